//! The topic bootstrap procedure under the crash matrix: a crash before and after every durable write and at every
//! side-effect point (after each single topic creation, after each chunk of names persisted), then recovery — and, in
//! the full matrix, a second crash during the recovery. Every case must end like the uncrashed run: each wanted
//! topic exists exactly once in the (fake) cluster, nothing else exists, every name is persisted once, nothing
//! else is persisted. Procedure records and topic names share one metadata store (`KvStateStore` over
//! `MemoryKvBackend`).

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use procedures::testing::{
    CrashScenario, MatrixConfig, MatrixReport, StoreDigest, run_crash_matrix, store_digest,
};
use procedures::{ProcedureManager, ProcedureWithId, StateStore};
use remote_wal::key::topic_name::TopicNameValue;
use remote_wal::kv::{
    KvBackend, KvBackendRef, KvStateStore, KvWrapper, MemoryKvBackend, Txn, TxnResponse,
};
use remote_wal::wal::kafka::bootstrap::{TopicBootstrapProcedure, bootstrap_procedure_id};
use remote_wal::wal::kafka::testing::FakeTopicAdmin;
use remote_wal::wal::kafka::{ReadyPoll, TopicPoolSpec};

struct BootstrapScenario {
    spec: TopicPoolSpec,
    /// The transaction limit (operations) the bootstrap's store advertises; `None`: unbounded (one chunk).
    max_txn_ops: Option<usize>,
    /// The brokers list no topic during the whole run (none has applied the controller's records yet): the
    /// bootstrap knows its topics only from the creations' acknowledgements.
    lists_nothing: bool,
}

impl BootstrapScenario {
    fn new(num_topics: usize) -> Self {
        let mut spec = TopicPoolSpec::new("wal_crash", num_topics);
        spec.max_concurrent_creates = 3;
        spec.ready_poll = ReadyPoll {
            init: Duration::from_millis(1),
            max: Duration::from_millis(5),
            factor: 2.0,
            deadline: Duration::from_secs(5),
        };
        BootstrapScenario {
            spec,
            max_txn_ops: None,
            lists_nothing: false,
        }
    }

    /// The same scenario with brokers that list no topic (see `lists_nothing`).
    fn listing_nothing(mut self) -> Self {
        self.lists_nothing = true;
        self
    }

    /// The same scenario with PersistNames limited to `ops` operations per transaction (`ops / 2` names a chunk).
    fn with_max_txn_ops(mut self, ops: usize) -> Self {
        self.max_txn_ops = Some(ops);
        self
    }

    /// The store the bootstrap writes names to.
    fn names_kv(&self, env: &Env) -> KvBackendRef {
        match self.max_txn_ops {
            Some(max_txn_ops) => Arc::new(LimitedKv {
                inner: env.kv.clone(),
                max_txn_ops,
            }),
            None => env.kv.clone(),
        }
    }
}

/// A memory store advertising a transaction limit, so PersistNames writes several chunks (as on etcd).
#[derive(Debug)]
struct LimitedKv {
    inner: Arc<MemoryKvBackend>,
    max_txn_ops: usize,
}

#[async_trait]
impl KvWrapper for LimitedKv {
    fn inner(&self) -> &dyn KvBackend {
        self.inner.as_ref()
    }
    fn name(&self) -> String {
        format!("limited-{}", self.inner.name())
    }
    fn max_txn_ops(&self) -> usize {
        self.max_txn_ops
    }
    async fn txn(&self, txn: Txn) -> remote_wal::kv::Result<TxnResponse> {
        assert!(
            txn.compare.len().max(txn.success.len()) <= self.max_txn_ops,
            "a transaction over the advertised limit: {txn:?}"
        );
        self.inner.txn(txn).await
    }
}

struct Env {
    store: Arc<dyn StateStore>,
    kv: Arc<MemoryKvBackend>,
    admin: Arc<FakeTopicAdmin>,
}

#[derive(Debug, PartialEq)]
struct Outcome {
    /// The procedure records (without timestamps).
    store: StoreDigest,
    /// The cluster's topics → partitions.
    topics: BTreeMap<String, usize>,
    /// Topic → how many times it was created. Kafka cannot create a name twice; the fake enforces the same.
    created: BTreeMap<String, usize>,
    /// Every topic name key of the metadata store with its value, as text.
    kv: Vec<(String, String)>,
}

#[async_trait]
impl CrashScenario for BootstrapScenario {
    type Env = Env;
    type Outcome = Outcome;

