//! Unit tests of the create-table procedure, one step at a time, with mocked allocator sources and datanodes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use procedures::{Context, Procedure, ProcedureId, SideEffectHook, Status};

use crate::ddl::Error;
use crate::ddl::allocator::{TABLE_ID_SEQ_KEY, TableMetadataAllocator};
use crate::ddl::context::DdlContext;
use crate::ddl::create_table::{CreateTableProcedure, CreateTableState, region_create_requests};
use crate::ddl::datanode_manager::{DatanodeManager, MemoryDatanodeManager, MockDatanodeManager};
use crate::ddl::metadata_manager::{TableMetadata, TableMetadataManager};
use crate::ddl::peer::{MockPeerSelector, RoundRobinPeerSelector};
use crate::ddl::task::CreateTableTask;
use crate::ddl::wal_source::{MockWalOptionsSource, RaftEngineWalSource};
use crate::key::table_name::TableName;
use crate::kv::{KvBackend, KvBackendRef, MemoryKvBackend};
use crate::wal::WalOptions;

fn task(table: &str, n: u32) -> CreateTableTask {
    CreateTableTask::new(TableName::new("greptime", "public", table), n)
}

fn context(
    kv: KvBackendRef,
    wal: Arc<dyn crate::ddl::WalOptionsSource>,
    datanodes: Arc<dyn DatanodeManager>,
) -> DdlContext {
    DdlContext {
        metadata: Arc::new(TableMetadataManager::new(kv.clone())),
        allocator: Arc::new(TableMetadataAllocator::new(
            kv,
            Arc::new(RoundRobinPeerSelector::new(vec![1, 2])),
            wal,
        )),
        datanodes,
    }
}

/// A context on `kv` with datanodes in memory and a Kafka source that expects `allocations` batches.
fn memory_context(kv: KvBackendRef, allocations: usize) -> DdlContext {
    context(
        kv,
        Arc::new(kafka_source(allocations)),
        Arc::new(MemoryDatanodeManager::new()),
    )
}

fn kafka_source(times: usize) -> MockWalOptionsSource {
    let mut wal = MockWalOptionsSource::new();
    wal.expect_load_if_needed().returning(|| Ok(()));
    wal.expect_alloc_batch().times(times).returning(|n| {
        Ok((0..n)
            .map(|i| WalOptions::kafka(format!("topic_{i}")))
            .collect())
    });
    wal
}

fn ctx() -> Context {
    Context::new(ProcedureId::new("test"))
}

/// Runs steps until done, rebuilding the procedure from its dump after every persisted step, as a recovery would.
async fn run_to_end(
    mut p: CreateTableProcedure,
    context: &DdlContext,
) -> procedures::Result<serde_json::Value> {
    loop {
        let status = p.execute(&ctx()).await?;
        // What the engine does with a state store that cannot join the step's writes: apply them alone first.
        if let Some(writes) = status.writes() {
            writes.apply_alone().await?;
        }
        match status {
            Status::Done { output, .. } => return Ok(output.unwrap_or_default()),
            Status::Executing { persist: true, .. } => {
                p = CreateTableProcedure::from_json(p.dump()?, context.clone())?;
            }
            _ => {}
        }
    }
}

#[tokio::test]
async fn prepare_refuses_a_bad_name_naming_it() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let c = memory_context(kv, 0);
    let mut p = CreateTableProcedure::new(task("bad.name", 1), c);
    let err = p.execute(&ctx()).await.unwrap_err();
    assert!(!err.is_retryable());
    assert!(err.to_string().contains("'bad.name'"), "{err}");
}

