//! `walctl open-regions --replay` on Kafka (`KAFKA_ENDPOINTS`; the test fails saying so when unset): regions
//! sharing a pool topic each report exactly the entries written for them on it.

use std::collections::BTreeMap;
use std::time::Duration;

use datanode::log_store::kafka::{RsKafkaPartition, call_bound, connect_client};
use datanode::log_store::{EntryToWrite, KafkaLogStore, KafkaLogStoreConfig, LogStore};
use remote_wal::wal::{KafkaConfig, WalOptions};

use crate::support::{Env, endpoints, kafka_redb_config, unique};

#[test]
fn replay_reports_the_entries_each_region_wrote_on_its_shared_topic() {
    let env = Env::new();
    let prefix = unique("walctl_replay");
    let config = kafka_redb_config(&env, "replay", &prefix, 2, "");
    env.json(Some(&config), &["bootstrap"]);
    let created = env.json(
        Some(&config),
        &["create-table", "public.replayed", "--regions", "4"],
    );
    // region id → topic
    let topics: BTreeMap<u64, String> = created
        .iter()
        .map(|r| {
            let options = WalOptions::decode(r["wal_options"].as_str().expect("wal_options"))
                .expect("decode");
            let WalOptions::Kafka(k) = options else {
                panic!("a Kafka region: {r}")
            };
            (r["region_id"].as_u64().expect("region_id"), k.topic)
        })
        .collect();
    assert_eq!(
        topics
            .values()
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        2,
        "4 regions share the 2 topics: {topics:?}"
    );

    // Region i writes i + 1 entries of 100 bytes on its topic.
    let mut kafka = KafkaConfig {
        broker_endpoints: endpoints("KAFKA_ENDPOINTS"),
        create_topic_timeout: Duration::from_secs(10),
        ..KafkaConfig::default()
    };
    kafka.backoff.deadline = Duration::from_secs(10);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut wanted = BTreeMap::new();
    rt.block_on(async {
        let client = connect_client(&kafka).await.expect("connect");
        for (i, (region_id, topic)) in topics.iter().enumerate() {
            let partition = RsKafkaPartition::new(&client, topic, call_bound(&kafka))
                .await
                .expect("partition");
            let store = KafkaLogStore::new(partition, KafkaLogStoreConfig::default());
            let entries = (0..=i)
                .map(|_| EntryToWrite {
                    region_id: *region_id,
                    data: vec![1; 100],
                })
                .collect();
            store.append(entries).await.expect("append");
            wanted.insert(*region_id, i as u64 + 1);
        }
    });

    let opened = env.json(
        Some(&config),
        &["open-regions", "--datanode", "1", "--replay"],
    );
    assert_eq!(opened.len(), 4, "{opened:?}");
    for line in &opened {
        let region_id = line["region_id"].as_u64().expect("region_id");
        assert!(line.get("replay_error").is_none(), "{line}");
        assert_eq!(
            line["entries_replayed"].as_u64(),
            Some(wanted[&region_id]),
            "{line}"
        );
        assert_eq!(
            line["bytes_replayed"].as_u64(),
            Some(wanted[&region_id] * 100),
            "{line}"
        );
    }
}
