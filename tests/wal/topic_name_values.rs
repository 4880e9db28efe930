//! Issue 16 F11: a damaged `__topic_name/kafka/{topic}` value stops the pool from loading with an error naming the
//! key, instead of the name being taken on trust and its topic handed to regions.

use std::sync::Arc;

use remote_wal::key::topic_name::{persist_topics_txn, topic_name_key};
use remote_wal::kv::{KvBackend, MemoryKvBackend, PutRequest};
use remote_wal::wal::KafkaConfig;
use remote_wal::wal::kafka::KafkaTopicManager;

use remote_wal::wal::kafka::testing::FakeTopicAdmin;

#[tokio::test]
async fn a_garbage_topic_name_value_keeps_the_pool_unready_naming_the_key() {
    let config = KafkaConfig {
        num_topics: 3,
        topic_name_prefix: "f11".to_string(),
        ..KafkaConfig::default()
    };
    let kv = Arc::new(MemoryKvBackend::new());
    let names: Vec<(String, Option<remote_wal::key::topic_name::TopicId>)> = config
        .topic_names()
        .into_iter()
        .map(|n| (n, None))
        .collect();
    assert!(kv.txn(persist_topics_txn(&names)).await.unwrap().succeeded);

    // The topics are on the (fake) brokers, so loading checks them and finds them.
    let admin = Arc::new(FakeTopicAdmin::new());
    for (name, _) in &names {
        admin.create_out_of_band(name, 1);
    }

    // Intact, the pool loads and hands out its topics.
    let pool = KafkaTopicManager::from_config(&config, kv.clone(), admin.clone()).unwrap();
    pool.load_ready().await.unwrap();
    assert!(pool.is_ready());

    kv.put(PutRequest {
        key: topic_name_key("f11_1"),
        value: b"\x00garbage".to_vec(),
        prev_kv: false,
    })
    .await
    .unwrap();
    let pool = KafkaTopicManager::from_config(&config, kv.clone(), admin.clone()).unwrap();
    let err = pool.load_ready().await.unwrap_err();
    assert!(
        matches!(err, remote_wal::wal::Error::InvalidTopicNameKey { .. }),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "invalid persisted topic name key '__topic_name/kafka/f11_1': value '\u{0}garbage' is not a topic name \
         value: expected value at line 1 column 1"
    );
    assert!(!pool.is_ready());
    assert!(pool.alloc().is_err());
}