#[tokio::test]
async fn prepare_on_an_existing_table_fails_or_returns_its_id() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let dns = Arc::new(MemoryDatanodeManager::new());
    let c = context(kv.clone(), Arc::new(kafka_source(1)), dns.clone());
    let out = run_to_end(CreateTableProcedure::new(task("cpu", 2), c.clone()), &c)
        .await
        .unwrap();
    let id = out["table_id"].as_u64().unwrap();

    let mut again = CreateTableProcedure::new(task("cpu", 2), c.clone());
    let err = again.execute(&ctx()).await.unwrap_err();
    assert!(!err.is_retryable());
    let msg = err.to_string();
    assert!(
        msg.contains("greptime.public.cpu") && msg.contains("already exists"),
        "{msg}"
    );

    let mut t = task("cpu", 2);
    t.if_not_exists = true;
    let mut p = CreateTableProcedure::new(t, c);
    match p.execute(&ctx()).await.unwrap() {
        Status::Done { output, .. } => assert_eq!(output.unwrap()["table_id"].as_u64(), Some(id)),
        other => panic!("expected done, got {other:?}"),
    }
    // Neither attempt created anything more.
    assert_eq!(dns.creations().len(), 2);
}

#[tokio::test]
async fn allocate_persists_and_is_not_repeated_on_replay() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let dns = Arc::new(MemoryDatanodeManager::new());
    // The WAL source may be asked once in the whole life of the procedure.
    let c = context(kv.clone(), Arc::new(kafka_source(1)), dns.clone());
    let mut p = CreateTableProcedure::new(task("cpu", 4), c.clone());
    assert!(matches!(
        p.execute(&ctx()).await.unwrap(),
        Status::Executing { persist: false, .. }
    ));
    assert_eq!(p.data().state, CreateTableState::Allocate);
    assert!(matches!(
        p.execute(&ctx()).await.unwrap(),
        Status::Executing { persist: true, .. }
    ));
    assert_eq!(p.data().state, CreateTableState::CreateRegions);
    let persisted = p.dump().unwrap();
    let allocation = p.data().allocation.clone().unwrap();
    let seq_after_allocate = kv.get(TABLE_ID_SEQ_KEY.as_bytes()).await.unwrap();

    // Replay the same persisted state three times (crash after each run): the allocation is reused each time.
    for _ in 0..3 {
        let replay = CreateTableProcedure::from_json(persisted.clone(), c.clone()).unwrap();
        let out = run_to_end(replay, &c).await.unwrap();
        assert_eq!(
            out["table_id"].as_u64(),
            Some(u64::from(allocation.table_id))
        );
    }
    assert_eq!(
        kv.get(TABLE_ID_SEQ_KEY.as_bytes()).await.unwrap(),
        seq_after_allocate
    );
    assert!(dns.creations().values().all(|&n| n == 1));
    assert_eq!(dns.creations().len(), 4);

    // A state that already holds an allocation (loaded at Allocate) keeps it: the source is not asked again.
    let mut at_allocate: serde_json::Value = persisted.clone();
    at_allocate["state"] = serde_json::json!("allocate");
    let mut p = CreateTableProcedure::from_json(at_allocate, c.clone()).unwrap();
    p.execute(&ctx()).await.unwrap();
    assert_eq!(p.data().allocation.as_ref(), Some(&allocation));
}

#[tokio::test]
async fn allocate_reuses_and_removes_a_reservation_an_older_release_left() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let dns = Arc::new(MemoryDatanodeManager::new());
    // An older release reserved the allocation at `__table_allocation/{procedure id}`, then crashed before storing
    // the state that held it.
    let c = context(kv.clone(), Arc::new(kafka_source(1)), dns.clone());
    let reserved = c
        .allocator
        .allocate_once("test", &task("cpu", 3))
        .await
        .unwrap();
    // This release resumes the procedure (under the same id) from its submitted record: no new allocation.
    let c2 = context(kv.clone(), Arc::new(kafka_source(0)), dns.clone());
    let submitted = CreateTableProcedure::new(task("cpu", 3), c2.clone())
        .dump()
        .unwrap();
    let again = CreateTableProcedure::from_json(submitted, c2.clone()).unwrap();
    let out = run_to_end(again, &c2).await.unwrap();
    assert_eq!(out["table_id"].as_u64(), Some(u64::from(reserved.table_id)));
    let metadata = TableMetadataManager::new(kv.clone());
    assert_eq!(
        metadata
            .table_route(reserved.table_id)
            .await
            .unwrap()
            .unwrap()
            .region_routes,
        reserved.region_routes
    );
    // The reservation is gone: removed in the commit of Allocate's state.
    let left = kv
        .range(crate::kv::RangeRequest::prefix("__table_allocation/"))
        .await
        .unwrap();
    assert!(left.kvs.is_empty(), "{left:?}");
}

