//! A deposed manager's late writes. Manager A is held just before a transaction — a migration's route change, or a
//! cancelled drop's rollback putting a key back — while manager B claims the procedure store's epoch (B has no
//! loader for the procedure, so nothing else moves: only the epoch stands between A and the keys). Let go, A's
//! transaction is refused by the epoch condition, A halts (fenced), and the keys are exactly as B found them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use procedures::{LocalManager, ManagerConfig, ProcedureId, ProcedureManager, ProcedureWithId};
use remote_wal::ddl::{
    DROP_TABLE_TYPE_NAME, DropTableProcedure, DropTableTask, MigrationContext,
    REGION_MIGRATION_TYPE_NAME, RegionLeadership, RegionMigrationProcedure, RegionMigrationTask,
    TableMetadataManager, TableName,
};
use remote_wal::key::datanode_table::{DatanodeTableValue, datanode_table_key};
use remote_wal::key::table_route::{TableRouteValue, table_route_key};
use remote_wal::kv::{
    KeyValue, KvBackend, KvBackendRef, KvStateStore, KvWrapper, MemoryKvBackend, Txn, TxnResponse,
};
use remote_wal::wal::WalOptions;
use tokio::sync::Semaphore;

use crate::support::ddl as support;

const TABLE: u32 = 1024;
const WAIT: Duration = Duration::from_secs(30);

/// Once armed, holds every transaction until the test lets it go, and says when one arrived.
#[derive(Debug)]
struct GatedKv {
    inner: KvBackendRef,
    armed: AtomicBool,
    entered: Semaphore,
    release: Semaphore,
}

impl GatedKv {
    fn new(inner: KvBackendRef, armed: bool) -> Arc<Self> {
        Arc::new(GatedKv {
            inner,
            armed: AtomicBool::new(armed),
            entered: Semaphore::new(0),
            release: Semaphore::new(0),
        })
    }
}

#[async_trait]
impl KvWrapper for GatedKv {
    fn inner(&self) -> &dyn KvBackend {
        self.inner.as_ref()
    }

    async fn txn(&self, txn: Txn) -> remote_wal::kv::Result<TxnResponse> {
        if !self.armed.load(Ordering::SeqCst) {
            return self.inner.txn(txn).await;
        }
        self.entered.add_permits(1);
        if let Ok(permit) = self.release.acquire().await {
            permit.forget();
        }
        self.inner.txn(txn).await
    }
}

#[derive(Debug)]
struct NoLeader;

#[async_trait]
impl RegionLeadership for NoLeader {
    async fn region_leader(&self, _region_id: u64) -> Option<(u64, u64)> {
        None
    }

    async fn live_datanodes(&self) -> Vec<u64> {
        vec![1, 2]
    }
}

