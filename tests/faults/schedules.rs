//! Random crash schedules: proptest draws a sequence of operations — bootstrap the Kafka topic pool, grow it, create
//! tables with random names (three names, so recreates are common) and 1–8 regions, with and without
//! `if_not_exists` — and, for most operations, up to three crash points (before or after the k-th durable write of a
//! manager, or at its m-th side-effect point: after one topic creation, after one region creation).
//!
//! Everything runs on one memory kv backend (holding the metadata and, through `KvStateStore`, the procedure state),
//! one fake Kafka that refuses a second create of a name as Kafka does, and one set of fake datanodes. A "process" is
//! a `LocalManager` behind a `CrashingStore`. An operation with crash points starts a fresh process that dies at the
//! first point; a fresh process then starts on the same stores (dying at the next point, if any — so a crash can
//! hit a recovery), recovers what the dead one left, boots the pool as a metasrv does, and submits the interrupted
//! operation again (or watches it: create-table procedures have fixed ids per operation); then the schedule goes on
//! in the last process.
//!
//! After every operation the whole world is checked against a model: each wanted topic exists once in the fake
//! cluster (one successful create per name) and is persisted under `__topic_name/kafka/`; table names map to unique
//! ids, a recreate returns the existing id (`if_not_exists`) or "already exists" and never makes a second table;
//! each region has exactly one WAL option, from the pool as it was when the table was created (or raft-engine); each
//! region was created once on its datanode, with the recorded options, and no other region exists; every
//! datanode's open requests are exactly the regions it was asked to create; no allocation reservation is left.
//!
//! Both WAL modes run. `PROPTEST_CASES` sets the case count (default 64).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use procedures::testing::{
    CrashController, CrashPlan, CrashPoint, CrashingStore, MatrixConfig, injected_crash,
};
use procedures::{
    BoxedProcedure, BoxedProcedureLoader, Context, LocalManager, LockKey, Procedure, ProcedureId,
    ProcedureInfo, ProcedureManager, ProcedureManagerRef, ProcedureWithId, Status, Watcher,
};
use proptest::prelude::*;
use remote_wal::datanode::opener::{RegionOpener, WalProviderKind};
use remote_wal::ddl::allocator::ALLOCATION_KEY_PREFIX;
use remote_wal::ddl::region::region_id;
use remote_wal::ddl::{
    CreateTableProcedure, CreateTableTask, DdlContext, MemoryDatanodeManager,
    RoundRobinPeerSelector, TableMetadataAllocator, TableMetadataManager, TableName,
    WalOptionsSource,
};
use remote_wal::key::datanode_table::DatanodeTableValue;
use remote_wal::key::table_name::TableNameValue;
use remote_wal::key::table_route::TableRouteValue;
use remote_wal::key::topic_name::{get_topic_value, list_persisted_topics};
use remote_wal::kv::{
    KvBackend, KvBackendRef, KvStateStore, MemoryKvBackend, RangeRequest, range_all,
};
use remote_wal::wal::kafka::testing::FakeTopicAdmin;
use remote_wal::wal::kafka::{KafkaTopicManager, RoundRobinTopicSelector, TopicPoolSpec};
use remote_wal::wal::{WAL_OPTIONS_KEY, WalOptions, WalOptionsAllocator};

const PREFIX: &str = "sched_wal";
const DATANODES: [u64; 3] = [1, 2, 3];
const NAMES: [&str; 3] = ["cpu", "mem", "disk"];
/// The longest any one manager run of an operation may take before the case is reported as hung.
const OP_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    RaftEngine,
    Kafka,
}

#[derive(Clone, Debug)]
enum Op {
    /// Configure the pool `extra` topics larger (the first time: bootstrap; later: grow) and start it. A no-op in
    /// raft-engine mode.
    GrowPool { extra: usize },
    /// Create `greptime.public.{NAMES[name]}` with `regions` regions.
    CreateTable {
        name: usize,
        regions: u32,
        if_not_exists: bool,
    },
}

/// One operation and where the processes running it crash: the process that starts it (restarted at the start of
/// the operation when the list is not empty) dies at the first point, the one recovering it at the second, and so
/// on; the process after the last point does not crash.
#[derive(Clone, Debug)]
struct Step {
    op: Op,
    crashes: Vec<CrashPoint>,
}

