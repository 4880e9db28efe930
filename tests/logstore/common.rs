//! Helpers of the log store tests: a store on an in-memory partition, entries, and a topic on the real broker.

use std::sync::Arc;
use std::time::Duration;

use remote_wal::datanode::log_store::kafka::PartitionLog;
use remote_wal::datanode::log_store::memory_partition::MemoryPartition;
use remote_wal::datanode::log_store::{
    Entry, EntryToWrite, KafkaLogStore, KafkaLogStoreConfig, RsKafkaPartition,
};
use remote_wal::wal::KafkaConfig;
use rskafka::client::Client;

use crate::support::{require_endpoints, unique};

/// A Kafka log store on a fresh in-memory partition with `max_batch_bytes` per produce request.
pub fn memory_store(max_batch_bytes: usize) -> KafkaLogStore<MemoryPartition> {
    KafkaLogStore::new(
        MemoryPartition::new("memory_topic"),
        KafkaLogStoreConfig::for_max_batch_bytes(max_batch_bytes),
    )
}

/// An entry to write.
pub fn write(region_id: u64, data: &[u8]) -> EntryToWrite {
    EntryToWrite {
        region_id,
        data: data.to_vec(),
    }
}

/// `n` bytes that differ per `seed`.
pub fn bytes(seed: u64, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64) % 251) as u8)
        .collect()
}

/// The data of entries, in order.
pub fn data(entries: &[Entry]) -> Vec<Vec<u8>> {
    entries.iter().map(|e| e.data.clone()).collect()
}

/// A Kafka config on the broker of `KAFKA_ENDPOINTS` (fails the test when unset), with short deadlines.
pub fn broker_config() -> KafkaConfig {
    let mut c = KafkaConfig {
        broker_endpoints: require_endpoints("KAFKA_ENDPOINTS", "a running Kafka broker"),
        create_topic_timeout: Duration::from_secs(10),
        ..KafkaConfig::default()
    };
    c.backoff.init = Duration::from_millis(50);
    c.backoff.max = Duration::from_millis(500);
    c.backoff.deadline = Duration::from_secs(30);
    c
}

/// A new one-partition topic on the real broker, and a client to it.
pub async fn broker_topic(tag: &str) -> (Arc<Client>, KafkaConfig, String) {
    let config = broker_config();
    let client = remote_wal::datanode::log_store::kafka::connect_client(&config)
        .await
        .unwrap_or_else(|e| panic!("Kafka at {:?} is unreachable: {e}", config.broker_endpoints));
    let topic = unique(&format!("logstore_{tag}"));
    client
        .controller_client()
        .expect("controller client")
        .create_topic(&topic, 1, 1, 10_000)
        .await
        .unwrap_or_else(|e| panic!("create topic {topic}: {e}"));
    // A new topic can be missing from metadata for a moment (longer on a busy broker): wait until it is listed, so
    // the store's first call does not spend its backoff deadline on UNKNOWN_TOPIC_OR_PARTITION.
    let listed = async {
        loop {
            let topics = client.list_topics().await.expect("list topics");
            if topics.iter().any(|t| t.name == topic) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(120), listed)
        .await
        .unwrap_or_else(|_| panic!("topic {topic} was created but not listed within 120 s"));
    (client, config, topic)
}

/// A log store on `topic` of the real broker.
pub async fn broker_store(
    client: &Client,
    config: &KafkaConfig,
    topic: &str,
    store_config: KafkaLogStoreConfig,
) -> KafkaLogStore<RsKafkaPartition> {
    let partition = RsKafkaPartition::new(
        client,
        topic,
        remote_wal::datanode::log_store::kafka::call_bound(config),
    )
    .await
    .unwrap_or_else(|e| panic!("partition client of {topic}: {e}"));
    // A new topic's partition may have no leader yet (longer on a busy broker): wait until it answers, so the
    // test's own calls meet a ready partition. A bound on readiness, not on speed.
    let mut last = None;
    for _ in 0..4 {
        match partition.high_watermark().await {
            Ok(_) => return KafkaLogStore::new(partition, store_config),
            Err(e) => last = Some(e),
        }
    }
    panic!("partition 0 of {topic} never answered: {last:?}")
}
