//! Entries larger than one record are split into fragments and reassembled; a fragment sequence that stops
//! before its last fragment (the writer crashed mid-entry) is skipped, and what follows it still reads.

use datanode::log_store::LogStore;
use datanode::log_store::kafka::PartitionLog;
use datanode::log_store::record::{EntrySeq, encode_entry};

/// The sequence of a torn entry: a writer of its own, as a datanode that crashed mid-entry was.
fn torn_seq() -> EntrySeq {
    EntrySeq {
        epoch: 0,
        writer: u64::MAX / 2,
        counter: 1,
    }
}

use crate::common::{bytes, data, memory_store, write};

#[tokio::test]
async fn a_large_entry_is_split_into_fragments_and_read_back_whole() {
    let store = memory_store(1024);
    let big = bytes(1, 10_000);
    let ids = store
        .append(vec![
            write(1, b"before"),
            write(1, &big),
            write(2, b"other"),
            write(1, b"after"),
        ])
        .await
        .unwrap();
    let records = store.partition().records();
    // 10,000 bytes in fragments of at most 1024 - 256 - 30 bytes: 14 records, plus the three small entries.
    assert_eq!(records.len(), 14 + 3, "one record per fragment");
    assert!(
        store.partition().calls().produces > 1,
        "a batch over max_batch_bytes is produced in several requests"
    );
    let read = store.read(1, 0).await.unwrap();
    assert_eq!(
        data(&read),
        vec![b"before".to_vec(), big, b"after".to_vec()]
    );
    // The entry id of the big entry is its first fragment's offset + 1.
    assert_eq!(read[1].entry_id, ids[1].entry_id);
    assert_eq!(ids[1].entry_id, 2);
    assert_eq!(
        ids[2].entry_id, 16,
        "region 2's entry follows the 14 fragments"
    );
    // Reading from the big entry's id starts there; from one past it skips it.
    assert_eq!(store.read(1, ids[1].entry_id).await.unwrap().len(), 2);
    assert_eq!(
        data(&store.read(1, ids[1].entry_id + 1).await.unwrap()),
        vec![b"after".to_vec()]
    );
}

#[tokio::test]
async fn a_torn_entry_is_skipped_and_the_next_entry_reads() {
    let store = memory_store(1024);
    store.append(vec![write(1, b"one")]).await.unwrap();
    // A crash after 2 of 4 fragments of region 1's next entry, interleaved with region 2's records.
    let torn = encode_entry(1, torn_seq(), &bytes(9, 400), 100);
    assert_eq!(torn.len(), 4);
    let partition = store.partition();
    partition.push_raw(vec![(
        Some(torn[0].key.clone()),
        Some(torn[0].value.clone()),
    )]);
    store.append(vec![write(2, b"two")]).await.unwrap();
    partition.push_raw(vec![(
        Some(torn[1].key.clone()),
        Some(torn[1].value.clone()),
    )]);
    // The datanode restarts and region 1 writes on.
    store.append(vec![write(1, b"three")]).await.unwrap();
    assert_eq!(
        data(&store.read(1, 0).await.unwrap()),
        vec![b"one".to_vec(), b"three".to_vec()]
    );
    assert_eq!(
        data(&store.read(2, 0).await.unwrap()),
        vec![b"two".to_vec()]
    );
    let (_, counts) = store
        .read_regions_counted(&[(1, 0)].into_iter().collect())
        .await
        .unwrap();
    assert_eq!(counts.torn_entries, 1);
}

#[tokio::test]
async fn a_torn_tail_is_skipped() {
    let store = memory_store(1024);
    store
        .append(vec![write(1, b"one"), write(1, b"two")])
        .await
        .unwrap();
    let torn = encode_entry(1, torn_seq(), &bytes(3, 300), 100);
    store.partition().push_raw(
        torn[..2]
            .iter()
            .map(|r| (Some(r.key.clone()), Some(r.value.clone())))
            .collect(),
    );
    let end = store.partition().high_watermark().await.unwrap();
    assert_eq!(end, 4);
    assert_eq!(
        data(&store.read(1, 0).await.unwrap()),
        vec![b"one".to_vec(), b"two".to_vec()]
    );
}
