//! The drop-table procedure under the crash matrix: a crash before or after every durable write (and a second
//! crash during recovery), with the procedure state in the metadata kv and apart from it, must end exactly as an
//! uncrashed run: every key of the dropped table gone — name, info, route, `__dn_table` records and its regions'
//! `__topic_region` keys — no tombstone left, and the other table untouched. A cancel before the tombstones are
//! deleted puts every key back.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use procedures::testing::{
    CrashScenario, MatrixConfig, StoreDigest, run_crash_matrix, store_digest,
};
use procedures::{
    LocalManager, ManagerConfig, MemoryStateStore, ProcedureId, ProcedureManager, ProcedureWithId,
    StateStore,
};
use remote_wal::ddl::{
    CREATE_TABLE_TYPE_NAME, CreateTableProcedure, CreateTableTask, DROP_TABLE_TYPE_NAME,
    DropTableProcedure, DropTableTask, MemoryDatanodeManager, MigrationContext, RegionLeadership,
    TableMetadataManager, TableName,
};
use remote_wal::kv::{KvBackendRef, KvStateStore, MemoryKvBackend, RangeRequest};

use crate::support::ddl as support;

const DATANODES: [u64; 2] = [1, 2];

/// Nobody leads anything: the datanodes closed the dropped table's regions.
#[derive(Debug)]
struct Closed;

#[async_trait]
impl RegionLeadership for Closed {
    async fn region_leader(&self, _region_id: u64) -> Option<(u64, u64)> {
        None
    }

    async fn live_datanodes(&self) -> Vec<u64> {
        DATANODES.to_vec()
    }
}

fn table(name: &str) -> TableName {
    TableName::new("greptime", "public", name)
}

/// Every key the tables and the drop write, as text.
async fn snapshot(kv: &KvBackendRef) -> BTreeMap<String, String> {
    let mut out = support::metadata_snapshot(kv).await;
    for prefix in ["__topic_region/", "__tombstone/", "__region_drop/"] {
        for found in remote_wal::kv::range_all(kv.as_ref(), RangeRequest::prefix(prefix), 128)
            .await
            .expect("kv readable")
        {
            out.insert(
                String::from_utf8_lossy(&found.key).into_owned(),
                String::from_utf8_lossy(&found.value).into_owned(),
            );
        }
    }
    out
}

/// A kv with tables `cpu` (3 regions) and `mem` (1 region) on a 2-topic Kafka pool, made by create-table.
async fn two_tables() -> KvBackendRef {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let context = support::context(
        kv.clone(),
        DATANODES.to_vec(),
        Arc::new(support::FakeKafkaPool::new(2)),
        Arc::new(MemoryDatanodeManager::new()),
    );
    let manager = LocalManager::new(Arc::new(MemoryStateStore::new()), ManagerConfig::default());
    manager
        .register_loader(
            CREATE_TABLE_TYPE_NAME,
            CreateTableProcedure::loader(context.clone()),
        )
        .unwrap();
    manager.start().await.unwrap();
    for (name, regions) in [("cpu", 3), ("mem", 1)] {
        manager
            .submit(ProcedureWithId::with_random_id(Box::new(
                CreateTableProcedure::new(
                    CreateTableTask::new(table(name), regions),
                    context.clone(),
                ),
            )))
            .await
            .unwrap()
            .wait()
            .await
            .unwrap();
    }
    manager.stop().await.unwrap();
    kv
}

struct DropScenario {
    state_in_kv: bool,
    /// The kv the environments copy, and the id of `cpu` in it.
    template: BTreeMap<String, String>,
    table_id: u32,
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

impl DropScenario {
    fn context(&self, env: &Env) -> MigrationContext {
        MigrationContext {
            metadata: Arc::new(TableMetadataManager::new(env.kv.clone())),
            datanode_ids: DATANODES.to_vec(),
            leadership: Arc::new(Closed),
            epoch_key: None,
        }
    }

    fn task(&self) -> DropTableTask {
        DropTableTask {
            name: table("cpu"),
            if_exists: false,
            table_id: Some(self.table_id),
        }
    }
}

#[async_trait]
impl CrashScenario for DropScenario {
    type Env = Env;
    type Outcome = Outcome;

    async fn new_env(&self) -> Env {
        let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
        let kvs = self
            .template
            .iter()
            .map(|(k, v)| remote_wal::kv::KeyValue {
                key: k.clone().into_bytes(),
                value: v.clone().into_bytes(),
            })
            .collect();
        kv.batch_put(kvs, false).await.unwrap();
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
            DROP_TABLE_TYPE_NAME,
            DropTableProcedure::loader(self.context(env)),
        )
    }

    fn procedures(&self, env: &Env) -> Vec<ProcedureWithId> {
        vec![ProcedureWithId::new(
            ProcedureId::new("drop-cpu"),
            Box::new(DropTableProcedure::new(self.task(), self.context(env))),
        )]
    }

    async fn outcome(&self, env: &Env) -> Outcome {
        Outcome {
            store: store_digest(env.store.as_ref())
                .await
                .expect("store readable"),
            metadata: snapshot(&env.kv).await,
        }
    }
}

async fn scenario(state_in_kv: bool) -> DropScenario {
    let kv = two_tables().await;
    let template = snapshot(&kv).await;
    let table_id: u32 = template
        .get("__table_name/greptime/public/cpu")
        .and_then(|v| serde_json::from_str::<serde_json::Value>(v).ok())
        .and_then(|v| v["table_id"].as_u64())
        .expect("cpu's id") as u32;
    DropScenario {
        state_in_kv,
        template,
        table_id,
    }
}

