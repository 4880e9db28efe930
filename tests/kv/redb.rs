//! redb-specific behaviour: the file lock and durability across reopen.

use remote_wal::kv::Error;
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

/// Run as a child of the test below (`KV_REDB_HOLD` set): hold the file open until stdin closes.
fn hold_file_until_stdin_closes(path: &str) {
    use std::io::{BufRead, Write};
    let held = RedbKvBackend::open(path);
    println!("{}", if held.is_ok() { "HELD" } else { "NOT HELD" });
    std::io::stdout().flush().unwrap();
    for _ in std::io::stdin().lock().lines() {}
    drop(held);
}

#[test]
fn a_file_held_by_another_process_is_refused_naming_the_path() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    if let Ok(path) = std::env::var("KV_REDB_HOLD") {
        return hold_file_until_stdin_closes(&path);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.redb");
    // This same test binary, running only this test (named with its module path in the `kv` target), in child mode.
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "redb::a_file_held_by_another_process_is_refused_naming_the_path",
            "--nocapture",
        ])
        .env("KV_REDB_HOLD", &path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map(|l| l.unwrap());
    let status_line = lines
        .by_ref()
        .find(|l| l == "HELD" || l == "NOT HELD")
        .expect("the child reports whether it holds the file");
    assert_eq!(status_line, "HELD", "the child process opened the file");

    let err = RedbKvBackend::open(&path).expect_err("another process holds the file");
    assert!(matches!(err, Error::RedbLocked { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "the error names the path: {err}"
    );

    drop(child.stdin.take());
    let rest: Vec<String> = lines.collect();
    assert!(
        child.wait().unwrap().success(),
        "the child exited cleanly: {rest:?}"
    );
    RedbKvBackend::open(&path).expect("free again once the other process exited");
}
