//! Replay of the regions sharing a topic: one read pass from the lowest checkpoint, records routed by region id,
//! every entry after a region's checkpoint exactly once, in order.

use std::collections::BTreeMap;
use std::sync::Arc;

use datanode::checkpoint::{CheckpointStore, start_kafka_region};
use datanode::log_store::{EntryToWrite, KafkaLogStoreConfig, LogStore};
use datanode::replay::replay_topic;
use remote_wal::key::topic_name::{TopicNameValue, topic_name_key};
use remote_wal::kv::memory::MemoryKvBackend;
use remote_wal::kv::{KvBackendRef, PutRequest};

use crate::common::{broker_store, broker_topic, bytes, memory_store};

/// Per region: (entry id, data) of every entry appended, in order.
type Written = BTreeMap<u64, Vec<(u64, Vec<u8>)>>;

async fn write_rounds(store: &dyn LogStore, regions: &[u64], rounds: u64, size: usize) -> Written {
    let mut written: Written = BTreeMap::new();
    for round in 0..rounds {
        let batch: Vec<EntryToWrite> = regions
            .iter()
            .map(|r| EntryToWrite {
                region_id: *r,
                data: bytes(round * 1000 + r, size),
            })
            .collect();
        let ids = store.append(batch.clone()).await.unwrap();
        for (entry, id) in batch.into_iter().zip(ids) {
            written
                .entry(entry.region_id)
                .or_default()
                .push((id.entry_id, entry.data));
        }
    }
    written
}

#[tokio::test]
async fn sixteen_regions_on_one_topic_are_replayed_in_one_read_pass() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let checkpoints = CheckpointStore::new(kv.clone());
    let store = memory_store(64 * 1024);
    let regions: Vec<u64> = (0..16).map(|i| (1024u64 << 32) | i).collect();
    let written = write_rounds(&store, &regions, 20, 100).await;
    // Every other region flushed part of its entries.
    for (i, region) in regions.iter().enumerate() {
        if i % 2 == 0 {
            let flushed = written[region][i % 20].0;
            checkpoints
                .record_flushed("memory_topic", *region, flushed)
                .await
                .unwrap();
        }
    }
    let records_on_topic = store.partition().records().len() as u64;
    let before = store.partition().calls();

    let replay = replay_topic(&store, &kv, &regions).await.unwrap();

    let after = store.partition().calls();
    for region in &regions {
        let got = &replay.regions[region];
        let want: Vec<(u64, Vec<u8>)> = written[region]
            .iter()
            .filter(|(id, _)| *id > got.checkpoint)
            .cloned()
            .collect();
        let have: Vec<(u64, Vec<u8>)> = got
            .entries
            .iter()
            .map(|e| (e.entry_id, e.data.clone()))
            .collect();
        assert_eq!(
            have, want,
            "region {region}: every entry after its checkpoint, once, in order"
        );
        assert_eq!(got.entries_replayed, want.len() as u64);
        assert_eq!(got.bytes_replayed, want.len() as u64 * 100);
    }
    // One pass: every record of the topic fetched at most once, whatever the number of regions.
    let fetched = after.records_fetched - before.records_fetched;
    assert!(
        fetched <= records_on_topic,
        "one pass reads each record at most once: fetched {fetched} of {records_on_topic}"
    );
    assert_eq!(after.fetches - before.fetches, replay.read.fetches);
    assert_eq!(
        replay.read.records, records_on_topic,
        "the lowest checkpoint is 0: the whole topic"
    );

    // Reading region by region would fetch the topic once per region.
    let before = store.partition().calls();
    for region in &regions {
        store.read(*region, 1).await.unwrap();
    }
    let per_region = store.partition().calls().records_fetched - before.records_fetched;
    assert_eq!(per_region, 16 * records_on_topic);
}

