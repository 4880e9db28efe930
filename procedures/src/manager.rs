//! The [`ProcedureManager`] trait and its local implementation, [`LocalManager`].

use std::sync::Arc;

use async_trait::async_trait;

use crate::config::ManagerConfig;
use crate::error::Result;
use crate::procedure::{BoxedProcedureLoader, ProcedureId, ProcedureWithId, SideEffectHook};
use crate::record::ProcedureInfo;
use crate::store::StateStore;
use crate::watcher::Watcher;

/// Runs procedures durably: persists their state after each step, recovers unfinished ones on start, and fences
/// itself off when a newer manager claims the store.
#[async_trait]
pub trait ProcedureManager: Send + Sync {
    /// Registers how to rebuild procedures of `type_name` from their persisted data. Must happen before `start`.
    fn register_loader(&self, type_name: &str, loader: BoxedProcedureLoader) -> Result<()>;

    /// Claims a new epoch in the store (fencing any older manager), then recovers and resumes every unfinished
    /// procedure. Records that cannot be recovered become visible failed procedures.
    ///
    /// A stopped (or fenced, or halted) manager may be started again: it waits for the tasks of its last run to
    /// end, forgets what it knew, claims a new epoch and recovers from the store like a new manager. Starting a
    /// manager that is running (or starting) is refused with [`crate::Error::ManagerNotRunning`].
    async fn start(&self) -> Result<()>;

    /// Stops running procedures (they stay unfinished in the store and resume at the next start). Returns only
    /// once every task the manager spawned (runners, submissions, retention) has ended: afterwards no task of the
    /// manager holds the state store.
    async fn stop(&self) -> Result<()>;

    /// Persists and starts a procedure, and returns its watcher.
    ///
    /// The id is an idempotency key: an id the manager already knows — running, finished (its stored output), or
    /// only as a record in the store — gives a watcher of that procedure instead of a second one, when it is of the
    /// same type; of another type, [`crate::Error::ProcedureIdInUse`]. Cancellation-safe: dropping the returned
    /// future at any point leaves either no procedure (the record was not written) or a running one.
    async fn submit(&self, procedure: ProcedureWithId) -> Result<Watcher>;

    /// [`ProcedureManager::submit`], except that a root under the same id that **failed and whose rollback
    /// completed** (it left nothing behind) is replaced by this submission and runs again: its record is overwritten
    /// in one write conditioned on the failed record's bytes, so two such resubmissions run it once. Any other
    /// procedure under the id is answered as `submit` answers it. The caller checks that the request is the same
    /// one (the id stays an idempotency key for everything that did or may still take effect). The default is
    /// `submit`: a manager that cannot replace records never runs an id twice.
    async fn submit_again_if_rolled_back(&self, procedure: ProcedureWithId) -> Result<Watcher> {
        self.submit(procedure).await
    }

    /// A watcher of a procedure this manager knows (submitted or recovered), finished or not. A finished procedure
    /// that left memory (see [`crate::ManagerConfig::finished_in_memory`]) is read from its record in the store:
    /// its watcher resolves at once. An error when that read fails.
    async fn watch(&self, id: &ProcedureId) -> Result<Option<Watcher>>;

    /// What is known of one procedure: from memory, or, for a finished procedure that left memory, from its record.
    async fn procedure_state(&self, id: &ProcedureId) -> Result<Option<ProcedureInfo>>;

    /// Every known procedure (running, and finished ones still retained: those in memory, and those that left it
    /// read from the store), sorted by id. While the store cannot be read, the ones in memory (a warning is logged).
    async fn list_procedures(&self) -> Result<Vec<ProcedureInfo>>;

    /// The epoch this manager claimed at `start`, if started.
    fn epoch(&self) -> Option<u64>;

    /// Requests the cancel of procedure `id` (a fenced write of its control key, see [`crate::control`]): a
    /// running procedure stops at once — its step in progress is interrupted at its await and the procedure goes
    /// back to its last persisted record, as after a crash (a procedure whose type has no loader finishes its step
    /// first) — and one waiting for a retry too; it rolls back if it supports rollback and ends
    /// [`crate::ProcedureState::Cancelled`]. Returns once the request is stored, not
    /// once the procedure ended (watch it for that). The default refuses: a manager without control.
    async fn cancel(&self, id: &ProcedureId) -> Result<()> {
        Err(no_control(id, "cancel"))
    }

