//! A create-table left unfinished by a killed process is finished by the next `walctl` started on the store.
//!
//! The killed run is played in this test process through the library: a `Metasrv` on a redb file whose datanodes
//! never answer, so the create-table procedure persists its allocation (table id, placement, WAL options) and then
//! hangs in CreateRegions; the manager is stopped and everything dropped, as a kill would leave it. Then `walctl`
//! runs on the same file.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::Env;
use async_trait::async_trait;
use remote_wal::config::MetasrvConfig;
use remote_wal::ddl::{DatanodeManager, RegionCreateRequest, TableMetadataManager, TableName};
use remote_wal::kv::{KvBackendRef, RedbKvBackend};
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

/// Runs a create-table that hangs in CreateRegions, then "kills" it; returns the procedure's id.
async fn killed_create_table(redb: &std::path::Path) -> String {
    let kv: KvBackendRef = Arc::new(RedbKvBackend::open(redb).unwrap());
    let metasrv = Arc::new(
        Metasrv::with_parts(MetasrvConfig::embedded(), kv, None, Arc::new(Unresponsive)).unwrap(),
    );
    metasrv.start().await.unwrap();
    let creating = {
        let metasrv = metasrv.clone();
        tokio::spawn(async move {
            metasrv
                .create_table(TableName::new("greptime", "public", "halfway"), 4, false)
                .await
        })
    };
    // Wait until the allocation is persisted (step 1: the procedure is stuck creating regions).
    let deadline = Instant::now() + Duration::from_secs(30);
    let id = loop {
        let list = metasrv.list_procedures().await.unwrap();
        if let Some(p) = list
            .iter()
            .find(|p| p.type_name.contains("CreateTable") && p.step >= 1)
        {
            assert!(!p.state.is_finished(), "{p:?}");
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
    // The aborted procedure task releases its handle on the file asynchronously.
    let deadline = Instant::now() + Duration::from_secs(30);
    let kv: KvBackendRef = loop {
        match RedbKvBackend::open(redb) {
            Ok(kv) => break Arc::new(kv),
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "the redb file is still held: {e}"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    // No table metadata yet: its transaction is the procedure's last step.
    let name = TableName::new("greptime", "public", "halfway");
    assert_eq!(
        TableMetadataManager::new(kv).table_id(&name).await.unwrap(),
        None
    );
    id
}

#[test]
fn the_next_walctl_finishes_a_create_table_left_by_a_killed_run() {
    let env = Env::new();
    std::fs::create_dir_all(env.dir.path().join("walctl-data")).unwrap();
    let redb = env.dir.path().join("walctl-data/metadata.redb");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let id = runtime.block_on(killed_create_table(&redb));
    drop(runtime);

    // The killed run left the procedure unfinished and no table metadata (both checked above). Read-only commands
    // resume nothing: the record stays unfinished and there are no regions to open yet.
    let shown = env.json(None, &["procedures", "show", &id]);
    assert_ne!(shown[0]["state"], "done", "{shown:?}");
    let opened = env.json(None, &["open-regions", "--datanode", "1"]);
    assert!(opened.is_empty(), "{opened:?}");
    // A command that changes something starts the manager, which lets the resumed procedure finish first: the
    // table's 4 regions are there, next to the new table's one.
    let other = env.json(None, &["create-table", "other", "--regions", "1"]);
    let other_id = other[0]["table_id"].as_u64().expect("table id");
    let opened: Vec<Value> = env
        .json(None, &["open-regions", "--datanode", "1"])
        .into_iter()
        .filter(|r| r["region_id"].as_u64().map(|id| id >> 32) != Some(other_id))
        .collect();
    assert_eq!(opened.len(), 4, "{opened:?}");

    let shown = env.json(None, &["procedures", "show", &id]);
    assert_eq!(shown[0]["state"], "done", "{shown:?}");
    let table_id = shown[0]["output"]["table_id"]
        .as_u64()
        .expect("table id output");
    for r in &opened {
        assert_eq!(r["region_id"].as_u64().unwrap() >> 32, table_id, "{r}");
    }

    // Exactly one table: creating it again says it exists; with --if-not-exists it is the same table.
    let err = env.err(None, &["create-table", "halfway", "--regions", "4"]);
    assert!(err.contains("already exists"), "{err}");
    let again = env.json(
        None,
        &[
            "create-table",
            "halfway",
            "--regions",
            "4",
            "--if-not-exists",
        ],
    );
    assert_eq!(again[0]["table_id"].as_u64(), Some(table_id));
}