#[tokio::test]
async fn allocate_uses_the_selector_and_the_wal_source() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let mut peers = MockPeerSelector::new();
    peers.expect_select().times(1).returning(|n| Ok(vec![7; n]));
    let c = DdlContext {
        metadata: Arc::new(TableMetadataManager::new(kv.clone())),
        allocator: Arc::new(TableMetadataAllocator::new(
            kv,
            Arc::new(peers),
            Arc::new(kafka_source(1)),
        )),
        datanodes: Arc::new(MemoryDatanodeManager::new()),
    };
    let mut p = CreateTableProcedure::from_json(
        serde_json::json!({"state": "allocate", "task": task("cpu", 3)}),
        c,
    )
    .unwrap();
    p.execute(&ctx()).await.unwrap();
    let a = p.data().allocation.clone().unwrap();
    assert_eq!(a.region_routes, BTreeMap::from([(0, 7), (1, 7), (2, 7)]));
    assert_eq!(
        a.region_wal_options[&2],
        r#"{"wal.provider":"kafka","wal.kafka.topic":"topic_2"}"#
    );
}

fn pool_not_ready() -> Error {
    crate::wal::Error::TopicPoolNotReady {
        prefix: "pool".into(),
        reason: "the topic bootstrap has not completed (call start first)".into(),
    }
    .into()
}

#[tokio::test]
async fn allocate_waits_retryably_while_the_topic_pool_is_not_ready_then_allocates() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let mut wal = MockWalOptionsSource::new();
    let mut seq = mockall::Sequence::new();
    // Not ready (neither loaded nor complete in the kv) on the first attempt, loaded on the second.
    wal.expect_load_if_needed()
        .times(1)
        .in_sequence(&mut seq)
        .returning(|| Err(pool_not_ready()));
    wal.expect_load_if_needed()
        .times(1)
        .in_sequence(&mut seq)
        .returning(|| Ok(()));
    wal.expect_alloc_batch().times(1).returning(|n| {
        Ok((0..n)
            .map(|i| WalOptions::kafka(format!("topic_{i}")))
            .collect())
    });
    let c = context(
        kv.clone(),
        Arc::new(wal),
        Arc::new(MemoryDatanodeManager::new()),
    );
    let mut p = CreateTableProcedure::from_json(
        serde_json::json!({"state": "allocate", "task": task("cpu", 3)}),
        c,
    )
    .unwrap();
    let err = p.execute(&ctx()).await.unwrap_err();
    // The real error, kept as it is, but retryable inside the step: a start-up order never fails a table for good.
    assert!(err.is_retryable(), "{err}");
    assert!(err.to_string().contains("is not ready"), "{err}");
    assert!(p.data().allocation.is_none());
    // No table id was consumed for nothing.
    assert_eq!(kv.get(TABLE_ID_SEQ_KEY.as_bytes()).await.unwrap(), None);
    // The engine's retry runs the step again; the pool is loaded now.
    assert!(matches!(
        p.execute(&ctx()).await.unwrap(),
        Status::Executing { persist: true, .. }
    ));
    assert_eq!(
        p.data()
            .allocation
            .as_ref()
            .unwrap()
            .region_wal_options
            .len(),
        3
    );
}