#[derive(Clone, Debug)]
struct Schedule {
    steps: Vec<Step>,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (1usize..=4).prop_map(|extra| Op::GrowPool { extra }),
        3 => (0..NAMES.len(), 1u32..=8, any::<bool>()).prop_map(|(name, regions, if_not_exists)| {
            Op::CreateTable { name, regions, if_not_exists }
        }),
    ]
}

/// Crash points counted from a process's start; one operation (with the recovery a process starts with) makes
/// about 3–6 durable writes and up to 8 side-effect points, so most of these are reached.
fn crash_point() -> impl Strategy<Value = CrashPoint> {
    prop_oneof![
        (0usize..6).prop_map(CrashPoint::BeforeWrite),
        (0usize..6).prop_map(CrashPoint::AfterWrite),
        (0usize..8).prop_map(CrashPoint::SideEffect),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    (
        op(),
        prop_oneof![
            1 => Just(Vec::new()),
            2 => proptest::collection::vec(crash_point(), 1..=3),
        ],
    )
        .prop_map(|(op, crashes)| Step { op, crashes })
}

fn schedule() -> impl Strategy<Value = Schedule> {
    (
        proptest::bool::weighted(0.8),
        1usize..=4,
        proptest::collection::vec(crash_point(), 0..=2),
        proptest::collection::vec(step(), 1..=10),
    )
        .prop_map(|(boot_first, extra, crashes, mut steps)| {
            // Most schedules bootstrap first (otherwise most creates only meet a pool that is not ready).
            if boot_first {
                steps.insert(
                    0,
                    Step {
                        op: Op::GrowPool { extra },
                        crashes,
                    },
                );
            }
            Schedule { steps }
        })
}

// ---- a process: one manager whose life a crash controller ends ----

/// A procedure of a process: refuses to start a step once the process is dead, and counts steps in flight.
struct Tracked {
    inner: BoxedProcedure,
    life: Arc<Life>,
}

struct Life {
    controller: Arc<CrashController>,
    in_flight: AtomicUsize,
}

struct StepGuard<'a>(&'a AtomicUsize);

impl Drop for StepGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Life {
    fn enter(&self, id: &ProcedureId) -> procedures::Result<StepGuard<'_>> {
        if let Some(dead) = self.controller.crashed() {
            return Err(injected_crash(format!(
                "{} ({}); the dead process cannot run a step of {id}",
                dead.point, dead.detail
            )));
        }
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        Ok(StepGuard(&self.in_flight))
    }
}

fn track(p: ProcedureWithId, life: &Arc<Life>) -> ProcedureWithId {
    ProcedureWithId::new(
        p.id,
        Box::new(Tracked {
            inner: p.procedure,
            life: life.clone(),
        }),
    )
}

#[async_trait]
impl Procedure for Tracked {
    fn type_name(&self) -> &str {
        self.inner.type_name()
    }

    async fn execute(&mut self, ctx: &Context) -> procedures::Result<Status> {
        let life = self.life.clone();
        let _guard = life.enter(ctx.procedure_id())?;
        Ok(match self.inner.execute(ctx).await? {
            Status::Suspended {
                subprocedures,
                persist,
            } => Status::Suspended {
                subprocedures: subprocedures
                    .into_iter()
                    .map(|c| track(c, &self.life))
                    .collect(),
                persist,
            },
            other => other,
        })
    }

    fn dump(&self) -> procedures::Result<serde_json::Value> {
        self.inner.dump()
    }

    fn lock_key(&self) -> LockKey {
        self.inner.lock_key()
    }

    fn rollback_supported(&self) -> bool {
        self.inner.rollback_supported()
    }

    async fn rollback(&mut self, ctx: &Context) -> procedures::Result<()> {
        let life = self.life.clone();
        let _guard = life.enter(ctx.procedure_id())?;
        self.inner.rollback(ctx).await
    }

    fn timeout(&self) -> Option<Duration> {
        self.inner.timeout()
    }
}

/// The manager of a process: every procedure it loads or is given runs [`Tracked`].
struct TrackingManager {
    inner: LocalManager,
    life: Arc<Life>,
}

#[async_trait]
impl ProcedureManager for TrackingManager {
    fn register_loader(
        &self,
        type_name: &str,
        loader: BoxedProcedureLoader,
    ) -> procedures::Result<()> {
        let life = self.life.clone();
        self.inner.register_loader(
            type_name,
            Box::new(move |data| {
                Ok(Box::new(Tracked {
                    inner: loader(data)?,
                    life: life.clone(),
                }) as BoxedProcedure)
            }),
        )
    }

