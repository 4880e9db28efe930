//! Load-aware topic selection: every new region gets the topic with the fewest regions, from counts a metasrv
//! loads from the store when its pool loads and keeps exact in memory. Over several metasrv processes one after
//! the other on one store, the most and least loaded topics differ by at most one region; concurrent allocations
//! in one process keep the counts exact; a replayed Allocate step counts its regions once.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use remote_wal::config::{DatanodesConfig, MetadataBackend, MetadataStoreConfig, MetasrvConfig};
use remote_wal::ddl::{
    CreateTableTask, MemoryDatanodeManager, RoundRobinPeerSelector, TableMetadataAllocator,
    TableName,
};
use remote_wal::kv::{KvBackendRef, MemoryKvBackend};
use remote_wal::metasrv::Metasrv;
use remote_wal::wal::kafka::testing::FakeTopicAdmin;
use remote_wal::wal::kafka::{KafkaTopicManager, LeastLoadedTopicSelector, TopicPoolSpec};
use remote_wal::wal::{KafkaConfig, WalConfig, WalOptions, WalOptionsAllocator};

const PREFIX: &str = "sel_pool";

/// A metasrv "process" on the shared store and fake brokers, with a pool of `num_topics` topics.
fn metasrv(kv: &KvBackendRef, broker: &Arc<FakeTopicAdmin>, num_topics: usize) -> Metasrv {
    let config = MetasrvConfig {
        metadata_store: MetadataStoreConfig {
            backend: MetadataBackend::Memory,
            ..Default::default()
        },
        wal: WalConfig::Kafka(KafkaConfig {
            num_topics,
            topic_name_prefix: PREFIX.to_string(),
            ..Default::default()
        }),
        datanodes: DatanodesConfig {
            ids: vec![1, 2, 3],
            ..Default::default()
        },
        ..Default::default()
    };
    Metasrv::with_parts(
        config,
        kv.clone(),
        Some(broker.clone()),
        Arc::new(MemoryDatanodeManager::new()),
    )
    .expect("valid config")
}

fn topic_of(encoded: &str) -> String {
    match WalOptions::decode(encoded).expect("recorded WAL options decode") {
        WalOptions::Kafka(k) => k.topic,
        other => panic!("expected a Kafka topic, got {other:?}"),
    }
}

/// Creates the tables of `processes` (region counts per table, one list per process), each list by a new metasrv
/// on the same store, the previous one stopped first; returns the regions per topic the last `topics()` reports
/// after checking its spread against them.
async fn create_over_processes(
    num_topics: usize,
    processes: &[Vec<u32>],
) -> BTreeMap<String, usize> {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let broker = Arc::new(FakeTopicAdmin::new());
    let mut created: BTreeMap<String, usize> = BTreeMap::new();
    let mut table = 0;
    for tables in processes {
        let metasrv = metasrv(&kv, &broker, num_topics);
        metasrv
            .start()
            .await
            .expect("start (bootstraps the pool once)");
        for regions in tables {
            table += 1;
            let name = TableName::new("greptime", "public", format!("t{table}"));
            let made = metasrv
                .create_table(name, *regions, false)
                .await
                .expect("create table");
            for r in &made.regions {
                *created.entry(topic_of(&r.wal_options)).or_default() += 1;
            }
        }
        metasrv.stop().await.expect("stop");
    }
    let report = metasrv(&kv, &broker, num_topics)
        .topics()
        .await
        .expect("topics report");
    let reported: BTreeMap<String, usize> = report
        .topics
        .iter()
        .filter(|t| t.regions > 0)
        .map(|t| (t.topic.clone(), t.regions))
        .collect();
    assert_eq!(
        reported, created,
        "the report counts what create-table recorded"
    );
    let per_topic: Vec<usize> = report.topics.iter().map(|t| t.regions).collect();
    assert_eq!(per_topic.len(), num_topics);
    assert_eq!(
        report.spread.min,
        per_topic.iter().copied().min().unwrap_or(0)
    );
    assert_eq!(
        report.spread.max,
        per_topic.iter().copied().max().unwrap_or(0)
    );
    let total: usize = per_topic.iter().sum();
    assert!((report.spread.mean - total as f64 / num_topics as f64).abs() < 1e-9);
    report
        .topics
        .iter()
        .map(|t| (t.topic.clone(), t.regions))
        .collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Random pools and random tables over 2–5 processes: the spread stays within one region, where a round-robin
    /// restarting anywhere in each process would pile regions on some topics.
    #[test]
    fn spread_stays_within_one_region_over_restarts(
        num_topics in 1usize..12,
        processes in prop::collection::vec(prop::collection::vec(1u32..24, 1..6), 2..6),
    ) {
        let counts = runtime().block_on(create_over_processes(num_topics, &processes));
        let total: u32 = processes.iter().flatten().sum();
        prop_assert_eq!(counts.values().sum::<usize>(), total as usize);
        let min = counts.values().min().copied().unwrap_or(0);
        let max = counts.values().max().copied().unwrap_or(0);
        prop_assert!(max - min <= 1, "{:?}", counts);
    }
}

