//! The create-table procedure under the crash matrix: a crash before or after every durable write and at every
//! region creation, then recovery (and a second crash during it), must end exactly as an uncrashed run — one
//! table, one id, the same placement and WAL options, each region created once, and the same regions to open on
//! every datanode.

use crate::support::ddl as support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use procedures::testing::{
    CrashScenario, MatrixConfig, RootResult, StoreDigest, run_crash_matrix, store_digest,
};
use procedures::{MemoryStateStore, ProcedureId, ProcedureManager, ProcedureWithId, StateStore};
use remote_wal::datanode::{RegionOpenRequest, WalProviderKind};
use remote_wal::ddl::datanode_manager::RegionCreateRequest;
use remote_wal::ddl::{
    CREATE_TABLE_TYPE_NAME, CreateTableProcedure, CreateTableTask, DdlContext,
    MemoryDatanodeManager, RaftEngineWalSource, TableName, WalOptionsSourceRef,
};
use remote_wal::kv::{KeyValue, KvBackendRef, KvStateStore, MemoryKvBackend};
use remote_wal::wal::kafka::TopicPoolSpec;
use remote_wal::wal::kafka::admin::TopicAdminRef;
use remote_wal::wal::kafka::rskafka_admin::RsKafkaTopicAdmin;
use remote_wal::wal::{KafkaConfig, WalOptions};

const DATANODES: [u64; 3] = [1, 2, 3];

/// Where the WAL options come from.
#[derive(Clone, Debug)]
enum Provider {
    /// Every region on raft-engine.
    RaftEngine,
    /// The real `WalOptionsAllocator::Kafka` over a pool bootstrapped once (through `admin`), whose persisted topic
    /// keys are copied into each case's fresh kv.
    Kafka {
        spec: TopicPoolSpec,
        admin: TopicAdminRef,
        pool: Vec<KeyValue>,
    },
}

struct CreateTableScenario {
    provider: Provider,
    num_regions: u32,
    /// Procedure state in the same kv as the metadata (`KvStateStore`), as a metasrv runs; else a separate
    /// `MemoryStateStore`.
    state_in_kv: bool,
}

struct Env {
    store: Arc<dyn StateStore>,
    kv: KvBackendRef,
    datanodes: Arc<MemoryDatanodeManager>,
    wal: WalOptionsSourceRef,
    /// The context of the manager currently running (rebuilt for each manager, as a restarted process would).
    current: Mutex<Option<DdlContext>>,
}

/// Compared up to the table id (see [`Outcome::canonical`]).
#[derive(Debug)]
struct Outcome {
    store: StoreDigest,
    metadata: BTreeMap<String, String>,
    regions: BTreeMap<u64, BTreeMap<u64, RegionCreateRequest>>,
    creations: BTreeMap<u64, usize>,
    open: BTreeMap<u64, (Vec<RegionOpenRequest>, Vec<String>)>,
    /// Broken invariants (must be empty in the golden run, checked separately).
    violations: Vec<String>,
}

impl Outcome {
    /// Everything but the violations as text, with the table id (and the region ids and the id sequence value made
    /// from it) replaced by placeholders. The allocation becomes durable only with the Allocate step's record: a
    /// crash before that commit makes the recovered run allocate again, from the id sequence's next batch (ids are
    /// never reused). Everything else — one table, its placement, its WAL options, each region created once — must
    /// be exactly as in the uncrashed run.
    fn canonical(&self) -> String {
        let mut text = format!(
            "{:?}",
            (
                &self.store,
                &self.metadata,
                &self.regions,
                &self.creations,
                &self.open
            )
        );
        let id = self
            .metadata
            .iter()
            .find(|(k, _)| k.starts_with("__table_name/"))
            .and_then(|(_, v)| serde_json::from_str::<serde_json::Value>(v).ok())
            .and_then(|v| v["table_id"].as_u64());
        if let Some(seq) = self.metadata.get("__table_id_seq") {
            text = text.replace(
                &format!("{:?}: {:?}", "__table_id_seq", seq),
                "\"__table_id_seq\": SEQ",
            );
        }
        if let Some(id) = id {
            for n in (0..64u64).rev() {
                text = text.replace(&((id << 32) | n).to_string(), &format!("REGION{n}"));
            }
            text = text.replace(&id.to_string(), "TABLE");
        }
        text
    }
}

