//! Entry id 0 means "nothing written" and never collides with Kafka offset 0: the record at offset 0 is entry
//! id 1.

use datanode::log_store::LogStore;

use crate::common::{data, memory_store, write};

#[tokio::test]
async fn the_first_record_of_a_topic_is_entry_id_one_and_zero_means_nothing_written() {
    let store = memory_store(1024);
    assert_eq!(
        store.last_entry_id(1).await.unwrap(),
        0,
        "an empty topic: nothing written"
    );
    assert!(store.read(1, 0).await.unwrap().is_empty());

    let ids = store.append(vec![write(1, b"first")]).await.unwrap();
    assert_eq!(store.partition().records()[0].offset, 0);
    assert_eq!(ids[0].entry_id, 1, "offset 0 is entry id 1");
    assert_eq!(store.last_entry_id(1).await.unwrap(), 1);

    // A checkpoint of 0 (nothing flushed) replays the entry at offset 0; reading from 1 too; from 2 nothing.
    assert_eq!(
        data(&store.read(1, 0).await.unwrap()),
        vec![b"first".to_vec()]
    );
    assert_eq!(
        data(&store.read(1, 1).await.unwrap()),
        vec![b"first".to_vec()]
    );
    assert!(store.read(1, 2).await.unwrap().is_empty());
}
