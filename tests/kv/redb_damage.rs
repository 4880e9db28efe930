//! A damaged, truncated, empty or missing redb file: every outcome is a working store or a one-line error naming the
//! path — never a panic, never a silent re-initialisation, never a file made by a read-only opener.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use remote_wal::config::{MetadataBackend, MetadataStoreConfig, MetasrvConfig};
use remote_wal::kv::Error;
use remote_wal::kv::redb::RedbOpenMode;
use remote_wal::kv::{KvBackend, PutRequest, RangeRequest, RedbKvBackend, Txn, TxnOp};
use remote_wal::metasrv::Metasrv;

/// A small store: a few dozen keys, written one transaction each (so the file holds several committed roots).
fn small_store(dir: &Path) -> Vec<u8> {
    let path = dir.join("original.redb");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let kv = RedbKvBackend::open(&path).unwrap();
        for i in 0..40 {
            kv.put(PutRequest {
                key: format!("__table_name/greptime/public/t{i}").into_bytes(),
                value: format!("{{\"table_id\":{}}}", 1024 + i).into_bytes(),
                prev_kv: false,
            })
            .await
            .unwrap();
        }
    });
    std::fs::read(&path).unwrap()
}

/// What one damaged file did.
#[derive(Debug, Default)]
struct Tally {
    opened: usize,
    open_errors: usize,
    op_errors: usize,
}

/// Opens `path` and runs a read, a range, a write and a txn on it. Panics (failing the test) when anything panicked
/// or an error does not name the path on one line, or tells of a panic instead of a damaged file.
fn exercise(path: &Path, what: &str, tally: &mut Tally) {
    let shown = path.display().to_string();
    let check = |err: &Error, call: &str| {
        let text = err.to_string();
        assert!(
            text.contains(&shown) && !text.contains('\n'),
            "{what}: {call}: the error must name the path on one line: {text}"
        );
        assert!(
            !text.contains("panicked") && !matches!(err, Error::RedbTask { .. }),
            "{what}: {call}: a panic inside redb reached the caller: {text}"
        );
    };
    let opened = catch_unwind(AssertUnwindSafe(|| RedbKvBackend::open(path)))
        .unwrap_or_else(|_| panic!("{what}: opening panicked"));
    let kv = match opened {
        Ok(kv) => kv,
        Err(err) => {
            check(&err, "open");
            tally.open_errors += 1;
            return;
        }
    };
    tally.opened += 1;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let results = catch_unwind(AssertUnwindSafe(|| {
        rt.block_on(async {
            vec![
                (
                    "get",
                    kv.get(b"__table_name/greptime/public/t7").await.err(),
                ),
                (
                    "range",
                    kv.range(RangeRequest::prefix("__table_name/")).await.err(),
                ),
                (
                    "put",
                    kv.put(PutRequest {
                        key: b"after_damage".to_vec(),
                        value: b"v".to_vec(),
                        prev_kv: true,
                    })
                    .await
                    .err(),
                ),
                (
                    "txn",
                    kv.txn(Txn {
                        compare: Vec::new(),
                        success: vec![TxnOp::Put(b"txn_key".to_vec(), b"v".to_vec())],
                        failure: Vec::new(),
                    })
                    .await
                    .err(),
                ),
            ]
        })
    }))
    .unwrap_or_else(|_| panic!("{what}: a kv call panicked"));
    for (call, err) in results {
        if let Some(err) = err {
            check(&err, call);
            tally.op_errors += 1;
        }
    }
    catch_unwind(AssertUnwindSafe(move || drop(kv)))
        .unwrap_or_else(|_| panic!("{what}: closing panicked"));
}

fn write_copy(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn flipped_bytes_give_a_working_store_or_an_error_naming_the_path_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let original = small_store(dir.path());
    // Every 37th byte of the first 8 KiB (headers and the first pages) and about 100 positions across the rest.
    let head = original.len().min(8192);
    let step = (original.len() / 100).max(1);
    let positions: Vec<usize> = (0..head)
        .step_by(37)
        .chain((head..original.len()).step_by(step))
        .collect();
    let mut tally = Tally::default();
    for pos in &positions {
        let mut bytes = original.clone();
        bytes[*pos] ^= 0xff;
        let path = write_copy(dir.path(), &format!("flip-{pos}.redb"), &bytes);
        exercise(&path, &format!("byte {pos} flipped"), &mut tally);
        std::fs::remove_file(&path).unwrap();
    }
    assert!(
        tally.open_errors + tally.op_errors > 0,
        "no flip was noticed: {tally:?}"
    );
    assert!(tally.opened > 0, "no flip left a usable store: {tally:?}");
}

