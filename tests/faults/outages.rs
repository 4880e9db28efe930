//! Outages of the real services in the middle of a procedure, and two managers (two metasrv leaders) on one etcd.
//! Each test runs its own Kafka or etcd instance (started through `scripts/services.sh`), so stopping it never
//! disturbs other tests.

use crate::support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use procedures::{LocalManager, ManagerConfig, ProcedureManagerRef, RetryPolicy};
use remote_wal::datanode::opener::{RegionOpener, WalProviderKind};
use remote_wal::ddl::datanode_manager::{
    DatanodeManager, DatanodeManagerRef, MemoryDatanodeManager, RegionCreateRequest,
};
use remote_wal::ddl::{
    CreateTableTask, DdlContext, DdlManager, RaftEngineWalSource, RoundRobinPeerSelector,
    TableMetadataAllocator, TableMetadataManager, TableName,
};
use remote_wal::key::topic_name::list_persisted_topics;
use remote_wal::kv::etcd::{EtcdConfig, EtcdKvBackend};
use remote_wal::kv::state_store::KvStateStore;
use remote_wal::kv::{KvBackend, KvBackendRef, MemoryKvBackend};
use remote_wal::wal::kafka::KafkaTopicManager;
use remote_wal::wal::kafka::admin::TopicAdmin;
use remote_wal::wal::kafka::rskafka_admin::RsKafkaTopicAdmin;
use remote_wal::wal::{BackoffConfig, KafkaConfig, WalOptionsAllocator};
use support::{Service, unique};
use tokio::sync::watch;

const DATANODES: [u64; 3] = [1, 2, 3];

fn manager_config(store_retries: usize) -> ManagerConfig {
    ManagerConfig {
        step_retry: RetryPolicy {
            max_retries: 1,
            initial_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(200),
            factor: 2.0,
        },
        store_retry: RetryPolicy {
            max_retries: store_retries,
            initial_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(300),
            factor: 2.0,
        },
        ..ManagerConfig::default()
    }
}

/// A manager and a DDL manager on `kv`, raft-engine WAL, datanodes 1..=3 behind `datanodes`; started.
async fn metasrv(
    kv: KvBackendRef,
    datanodes: DatanodeManagerRef,
    store_retries: usize,
) -> (ProcedureManagerRef, DdlManager) {
    let store = Arc::new(KvStateStore::new(kv.clone()));
    let manager: ProcedureManagerRef =
        Arc::new(LocalManager::new(store, manager_config(store_retries)));
    let context = DdlContext {
        metadata: Arc::new(TableMetadataManager::new(kv.clone())),
        allocator: Arc::new(TableMetadataAllocator::new(
            kv.clone(),
            Arc::new(RoundRobinPeerSelector::new(DATANODES.to_vec())),
            Arc::new(RaftEngineWalSource),
        )),
        datanodes,
    };
    let ddl = DdlManager::new(manager.clone(), context);
    ddl.register_loaders()
        .expect("register the create-table loader");
    manager.start().await.expect("start the procedure manager");
    (manager, ddl)
}

/// Datanodes whose region creation waits at a gate the test opens.
#[derive(Debug)]
struct GatedDatanodes {
    inner: Arc<MemoryDatanodeManager>,
    open: watch::Sender<bool>,
    entered: AtomicUsize,
}

impl GatedDatanodes {
    fn closed(inner: Arc<MemoryDatanodeManager>) -> Arc<Self> {
        Arc::new(GatedDatanodes {
            inner,
            open: watch::channel(false).0,
            entered: AtomicUsize::new(0),
        })
    }

    fn open(&self) {
        self.open.send_replace(true);
    }

