//! What a cancel undoes. Create-table: cancelled in the middle of CreateRegions, it drops the regions it created,
//! releases its reservation and leaves no table metadata behind, on the memory and the redb backends. The topic
//! bootstrap: it undoes nothing (no topic is deleted), and the next bootstrap completes the pool.

use crate::support::{ddl as support, kv_snapshot};

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use procedures::{LocalManager, ManagerConfig, ProcedureId, ProcedureManager, RetryPolicy};
use remote_wal::ddl::datanode_manager::RegionCreateRequest;
use remote_wal::ddl::{
    CreateTableTask, DatanodeManager, DdlContext, DdlManager, MemoryDatanodeManager,
    RoundRobinPeerSelector, TableMetadataAllocator, TableMetadataManager, TableName,
};
use remote_wal::kv::{KvBackendRef, KvStateStore, MemoryKvBackend, RedbKvBackend};
use tokio::sync::Semaphore;

/// Datanodes that create the first `free` regions at once, then block each further creation until the test opens
/// the gate.
#[derive(Debug)]
struct GatedDatanodes {
    inner: Arc<MemoryDatanodeManager>,
    free: AtomicUsize,
    gate: Semaphore,
    blocked: AtomicUsize,
}

#[async_trait]
impl DatanodeManager for GatedDatanodes {
    async fn create_region(
        &self,
        datanode_id: u64,
        request: RegionCreateRequest,
    ) -> remote_wal::ddl::error::Result<()> {
        if self
            .free
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_err()
        {
            self.blocked.fetch_add(1, Ordering::SeqCst);
            // The gate is never closed: the permit always comes once the test adds it.
            let _permit = self.gate.acquire().await;
        }
        self.inner.create_region(datanode_id, request).await
    }

    fn can_drop_regions(&self) -> bool {
        true
    }

    async fn drop_region(
        &self,
        datanode_id: u64,
        region_id: u64,
    ) -> remote_wal::ddl::error::Result<()> {
        self.inner.drop_region(datanode_id, region_id).await
    }
}

/// Every key of the kv but the engine's records and the table-id sequence (ids are never reused, so a rolled-back
/// table's id stays consumed).
async fn metadata_keys(kv: &KvBackendRef) -> Vec<(String, Vec<u8>)> {
    kv_snapshot(kv.as_ref())
        .await
        .into_iter()
        .map(|(k, v)| (String::from_utf8_lossy(&k).into_owned(), v))
        .filter(|(k, _)| !k.starts_with("__procedure__/") && k != "__table_id_seq")
        .collect()
}

