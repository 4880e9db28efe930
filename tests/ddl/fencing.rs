//! Issue 16, F3: no stale execution of a create-table another manager has advanced. Two procedure managers on one
//! kv (the procedure store in it, as a metasrv runs): the first is held inside its Allocate step — before it
//! allocates anything, or just after it drew its table id from `__table_id_seq` (its allocation is then stored only
//! with its next state, in one commit under the epoch condition) — while a second claims the epoch, recovers the procedure
//! and runs it (to the end, or until it is killed at any point, a third manager then finishing it). The first is
//! then let go, or killed where it stands. Whatever the interleaving, no reservation outlives the procedure, the
//! table exists once, no region is created by the stale manager, and a stale manager let go halts.

use std::sync::Arc;
use std::time::Duration;

use crate::support::kv_keys;
use async_trait::async_trait;
use procedures::testing::{CrashPlan, CrashPoint, CrashingStore};
use procedures::{
    LocalManager, ManagerConfig, ProcedureId, ProcedureManager, ProcedureState, ProcedureWithId,
    RetryPolicy, StateStore,
};
use remote_wal::ddl::allocator::TABLE_ID_SEQ_KEY;
use remote_wal::ddl::{
    CREATE_TABLE_TYPE_NAME, CreateTableProcedure, CreateTableTask, DdlContext,
    MemoryDatanodeManager, RaftEngineWalSource, RoundRobinPeerSelector, TableMetadataAllocator,
    TableMetadataManager, TableName, WalOptionsSource, WalOptionsSourceRef,
};
use remote_wal::kv::{
    CompareAndPutRequest, CompareAndPutResponse, KvBackend, KvBackendRef, KvStateStore, KvWrapper,
    MemoryKvBackend,
};
use remote_wal::wal::WalOptions;
use tokio::sync::Semaphore;

const EPOCH_KEY: &str = "__procedure__/epoch";
const WAIT: Duration = Duration::from_secs(30);

/// Holds the stale manager's Allocate step at one point until the test lets it go.
#[derive(Debug)]
struct Gate {
    entered: Semaphore,
    release: Semaphore,
}

impl Gate {
    fn new() -> Arc<Self> {
        Arc::new(Gate {
            entered: Semaphore::new(0),
            release: Semaphore::new(0),
        })
    }

    async fn pass(&self) {
        self.entered.add_permits(1);
        if let Ok(permit) = self.release.acquire().await {
            permit.forget();
        }
    }
}

/// Where the stale manager is held in Allocate.
#[derive(Clone, Copy, Debug)]
enum Pause {
    /// In `load_if_needed`, before anything is allocated.
    BeforeAllocation,
    /// Right after it advanced `__table_id_seq` (its table id drawn), before its allocation is stored with its state.
    AfterTableId,
}

/// What happens to the stale manager once the newer one has run.
#[derive(Clone, Copy, Debug)]
enum Then {
    /// It is let go and goes on with its step.
    Released,
    /// It is killed where it stands.
    Killed,
}

/// A WAL source that holds every caller in `load_if_needed` at the gate.
#[derive(Debug)]
struct GatedWal(Arc<Gate>);

#[async_trait]
impl WalOptionsSource for GatedWal {
    async fn load_if_needed(&self) -> remote_wal::ddl::error::Result<()> {
        self.0.pass().await;
        Ok(())
    }

    fn alloc_batch(&self, n: usize) -> remote_wal::ddl::error::Result<Vec<WalOptions>> {
        Ok(vec![WalOptions::RaftEngine; n])
    }
}

/// The allocator's kv, holding the caller at the gate right after it advanced the table id sequence.
#[derive(Debug)]
struct GatedKv {
    inner: KvBackendRef,
    gate: Arc<Gate>,
}

