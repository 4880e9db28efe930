//! What tells a resent record from a new one is (region epoch, writer, counter), never a clock: a restarted writer,
//! however far its predecessor ran ahead, and two writers of one region (a zombie beside the lease holder) never
//! have an entry taken for a copy; a producer's resent copy still is; format version 1 records still decode.

use std::collections::BTreeMap;
use std::sync::Arc;

use datanode::log_store::kafka::PartitionLog;
use datanode::log_store::memory_partition::MemoryPartition;
use datanode::log_store::record::encode_v1_fragment;
use datanode::log_store::{EntryToWrite, KafkaLogStore, KafkaLogStoreConfig, LogStore};

use crate::common::{broker_store, broker_topic, data, memory_store, write};

/// One-byte entries of `region`, `n` of them.
fn ones(region: u64, n: usize) -> Vec<EntryToWrite> {
    (0..n)
        .map(|i| EntryToWrite {
            region_id: region,
            data: vec![(i % 251) as u8],
        })
        .collect()
}

#[tokio::test]
async fn a_restarted_writer_replays_whole_on_a_memory_partition() {
    let partition = Arc::new(MemoryPartition::new("restart"));
    let config = KafkaLogStoreConfig::for_max_batch_bytes(1 << 20);
    let first = KafkaLogStore::new(partition.clone(), config);
    first.append(ones(1, 5_000)).await.unwrap();
    // The restart: a new store on the same partition, a new writer id, counters from 1 again.
    let second = KafkaLogStore::new(partition.clone(), config);
    assert_ne!(first.writer(), second.writer());
    second.append(ones(1, 100)).await.unwrap();
    let replayed = second.read(1, 0).await.unwrap();
    assert_eq!(replayed.len(), 5_100, "every acknowledged entry replays");
}

#[tokio::test]
async fn a_resent_batch_is_still_a_copy() {
    let store = memory_store(1 << 20);
    store
        .append(vec![write(1, b"a"), write(1, b"b")])
        .await
        .unwrap();
    // The producer resends the batch it already wrote (a retry after a lost answer): same records again.
    let partition = store.partition();
    let sent: Vec<_> = partition
        .records()
        .iter()
        .map(|r| (r.key.clone(), r.value.clone()))
        .collect();
    partition.push_raw(sent);
    store.append(vec![write(1, b"c")]).await.unwrap();
    assert_eq!(
        data(&store.read(1, 0).await.unwrap()),
        vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]
    );
}

#[tokio::test]
async fn two_writers_of_one_region_both_replay() {
    let partition = Arc::new(MemoryPartition::new("two_writers"));
    let config = KafkaLogStoreConfig::for_max_batch_bytes(1 << 20);
    let holder = KafkaLogStore::with_writer(partition.clone(), config, 11);
    let zombie = KafkaLogStore::with_writer(partition.clone(), config, 12);
    let mut expected = Vec::new();
    for round in 0..50u8 {
        holder.append(vec![write(1, &[round, 0])]).await.unwrap();
        expected.push(vec![round, 0]);
        zombie.append(vec![write(1, &[round, 1])]).await.unwrap();
        expected.push(vec![round, 1]);
    }
    assert_eq!(data(&holder.read(1, 0).await.unwrap()), expected);
}

#[tokio::test]
async fn format_version_1_records_still_decode() {
    let store = memory_store(1 << 20);
    let partition = store.partition();
    // As a store before region epochs wrote them: wall-clock sequences, 30-byte headers; one resent copy.
    let old: Vec<_> = [
        (1_700_000_000_000_001u64, b"v1-a"),
        (1_700_000_000_000_002, b"v1-b"),
    ]
    .iter()
    .map(|(seq, d)| encode_v1_fragment(1, *seq, 0, 1, &d[..]))
    .collect();
    let mut raw: Vec<_> = old
        .iter()
        .map(|r| (Some(r.key.clone()), Some(r.value.clone())))
        .collect();
    raw.push(raw[1].clone());
    partition.push_raw(raw);
    store.append(vec![write(1, b"v2")]).await.unwrap();
    assert_eq!(
        data(&store.read(1, 0).await.unwrap()),
        vec![b"v1-a".to_vec(), b"v1-b".to_vec(), b"v2".to_vec()]
    );
}

/// The case that lost entries when sequences came from the wall clock: 3,000,000 one-byte entries (written far
/// faster than one per microsecond), a restart, 1,000 more: all 3,001,000 replay, on the real broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_million_entries_a_restart_and_a_thousand_more_all_replay() {
    let (client, config, topic) = broker_topic("restart_3m").await;
    let first = broker_store(&client, &config, &topic, KafkaLogStoreConfig::default()).await;
    const FIRST: usize = 3_000_000;
    const BATCH: usize = 100_000;
    for _ in 0..FIRST / BATCH {
        first.append(ones(7, BATCH)).await.unwrap();
    }
    drop(first);
    let second = broker_store(&client, &config, &topic, KafkaLogStoreConfig::default()).await;
    second.append(ones(7, 1_000)).await.unwrap();
    let (entries, counts) = second
        .read_regions_counted(&BTreeMap::from([(7, 0)]))
        .await
        .unwrap();
    assert_eq!(counts.duplicates, 0, "no record was taken for a copy");
    assert_eq!(entries[&7].len(), FIRST + 1_000);
    let end = second.partition().high_watermark().await.unwrap();
    assert_eq!(end as usize, FIRST + 1_000, "one record per entry");
}