#[tokio::test]
async fn a_pool_that_is_not_ready_outside_a_procedure_is_still_an_error() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let mut wal = MockWalOptionsSource::new();
    wal.expect_load_if_needed()
        .returning(|| Err(pool_not_ready()));
    let allocator = TableMetadataAllocator::new(
        kv,
        Arc::new(RoundRobinPeerSelector::new(vec![1])),
        Arc::new(wal),
    );
    let err = allocator.allocate(&task("cpu", 1)).await.unwrap_err();
    assert!(
        matches!(&err, Error::Wal { source } if matches!(**source, crate::wal::Error::TopicPoolNotReady { .. })),
        "{err}"
    );
    assert!(!err.is_retryable(), "{err}");
}

#[derive(Default)]
struct Labels(Mutex<Vec<String>>);

impl SideEffectHook for Labels {
    fn on_side_effect(&self, _: &ProcedureId, label: &str) -> procedures::Result<()> {
        self.0.lock().unwrap().push(label.to_string());
        Ok(())
    }
}

async fn at_create_regions(c: &DdlContext, t: CreateTableTask) -> CreateTableProcedure {
    let mut p = CreateTableProcedure::new(t, c.clone());
    p.execute(&ctx()).await.unwrap();
    p.execute(&ctx()).await.unwrap();
    assert_eq!(p.data().state, CreateTableState::CreateRegions);
    p
}

#[tokio::test]
async fn create_regions_sends_wal_options_and_marks_each_region() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let mut dns = MockDatanodeManager::new();
    dns.expect_create_region()
        .times(3)
        .withf(|dn, req| {
            (*dn == 1 || *dn == 2)
                && req.options["wal_options"].starts_with(r#"{"wal.provider":"kafka""#)
                && req.options["ttl"] == "7d"
        })
        .returning(|_, _| Ok(()));
    let c = context(kv, Arc::new(kafka_source(1)), Arc::new(dns));
    let mut t = task("cpu", 3);
    t.options.insert("ttl".into(), "7d".into());
    let mut p = at_create_regions(&c, t).await;
    let labels = Arc::new(Labels::default());
    let hooked = Context::with_hook(ProcedureId::new("test"), Some(labels.clone()));
    assert!(matches!(
        p.execute(&hooked).await.unwrap(),
        Status::Executing { persist: false, .. }
    ));
    assert_eq!(p.data().state, CreateTableState::PersistDatanodeTableValue);
    assert_eq!(labels.0.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn create_regions_tolerates_regions_that_exist_with_the_same_options() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let dns = Arc::new(MemoryDatanodeManager::new());
    let c = context(kv, Arc::new(kafka_source(1)), dns.clone());
    let mut p = at_create_regions(&c, task("cpu", 3)).await;
    // Two of the three regions were created before a crash.
    let requests = region_create_requests(&p.data().task, p.data().allocation.as_ref().unwrap());
    for (dn, req) in requests.iter().take(2) {
        dns.create_region(*dn, req.clone()).await.unwrap();
    }
    p.execute(&ctx()).await.unwrap();
    assert_eq!(dns.creations().len(), 3);
    assert!(dns.creations().values().all(|&n| n == 1));
}

#[tokio::test]
async fn create_regions_fails_on_a_region_with_other_options() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let dns = Arc::new(MemoryDatanodeManager::new());
    let c = context(kv.clone(), Arc::new(kafka_source(1)), dns.clone());
    let mut p = at_create_regions(&c, task("cpu", 2)).await;
    let (dn, mut req) =
        region_create_requests(&p.data().task, p.data().allocation.as_ref().unwrap()).remove(1);
    req.options.insert(
        "wal_options".into(),
        r#"{"wal.provider":"raft_engine"}"#.into(),
    );
    dns.create_region(dn, req.clone()).await.unwrap();
    let err = p.execute(&ctx()).await.unwrap_err();
    assert!(!err.is_retryable());
    assert!(
        err.to_string()
            .contains(&format!("region {}", req.region_id)),
        "{err}"
    );
    // The failed procedure leaves no allocation reservation behind.
    let left = kv
        .range(crate::kv::RangeRequest::prefix("__table_allocation/"))
        .await
        .unwrap();
    assert!(left.kvs.is_empty(), "{left:?}");
}

