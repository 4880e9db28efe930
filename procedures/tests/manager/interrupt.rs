//! A cancel or pause interrupts a step where it awaits: its future is dropped as soon as the manager learns of the
//! request, and the rollback (cancel) or the step's re-run (pause, then resume) works from the last persisted record
//! — never from the state the dropped step had half changed in memory.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use procedures::control::{self, ControlOp, control_key};
use procedures::{
    BoxedProcedureLoader, Context, Error, LocalManager, LockKey, MemoryStateStore, Procedure,
    ProcedureId, ProcedureManager, ProcedureRecord, ProcedureState, ProcedureWithId, Result,
    StateStore, Status,
};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::support::manager::{Env, Plan, fast_config, within};

const HANGING: &str = "test_hanging";

/// The persisted data of a [`Hanging`] procedure.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Data {
    /// Steps done: 0 (its first step persists 1), then 1 (its second step, the one that waits, ends it).
    at: u32,
    /// Set by the second step before it awaits: the in-memory change an interrupt must not let through.
    touched: bool,
}

/// What the test sees of the [`Hanging`] procedures it runs.
struct Probe {
    /// Told each time a run of the second step has begun to wait.
    waiting: mpsc::UnboundedSender<()>,
    /// How many more runs of the second step wait forever; the later ones go straight through.
    hangs: AtomicU32,
    /// How many futures of the second step were dropped while they waited.
    dropped: AtomicU32,
    /// `touched` as each run of the second step found it on entry.
    seen_by_step: Mutex<Vec<bool>>,
    /// `touched` as each rollback found it.
    seen_by_rollback: Mutex<Vec<bool>>,
}

impl Probe {
    fn new(hangs: u32) -> (Arc<Self>, mpsc::UnboundedReceiver<()>) {
        let (waiting, rx) = mpsc::unbounded_channel();
        let probe = Probe {
            waiting,
            hangs: AtomicU32::new(hangs),
            dropped: AtomicU32::new(0),
            seen_by_step: Mutex::new(Vec::new()),
            seen_by_rollback: Mutex::new(Vec::new()),
        };
        (Arc::new(probe), rx)
    }

    fn procedure(self: &Arc<Self>, id: &str, data: Data) -> ProcedureWithId {
        ProcedureWithId::new(
            ProcedureId::new(id),
            Box::new(Hanging {
                data,
                probe: Arc::clone(self),
            }),
        )
    }

    fn loader(self: &Arc<Self>) -> BoxedProcedureLoader {
        let probe = Arc::clone(self);
        Box::new(move |value| {
            let data: Data = serde_json::from_value(value).map_err(Error::external)?;
            Ok(Box::new(Hanging {
                data,
                probe: Arc::clone(&probe),
            }))
        })
    }

    fn seen_by_step(&self) -> Vec<bool> {
        self.seen_by_step.lock().unwrap().clone()
    }

    fn seen_by_rollback(&self) -> Vec<bool> {
        self.seen_by_rollback.lock().unwrap().clone()
    }
}

/// Counts a drop of the future that holds it: it is held across an await that never completes, so only a drop of
/// the step's future drops it.
struct DropCounter(Arc<Probe>);

