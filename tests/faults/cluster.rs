//! A 3-node Apache Kafka cluster (KRaft, every node broker and controller, on loopback), started by this test:
//! a pool with replication factor 3, a broker lost, and the controller moving between creations.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use procedures::{LocalManager, ManagerConfig, ProcedureManagerRef};
use remote_wal::ddl::datanode_manager::MemoryDatanodeManager;
use remote_wal::ddl::{
    CreateTableTask, DdlContext, DdlManager, RoundRobinPeerSelector, TableMetadataAllocator,
    TableMetadataManager, TableName,
};
use remote_wal::key::topic_name::list_persisted_topics;
use remote_wal::kv::state_store::KvStateStore;
use remote_wal::kv::{KvBackendRef, MemoryKvBackend};
use remote_wal::wal::kafka::admin::TopicAdmin;
use remote_wal::wal::kafka::rskafka_admin::RsKafkaTopicAdmin;
use remote_wal::wal::{BackoffConfig, KafkaConfig, WalConfig, WalOptions, WalOptionsAllocator};
use support::{Service, unique};

fn pool_config(endpoints: &[String], prefix: &str, num_topics: usize, rf: i16) -> KafkaConfig {
    KafkaConfig {
        broker_endpoints: endpoints.to_vec(),
        num_topics,
        topic_name_prefix: prefix.to_string(),
        replication_factor: rf,
        max_concurrent_creates: 4,
        create_topic_timeout: Duration::from_secs(10),
        backoff: BackoffConfig {
            init: Duration::from_millis(200),
            max: Duration::from_secs(2),
            base: 2.0,
            deadline: Duration::from_secs(60),
        },
        ..KafkaConfig::default()
    }
}

/// A metasrv's pieces on `kv`: a fresh procedure manager (as after a restart) and the pool of `config`, started.
async fn start_pool(
    kv: &KvBackendRef,
    config: &KafkaConfig,
) -> (ProcedureManagerRef, Arc<WalOptionsAllocator>) {
    let wal = Arc::new(
        WalOptionsAllocator::from_config(&WalConfig::Kafka(config.clone()), kv.clone())
            .await
            .expect("allocator"),
    );
    let manager: ProcedureManagerRef = Arc::new(LocalManager::new(
        Arc::new(KvStateStore::new(kv.clone())),
        ManagerConfig::default(),
    ));
    wal.register_loaders(&*manager).expect("loaders");
    manager.start().await.expect("manager start");
    tokio::time::timeout(Duration::from_secs(240), wal.start(&manager))
        .await
        .expect("pool start finishes")
        .expect("pool becomes ready");
    (manager, wal)
}

/// The topics under `prefix` as the cluster lists them, once every one of `wanted` is listed (or after 30 s): in a
/// 3-broker cluster the broker that answers may not have caught up with the controller's metadata yet right after
/// the topics were created.
async fn topics_of(
    admin: &RsKafkaTopicAdmin,
    prefix: &str,
    wanted: &BTreeSet<String>,
) -> BTreeMap<String, usize> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let found: BTreeMap<String, usize> = admin
            .list_topics()
            .await
            .expect("list topics")
            .into_iter()
            .filter(|(t, _)| t.starts_with(&format!("{prefix}_")))
            .collect();
        if wanted.iter().all(|t| found.contains_key(t)) || tokio::time::Instant::now() >= deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn persisted(kv: &KvBackendRef, prefix: &str) -> BTreeSet<String> {
    list_persisted_topics(kv.as_ref(), &format!("{prefix}_"))
        .await
        .expect("persisted topics")
        .into_iter()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_broker_cluster_pool_survives_a_lost_broker_and_controller_moves() {
    let cluster = Service::kafka_cluster("kraft3", 3);
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());

    // 1. Bootstrap with replication factor 3: every topic is on all three brokers.
    let rf3 = unique("rf3");
    let config = pool_config(&cluster.endpoints, &rf3, 8, 3);
    let (_m, wal) = start_pool(&kv, &config).await;
    let admin = RsKafkaTopicAdmin::connect(&config).await.expect("admin");
    let wanted: BTreeSet<String> = config.topic_names().into_iter().collect();
    assert_eq!(
        topics_of(&admin, &rf3, &wanted)
            .await
            .keys()
            .cloned()
            .collect::<BTreeSet<_>>(),
        wanted
    );
    assert_eq!(persisted(&kv, &rf3).await, wanted);
    assert!(wal.alloc().is_ok());

    // 2. One broker down: the pool still loads (a restarted metasrv) and new tables still get Kafka topics.
    cluster.stop(2);
    let (manager, wal) = start_pool(&kv, &config).await;
    let regions = Arc::new(MemoryDatanodeManager::new());
    let ddl = DdlManager::new(
        manager.clone(),
        DdlContext {
            metadata: Arc::new(TableMetadataManager::new(kv.clone())),
            allocator: Arc::new(TableMetadataAllocator::new(
                kv.clone(),
                Arc::new(RoundRobinPeerSelector::new(vec![1, 2])),
                wal.clone(),
            )),
            datanodes: regions.clone(),
        },
    );
    // Registering after start is allowed; the loader only matters to a later recovery.
    ddl.register_loaders()
        .expect("register the create-table loader");
    let table_id = ddl
        .create_table(CreateTableTask::new(
            TableName::new("greptime", "public", "with_a_broker_down"),
            6,
        ))
        .await
        .expect("a table is created while a broker is down");
    let assigned: Vec<WalOptions> = regions
        .regions()
        .values()
        .flat_map(|rs| rs.values())
        .filter(|r| (r.region_id >> 32) as u32 == table_id)
        .map(|r| WalOptions::decode(&r.options["wal_options"]).expect("wal options decode"))
        .collect();
    assert_eq!(assigned.len(), 6);
    for o in &assigned {
        match o {
            WalOptions::Kafka(k) => assert!(
                wanted.contains(&k.topic),
                "region got a topic outside the pool: {o:?}"
            ),
            other => panic!("a Kafka pool handed out {other:?}"),
        }
    }
    cluster.start(2);

    // 3. The controller moves between creations: stop each node in turn (one of them is the active controller,
    //    so at least one election happens) and grow the pool while it is down. RF 2 fits on the two nodes left.
    let moving = unique("moving");
    let mut num_topics = 0;
    for node in 0..3 {
        cluster.stop(node);
        num_topics += 3;
        let config = pool_config(&cluster.endpoints, &moving, num_topics, 2);
        start_pool(&kv, &config).await;
        cluster.start(node);
    }
    let config = pool_config(&cluster.endpoints, &moving, num_topics, 2);
    let admin = RsKafkaTopicAdmin::connect(&config).await.expect("admin");
    let wanted: BTreeSet<String> = config.topic_names().into_iter().collect();
    let found = topics_of(&admin, &moving, &wanted).await;
    assert_eq!(
        found.keys().cloned().collect::<BTreeSet<_>>(),
        wanted,
        "each wanted topic exists, nothing else"
    );
    assert!(
        found.values().all(|p| *p == 1),
        "one partition each: {found:?}"
    );
    assert_eq!(persisted(&kv, &moving).await, wanted);
}