#[tokio::test]
async fn an_unavailable_datanode_is_a_retryable_step_error() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let dns = Arc::new(MemoryDatanodeManager::new());
    let c = context(kv, Arc::new(RaftEngineWalSource), dns.clone());
    let mut p = at_create_regions(&c, task("cpu", 2)).await;
    dns.fail_next(2, 1);
    let err = p.execute(&ctx()).await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    // The retry converges.
    p.execute(&ctx()).await.unwrap();
    assert_eq!(dns.creations().len(), 2);
}

#[tokio::test]
async fn persist_succeeds_on_identical_replay_and_fails_for_another_table_of_the_same_name() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let c = memory_context(kv.clone(), 2);
    let mut p = at_create_regions(&c, task("cpu", 2)).await;
    p.execute(&ctx()).await.unwrap();
    let persisted = p.dump().unwrap();
    let first = p.execute(&ctx()).await.unwrap();
    assert!(matches!(first, Status::Done { .. }));
    first.writes().unwrap().apply_alone().await.unwrap();
    let before = kv.range(crate::kv::RangeRequest::prefix("")).await.unwrap();

    // The same step again (crash after the txn, before the state was stored): success, nothing changed.
    let mut replay = CreateTableProcedure::from_json(persisted, c.clone()).unwrap();
    assert!(matches!(
        replay.execute(&ctx()).await.unwrap(),
        Status::Done { .. }
    ));
    assert_eq!(
        kv.range(crate::kv::RangeRequest::prefix("")).await.unwrap(),
        before
    );

    // Another procedure that allocated another id under the same name fails at its metadata txn.
    let mut other = at_create_regions(&c, task("cpu2", 2)).await;
    other.execute(&ctx()).await.unwrap();
    let mut data = other.dump().unwrap();
    data["task"]["name"]["table"] = serde_json::json!("cpu");
    let mut other = CreateTableProcedure::from_json(data, c.clone()).unwrap();
    let err = other.execute(&ctx()).await.unwrap_err();
    assert!(!err.is_retryable());
    let msg = err.to_string();
    assert!(
        msg.contains("greptime.public.cpu") && msg.contains("already exists"),
        "{msg}"
    );
    assert_eq!(
        kv.range(crate::kv::RangeRequest::prefix("")).await.unwrap(),
        before
    );
}

#[tokio::test]
async fn metadata_replay_compares_values_not_bytes() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let manager = TableMetadataManager::new(kv.clone());
    let t = task("cpu", 2);
    let allocation = crate::ddl::TableAllocation {
        table_id: 1024,
        region_routes: BTreeMap::from([(0, 1), (1, 2)]),
        region_wal_options: BTreeMap::from([
            (0, WalOptions::RaftEngine.encode()),
            (1, WalOptions::RaftEngine.encode()),
        ]),
    };
    let metadata = TableMetadata::new(&t, &allocation);
    // The name key written by another writer with whitespace: same value, other bytes.
    kv.put(crate::kv::PutRequest {
        key: t.name.key().into_bytes(),
        value: br#"{ "table_id": 1024 }"#.to_vec(),
        prev_kv: false,
    })
    .await
    .unwrap();
    // Only the name exists: the other keys are missing, which is a conflict naming the first missing key.
    let err = manager
        .create_table_metadata(&metadata)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("__table_info/1024"), "{err}");
    // Once the rest is there too, the whitespace difference does not matter.
    for (k, v) in metadata.encode().unwrap().into_iter().skip(1) {
        kv.put(crate::kv::PutRequest {
            key: k.into_bytes(),
            value: v,
            prev_kv: false,
        })
        .await
        .unwrap();
    }
    manager.create_table_metadata(&metadata).await.unwrap();
}

