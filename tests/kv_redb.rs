//! redb-specific behaviour: the file lock and durability across reopen.

use remote_wal::Error;
use remote_wal::kv::{KvBackend, PutRequest, RedbKvBackend};

#[tokio::test]
async fn a_file_held_by_another_handle_is_refused_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.redb");
    let first = RedbKvBackend::open(&path).unwrap();
    let err = RedbKvBackend::open(&path).expect_err("the file is held by the first handle");
    assert!(matches!(err, Error::RedbLocked { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "the error names the path: {err}"
    );
    drop(first);
    RedbKvBackend::open(&path).expect("free again once the first handle is dropped");
}

#[tokio::test]
async fn writes_survive_reopening_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.redb");
    {
        let kv = RedbKvBackend::open(&path).unwrap();
        kv.put(PutRequest {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            prev_kv: false,
        })
        .await
        .unwrap();
    }
    let kv = RedbKvBackend::open(&path).unwrap();
    assert_eq!(
        kv.get(b"k").await.unwrap().map(|kv| kv.value),
        Some(b"v".to_vec())
    );
}

#[tokio::test]
async fn a_missing_directory_is_an_open_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-such-dir").join("meta.redb");
    let err = RedbKvBackend::open(&path).expect_err("the directory does not exist");
    assert!(matches!(err, Error::RedbOpen { .. }), "{err:?}");
    assert!(err.to_string().contains("no-such-dir"), "{err}");
}
