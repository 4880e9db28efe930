//! A deposed manager's late route change: manager A is held inside a migration's UpdateRoute, just before its
//! transaction, while manager B claims the procedure store's epoch (B has no loader for migrations, so the route
//! stays as it was: only the epoch stands between A and the route). Let go, A's transaction is refused by the epoch
//! condition, A halts (fenced), and the route and `__dn_table` records are exactly as before.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use procedures::{LocalManager, ManagerConfig, ProcedureId, ProcedureManager, ProcedureWithId};
use remote_wal::ddl::datanode_table::{DatanodeTableValue, datanode_table_key};
use remote_wal::ddl::table_route::{TableRouteValue, table_route_key};
use remote_wal::ddl::{
    MigrationContext, REGION_MIGRATION_TYPE_NAME, RegionLeadership, RegionMigrationProcedure,
    RegionMigrationTask, TableMetadataManager,
};
use remote_wal::kv::{
    KeyValue, KvBackend, KvBackendRef, KvStateStore, KvWrapper, MemoryKvBackend, Txn, TxnResponse,
};
use remote_wal::wal::WalOptions;
use tokio::sync::Semaphore;

use crate::support::ddl as support;

const TABLE: u32 = 1024;
const WAIT: Duration = Duration::from_secs(30);

/// Holds every transaction until the test lets it go, and says when one arrived.
#[derive(Debug)]
struct GatedKv {
    inner: KvBackendRef,
    entered: Semaphore,
    release: Semaphore,
}

#[async_trait]
impl KvWrapper for GatedKv {
    fn inner(&self) -> &dyn KvBackend {
        self.inner.as_ref()
    }

    async fn txn(&self, txn: Txn) -> remote_wal::Result<TxnResponse> {
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
    let gated = Arc::new(GatedKv {
        inner: kv.clone(),
        entered: Semaphore::new(0),
        release: Semaphore::new(0),
    });
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