/// A memory backend with small limits: at most `max_txn_ops` ops per transaction and `max_request_bytes` key and
/// value bytes per transaction (a bigger one is refused, as a real backend's limit would).
#[derive(Debug)]
struct LimitedKv {
    inner: MemoryKvBackend,
    max_txn_ops: usize,
    max_request_bytes: usize,
}

impl LimitedKv {
    fn txn_ops(max_txn_ops: usize) -> Self {
        LimitedKv {
            inner: MemoryKvBackend::new(),
            max_txn_ops,
            max_request_bytes: usize::MAX,
        }
    }

    fn request_bytes(max_request_bytes: usize) -> Self {
        LimitedKv {
            inner: MemoryKvBackend::new(),
            max_txn_ops: usize::MAX,
            max_request_bytes,
        }
    }

    /// Keys left in the store, except the table-id sequence (ids are never reused, so it may have moved).
    fn keys_left(&self) -> Vec<String> {
        self.inner
            .dump()
            .into_iter()
            .map(|kv| String::from_utf8_lossy(&kv.key).to_string())
            .filter(|k| k != TABLE_ID_SEQ_KEY)
            .collect()
    }
}

#[async_trait::async_trait]
impl KvBackend for LimitedKv {
    fn name(&self) -> String {
        "limited".into()
    }
    fn max_txn_ops(&self) -> usize {
        self.max_txn_ops
    }
    fn max_request_bytes(&self) -> usize {
        self.max_request_bytes
    }
    async fn get(&self, key: &[u8]) -> crate::kv::Result<Option<crate::kv::KeyValue>> {
        self.inner.get(key).await
    }
    async fn batch_get(&self, keys: &[Vec<u8>]) -> crate::kv::Result<Vec<crate::kv::KeyValue>> {
        self.inner.batch_get(keys).await
    }
    async fn range(
        &self,
        req: crate::kv::RangeRequest,
    ) -> crate::kv::Result<crate::kv::RangeResponse> {
        self.inner.range(req).await
    }
    async fn put(
        &self,
        req: crate::kv::PutRequest,
    ) -> crate::kv::Result<Option<crate::kv::KeyValue>> {
        self.inner.put(req).await
    }
    async fn batch_put(
        &self,
        kvs: Vec<crate::kv::KeyValue>,
        prev_kv: bool,
    ) -> crate::kv::Result<Vec<crate::kv::KeyValue>> {
        self.inner.batch_put(kvs, prev_kv).await
    }
    async fn compare_and_put(
        &self,
        req: crate::kv::CompareAndPutRequest,
    ) -> crate::kv::Result<crate::kv::CompareAndPutResponse> {
        self.inner.compare_and_put(req).await
    }
    async fn delete_range(
        &self,
        key: &[u8],
        range_end: &[u8],
        prev_kv: bool,
    ) -> crate::kv::Result<(u64, Vec<crate::kv::KeyValue>)> {
        self.inner.delete_range(key, range_end, prev_kv).await
    }
    async fn batch_delete(
        &self,
        keys: &[Vec<u8>],
        prev_kv: bool,
    ) -> crate::kv::Result<Vec<crate::kv::KeyValue>> {
        self.inner.batch_delete(keys, prev_kv).await
    }
    async fn txn(&self, txn: crate::kv::Txn) -> crate::kv::Result<crate::kv::TxnResponse> {
        let op_bytes = |op: &crate::kv::TxnOp| match op {
            crate::kv::TxnOp::Put(k, v) => k.len() + v.len(),
            crate::kv::TxnOp::Get(k) | crate::kv::TxnOp::Delete(k) => k.len(),
        };
        let bytes: usize = txn
            .compare
            .iter()
            .map(|c| match c {
                crate::kv::Compare::ValueEquals(k, v) => k.len() + v.len(),
                c => c.key().len(),
            })
            .chain(txn.success.iter().chain(&txn.failure).map(op_bytes))
            .sum();
        snafu::ensure!(
            bytes <= self.max_request_bytes,
            crate::kv::error::KvLimitSnafu {
                backend: self.name(),
                key: "",
                reason: format!("{bytes} bytes, at most {}", self.max_request_bytes),
            }
        );
        self.inner.txn(txn).await
    }
}

