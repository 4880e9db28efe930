//! Entries a topic no longer holds (deleted by a prune, by retention, or the topic recreated) are an error naming
//! the topic, the region and both entry ids, never a silently shorter replay.

use std::collections::BTreeMap;

use remote_wal::datanode::log_store::LogStore;

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