    async fn wait_entered(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.entered.load(Ordering::SeqCst) == 0 {
            assert!(
                Instant::now() < deadline,
                "the create-table procedure never reached CreateRegions"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[async_trait]
impl DatanodeManager for GatedDatanodes {
    async fn create_region(
        &self,
        datanode_id: u64,
        request: RegionCreateRequest,
    ) -> remote_wal::ddl::error::Result<()> {
        self.entered.fetch_add(1, Ordering::SeqCst);
        let mut rx = self.open.subscribe();
        while !*rx.borrow_and_update() {
            if rx.changed().await.is_err() {
                break;
            }
        }
        self.inner.create_region(datanode_id, request).await
    }
}

/// The real admin, holding every create after the first `pass` until the test releases it: the broker can be
/// stopped between two creates however fast it is.
#[derive(Debug)]
struct GatedAdmin {
    inner: RsKafkaTopicAdmin,
    pass: usize,
    /// Creates that started (passed or held).
    started: watch::Sender<usize>,
    released: watch::Sender<bool>,
}

impl GatedAdmin {
    fn new(inner: RsKafkaTopicAdmin, pass: usize) -> Arc<Self> {
        Arc::new(GatedAdmin {
            inner,
            pass,
            started: watch::channel(0).0,
            released: watch::channel(false).0,
        })
    }

    /// Waits until `n` creates started (the first `pass` of them went through to the broker).
    async fn wait_started(&self, n: usize) {
        let mut rx = self.started.subscribe();
        rx.wait_for(|started| *started >= n)
            .await
            .expect("the admin lives as long as the test");
    }

    fn release(&self) {
        self.released.send_replace(true);
    }
}

#[async_trait]
impl TopicAdmin for GatedAdmin {
    fn endpoints(&self) -> Vec<String> {
        self.inner.endpoints()
    }

    async fn list_topics(
        &self,
    ) -> remote_wal::wal::error::Result<std::collections::BTreeMap<String, usize>> {
        self.inner.list_topics().await
    }

    async fn create_topic(
        &self,
        name: &str,
        num_partitions: i32,
        replication_factor: i16,
    ) -> remote_wal::wal::error::Result<remote_wal::wal::kafka::admin::CreateTopicOutcome> {
        let mut index = 0;
        self.started.send_modify(|n| {
            index = *n;
            *n += 1;
        });
        if index >= self.pass {
            let mut rx = self.released.subscribe();
            // The sender lives in `self`: waiting ends only when the test releases the gate.
            let _ = rx.wait_for(|released| *released).await;
        }
        self.inner
            .create_topic(name, num_partitions, replication_factor)
            .await
    }
}

async fn etcd_kv(endpoints: &[String]) -> KvBackendRef {
    let config = EtcdConfig {
        connect_timeout: Duration::from_secs(3),
        request_timeout: Duration::from_secs(2),
        ..EtcdConfig::new(endpoints.to_vec())
    };
    Arc::new(
        EtcdKvBackend::connect(config)
            .await
            .expect("connect to the test's etcd"),
    )
}

/// Exactly one table under `name`, every region created exactly once, and the datanodes' open requests cover
/// exactly the table's regions.
async fn assert_one_table(
    kv: &dyn KvBackend,
    kvref: KvBackendRef,
    name: &TableName,
    regions: u32,
    dn: &MemoryDatanodeManager,
) -> u32 {
    let value = kv
        .get(name.key().as_bytes())
        .await
        .expect("read the table name key")
        .expect("the table exists");
    let id: serde_json::Value =
        serde_json::from_slice(&value.value).expect("table name value is JSON");
    let table_id = id["table_id"].as_u64().expect("table_id") as u32;
    let created = dn.creations();
    let mine: Vec<_> = created
        .iter()
        .filter(|(rid, _)| (**rid >> 32) as u32 == table_id)
        .collect();
    assert_eq!(
        mine.len(),
        regions as usize,
        "every region of table {table_id} created: {created:?}"
    );
    assert!(
        mine.iter().all(|(_, n)| **n == 1),
        "each region created once: {mine:?}"
    );
    let mut opened = BTreeSet::new();
    for d in DATANODES {
        let open = RegionOpener::new(kvref.clone(), d, WalProviderKind::RaftEngine)
            .open_regions()
            .await
            .expect("open regions");
        assert!(open.errors.is_empty(), "datanode {d}: {:?}", open.errors);
        for r in open.requests {
            assert!(
                opened.insert(r.region_id),
                "region {} opened twice",
                r.region_id
            );
        }
    }
    let expected: BTreeSet<u64> = (0..regions)
        .map(|n| (u64::from(table_id) << 32) | u64::from(n))
        .collect();
    assert_eq!(
        opened, expected,
        "open requests cover exactly the table's regions"
    );
    table_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_stopped_mid_bootstrap_fails_within_the_deadline_and_a_rerun_completes_exactly_once()
{
    let kafka = Service::kafka("kafka-outage");
    let config = KafkaConfig {
        broker_endpoints: kafka.endpoints.clone(),
        num_topics: 160,
        topic_name_prefix: unique("outage"),
        max_concurrent_creates: 2,
        create_topic_timeout: Duration::from_secs(3),
        backoff: BackoffConfig {
            init: Duration::from_millis(200),
            max: Duration::from_secs(1),
            base: 2.0,
            deadline: Duration::from_secs(6),
        },
        ..KafkaConfig::default()
    };
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    // Ten creates reach the broker; the rest wait at the gate until the broker is stopped.
    let gated = GatedAdmin::new(
        RsKafkaTopicAdmin::connect(&config).await.expect("admin"),
        10,
    );
    let wal = Arc::new(WalOptionsAllocator::Kafka(
        KafkaTopicManager::from_config(&config, kv.clone(), gated.clone()).expect("allocator"),
    ));
    let store = Arc::new(KvStateStore::new(kv.clone()));
    let manager: ProcedureManagerRef = Arc::new(LocalManager::new(store, manager_config(3)));
    wal.register_loaders(&*manager)
        .expect("register the bootstrap loader");
    manager.start().await.expect("start");

    let admin = RsKafkaTopicAdmin::connect(&config).await.expect("admin");
    let ours = |topics: &std::collections::BTreeMap<String, usize>| {
        topics
            .keys()
            .filter(|t| t.starts_with(&format!("{}_", config.topic_name_prefix)))
            .cloned()
            .collect::<BTreeSet<_>>()
    };
    let run = {
        let (wal, manager) = (wal.clone(), manager.clone());
        tokio::spawn(async move { wal.start(&manager).await })
    };
    // Stop the broker once ten creates went through and the next one waits: some, not all, topics exist.
    tokio::time::timeout(Duration::from_secs(60), gated.wait_started(11))
        .await
        .expect("the bootstrap reached its eleventh create within 60 s");
    let before_stop = ours(&admin.list_topics().await.expect("list topics")).len();
    assert!(
        (1..config.num_topics).contains(&before_stop),
        "{before_stop} of {} topics exist when the broker stops",
        config.num_topics
    );
    kafka.stop(0);
    let stopped_at = Instant::now();
    gated.release();
    let err = tokio::time::timeout(Duration::from_secs(180), run)
        .await
        .expect("bootstrap must fail, not hang, once the broker is gone")
        .expect("bootstrap task")
        .expect_err("bootstrap cannot complete without the broker");
    let took = stopped_at.elapsed();
    let text = err.to_string();
    eprintln!("bootstrap failed {took:?} after the broker stopped: {text}");
    assert!(
        text.contains(&kafka.endpoints[0]),
        "the error names the endpoint: {text}"
    );
    // One retry authority: rskafka's deadline plus one request, with a 3x allowance for a loaded machine.
    let bound = 3 * (config.backoff.deadline + config.create_topic_timeout);
    assert!(
        took < bound,
        "bootstrap took {took:?} to give up, more than the configured bound {bound:?}"
    );
    assert!(
        !wal.is_ready(),
        "a failed bootstrap leaves the pool not ready"
    );
    assert!(
        wal.alloc().is_err(),
        "allocation before the pool is ready is an error"
    );

    kafka.start(0);
    tokio::time::timeout(Duration::from_secs(180), wal.start(&manager))
        .await
        .expect("rerun finishes")
        .expect("rerun completes the pool");
    let wanted: BTreeSet<String> = config.topic_names().into_iter().collect();
    let admin = RsKafkaTopicAdmin::connect(&config)
        .await
        .expect("admin after restart");
    assert_eq!(
        ours(&admin.list_topics().await.expect("list")),
        wanted,
        "the broker holds exactly the wanted topics"
    );
    let persisted: BTreeSet<String> =
        list_persisted_topics(kv.as_ref(), &format!("{}_", config.topic_name_prefix))
            .await
            .expect("persisted")
            .into_iter()
            .collect();
    assert_eq!(
        persisted, wanted,
        "every wanted topic is persisted, nothing else"
    );
    assert!(wal.alloc().is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_stopped_mid_create_table_shows_the_error_and_the_table_finishes_once_after_restart() {
    let etcd = Service::etcd("etcd-outage");
    let kv = etcd_kv(&etcd.endpoints).await;
    let regions = Arc::new(MemoryDatanodeManager::new());
    let gated = GatedDatanodes::closed(regions.clone());
    let (manager, ddl) = metasrv(kv.clone(), gated.clone(), 1000).await;
    let name = TableName::new("greptime", "public", "etcd_outage");
    let run = tokio::spawn(async move {
        ddl.create_table(CreateTableTask::new(
            TableName::new("greptime", "public", "etcd_outage"),
            4,
        ))
        .await
    });
    gated.wait_entered().await;
    etcd.stop(0);
    gated.open();

    // The store calls after CreateRegions (the boundary's control read, the next state write) fail while etcd is
    // down: the procedure says so while they are retried.
    let deadline = Instant::now() + Duration::from_secs(60);
    let info = loop {
        let list = manager.list_procedures().await.expect("list procedures");
        if let Some(info) = list.into_iter().find(|p| p.error.is_some()) {
            break info;
        }
        assert!(
            Instant::now() < deadline,
            "no procedure shows the state store error within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let error = info.error.clone().unwrap_or_default();
    eprintln!(
        "procedure {} while etcd is down: state {}, error: {error}",
        info.id, info.state
    );
    assert!(
        !info.state.is_finished(),
        "the procedure is not given up while the store is retried: {info:?}"
    );
    // The culprit is named: the state store's write, failed by etcd at this instance's endpoint.
    assert!(
        error.starts_with("state store failed to ")
            && error.contains(&format!("etcd at {}", etcd.endpoints[0])),
        "the error says what failed: {error}"
    );

    etcd.start(0);
    let table_id = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the table finishes after etcd is back")
        .expect("task")
        .expect("create table succeeds");
    let id = assert_one_table(kv.as_ref(), kv.clone(), &name, 4, &regions).await;
    assert_eq!(id, table_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_manager_on_the_same_etcd_fences_the_first_and_finishes_its_procedure_once() {
    let etcd = Service::etcd("two-leaders");
    let regions = Arc::new(MemoryDatanodeManager::new());
    let gated = GatedDatanodes::closed(regions.clone());
    let kv_a = etcd_kv(&etcd.endpoints).await;
    let (manager_a, ddl_a) = metasrv(kv_a.clone(), gated.clone(), 3).await;
    let epoch_a = manager_a.epoch().expect("A started");
    let name = TableName::new("greptime", "public", "two_leaders");
    let ddl_a = Arc::new(ddl_a);
    let run_a = {
        let ddl_a = ddl_a.clone();
        tokio::spawn(async move {
            ddl_a
                .create_table(CreateTableTask::new(
                    TableName::new("greptime", "public", "two_leaders"),
                    6,
                ))
                .await
        })
    };
    gated.wait_entered().await;
    let procedure_id = manager_a
        .list_procedures()
        .await
        .expect("list")
        .into_iter()
        .find(|p| !p.state.is_finished())
        .expect("A's create-table is running")
        .id;

    // B becomes leader while A is in the middle of CreateRegions.
    let kv_b = etcd_kv(&etcd.endpoints).await;
    let (manager_b, _ddl_b) = metasrv(kv_b.clone(), regions.clone(), 3).await;
    let epoch_b = manager_b.epoch().expect("B started");
    assert!(
        epoch_b > epoch_a,
        "B claims a newer epoch ({epoch_b} > {epoch_a})"
    );
    let mut watcher = manager_b
        .watch(&procedure_id)
        .await
        .expect("B reads the store")
        .expect("B recovered A's procedure");
    let output = tokio::time::timeout(Duration::from_secs(60), watcher.wait())
        .await
        .expect("B finishes")
        .expect("B's run succeeds");
    eprintln!("B finished {procedure_id}: {output:?}");

    // A wakes up: its regions already exist with the same options; its next state write is refused.
    gated.open();
    let a_result = tokio::time::timeout(Duration::from_secs(60), run_a)
        .await
        .expect("A stops")
        .expect("task");
    let a_err = a_result
        .expect_err("A must not report success from a fenced run")
        .to_string();
    eprintln!("A's create_table: {a_err}");
    let a_submit = ddl_a
        .create_table(CreateTableTask::new(
            TableName::new("greptime", "public", "after_fencing"),
            1,
        ))
        .await
        .expect_err("a fenced manager refuses submissions")
        .to_string();
    assert!(
        a_submit.contains(&format!("fenced by epoch {epoch_b}")),
        "A's refusal names the newer epoch: {a_submit}"
    );

    assert_one_table(kv_b.as_ref(), kv_b.clone(), &name, 6, &regions).await;
    assert!(
        kv_b.get(
            TableName::new("greptime", "public", "after_fencing")
                .key()
                .as_bytes()
        )
        .await
        .expect("get")
        .is_none()
    );
    let info = manager_b
        .procedure_state(&procedure_id)
        .await
        .expect("state")
        .expect("known to B");
    assert!(
        info.state.is_finished() && info.error.is_none(),
        "B's record is done: {info:?}"
    );
}