fn initial() -> Vec<KeyValue> {
    let route = TableRouteValue {
        region_routes: BTreeMap::from([(0, 1)]),
        version: 1,
        region_epochs: BTreeMap::new(),
    };
    let record = DatanodeTableValue {
        table_id: TABLE,
        regions: vec![0],
        engine: "mito".to_string(),
        region_storage_path: "greptime/public".to_string(),
        region_options: BTreeMap::new(),
        region_wal_options: BTreeMap::from([(0, WalOptions::kafka("t").encode())]),
        version: 1,
    };
    vec![
        KeyValue {
            key: table_route_key(TABLE).into_bytes(),
            value: serde_json::to_vec(&route).unwrap(),
        },
        KeyValue {
            key: datanode_table_key(1, TABLE).into_bytes(),
            value: serde_json::to_vec(&record).unwrap(),
        },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_managers_late_route_change_is_refused_by_the_epoch_and_it_halts() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    kv.batch_put(initial(), false).await.unwrap();
    let before = support::metadata_snapshot(&kv).await;
    let gated = GatedKv::new(kv.clone(), true);
    let context = MigrationContext {
        metadata: Arc::new(TableMetadataManager::new(gated.clone())),
        datanode_ids: vec![1, 2],
        leadership: Arc::new(NoLeader),
        epoch_key: Some("__procedure__/epoch".to_string()),
    };

    let a = LocalManager::new(
        Arc::new(KvStateStore::new(kv.clone())),
        ManagerConfig::default(),
    );
    a.register_loader(
        REGION_MIGRATION_TYPE_NAME,
        RegionMigrationProcedure::loader(context.clone()),
    )
    .unwrap();
    a.start().await.unwrap();
    let id = ProcedureId::new("late-move");
    let mut watcher = a
        .submit(ProcedureWithId::new(
            id.clone(),
            Box::new(RegionMigrationProcedure::new(
                RegionMigrationTask {
                    region_id: u64::from(TABLE) << 32,
                    to: 2,
                    only_from: None,
                },
                context,
            )),
        ))
        .await
        .unwrap();
    // A is inside UpdateRoute, its transaction built against epoch 1.
    tokio::time::timeout(WAIT, gated.entered.acquire())
        .await
        .expect("A reaches its route transaction")
        .unwrap()
        .forget();

    // B claims the store: the procedure is B's now (B cannot run it: no loader, so the route stays).
    let b = LocalManager::new(
        Arc::new(KvStateStore::new(kv.clone())),
        ManagerConfig::default(),
    );
    b.start().await.unwrap();
    assert!(b.epoch() > a.epoch(), "{:?} {:?}", b.epoch(), a.epoch());

    gated.release.add_permits(1);
    let outcome = tokio::time::timeout(WAIT, watcher.wait())
        .await
        .expect("A stops");
    assert!(
        outcome.is_err(),
        "the deposed manager finished the migration: {outcome:?}"
    );
    assert_eq!(
        support::metadata_snapshot(&kv).await,
        before,
        "the route moved"
    );
    // A halted: fenced, it refuses new work naming the newer epoch.
    let err = a
        .submit(ProcedureWithId::new(
            ProcedureId::new("more"),
            Box::new(RegionMigrationProcedure::new(
                RegionMigrationTask {
                    region_id: u64::from(TABLE) << 32,
                    to: 2,
                    only_from: None,
                },
                MigrationContext {
                    metadata: Arc::new(TableMetadataManager::new(kv.clone())),
                    datanode_ids: vec![1, 2],
                    leadership: Arc::new(NoLeader),
                    epoch_key: None,
                },
            )),
        ))
        .await
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(err.contains("fenced by epoch"), "{err}");
    b.stop().await.unwrap();
}

#[derive(Debug)]
struct StillOpen;

#[async_trait]
impl RegionLeadership for StillOpen {
    async fn region_leader(&self, _region_id: u64) -> Option<(u64, u64)> {
        Some((1, 0))
    }

    async fn live_datanodes(&self) -> Vec<u64> {
        vec![1, 2]
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_managers_late_drop_rollback_puts_nothing_back_and_it_halts() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let mut keys = initial();
    keys.push(KeyValue {
        key: b"__table_name/greptime/public/gone".to_vec(),
        value: format!("{{\"table_id\":{TABLE}}}").into_bytes(),
    });
    kv.batch_put(keys, false).await.unwrap();
    let gated = GatedKv::new(kv.clone(), false);
    let context = MigrationContext {
        metadata: Arc::new(TableMetadataManager::new(gated.clone())),
        datanode_ids: vec![1, 2],
        leadership: Arc::new(StillOpen),
        epoch_key: Some("__procedure__/epoch".to_string()),
    };
    let a = LocalManager::new(
        Arc::new(KvStateStore::new(kv.clone())),
        ManagerConfig::default(),
    );
    a.register_loader(
        DROP_TABLE_TYPE_NAME,
        DropTableProcedure::loader(context.clone()),
    )
    .unwrap();
    a.start().await.unwrap();
    let id = ProcedureId::new("late-rollback");
    let mut watcher = a
        .submit(ProcedureWithId::new(
            id.clone(),
            Box::new(DropTableProcedure::new(
                DropTableTask {
                    name: TableName::new("greptime", "public", "gone"),
                    if_exists: false,
                    table_id: Some(TABLE),
                },
                context,
            )),
        ))
        .await
        .unwrap();
    // The drop waits for the datanodes (one still leads a region): its keys are tombstones.
    let deadline = tokio::time::Instant::now() + WAIT;
    while watcher.info().step_name.as_deref() != Some("WaitClosed") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never reached WaitClosed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let dropped = support::metadata_snapshot(&kv).await;
    assert!(!dropped.contains_key("__table_name/greptime/public/gone"));

    // Cancelled: A's rollback is held before its first write, while B claims the store.
    gated.armed.store(true, Ordering::SeqCst);
    a.cancel(&id).await.unwrap();
    tokio::time::timeout(WAIT, gated.entered.acquire())
        .await
        .expect("A's rollback reaches its transaction")
        .unwrap()
        .forget();
    let b = LocalManager::new(
        Arc::new(KvStateStore::new(kv.clone())),
        ManagerConfig::default(),
    );
    b.start().await.unwrap();
    gated.release.add_permits(16);
    gated.armed.store(false, Ordering::SeqCst);
    let outcome = tokio::time::timeout(WAIT, watcher.wait())
        .await
        .expect("A stops");
    assert!(outcome.is_err(), "{outcome:?}");
    // Nothing came back: the table stays dropped for B to finish.
    assert_eq!(
        support::metadata_snapshot(&kv).await,
        dropped,
        "a key was put back"
    );
    b.stop().await.unwrap();
}
