//! The embedded default's `metadata.redb` damaged, truncated, emptied or missing, through the binary: walctl exits 1
//! with one stderr line naming the file, never panics (exit 101), and never re-initialises or creates the file on a
//! command that does not create metadata.

use std::path::Path;
use std::process::Output;

use crate::support::{Env, without_waiting_lines};

const FILE: &str = "walctl-data/metadata.redb";

fn run(env: &Env, args: &[&str]) -> Output {
    env.walctl().args(args).output().expect("run walctl")
}

/// A failure as the user sees it: exit code 1, one line on stderr that names the file, no panic text.
fn assert_fails_naming_the_file(out: &Output, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{what}: exit code 1, stderr {stderr:?}"
    );
    let lines = without_waiting_lines(&stderr);
    assert_eq!(lines.len(), 1, "{what}: one line: {stderr:?}");
    assert!(
        lines[0].contains(FILE),
        "{what}: names the file: {stderr:?}"
    );
    assert!(!stderr.contains("panicked"), "{what}: no panic: {stderr:?}");
}

/// A store holding one table, and its bytes.
fn store_with_a_table(env: &Env) -> Vec<u8> {
    env.ok(None, &["create-table", "kept", "--regions", "3"]);
    std::fs::read(env.dir.path().join(FILE)).expect("read the store")
}

fn file_bytes(env: &Env) -> Vec<u8> {
    std::fs::read(env.dir.path().join(FILE)).expect("read the store")
}

fn write_file(env: &Env, bytes: &[u8]) {
    std::fs::write(env.dir.path().join(FILE), bytes).expect("write the store");
}

#[test]
fn an_empty_file_is_an_error_for_every_command_and_stays_empty() {
    let env = Env::new();
    store_with_a_table(&env);
    write_file(&env, &[]);
    for args in [
        &["topics"][..],
        &["procedures", "list"],
        &["open-regions", "--datanode", "1"],
        // A command that creates metadata may create a missing file, never re-initialise an empty one.
        &["create-table", "fresh", "--regions", "1"],
    ] {
        let out = run(&env, args);
        assert_fails_naming_the_file(&out, &format!("{args:?} on an empty file"));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("empty file"),
            "{args:?}: says the file is empty: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(file_bytes(&env).is_empty(), "{args:?} left the file empty");
    }
}

#[test]
fn a_truncated_file_is_an_error_naming_it_and_is_left_as_it_was() {
    let env = Env::new();
    let original = store_with_a_table(&env);
    for keep in [original.len() / 2, 512, 17] {
        let truncated = &original[..keep];
        write_file(&env, truncated);
        let out = run(&env, &["open-regions", "--datanode", "1"]);
        assert_fails_naming_the_file(&out, &format!("truncated to {keep} bytes"));
        assert_eq!(
            file_bytes(&env),
            truncated,
            "truncated to {keep}: file untouched"
        );
    }
}

#[test]
fn flipped_bytes_give_the_table_or_one_line_naming_the_file_never_a_panic() {
    let env = Env::new();
    let original = store_with_a_table(&env);
    // The first 4 KiB (header, region headers) densely, the rest sparsely: ~60 runs of the binary.
    let positions: Vec<usize> = (0..original.len().min(4096))
        .step_by(97)
        .chain((4096..original.len()).step_by((original.len() / 16).max(1)))
        .collect();
    let (mut noticed, mut read) = (0, 0);
    for pos in positions {
        let mut bytes = original.clone();
        bytes[pos] ^= 0xff;
        write_file(&env, &bytes);
        let out = run(&env, &["--json", "open-regions", "--datanode", "1"]);
        if out.status.success() {
            read += 1;
        } else {
            noticed += 1;
            assert_fails_naming_the_file(&out, &format!("byte {pos} flipped"));
        }
        assert_ne!(out.status.code(), Some(101), "byte {pos}: no panic exit");
    }
    assert!(
        noticed > 0,
        "no flipped byte was noticed ({read} runs read the store)"
    );
    assert!(
        read > 0,
        "every flip failed: the test did not reach unused bytes"
    );
}

#[test]
fn a_missing_file_is_not_created_by_a_read_only_command() {
    let env = Env::new();
    for args in [
        &["topics"][..],
        &["procedures", "list"],
        &["open-regions", "--datanode", "1"],
    ] {
        let out = run(&env, args);
        assert_fails_naming_the_file(&out, &format!("{args:?} without a file"));
        assert!(
            !Path::new(&env.dir.path().join(FILE)).exists(),
            "{args:?} created the file"
        );
    }
}
