//! A record written twice (a producer retry after a lost acknowledgement) yields its entry once.

use datanode::log_store::LogStore;

use crate::common::{bytes, data, memory_store, write};

#[tokio::test]
async fn a_resent_batch_yields_each_entry_once_at_its_first_offset() {
    let store = memory_store(1024);
    let ids = store
        .append(vec![
            write(1, b"a"),
            write(2, b"b"),
            write(1, &bytes(5, 2000)),
        ])
        .await
        .unwrap();
    // The producer resends everything it wrote (the acknowledgement was lost), then the region writes on.
    let partition = store.partition();
    let resent: Vec<_> = partition
        .records()
        .into_iter()
        .map(|r| (r.key, r.value))
        .collect();
    partition.push_raw(resent);
    store.append(vec![write(1, b"c")]).await.unwrap();

    let read = store.read(1, 0).await.unwrap();
    assert_eq!(
        data(&read),
        vec![b"a".to_vec(), bytes(5, 2000), b"c".to_vec()]
    );
    assert_eq!(read[0].entry_id, ids[0].entry_id);
    assert_eq!(
        read[1].entry_id, ids[2].entry_id,
        "the first copy's entry id"
    );
    assert_eq!(data(&store.read(2, 0).await.unwrap()), vec![b"b".to_vec()]);
    let (_, counts) = store
        .read_regions_counted(&[(1, 0), (2, 0)].into_iter().collect())
        .await
        .unwrap();
    assert_eq!(
        counts.duplicates,
        1 + 1 + 3,
        "every resent record is counted as a duplicate"
    );
}

#[tokio::test]
async fn a_fragment_resent_mid_entry_is_skipped() {
    let store = memory_store(512);
    store.append(vec![write(1, &bytes(7, 1000))]).await.unwrap();
    let records = store.partition().records();
    assert!(records.len() >= 3);
    // Rebuild the log with fragment 1 written twice in a row.
    let again = datanode::log_store::memory_partition::MemoryPartition::new("t2");
    let mut raw: Vec<_> = records
        .iter()
        .map(|r| (r.key.clone(), r.value.clone()))
        .collect();
    raw.insert(2, raw[1].clone());
    again.push_raw(raw);
    let store2 = datanode::log_store::KafkaLogStore::new(
        again,
        datanode::log_store::KafkaLogStoreConfig::for_max_batch_bytes(512),
    );
    assert_eq!(
        data(&store2.read(1, 0).await.unwrap()),
        vec![bytes(7, 1000)]
    );
}