impl PartialEq for Outcome {
    fn eq(&self, other: &Self) -> bool {
        self.violations == other.violations && self.canonical() == other.canonical()
    }
}

impl CreateTableScenario {
    fn wal_kind(&self) -> WalProviderKind {
        match self.provider {
            Provider::RaftEngine => WalProviderKind::RaftEngine,
            Provider::Kafka { .. } => WalProviderKind::Kafka,
        }
    }

    fn task(&self) -> CreateTableTask {
        let mut task = CreateTableTask::new(
            TableName::new("greptime", "public", "cpu"),
            self.num_regions,
        );
        task.options.insert("ttl".into(), "7d".into());
        task
    }
}

#[async_trait]
impl CrashScenario for CreateTableScenario {
    type Env = Env;
    type Outcome = Outcome;

    async fn new_env(&self) -> Env {
        let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
        let wal: WalOptionsSourceRef = match &self.provider {
            Provider::RaftEngine => Arc::new(RaftEngineWalSource),
            Provider::Kafka { spec, admin, pool } => {
                kv.batch_put(pool.clone(), false)
                    .await
                    .expect("kv writable");
                Arc::new(support::kafka_allocator(spec.clone(), admin.clone(), kv.clone()).await)
            }
        };
        let store: Arc<dyn StateStore> = if self.state_in_kv {
            Arc::new(KvStateStore::new(kv.clone()))
        } else {
            Arc::new(MemoryStateStore::new())
        };
        Env {
            store,
            kv,
            datanodes: Arc::new(MemoryDatanodeManager::new()),
            wal,
            current: Mutex::new(None),
        }
    }

    fn state_store(&self, env: &Env) -> Arc<dyn StateStore> {
        env.store.clone()
    }

    fn register_loaders(
        &self,
        env: &Env,
        manager: &dyn ProcedureManager,
    ) -> procedures::Result<()> {
        // A restarted process has a fresh WAL allocator (its selector starts over); it loads the persisted pool on
        // its first allocation.
        let wal: WalOptionsSourceRef = match &self.provider {
            Provider::RaftEngine => env.wal.clone(),
            Provider::Kafka { spec, admin, .. } => {
                let topics = remote_wal::wal::kafka::KafkaTopicManager::new(
                    spec.clone(),
                    env.kv.clone(),
                    admin.clone(),
                    Arc::new(remote_wal::wal::kafka::RoundRobinTopicSelector::new()),
                )
                .expect("valid spec");
                Arc::new(remote_wal::wal::WalOptionsAllocator::Kafka(topics))
            }
        };
        let context = support::context(
            env.kv.clone(),
            DATANODES.to_vec(),
            wal,
            env.datanodes.clone(),
        );
        *env.current.lock().unwrap() = Some(context.clone());
        manager.register_loader(
            CREATE_TABLE_TYPE_NAME,
            CreateTableProcedure::loader(context),
        )
    }

    fn procedures(&self, env: &Env) -> Vec<ProcedureWithId> {
        let context = env
            .current
            .lock()
            .unwrap()
            .clone()
            .expect("loaders registered first");
        vec![ProcedureWithId::new(
            ProcedureId::new("create-cpu"),
            Box::new(CreateTableProcedure::new(self.task(), context)),
        )]
    }

    /// The table id in the output compared as a placeholder, as [`Outcome::canonical`] does.
    fn canonical_results(&self, results: Vec<RootResult>) -> Vec<RootResult> {
        results
            .into_iter()
            .map(|mut r| {
                if let Ok(Some(output)) = &mut r.result
                    && output.get("table_id").is_some()
                {
                    output["table_id"] = serde_json::json!("TABLE");
                }
                r
            })
            .collect()
    }