    async fn new_env(&self) -> Env {
        // One metadata store holds both the procedure records (under `__procedure__/`) and the topic names, as in a
        // metasrv.
        let kv = Arc::new(MemoryKvBackend::new());
        let admin = Arc::new(FakeTopicAdmin::new());
        if self.lists_nothing {
            admin.stale_metadata_reads(usize::MAX);
        }
        Env {
            store: Arc::new(KvStateStore::new(kv.clone())),
            kv,
            admin,
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
        manager.register_loader(
            TopicBootstrapProcedure::TYPE_NAME,
            TopicBootstrapProcedure::loader(self.names_kv(env), env.admin.clone()),
        )
    }

    fn procedures(&self, env: &Env) -> Vec<ProcedureWithId> {
        let procedure =
            TopicBootstrapProcedure::new(self.spec.clone(), self.names_kv(env), env.admin.clone())
                .expect("valid spec");
        vec![ProcedureWithId::new(
            bootstrap_procedure_id(&self.spec.topic_name_prefix, 0),
            Box::new(procedure),
        )]
    }

    async fn outcome(&self, env: &Env) -> Outcome {
        let topics = env.admin.topics();
        Outcome {
            store: store_digest(env.store.as_ref()).await.expect("digest"),
            topics: env.admin.partitions(),
            created: env.admin.created_counts(),
            // A name's topic id is recorded when a metadata read listed the topic before the name was persisted
            // (or by a later bootstrap): whether it is there depends on where a crash fell. What every case must
            // show is that a recorded id is the topic's own: the value is compared with the id replaced by that
            // verdict.
            kv: env
                .kv
                .dump()
                .into_iter()
                .filter(|kv| kv.key.starts_with(b"__topic_name/"))
                .map(|kv| {
                    let key = String::from_utf8_lossy(&kv.key).into_owned();
                    let mut value =
                        TopicNameValue::decode(&kv.key, &kv.value).expect("a topic name value");
                    let topic = key.trim_start_matches("__topic_name/kafka/");
                    let verdict = match (value.topic_id, topics.get(topic)) {
                        (None, _) => "",
                        (Some(id), Some(t)) if t.id == id => "",
                        (Some(_), _) => " WRONG TOPIC ID",
                    };
                    value.topic_id = None;
                    (
                        key,
                        format!("{}{verdict}", String::from_utf8_lossy(&value.encode())),
                    )
                })
                .collect(),
        }
    }
}

/// What every case must end with, checked on the golden run's world (each case is compared with it).
async fn assert_golden_world(scenario: &BootstrapScenario) {
    let env = scenario.new_env().await;
    let manager = procedures::LocalManager::new(env.store.clone(), MatrixConfig::default().manager);
    scenario.register_loaders(&env, &manager).unwrap();
    manager.start().await.unwrap();
    for p in scenario.procedures(&env) {
        manager.submit(p).await.unwrap().wait().await.unwrap();
    }
    manager.stop().await.unwrap();
    let stray: Vec<_> = env
        .kv
        .dump()
        .into_iter()
        .filter(|kv| {
            !kv.key.starts_with(b"__topic_name/") && !kv.key.starts_with(b"__procedure__/")
        })
        .collect();
    assert!(
        stray.is_empty(),
        "nothing but names and records is written: {stray:?}"
    );
    let outcome = scenario.outcome(&env).await;
    let wanted = scenario.spec.topic_names();
    assert_eq!(
        outcome.topics,
        wanted
            .iter()
            .map(|t| (t.clone(), 1))
            .collect::<BTreeMap<_, _>>()
    );
    assert_eq!(
        outcome.created,
        wanted
            .iter()
            .map(|t| (t.clone(), 1))
            .collect::<BTreeMap<_, _>>()
    );
    let mut persisted: Vec<(String, String)> = wanted
        .iter()
        .map(|t| {
            (
                format!("__topic_name/kafka/{t}"),
                r#"{"pruned_entry_id":0}"#.to_string(),
            )
        })
        .collect();
    persisted.sort();
    assert_eq!(outcome.kv, persisted);
}

fn print(name: &str, report: &MatrixReport) {
    let _ = writeln!(std::io::stderr(), "crash matrix '{name}': {report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_crash_point_of_an_8_topic_bootstrap_ends_with_each_topic_once_and_all_persisted() {
    let scenario = BootstrapScenario::new(8);
    assert_golden_world(&scenario).await;
    let report = run_crash_matrix(&scenario, MatrixConfig::default()).await;
    print("bootstrap 8 topics, two crash levels", &report);
    report.assert_no_mismatch();
    // 8 creations + the persist are side-effect points; every one was crashed at.
    assert_eq!(report.side_effect_points, 9);
    assert!(report.double_crash_cases > 0);
    assert_eq!(report.unreached_crash_points, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_first_crash_point_of_a_64_topic_bootstrap_ends_with_each_topic_once_and_all_persisted()
 {
    let scenario = BootstrapScenario::new(64);
    assert_golden_world(&scenario).await;
    let config = MatrixConfig {
        second_crash: false,
        ..MatrixConfig::default()
    };
    let report = run_crash_matrix(&scenario, config).await;
    print("bootstrap 64 topics, first crash only", &report);
    report.assert_no_mismatch();
    assert_eq!(report.side_effect_points, 65);
    assert_eq!(report.single_crash_cases, 2 * report.transitions + 65);
    assert_eq!(report.unreached_crash_points, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_crash_point_of_a_bootstrap_persisting_in_chunks_ends_with_each_name_persisted_once()
{
    // 6 operations a transaction: 3 names a chunk, so 10 names are 4 chunks, each a durable step of its own.
    let scenario = BootstrapScenario::new(10).with_max_txn_ops(6);
    assert_golden_world(&scenario).await;
    let report = run_crash_matrix(&scenario, MatrixConfig::default()).await;
    print(
        "bootstrap 10 topics, names in 4 chunks, two crash levels",
        &report,
    );
    report.assert_no_mismatch();
    // 10 creations + 4 chunks are side-effect points; every one was crashed at.
    assert_eq!(report.side_effect_points, 14);
    assert!(report.double_crash_cases > 0);
    assert_eq!(report.unreached_crash_points, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_crash_point_with_brokers_listing_nothing_ends_with_each_topic_once_and_all_persisted()
 {
    // A crash after a creation was acknowledged and before its name is persisted, while no broker lists the topic:
    // the recovery creates it again, is told it exists, and persists it.
    let scenario = BootstrapScenario::new(8).listing_nothing();
    assert_golden_world(&scenario).await;
    let report = run_crash_matrix(&scenario, MatrixConfig::default()).await;
    print(
        "bootstrap 8 topics, brokers listing nothing, two crash levels",
        &report,
    );
    report.assert_no_mismatch();
    assert_eq!(report.side_effect_points, 9);
    assert!(report.double_crash_cases > 0);
    assert_eq!(report.unreached_crash_points, 0);
}
