//! `WalOptionsAllocator` end to end on a procedure manager: readiness, allocation order, one bootstrap per pool,
//! growth after a finished bootstrap, and a new attempt after a failed one.

use std::sync::Arc;
use std::time::Duration;

use procedures::{
    LocalManager, ManagerConfig, MemoryStateStore, ProcedureManager, ProcedureManagerRef,
    RetryPolicy,
};
use remote_wal::key::topic_name::list_persisted_topics;
use remote_wal::kv::{KvBackendRef, MemoryKvBackend};
use remote_wal::wal::kafka::bootstrap::bootstrap_procedure_id;
use remote_wal::wal::kafka::testing::FAKE_ENDPOINT;
use remote_wal::wal::kafka::testing::{FakeFault, FakeTopicAdmin};
use remote_wal::wal::kafka::{
    KafkaTopicManager, ReadyPoll, RoundRobinTopicSelector, TopicPoolSpec,
};
use remote_wal::wal::{WalOptions, WalOptionsAllocator};

fn spec(prefix: &str, n: usize) -> TopicPoolSpec {
    let mut spec = TopicPoolSpec::new(prefix, n);
    spec.ready_poll = ReadyPoll {
        init: Duration::from_millis(1),
        max: Duration::from_millis(5),
        factor: 2.0,
        deadline: Duration::from_secs(5),
    };
    spec
}

fn kafka(
    spec: TopicPoolSpec,
    kv: &KvBackendRef,
    admin: &Arc<FakeTopicAdmin>,
) -> WalOptionsAllocator {
    WalOptionsAllocator::Kafka(
        KafkaTopicManager::new(
            spec,
            kv.clone(),
            admin.clone(),
            Arc::new(RoundRobinTopicSelector::new()),
        )
        .unwrap(),
    )
}

async fn manager(allocator: &WalOptionsAllocator) -> ProcedureManagerRef {
    let config = ManagerConfig {
        step_retry: RetryPolicy {
            max_retries: 1,
            initial_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(2),
            factor: 2.0,
        },
        ..ManagerConfig::default()
    };
    let manager = LocalManager::new(Arc::new(MemoryStateStore::new()), config);
    allocator.register_loaders(&manager).unwrap();
    manager.start().await.unwrap();
    Arc::new(manager)
}

#[tokio::test]
async fn raft_engine_is_ready_at_once() {
    let allocator = WalOptionsAllocator::RaftEngine;
    assert!(allocator.is_ready());
    assert_eq!(allocator.alloc().unwrap(), WalOptions::RaftEngine);
    assert_eq!(
        allocator.alloc_batch(3).unwrap(),
        vec![WalOptions::RaftEngine; 3]
    );
    let manager = manager(&allocator).await;
    allocator.start(&manager).await.unwrap();
    assert!(allocator.alloc_batch(0).unwrap().is_empty());
}

#[tokio::test]
async fn kafka_allocation_before_start_is_an_error_not_a_fallback() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    let allocator = kafka(spec("early", 4), &kv, &admin);
    assert!(!allocator.is_ready());
    for err in [
        allocator.alloc().unwrap_err(),
        allocator.alloc_batch(2).unwrap_err(),
    ] {
        let text = err.to_string();
        assert!(
            text.contains("'early'") && text.contains("not ready"),
            "{text}"
        );
    }
}

#[tokio::test]
async fn start_bootstraps_the_pool_then_allocates_round_robin() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    let allocator = kafka(spec("rr", 3), &kv, &admin);
    let manager = manager(&allocator).await;
    allocator.start(&manager).await.unwrap();
    assert!(allocator.is_ready());
    assert_eq!(admin.topics().len(), 3);
    assert_eq!(
        list_persisted_topics(kv.as_ref(), "").await.unwrap(),
        ["rr_0", "rr_1", "rr_2"]
    );
    let got = allocator.alloc_batch(4).unwrap();
    assert_eq!(
        got,
        ["rr_0", "rr_1", "rr_2", "rr_0"]
            .map(WalOptions::kafka)
            .to_vec()
    );
    assert_eq!(allocator.alloc().unwrap(), WalOptions::kafka("rr_1"));
}

#[tokio::test]
async fn starting_twice_is_one_procedure() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    let allocator = kafka(spec("twice", 5), &kv, &admin);
    let manager = manager(&allocator).await;
    let (a, b) = tokio::join!(allocator.start(&manager), allocator.start(&manager));
    a.unwrap();
    b.unwrap();
    allocator.start(&manager).await.unwrap();
    assert_eq!(admin.total_create_calls(), 5);
    let ids: Vec<String> = manager
        .list_procedures()
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.id.to_string())
        .collect();
    assert_eq!(ids, [bootstrap_procedure_id("twice", 0).to_string()]);
}

