//! `walctl procedures show` and `walctl procedures locks` report what the store knows of a procedure: its step's
//! name, the lock keys it declares, its event history and its times, and say that held/awaited locks are live state
//! of a running manager. Both commands only read.
//!
//! The unfinished procedure is a create-table left by a "killed" run, played in this test process: a `Metasrv` on a
//! redb file whose datanodes never answer, so the procedure persists its allocation and hangs in CreateRegions; the
//! manager is stopped and everything dropped. Then `walctl` runs on the same file.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::Env;
use async_trait::async_trait;
use remote_wal::config::MetasrvConfig;
use remote_wal::ddl::{DatanodeManager, RegionCreateRequest, TableName};
use remote_wal::kv::{KeyValue, KvBackendRef, RangeRequest, RedbKvBackend, range_all};
use remote_wal::metasrv::Metasrv;
use serde_json::Value;

/// Datanodes that never answer a create-region request.
#[derive(Debug)]
struct Unresponsive;

#[async_trait]
impl DatanodeManager for Unresponsive {
    async fn create_region(
        &self,
        _datanode_id: u64,
        _request: RegionCreateRequest,
    ) -> remote_wal::ddl::error::Result<()> {
        std::future::pending().await
    }
}

/// Leaves a create-table of `stuck` stopped in CreateRegions in the redb file at `redb`; returns its id.
async fn create_table_left_in_create_regions(redb: &std::path::Path) -> String {
    let kv: KvBackendRef = Arc::new(RedbKvBackend::open(redb).unwrap());
    let metasrv = Arc::new(
        Metasrv::with_parts(MetasrvConfig::embedded(), kv, None, Arc::new(Unresponsive)).unwrap(),
    );
    metasrv.start().await.unwrap();
    let creating = {
        let metasrv = metasrv.clone();
        tokio::spawn(async move {
            metasrv
                .create_table(TableName::new("greptime", "public", "stuck"), 2, false)
                .await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let id = loop {
        let list = metasrv.list_procedures().await.unwrap();
        if let Some(p) = list
            .iter()
            .find(|p| p.type_name.contains("CreateTable") && p.step >= 1)
        {
            break p.id.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "create-table never got past Allocate: {list:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    metasrv.stop().await.unwrap();
    creating.abort();
    let _ = creating.await;
    drop(metasrv);
    id
}

fn stuck_create_table(env: &Env) -> String {
    std::fs::create_dir_all(env.dir.path().join("walctl-data")).unwrap();
    let redb = env.dir.path().join("walctl-data/metadata.redb");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let id = runtime.block_on(create_table_left_in_create_regions(&redb));
    drop(runtime);
    id
}

/// Every key and value of the redb file at `path`, read in a runtime that closes the file afterwards.
fn redb_contents(path: &std::path::Path) -> Vec<KeyValue> {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let kv = RedbKvBackend::open(path).expect("open the redb file");
        range_all(&kv, RangeRequest::prefix(Vec::new()), 0)
            .await
            .expect("read every key")
    })
}

fn event_names(shown: &Value) -> Vec<String> {
    shown["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["event"].as_str().expect("event tag").to_string())
        .collect()
}

#[test]
fn show_reports_the_step_name_lock_keys_times_and_history_of_a_stuck_procedure() {
    let env = Env::new();
    let id = stuck_create_table(&env);

    let shown = env.json(None, &["procedures", "show", &id]);
    assert_eq!(shown.len(), 1, "{shown:?}");
    let p = &shown[0];
    assert_eq!(p["state"], "running", "{p}");
    assert_eq!(p["step_name"], "CreateRegions", "{p}");
    let keys: Vec<(String, bool)> = p["lock_keys"]
        .as_array()
        .expect("lock_keys")
        .iter()
        .map(|k| {
            (
                k["key"].as_str().unwrap().to_string(),
                k["exclusive"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        keys,
        [
            ("__catalog_lock/greptime".to_string(), false),
            ("__schema_lock/greptime/public".to_string(), false),
            ("__table_name_lock/greptime/public/stuck".to_string(), true),
        ]
    );
    // Live fields: nothing runs it here, and the store does not hold them.
    assert_eq!(p["attempt"], 0, "{p}");
    assert!(
        p["next_retry_at_ms"].is_null() && p["lock_wait"].is_null(),
        "{p}"
    );
    assert_eq!(p["locks_held"], Value::Array(Vec::new()), "{p}");
    assert!(p["step_ms"].is_null(), "{p}");
    assert!(p["total_ms"].as_u64().is_some(), "{p}");
    // The history up to the last write: submitted, then the steps that ran and finished.
    let events = event_names(p);
    assert_eq!(
        events.first().map(String::as_str),
        Some("submitted"),
        "{events:?}"
    );
    assert!(events.contains(&"step_started".to_string()), "{events:?}");
    assert!(events.contains(&"step_finished".to_string()), "{events:?}");
    let steps: Vec<&str> = p["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"] == "step_finished")
        .map(|e| e["step"].as_str().unwrap())
        .collect();
    assert!(steps.contains(&"Allocate"), "{steps:?}");
    for e in p["events"].as_array().unwrap() {
        assert!(e["at_ms"].as_u64().is_some(), "{e}");
    }

    let text = env.ok(None, &["procedures", "show", &id]);
    for field in [
        "step name",
        "CreateRegions",
        "attempt",
        "last error",
        "next retry",
        "in step",
        "total",
        "lock keys",
        "__table_name_lock/greptime/public/stuck (exclusive)",
        "locks held",
        "waiting for",
        "EVENT",
        "submitted",
        "step Allocate finished",
    ] {
        assert!(text.contains(field), "'{field}' missing from:\n{text}");
    }
}

#[test]
fn locks_lists_the_keys_unfinished_procedures_declare_and_says_where_from() {
    let env = Env::new();
    let id = stuck_create_table(&env);
    let redb = env.dir.path().join("walctl-data/metadata.redb");
    let before = redb_contents(&redb);

    let lines = env.json(None, &["procedures", "locks"]);
    assert_eq!(lines.len(), 3, "{lines:?}");
    for line in &lines {
        assert_eq!(line["id"], id.as_str(), "{line}");
        assert_eq!(line["status"], "declared", "{line}");
    }
    let table = lines
        .iter()
        .find(|l| l["key"] == "__table_name_lock/greptime/public/stuck")
        .expect("the table name key");
    assert_eq!(table["exclusive"], true);

    let text = env.ok(None, &["procedures", "locks"]);
    let first = text.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("# lock keys declared") && first.contains("running procedure manager"),
        "{text}"
    );
    assert!(
        text.contains("KEY") && text.contains("MODE") && text.contains(&id),
        "{text}"
    );
    assert!(
        text.contains("shared") && text.contains("exclusive"),
        "{text}"
    );
    // Read-only: no epoch claimed, the stuck procedure not resumed, nothing written.
    assert_eq!(
        redb_contents(&redb),
        before,
        "`procedures locks` wrote to the store"
    );
}

#[test]
fn show_of_a_finished_create_table_ends_its_history_with_done() {
    let env = Env::new();
    env.json(None, &["create-table", "fine", "--regions", "2"]);
    let list = env.json(None, &["procedures", "list"]);
    let id = list[0]["id"].as_str().unwrap().to_string();
    let shown = env.json(None, &["procedures", "show", &id]);
    let events = event_names(&shown[0]);
    assert_eq!(
        events.last().map(String::as_str),
        Some("done"),
        "{events:?}"
    );
    assert_eq!(shown[0]["step_name"], "PersistDatanodeTableValue");
    let text = env.ok(None, &["procedures", "locks"]);
    assert!(
        text.contains("no unfinished procedure declares a lock key"),
        "{text}"
    );
}