#[tokio::test]
async fn the_topics_pruned_entry_id_raises_a_lower_checkpoint() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let store = memory_store(1024);
    let written = write_rounds(&store, &[1, 2], 5, 10).await;
    let pruned = written[&1][2].0;
    kv.put(PutRequest {
        key: topic_name_key("memory_topic"),
        value: TopicNameValue {
            pruned_entry_id: pruned,
            topic_id: None,
        }
        .encode(),
        prev_kv: false,
    })
    .await
    .unwrap();
    CheckpointStore::new(kv.clone())
        .record_flushed("memory_topic", 2, written[&2][3].0)
        .await
        .unwrap();
    let replay = replay_topic(&store, &kv, &[1, 2]).await.unwrap();
    assert_eq!(replay.pruned_entry_id, pruned);
    assert_eq!(
        replay.regions[&1].checkpoint, pruned,
        "no checkpoint: the pruned entry id"
    );
    assert_eq!(replay.regions[&1].entries_replayed, 2);
    assert_eq!(
        replay.regions[&2].checkpoint, written[&2][3].0,
        "its own, higher"
    );
    assert_eq!(replay.regions[&2].entries_replayed, 1);
}

#[tokio::test]
async fn regions_sharing_a_topic_on_the_broker_replay_exactly_after_their_checkpoints() {
    let (client, config, topic) = broker_topic("replay").await;
    let store = broker_store(
        &client,
        &config,
        &topic,
        KafkaLogStoreConfig::for_max_batch_bytes(8 * 1024),
    )
    .await;
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let checkpoints = CheckpointStore::new(kv.clone());
    let regions = [11u64, 12, 13, 14];
    for region in regions {
        assert_eq!(
            start_kafka_region(&store, &checkpoints, region)
                .await
                .unwrap(),
            0
        );
    }
    let mut written = write_rounds(&store, &regions, 10, 3000).await;
    checkpoints
        .record_flushed(&topic, 11, written[&11][4].0)
        .await
        .unwrap();
    checkpoints
        .record_flushed(&topic, 12, written[&12][9].0)
        .await
        .unwrap();
    checkpoints
        .record_flushed(&topic, 13, store.last_entry_id(13).await.unwrap())
        .await
        .unwrap();
    // A region created now starts at the topic's end and replays only what it writes.
    let end = start_kafka_region(&store, &checkpoints, 15).await.unwrap();
    assert_eq!(end, store.last_entry_id(15).await.unwrap());
    let later = write_rounds(&store, &[15, 14], 2, 50).await;
    for (region, list) in later {
        written.entry(region).or_default().extend(list);
    }

    let replay = replay_topic(&store, &kv, &[11, 12, 13, 14, 15])
        .await
        .unwrap();
    let count = |r: u64| replay.regions[&r].entries_replayed;
    assert_eq!(
        (count(11), count(12), count(13), count(14), count(15)),
        (5, 0, 0, 12, 2)
    );
    for region in [11u64, 14, 15] {
        let got = &replay.regions[&region];
        let want: Vec<(u64, Vec<u8>)> = written[&region]
            .iter()
            .filter(|(id, _)| *id > got.checkpoint)
            .cloned()
            .collect();
        let have: Vec<(u64, Vec<u8>)> = got
            .entries
            .iter()
            .map(|e| (e.entry_id, e.data.clone()))
            .collect();
        assert_eq!(have, want, "region {region}");
    }
}

#[tokio::test]
async fn a_region_whose_entries_were_deleted_gets_its_own_error_and_the_others_replay() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let checkpoints = CheckpointStore::new(kv.clone());
    let store = memory_store(1024);
    let written = write_rounds(&store, &[1, 2], 5, 10).await;
    // Region 2 flushed its third entry; region 1 nothing. Then the topic loses its head (retention, or a
    // DeleteRecords that ignored region 1).
    checkpoints
        .record_flushed("memory_topic", 2, written[&2][2].0)
        .await
        .unwrap();
    store.partition().delete_below(4);
    let replay = replay_topic(&store, &kv, &[1, 2]).await.unwrap();
    assert_eq!(
        replay.errors[&1].to_string(),
        "WAL topic 'memory_topic', region 1: entries from entry id 1 are gone: the topic's first entry id is now 5"
    );
    assert!(!replay.regions.contains_key(&1));
    let two: Vec<u64> = replay.regions[&2]
        .entries
        .iter()
        .map(|e| e.entry_id)
        .collect();
    let want: Vec<u64> = written[&2][3..].iter().map(|(id, _)| *id).collect();
    assert_eq!(
        two, want,
        "region 2 still replays everything after its checkpoint"
    );
}
