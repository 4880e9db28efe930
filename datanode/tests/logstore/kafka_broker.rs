//! The Kafka log store on the real broker (`KAFKA_ENDPOINTS`; these tests fail when it is unset): append, read,
//! last entry id, offset 0, and a fragmented entry.

use std::collections::BTreeMap;

use datanode::log_store::kafka::RsKafkaPartition;
use datanode::log_store::{KafkaLogStore, KafkaLogStoreConfig, LogStore};
use remote_wal::wal::config::TopicConfig;
use remote_wal::wal::kafka::admin::{CreateTopicOutcome, TopicAdmin};
use remote_wal::wal::kafka::rskafka_admin::RsKafkaTopicAdmin;

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

/// A bootstrap finishes once the controller acknowledged its creations, before the broker lists the topics: a
/// writer may meet UNKNOWN_TOPIC_OR_PARTITION. The store retries it (rskafka's partition client with
/// `UnknownTopicHandling::Retry`, within the backoff deadline) and the entry lands once the broker applied the topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_on_a_topic_the_broker_has_not_applied_yet_retries_until_it_has() {
    let config = crate::common::broker_config();
    let client = datanode::log_store::kafka::connect_client(&config)
        .await
        .unwrap_or_else(|e| panic!("Kafka at {:?} is unreachable: {e}", config.broker_endpoints));
    let topic = crate::support::unique("logstore_unapplied");
    let bound = datanode::log_store::kafka::call_bound(&config);
    let writer = {
        let client = client.clone();
        let topic = topic.clone();
        tokio::spawn(async move {
            let partition = RsKafkaPartition::new(&client, &topic, bound).await?;
            let store = KafkaLogStore::new(partition, KafkaLogStoreConfig::default());
            let ids = store.append(vec![write(1, b"early")]).await?;
            let read = store.read(1, 0).await?;
            Ok::<_, remote_wal::wal::Error>((ids, read))
        })
    };
    // The writer is under way while the topic does not exist yet: it meets UNKNOWN_TOPIC_OR_PARTITION first.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(
        !writer.is_finished(),
        "the writer cannot finish before its topic exists"
    );
    let admin = RsKafkaTopicAdmin::connect(&config).await.unwrap();
    let answers = admin
        .create_topics(std::slice::from_ref(&topic), 1, 1, &TopicConfig::new())
        .await
        .unwrap();
    assert_eq!(
        answers[0].1.as_ref().unwrap(),
        &CreateTopicOutcome::Created,
        "acknowledged by the controller"
    );
    let (ids, read) = writer
        .await
        .unwrap()
        .expect("the writer retried until the broker applied the topic");
    assert_eq!(ids[0].entry_id, 1, "offset 0 of the new topic");
    assert_eq!(data(&read), vec![b"early".to_vec()]);
}