async fn cancelled_mid_create_leaves_nothing(kv: KvBackendRef) {
    let memory = Arc::new(MemoryDatanodeManager::new());
    let datanodes = Arc::new(GatedDatanodes {
        inner: memory.clone(),
        free: AtomicUsize::new(2),
        gate: Semaphore::new(0),
        blocked: AtomicUsize::new(0),
    });
    let quick = RetryPolicy {
        max_retries: 3,
        initial_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
        factor: 2.0,
    };
    let config = ManagerConfig {
        step_retry: quick.clone(),
        store_retry: quick,
        ..ManagerConfig::default()
    };
    let manager = Arc::new(LocalManager::new(
        Arc::new(KvStateStore::new(kv.clone())),
        config,
    ));
    let context = DdlContext {
        metadata: Arc::new(TableMetadataManager::new(kv.clone())),
        allocator: Arc::new(TableMetadataAllocator::new(
            kv.clone(),
            Arc::new(RoundRobinPeerSelector::new(vec![1, 2, 3])),
            Arc::new(support::FakeKafkaPool::new(4)),
        )),
        datanodes: datanodes.clone(),
    };
    let ddl = Arc::new(DdlManager::new(manager.clone(), context));
    ddl.register_loaders().unwrap();
    manager.start().await.unwrap();

    // One table made before, so the comparison covers a store that holds other metadata.
    datanodes.free.store(usize::MAX, Ordering::SeqCst);
    let task = |t: &str| CreateTableTask::new(TableName::new("greptime", "public", t), 4);
    ddl.create_table(task("kept")).await.unwrap();
    datanodes.free.store(2, Ordering::SeqCst);
    let before = metadata_keys(&kv).await;
    let regions_before = memory.regions();

    let id = ProcedureId::new("cancel-me");
    let create = {
        let ddl = ddl.clone();
        let id = id.clone();
        tokio::spawn(async move { ddl.create_table_with_id(task("cancelled"), Some(id)).await })
    };
    tokio::time::timeout(Duration::from_secs(30), async {
        while datanodes.blocked.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("the third region's creation blocks");
    assert_ne!(memory.regions(), regions_before, "two regions were created");

    manager.cancel(&id).await.unwrap();
    datanodes.gate.add_permits(1000);
    let err = tokio::time::timeout(Duration::from_secs(30), create)
        .await
        .expect("the create-table ends")
        .unwrap()
        .unwrap_err();
    assert!(err.to_string().contains("cancelled (rolled back)"), "{err}");

    assert_eq!(
        memory.regions(),
        regions_before,
        "every region it created is dropped"
    );
    assert_eq!(memory.drops().len(), 4, "{:?}", memory.drops());
    assert_eq!(
        metadata_keys(&kv).await,
        before,
        "no key of the cancelled table is left"
    );
    let info = manager.procedure_state(&id).await.unwrap().unwrap();
    assert_eq!(info.state, procedures::ProcedureState::Cancelled);
    manager.stop().await.unwrap();
}

#[tokio::test]
async fn a_cancelled_create_table_leaves_no_key_behind_on_memory() {
    cancelled_mid_create_leaves_nothing(Arc::new(MemoryKvBackend::new())).await;
}

#[tokio::test]
async fn a_cancelled_create_table_leaves_no_key_behind_on_redb() {
    let dir = tempfile::tempdir().unwrap();
    let kv: KvBackendRef = Arc::new(RedbKvBackend::open(dir.path().join("meta.redb")).unwrap());
    cancelled_mid_create_leaves_nothing(kv).await;
}

/// The topic bootstrap has no rollback: cancelled while it waits to retry a topic's creation, it ends cancelled and
/// deletes nothing; the next bootstrap of the pool (its next attempt id) resumes from the topics that exist.
#[tokio::test]
async fn a_cancelled_bootstrap_deletes_no_topic_and_the_next_bootstrap_completes_the_pool() {
    use remote_wal::wal::kafka::bootstrap::bootstrap_procedure_id;
    use remote_wal::wal::kafka::testing::{FakeFault, FakeTopicAdmin};
    use remote_wal::wal::kafka::{
        KafkaTopicManager, ReadyPoll, RoundRobinTopicSelector, TopicPoolSpec,
    };

    let mut spec = TopicPoolSpec::new("cancel_pool", 4);
    spec.ready_poll = ReadyPoll {
        init: Duration::from_millis(1),
        max: Duration::from_millis(5),
        factor: 2.0,
        deadline: Duration::from_secs(5),
    };
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    let pool = Arc::new(
        KafkaTopicManager::new(
            spec,
            kv.clone(),
            admin.clone(),
            Arc::new(RoundRobinTopicSelector::new()),
        )
        .unwrap(),
    );
    // The retry delay is an hour: only the cancel ends the wait before the test's bound.
    let config = ManagerConfig {
        step_retry: RetryPolicy {
            max_retries: 3,
            initial_delay: Duration::from_secs(3600),
            max_delay: Duration::from_secs(3600),
            factor: 2.0,
        },
        ..ManagerConfig::default()
    };
    let manager = LocalManager::new(Arc::new(KvStateStore::new(kv.clone())), config);
    pool.register_loader(&manager).unwrap();
    manager.start().await.unwrap();
    let manager: procedures::ProcedureManagerRef = Arc::new(manager);

    // The third create call breaks (retryable): two topics exist, the bootstrap waits to retry.
    admin.fail_nth_create(3, FakeFault::ConnectionBroken);
    let first = {
        let (pool, manager) = (pool.clone(), manager.clone());
        tokio::spawn(async move { pool.start(&manager).await })
    };
    let id = bootstrap_procedure_id("cancel_pool", 0);
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let Some(info) = manager.procedure_state(&id).await.unwrap()
                && info.state == procedures::ProcedureState::Retrying
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("the bootstrap waits to retry");
    let made = admin.topics().len();
    assert_eq!(made, 2, "{:?}", admin.topics());

    manager.cancel(&id).await.unwrap();
    let err = tokio::time::timeout(Duration::from_secs(30), first)
        .await
        .expect("the bootstrap ends")
        .unwrap()
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("was cancelled: cancelled (no rollback"),
        "{err}"
    );
    assert_eq!(admin.topics().len(), made, "no topic deleted");

    // The next bootstrap: a new attempt completes the pool, creating only the missing topics.
    tokio::time::timeout(Duration::from_secs(30), pool.start(&manager))
        .await
        .expect("the next bootstrap ends")
        .unwrap();
    assert!(pool.is_ready());
    assert_eq!(admin.topics().len(), 4);
    assert!(
        admin.created_counts().values().all(|n| *n == 1),
        "{:?}",
        admin.created_counts()
    );
    manager.stop().await.unwrap();
}

/// Datanodes that refuse every region creation for good while `refuse` is set.
#[derive(Debug)]
struct RefusingDatanodes {
    inner: Arc<MemoryDatanodeManager>,
    refuse: std::sync::atomic::AtomicBool,
}

#[async_trait]
impl DatanodeManager for RefusingDatanodes {
    async fn create_region(
        &self,
        datanode_id: u64,
        request: RegionCreateRequest,
    ) -> remote_wal::ddl::error::Result<()> {
        if self.refuse.load(Ordering::SeqCst) {
            return Err(remote_wal::ddl::Error::RegionExistsWithDifferentOptions {
                region_id: request.region_id,
                datanode_id,
                existing: "another table's region".to_string(),
                requested: "this one".to_string(),
            });
        }
        self.inner.create_region(datanode_id, request).await
    }

    fn can_drop_regions(&self) -> bool {
        true
    }

    async fn drop_region(
        &self,
        datanode_id: u64,
        region_id: u64,
    ) -> remote_wal::ddl::error::Result<()> {
        self.inner.drop_region(datanode_id, region_id).await
    }
}

/// A create-table that failed and was rolled back runs again when its client sends the same request with the same
/// id (the failure could have been a fault a retry clears), and creates the table once; another request under that
/// id is still refused naming the difference.
#[tokio::test]
async fn a_failed_rolled_back_create_table_sent_again_with_its_id_creates_the_table() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let memory = Arc::new(MemoryDatanodeManager::new());
    let datanodes = Arc::new(RefusingDatanodes {
        inner: memory.clone(),
        refuse: std::sync::atomic::AtomicBool::new(true),
    });
    let manager = Arc::new(LocalManager::new(
        Arc::new(KvStateStore::new(kv.clone())),
        ManagerConfig::default(),
    ));
    let context = DdlContext {
        metadata: Arc::new(TableMetadataManager::new(kv.clone())),
        allocator: Arc::new(TableMetadataAllocator::new(
            kv.clone(),
            Arc::new(RoundRobinPeerSelector::new(vec![1, 2])),
            Arc::new(support::FakeKafkaPool::new(4)),
        )),
        datanodes: datanodes.clone(),
    };
    let ddl = Arc::new(DdlManager::new(manager.clone(), context));
    ddl.register_loaders().unwrap();
    manager.start().await.unwrap();
    let task = || CreateTableTask::new(TableName::new("greptime", "public", "again"), 2);
    let id = ProcedureId::new("create-again");

    let failed = ddl
        .create_table_with_id(task(), Some(id.clone()))
        .await
        .expect_err("the datanodes refuse");
    assert!(
        failed.to_string().contains("another table's region"),
        "{failed}"
    );
    assert!(
        metadata_keys(&kv).await.is_empty(),
        "rolled back: no key left"
    );

    datanodes.refuse.store(false, Ordering::SeqCst);
    let table_id = ddl
        .create_table_with_id(task(), Some(id.clone()))
        .await
        .expect("the same request under the same id runs again");
    assert_eq!(
        ddl.create_table_with_id(task(), Some(id.clone()))
            .await
            .unwrap(),
        table_id,
        "and is then the same table"
    );
    assert_eq!(memory.regions().len(), 2);
    let other = ddl
        .create_table_with_id(
            CreateTableTask::new(TableName::new("greptime", "public", "again"), 3),
            Some(id),
        )
        .await
        .expect_err("another request under the id");
    assert!(other.to_string().contains("differs"), "{other}");
}