async fn run(state_in_kv: bool) {
    let scenario = scenario(state_in_kv).await;
    let id = scenario.table_id;
    let before = scenario.template.clone();
    assert_eq!(
        before
            .keys()
            .filter(|k| k.starts_with("__topic_region/"))
            .count(),
        4,
        "{before:?}"
    );

    let env = scenario.new_env().await;
    let manager = LocalManager::new(env.store.clone(), MatrixConfig::default().manager);
    scenario.register_loaders(&env, &manager).unwrap();
    manager.start().await.unwrap();
    for root in scenario.procedures(&env) {
        let out = manager.submit(root).await.unwrap().wait().await.unwrap();
        assert_eq!(
            out,
            Some(serde_json::json!({"table_id": id, "dropped": true, "regions": 3}))
        );
    }
    manager.stop().await.unwrap();
    let golden = scenario.outcome(&env).await;
    // What is left is exactly `mem`'s keys and the id sequence.
    let expected: BTreeMap<String, String> = before
        .iter()
        .filter(|(k, _)| {
            let of_cpu = k.ends_with(&format!("/{id}"))
                || k.as_str() == "__table_name/greptime/public/cpu"
                || (k.starts_with("__topic_region/")
                    && k.contains(&format!("/{}", u64::from(id) << 32)))
                || (k.starts_with("__topic_region/")
                    && (0..3).any(|n| k.ends_with(&format!("/{}", (u64::from(id) << 32) | n))));
            !of_cpu
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // Each of `cpu`'s regions is left for the datanodes to delete, as a region on a Kafka topic.
    let (drops, rest): (BTreeMap<String, String>, BTreeMap<String, String>) = golden
        .metadata
        .clone()
        .into_iter()
        .partition(|(k, _)| k.starts_with("__region_drop/"));
    assert_eq!(rest, expected);
    let dropped: Vec<String> = (0..3)
        .map(|n| format!("__region_drop/{}", (u64::from(id) << 32) | n))
        .collect();
    assert_eq!(drops.keys().cloned().collect::<Vec<_>>(), dropped);
    for value in drops.values() {
        let value: serde_json::Value = serde_json::from_str(value).unwrap();
        assert_eq!(value["table_id"], id, "{value}");
        assert_eq!(value["wal"], "kafka", "{value}");
    }
    assert!(
        golden
            .metadata
            .keys()
            .any(|k| k == "__table_name/greptime/public/mem")
    );

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
    // The epoch claim, the submission, Prepare's record (the keys), DeleteMetadata's commit of the tombstones,
    // WaitClosed's record, and DeleteTombstones with the `done` record. With the state apart from the metadata,
    // the two metadata commits are written alone first, each followed by a side-effect point.
    let alone = if state_in_kv { 0 } else { 2 };
    assert_eq!(report.transitions, 6);
    assert_eq!(report.side_effect_points, alone);
    assert_eq!(report.unreached_crash_points, 0);
    assert_eq!(report.single_crash_cases, 2 * 6 + alone);
    assert!(report.double_crash_cases > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_table_survives_every_crash_point_state_in_kv() {
    run(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_table_survives_every_crash_point_state_apart() {
    run(false).await;
}

/// Cancelled while it waits for the datanodes to close the regions: every key comes back from its tombstone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drop_cancelled_before_its_tombstones_go_puts_every_key_back() {
    #[derive(Debug)]
    struct StillOpen;
    #[async_trait]
    impl RegionLeadership for StillOpen {
        async fn region_leader(&self, _region_id: u64) -> Option<(u64, u64)> {
            Some((1, 0))
        }
        async fn live_datanodes(&self) -> Vec<u64> {
            DATANODES.to_vec()
        }
    }
    let scenario = scenario(true).await;
    let env = scenario.new_env().await;
    let before = snapshot(&env.kv).await;
    let context = MigrationContext {
        leadership: Arc::new(StillOpen),
        ..scenario.context(&env)
    };
    let manager = LocalManager::new(env.store.clone(), ManagerConfig::default());
    manager
        .register_loader(
            DROP_TABLE_TYPE_NAME,
            DropTableProcedure::loader(context.clone()),
        )
        .unwrap();
    manager.start().await.unwrap();
    let id = ProcedureId::new("drop-then-cancel");
    let mut watcher = manager
        .submit(ProcedureWithId::new(
            id.clone(),
            Box::new(DropTableProcedure::new(scenario.task(), context)),
        ))
        .await
        .unwrap();
    // Waiting in WaitClosed: the table is gone, its keys are tombstones.
    for _ in 0..3000 {
        if watcher.info().step_name.as_deref() == Some("WaitClosed")
            && !snapshot(&env.kv)
                .await
                .contains_key("__table_name/greptime/public/cpu")
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(
        snapshot(&env.kv)
            .await
            .keys()
            .any(|k| k.starts_with("__tombstone/"))
    );
    manager.cancel(&id).await.unwrap();
    let err = watcher.wait().await.unwrap_err().to_string();
    assert!(err.contains("cancelled"), "{err}");
    assert_eq!(
        snapshot(&env.kv).await,
        before,
        "every key back, no tombstone left"
    );
    manager.stop().await.unwrap();
}
