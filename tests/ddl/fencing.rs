//! Issue 16, F3: no stale execution of a create-table another manager has advanced. Two procedure managers on one
//! kv (the procedure store in it, as a metasrv runs): the first is held inside its Allocate step while a second
//! claims the epoch, recovers the procedure and runs it (to the end, or until it is killed at any point, a third
//! manager then finishing it). When the first is let go, its stale Allocate must write nothing: no
//! `__table_allocation/…` reservation outlives the procedure, the table exists once, no region is created by the
//! stale manager, and that manager halts.

use std::sync::Arc;
use std::time::Duration;

use crate::support::kv_keys;
use async_trait::async_trait;
use procedures::testing::{CrashPlan, CrashPoint, CrashingStore};
use procedures::{
    LocalManager, ManagerConfig, ProcedureId, ProcedureManager, ProcedureState, ProcedureWithId,
    RetryPolicy, StateStore,
};
use remote_wal::ddl::{
    CREATE_TABLE_TYPE_NAME, CreateTableProcedure, CreateTableTask, DdlContext,
    MemoryDatanodeManager, RaftEngineWalSource, RoundRobinPeerSelector, TableMetadataAllocator,
    TableMetadataManager, TableName, WalOptionsSource, WalOptionsSourceRef,
};
use remote_wal::kv::{KvBackendRef, KvStateStore, MemoryKvBackend};
use remote_wal::wal::WalOptions;
use tokio::sync::Semaphore;

const EPOCH_KEY: &str = "__procedure__/epoch";
const WAIT: Duration = Duration::from_secs(30);

/// A WAL source that holds every caller in `load_if_needed` until the test lets it go.
#[derive(Debug)]
struct Gate {
    entered: Semaphore,
    release: Semaphore,
}

#[async_trait]
impl WalOptionsSource for Gate {
    async fn load_if_needed(&self) -> remote_wal::Result<()> {
        self.entered.add_permits(1);
        if let Ok(permit) = self.release.acquire().await {
            permit.forget();
        }
        Ok(())
    }

    fn alloc_batch(&self, n: usize) -> remote_wal::Result<Vec<WalOptions>> {
        Ok(vec![WalOptions::RaftEngine; n])
    }
}

fn config() -> ManagerConfig {
    // Quick retries: a killed manager's store refuses everything, and nothing here depends on their timing.
    let quick = RetryPolicy {
        max_retries: 2,
        initial_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
        factor: 2.0,
    };
    ManagerConfig {
        step_retry: quick.clone(),
        store_retry: quick,
        ..Default::default()
    }
}

fn context(
    kv: &KvBackendRef,
    wal: WalOptionsSourceRef,
    dns: Arc<MemoryDatanodeManager>,
) -> DdlContext {
    DdlContext {
        metadata: Arc::new(TableMetadataManager::new(kv.clone())),
        allocator: Arc::new(
            TableMetadataAllocator::new(
                kv.clone(),
                Arc::new(RoundRobinPeerSelector::new(vec![1, 2])),
                wal,
            )
            .with_epoch_fence(EPOCH_KEY),
        ),
        datanodes: dns,
    }
}

fn manager(
    store: Arc<dyn StateStore>,
    crash: Option<&Arc<CrashingStore>>,
    ctx: &DdlContext,
) -> LocalManager {
    let m = match crash {
        Some(crashing) => LocalManager::with_side_effect_hook(store, config(), crashing.clone()),
        None => LocalManager::new(store, config()),
    };
    m.register_loader(
        CREATE_TABLE_TYPE_NAME,
        CreateTableProcedure::loader(ctx.clone()),
    )
    .unwrap();
    m
}

/// The stale manager `A`, submitted the create-table and held inside its Allocate step.
struct Stale {
    manager: LocalManager,
    gate: Arc<Gate>,
    datanodes: Arc<MemoryDatanodeManager>,
    watcher: procedures::Watcher,
}

async fn stale_manager_in_allocate(kv: &KvBackendRef, id: &ProcedureId) -> Stale {
    let gate = Arc::new(Gate {
        entered: Semaphore::new(0),
        release: Semaphore::new(0),
    });
    let datanodes = Arc::new(MemoryDatanodeManager::new());
    let ctx = context(kv, gate.clone(), datanodes.clone());
    let manager = manager(Arc::new(KvStateStore::new(kv.clone())), None, &ctx);
    manager.start().await.unwrap();
    let task = CreateTableTask::new(TableName::new("greptime", "public", "fenced"), 3);
    let watcher = manager
        .submit(ProcedureWithId::new(
            id.clone(),
            Box::new(CreateTableProcedure::new(task, ctx)),
        ))
        .await
        .unwrap();
    tokio::time::timeout(WAIT, gate.entered.acquire())
        .await
        .expect("the first manager reaches Allocate")
        .unwrap()
        .forget();
    Stale {
        manager,
        gate,
        datanodes,
        watcher,
    }
}

