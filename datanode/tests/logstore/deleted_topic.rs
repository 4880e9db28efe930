//! Replay on the real broker (`KAFKA_ENDPOINTS`; the test fails when it is unset) when one of the datanode's
//! topics was deleted outright: its regions each get an error naming the region and the topic, within the bound of
//! the configured Kafka deadlines, and the regions on the other topic replay all the same.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use datanode::log_store::{KafkaLogStoreConfig, LogStore};
use datanode::replay::replay_open_requests;
use remote_wal::datanode::RegionOpenRequest;
use remote_wal::kv::KvBackendRef;
use remote_wal::kv::memory::MemoryKvBackend;
use remote_wal::wal::{WAL_OPTIONS_KEY, WalOptions};

use crate::common::{broker_store, broker_topic, write};

fn open_request(region_id: u64, topic: &str) -> RegionOpenRequest {
    RegionOpenRequest {
        region_id,
        engine: "mito".to_string(),
        region_dir: format!("data/{region_id}"),
        options: BTreeMap::from([(
            WAL_OPTIONS_KEY.to_string(),
            WalOptions::kafka(topic).encode(),
        )]),
    }
}

#[tokio::test]
async fn a_deleted_topic_fails_its_regions_by_name_and_the_other_topics_regions_replay() {
    let (client, config, kept) = broker_topic("deleted_kept").await;
    let (_, _, gone) = broker_topic("deleted_gone").await;
    let kept_store = broker_store(&client, &config, &kept, KafkaLogStoreConfig::default()).await;
    kept_store
        .append(vec![write(1, b"a"), write(2, b"b"), write(1, b"c")])
        .await
        .unwrap();
    let gone_store = broker_store(&client, &config, &gone, KafkaLogStoreConfig::default()).await;
    gone_store
        .append(vec![write(3, b"x"), write(4, b"y")])
        .await
        .unwrap();
    client
        .controller_client()
        .expect("controller client")
        .delete_topic(gone.clone(), 10_000)
        .await
        .unwrap_or_else(|e| panic!("delete topic {gone}: {e}"));

    // Short deadlines: a call on the deleted topic gives up after about backoff.deadline + create_topic_timeout.
    let mut short = config.clone();
    short.backoff.deadline = Duration::from_secs(2);
    short.create_topic_timeout = Duration::from_secs(1);
    let bound = datanode::log_store::kafka::call_bound(&short);
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let requests = vec![
        open_request(1, &kept),
        open_request(3, &gone),
        open_request(2, &kept),
        open_request(4, &gone),
    ];
    let no_engine_dir = std::env::temp_dir().join(crate::support::unique("no_raft_engine"));
    // Every call on the deleted topic is bounded: opening its partition, or one call on it once opened, then the
    // replay gives up on the topic. Twice the bound plus connecting leaves room on a busy machine.
    let outcomes = tokio::time::timeout(
        bound * 2 + Duration::from_secs(20),
        replay_open_requests(&requests, &kv, Some(&short), &no_engine_dir),
    )
    .await
    .unwrap_or_else(|_| {
        panic!("the replay did not give up on deleted topic {gone} in bounded time")
    });

    let by_region: BTreeMap<u64, _> = outcomes.iter().map(|o| (o.region_id, o)).collect();
    assert_eq!(outcomes.len(), 4);
    for region in [3, 4] {
        let error = by_region[&region]
            .error
            .as_ref()
            .unwrap_or_else(|| panic!("region {region} on deleted topic {gone} replayed"));
        let text = error.to_string();
        assert!(
            text.starts_with(&format!("region {region}: WAL replay failed: ")),
            "{text}"
        );
        assert!(text.contains(&format!("'{gone}'")), "{text}");
    }
    assert!(by_region[&1].error.is_none(), "{:?}", by_region[&1].error);
    assert!(by_region[&2].error.is_none(), "{:?}", by_region[&2].error);
    assert_eq!(
        (
            by_region[&1].entries_replayed,
            by_region[&2].entries_replayed
        ),
        (2, 1)
    );
    eprintln!("deleted topic: {}", by_region[&3].error.as_ref().unwrap());
}
