//! The topic bootstrap against a real Kafka broker (`KAFKA_ENDPOINTS`, comma-separated `host:port`; the tests fail
//! when it is unset or unreachable). Each test uses its own random topic prefix, so tests never collide with each
//! other or with earlier runs.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use procedures::testing::{
    CrashScenario, MatrixConfig, StoreDigest, run_crash_matrix, store_digest,
};
use procedures::{
    LocalManager, ManagerConfig, MemoryStateStore, ProcedureId, ProcedureManager,
    ProcedureManagerRef, ProcedureWithId, RetryPolicy, SideEffectHook, StateStore,
};
use remote_wal::key::topic_name::list_persisted_topics;
use remote_wal::kv::{KvBackendRef, KvStateStore, MemoryKvBackend};
use remote_wal::wal::kafka::admin::{CreateTopicOutcome, TopicAdmin};
use remote_wal::wal::kafka::bootstrap::{TopicBootstrapProcedure, bootstrap_procedure_id};
use remote_wal::wal::kafka::rskafka_admin::RsKafkaTopicAdmin;
use remote_wal::wal::kafka::{KafkaTopicManager, TopicPoolSpec};
use remote_wal::wal::{KafkaConfig, WalConfig, WalOptions, WalOptionsAllocator};

/// The broker endpoints from `KAFKA_ENDPOINTS`; fails the test when unset.
fn endpoints() -> Vec<String> {
    let raw = std::env::var("KAFKA_ENDPOINTS").unwrap_or_default();
    let endpoints: Vec<String> = raw
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(String::from)
        .collect();
    assert!(
        !endpoints.is_empty(),
        "KAFKA_ENDPOINTS is not set: these tests need a running Kafka broker (comma-separated host:port; \
         the README's test command, scripts/test.sh, sets it)"
    );
    endpoints
}

/// A topic prefix no other test or earlier run uses.
fn unique_prefix(tag: &str) -> String {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "rw_boot_{tag}_{}_{nanos}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn config(prefix: &str, num_topics: usize) -> KafkaConfig {
    let mut c = KafkaConfig {
        broker_endpoints: endpoints(),
        num_topics,
        topic_name_prefix: prefix.to_string(),
        create_topic_timeout: Duration::from_secs(20),
        max_concurrent_creates: 8,
        ..KafkaConfig::default()
    };
    c.backoff.init = Duration::from_millis(20);
    c.backoff.max = Duration::from_millis(500);
    c.backoff.deadline = Duration::from_secs(30);
    c
}

/// The real admin, counting the `Created` answers per topic (Kafka creates a name at most once; a second create is
/// TOPIC_ALREADY_EXISTS, so a count above 1 would mean the broker accepted a duplicate).
#[derive(Debug)]
struct CountingAdmin {
    inner: RsKafkaTopicAdmin,
    created: Mutex<BTreeMap<String, usize>>,
}

impl CountingAdmin {
    async fn connect(config: &KafkaConfig) -> Arc<Self> {
        match RsKafkaTopicAdmin::connect(config).await {
            Ok(inner) => Arc::new(CountingAdmin {
                inner,
                created: Mutex::default(),
            }),
            Err(e) => panic!(
                "Kafka at KAFKA_ENDPOINTS={:?} is unreachable: {e}",
                config.broker_endpoints
            ),
        }
    }

    fn created(&self) -> BTreeMap<String, usize> {
        self.created.lock().unwrap().clone()
    }

    /// The broker's topics starting with `{prefix}_`, with their partition counts.
    async fn pool_topics(&self, prefix: &str) -> BTreeMap<String, usize> {
        let pattern = format!("{prefix}_");
        self.inner
            .list_topics()
            .await
            .unwrap()
            .into_iter()
            .filter(|(t, _)| t.starts_with(&pattern))
            .collect()
    }

