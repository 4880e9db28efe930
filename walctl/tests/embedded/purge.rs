//! `walctl procedures purge`: a damaged procedure record makes every command warn until it is purged; a purge
//! needs `--yes` when stdin is not a terminal and deletes exactly that record.

use remote_wal::kv::{KvBackend, PutRequest, RangeRequest, RedbKvBackend};

use crate::support::Env;

/// The kv key of procedure `id`'s record.
fn record_key(id: &str) -> String {
    format!("__procedure__/proc/{id}")
}

/// Every key of the redb file under `__procedure__/proc/`.
fn record_keys(env: &Env) -> Vec<String> {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let kv = RedbKvBackend::open(env.dir.path().join("walctl-data/metadata.redb")).unwrap();
        kv.range(RangeRequest::prefix(b"__procedure__/proc/".to_vec()))
            .await
            .unwrap()
            .kvs
            .into_iter()
            .map(|kv| String::from_utf8(kv.key).unwrap())
            .collect()
    })
}

/// Plants a record under `id` whose JSON is cut short, as a torn write or a bad edit would leave it.
fn plant_damaged_record(env: &Env, id: &str) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let kv = RedbKvBackend::open(env.dir.path().join("walctl-data/metadata.redb")).unwrap();
        kv.put(PutRequest {
            key: record_key(id).into_bytes(),
            value: format!(r#"{{"id":"{id}","type_name":"CreateTable","state":"run"#).into_bytes(),
            prev_kv: false,
        })
        .await
        .unwrap();
    });
}

fn stderr_of(env: &Env, args: &[&str]) -> (bool, String, String) {
    let out = env.walctl().args(args).output().expect("run walctl");
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn purge_removes_a_damaged_record_and_its_warning_after_confirmation() {
    let env = Env::new();
    // A healthy procedure next to the damaged one: the purge must leave it alone.
    let created = env.json(None, &["create-table", "kept", "--regions", "1"]);
    assert_eq!(created.len(), 1);
    plant_damaged_record(&env, "damaged-1");
    let before = record_keys(&env);
    assert_eq!(before.len(), 2, "{before:?}");

    // Before: listing the procedures warns about the record (open-regions, which reads no procedure, does not).
    let (ok, _, stderr) = stderr_of(&env, &["procedures", "list"]);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("damaged-1"),
        "procedures list warns: {stderr}"
    );

    // Without --yes and without a terminal on stdin: refused, nothing deleted.
    let (ok, _, stderr) = stderr_of(&env, &["procedures", "purge", "damaged-1"]);
    assert!(!ok, "{stderr}");
    assert_eq!(
        stderr.lines().last(),
        Some(
            "error: refusing to purge procedure 'damaged-1' without confirmation: stdin is not a terminal (pass --yes)"
        ),
        "{stderr}"
    );
    assert_eq!(record_keys(&env), before);

    // An unknown id is an error naming it.
    let (ok, _, stderr) = stderr_of(&env, &["procedures", "purge", "nope", "--yes"]);
    assert!(!ok, "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: no procedure with id 'nope'"),
        "{stderr}"
    );
    assert_eq!(record_keys(&env), before);

    // With --yes: exactly that record goes.
    let out = env.ok(None, &["procedures", "purge", "damaged-1", "--yes"]);
    assert_eq!(out, "procedure damaged-1 purged from the state store\n");
    let after = record_keys(&env);
    assert_eq!(after.len(), 1, "{after:?}");
    assert!(!after.contains(&record_key("damaged-1")), "{after:?}");
    assert!(
        before.contains(&after[0]),
        "the healthy record stays: {after:?}"
    );

    // After: no warning, and the table is still there.
    let (ok, stdout, stderr) = stderr_of(&env, &["--json", "procedures", "list"]);
    assert!(ok, "{stderr}");
    assert_eq!(stderr, "", "no warning after the purge");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.contains("CreateTable"), "{stdout}");
    let (ok, _, stderr) = stderr_of(&env, &["open-regions", "--datanode", "1"]);
    assert!(ok && stderr.is_empty(), "{stderr}");
}