/// Damage that appears under an open handle (the integrity check on open cannot see it): redb panics on some of
/// these bytes (`entered unreachable code` in its btree); the panic must come back as an error naming the path, and
/// the handle must refuse every later call.
#[test]
fn bytes_damaged_under_an_open_handle_give_errors_naming_the_path_never_a_panic() {
    use std::io::{Read, Seek, SeekFrom, Write};
    let dir = tempfile::tempdir().unwrap();
    let original = small_store(dir.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut damaged = 0;
    let mut errors = 0;
    // The pages after the 4 KiB header, every 193rd non-zero byte.
    for pos in (4096..original.len()).step_by(193) {
        if original[pos] == 0 {
            continue;
        }
        let path = write_copy(dir.path(), &format!("live-{pos}.redb"), &original);
        let shown = path.display().to_string();
        let kv = RedbKvBackend::open(&path).unwrap();
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let mut byte = [0u8];
        file.seek(SeekFrom::Start(pos as u64)).unwrap();
        file.read_exact(&mut byte).unwrap();
        file.seek(SeekFrom::Start(pos as u64)).unwrap();
        file.write_all(&[byte[0] ^ 0xff]).unwrap();
        file.sync_all().unwrap();
        let outcomes = catch_unwind(AssertUnwindSafe(|| {
            rt.block_on(async {
                vec![
                    kv.get(b"__table_name/greptime/public/t7").await.err(),
                    kv.range(RangeRequest::prefix("__table_name/")).await.err(),
                    kv.put(PutRequest {
                        key: b"after_damage".to_vec(),
                        value: b"v".to_vec(),
                        prev_kv: false,
                    })
                    .await
                    .err(),
                    kv.get(b"k").await.err(),
                ]
            })
        }))
        .unwrap_or_else(|_| panic!("byte {pos} damaged under the handle: a kv call panicked"));
        let mut seen_damaged = false;
        for err in outcomes.into_iter().flatten() {
            errors += 1;
            let text = err.to_string();
            assert!(
                text.contains(&shown) && !text.contains('\n') && !text.contains("panicked"),
                "byte {pos}: {text}"
            );
            assert!(!matches!(err, Error::RedbTask { .. }), "byte {pos}: {text}");
            if seen_damaged {
                assert!(
                    matches!(err, Error::RedbDamaged { .. }) && text.contains("refused"),
                    "byte {pos}: a call after redb panicked must be refused: {text}"
                );
            }
            if matches!(err, Error::RedbDamaged { .. }) {
                seen_damaged = true;
                damaged += 1;
            }
        }
        catch_unwind(AssertUnwindSafe(move || drop(kv)))
            .unwrap_or_else(|_| panic!("byte {pos}: closing panicked"));
    }
    assert!(errors > 0, "no damage was noticed");
    assert!(
        damaged > 0,
        "no damaged byte made redb panic, so the guard was not exercised ({errors} errors)"
    );
}

#[test]
fn truncated_files_give_an_error_naming_the_path_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let original = small_store(dir.path());
    let mut tally = Tally::default();
    let len = original.len();
    let lengths = [1, 8, 64, 512, 4096, len / 4, len / 2, len - 4096, len - 1];
    for keep in lengths {
        let path = write_copy(dir.path(), &format!("cut-{keep}.redb"), &original[..keep]);
        exercise(&path, &format!("truncated to {keep} bytes"), &mut tally);
        let after = std::fs::read(&path).unwrap();
        assert!(
            after.len() <= keep || tally.opened > 0,
            "a truncated file that did not open was rewritten ({keep} → {} bytes)",
            after.len()
        );
    }
}

#[test]
fn an_empty_file_is_refused_naming_the_path_and_left_empty() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_copy(dir.path(), "metadata.redb", b"");
    for mode in [RedbOpenMode::CreateIfMissing, RedbOpenMode::MustExist] {
        let err = RedbKvBackend::open_with(&path, mode).expect_err("an empty file is not a store");
        assert!(matches!(err, Error::RedbEmptyFile { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains(&path.display().to_string()) && text.contains("0 bytes"),
            "{text}"
        );
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            0,
            "not re-initialised"
        );
    }
}

#[test]
fn a_missing_file_is_created_only_by_a_create_if_missing_opener() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metadata.redb");
    let err = RedbKvBackend::open_with(&path, RedbOpenMode::MustExist).expect_err("missing");
    assert!(matches!(err, Error::RedbMissing { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    assert!(!path.exists(), "a must-exist open created the file");

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let kv = RedbKvBackend::open_with(&path, RedbOpenMode::CreateIfMissing).unwrap();
        kv.put(PutRequest {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            prev_kv: false,
        })
        .await
        .unwrap();
        drop(kv);
        let kv = RedbKvBackend::open_with(&path, RedbOpenMode::MustExist).unwrap();
        assert_eq!(kv.get(b"k").await.unwrap().unwrap().value, b"v");
    });
    // Creation goes through a temporary file that is gone afterwards.
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["metadata.redb"]);
}

fn redb_config(path: &Path) -> MetasrvConfig {
    MetasrvConfig {
        metadata_store: MetadataStoreConfig {
            backend: MetadataBackend::Redb,
            path: path.to_path_buf(),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[tokio::test]
async fn a_read_only_metasrv_neither_creates_nor_reinitialises_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data").join("metadata.redb");
    let err = Metasrv::open(redb_config(&path), RedbOpenMode::MustExist)
        .await
        .expect_err("nothing stored yet");
    assert!(
        matches!(
            err,
            remote_wal::Error::Kv {
                source: Error::RedbMissing { .. }
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    assert!(
        !dir.path().join("data").exists(),
        "no directory made either"
    );

    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, b"").unwrap();
    for mode in [RedbOpenMode::MustExist, RedbOpenMode::CreateIfMissing] {
        let err = Metasrv::open(redb_config(&path), mode)
            .await
            .expect_err("an empty file is refused");
        assert!(
            matches!(
                err,
                remote_wal::Error::Kv {
                    source: Error::RedbEmptyFile { .. }
                }
            ),
            "{mode:?}: {err:?}"
        );
    }
    let err = Metasrv::new(redb_config(&path))
        .await
        .expect_err("new refuses it too");
    assert!(
        matches!(
            err,
            remote_wal::Error::Kv {
                source: Error::RedbEmptyFile { .. }
            }
        ),
        "{err:?}"
    );
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
}