    /// [`Self::pool_topics`] once the broker lists every topic of `names` (or after 30 s, whatever it lists then):
    /// a bootstrap finishes once the controller acknowledged its creations, and the broker lists a topic only
    /// after applying the controller's records and creating its log.
    async fn pool_topics_listing(&self, prefix: &str, names: &[String]) -> BTreeMap<String, usize> {
        let until = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let listed = self.pool_topics(prefix).await;
            if names.iter().all(|t| listed.contains_key(t)) || tokio::time::Instant::now() >= until
            {
                return listed;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[async_trait]
impl TopicAdmin for CountingAdmin {
    fn endpoints(&self) -> Vec<String> {
        self.inner.endpoints()
    }

    async fn list_topics(&self) -> remote_wal::wal::error::Result<BTreeMap<String, usize>> {
        self.inner.list_topics().await
    }

    async fn create_topic(
        &self,
        name: &str,
        num_partitions: i32,
        replication_factor: i16,
    ) -> remote_wal::wal::error::Result<CreateTopicOutcome> {
        let outcome = self
            .inner
            .create_topic(name, num_partitions, replication_factor)
            .await?;
        if outcome == CreateTopicOutcome::Created {
            *self
                .created
                .lock()
                .unwrap()
                .entry(name.to_string())
                .or_default() += 1;
        }
        Ok(outcome)
    }
}

fn manager_config() -> ManagerConfig {
    ManagerConfig {
        step_retry: RetryPolicy {
            max_retries: 2,
            initial_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(100),
            factor: 2.0,
        },
        ..ManagerConfig::default()
    }
}

async fn started(manager: LocalManager, allocator: &WalOptionsAllocator) -> ProcedureManagerRef {
    allocator.register_loaders(&manager).unwrap();
    manager.start().await.unwrap();
    Arc::new(manager)
}

fn allocator(
    config: &KafkaConfig,
    kv: &KvBackendRef,
    admin: &Arc<CountingAdmin>,
) -> WalOptionsAllocator {
    WalOptionsAllocator::Kafka(
        KafkaTopicManager::from_config(config, kv.clone(), admin.clone()).unwrap(),
    )
}

/// Every name of `config` with one partition.
fn wanted(config: &KafkaConfig) -> BTreeMap<String, usize> {
    config.topic_names().into_iter().map(|t| (t, 1)).collect()
}

async fn persisted(kv: &KvBackendRef, prefix: &str) -> BTreeMap<String, usize> {
    list_persisted_topics(kv.as_ref(), &format!("{prefix}_"))
        .await
        .unwrap()
        .into_iter()
        .map(|t| (t, 1))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_creates_and_persists_64_topics() {
    let prefix = unique_prefix("b64");
    let config = config(&prefix, 64);
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = CountingAdmin::connect(&config).await;
    let allocator = allocator(&config, &kv, &admin);
    let manager = started(
        LocalManager::new(Arc::new(MemoryStateStore::new()), manager_config()),
        &allocator,
    )
    .await;
    allocator.start(&manager).await.unwrap();

    assert_eq!(
        admin
            .pool_topics_listing(&prefix, &config.topic_names())
            .await,
        wanted(&config)
    );
    assert_eq!(persisted(&kv, &prefix).await, wanted(&config));
    assert_eq!(admin.created(), wanted(&config));
    let options = allocator.alloc_batch(64).unwrap();
    let topics: std::collections::HashSet<WalOptions> = options.into_iter().collect();
    assert_eq!(topics.len(), 64);
}

/// Crashes the manager at the `n`-th topic creation it reports.
struct CrashAtCreation {
    n: usize,
    seen: AtomicUsize,
}

impl SideEffectHook for CrashAtCreation {
    fn on_side_effect(&self, _id: &ProcedureId, label: &str) -> procedures::Result<()> {
        if label.starts_with("created ") && self.seen.fetch_add(1, Ordering::SeqCst) + 1 == self.n {
            return Err(procedures::testing::injected_crash(format!(
                "after topic creation #{}",
                self.n
            )));
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_20_of_64_creations_recovers_without_duplicates() {
    let prefix = unique_prefix("crash");
    let config = config(&prefix, 64);
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let store: Arc<dyn StateStore> = Arc::new(KvStateStore::new(kv.clone()));
    let admin = CountingAdmin::connect(&config).await;

    let first = allocator(&config, &kv, &admin);
    let hook = Arc::new(CrashAtCreation {
        n: 20,
        seen: AtomicUsize::new(0),
    });
    let crashing = started(
        LocalManager::with_side_effect_hook(store.clone(), manager_config(), hook),
        &first,
    )
    .await;
    let err = first.start(&crashing).await.unwrap_err();
    assert!(
        !first.is_ready(),
        "crashed start must not make the pool ready: {err}"
    );
    // The broker acknowledged 20 creations before the crash; a topic it just created can take a moment to show in
    // its listing, so wait (bounded) until all of them do rather than race the broker's metadata.
    let mut after_crash = admin.pool_topics(&prefix).await.len();
    let listed_by = tokio::time::Instant::now() + Duration::from_secs(30);
    while after_crash < 20 && tokio::time::Instant::now() < listed_by {
        tokio::time::sleep(Duration::from_millis(100)).await;
        after_crash = admin.pool_topics(&prefix).await.len();
    }
    assert!(
        (20..64).contains(&after_crash),
        "{after_crash} topics after the crash"
    );
    assert!(persisted(&kv, &prefix).await.is_empty());

    // A new metasrv: a new manager on the same store recovers the procedure; start joins it.
    let second = allocator(&config, &kv, &admin);
    let manager = started(LocalManager::new(store, manager_config()), &second).await;
    second.start(&manager).await.unwrap();

    assert_eq!(
        admin
            .pool_topics_listing(&prefix, &config.topic_names())
            .await,
        wanted(&config)
    );
    assert_eq!(persisted(&kv, &prefix).await, wanted(&config));
    // No topic was created twice. A create cancelled by the crash after the broker made the topic has no
    // `Created` answer (its re-run got TOPIC_ALREADY_EXISTS), so the count is at most one per topic.
    let created = admin.created();
    assert!(created.values().all(|&n| n == 1), "{created:?}");
    assert!(created.len() >= 20, "{} created answers", created.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn growing_64_to_96_creates_only_the_new_topics() {
    let prefix = unique_prefix("grow");
    let small = config(&prefix, 64);
    let big = config(&prefix, 96);
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = CountingAdmin::connect(&small).await;
    let store: Arc<dyn StateStore> = Arc::new(MemoryStateStore::new());

    let a = allocator(&small, &kv, &admin);
    let manager = started(LocalManager::new(store.clone(), manager_config()), &a).await;
    a.start(&manager).await.unwrap();
    manager.stop().await.unwrap();

    // Restart with the bigger pool (the finished bootstrap is retained in the store).
    let b = allocator(&big, &kv, &admin);
    let manager = started(LocalManager::new(store, manager_config()), &b).await;
    b.start(&manager).await.unwrap();

    assert_eq!(
        admin.pool_topics_listing(&prefix, &big.topic_names()).await,
        wanted(&big)
    );
    assert_eq!(persisted(&kv, &prefix).await, wanted(&big));
    assert_eq!(
        admin.created(),
        wanted(&big),
        "the 64 first topics were not created again"
    );
    assert_eq!(b.alloc_batch(96).unwrap().len(), 96);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_made_out_of_band_with_3_partitions_fails_the_bootstrap_naming_it() {
    let prefix = unique_prefix("oob");
    let config = config(&prefix, 8);
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = CountingAdmin::connect(&config).await;
    let intruder = format!("{prefix}_5");
    admin.inner.create_topic(&intruder, 3, 1).await.unwrap();
    // The operator's topic exists before the bootstrap starts: wait until the broker's metadata lists it.
    for _ in 0..300 {
        if admin.pool_topics(&prefix).await.contains_key(&intruder) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let allocator = allocator(&config, &kv, &admin);
    let manager = started(
        LocalManager::new(Arc::new(MemoryStateStore::new()), manager_config()),
        &allocator,
    )
    .await;
    let err = allocator.start(&manager).await.unwrap_err().to_string();
    eprintln!("out-of-band topic: {err}");
    assert!(
        err.contains(&format!(
            "Kafka topic '{intruder}' has 3 partitions but the pool needs 1"
        )),
        "{err}"
    );
    assert!(!allocator.is_ready());
    assert!(
        persisted(&kv, &prefix).await.is_empty(),
        "nothing persisted"
    );
    assert_eq!(
        admin.pool_topics(&prefix).await[&intruder],
        3,
        "the intruder is left alone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_broker_fails_within_the_deadline_naming_the_endpoints() {
    // A loopback port nobody listens on.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = listener.local_addr().unwrap().to_string();
    drop(listener);
    let mut config = config(&unique_prefix("down"), 4);
    config.broker_endpoints = vec![endpoint.clone()];
    config.backoff.deadline = Duration::from_secs(2);
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let err = WalOptionsAllocator::from_config(&WalConfig::Kafka(config), kv)
        .await
        .unwrap_err()
        .to_string();
    eprintln!("unreachable broker: {err}");
    assert!(err.contains(&endpoint), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_factor_3_on_one_broker_surfaces_kafkas_error() {
    let prefix = unique_prefix("rf3");
    let mut config = config(&prefix, 2);
    config.replication_factor = 3;
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = CountingAdmin::connect(&config).await;
    let allocator = allocator(&config, &kv, &admin);
    let manager = started(
        LocalManager::new(Arc::new(MemoryStateStore::new()), manager_config()),
        &allocator,
    )
    .await;
    let err = allocator.start(&manager).await.unwrap_err().to_string();
    eprintln!("replication factor 3: {err}");
    assert!(
        err.contains("INVALID_REPLICATION_FACTOR") && err.contains(&prefix),
        "{err}"
    );
    assert!(admin.pool_topics(&prefix).await.is_empty());
    assert!(persisted(&kv, &prefix).await.is_empty());
}

/// The crash matrix on the real broker (first crash only, 4 topics per case, a fresh prefix per case).
struct KafkaScenario;

struct KafkaEnv {
    spec: TopicPoolSpec,
    store: Arc<dyn StateStore>,
    kv: Arc<MemoryKvBackend>,
    admin: Arc<CountingAdmin>,
}

#[derive(Debug, PartialEq)]
struct KafkaOutcome {
    store: StoreDigest,
    /// The broker's pool topics, named by index (the prefix differs per case).
    topics: BTreeMap<usize, usize>,
    /// Whether no topic got two `Created` answers. (Exactly one cannot be asserted: a crash may cancel a create
    /// request after the broker created the topic but before its answer arrived; the re-run then sees
    /// TOPIC_ALREADY_EXISTS.)
    created_at_most_once: bool,
    /// Persisted names, by index.
    persisted: Vec<usize>,
}

#[async_trait]
impl CrashScenario for KafkaScenario {
    type Env = KafkaEnv;
    type Outcome = KafkaOutcome;

    async fn new_env(&self) -> KafkaEnv {
        let config = config(&unique_prefix("matrix"), 4);
        KafkaEnv {
            spec: TopicPoolSpec::from_config(&config),
            store: Arc::new(MemoryStateStore::new()),
            kv: Arc::new(MemoryKvBackend::new()),
            admin: CountingAdmin::connect(&config).await,
        }
    }

    fn state_store(&self, env: &KafkaEnv) -> Arc<dyn StateStore> {
        env.store.clone()
    }

    fn register_loaders(
        &self,
        env: &KafkaEnv,
        manager: &dyn ProcedureManager,
    ) -> procedures::Result<()> {
        manager.register_loader(
            TopicBootstrapProcedure::TYPE_NAME,
            TopicBootstrapProcedure::loader(env.kv.clone(), env.admin.clone()),
        )
    }

    fn procedures(&self, env: &KafkaEnv) -> Vec<ProcedureWithId> {
        let p = TopicBootstrapProcedure::new(env.spec.clone(), env.kv.clone(), env.admin.clone())
            .expect("valid spec");
        // The id names the pool, and the prefix differs per case: use a fixed id so the digests compare.
        vec![ProcedureWithId::new(
            bootstrap_procedure_id("matrix", 0),
            Box::new(p),
        )]
    }

    async fn outcome(&self, env: &KafkaEnv) -> KafkaOutcome {
        let index = |t: &str| env.spec.pool_index(t).expect("a pool topic");
        let mut store = store_digest(env.store.as_ref()).await.expect("digest");
        // The procedure's data names the case's prefix: replace it so the digests compare.
        for entry in store.entries.values_mut() {
            if let procedures::testing::DigestEntry::Record(r) = entry {
                let text = r
                    .data
                    .to_string()
                    .replace(&env.spec.topic_name_prefix, "PREFIX");
                r.data = serde_json::from_str(&text).expect("json");
            }
        }
        let kv: KvBackendRef = env.kv.clone();
        // Every persisted name's creation was acknowledged: wait (bounded) until the broker lists them.
        let persisted_names: Vec<String> = persisted(&kv, &env.spec.topic_name_prefix)
            .await
            .into_keys()
            .collect();
        KafkaOutcome {
            store,
            topics: env
                .admin
                .pool_topics_listing(&env.spec.topic_name_prefix, &persisted_names)
                .await
                .into_iter()
                .map(|(t, p)| (index(&t), p))
                .collect(),
            created_at_most_once: env.admin.created().values().all(|&n| n == 1),
            persisted: persisted(&kv, &env.spec.topic_name_prefix)
                .await
                .into_keys()
                .map(|t| index(&t))
                .collect(),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_first_crash_point_on_the_real_broker_ends_with_each_topic_once() {
    let config = MatrixConfig {
        second_crash: false,
        concurrency: 2,
        phase_timeout: Duration::from_secs(60),
        ..MatrixConfig::default()
    };
    let report = run_crash_matrix(&KafkaScenario, config).await;
    eprintln!("crash matrix 'bootstrap 4 topics on real Kafka, first crash only': {report}");
    report.assert_no_mismatch();
    assert_eq!(report.side_effect_points, 5);
    assert_eq!(report.unreached_crash_points, 0);

    // And the golden world itself is right: one more uncrashed run.
    let env = KafkaScenario.new_env().await;
    let manager = LocalManager::new(env.store.clone(), manager_config());
    KafkaScenario.register_loaders(&env, &manager).unwrap();
    manager.start().await.unwrap();
    for p in KafkaScenario.procedures(&env) {
        manager.submit(p).await.unwrap().wait().await.unwrap();
    }
    let outcome = KafkaScenario.outcome(&env).await;
    let all: BTreeMap<usize, usize> = (0..4).map(|i| (i, 1)).collect();
    assert_eq!(outcome.topics, all);
    assert!(outcome.created_at_most_once);
    assert_eq!(
        env.admin.created().len(),
        4,
        "the uncrashed run created every topic itself"
    );
    assert_eq!(outcome.persisted, vec![0, 1, 2, 3]);
}
