//! Read-only commands only read: on the embedded redb store, `procedures list/show`, `open-regions` and `topics`
//! leave every key and value (the procedure manager's epoch included) exactly as they were.

use std::path::Path;

use crate::support::Env;
use remote_wal::kv::{KeyValue, RangeRequest, RedbKvBackend, range_all};

/// Every key and value of the redb file at `path`, read in one process that closes the file afterwards.
fn redb_contents(path: &Path) -> Vec<KeyValue> {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let kv = RedbKvBackend::open(path).expect("open the redb file");
        range_all(&kv, RangeRequest::prefix(Vec::new()), 0)
            .await
            .expect("read every key")
    })
}

#[test]
fn read_only_commands_leave_the_redb_store_unchanged_epoch_included() {
    let env = Env::new();
    let created = env.json(None, &["create-table", "demo", "--regions", "2"]);
    assert_eq!(created.len(), 2, "{created:?}");
    let redb = env.dir.path().join("walctl-data/metadata.redb");
    let before = redb_contents(&redb);
    assert!(
        before
            .iter()
            .any(|kv| String::from_utf8_lossy(&kv.key).ends_with("epoch")),
        "create-table claimed an epoch, so the store holds one: {before:?}"
    );

    let list = env.json(None, &["procedures", "list"]);
    assert_eq!(list.len(), 1, "the create-table procedure: {list:?}");
    let id = list[0]["id"].as_str().expect("procedure id").to_string();
    let shown = env.json(None, &["procedures", "show", &id]);
    assert_eq!(shown[0]["state"], "done", "{shown:?}");
    let opened = env.json(None, &["open-regions", "--datanode", "1"]);
    assert_eq!(opened.len(), 2, "{opened:?}");

    assert_eq!(
        redb_contents(&redb),
        before,
        "a read-only command wrote to the store"
    );
}

/// `topics` reports the Kafka pool from the store alone: here on the redb file a create-table (raft-engine WAL)
/// left with its epoch and records, read through a config that names the Kafka WAL. The broker endpoint answers
/// nothing, so a `topics` that reached for the broker would fail instead of reporting.
#[test]
fn topics_leaves_the_redb_store_unchanged_epoch_included() {
    let env = Env::new();
    env.json(None, &["create-table", "demo", "--regions", "1"]);
    let redb = env.dir.path().join("walctl-data/metadata.redb");
    let kafka = env.write(
        "kafka.toml",
        r#"
[metadata_store]
backend = "redb"
path = "walctl-data/metadata.redb"

[wal]
provider = "kafka"
broker_endpoints = ["127.0.0.1:1"]
num_topics = 3
topic_name_prefix = "readonly_topics"
"#,
    );
    let before = redb_contents(&redb);
    assert!(
        before
            .iter()
            .any(|kv| String::from_utf8_lossy(&kv.key).ends_with("epoch")),
        "create-table claimed an epoch, so the store holds one: {before:?}"
    );

    let topics = env.json(Some(&kafka), &["topics"]);
    assert_eq!(topics.len(), 3, "the pool's three topics: {topics:?}");
    env.ok(Some(&kafka), &["topics"]);

    assert_eq!(
        redb_contents(&redb),
        before,
        "`walctl topics` wrote to the store"
    );
}
