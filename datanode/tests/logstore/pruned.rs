//! Entries a topic no longer holds (deleted by a prune, by retention, or the topic recreated) are an error naming
//! the topic, the region and both entry ids, never a silently shorter replay.

use std::collections::BTreeMap;

use datanode::log_store::LogStore;

use crate::common::{memory_store, write};

#[tokio::test]
async fn reading_below_the_topics_first_entry_names_topic_region_and_ids() {
    let store = memory_store(1024);
    store
        .append(vec![write(1, b"a"), write(2, b"b"), write(1, b"c")])
        .await
        .unwrap();
    store.partition().delete_below(2);
    let err = store.read(1, 1).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "WAL topic 'memory_topic', region 1: entries from entry id 1 are gone: the topic's first entry id is now 3"
    );
    assert!(!err.is_retryable());
    // From the first entry still there, the read works.
    let rest = store.read(1, 3).await.unwrap();
    assert_eq!(rest.len(), 1);
    // The region asking from the lowest id is the one named.
    let err = store
        .read_regions(&BTreeMap::from([(1, 3), (2, 2)]))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("region 2: entries from entry id 2"),
        "{err}"
    );
}

/// A topic deleted and recreated empty (a broker auto-creating topics, or by hand) ends below the checkpoints of
/// its old regions: each of them gets an error naming the topic, the region, its checkpoint and the topic's end,
/// never a silently empty replay; a region started on the new topic replays.
#[tokio::test]
async fn a_checkpoint_above_the_topics_end_is_an_error_naming_topic_region_and_both_ids() {
    use std::sync::Arc;

    use datanode::checkpoint::{CheckpointStore, start_kafka_region};
    use datanode::replay::replay_topic;
    use remote_wal::kv::KvBackendRef;
    use remote_wal::kv::memory::MemoryKvBackend;

    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let checkpoints = CheckpointStore::new(kv.clone());
    let old = memory_store(1024);
    let ids = old
        .append((0..8u64).map(|i| write(1 + i % 2, b"old")).collect())
        .await
        .unwrap();
    checkpoints
        .record_flushed("memory_topic", 1, ids[4].entry_id)
        .await
        .unwrap();
    checkpoints
        .record_flushed("memory_topic", 2, ids[7].entry_id)
        .await
        .unwrap();
    // The topic is recreated empty; region 3 starts on it and writes two entries.
    let recreated = memory_store(1024);
    start_kafka_region(&recreated, &checkpoints, 3)
        .await
        .unwrap();
    recreated
        .append(vec![write(3, b"n1"), write(3, b"n2")])
        .await
        .unwrap();
    let replay = replay_topic(&recreated, &kv, &[1, 2, 3]).await.unwrap();
    assert_eq!(
        replay.errors[&1].to_string(),
        "WAL topic 'memory_topic', region 1: its replay checkpoint is entry id 5 but the topic ends at entry id 2: the topic was recreated or truncated"
    );
    assert!(!replay.errors[&1].is_retryable());
    assert!(
        replay.errors[&2].to_string().contains(
            "region 2: its replay checkpoint is entry id 8 but the topic ends at entry id 2"
        ),
        "{}",
        replay.errors[&2]
    );
    assert!(!replay.regions.contains_key(&1) && !replay.regions.contains_key(&2));
    let three: Vec<Vec<u8>> = replay.regions[&3]
        .entries
        .iter()
        .map(|e| e.data.clone())
        .collect();
    assert_eq!(three, vec![b"n1".to_vec(), b"n2".to_vec()]);
    // A checkpoint exactly at the end (everything flushed) is no error: nothing to replay.
    let at_end = replay_topic(&recreated, &kv, &[3]).await.unwrap();
    assert!(at_end.errors.is_empty());
}