#[tokio::test]
async fn a_grown_pool_runs_a_new_bootstrap_after_the_finished_one() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    let small = kafka(spec("grow", 4), &kv, &admin);
    let manager = manager(&small).await;
    small.start(&manager).await.unwrap();

    let big = kafka(spec("grow", 6), &kv, &admin);
    big.start(&manager).await.unwrap();
    assert_eq!(admin.total_create_calls(), 6);
    assert_eq!(
        list_persisted_topics(kv.as_ref(), "").await.unwrap().len(),
        6
    );
    assert_eq!(big.alloc_batch(6).unwrap().len(), 6);
    assert!(
        manager
            .watch(&bootstrap_procedure_id("grow", 1))
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test]
async fn a_failed_bootstrap_is_reported_and_a_later_start_runs_a_new_one() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    admin.create_out_of_band("bad_1", 3);
    let allocator = kafka(spec("bad", 3), &kv, &admin);
    let manager = manager(&allocator).await;
    let err = allocator.start(&manager).await.unwrap_err().to_string();
    assert!(err.contains("'bad'") && err.contains("bad_1"), "{err}");
    assert!(!allocator.is_ready());
    assert!(
        list_persisted_topics(kv.as_ref(), "")
            .await
            .unwrap()
            .is_empty()
    );

    // The operator fixes the topic; the next start (same manager, failed record retained) succeeds.
    admin.delete_out_of_band("bad_1");
    allocator.start(&manager).await.unwrap();
    assert!(allocator.is_ready());
    assert_eq!(
        list_persisted_topics(kv.as_ref(), "").await.unwrap().len(),
        3
    );
}

#[tokio::test]
async fn a_changed_partition_count_fails_the_start_whether_or_not_the_finished_bootstrap_is_retained()
 {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    let one = kafka(spec("parts", 3), &kv, &admin);
    let first_manager = manager(&one).await;
    one.start(&first_manager).await.unwrap();

    // The config now asks for 2 partitions per topic; the topics have 1. A manager without the finished record
    // (its retention ran out, or another state store) runs the bootstrap, which refuses the pool...
    let mut two_partitions = spec("parts", 3);
    two_partitions.num_partitions = 2;
    let fresh = kafka(two_partitions.clone(), &kv, &admin);
    let fresh_manager = manager(&fresh).await;
    let err = fresh.start(&fresh_manager).await.unwrap_err().to_string();
    assert!(
        err.contains("parts_0") && err.contains("partition"),
        "{err}"
    );
    assert!(!fresh.is_ready());

    // ...and so must a manager that still retains the bootstrap that made the 1-partition pool.
    let retained = kafka(two_partitions, &kv, &admin);
    let err = retained
        .start(&first_manager)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("parts_0") && err.contains("partition"),
        "{err}"
    );
    assert!(!retained.is_ready());
    assert_eq!(
        admin.partitions()["parts_0"],
        1,
        "the topics are left alone"
    );
}

/// Log lines written while the returned guard lives on this thread.
#[derive(Clone, Default)]
struct Logs(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn capture(&self) -> tracing::subscriber::DefaultGuard {
        let logs = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || logs.clone())
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test]
async fn a_shrunk_pool_warns_about_the_topics_beyond_it_even_when_no_bootstrap_runs() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    let big = kafka(spec("shrink", 6), &kv, &admin);
    let manager = manager(&big).await;
    big.start(&manager).await.unwrap();

    // The finished bootstrap of 6 topics is retained: starting the 4-topic pool runs no new bootstrap.
    let small = kafka(spec("shrink", 4), &kv, &admin);
    let logs = Logs::default();
    {
        let _guard = logs.capture();
        small.start(&manager).await.unwrap();
    }
    assert_eq!(manager.list_procedures().await.unwrap().len(), 1);
    let text = logs.text();
    assert!(
        text.contains("shrink_4") && text.contains("shrink_5") && text.contains("WARN"),
        "a warning names the persisted topics beyond the pool: {text:?}"
    );
    assert_eq!(small.alloc_batch(8).unwrap().len(), 8);
    assert!(
        small
            .alloc_batch(8)
            .unwrap()
            .iter()
            .all(|o| *o != WalOptions::kafka("shrink_4") && *o != WalOptions::kafka("shrink_5"))
    );
}

#[tokio::test]
async fn brokers_stopped_after_connecting_fail_the_start_naming_the_endpoints() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    // Brokers stopped after the admin connected: rskafka retries every call until its deadline, which is final.
    let admin = Arc::new(FakeTopicAdmin::new());
    admin.fail_all(Some(FakeFault::DeadlineExhausted));
    let allocator = WalOptionsAllocator::Kafka(
        KafkaTopicManager::new(
            spec("down", 2),
            kv.clone(),
            admin.clone(),
            Arc::new(RoundRobinTopicSelector::new()),
        )
        .unwrap(),
    );
    let manager = manager(&allocator).await;
    // The exhausted deadline is final: the manager fails the step without running the deadline again.
    let err = allocator.start(&manager).await.unwrap_err().to_string();
    assert!(
        err.contains(FAKE_ENDPOINT) && err.contains("'down'"),
        "{err}"
    );
    assert!(!allocator.is_ready());
    assert!(
        list_persisted_topics(kv.as_ref(), "")
            .await
            .unwrap()
            .is_empty()
    );
}
