//! The raft-engine log store in a temporary directory: append, read, last entry id, and recovery on reopen.

use std::collections::BTreeMap;

use datanode::log_store::{LogStore, RaftEngineLogStore};

use crate::common::{bytes, data, write};

#[tokio::test]
async fn append_read_and_last_entry_id_per_region_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wal/1");
    let store = RaftEngineLogStore::open(&path).await.unwrap();
    assert_eq!(store.last_entry_id(7).await.unwrap(), 0, "nothing written");

    let ids = store
        .append(vec![
            write(7, b"a"),
            write(8, b"x"),
            write(7, &bytes(1, 100_000)),
        ])
        .await
        .unwrap();
    let got: Vec<(u64, u64)> = ids.iter().map(|e| (e.region_id, e.entry_id)).collect();
    assert_eq!(
        got,
        vec![(7, 1), (8, 1), (7, 2)],
        "each region counts its own ids from 1"
    );
    store.append(vec![write(7, b"c")]).await.unwrap();
    assert_eq!(store.last_entry_id(7).await.unwrap(), 3);
    assert_eq!(store.last_entry_id(8).await.unwrap(), 1);

    assert_eq!(
        data(&store.read(7, 0).await.unwrap()),
        vec![b"a".to_vec(), bytes(1, 100_000), b"c".to_vec()]
    );
    let from_two = store.read(7, 2).await.unwrap();
    assert_eq!(
        from_two.iter().map(|e| e.entry_id).collect::<Vec<_>>(),
        vec![2, 3]
    );
    assert!(
        store.read(9, 0).await.unwrap().is_empty(),
        "an unknown region has no entries"
    );

    drop(store);
    let reopened = RaftEngineLogStore::open(&path).await.unwrap();
    assert_eq!(
        reopened.last_entry_id(7).await.unwrap(),
        3,
        "recovered from the directory"
    );
    let ids = reopened.append(vec![write(7, b"d")]).await.unwrap();
    assert_eq!(ids[0].entry_id, 4, "ids go on after a reopen");
    let all = reopened
        .read_regions(&BTreeMap::from([(7, 3), (8, 0)]))
        .await
        .unwrap();
    assert_eq!(data(&all[&7]), vec![b"c".to_vec(), b"d".to_vec()]);
    assert_eq!(data(&all[&8]), vec![b"x".to_vec()]);
}

#[tokio::test]
async fn a_directory_that_cannot_be_created_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let err = RaftEngineLogStore::open(&file.join("wal"))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("not-a-dir/wal"), "{text}");
    assert!(
        text.starts_with("cannot open raft-engine WAL directory"),
        "{text}"
    );
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn a_flush_deletes_up_to_the_checkpoint_and_ids_go_on_above_it_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wal/1");
    let store = RaftEngineLogStore::open(&path).await.unwrap();
    store
        .append((0..4).map(|i| write(7, &bytes(i, 10))).collect())
        .await
        .unwrap();
    store.append(vec![write(8, b"other")]).await.unwrap();

    assert_eq!(store.flush(7, 2).await.unwrap(), 2);
    assert_eq!(
        store
            .read(7, 0)
            .await
            .unwrap()
            .iter()
            .map(|e| e.entry_id)
            .collect::<Vec<_>>(),
        vec![3, 4],
        "entries up to the checkpoint are gone, the others stay"
    );
    assert_eq!(store.flush(7, 1).await.unwrap(), 2, "only forward");
    let err = store.flush(7, 5).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("cannot flush region 7 up to entry id 5: its WAL (raft-engine '")
            && err.to_string().ends_with("') ends at entry id 4"),
        "{err}"
    );

    // Everything flushed, then reopened: the next id is above the checkpoint, never a reused one.
    assert_eq!(store.flush(7, 4).await.unwrap(), 4);
    assert!(store.read(7, 0).await.unwrap().is_empty());
    drop(store);
    let reopened = RaftEngineLogStore::open(&path).await.unwrap();
    assert_eq!(reopened.flushed_entry_id(7).await.unwrap(), 4);
    assert_eq!(reopened.last_entry_id(7).await.unwrap(), 4);
    let ids = reopened.append(vec![write(7, b"e")]).await.unwrap();
    assert_eq!(ids[0].entry_id, 5);
    assert_eq!(
        data(&reopened.read(8, 0).await.unwrap()),
        vec![b"other".to_vec()],
        "another region's entries are untouched"
    );
}
