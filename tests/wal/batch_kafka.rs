//! Batched creation and the one metadata read on the real broker (`KAFKA_ENDPOINTS`): a batch answered per topic
//! (created, already existing, another partition count, a refused replication factor), and a 2,000-topic pool
//! bootstrapped in batches of 1,000, then resumed after a crash before PersistNames with every topic existing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use procedures::{Context, Procedure, ProcedureId, Status};
use remote_wal::key::topic_name::list_persisted_topics;
use remote_wal::kv::{KvBackendRef, MemoryKvBackend};
use remote_wal::wal::kafka::TopicPoolSpec;
use remote_wal::wal::kafka::admin::{CreateTopicOutcome, TopicAdmin, TopicCreation};
use remote_wal::wal::kafka::bootstrap::{
    BootstrapStep, TopicBootstrapData, TopicBootstrapProcedure,
};
use remote_wal::wal::kafka::rskafka_admin::RsKafkaTopicAdmin;
use remote_wal::wal::{KafkaConfig, TopicConfig};

use crate::support;

fn config(prefix: &str, num_topics: usize) -> KafkaConfig {
    KafkaConfig {
        broker_endpoints: support::require_endpoints("KAFKA_ENDPOINTS", "a running Kafka broker"),
        num_topics,
        topic_name_prefix: prefix.to_string(),
        create_topic_timeout: Duration::from_secs(30),
        create_batch_size: 1_000,
        ..KafkaConfig::default()
    }
}

async fn connect(config: &KafkaConfig) -> RsKafkaTopicAdmin {
    match RsKafkaTopicAdmin::connect(config).await {
        Ok(admin) => admin,
        Err(e) => panic!("Kafka at {:?} is unreachable: {e}", config.broker_endpoints),
    }
}

/// The real admin, counting the batched creates and metadata reads the bootstrap sends through it.
#[derive(Debug)]
struct Counting {
    inner: RsKafkaTopicAdmin,
    batches: AtomicUsize,
    reads: AtomicUsize,
}

#[async_trait]
impl TopicAdmin for Counting {
    fn endpoints(&self) -> Vec<String> {
        self.inner.endpoints()
    }

    async fn list_topics(&self) -> remote_wal::wal::error::Result<BTreeMap<String, usize>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.list_topics().await
    }

    async fn create_topic(
        &self,
        name: &str,
        num_partitions: i32,
        replication_factor: i16,
    ) -> remote_wal::wal::error::Result<CreateTopicOutcome> {
        self.batches.fetch_add(1, Ordering::SeqCst);
        self.inner
            .create_topic(name, num_partitions, replication_factor)
            .await
    }

    fn create_batch_size(&self) -> usize {
        self.inner.create_batch_size()
    }

    async fn create_topics(
        &self,
        names: &[String],
        num_partitions: i32,
        replication_factor: i16,
        topic_config: &TopicConfig,
    ) -> remote_wal::wal::error::Result<Vec<TopicCreation>> {
        self.batches.fetch_add(1, Ordering::SeqCst);
        self.inner
            .create_topics(names, num_partitions, replication_factor, topic_config)
            .await
    }

    async fn describe_topics(
        &self,
        names: &[String],
    ) -> remote_wal::wal::error::Result<BTreeMap<String, usize>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.describe_topics(names).await
    }
}

