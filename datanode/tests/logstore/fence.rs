//! Fence records and the replay rule: once a region's fence record of epoch `E` is read, the region's later
//! records of a lower epoch (a deposed leader's late appends, acknowledged by Kafka after the hand-over) are
//! ignored; what the deposed leader wrote before the fence replays. On an in-memory partition with records
//! placed at chosen offsets, and once on the real broker with two stores racing.

use std::collections::BTreeMap;
use std::sync::Arc;

use datanode::log_store::memory_partition::MemoryPartition;
use datanode::log_store::record::{EntrySeq, RecordDecoder, encode_entry, encode_fence};
use datanode::log_store::{KafkaLogStore, KafkaLogStoreConfig, LogStore};

use crate::common::{broker_store, broker_topic, data, write};

fn seq(epoch: u64, writer: u64, counter: u64) -> EntrySeq {
    EntrySeq {
        epoch,
        writer,
        counter,
    }
}

/// Feeds `records` at offsets 0, 1, 2, … and returns region `region`'s entries as (entry id, data) and the stats.
fn decode(
    records: &[(Vec<u8>, Vec<u8>)],
    region: u64,
    fence_below: Option<u64>,
) -> (
    Vec<(u64, Vec<u8>)>,
    datanode::log_store::record::DecodeStats,
) {
    let mut decoder = RecordDecoder::new("fenced", BTreeMap::from([(region, 0), (region + 1, 0)]));
    if let Some(epoch) = fence_below {
        decoder = decoder.fence_below(region, epoch);
    }
    for (offset, (key, value)) in records.iter().enumerate() {
        decoder
            .push(offset as i64, Some(key), Some(value))
            .unwrap_or_else(|e| panic!("offset {offset}: {e}"));
    }
    let (mut out, stats) = decoder.finish();
    let entries = out
        .remove(&region)
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.entry_id, e.data))
        .collect();
    (entries, stats)
}

fn entry(region: u64, s: EntrySeq, bytes: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let r = encode_entry(region, s, bytes, 1 << 20).remove(0);
    (r.key, r.value)
}

fn fence(region: u64, epoch: u64, writer: u64) -> (Vec<u8>, Vec<u8>) {
    let r = encode_fence(region, epoch, writer);
    (r.key, r.value)
}

#[test]
fn after_a_fence_the_deposed_epoch_is_ignored_and_what_it_wrote_before_replays() {
    let records = vec![
        entry(7, seq(1, 10, 1), b"old-1"),
        entry(7, seq(1, 10, 2), b"old-2"),
        fence(7, 2, 20),
        entry(7, seq(1, 10, 3), b"zombie-late"),
        entry(7, seq(2, 20, 1), b"new-1"),
        // Another region's records of epoch 1 are not its fence's business.
        entry(8, seq(1, 10, 1), b"other"),
        entry(7, seq(1, 10, 4), b"zombie-later"),
        entry(7, seq(2, 20, 2), b"new-2"),
    ];
    let (entries, stats) = decode(&records, 7, None);
    assert_eq!(
        entries,
        vec![
            (1, b"old-1".to_vec()),
            (2, b"old-2".to_vec()),
            (5, b"new-1".to_vec()),
            (8, b"new-2".to_vec()),
        ]
    );
    assert_eq!((stats.fences, stats.fenced), (1, 2), "{stats:?}");

    // Region 8 (no fence) keeps its epoch-1 record.
    let (other, _) = decode(&records, 8, None);
    assert_eq!(other, vec![(6, b"other".to_vec())]);
}

#[test]
fn an_entry_of_the_deposed_epoch_cut_by_the_fence_is_torn_not_completed() {
    let mut records: Vec<(Vec<u8>, Vec<u8>)> = encode_entry(7, seq(1, 10, 1), &[5u8; 300], 100)
        .into_iter()
        .map(|r| (r.key, r.value))
        .collect();
    assert_eq!(records.len(), 3);
    // The fence lands between the entry's first and second fragments; the rest arrive after it.
    let fence_record = fence(7, 2, 20);
    records.insert(1, fence_record);
    records.push(entry(7, seq(2, 20, 1), b"new"));
    let (entries, stats) = decode(&records, 7, None);
    assert_eq!(entries, vec![(5, b"new".to_vec())]);
    assert_eq!((stats.torn_entries, stats.fenced), (1, 2), "{stats:?}");
}

#[test]
fn a_lower_fence_read_later_does_not_lower_the_rule_and_a_reader_past_the_fence_is_told_the_epoch()
{
    let records = vec![
        fence(7, 3, 30),
        // A stale fence (say, a migration to epoch 2 that lost its race) after the epoch-3 one.
        fence(7, 2, 20),
        entry(7, seq(2, 20, 1), b"epoch-2-late"),
        entry(7, seq(3, 30, 1), b"epoch-3"),
    ];
    let (entries, stats) = decode(&records, 7, None);
    assert_eq!(entries, vec![(4, b"epoch-3".to_vec())]);
    assert_eq!((stats.fences, stats.fenced), (2, 1));

    // A reader whose checkpoint lies after the fence does not read it: told the epoch, it applies the same rule.
    let after_the_fence = vec![
        entry(7, seq(1, 10, 9), b"zombie"),
        entry(7, seq(2, 20, 1), b"new"),
    ];
    let (entries, stats) = decode(&after_the_fence, 7, Some(2));
    assert_eq!(entries, vec![(2, b"new".to_vec())]);
    assert_eq!(stats.fenced, 1);
    // Not told, it would replay the zombie's record: the rule needs one or the other.
    let (unfenced, _) = decode(&after_the_fence, 7, None);
    assert_eq!(unfenced.len(), 2);
}