#[tokio::test]
async fn a_metadata_txn_over_the_backend_limit_is_refused_before_writing() {
    // name + info + route + 2 datanodes = 5 keys → 10 ops, plus 4 the engine adds when the writes commit with the
    // procedure's record.
    let kv = Arc::new(LimitedKv::txn_ops(13));
    let manager = TableMetadataManager::new(kv.clone());
    let t = task("cpu", 2);
    let allocation = crate::ddl::TableAllocation {
        table_id: 1024,
        region_routes: BTreeMap::from([(0, 1), (1, 2)]),
        region_wal_options: BTreeMap::new(),
    };
    let err = manager
        .create_table_metadata(&TableMetadata::new(&t, &allocation))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("greptime.public.cpu") && err.contains("14") && err.contains("13"),
        "{err}"
    );
    assert!(kv.inner.dump().is_empty());
}

#[tokio::test]
async fn a_table_whose_metadata_cannot_fit_one_txn_fails_before_any_region_is_created() {
    // 2 regions on 2 datanodes: name + info + route + 2 datanode keys = 5 keys → 10 ops, plus 4 the engine adds,
    // over a limit of 13. The metadata step could never succeed, so the procedure must stop before it creates
    // regions it cannot record.
    let kv = Arc::new(LimitedKv::txn_ops(13));
    let dns = Arc::new(MemoryDatanodeManager::new());
    let c = context(kv.clone(), Arc::new(RaftEngineWalSource), dns.clone());
    let err = run_to_end(CreateTableProcedure::new(task("cpu", 2), c.clone()), &c)
        .await
        .unwrap_err();
    assert!(!err.is_retryable());
    let msg = err.to_string();
    assert!(
        msg.contains("greptime.public.cpu") && msg.contains("14"),
        "{msg}"
    );
    assert_eq!(dns.calls(), 0, "regions were created: {:?}", dns.regions());
    // Nothing reserved stays behind.
    let left = kv.keys_left();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test]
async fn a_table_whose_metadata_is_over_the_byte_limit_fails_before_any_region_is_created() {
    let kv = Arc::new(LimitedKv::request_bytes(4096));
    let dns = Arc::new(MemoryDatanodeManager::new());
    let c = context(kv.clone(), Arc::new(RaftEngineWalSource), dns.clone());
    // The options go into the info and into each datanode's value: 3 copies of 2,000 bytes.
    let mut t = task("cpu", 2);
    t.options.insert("comment".into(), "x".repeat(2000));
    let err = run_to_end(CreateTableProcedure::new(t, c.clone()), &c)
        .await
        .unwrap_err();
    assert!(!err.is_retryable());
    let msg = err.to_string();
    assert!(
        msg.contains("greptime.public.cpu") && msg.contains("4096"),
        "{msg}"
    );
    assert_eq!(dns.calls(), 0, "regions were created: {:?}", dns.regions());
    let left = kv.keys_left();
    assert!(left.is_empty(), "{left:?}");
}

/// Records every key read (`get`, `batch_get`, `range` start) and forwards to a memory backend.
#[derive(Debug, Default)]
struct ReadKeys {
    inner: MemoryKvBackend,
    read: Mutex<Vec<String>>,
}

impl ReadKeys {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.read.lock().unwrap())
    }
    fn note(&self, key: &[u8]) {
        self.read
            .lock()
            .unwrap()
            .push(String::from_utf8_lossy(key).into_owned());
    }
}