    async fn start(&self) -> procedures::Result<()> {
        self.inner.start().await
    }

    async fn stop(&self) -> procedures::Result<()> {
        self.inner.stop().await
    }

    async fn submit(&self, procedure: ProcedureWithId) -> procedures::Result<Watcher> {
        self.inner.submit(track(procedure, &self.life)).await
    }

    async fn watch(&self, id: &ProcedureId) -> procedures::Result<Option<Watcher>> {
        self.inner.watch(id).await
    }

    async fn procedure_state(&self, id: &ProcedureId) -> procedures::Result<Option<ProcedureInfo>> {
        self.inner.procedure_state(id).await
    }

    async fn list_procedures(&self) -> procedures::Result<Vec<ProcedureInfo>> {
        self.inner.list_procedures().await
    }

    fn epoch(&self) -> Option<u64> {
        self.inner.epoch()
    }
}

/// Where new regions get their WAL options in one process: the pool currently configured (swapped when it grows).
#[derive(Debug)]
struct CurrentPool(Mutex<Arc<WalOptionsAllocator>>);

impl CurrentPool {
    fn get(&self) -> Arc<WalOptionsAllocator> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, allocator: Arc<WalOptionsAllocator>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = allocator;
    }
}

impl WalOptionsSource for CurrentPool {
    fn alloc_batch(&self, n: usize) -> remote_wal::ddl::error::Result<Vec<WalOptions>> {
        Ok(self.get().alloc_batch(n)?)
    }
}

/// Everything that outlives a process: the durable stores and the outside world.
struct World {
    mode: Mode,
    /// The procedure state, in the same kv backend as the metadata (as a metasrv keeps it).
    state: Arc<KvStateStore>,
    kv: Arc<MemoryKvBackend>,
    admin: Arc<FakeTopicAdmin>,
    datanodes: Arc<MemoryDatanodeManager>,
    /// The configured pool size (0: no pool configured yet).
    pool_size: usize,
}

struct Process {
    life: Arc<Life>,
    manager: Arc<TrackingManager>,
    ddl: DdlContext,
    pool: Arc<CurrentPool>,
}

enum Failure {
    /// The process died at its crash point: start the next one.
    Crashed,
    /// Anything else is a finding.
    Finding(String),
}

impl World {
    fn new(mode: Mode) -> Self {
        let kv = Arc::new(MemoryKvBackend::new());
        World {
            mode,
            state: Arc::new(KvStateStore::new(kv.clone())),
            kv,
            admin: Arc::new(FakeTopicAdmin::new()),
            datanodes: Arc::new(MemoryDatanodeManager::new()),
            pool_size: 0,
        }
    }

    fn kv(&self) -> KvBackendRef {
        self.kv.clone()
    }

    /// The allocator of the configured pool (in Kafka mode with no pool yet: one that is never ready).
    fn allocator(&self) -> Arc<WalOptionsAllocator> {
        Arc::new(match self.mode {
            Mode::RaftEngine => WalOptionsAllocator::RaftEngine,
            Mode::Kafka => WalOptionsAllocator::Kafka(self.topic_manager(self.pool_size.max(1))),
        })
    }

    fn topic_manager(&self, num_topics: usize) -> KafkaTopicManager {
        KafkaTopicManager::new(
            TopicPoolSpec::new(PREFIX, num_topics),
            self.kv(),
            self.admin.clone(),
            Arc::new(RoundRobinTopicSelector::new()),
        )
        .expect("a valid pool spec")
    }

