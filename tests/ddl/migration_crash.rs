//! The region-migration procedure under the crash matrix: a crash before or after every durable write and after
//! the route's transaction (and a second crash during recovery), with the procedure state in the metadata kv
//! (its route changes fenced by the manager's epoch) and apart from it, must end exactly
//! as an uncrashed run: the route names the target at epoch + 1 (its version bumped once), the region is listed in
//! the target's `__dn_table` record with its WAL options and in no other, and nothing else changed.
//!
//! The datanodes are a fake leadership that reports the route's datanode as the region's leader at the route's
//! epoch, as the registry does once the target heartbeats after the old leader's lease ran out
//! (`tests/datanodes/migration.rs` tests that part on the registry itself).

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use procedures::testing::{
    CrashScenario, MatrixConfig, StoreDigest, run_crash_matrix, store_digest,
};
use procedures::{MemoryStateStore, ProcedureId, ProcedureManager, ProcedureWithId, StateStore};
use remote_wal::ddl::{
    MigrationContext, REGION_MIGRATION_TYPE_NAME, RegionMigrationProcedure, RegionMigrationTask,
    TableMetadataManager,
};
use remote_wal::key::datanode_table::{DatanodeTableValue, datanode_table_key};
use remote_wal::key::table_route::{TableRouteValue, table_route_key};
use remote_wal::kv::{KeyValue, KvBackendRef, KvStateStore, MemoryKvBackend};
use remote_wal::wal::WalOptions;

use crate::support::ddl as support;

const TABLE: u32 = 1024;

struct MigrationScenario {
    /// Region number → datanode.
    placement: BTreeMap<u32, u64>,
    /// The region moved, and where to.
    region: u32,
    to: u64,
    state_in_kv: bool,
}

struct Env {
    kv: KvBackendRef,
    store: Arc<dyn StateStore>,
}

#[derive(Debug, PartialEq)]
struct Outcome {
    store: StoreDigest,
    metadata: BTreeMap<String, String>,
}

fn wal(number: u32) -> String {
    WalOptions::kafka(format!("pool_topic_{}", number % 2)).encode()
}

impl MigrationScenario {
    /// The table's metadata before the migration: its route and one `__dn_table` record per datanode.
    fn initial(&self) -> Vec<KeyValue> {
        support::table_keys(TABLE, &self.placement, &wal)
    }

    fn region_id(&self) -> u64 {
        (u64::from(TABLE) << 32) | u64::from(self.region)
    }

    fn context(&self, env: &Env) -> MigrationContext {
        MigrationContext {
            metadata: Arc::new(TableMetadataManager::new(env.kv.clone())),
            datanode_ids: vec![1, 2, 3],
            leadership: Arc::new(support::RouteLeadership {
                kv: env.kv.clone(),
                live: vec![1, 2, 3],
            }),
            epoch_key: self.state_in_kv.then(|| {
                format!(
                    "{}{}",
                    remote_wal::kv::state_store::PROCEDURE_PREFIX,
                    procedures::record::EPOCH_KEY
                )
            }),
        }
    }

    /// What must hold after any run.
    fn violations(&self, metadata: &BTreeMap<String, String>) -> Vec<String> {
        let mut v = Vec::new();
        let route: TableRouteValue = match metadata.get(&table_route_key(TABLE)) {
            Some(text) => serde_json::from_str(text).unwrap(),
            None => return vec!["the route is gone".to_string()],
        };
        let from = self.placement[&self.region];
        if route.region_routes.get(&self.region) != Some(&self.to)
            || route.region_epoch(self.region) != 1
            || route.version != 2
        {
            v.push(format!("route {route:?}"));
        }
        for (number, dn) in &self.placement {
            let expected = if *number == self.region { self.to } else { *dn };
            if route.region_routes.get(number) != Some(&expected) {
                v.push(format!(
                    "region {number} routed to {:?}",
                    route.region_routes.get(number)
                ));
            }
        }
        let mut listing = Vec::new();
        for dn in [1u64, 2, 3] {
            if let Some(text) = metadata.get(&datanode_table_key(dn, TABLE)) {
                let value: DatanodeTableValue = serde_json::from_str(text).unwrap();
                if value.regions.is_empty() {
                    v.push(format!("datanode {dn} keeps an empty record"));
                }
                if value.regions.contains(&self.region) {
                    listing.push(dn);
                    if value.region_wal_options.get(&self.region) != Some(&wal(self.region)) {
                        v.push(format!(
                            "datanode {dn} lists the region without its WAL options"
                        ));
                    }
                }
            } else if dn == self.to {
                v.push(format!("the target {dn} has no record"));
            }
        }
        if listing != [self.to] {
            v.push(format!(
                "the region is listed by {listing:?}, moved from {from}"
            ));
        }
        v
    }
}