async fn run_to_done(p: &mut TopicBootstrapProcedure) {
    let ctx = Context::new(ProcedureId::new("test"));
    loop {
        match p.execute(&ctx).await {
            Ok(Status::Executing { .. }) => {}
            Ok(Status::Done { .. }) => return,
            Ok(other) => panic!("unexpected status {other:?}"),
            Err(e) => panic!("bootstrap failed: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_on_the_real_broker_is_answered_per_topic() {
    let prefix = support::unique("rw_batch_answers");
    let admin = connect(&config(&prefix, 4)).await;
    let names: Vec<String> = (0..4).map(|i| format!("{prefix}_{i}")).collect();
    admin.create_topic(&names[1], 1, 1).await.unwrap();
    admin.create_topic(&names[2], 2, 1).await.unwrap();

    let answers: BTreeMap<String, _> = admin
        .create_topics(&names, 1, 1, &TopicConfig::new())
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(
        answers[&names[0]].as_ref().unwrap(),
        &CreateTopicOutcome::Created
    );
    assert_eq!(
        answers[&names[1]].as_ref().unwrap(),
        &CreateTopicOutcome::AlreadyExisted
    );
    let mismatch = answers[&names[2]].as_ref().unwrap_err().to_string();
    assert!(
        mismatch.contains(&format!(
            "topic '{}' already exists with 2 partition(s), but 1 partition(s) are wanted",
            names[2]
        )),
        "{mismatch}"
    );
    assert_eq!(
        answers[&names[3]].as_ref().unwrap(),
        &CreateTopicOutcome::Created
    );

    // One broker cannot place 3 replicas: the topic's answer names it, the code and the broker's message.
    let lonely = format!("{prefix}_rf3");
    let answers = admin
        .create_topics(std::slice::from_ref(&lonely), 1, 3, &TopicConfig::new())
        .await
        .unwrap();
    let err = answers[0].1.as_ref().unwrap_err();
    assert!(!err.is_retryable(), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&format!("'{lonely}'"))
            && text.contains("INVALID_REPLICATION_FACTOR")
            && text.contains("broker"),
        "{text}"
    );

    // Topics created a moment ago can be missing from metadata briefly: read until all four are listed.
    let described = loop {
        let described = admin.describe_topics(&names).await.unwrap();
        if described.len() == names.len() {
            break described;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(described[&names[0]], 1);
    assert_eq!(described[&names[2]], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_topics_bootstrap_in_batches_and_resume_with_one_metadata_read() {
    let prefix = support::unique("rw_batch_2k");
    let config = config(&prefix, 2_000);
    let admin = Arc::new(Counting {
        inner: connect(&config).await,
        batches: AtomicUsize::new(0),
        reads: AtomicUsize::new(0),
    });
    let spec = TopicPoolSpec::from_config(&config);
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let mut p = TopicBootstrapProcedure::new(spec.clone(), kv.clone(), admin.clone()).unwrap();
    run_to_done(&mut p).await;
    // 2,000 missing topics in batches of 1,000.
    assert_eq!(admin.batches.load(Ordering::SeqCst), 2);
    let wanted = spec.topic_names();
    // The bootstrap ends once the controller acknowledged the creations; the broker lists them a little later.
    let until = tokio::time::Instant::now() + Duration::from_secs(60);
    let listed = loop {
        let listed = admin.inner.describe_topics(&wanted).await.unwrap();
        if listed.len() == wanted.len() || tokio::time::Instant::now() >= until {
            break listed;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(listed.len(), 2_000);
    assert!(listed.values().all(|&p| p == 1));
    let persisted = list_persisted_topics(kv.as_ref(), &format!("{prefix}_"))
        .await
        .unwrap();
    assert_eq!(persisted.len(), 2_000);

    // A crash before PersistNames: resumed at CreateMissing with nothing persisted and every topic existing.
    admin.batches.store(0, Ordering::SeqCst);
    admin.reads.store(0, Ordering::SeqCst);
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let mut p = TopicBootstrapProcedure::from_data(
        TopicBootstrapData {
            step: BootstrapStep::CreateMissing,
            spec,
            persisted_below: 0,
        },
        kv.clone(),
        admin.clone(),
    );
    run_to_done(&mut p).await;
    assert_eq!(admin.reads.load(Ordering::SeqCst), 1, "one metadata read");
    assert_eq!(admin.batches.load(Ordering::SeqCst), 0, "no create sent");
    let persisted = list_persisted_topics(kv.as_ref(), &format!("{prefix}_"))
        .await
        .unwrap();
    assert_eq!(persisted.len(), 2_000);
}
