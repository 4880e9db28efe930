//! Store commits per create-table: the procedure's submission, Allocate's state with the allocation, and the
//! metadata with the `done` record — three, counted on etcd by its revision and on the memory and redb backends by
//! a counting wrapper, with the table id sequence already reserved (its batch is shared by many tables). With group
//! commit (on by default), create-tables running at once share commits: fewer than three each.

use crate::support::{Service, ddl as ddl_support};

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use procedures::{LocalManager, ManagerConfig, ProcedureId, ProcedureManager, ProcedureWithId};
use remote_wal::ddl::{
    CREATE_TABLE_TYPE_NAME, CreateTableProcedure, CreateTableTask, DdlContext,
    MemoryDatanodeManager, RaftEngineWalSource, TableName,
};
use remote_wal::kv::{
    CompareAndPutRequest, CompareAndPutResponse, CountingKvBackend, EtcdConfig, EtcdKvBackend,
    KeyValue, KvBackend, KvBackendRef, KvStateStore, KvWrapper, MemoryKvBackend, PutRequest,
    RangeRequest, RedbKvBackend, Txn, TxnOp, TxnResponse,
};

/// A kv backend that counts the calls that change something (a commit each; a refused transaction is none).
#[derive(Debug)]
struct Counting {
    inner: KvBackendRef,
    commits: AtomicU64,
}