#[async_trait]
impl CrashScenario for MigrationScenario {
    type Env = Env;
    type Outcome = Outcome;

    async fn new_env(&self) -> Env {
        let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
        kv.batch_put(self.initial(), false).await.unwrap();
        let store: Arc<dyn StateStore> = if self.state_in_kv {
            Arc::new(KvStateStore::new(kv.clone()))
        } else {
            Arc::new(MemoryStateStore::new())
        };
        Env { kv, store }
    }

    fn state_store(&self, env: &Env) -> Arc<dyn StateStore> {
        env.store.clone()
    }

    fn register_loaders(
        &self,
        env: &Env,
        manager: &dyn ProcedureManager,
    ) -> procedures::Result<()> {
        manager.register_loader(
            REGION_MIGRATION_TYPE_NAME,
            RegionMigrationProcedure::loader(self.context(env)),
        )
    }

    fn procedures(&self, env: &Env) -> Vec<ProcedureWithId> {
        vec![ProcedureWithId::new(
            ProcedureId::new("migrate"),
            Box::new(RegionMigrationProcedure::new(
                RegionMigrationTask {
                    region_id: self.region_id(),
                    to: self.to,
                    only_from: None,
                },
                self.context(env),
            )),
        )]
    }

    async fn outcome(&self, env: &Env) -> Outcome {
        Outcome {
            store: store_digest(env.store.as_ref())
                .await
                .expect("store readable"),
            metadata: support::metadata_snapshot(&env.kv).await,
        }
    }
}

async fn run(scenario: MigrationScenario) {
    // The golden run holds the invariants; the matrix holds every case to it.
    let env = scenario.new_env().await;
    let manager = procedures::LocalManager::new(env.store.clone(), MatrixConfig::default().manager);
    scenario.register_loaders(&env, &manager).unwrap();
    manager.start().await.unwrap();
    for root in scenario.procedures(&env) {
        let out = manager.submit(root).await.unwrap().wait().await.unwrap();
        assert_eq!(
            out,
            Some(serde_json::json!({
                "region_id": scenario.region_id(),
                "from": scenario.placement[&scenario.region],
                "to": scenario.to,
                "epoch": 1,
            }))
        );
    }
    manager.stop().await.unwrap();
    let golden = scenario.outcome(&env).await;
    assert_eq!(scenario.violations(&golden.metadata), Vec::<String>::new());

    let report = run_crash_matrix(&scenario, MatrixConfig::default()).await;
    println!(
        "{} transitions, {} side-effect points, {} single-crash + {} double-crash + {} lost-answer cases",
        report.transitions,
        report.side_effect_points,
        report.single_crash_cases,
        report.double_crash_cases,
        report.lost_answer_cases,
    );
    report.assert_no_mismatch();
    // Durable writes: the epoch claim, the submission, Prepare's record (source and epochs), UpdateRoute's record,
    // the `done` record; one side effect: UpdateRoute's transaction of the route and both __dn_table records,
    // before its record.
    assert_eq!(report.transitions, 5);
    assert_eq!(report.side_effect_points, 1);
    assert_eq!(report.unreached_crash_points, 0);
    assert_eq!(report.single_crash_cases, 2 * report.transitions + 1);
    assert!(report.double_crash_cases > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn region_migration_survives_every_crash_point_state_in_kv() {
    run(MigrationScenario {
        placement: BTreeMap::from([(0, 1), (1, 2), (2, 1)]),
        region: 0,
        to: 2,
        state_in_kv: true,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn region_migration_of_a_datanodes_last_region_to_a_new_one_survives_every_crash_point() {
    run(MigrationScenario {
        placement: BTreeMap::from([(0, 1)]),
        region: 0,
        to: 3,
        state_in_kv: false,
    })
    .await;
}
