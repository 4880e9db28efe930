//! The Kafka log store on the real broker (`KAFKA_ENDPOINTS`; these tests fail when it is unset): append, read,
//! last entry id, offset 0, and a fragmented entry.

use std::collections::BTreeMap;

use remote_wal::datanode::log_store::{KafkaLogStoreConfig, LogStore};

use crate::common::{broker_store, broker_topic, bytes, data, write};

#[tokio::test]
async fn append_read_and_last_entry_id_on_the_broker() {
    let (client, config, topic) = broker_topic("basic").await;
    let store = broker_store(&client, &config, &topic, KafkaLogStoreConfig::default()).await;
    assert_eq!(
        store.last_entry_id(1).await.unwrap(),
        0,
        "a new topic: nothing written"
    );

    let ids = store
        .append(vec![write(1, b"a"), write(2, b"b"), write(1, b"c")])
        .await
        .unwrap();
    let got: Vec<u64> = ids.iter().map(|e| e.entry_id).collect();
    assert_eq!(got, vec![1, 2, 3], "offsets 0, 1, 2 are entry ids 1, 2, 3");
    assert_eq!(store.last_entry_id(1).await.unwrap(), 3);

    assert_eq!(
        data(&store.read(1, 0).await.unwrap()),
        vec![b"a".to_vec(), b"c".to_vec()]
    );
    assert_eq!(data(&store.read(1, 2).await.unwrap()), vec![b"c".to_vec()]);
    assert_eq!(data(&store.read(2, 0).await.unwrap()), vec![b"b".to_vec()]);
    assert!(store.read(1, 4).await.unwrap().is_empty());

    let both = store
        .read_regions(&BTreeMap::from([(1, 2), (2, 0), (3, 0)]))
        .await
        .unwrap();
    assert_eq!(data(&both[&1]), vec![b"c".to_vec()]);
    assert_eq!(data(&both[&2]), vec![b"b".to_vec()]);
    assert!(
        both[&3].is_empty(),
        "a region without entries is answered, empty"
    );
}

#[tokio::test]
async fn a_large_entry_is_fragmented_on_the_broker_and_read_back_whole() {
    let (client, config, topic) = broker_topic("fragments").await;
    // Requests of at most 16 KiB: a 100 KB entry takes several records and several produce requests.
    let store = broker_store(
        &client,
        &config,
        &topic,
        KafkaLogStoreConfig::for_max_batch_bytes(16 * 1024),
    )
    .await;
    let big = bytes(3, 100_000);
    let ids = store
        .append(vec![write(5, b"small"), write(5, &big), write(6, b"other")])
        .await
        .unwrap();
    assert_eq!(ids[1].entry_id, 2);
    assert!(
        ids[2].entry_id > 3,
        "region 6's entry comes after the big entry's fragments"
    );
    let read = store.read(5, 0).await.unwrap();
    assert_eq!(data(&read), vec![b"small".to_vec(), big]);
    assert_eq!(read[1].entry_id, 2);
    // A fetch size smaller than one request still reads everything (several fetches).
    let mut small_fetch = KafkaLogStoreConfig::for_max_batch_bytes(16 * 1024);
    small_fetch.fetch_bytes = 4096;
    let again = broker_store(&client, &config, &topic, small_fetch).await;
    let (entries, counts) = again
        .read_regions_counted(&BTreeMap::from([(5, 0), (6, 0)]))
        .await
        .unwrap();
    assert_eq!(entries[&5].len(), 2);
    assert_eq!(data(&entries[&6]), vec![b"other".to_vec()]);
    assert!(counts.fetches > 1, "{counts:?}");
}
