//! Replay checkpoints in `__topic_region/{topic}/{region_id}`: they only move forward, a new region on a Kafka
//! topic starts at the topic's end, and GreptimeDB's empty value (a region without a checkpoint) is read.

use std::sync::Arc;

use datanode::checkpoint::{
    CheckpointStore, TopicRegionValue, start_kafka_region, topic_region_key,
};
use datanode::log_store::LogStore;
use datanode::replay::replay_topic;
use remote_wal::kv::memory::MemoryKvBackend;
use remote_wal::kv::{KvBackendRef, PutRequest};

use crate::common::{data, memory_store, write};

fn kv() -> KvBackendRef {
    Arc::new(MemoryKvBackend::new())
}

#[tokio::test]
async fn a_checkpoint_only_moves_forward_and_is_stored_in_greptimedb_layout() {
    let kv = kv();
    let checkpoints = CheckpointStore::new(kv.clone());
    assert_eq!(checkpoints.get("t", 7).await.unwrap(), None);
    assert_eq!(checkpoints.record_flushed("t", 7, 10).await.unwrap(), 10);
    assert_eq!(
        checkpoints.record_flushed("t", 7, 4).await.unwrap(),
        10,
        "never backwards"
    );
    assert_eq!(checkpoints.record_flushed("t", 7, 12).await.unwrap(), 12);
    let stored = kv.get(&topic_region_key("t", 7)).await.unwrap().unwrap();
    assert_eq!(stored.key, b"__topic_region/t/7".to_vec());
    assert_eq!(stored.value, br#"{"checkpoint":{"entry_id":12}}"#.to_vec());

    // A region GreptimeDB's create-table wrote (empty value: no checkpoint yet) is listed without one, and
    // starting it gives it one; starting it again keeps the first.
    kv.put(PutRequest {
        key: topic_region_key("t", 8),
        value: Vec::new(),
        prev_kv: false,
    })
    .await
    .unwrap();
    let regions = checkpoints.regions("t").await.unwrap();
    assert_eq!(regions[&7], TopicRegionValue::at(12));
    assert_eq!(regions[&8], TopicRegionValue::default());
    assert_eq!(checkpoints.start_region("t", 8, 30).await.unwrap(), 30);
    assert_eq!(
        checkpoints.start_region("t", 8, 50).await.unwrap(),
        30,
        "a retried start keeps it"
    );
    assert_eq!(checkpoints.start_region("t", 7, 50).await.unwrap(), 12);
    assert!(checkpoints.regions("other").await.unwrap().is_empty());
}

#[tokio::test]
async fn a_new_region_on_a_kafka_topic_starts_at_the_topics_end() {
    let kv = kv();
    let checkpoints = CheckpointStore::new(kv.clone());
    let store = memory_store(1024);
    store
        .append(
            (0..5)
                .map(|i| write(1, format!("old {i}").as_bytes()))
                .collect(),
        )
        .await
        .unwrap();
    assert_eq!(
        start_kafka_region(&store, &checkpoints, 2).await.unwrap(),
        5
    );
    store
        .append(vec![write(2, b"mine"), write(1, b"more")])
        .await
        .unwrap();
    let replay = replay_topic(&store, &kv, &[1, 2]).await.unwrap();
    assert_eq!(replay.regions[&2].checkpoint, 5);
    assert_eq!(data(&replay.regions[&2].entries), vec![b"mine".to_vec()]);
    // Region 1 has no checkpoint: it replays everything it wrote.
    assert_eq!(replay.regions[&1].entries_replayed, 6);
}