    /// Starts a process with `plan`: register loaders, start the manager (recovering what the last one left), and
    /// in Kafka mode with a pool configured, start the pool as a metasrv does at boot.
    async fn boot(&self, plan: CrashPlan) -> Result<Process, (Failure, Option<Process>)> {
        let controller = Arc::new(CrashController::new(plan));
        let store = Arc::new(CrashingStore::new(self.state.clone(), controller.clone()));
        let life = Arc::new(Life {
            controller,
            in_flight: AtomicUsize::new(0),
        });
        let manager = Arc::new(TrackingManager {
            inner: LocalManager::with_side_effect_hook(
                store.clone(),
                MatrixConfig::default().manager,
                store,
            ),
            life: life.clone(),
        });
        let pool = Arc::new(CurrentPool(Mutex::new(self.allocator())));
        let ddl = DdlContext {
            metadata: Arc::new(TableMetadataManager::new(self.kv())),
            allocator: Arc::new(TableMetadataAllocator::new(
                self.kv(),
                Arc::new(RoundRobinPeerSelector::new(DATANODES.to_vec())),
                pool.clone(),
            )),
            datanodes: self.datanodes.clone(),
        };
        let process = Process {
            life,
            manager,
            ddl,
            pool,
        };
        let finding = |what: String| Failure::Finding(what);
        if let Err(e) = process.manager.register_loader(
            remote_wal::ddl::CREATE_TABLE_TYPE_NAME,
            CreateTableProcedure::loader(process.ddl.clone()),
        ) {
            return Err((finding(format!("register create-table loader: {e}")), None));
        }
        // The bootstrap loader only needs the kv and the admin: any pool size registers the same loader.
        if let Err(e) = self
            .topic_manager(1)
            .register_loader(process.manager.as_ref())
        {
            return Err((finding(format!("register bootstrap loader: {e}")), None));
        }
        let started = tokio::time::timeout(OP_TIMEOUT, process.manager.start()).await;
        match started {
            Err(_) => return Err((finding("hung: manager start".into()), Some(process))),
            Ok(Err(e)) if !process.life.controller.is_crashed() => {
                return Err((finding(format!("manager start failed: {e}")), Some(process)));
            }
            Ok(Err(_)) => return Err((Failure::Crashed, Some(process))),
            Ok(Ok(())) => {}
        }
        if self.mode == Mode::Kafka
            && self.pool_size > 0
            && let Err(f) = self.start_pool(&process).await
        {
            return Err((f, Some(process)));
        }
        Ok(process)
    }

    /// Starts (bootstraps, grows, or just loads) the configured pool on `process` and makes it the one new regions
    /// get options from.
    async fn start_pool(&self, process: &Process) -> Result<(), Failure> {
        let allocator = self.allocator();
        let manager: ProcedureManagerRef = process.manager.clone();
        match tokio::time::timeout(OP_TIMEOUT, allocator.start(&manager)).await {
            Err(_) => Err(Failure::Finding(format!(
                "hung: starting the pool of {} topics",
                self.pool_size
            ))),
            Ok(Err(_)) if process.life.controller.is_crashed() => Err(Failure::Crashed),
            Ok(Err(e)) => Err(Failure::Finding(format!(
                "starting the pool of {} topics failed: {e}",
                self.pool_size
            ))),
            Ok(Ok(())) => {
                process.pool.set(allocator);
                Ok(())
            }
        }
    }
}