/// Lets the stale manager go and waits until it has stopped: fenced, it must not finish the procedure.
async fn release(stale: &mut Stale) {
    stale.gate.release.add_permits(1);
    let outcome = tokio::time::timeout(WAIT, stale.watcher.wait())
        .await
        .expect("the stale manager stops");
    if let Ok(output) = outcome {
        panic!("the stale manager finished the procedure: {output:?}");
    }
    // It halted because it was fenced: it refuses new work naming the newer epoch.
    let task = CreateTableTask::new(TableName::new("greptime", "public", "other"), 1);
    let scratch: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let ctx = context(
        &scratch,
        Arc::new(RaftEngineWalSource),
        Arc::new(MemoryDatanodeManager::new()),
    );
    let err = stale
        .manager
        .submit(ProcedureWithId::with_random_id(Box::new(
            CreateTableProcedure::new(task, ctx),
        )))
        .await
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(err.contains("fenced by epoch"), "{err}");
}

/// The end every interleaving must reach: done once, one table, no reservation, no region by the stale manager.
async fn check_end(kv: &KvBackendRef, id: &ProcedureId, stale: &Stale, label: &str) {
    let c_dns = Arc::new(MemoryDatanodeManager::new());
    let ctx = context(kv, Arc::new(RaftEngineWalSource), c_dns);
    let c = manager(Arc::new(KvStateStore::new(kv.clone())), None, &ctx);
    c.start().await.unwrap();
    if let Some(mut w) = c.watch(id) {
        let _ = tokio::time::timeout(WAIT, w.wait())
            .await
            .expect("recovery ends");
    }
    let info = c.procedure_state(id).await.unwrap().expect("the record");
    assert_eq!(info.state, ProcedureState::Done, "{label}: {info:?}");
    assert_eq!(
        kv_keys(kv.as_ref(), "__table_allocation/").await,
        Vec::<String>::new(),
        "{label}: a reservation outlived its procedure"
    );
    assert_eq!(
        kv_keys(kv.as_ref(), "__table_name/").await.len(),
        1,
        "{label}"
    );
    assert_eq!(
        kv_keys(kv.as_ref(), "__table_info/").await.len(),
        1,
        "{label}"
    );
    assert_eq!(
        stale.datanodes.calls(),
        0,
        "{label}: the stale manager created regions"
    );
    c.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_allocate_after_another_manager_finished_the_table_writes_nothing() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let id = ProcedureId::new("create-t");
    let mut stale = stale_manager_in_allocate(&kv, &id).await;

    // A second manager claims the epoch, recovers the procedure and finishes it.
    let ctx = context(
        &kv,
        Arc::new(RaftEngineWalSource),
        Arc::new(MemoryDatanodeManager::new()),
    );
    let b = manager(Arc::new(KvStateStore::new(kv.clone())), None, &ctx);
    b.start().await.unwrap();
    let mut w = b.watch(&id).expect("recovered");
    let output = tokio::time::timeout(WAIT, w.wait()).await.unwrap().unwrap();
    assert!(output.is_some());

    release(&mut stale).await;
    assert_eq!(
        kv_keys(kv.as_ref(), "__table_allocation/").await,
        Vec::<String>::new()
    );
    b.stop().await.unwrap();
    check_end(&kv, &id, &stale, "finished by the second manager").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_allocate_leaves_no_reservation_whatever_point_the_newer_manager_is_killed_at() {
    let mut plans = vec![CrashPlan::none()];
    for k in 0..8 {
        plans.push(CrashPlan::at(CrashPoint::BeforeWrite(k)));
        plans.push(CrashPlan::at(CrashPoint::AfterWrite(k)));
    }
    for m in 0..4 {
        plans.push(CrashPlan::at(CrashPoint::SideEffect(m)));
    }
    for plan in plans {
        let label = format!("{plan:?}");
        let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
        let id = ProcedureId::new("create-t");
        let mut stale = stale_manager_in_allocate(&kv, &id).await;

        // The second manager claims the epoch and runs the procedure until it is killed at `plan`.
        let crashing = Arc::new(CrashingStore::with_plan(
            Arc::new(KvStateStore::new(kv.clone())),
            plan,
        ));
        let ctx = context(
            &kv,
            Arc::new(RaftEngineWalSource),
            Arc::new(MemoryDatanodeManager::new()),
        );
        let b = manager(crashing.clone(), Some(&crashing), &ctx);
        if b.start().await.is_ok()
            && let Some(mut w) = b.watch(&id)
        {
            let _ = tokio::time::timeout(WAIT, w.wait())
                .await
                .expect("the second manager stops");
        }
        // Dead or done: it writes no more.
        let _ = b.stop().await;

        // The stale manager goes on; then a third manager recovers whatever is left.
        let epoch_moved = kv
            .get(EPOCH_KEY.as_bytes())
            .await
            .unwrap()
            .map(|kv| kv.value)
            != Some(b"1".to_vec());
        if epoch_moved {
            release(&mut stale).await;
        } else {
            // Killed before it claimed the epoch: the first manager is not stale; stop it like a kill.
            stale.manager.stop().await.unwrap();
            stale.gate.release.add_permits(1);
        }
        check_end(&kv, &id, &stale, &label).await;
    }
}