#[async_trait::async_trait]
impl crate::kv::wrapper::KvWrapper for ReadKeys {
    fn inner(&self) -> &dyn KvBackend {
        &self.inner
    }
    async fn get(&self, key: &[u8]) -> crate::kv::Result<Option<crate::kv::KeyValue>> {
        self.note(key);
        self.inner.get(key).await
    }
    async fn batch_get(&self, keys: &[Vec<u8>]) -> crate::kv::Result<Vec<crate::kv::KeyValue>> {
        keys.iter().for_each(|k| self.note(k));
        self.inner.batch_get(keys).await
    }
    async fn range(
        &self,
        req: crate::kv::RangeRequest,
    ) -> crate::kv::Result<crate::kv::RangeResponse> {
        self.note(&req.key);
        self.inner.range(req).await
    }
}

/// Runs the steps of `p` on the one object (no rebuild), applying each step's writes alone; the keys each step read.
async fn keys_read_per_step(mut p: CreateTableProcedure, kv: &ReadKeys) -> Vec<Vec<String>> {
    let mut per_step = Vec::new();
    kv.take();
    loop {
        let status = p.execute(&ctx()).await.unwrap();
        if let Some(writes) = status.writes() {
            writes.apply_alone().await.unwrap();
        }
        per_step.push(kv.take());
        if matches!(status, Status::Done { .. }) {
            return per_step;
        }
    }
}

#[tokio::test]
async fn a_first_run_skips_the_reads_for_an_earlier_runs_writes_and_a_rebuilt_one_does_not() {
    let kv = Arc::new(ReadKeys::default());
    let c = memory_context(kv.clone(), 2);
    let reservation = crate::ddl::allocator::allocation_key("test");

    // Made in this process: Allocate does not look for an older release's reservation, and the last step writes
    // its metadata under conditions without reading it first.
    let first = CreateTableProcedure::new(task("cpu", 2), c.clone());
    let steps = keys_read_per_step(first, &kv).await;
    assert_eq!(steps.len(), 4, "{steps:?}");
    assert!(!steps[1].contains(&reservation), "{steps:?}");
    assert!(steps[3].is_empty(), "the metadata step read {:?}", steps[3]);

    // Rebuilt from its submitted record (a recovery): both reads happen.
    let submitted = CreateTableProcedure::new(task("mem", 2), c.clone())
        .dump()
        .unwrap();
    let rebuilt = CreateTableProcedure::from_json(submitted, c.clone()).unwrap();
    let steps = keys_read_per_step(rebuilt, &kv).await;
    assert_eq!(steps.len(), 4, "{steps:?}");
    assert!(steps[1].contains(&reservation), "{steps:?}");
    let name_key = TableName::new("greptime", "public", "mem").key();
    assert!(steps[3].contains(&name_key), "{steps:?}");
}

#[tokio::test]
async fn a_first_run_whose_keys_were_taken_meanwhile_is_refused_by_the_commit_naming_the_key() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let c = memory_context(kv.clone(), 2);
    // One procedure reaches its last step; meanwhile a writer outside its lock creates the same table.
    let mut p = at_create_regions(&c, task("cpu", 2)).await;
    p.execute(&ctx()).await.unwrap();
    run_to_end(CreateTableProcedure::new(task("cpu", 2), c.clone()), &c)
        .await
        .unwrap();
    let before = kv.range(crate::kv::RangeRequest::prefix("")).await.unwrap();

    let status = p.execute(&ctx()).await.unwrap();
    let err = status.writes().unwrap().apply_alone().await.unwrap_err();
    let name_key = TableName::new("greptime", "public", "cpu").key();
    assert!(
        matches!(&err, procedures::Error::StepConditionFailed { key, .. } if *key == name_key),
        "{err}"
    );
    assert!(!err.is_retryable(), "{err}");
    assert_eq!(
        kv.range(crate::kv::RangeRequest::prefix("")).await.unwrap(),
        before
    );
}
