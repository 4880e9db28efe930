//! `walctl procedures cancel|pause|resume`: requests written into the store by the walctl process, without a
//! manager of its own, and honoured by the manager that runs the procedure next.
//!
//! The procedure is a create-table stopped in CreateRegions by a "killed" run played in this test process: a
//! `Metasrv` on a redb file whose datanodes create the first region and then block, so one region exists when the
//! run is stopped. (redb admits one process at a time, so walctl runs between two runs of the manager here; on etcd a
//! running manager picks the request up at its next poll, interrupting the step in progress, or at the procedure's
//! next step boundary.)

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::Env;
use async_trait::async_trait;
use remote_wal::config::MetasrvConfig;
use remote_wal::ddl::{DatanodeManager, MemoryDatanodeManager, RegionCreateRequest, TableName};
use remote_wal::kv::{KvBackendRef, RangeRequest, RedbKvBackend, range_all};
use remote_wal::metasrv::Metasrv;

/// Datanodes over one shared in-memory fleet that create `free` regions, then block every further creation.
#[derive(Debug)]
struct Blocking {
    fleet: Arc<MemoryDatanodeManager>,
    free: AtomicUsize,
}

#[async_trait]
impl DatanodeManager for Blocking {
    async fn create_region(
        &self,
        datanode_id: u64,
        request: RegionCreateRequest,
    ) -> remote_wal::ddl::error::Result<()> {
        if self
            .free
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_err()
        {
            std::future::pending::<()>().await;
        }
        self.fleet.create_region(datanode_id, request).await
    }

    fn can_drop_regions(&self) -> bool {
        true
    }

    async fn drop_region(
        &self,
        datanode_id: u64,
        region_id: u64,
    ) -> remote_wal::ddl::error::Result<()> {
        self.fleet.drop_region(datanode_id, region_id).await
    }
}

fn metasrv(
    redb: &std::path::Path,
    fleet: &Arc<MemoryDatanodeManager>,
    free: usize,
) -> Arc<Metasrv> {
    let kv: KvBackendRef = Arc::new(RedbKvBackend::open(redb).unwrap());
    let datanodes = Arc::new(Blocking {
        fleet: fleet.clone(),
        free: AtomicUsize::new(free),
    });
    Arc::new(Metasrv::with_parts(MetasrvConfig::embedded(), kv, None, datanodes).unwrap())
}

/// Runs a create-table of `doomed` (2 regions) until its first region exists and the second blocks, then stops the
/// manager and drops everything; returns the procedure's id.
async fn create_table_stopped_in_create_regions(
    redb: &std::path::Path,
    fleet: &Arc<MemoryDatanodeManager>,
) -> String {
    let metasrv = metasrv(redb, fleet, 1);
    metasrv.start().await.unwrap();
    let creating = {
        let metasrv = metasrv.clone();
        tokio::spawn(async move {
            metasrv
                .create_table(TableName::new("greptime", "public", "doomed"), 2, false)
                .await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let id = loop {
        let list = metasrv.list_procedures().await.unwrap();
        let created = fleet.regions().values().map(|r| r.len()).sum::<usize>();
        if let Some(p) = list.iter().find(|p| p.type_name.contains("CreateTable"))
            && created == 1
        {
            break p.id.to_string();
        }
        assert!(Instant::now() < deadline, "no region was created: {list:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    metasrv.stop().await.unwrap();
    creating.abort();
    let _ = creating.await;
    drop(metasrv);
    id
}

/// Every key of the redb file, as text.
async fn keys(metasrv_redb: &std::path::Path) -> Vec<String> {
    let kv = RedbKvBackend::open(metasrv_redb).unwrap();
    range_all(&kv, RangeRequest::prefix(Vec::new()), 0)
        .await
        .unwrap()
        .into_iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .collect()
}

#[test]
fn a_cancel_written_by_walctl_rolls_the_stopped_create_table_back_in_the_next_manager() {
    let env = Env::new();
    std::fs::create_dir_all(env.dir.path().join("walctl-data")).unwrap();
    let redb = env.dir.path().join("walctl-data/metadata.redb");
    let fleet = Arc::new(MemoryDatanodeManager::new());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let id = runtime.block_on(create_table_stopped_in_create_regions(&redb, &fleet));
    let before = runtime.block_on(keys(&redb));
    assert!(
        before.contains(&format!("__procedure__/proc/{id}")),
        "{before:?}"
    );

    // Pause, resume and cancel from the walctl process: each writes one request and starts no manager.
    let paused = env.ok(None, &["procedures", "pause", &id]);
    assert!(
        paused.contains(&format!("pause of procedure {id} requested")),
        "{paused}"
    );
    let resumed = env.json(None, &["procedures", "resume", &id]);
    assert_eq!(resumed[0]["requested"], "resume", "{resumed:?}");
    let cancelled = env.json(None, &["procedures", "cancel", &id]);
    assert_eq!(cancelled[0]["requested"], "cancel", "{cancelled:?}");
    assert_eq!(cancelled[0]["id"], id.as_str(), "{cancelled:?}");
    let after = runtime.block_on(keys(&redb));
    let control = format!("__procedure__/control/proc/{id}");
    let mut expected = before.clone();
    expected.push(control.clone());
    expected.sort();
    assert_eq!(
        after, expected,
        "walctl wrote the request and nothing else (no epoch claimed)"
    );
    // The record is unchanged: nothing ran it.
    let shown = env.json(None, &["procedures", "show", &id]);
    assert_eq!(shown[0]["state"], "running", "{shown:?}");

    // The next manager honours the cancel on recovery: it rolls back (drops the region, releases the
    // reservation) and ends cancelled.
    let state = runtime.block_on(async {
        let metasrv = metasrv(&redb, &fleet, usize::MAX);
        metasrv.start().await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let info = loop {
            let info = metasrv.procedure(&id).await.unwrap();
            if info.state.is_finished() {
                break info;
            }
            assert!(Instant::now() < deadline, "never finished: {info:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        metasrv.stop().await.unwrap();
        info
    });
    assert_eq!(
        state.state,
        procedures::ProcedureState::Cancelled,
        "{state:?}"
    );
    assert_eq!(state.error.as_deref(), Some("cancelled (rolled back)"));
    assert!(fleet.regions().is_empty(), "{:?}", fleet.regions());
    let left = runtime.block_on(keys(&redb));
    assert!(
        left.iter().all(|k| !k.starts_with("__table")
            && !k.starts_with("__dn_table")
            && !k.starts_with("__procedure__/control/")
            || k == "__table_id_seq"),
        "{left:?}"
    );
    let again = env.err(None, &["procedures", "cancel", &id]);
    assert!(again.contains("already finished (cancelled)"), "{again}");
}

#[test]
fn pause_all_and_resume_all_write_and_remove_one_key() {
    let env = Env::new();
    env.ok(None, &["bootstrap"]);
    let redb = env.dir.path().join("walctl-data/metadata.redb");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let all = "__procedure__/control/all".to_string();
    let paused = env.ok(None, &["procedures", "pause", "--all"]);
    assert!(
        paused.contains("pause of every procedure requested"),
        "{paused}"
    );
    assert!(runtime.block_on(keys(&redb)).contains(&all));
    let resumed = env.json(None, &["procedures", "resume", "--all"]);
    assert_eq!(resumed[0]["id"], serde_json::Value::Null, "{resumed:?}");
    assert!(!runtime.block_on(keys(&redb)).contains(&all));
    let usage = env.err(None, &["procedures", "pause"]);
    assert!(usage.contains("--all") || usage.contains("<ID>"), "{usage}");
}