#[async_trait]
impl KvWrapper for GatedKv {
    fn inner(&self) -> &dyn KvBackend {
        self.inner.as_ref()
    }
    async fn compare_and_put(
        &self,
        req: CompareAndPutRequest,
    ) -> remote_wal::kv::Result<CompareAndPutResponse> {
        let advances_sequence = req.key == TABLE_ID_SEQ_KEY.as_bytes();
        let resp = self.inner.compare_and_put(req).await?;
        if advances_sequence && resp.success {
            self.gate.pass().await;
        }
        Ok(resp)
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
    context_with_allocator_kv(kv, kv.clone(), wal, dns)
}

/// [`context`] whose allocator reads and writes through `allocator_kv` (a gated view of `kv`).
fn context_with_allocator_kv(
    kv: &KvBackendRef,
    allocator_kv: KvBackendRef,
    wal: WalOptionsSourceRef,
    dns: Arc<MemoryDatanodeManager>,
) -> DdlContext {
    DdlContext {
        metadata: Arc::new(TableMetadataManager::new(kv.clone())),
        allocator: Arc::new(
            TableMetadataAllocator::new(
                allocator_kv,
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

async fn stale_manager_in_allocate(kv: &KvBackendRef, id: &ProcedureId, pause: Pause) -> Stale {
    let gate = Gate::new();
    let datanodes = Arc::new(MemoryDatanodeManager::new());
    let ctx = match pause {
        Pause::BeforeAllocation => context(kv, Arc::new(GatedWal(gate.clone())), datanodes.clone()),
        Pause::AfterTableId => context_with_allocator_kv(
            kv,
            Arc::new(GatedKv {
                inner: kv.clone(),
                gate: gate.clone(),
            }),
            Arc::new(RaftEngineWalSource),
            datanodes.clone(),
        ),
    };
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
    if let Some(mut w) = c.watch(id).await.unwrap() {
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
    let mut stale = stale_manager_in_allocate(&kv, &id, Pause::BeforeAllocation).await;

    // A second manager claims the epoch, recovers the procedure and finishes it.
    let ctx = context(
        &kv,
        Arc::new(RaftEngineWalSource),
        Arc::new(MemoryDatanodeManager::new()),
    );
    let b = manager(Arc::new(KvStateStore::new(kv.clone())), None, &ctx);
    b.start().await.unwrap();
    let mut w = b.watch(&id).await.unwrap().expect("recovered");
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

/// Every interleaving of the matrix: the stale manager held before allocating or after drawing its table id; the newer manager run
/// to the end or killed before or after each of its first 8 durable writes or at each of its first 4 side-effect
/// points; then the stale manager let go or killed; a third manager finishes what is left.
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
    let mut cases = 0;
    for pause in [Pause::BeforeAllocation, Pause::AfterTableId] {
        for then in [Then::Released, Then::Killed] {
            for plan in &plans {
                interleaving(pause, *plan, then).await;
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 84);
}

async fn interleaving(pause: Pause, plan: CrashPlan, then: Then) {
    let label = format!("stale held {pause:?}, newer manager {plan:?}, stale then {then:?}");
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let id = ProcedureId::new("create-t");
    let mut stale = stale_manager_in_allocate(&kv, &id, pause).await;
    if matches!(pause, Pause::AfterTableId) {
        assert_eq!(
            kv_keys(kv.as_ref(), TABLE_ID_SEQ_KEY).await,
            vec![TABLE_ID_SEQ_KEY.to_string()],
            "{label}: the stale manager is held after drawing its table id"
        );
        assert_eq!(
            kv_keys(kv.as_ref(), "__table_allocation/").await,
            Vec::<String>::new(),
            "{label}: an allocation is stored with the state only, never as a reservation of its own"
        );
    }

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
        && let Some(mut w) = b.watch(&id).await.unwrap()
    {
        let _ = tokio::time::timeout(WAIT, w.wait())
            .await
            .expect("the second manager stops");
    }
    // Dead or done: it writes no more.
    let _ = b.stop().await;

    // The stale manager goes on (or dies); then a third manager recovers whatever is left.
    let epoch_moved = kv
        .get(EPOCH_KEY.as_bytes())
        .await
        .unwrap()
        .map(|kv| kv.value)
        != Some(b"1".to_vec());
    if epoch_moved && matches!(then, Then::Released) {
        release(&mut stale).await;
    } else {
        // Killed (or, killed before the newer one claimed the epoch, not stale at all): stop it like a kill.
        stale.manager.stop().await.unwrap();
        stale.gate.release.add_permits(1);
    }
    check_end(&kv, &id, &stale, &label).await;
}

/// Datanodes in memory whose region creations wait at a gate (so a test can catch a create-table inside
/// CreateRegions); they drop regions, as a rollback needs.
#[derive(Debug)]
struct HeldDatanodes {
    inner: MemoryDatanodeManager,
    gate: Arc<Gate>,
}

#[async_trait]
impl remote_wal::ddl::DatanodeManager for HeldDatanodes {
    async fn create_region(
        &self,
        datanode_id: u64,
        request: remote_wal::ddl::RegionCreateRequest,
    ) -> remote_wal::ddl::error::Result<()> {
        self.gate.pass().await;
        self.inner.create_region(datanode_id, request).await
    }

    fn can_drop_regions(&self) -> bool {
        true
    }

    async fn drop_region(
        &self,
        datanode_id: u64,
        region_id: u64,
    ) -> remote_wal::ddl::error::Result<()> {
        self.inner.drop_region(datanode_id, region_id).await
    }
}

/// Once armed, holds every transaction until let go, and says when one arrived.
#[derive(Debug)]
struct GatedTxns {
    inner: KvBackendRef,
    armed: std::sync::atomic::AtomicBool,
    gate: Arc<Gate>,
}

#[async_trait]
impl KvWrapper for GatedTxns {
    fn inner(&self) -> &dyn KvBackend {
        self.inner.as_ref()
    }

    async fn txn(
        &self,
        txn: remote_wal::kv::Txn,
    ) -> remote_wal::kv::Result<remote_wal::kv::TxnResponse> {
        if self.armed.load(std::sync::atomic::Ordering::SeqCst) {
            self.gate.pass().await;
        }
        self.inner.txn(txn).await
    }
}

/// A create-table cancelled while it creates its regions, whose table metadata an earlier run had written alone,
/// rolls back: its rollback's delete of that metadata is held while another manager claims the store's epoch.
/// Let go, the delete is refused by the epoch condition in its transaction, the stale manager halts, and every
/// key of the table is still there (before, the delete was unconditional and took them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_managers_late_create_table_rollback_deletes_no_metadata_and_it_halts() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let regions_gate = Gate::new();
    let delete_gate = Gate::new();
    let metadata_kv = Arc::new(GatedTxns {
        inner: kv.clone(),
        armed: std::sync::atomic::AtomicBool::new(false),
        gate: delete_gate.clone(),
    });
    let ctx = DdlContext {
        metadata: Arc::new(TableMetadataManager::new(metadata_kv.clone())),
        allocator: Arc::new(
            TableMetadataAllocator::new(
                kv.clone(),
                Arc::new(RoundRobinPeerSelector::new(vec![1, 2])),
                Arc::new(RaftEngineWalSource),
            )
            .with_epoch_fence(EPOCH_KEY),
        ),
        datanodes: Arc::new(HeldDatanodes {
            inner: MemoryDatanodeManager::new(),
            gate: regions_gate.clone(),
        }),
    };
    let a = LocalManager::new(Arc::new(KvStateStore::new(kv.clone())), config());
    a.register_loader(
        CREATE_TABLE_TYPE_NAME,
        CreateTableProcedure::loader(ctx.clone()),
    )
    .unwrap();
    a.start().await.unwrap();
    let id = ProcedureId::new("late-create-rollback");
    let task = CreateTableTask::new(TableName::new("greptime", "public", "late"), 2);
    let mut watcher = a
        .submit(ProcedureWithId::new(
            id.clone(),
            Box::new(CreateTableProcedure::new(task.clone(), ctx.clone())),
        ))
        .await
        .unwrap();
    // Inside CreateRegions: the allocation is in the record.
    tokio::time::timeout(WAIT, regions_gate.entered.acquire())
        .await
        .unwrap()
        .unwrap()
        .forget();
    let record: serde_json::Value = serde_json::from_slice(
        &kv.get(format!("__procedure__/proc/{id}", id = id.as_str()).as_bytes())
            .await
            .unwrap()
            .expect("the record")
            .value,
    )
    .unwrap();
    let allocation: remote_wal::ddl::TableAllocation =
        serde_json::from_value(record["data"]["allocation"].clone()).expect("an allocation");
    // An earlier run's metadata, written alone (as with a store that cannot join a step's writes).
    let metadata = remote_wal::ddl::TableMetadata::new(&task, &allocation)
        .encode()
        .unwrap();
    kv.batch_put(
        metadata
            .iter()
            .map(|(k, v)| remote_wal::kv::KeyValue {
                key: k.clone().into_bytes(),
                value: v.clone(),
            })
            .collect(),
        false,
    )
    .await
    .unwrap();

    metadata_kv
        .armed
        .store(true, std::sync::atomic::Ordering::SeqCst);
    a.cancel(&id).await.unwrap();
    // The rollback's delete reaches the kv and is held there.
    tokio::time::timeout(WAIT, delete_gate.entered.acquire())
        .await
        .unwrap()
        .unwrap()
        .forget();
    // Manager B claims the store meanwhile.
    kv.put(remote_wal::kv::PutRequest {
        key: EPOCH_KEY.as_bytes().to_vec(),
        value: b"999".to_vec(),
        prev_kv: false,
    })
    .await
    .unwrap();
    delete_gate.release.add_permits(1);
    let err = tokio::time::timeout(WAIT, watcher.wait())
        .await
        .unwrap()
        .expect_err("the stale manager halts")
        .to_string();
    assert!(
        err.contains("fenced") || err.contains("not running"),
        "{err}"
    );
    for (key, value) in &metadata {
        assert_eq!(
            kv.get(key.as_bytes()).await.unwrap().map(|kv| kv.value),
            Some(value.clone()),
            "{key} was deleted by the deposed manager"
        );
    }
    let late = a
        .submit(ProcedureWithId::new(
            ProcedureId::new("after"),
            Box::new(CreateTableProcedure::new(
                CreateTableTask::new(TableName::new("greptime", "public", "after"), 1),
                ctx,
            )),
        ))
        .await
        .map(|_| ())
        .expect_err("a halted manager takes no work")
        .to_string();
    assert!(late.contains("fenced"), "{late}");
}