impl Counting {
    fn commit(&self) {
        self.commits.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl KvWrapper for Counting {
    fn inner(&self) -> &dyn KvBackend {
        self.inner.as_ref()
    }
    async fn put(&self, req: PutRequest) -> remote_wal::kv::Result<Option<KeyValue>> {
        self.commit();
        self.inner.put(req).await
    }
    async fn batch_put(
        &self,
        kvs: Vec<KeyValue>,
        prev_kv: bool,
    ) -> remote_wal::kv::Result<Vec<KeyValue>> {
        self.commit();
        self.inner.batch_put(kvs, prev_kv).await
    }
    async fn compare_and_put(
        &self,
        req: CompareAndPutRequest,
    ) -> remote_wal::kv::Result<CompareAndPutResponse> {
        let resp = self.inner.compare_and_put(req).await?;
        if resp.success {
            self.commit();
        }
        Ok(resp)
    }
    async fn delete_range(
        &self,
        key: &[u8],
        range_end: &[u8],
        prev_kv: bool,
    ) -> remote_wal::kv::Result<(u64, Vec<KeyValue>)> {
        self.commit();
        self.inner.delete_range(key, range_end, prev_kv).await
    }
    async fn batch_delete(
        &self,
        keys: &[Vec<u8>],
        prev_kv: bool,
    ) -> remote_wal::kv::Result<Vec<KeyValue>> {
        self.commit();
        self.inner.batch_delete(keys, prev_kv).await
    }
    async fn txn(&self, txn: Txn) -> remote_wal::kv::Result<TxnResponse> {
        let writes = |ops: &[TxnOp]| ops.iter().any(|op| !matches!(op, TxnOp::Get(_)));
        let (on_success, on_failure) = (writes(&txn.success), writes(&txn.failure));
        let resp = self.inner.txn(txn).await?;
        if (resp.succeeded && on_success) || (!resp.succeeded && on_failure) {
            self.commit();
        }
        Ok(resp)
    }
}

/// A started manager whose procedure state and table metadata share `kv`, with create-table registered.
async fn manager(kv: KvBackendRef) -> (LocalManager, DdlContext) {
    let context = ddl_support::context(
        kv.clone(),
        vec![1, 2, 3],
        Arc::new(RaftEngineWalSource),
        Arc::new(MemoryDatanodeManager::new()),
    );
    let manager = LocalManager::new(
        Arc::new(KvStateStore::new(kv.clone())),
        ManagerConfig::default(),
    );
    manager
        .register_loader(
            CREATE_TABLE_TYPE_NAME,
            CreateTableProcedure::loader(context.clone()),
        )
        .unwrap();
    manager.start().await.unwrap();
    (manager, context)
}

/// Creates table `name` (8 regions) through `manager`; returns its id.
async fn create((manager, context): &(LocalManager, DdlContext), name: &str) -> u64 {
    let context = context.clone();
    let task = CreateTableTask::new(TableName::new("greptime", "public", name), 8);
    let out = manager
        .submit(ProcedureWithId::new(
            ProcedureId::new(format!("create-{name}")),
            Box::new(CreateTableProcedure::new(task, context)),
        ))
        .await
        .unwrap()
        .wait()
        .await
        .unwrap()
        .unwrap();
    out["table_id"].as_u64().unwrap()
}

/// The commits of the second create-table on `kv` (the first reserves the id sequence's batch).
async fn commits_of_one_create(counting: Arc<Counting>) -> u64 {
    let kv: KvBackendRef = counting.clone();
    let manager = manager(kv.clone()).await;
    let first = create(&manager, "warm_up").await;
    let before = counting.commits.load(Ordering::SeqCst);
    let second = create(&manager, "cpu").await;
    let commits = counting.commits.load(Ordering::SeqCst) - before;
    assert_eq!(
        second,
        first + 1,
        "the second table takes the batch's next id"
    );
    manager.0.stop().await.unwrap();
    commits
}

#[tokio::test]
async fn one_create_table_is_three_commits_on_the_memory_backend() {
    let counting = Arc::new(Counting {
        inner: Arc::new(MemoryKvBackend::new()),
        commits: AtomicU64::new(0),
    });
    assert_eq!(commits_of_one_create(counting).await, 3);
}

#[tokio::test]
async fn one_create_table_is_three_commits_on_redb() {
    let dir = tempfile::tempdir().unwrap();
    let counting = Arc::new(Counting {
        inner: Arc::new(RedbKvBackend::open(dir.path().join("meta.redb")).unwrap()),
        commits: AtomicU64::new(0),
    });
    assert_eq!(commits_of_one_create(counting).await, 3);
}

/// etcd's current revision.
async fn revision(endpoints: &[String]) -> i64 {
    let mut client = etcd_client::Client::connect(endpoints, None).await.unwrap();
    let resp = client.get("revision-probe", None).await.unwrap();
    resp.header().unwrap().revision()
}

#[tokio::test]
async fn one_create_table_moves_etcds_revision_by_three_and_concurrent_ones_share_txns() {
    // An etcd of this test's own: nothing else moves its revision.
    let etcd = Service::etcd("create-commits");
    let kv: KvBackendRef = Arc::new(
        EtcdKvBackend::connect(EtcdConfig::new(etcd.endpoints.clone()))
            .await
            .unwrap(),
    );
    let running = Arc::new(manager(kv.clone()).await);
    create(&running, "warm_up").await;
    let before = revision(&etcd.endpoints).await;
    create(&running, "cpu").await;
    let after = revision(&etcd.endpoints).await;
    assert!(after - before <= 3, "{} revisions", after - before);
    assert_eq!(after - before, 3);

    // 8 more at once (ids still within the reserved batch) share etcd txns: fewer revisions than 3 each, and every
    // table is complete.
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let running = running.clone();
            tokio::spawn(async move { create(&running, &format!("t{i}")).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let last = revision(&etcd.endpoints).await;
    running.0.stop().await.unwrap();
    eprintln!(
        "8 concurrent create-tables on etcd: {} revisions",
        last - after
    );
    assert!(last - after < 24, "{} revisions for 8 tables", last - after);
    let names = remote_wal::kv::range_all(kv.as_ref(), RangeRequest::prefix("__table_name/"), 0)
        .await
        .unwrap();
    assert_eq!(names.len(), 10, "warm_up, cpu and the 8");
}

/// Creates `n` tables at once through one manager on `kv` (procedure state in the same kv, group commit on);
/// returns the store commits they took, counted by the `CountingKvBackend` every metasrv wraps its backend in.
async fn commits_of_concurrent_creates(kv: KvBackendRef, n: usize) -> u64 {
    let counting = Arc::new(CountingKvBackend::new(kv));
    let kv: KvBackendRef = counting.clone();
    let running = Arc::new(manager(kv.clone()).await);
    // The first table reserves the id sequence's batch, alone.
    create(&running, "warm_up").await;
    let before = counting.commits();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let running = running.clone();
            tokio::spawn(async move { create(&running, &format!("t{i}")).await })
        })
        .collect();
    let mut ids = std::collections::BTreeSet::new();
    for t in tasks {
        ids.insert(t.await.unwrap());
    }
    let commits = counting.commits() - before;
    assert_eq!(ids.len(), n, "every table has an id of its own: {ids:?}");
    // Every table is complete: its name, info and route are stored, and its procedure is done.
    for prefix in ["__table_name/", "__table_info/", "__table_route/"] {
        let keys = remote_wal::kv::range_all(kv.as_ref(), RangeRequest::prefix(prefix), 0)
            .await
            .unwrap();
        assert_eq!(keys.len(), n + 1, "{prefix}: {} keys", keys.len());
    }
    for i in 0..n {
        let info = running
            .0
            .procedure_state(&ProcedureId::new(format!("create-t{i}")))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(info.state, procedures::ProcedureState::Done, "t{i}");
    }
    running.0.stop().await.unwrap();
    eprintln!("{n} concurrent create-tables: {commits} commits");
    commits
}

// The single-threaded runtime: the create-tables submitted together meet in the state store's queue the same way
// in every run, so some of their writes share commits. Alone, each would take 3.
#[tokio::test]
async fn concurrent_create_tables_share_commits_on_the_memory_backend() {
    let n = 8;
    let commits = commits_of_concurrent_creates(Arc::new(MemoryKvBackend::new()), n).await;
    assert!(commits < 3 * n as u64, "{commits} commits for {n} tables");
}

#[tokio::test]
async fn concurrent_create_tables_share_commits_on_redb() {
    let dir = tempfile::tempdir().unwrap();
    let kv = Arc::new(RedbKvBackend::open(dir.path().join("meta.redb")).unwrap());
    let n = 8;
    let commits = commits_of_concurrent_creates(kv, n).await;
    assert!(commits < 3 * n as u64, "{commits} commits for {n} tables");
}