    /// Requests a pause of `id`: its step in progress is interrupted like a cancel's (and runs again, from the last
    /// persisted record, once resumed), then it is persisted `paused` and runs no step, keeping its lock keys,
    /// until [`ProcedureManager::resume`] (or a cancel). Persisted: it stays paused across a restart.
    async fn pause(&self, id: &ProcedureId) -> Result<()> {
        Err(no_control(id, "pause"))
    }

    /// Withdraws the pause request of `id`; it continues from where it paused.
    async fn resume(&self, id: &ProcedureId) -> Result<()> {
        Err(no_control(id, "resume"))
    }

    /// Pauses every procedure of the store (running ones interrupted in their step, as by
    /// [`ProcedureManager::pause`]), in any manager on it.
    async fn pause_all(&self) -> Result<()> {
        Err(crate::Error::ManagerNotRunning {
            reason: "this procedure manager does not support pause".to_string(),
        })
    }

    /// Withdraws [`ProcedureManager::pause_all`]; procedures paused by their own request stay paused.
    async fn resume_all(&self) -> Result<()> {
        Err(crate::Error::ManagerNotRunning {
            reason: "this procedure manager does not support resume".to_string(),
        })
    }
}

fn no_control(id: &ProcedureId, action: &'static str) -> crate::Error {
    crate::Error::ControlRefused {
        action,
        id: id.clone(),
        reason: "this procedure manager does not support it".to_string(),
    }
}

/// Shared handle to a manager.
pub type ProcedureManagerRef = Arc<dyn ProcedureManager>;

/// The one implementation of [`ProcedureManager`]: procedures run as tasks of the current tokio runtime.
pub struct LocalManager {
    inner: Arc<local::Inner>,
}

impl LocalManager {
    /// A manager over `store`. Call [`ProcedureManager::start`] before submitting.
    pub fn new(store: Arc<dyn StateStore>, config: ManagerConfig) -> Self {
        LocalManager {
            inner: local::Inner::new(store, config, None),
        }
    }

    /// A manager whose procedures report their side-effect points to `hook` (the crash harness uses this).
    pub fn with_side_effect_hook(
        store: Arc<dyn StateStore>,
        config: ManagerConfig,
        hook: Arc<dyn SideEffectHook>,
    ) -> Self {
        LocalManager {
            inner: local::Inner::new(store, config, Some(hook)),
        }
    }
}

impl LocalManager {
    /// Tells `observer` of every step this manager's procedures finish and every retry they schedule, from now on
    /// (replacing an observer set before). Without one, nothing is reported.
    pub fn set_observer(&self, observer: crate::ProcedureObserverRef) {
        self.inner.set_observer(observer);
    }

    /// The lock keys `id` holds, or, while it waits for them, the key it waits for and a procedure in its way.
    /// `None` when it neither holds nor waits for a key (not started yet, holding no key, or finished).
    pub fn procedure_locks(&self, id: &ProcedureId) -> Option<ProcedureLocks> {
        self.inner.locks.procedure_locks(id)
    }

    /// [`LocalManager::procedure_locks`] of every procedure that holds or waits for a key, sorted by id.
    pub fn locks(&self) -> Vec<ProcedureLocks> {
        self.inner.locks.all()
    }

    /// How many procedures stalled in this manager since it was made: a state write refused for good, a recovered
    /// record whose type has no loader, a subprocedure that cannot be recovered, a panic (see
    /// [`crate::ProcedureState::Stalled`]). A counter: it only grows, restarts of the manager included.
    pub fn stalled_count(&self) -> u64 {
        self.inner
            .stalled_total
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many procedures this manager ended as failed (their `failed` record written), plus the records it showed
    /// as failed on recovery because no manager can read them, since it was made. A counter, like
    /// [`LocalManager::stalled_count`].
    pub fn failed_count(&self) -> u64 {
        self.inner
            .failed_total
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many waiters for lock keys have been woken since the manager was made: a release wakes only the waiters
    /// of the released keys that it lets in.
    pub fn lock_wakeups(&self) -> u64 {
        self.inner.locks.wakeups()
    }
}

pub use lock::{HeldKey, LockWait, ProcedureLocks};

mod control;
pub(crate) mod live;
mod local;
mod lock;
mod retention;
mod runner;