    async fn outcome(&self, env: &Env) -> Outcome {
        let metadata = support::metadata_snapshot(&env.kv).await;
        let regions = env.datanodes.regions();
        let creations = env.datanodes.creations();
        let open = support::open_all(&env.kv, &DATANODES, self.wal_kind()).await;
        let violations = invariants(self, &metadata, &regions, &creations, &open);
        Outcome {
            store: store_digest(env.store.as_ref())
                .await
                .expect("store readable"),
            metadata,
            regions,
            creations,
            open,
            violations,
        }
    }
}

/// What must hold after any run: one table with one id everywhere, each region created exactly once on the node
/// its route names, every region openable where it was created, nothing left reserved.
fn invariants(
    s: &CreateTableScenario,
    metadata: &BTreeMap<String, String>,
    regions: &BTreeMap<u64, BTreeMap<u64, RegionCreateRequest>>,
    creations: &BTreeMap<u64, usize>,
    open: &BTreeMap<u64, (Vec<RegionOpenRequest>, Vec<String>)>,
) -> Vec<String> {
    let mut v = Vec::new();
    let names: Vec<_> = metadata
        .keys()
        .filter(|k| k.starts_with("__table_name/"))
        .collect();
    if names.len() != 1 {
        v.push(format!("{} table names", names.len()));
        return v;
    }
    let id: u32 =
        serde_json::from_str::<serde_json::Value>(&metadata[names[0]]).unwrap()["table_id"]
            .as_u64()
            .unwrap() as u32;
    for k in metadata.keys() {
        let ok = k.starts_with("__table_name/")
            || k == "__table_id_seq"
            || *k == format!("__table_info/{id}")
            || *k == format!("__table_route/{id}")
            || (k.starts_with("__dn_table/") && k.ends_with(&format!("/{id}")));
        if !ok {
            v.push(format!("unexpected key {k}"));
        }
    }
    if creations.len() != s.num_regions as usize || creations.values().any(|&n| n != 1) {
        v.push(format!("creations {creations:?}"));
    }
    if creations.keys().any(|r| (r >> 32) as u32 != id) {
        v.push(format!(
            "a region of another table id was created: {creations:?}"
        ));
    }
    for (dn, (requests, errors)) in open {
        let created: Vec<_> = regions
            .get(dn)
            .map(|r| r.values().cloned().collect())
            .unwrap_or_default();
        let opened: Vec<RegionCreateRequest> = requests
            .iter()
            .map(|r| RegionCreateRequest {
                region_id: r.region_id,
                engine: r.engine.clone(),
                region_dir: r.region_dir.clone(),
                options: r.options.clone(),
            })
            .collect();
        if created != opened || !errors.is_empty() {
            v.push(format!(
                "datanode {dn}: created {created:?}, opens {opened:?}, errors {errors:?}"
            ));
        }
    }
    v
}