/// A ready pool manager over `kv` (its topics persisted by an earlier metasrv) with its own load-aware selector.
async fn pool(
    kv: &KvBackendRef,
    broker: &Arc<FakeTopicAdmin>,
    num_topics: usize,
) -> (Arc<WalOptionsAllocator>, Arc<LeastLoadedTopicSelector>) {
    let selector = Arc::new(LeastLoadedTopicSelector::new());
    let topics = KafkaTopicManager::new(
        TopicPoolSpec::new(PREFIX, num_topics),
        kv.clone(),
        broker.clone(),
        selector.clone(),
    )
    .expect("valid spec");
    topics.load_ready().await.expect("the pool is persisted");
    (Arc::new(WalOptionsAllocator::Kafka(topics)), selector)
}

/// A store whose pool of `num_topics` topics is bootstrapped (by a metasrv since stopped).
async fn bootstrapped(num_topics: usize) -> (KvBackendRef, Arc<FakeTopicAdmin>) {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let broker = Arc::new(FakeTopicAdmin::new());
    let m = metasrv(&kv, &broker, num_topics);
    m.start().await.expect("bootstrap");
    m.stop().await.expect("stop");
    (kv, broker)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_allocations_in_one_process_keep_counts_exact() {
    let (kv, broker) = bootstrapped(7).await;
    let (wal, selector) = pool(&kv, &broker, 7).await;
    let tasks: Vec<_> = (0..32)
        .map(|k| {
            let wal = wal.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                for i in 0..20 {
                    got.extend(wal.alloc_batch(1 + (i + k) % 9).expect("pool ready"));
                }
                got
            })
        })
        .collect();
    let mut handed_out: BTreeMap<String, u64> = BTreeMap::new();
    for task in tasks {
        for options in task.await.expect("allocation task") {
            match options {
                WalOptions::Kafka(k) => *handed_out.entry(k.topic).or_default() += 1,
                other => panic!("expected Kafka options, got {other:?}"),
            }
        }
    }
    // The selector's counts are exactly what it handed out: no pick lost or counted twice under concurrency.
    assert_eq!(selector.counts(), handed_out);
    let min = handed_out.values().min().copied().unwrap_or(0);
    let max = handed_out.values().max().copied().unwrap_or(0);
    assert_eq!(handed_out.len(), 7);
    assert!(max - min <= 1, "{handed_out:?}");
}

#[tokio::test]
async fn a_replayed_allocate_counts_its_regions_once() {
    let (kv, broker) = bootstrapped(4).await;
    let task = CreateTableTask::new(TableName::new("greptime", "public", "replayed"), 6);
    let allocator = |wal: Arc<WalOptionsAllocator>| {
        TableMetadataAllocator::new(
            kv.clone(),
            Arc::new(RoundRobinPeerSelector::new(vec![1])),
            wal,
        )
    };

    // Process 1 reserves the allocation, replays the step, then dies before writing the table's metadata.
    let (wal, selector) = pool(&kv, &broker, 4).await;
    let first = allocator(wal.clone())
        .allocate_once("proc-a", &task)
        .await
        .unwrap();
    let replay = allocator(wal).allocate_once("proc-a", &task).await.unwrap();
    assert_eq!(replay, first);
    assert_eq!(selector.counts().values().sum::<u64>(), 6);

    // Process 2 counts the reservation from the store once, and its replay of Allocate reuses it.
    let (wal, selector) = pool(&kv, &broker, 4).await;
    let mut reserved: BTreeMap<String, u64> = BTreeMap::new();
    for encoded in first.region_wal_options.values() {
        *reserved.entry(topic_of(encoded)).or_default() += 1;
    }
    assert_eq!(
        selector.counts(),
        reserved,
        "seeded with the reservation, once"
    );
    let next = wal.alloc_batch(2).unwrap();
    let counts = selector.counts();
    assert_eq!(counts.values().sum::<u64>(), 6 + 2, "{counts:?}");
    for (topic, n) in &reserved {
        let picked = next
            .iter()
            .filter(|o| matches!(o, WalOptions::Kafka(k) if &k.topic == topic))
            .count() as u64;
        assert_eq!(counts[topic], n + picked, "{topic}: {counts:?}");
    }
    let replay = allocator(wal).allocate_once("proc-a", &task).await.unwrap();
    assert_eq!(replay, first);
    assert_eq!(
        selector.counts(),
        counts,
        "the replay handed out nothing new"
    );
    // 6 regions over 4 topics (2,2,1,1), then 2 more to the two emptiest: level at 2.
    assert!(counts.values().all(|c| *c == 2), "{counts:?}");
}