/// Ends a process: stop its manager and wait until none of its steps runs.
async fn shut(process: Process) -> Result<(), String> {
    if tokio::time::timeout(OP_TIMEOUT, process.manager.stop())
        .await
        .is_err()
    {
        return Err("hung: stop() of a crashed manager".into());
    }
    let waited = tokio::time::timeout(OP_TIMEOUT, async {
        while process.life.in_flight.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    waited.map_err(|_| "hung: steps of a crashed manager still running".to_string())
}

// ---- the model ----

#[derive(Debug)]
struct ModelTable {
    table_id: u32,
    regions: u32,
    /// The pool size when the table was created: its topics are among the first this many.
    pool_size: usize,
}

#[derive(Debug, Default)]
struct Model {
    tables: BTreeMap<String, ModelTable>,
}

fn table_name(i: usize) -> TableName {
    TableName::new("greptime", "public", NAMES[i])
}

/// Runs one schedule in `mode`; returns where the processes crashed, or describes the first broken expectation.
async fn run_schedule(mode: Mode, schedule: &Schedule) -> Result<Vec<String>, String> {
    let mut world = World::new(mode);
    let mut model = Model::default();
    let mut process: Option<Process> = None;
    let mut crashes = Vec::new();

    for (
        i,
        Step {
            op,
            crashes: planned,
        },
    ) in schedule.steps.iter().enumerate()
    {
        let mut plans: VecDeque<CrashPoint> = planned.iter().copied().collect();
        if !plans.is_empty() {
            // A clean restart, so that the first crash point counts from the start of a process.
            if let Some(p) = process.take() {
                shut(p).await?;
            }
        }
        if let Op::GrowPool { extra } = op
            && mode == Mode::Kafka
        {
            world.pool_size += extra;
        }
        // Each pass: (boot a process if none lives, then) run the operation; a crash ends the pass.
        let mut passes = 0;
        let result = loop {
            passes += 1;
            if passes > planned.len() + 2 {
                return Err(format!(
                    "op #{i} {op:?}: still not done after {passes} processes"
                ));
            }
            let p = match process.take() {
                Some(p) => p,
                None => {
                    let plan = plans.pop_front().map(CrashPlan::at).unwrap_or_default();
                    match world.boot(plan).await {
                        Ok(p) => p,
                        Err((Failure::Crashed, p)) => {
                            if let Some(p) = p {
                                crashes.push(record(&p));
                                shut(p).await?;
                            }
                            continue;
                        }
                        Err((Failure::Finding(what), _)) => {
                            return Err(format!("op #{i} {op:?}: booting a process: {what}"));
                        }
                    }
                }
            };
            let outcome = match op {
                Op::GrowPool { .. } if mode == Mode::Kafka => {
                    world.start_pool(&p).await.map(|()| OpResult::Pool)
                }
                Op::GrowPool { .. } => Ok(OpResult::Pool),
                Op::CreateTable {
                    name,
                    regions,
                    if_not_exists,
                } => create_table(&p, i, *name, *regions, *if_not_exists).await,
            };
            match outcome {
                Ok(r) if !p.life.controller.is_crashed() => {
                    process = Some(p);
                    break r;
                }
                Err(Failure::Finding(what)) if !p.life.controller.is_crashed() => {
                    return Err(format!("op #{i} {op:?}: {what}"));
                }
                // Crashed (whatever the op saw): the next process recovers and the op is submitted again.
                _ => {
                    crashes.push(record(&p));
                    shut(p).await?;
                }
            }
        };
        expect_result(mode, &world, &mut model, op, result)
            .map_err(|e| format!("op #{i} {op:?} (crashes so far: {crashes:?}): {e}"))?;
        check_world(&world, &model)
            .await
            .map_err(|e| format!("after op #{i} {op:?} (crashes so far: {crashes:?}): {e}"))?;
    }
    if let Some(p) = process {
        let _ = p.manager.stop().await;
    }
    Ok(crashes)
}

fn record(p: &Process) -> String {
    p.life
        .controller
        .crashed()
        .map(|c| format!("{} ({})", c.point, c.detail))
        .unwrap_or_else(|| "?".into())
}

#[derive(Debug)]
enum OpResult {
    Pool,
    Table(Result<u32, String>),
}

/// Submits the create-table procedure of op `i` under a fixed id (watching it when a recovered manager already has
/// it) and waits for it.
async fn create_table(
    p: &Process,
    i: usize,
    name: usize,
    regions: u32,
    if_not_exists: bool,
) -> Result<OpResult, Failure> {
    let mut task = CreateTableTask::new(table_name(name), regions);
    task.if_not_exists = if_not_exists;
    let id = ProcedureId::new(format!("schedule/op-{i}"));
    let procedure = ProcedureWithId::new(
        id.clone(),
        Box::new(CreateTableProcedure::new(task, p.ddl.clone())),
    );
    let run = async {
        let mut watcher = match p.manager.submit(procedure).await {
            Ok(w) => w,
            Err(procedures::Error::DuplicateProcedure { .. }) => match p.manager.watch(&id).await {
                Ok(Some(w)) => w,
                Err(e) => return Err(Failure::Finding(format!("{id}: watching it failed: {e}"))),
                Ok(None) => {
                    return Err(Failure::Finding(format!(
                        "{id}: submit says it exists but there is no watcher"
                    )));
                }
            },
            Err(e) if p.life.controller.is_crashed() => {
                let _ = e;
                return Err(Failure::Crashed);
            }
            Err(e) => return Err(Failure::Finding(format!("submit {id}: {e}"))),
        };
        let result = watcher.wait().await;
        Ok(OpResult::Table(match result {
            Ok(Some(output)) => match serde_json::from_value::<TableNameValue>(output.clone()) {
                Ok(v) => Ok(v.table_id),
                Err(_) => {
                    return Err(Failure::Finding(format!("{id}: output {output}")));
                }
            },
            Ok(None) => return Err(Failure::Finding(format!("{id}: no output"))),
            Err(e) => Err(e.to_string()),
        }))
    };
    match tokio::time::timeout(OP_TIMEOUT, run).await {
        Ok(r) => r,
        Err(_) => Err(Failure::Finding(format!("hung: {id}"))),
    }
}

/// What the operation should have returned, given the model before it; updates the model.
fn expect_result(
    mode: Mode,
    world: &World,
    model: &mut Model,
    op: &Op,
    result: OpResult,
) -> Result<(), String> {
    let Op::CreateTable {
        name,
        regions,
        if_not_exists,
    } = op
    else {
        return match result {
            OpResult::Pool => Ok(()),
            other => Err(format!("unexpected result {other:?}")),
        };
    };
    let OpResult::Table(result) = result else {
        return Err(format!("unexpected result {result:?}"));
    };
    let key = NAMES[*name].to_string();
    if mode == Mode::Kafka && world.pool_size == 0 {
        return match result {
            Err(e) if e.contains(&format!("Kafka topic pool '{PREFIX}' is not ready")) => Ok(()),
            other => Err(format!(
                "without a pool: expected 'not ready', got {other:?}"
            )),
        };
    }
    match (model.tables.get(&key), result) {
        (Some(t), Ok(id)) if *if_not_exists && id == t.table_id => Ok(()),
        (Some(t), Err(e))
            if !*if_not_exists
                && e.contains(&format!(
                    "table greptime.public.{key} already exists (table id {})",
                    t.table_id
                )) =>
        {
            Ok(())
        }
        (Some(t), other) => Err(format!(
            "recreate of existing table {key} (id {}): got {other:?}",
            t.table_id
        )),
        (None, Ok(id)) => {
            if let Some((other, _)) = model.tables.iter().find(|(_, t)| t.table_id == id) {
                return Err(format!(
                    "new table {key} got id {id}, already used by {other}"
                ));
            }
            model.tables.insert(
                key,
                ModelTable {
                    table_id: id,
                    regions: *regions,
                    pool_size: world.pool_size,
                },
            );
            Ok(())
        }
        (None, Err(e)) => Err(format!("creating new table {key} failed: {e}")),
    }
}

async fn scan(kv: &dyn KvBackend, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
    Ok(
        range_all(kv, RangeRequest::prefix(prefix.as_bytes().to_vec()), 0)
            .await
            .map_err(|e| format!("scan {prefix}: {e}"))?
            .into_iter()
            .map(|kv| (String::from_utf8_lossy(&kv.key).into_owned(), kv.value))
            .collect(),
    )
}

fn decode<T: serde::de::DeserializeOwned>(key: &str, value: &[u8]) -> Result<T, String> {
    serde_json::from_slice(value).map_err(|e| format!("{key}: {e}"))
}

/// Every invariant of the world against the model.
async fn check_world(world: &World, model: &Model) -> Result<(), String> {
    let kv = world.kv.as_ref();

    // Topics: the wanted ones, each created once, each persisted; nothing else.
    let wanted: BTreeSet<String> = (0..world.pool_size)
        .map(|i| format!("{PREFIX}_{i}"))
        .collect();
    let topics = world.admin.topics();
    let in_kafka: BTreeSet<String> = topics.keys().cloned().collect();
    if in_kafka != wanted {
        return Err(format!("topics in Kafka {in_kafka:?}, wanted {wanted:?}"));
    }
    for (name, t) in &topics {
        if t.creations != 1 || t.partitions != 1 {
            return Err(format!("topic {name}: {t:?}"));
        }
    }
    let mut successful: BTreeMap<String, usize> = BTreeMap::new();
    for (name, created) in world.admin.create_log() {
        if created {
            *successful.entry(name).or_default() += 1;
        }
    }
    if successful.keys().cloned().collect::<BTreeSet<_>>() != wanted
        || successful.values().any(|n| *n != 1)
    {
        return Err(format!(
            "successful creates per topic {successful:?}, wanted each of {wanted:?} once"
        ));
    }
    let persisted: BTreeSet<String> = list_persisted_topics(kv, "")
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .collect();
    if persisted != wanted {
        return Err(format!("persisted topics {persisted:?}, wanted {wanted:?}"));
    }
    for t in &persisted {
        let value = get_topic_value(kv, t).await.map_err(|e| e.to_string())?;
        if value.is_none() {
            return Err(format!("persisted topic {t} has no value"));
        }
    }

    // Table names: exactly the model's, with unique ids.
    let names: BTreeMap<String, u32> = scan(kv, "__table_name/")
        .await?
        .into_iter()
        .map(|(k, v)| Ok((k.clone(), decode::<TableNameValue>(&k, &v)?.table_id)))
        .collect::<Result<_, String>>()?;
    let expected_names: BTreeMap<String, u32> = model
        .tables
        .iter()
        .map(|(n, t)| (format!("__table_name/greptime/public/{n}"), t.table_id))
        .collect();
    if names != expected_names {
        return Err(format!(
            "table names {names:?}, expected {expected_names:?}"
        ));
    }
    let ids: BTreeSet<u32> = names.values().copied().collect();
    if ids.len() != names.len() {
        return Err(format!("table ids not unique: {names:?}"));
    }
    let routes_found: BTreeSet<String> = scan(kv, "__table_route/")
        .await?
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    let infos_found: BTreeSet<String> = scan(kv, "__table_info/")
        .await?
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    let routes_wanted: BTreeSet<String> =
        ids.iter().map(|id| format!("__table_route/{id}")).collect();
    let infos_wanted: BTreeSet<String> =
        ids.iter().map(|id| format!("__table_info/{id}")).collect();
    if routes_found != routes_wanted || infos_found != infos_wanted {
        return Err(format!(
            "routes {routes_found:?} / infos {infos_found:?} for tables {ids:?}"
        ));
    }

    // Per table: the route covers regions 0..n, the datanode values hold exactly the routed regions, each with one
    // WAL option from the pool (or raft-engine).
    let mut expected_dn_keys = BTreeSet::new();
    // datanode → region id → encoded WAL options
    let mut expected_regions: BTreeMap<u64, BTreeMap<u64, String>> = BTreeMap::new();
    for (name, t) in &model.tables {
        let route_key = format!("__table_route/{}", t.table_id);
        let route: TableRouteValue = match kv.get(route_key.as_bytes()).await {
            Ok(Some(v)) => decode(&route_key, &v.value)?,
            other => return Err(format!("{route_key}: {other:?}")),
        };
        let numbers: Vec<u32> = route.region_routes.keys().copied().collect();
        if numbers != (0..t.regions).collect::<Vec<_>>() {
            return Err(format!(
                "table {name}: route regions {numbers:?}, wanted 0..{}",
                t.regions
            ));
        }
        for (dn, regions) in route.regions_by_datanode() {
            if !DATANODES.contains(&dn) {
                return Err(format!(
                    "table {name}: region routed to unknown datanode {dn}"
                ));
            }
            let key = format!("__dn_table/{dn}/{}", t.table_id);
            expected_dn_keys.insert(key.clone());
            let value: DatanodeTableValue = match kv.get(key.as_bytes()).await {
                Ok(Some(v)) => decode(&key, &v.value)?,
                other => return Err(format!("{key}: {other:?}")),
            };
            if value.regions != regions {
                return Err(format!(
                    "{key}: regions {:?}, route says {regions:?}",
                    value.regions
                ));
            }
            let wal_regions: Vec<u32> = value.region_wal_options.keys().copied().collect();
            if wal_regions != regions {
                return Err(format!(
                    "{key}: WAL options for regions {wal_regions:?}, serves {regions:?}"
                ));
            }
            for (number, encoded) in &value.region_wal_options {
                let options = WalOptions::decode(encoded).map_err(|e| format!("{key}: {e}"))?;
                match (world.mode, &options) {
                    (Mode::RaftEngine, WalOptions::RaftEngine) => {}
                    (Mode::Kafka, WalOptions::Kafka(k))
                        if (0..t.pool_size).any(|i| k.topic == format!("{PREFIX}_{i}")) => {}
                    _ => {
                        return Err(format!(
                            "{key}: region {number} has WAL options {encoded}, not from the pool of {} topics",
                            t.pool_size
                        ));
                    }
                }
                expected_regions
                    .entry(dn)
                    .or_default()
                    .insert(region_id(t.table_id, *number), encoded.clone());
            }
        }
    }
    let dn_keys: BTreeSet<String> = scan(kv, "__dn_table/")
        .await?
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    if dn_keys != expected_dn_keys {
        return Err(format!(
            "datanode table keys {dn_keys:?}, expected {expected_dn_keys:?}"
        ));
    }

    // Datanodes: each region created once, with the recorded WAL options, and nothing else.
    let creations = world.datanodes.creations();
    if let Some((region, n)) = creations.iter().find(|(_, n)| **n != 1) {
        return Err(format!("region {region} created {n} times"));
    }
    let created_regions: BTreeMap<u64, BTreeMap<u64, String>> = world
        .datanodes
        .regions()
        .into_iter()
        .map(|(dn, regions)| {
            (
                dn,
                regions
                    .into_iter()
                    .map(|(id, req)| {
                        (
                            id,
                            req.options
                                .get(WAL_OPTIONS_KEY)
                                .cloned()
                                .unwrap_or_default(),
                        )
                    })
                    .collect(),
            )
        })
        .filter(|(_, r): &(u64, BTreeMap<u64, String>)| !r.is_empty())
        .collect();
    if created_regions != expected_regions {
        return Err(format!(
            "regions on datanodes {created_regions:?}, tables say {expected_regions:?}"
        ));
    }

    // Open requests: per datanode, exactly the regions it was asked to create, with the same requests.
    let kind = match world.mode {
        Mode::RaftEngine => WalProviderKind::RaftEngine,
        Mode::Kafka => WalProviderKind::Kafka,
    };
    let all_created = world.datanodes.regions();
    for dn in DATANODES {
        let open = RegionOpener::new(world.kv(), dn, kind)
            .with_page_size(2)
            .open_regions()
            .await
            .map_err(|e| format!("open regions of datanode {dn}: {e}"))?;
        if !open.errors.is_empty() {
            return Err(format!("datanode {dn}: open errors {:?}", open.errors));
        }
        let opened: BTreeMap<u64, (String, String, BTreeMap<String, String>)> = open
            .requests
            .into_iter()
            .map(|r| (r.region_id, (r.engine, r.region_dir, r.options)))
            .collect();
        let created: BTreeMap<u64, (String, String, BTreeMap<String, String>)> = all_created
            .get(&dn)
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .map(|(id, r)| (id, (r.engine, r.region_dir, r.options)))
            .collect();
        if opened != created {
            return Err(format!(
                "datanode {dn}: open requests {opened:?}, created regions {created:?}"
            ));
        }
    }

    // No allocation reservation outlives its procedure.
    let reservations = scan(kv, ALLOCATION_KEY_PREFIX).await?;
    if !reservations.is_empty() {
        let keys: Vec<&String> = reservations.iter().map(|(k, _)| k).collect();
        return Err(format!("allocation reservations left: {keys:?}"));
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

fn run(mode: Mode, schedule: &Schedule) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    rt.block_on(run_schedule(mode, schedule))
        .map(|_| ())
        .map_err(TestCaseError::fail)
}

/// The harness itself: a fixed schedule whose crash points are all reached, at the places planned (after the
/// second topic creation, after the CreateRegions state write, in the recovery, ...), and whose end state passes
/// every check.
#[tokio::test]
async fn planned_crashes_hit_where_planned() {
    use CrashPoint::*;
    let create = |name, regions, if_not_exists| Op::CreateTable {
        name,
        regions,
        if_not_exists,
    };
    let schedule = Schedule {
        steps: vec![
            Step {
                op: Op::GrowPool { extra: 3 },
                crashes: vec![SideEffect(1), AfterWrite(0)],
            },
            Step {
                // Writes of the process: #0 epoch, #1 submit, #2 Allocate's state, #3 CreateRegions' state. The
                // recovery creates the regions again (side-effect point #0 is its first one).
                op: create(0, 4, false),
                crashes: vec![AfterWrite(2), SideEffect(0)],
            },
            Step {
                op: Op::GrowPool { extra: 2 },
                crashes: vec![SideEffect(0)],
            },
            Step {
                op: create(0, 2, true),
                crashes: vec![BeforeWrite(2)],
            },
            Step {
                op: create(0, 2, false),
                crashes: vec![],
            },
            Step {
                op: create(1, 8, false),
                crashes: vec![SideEffect(5)],
            },
        ],
    };
    let crashes = run_schedule(Mode::Kafka, &schedule).await.unwrap();
    let expected = [
        "at side-effect point #1 (side effect 'created sched_wal_1",
        "after write #0 (",
        "after write #2 (write [\"proc/schedule/op-1\"]",
        "at side-effect point #0 (side effect 'created region 4398046511104 on datanode",
        "at side-effect point #0 (side effect 'created sched_wal_3",
        "before write #2 (",
        "at side-effect point #5 (side effect 'created region",
    ];
    assert_eq!(crashes.len(), expected.len(), "{crashes:#?}");
    for (got, want) in crashes.iter().zip(expected) {
        assert!(
            got.starts_with(want),
            "crash {got:?} should start with {want:?}: {crashes:#?}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn crash_schedules_on_the_kafka_pool(schedule in schedule()) {
        run(Mode::Kafka, &schedule)?;
    }

    #[test]
    fn crash_schedules_on_raft_engine(schedule in schedule()) {
        run(Mode::RaftEngine, &schedule)?;
    }
}
