//! A migration whose target fails after the route moved to it: WaitLeader ends the migration (failed for good,
//! naming the target) as soon as the target is declared failed, instead of waiting for a leader that will never
//! come, so the region's lock is free for the failover's own migration of the region. Without the check the
//! procedure retries "not leading yet" forever and the wait below runs out.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use procedures::{LocalManager, ManagerConfig, ProcedureId, ProcedureManager, ProcedureWithId};
use remote_wal::ddl::{
    MigrationContext, REGION_MIGRATION_TYPE_NAME, RegionLeadership, RegionMigrationProcedure,
    RegionMigrationTask, TableMetadataManager,
};
use remote_wal::key::datanode_table::{DatanodeTableValue, datanode_table_key};
use remote_wal::key::table_route::{TableRouteValue, table_route_key};
use remote_wal::kv::{KeyValue, KvBackendRef, KvStateStore, MemoryKvBackend};
use remote_wal::wal::WalOptions;

const TABLE: u32 = 1024;
/// A liveness guard, not a bound: the migration ends well before it once the target is failed.
const WAIT: Duration = Duration::from_secs(60);

/// No datanode leads the region; datanode 2 was declared failed.
#[derive(Debug)]
struct TargetFailed;

#[async_trait]
impl RegionLeadership for TargetFailed {
    async fn region_leader(&self, _region_id: u64) -> Option<(u64, u64)> {
        None
    }

    async fn live_datanodes(&self) -> Vec<u64> {
        vec![1]
    }

    async fn has_failed(&self, datanode_id: u64) -> bool {
        datanode_id == 2
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_whose_target_failed_ends_naming_it_with_the_route_moved() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
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
    kv.batch_put(
        vec![
            KeyValue {
                key: table_route_key(TABLE).into_bytes(),
                value: serde_json::to_vec(&route).unwrap(),
            },
            KeyValue {
                key: datanode_table_key(1, TABLE).into_bytes(),
                value: serde_json::to_vec(&record).unwrap(),
            },
        ],
        false,
    )
    .await
    .unwrap();
    let context = MigrationContext {
        metadata: Arc::new(TableMetadataManager::new(kv.clone())),
        datanode_ids: vec![1, 2],
        leadership: Arc::new(TargetFailed),
        epoch_key: None,
    };
    let manager = LocalManager::new(
        Arc::new(KvStateStore::new(kv.clone())),
        ManagerConfig::default(),
    );
    manager
        .register_loader(
            REGION_MIGRATION_TYPE_NAME,
            RegionMigrationProcedure::loader(context.clone()),
        )
        .unwrap();
    manager.start().await.unwrap();
    let region_id = u64::from(TABLE) << 32;
    let mut watcher = manager
        .submit(ProcedureWithId::new(
            ProcedureId::new("to-a-failed-target"),
            Box::new(RegionMigrationProcedure::new(
                RegionMigrationTask {
                    region_id,
                    to: 2,
                    only_from: None,
                },
                context,
            )),
        ))
        .await
        .unwrap();
    let outcome = tokio::time::timeout(WAIT, watcher.wait())
        .await
        .expect("the migration ends once its target is failed");
    let error = outcome
        .expect_err("a target that failed never leads")
        .to_string();
    assert!(
        error.contains(&format!(
            "region {region_id}: datanode 2 failed before it led the region at epoch 1"
        )),
        "{error}"
    );
    // The route moved before the target failed: the failover of datanode 2 lists the region and moves it on.
    let stored = kv
        .get(table_route_key(TABLE).as_bytes())
        .await
        .unwrap()
        .unwrap();
    let moved: TableRouteValue = serde_json::from_slice(&stored.value).unwrap();
    assert_eq!(moved.region_routes.get(&0), Some(&2), "{moved:?}");
    manager.stop().await.unwrap();
}