/// Runs the matrix; returns the golden outcome.
async fn run(provider: Provider, state_in_kv: bool) -> Outcome {
    let scenario = CreateTableScenario {
        provider,
        num_regions: 5,
        state_in_kv,
    };

    // The golden run itself must satisfy the invariants (the matrix then holds every case to it).
    let env = scenario.new_env().await;
    let manager = procedures::LocalManager::new(env.store.clone(), MatrixConfig::default().manager);
    scenario.register_loaders(&env, &manager).unwrap();
    manager.start().await.unwrap();
    for root in scenario.procedures(&env) {
        let out = manager
            .submit(root)
            .await
            .unwrap()
            .wait()
            .await
            .unwrap()
            .unwrap();
        assert_eq!(out["table_id"], 1024);
    }
    manager.stop().await.unwrap();
    let golden = scenario.outcome(&env).await;
    assert!(golden.violations.is_empty(), "{:?}", golden.violations);
    assert_eq!(golden.creations.len(), 5);

    let report = run_crash_matrix(&scenario, MatrixConfig::default()).await;
    println!(
        "{:?}: {} transitions, {} side-effect points, {} single-crash + {} double-crash cases, {} unreached",
        scenario.wal_kind(),
        report.transitions,
        report.side_effect_points,
        report.single_crash_cases,
        report.double_crash_cases,
        report.unreached_crash_points,
    );
    report.assert_no_mismatch();
    // The counts docs/create-table.md quotes: 4 durable writes (the epoch claim, the submission, Allocate's record
    // with the allocation, and the metadata with the `done` record), 5 region creations, a crash before and after
    // each write and after each creation (13 single-crash cases), and 126 second crashes during the recoveries.
    // With the state in another store than the metadata, the metadata is written alone before the `done` record,
    // followed by one more side-effect point (14 single-crash cases, 146 double).
    assert_eq!(report.transitions, 4);
    let alone = usize::from(!state_in_kv);
    assert_eq!(report.side_effect_points, 5 + alone);
    assert_eq!(report.unreached_crash_points, 0);
    assert_eq!(
        report.single_crash_cases,
        2 * report.transitions + report.side_effect_points
    );
    assert_eq!(report.single_crash_cases, 13 + alone);
    assert_eq!(
        report.double_crash_cases,
        if state_in_kv { 126 } else { 146 }
    );
    golden
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_table_survives_every_crash_point_raft_engine() {
    let golden = run(Provider::RaftEngine, false).await;
    for (requests, _) in golden.open.values() {
        for r in requests {
            assert_eq!(
                r.options["wal_options"],
                r#"{"wal.provider":"raft_engine"}"#
            );
        }
    }
}

/// The topics the golden run's regions write to.
fn topics_used(golden: &Outcome) -> BTreeSet<String> {
    golden
        .open
        .values()
        .flat_map(|(requests, _)| requests.iter())
        .map(
            |r| match WalOptions::decode(&r.options["wal_options"]).unwrap() {
                WalOptions::Kafka(k) => k.topic,
                other => panic!("not kafka: {other:?}"),
            },
        )
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_table_survives_every_crash_point_kafka_pool_in_memory() {
    let spec = TopicPoolSpec::new("greptimedb_wal_topic", 4);
    let admin: TopicAdminRef = Arc::new(remote_wal::wal::kafka::testing::FakeTopicAdmin::new());
    let pool = support::bootstrap_pool(spec.clone(), admin.clone()).await;
    assert_eq!(pool.len(), 4);
    let golden = run(Provider::Kafka { spec, admin, pool }, false).await;
    // 5 regions over a 4-topic pool, round-robin from the first topic.
    assert_eq!(topics_used(&golden).len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_table_survives_every_crash_point_kafka_real_broker() {
    let endpoints = support::kafka_endpoints();
    let mut config = KafkaConfig {
        broker_endpoints: endpoints.clone(),
        create_topic_timeout: Duration::from_secs(10),
        ..KafkaConfig::default()
    };
    config.backoff.deadline = Duration::from_secs(10);
    let admin: TopicAdminRef = match RsKafkaTopicAdmin::connect(&config).await {
        Ok(admin) => Arc::new(admin),
        Err(e) => panic!("Kafka at KAFKA_ENDPOINTS={endpoints:?} is unreachable: {e}"),
    };
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let spec = TopicPoolSpec::new(format!("remote_wal_ddl_matrix_{nanos}"), 4);
    let pool = support::bootstrap_pool(spec.clone(), admin.clone()).await;
    assert_eq!(pool.len(), 4);
    // State in the same kv as the metadata, as a metasrv runs.
    let golden = run(
        Provider::Kafka {
            spec,
            admin: admin.clone(),
            pool,
        },
        true,
    )
    .await;
    let in_broker = admin.list_topics().await.unwrap();
    let used = topics_used(&golden);
    assert_eq!(used.len(), 4);
    for topic in used {
        assert_eq!(
            in_broker.get(&topic),
            Some(&1),
            "topic {topic} is not in the broker with 1 partition"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_table_survives_every_crash_point_with_state_in_the_metadata_kv() {
    let golden = run(Provider::RaftEngine, true).await;
    assert_eq!(golden.creations.len(), 5);
}
