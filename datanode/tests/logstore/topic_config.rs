//! `[wal] topic_config."max.message.bytes"` sizes the log store's requests and fragments: entries larger than it
//! are written to a topic created with it (on the real broker, `KAFKA_ENDPOINTS`; fails when unset) and replayed
//! exactly.

use std::sync::Arc;

use datanode::log_store::kafka::{PartitionLog, call_bound, connect_client};
use datanode::log_store::{
    EntryToWrite, KafkaLogStore, KafkaLogStoreConfig, LogStore, RsKafkaPartition,
};
use datanode::replay::replay_topic;
use remote_wal::config::MetasrvConfig;
use remote_wal::kv::{KvBackendRef, MemoryKvBackend};
use remote_wal::wal::kafka::admin::TopicAdmin;
use remote_wal::wal::{KafkaConfig, TopicConfig, WalConfig};

use crate::support;

const ORIGIN: &str = "metasrv.toml";

fn kafka_toml(extra: &str) -> String {
    format!("[wal]\nprovider = \"kafka\"\nbroker_endpoints = [\"127.0.0.1:9092\"]\n{extra}\n")
}

/// The error the config file `toml` is refused with.
fn refused(toml: &str) -> String {
    MetasrvConfig::from_toml_str(toml, ORIGIN)
        .unwrap_err()
        .to_string()
}

fn configs(pairs: &[(&str, &str)]) -> TopicConfig {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn max_message_bytes_must_be_a_whole_number_of_bytes_and_sizes_the_log_store() {
    for bad in ["64k", "0", "-1", "1023", "2147483648", " 65536"] {
        assert_eq!(
            refused(&kafka_toml(&format!(
                "topic_config = {{ \"max.message.bytes\" = \"{bad}\" }}"
            ))),
            format!(
                "config file 'metasrv.toml': invalid WAL config: topic_config.\"max.message.bytes\" = {bad}: must \
                 be a whole number of bytes from 1024 to 2147483647 (the WAL fragments entries below it; each \
                 record needs room for its header, key and Kafka's framing)"
            ),
            "{bad:?}"
        );
    }
    let config = MetasrvConfig::from_toml_str(
        &kafka_toml("topic_config = { \"max.message.bytes\" = \"65536\" }"),
        ORIGIN,
    )
    .unwrap();
    let WalConfig::Kafka(kafka) = &config.wal else {
        panic!("not kafka: {:?}", config.wal)
    };
    let sizes = KafkaLogStoreConfig::for_kafka(kafka).unwrap();
    assert_eq!(sizes.max_batch_bytes, 65_536);
    // Room for the record's 46-byte header, its key and Kafka's framing.
    assert_eq!(sizes.max_fragment_bytes, 65_536 - 256 - 46);
    // Without it, Kafka's default topic limit.
    let sizes = KafkaLogStoreConfig::for_kafka(&KafkaConfig::default()).unwrap();
    assert_eq!(sizes.max_batch_bytes, 1_048_588);
}

/// Partition 0 of `topic`, once it answers: a new topic's partition may have no leader for a moment (a wait for
/// readiness, not a bound on speed).
async fn ready_partition(
    client: &rskafka::client::Client,
    config: &KafkaConfig,
    topic: &str,
) -> RsKafkaPartition {
    let mut last = None;
    for _ in 0..4 {
        match RsKafkaPartition::new(client, topic, call_bound(config)).await {
            Ok(p) => match p.high_watermark().await {
                Ok(_) => return p,
                Err(e) => last = Some(e),
            },
            Err(e) => last = Some(e),
        }
    }
    panic!("partition 0 of {topic} never answered: {last:?}")
}

/// Bytes that differ per `seed`.
fn entry_bytes(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_real_broker_entries_above_max_message_bytes_are_fragmented_below_it_and_replay_exactly()
 {
    let prefix = support::unique("rw_max_message");
    let config = support::real_kafka_config(&prefix, 1, configs(&[("max.message.bytes", "65536")]));
    let admin = support::connect_admin(&config).await;
    let topic = format!("{prefix}_0");
    let answers = admin
        .create_topics(std::slice::from_ref(&topic), 1, 1, &config.topic_config)
        .await
        .unwrap();
    answers[0].1.as_ref().unwrap();
    let client = connect_client(&config).await.unwrap();
    // The creation is acknowledged by the controller; the broker answering DescribeConfigs knows the topic only
    // once it applied it, which a ready partition shows.
    let partition = ready_partition(&client, &config, &topic).await;
    let read = support::describe_when_known(
        &admin,
        std::slice::from_ref(&topic),
        &["max.message.bytes".to_string()],
    )
    .await;
    assert_eq!(
        read.get(&topic)
            .and_then(|c| c.get("max.message.bytes"))
            .map(String::as_str),
        Some("65536"),
        "{read:?}"
    );

    let big = |seed| entry_bytes(seed, 300 * 1024);
    // Sized for Kafka's default limit, one 300 KiB record is refused by this topic, naming it; nothing is written.
    let unsized_store = KafkaLogStore::new(partition, KafkaLogStoreConfig::default());
    let err = unsized_store
        .append(vec![EntryToWrite {
            region_id: 1,
            data: big(9),
        }])
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains(&format!("'{topic}'")), "{err}");
    assert_eq!(unsized_store.end_entry_id().await.unwrap(), 0, "{err}");

    // Sized by the configured limit: fragments below it, read back whole.
    let store = KafkaLogStore::new(
        ready_partition(&client, &config, &topic).await,
        KafkaLogStoreConfig::for_kafka(&config).unwrap(),
    );
    let written = vec![
        EntryToWrite {
            region_id: 1,
            data: big(1),
        },
        EntryToWrite {
            region_id: 2,
            data: b"small".to_vec(),
        },
        EntryToWrite {
            region_id: 1,
            data: big(2),
        },
    ];
    let ids = store.append(written.clone()).await.unwrap();
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let replay = replay_topic(&store, &kv, &[1, 2]).await.unwrap();
    assert!(replay.errors.is_empty(), "{:?}", replay.errors);
    for region in [1, 2] {
        let wanted: Vec<(u64, Vec<u8>)> = written
            .iter()
            .zip(&ids)
            .filter(|(w, _)| w.region_id == region)
            .map(|(w, id)| (id.entry_id, w.data.clone()))
            .collect();
        let got: Vec<(u64, Vec<u8>)> = replay.regions[&region]
            .entries
            .iter()
            .map(|e| (e.entry_id, e.data.clone()))
            .collect();
        assert!(got == wanted, "region {region}: the entries differ");
    }
    // 300 KiB in fragments of at most 65,536 - 286 bytes: 5 records per large entry, and the small one.
    assert_eq!(replay.read.records, 11);
}