impl Drop for DropCounter {
    fn drop(&mut self) {
        self.0.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

/// Two steps; the second changes its state in memory, then (while `hangs` lasts) awaits a future that never
/// resolves. Rolls back, noting the state it rolls back from.
struct Hanging {
    data: Data,
    probe: Arc<Probe>,
}

#[async_trait]
impl Procedure for Hanging {
    fn type_name(&self) -> &str {
        HANGING
    }

    async fn execute(&mut self, _ctx: &Context) -> Result<Status> {
        if self.data.at == 0 {
            self.data.at = 1;
            return Ok(Status::executing(true));
        }
        self.probe
            .seen_by_step
            .lock()
            .unwrap()
            .push(self.data.touched);
        self.data.touched = true;
        let hang = self
            .probe
            .hangs
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if hang {
            let _counter = DropCounter(Arc::clone(&self.probe));
            let _ = self.probe.waiting.send(());
            std::future::pending::<()>().await;
        }
        self.data.at = 2;
        Ok(Status::done())
    }

    fn dump(&self) -> Result<serde_json::Value> {
        serde_json::to_value(&self.data).map_err(Error::external)
    }

    fn lock_key(&self) -> LockKey {
        LockKey::exclusive("hanging")
    }

    fn step_name(&self) -> Option<String> {
        Some(if self.data.at == 0 { "First" } else { "Wait" }.to_string())
    }

    fn rollback_supported(&self) -> bool {
        true
    }

    async fn rollback(&mut self, _ctx: &Context) -> Result<()> {
        self.probe
            .seen_by_rollback
            .lock()
            .unwrap()
            .push(self.data.touched);
        Ok(())
    }
}

async fn started(store: &Arc<MemoryStateStore>, probe: &Arc<Probe>) -> LocalManager {
    let manager = LocalManager::new(store.clone(), fast_config());
    manager.register_loader(HANGING, probe.loader()).unwrap();
    manager.start().await.unwrap();
    manager
}

fn stored(store: &MemoryStateStore, id: &str) -> ProcedureRecord {
    let value = store
        .snapshot()
        .get(&format!("proc/{id}"))
        .cloned()
        .expect("record stored");
    serde_json::from_slice(&value).unwrap()
}

fn stored_data(store: &MemoryStateStore, id: &str) -> Data {
    serde_json::from_value(stored(store, id).data).unwrap()
}

fn event_names(record: &ProcedureRecord) -> Vec<String> {
    record
        .events
        .iter()
        .map(|e| {
            serde_json::to_value(&e.kind).unwrap()["event"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

async fn until_state(m: &LocalManager, id: &str, state: ProcedureState) {
    within(async {
        loop {
            if let Some(info) = m.procedure_state(&ProcedureId::new(id)).await.unwrap()
                && info.state == state
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
}

#[tokio::test]
async fn a_cancel_from_another_process_drops_a_waiting_step_and_rolls_back_from_the_last_record() {
    let (probe, mut waiting) = Probe::new(1);
    let store = Arc::new(MemoryStateStore::new());
    let m = started(&store, &probe).await;
    let id = ProcedureId::new("p");
    let mut w = m
        .submit(probe.procedure("p", Data::default()))
        .await
        .unwrap();
    within(waiting.recv()).await.expect("the step waits");

    // Another process: the request goes into the store only; the running manager learns of it by its poll.
    let outside: &dyn StateStore = store.as_ref();
    control::request(outside, &id, ControlOp::Cancel)
        .await
        .unwrap();
    let err = within(w.wait()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "procedure p was cancelled: cancelled (rolled back)"
    );
    assert_eq!(
        probe.dropped.load(Ordering::SeqCst),
        1,
        "the waiting step's future was dropped"
    );
    assert_eq!(probe.seen_by_step(), [false], "the step ran once");
    assert_eq!(
        probe.seen_by_rollback(),
        [false],
        "the rollback works from the last record, not from the dropped step's change"
    );
    let record = stored(&store, "p");
    assert_eq!(record.state, ProcedureState::Cancelled);
    assert_eq!(record.error.as_deref(), Some("cancelled (rolled back)"));
    let data = stored_data(&store, "p");
    assert_eq!((data.at, data.touched), (1, false), "{data:?}");
    let names = event_names(&record);
    assert_eq!(
        names[names.len() - 4..],
        [
            "cancel_requested",
            "rolling_back",
            "rolled_back",
            "cancelled"
        ],
        "{names:?}"
    );
    assert!(!store.snapshot().contains_key(&control_key(&id)));
    assert!(m.procedure_locks(&id).is_none(), "its locks are released");
}

#[tokio::test]
async fn a_pause_drops_a_waiting_step_and_the_resume_runs_it_again_from_the_last_record() {
    let (probe, mut waiting) = Probe::new(1);
    let store = Arc::new(MemoryStateStore::new());
    let m = started(&store, &probe).await;
    let id = ProcedureId::new("p");
    let mut w = m
        .submit(probe.procedure("p", Data::default()))
        .await
        .unwrap();
    within(waiting.recv()).await.expect("the step waits");

    m.pause(&id).await.unwrap();
    until_state(&m, "p", ProcedureState::Paused).await;
    assert_eq!(probe.dropped.load(Ordering::SeqCst), 1);
    assert_eq!(probe.seen_by_step(), [false], "not run again while paused");
    let record = stored(&store, "p");
    assert_eq!(record.state, ProcedureState::Paused);
    let data = stored_data(&store, "p");
    assert_eq!(
        (data.at, data.touched),
        (1, false),
        "the paused record holds the last persisted state: {data:?}"
    );
    assert_eq!(
        m.procedure_locks(&id).expect("keeps its keys").held.len(),
        1
    );

    m.resume(&id).await.unwrap();
    let output = within(w.wait()).await.unwrap();
    assert_eq!(output, None);
    assert_eq!(
        probe.seen_by_step(),
        [false, false],
        "the re-run starts from the record, without the interrupted run's change"
    );
    assert_eq!(probe.dropped.load(Ordering::SeqCst), 1);
    assert!(probe.seen_by_rollback().is_empty());
    let record = stored(&store, "p");
    assert_eq!(record.state, ProcedureState::Done);
    let names = event_names(&record);
    let paused = names.iter().position(|n| n == "paused").unwrap();
    let resumed = names.iter().position(|n| n == "resumed").unwrap();
    assert!(paused < resumed, "{names:?}");
}

#[tokio::test]
async fn a_pause_of_every_procedure_from_another_process_interrupts_a_waiting_step() {
    let (probe, mut waiting) = Probe::new(1);
    let store = Arc::new(MemoryStateStore::new());
    let m = started(&store, &probe).await;
    let mut w = m
        .submit(probe.procedure("p", Data::default()))
        .await
        .unwrap();
    within(waiting.recv()).await.expect("the step waits");

    let outside: &dyn StateStore = store.as_ref();
    control::request_all(outside, true).await.unwrap();
    until_state(&m, "p", ProcedureState::Paused).await;
    assert_eq!(probe.dropped.load(Ordering::SeqCst), 1);
    control::request_all(outside, false).await.unwrap();
    within(w.wait()).await.unwrap();
    assert_eq!(probe.seen_by_step(), [false, false]);
}

/// A procedure type without a registered loader cannot be rebuilt from its record, so its step is not
/// interrupted: a request is honoured at the step boundary after it, as before. One pause of every procedure reaches
/// both runners with the same wake-up; once the procedure that can be rebuilt shows it was interrupted and paused,
/// the other still runs its step (an interrupted one would have stalled, unable to go back to its record).
#[tokio::test]
async fn the_step_of_a_type_without_a_loader_runs_to_its_end_before_a_pause() {
    let (probe, mut waiting) = Probe::new(1);
    let env = Env::new(false);
    let store = Arc::new(MemoryStateStore::new());
    // Loaders for the hanging type only: `Steps` procedures have none here.
    let m = started(&store, &probe).await;
    let plan = Plan {
        steps: 3,
        persist: true,
        block_at: Some(1),
        ..Plan::default()
    };
    let mut p = m.submit(env.with_id("p", plan)).await.unwrap();
    let mut q = m
        .submit(probe.procedure("q", Data::default()))
        .await
        .unwrap();
    within(async {
        while !env.events().contains(&"enter p at 1".to_string()) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    within(waiting.recv()).await.expect("q's step waits");

    m.pause_all().await.unwrap();
    until_state(&m, "q", ProcedureState::Paused).await;
    assert_eq!(probe.dropped.load(Ordering::SeqCst), 1);
    let shown = m
        .procedure_state(&ProcedureId::new("p"))
        .await
        .unwrap()
        .expect("p is known");
    assert_eq!(shown.state, ProcedureState::Running, "{shown:?}");
    assert_eq!(
        env.events(),
        ["enter p at 0", "exit p", "enter p at 1"],
        "p's step is still in progress"
    );
    // Its step ends on its own; the boundary after it pauses it.
    env.gate.add_permits(100);
    until_state(&m, "p", ProcedureState::Paused).await;
    assert_eq!(
        env.events(),
        ["enter p at 0", "exit p", "enter p at 1", "exit p"]
    );
    m.resume_all().await.unwrap();
    within(p.wait()).await.unwrap();
    within(q.wait()).await.unwrap();
}