#[test]
fn a_damaged_fence_record_is_refused_naming_the_offset_and_what_is_wrong() {
    let (key, mut value) = fence(7, 2, 20);
    value[1] = 0x03;
    let mut decoder = RecordDecoder::new("fenced", BTreeMap::from([(7, 0)]));
    let err = decoder
        .push(4, Some(&key), Some(&value))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("offset 4") && err.contains("region 7"),
        "{err}"
    );
    assert!(err.contains("unknown flags 0x03"), "{err}");

    let (key, mut value) = fence(7, 2, 20);
    value.push(1);
    let mut decoder = RecordDecoder::new("fenced", BTreeMap::from([(7, 0)]));
    let err = decoder
        .push(5, Some(&key), Some(&value))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("a fence record") && err.contains("1 bytes"),
        "{err}"
    );
}

#[tokio::test]
async fn the_store_appends_a_fence_and_its_replay_ignores_the_deposed_writers_later_appends() {
    let partition = Arc::new(MemoryPartition::new("fence_store"));
    let config = KafkaLogStoreConfig::for_max_batch_bytes(1 << 20);
    let old = KafkaLogStore::with_writer(partition.clone(), config, 11);
    old.register_region(1, 1);
    let new = KafkaLogStore::with_writer(partition.clone(), config, 12);
    new.register_region(1, 2);
    old.append(vec![write(1, b"a"), write(1, b"b")])
        .await
        .unwrap();
    let fence_id = new.append_fence(1, 2).await.unwrap();
    assert_eq!(fence_id, 3, "the fence is the third record: entry id 3");
    // The deposed leader's append still succeeds on Kafka: only replay can ignore it.
    old.append(vec![write(1, b"late")]).await.unwrap();
    new.append(vec![write(1, b"c")]).await.unwrap();
    assert_eq!(
        data(&new.read(1, 0).await.unwrap()),
        vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]
    );
    // A region this store does not let append cannot be fenced by it either.
    let err = new.append_fence(2, 2).await.unwrap_err().to_string();
    assert!(err.contains("region 2"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_broker_a_zombie_racing_the_fence_loses_only_what_it_appended_after_it() {
    let (client, config, topic) = broker_topic("fence_race").await;
    let old = broker_store(&client, &config, &topic, KafkaLogStoreConfig::default()).await;
    old.register_region(5, 1);
    let new = broker_store(&client, &config, &topic, KafkaLogStoreConfig::default()).await;
    new.register_region(5, 2);
    // The deposed leader writes on while the new one fences: every append it saw acknowledged below the fence's
    // offset replays, every one above it does not. It writes at least 20 before the fence and 20 after it, and
    // any number while the fence is being produced.
    let fenced = Arc::new(tokio::sync::Notify::new());
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let writer = {
        let fenced = fenced.clone();
        tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut started = Some(started_tx);
            let mut i = 0u32;
            let mut notified = std::pin::pin!(fenced.notified());
            let mut after = None;
            while after.is_none_or(|n| n > 0) {
                let ids = old.append(vec![write(5, &i.to_be_bytes())]).await.unwrap();
                acked.push((ids[0].entry_id, i.to_be_bytes().to_vec()));
                i += 1;
                if i == 20
                    && let Some(tx) = started.take()
                {
                    let _ = tx.send(());
                }
                match after {
                    Some(n) => after = Some(n - 1),
                    None => {
                        if futures::FutureExt::now_or_never(notified.as_mut()).is_some() {
                            after = Some(20);
                        }
                    }
                }
            }
            acked
        })
    };
    started_rx.await.unwrap();
    let fence_id = new.append_fence(5, 2).await.unwrap();
    fenced.notify_one();
    new.append(vec![write(5, b"new")]).await.unwrap();
    let acked = writer.await.unwrap();
    let (entries, counts) = new
        .read_regions_counted(&BTreeMap::from([(5, 0)]))
        .await
        .unwrap();
    let mut expected: Vec<Vec<u8>> = acked
        .iter()
        .filter(|(id, _)| *id < fence_id)
        .map(|(_, d)| d.clone())
        .collect();
    let after = acked.len() - expected.len();
    assert!(after >= 20, "the zombie appended after the fence: {after}");
    // The new leader's entry lies after the fence; where it falls among the zombie's does not matter here.
    expected.push(b"new".to_vec());
    assert_eq!(data(&entries[&5]), expected);
    assert_eq!(counts.fences, 1);
    assert_eq!(
        counts.fenced as usize, after,
        "each later append of the zombie was ignored"
    );
}
