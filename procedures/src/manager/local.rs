//! The local manager's shared state and its lifecycle: the epoch, the known procedures and their watch channels, the
//! admission semaphore, the lock table; halting, stopping and forgetting; and the public [`ProcedureManager`] API.
//!
//! The rest of the manager lives beside it: `store_io` (epoch-fenced writes with the store retry policy, reads, the
//! epoch claim), `recovery` (`start`: claim, read every record, resume) and `submission` (new procedures and ids
//! sent again).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use async_trait::async_trait;
use tokio::sync::{Semaphore, watch};

use crate::config::ManagerConfig;
use crate::control::{ControlOp, ControlRequests};
use crate::error::{Error, Result};
use crate::event::{EventKind, push_event};
use crate::manager::live::{HistoryRoom, LiveHandle};
use crate::manager::lock::{LockTable, ProcedureLocks};
use crate::manager::{LocalManager, ProcedureManager};
use crate::procedure::{BoxedProcedureLoader, ProcedureId, ProcedureWithId, SideEffectHook};
use crate::record::{ProcedureInfo, ProcedureState, now_ms};
use crate::store::StateStore;
use crate::watcher::Watcher;

mod recovery;
mod store_io;
mod submission;
mod tasks;

pub(crate) use store_io::{backoff, parse_epoch};
pub(crate) use submission::NewProcedure;
use submission::with_locks;

/// Where the manager is in its life.
#[derive(Clone, Debug)]
pub(crate) enum Phase {
    /// `start` not called (or it failed: it may be called again).
    New,
    /// `start` is claiming the epoch and loading the records; a second `start` is refused at once (were it to claim
    /// an epoch too, it would fence the first).
    Starting,
    /// Running procedures.
    Running,
    /// Stopped: by `stop`, by a newer manager's epoch, or by a fatal error. No more writes. A later `start` waits
    /// for every task of this run to end, forgets its state and starts afresh with a new epoch.
    Halted(HaltReason),
}

/// Why a manager halted.
#[derive(Clone, Debug)]
pub(crate) enum HaltReason {
    Stopped,
    Fenced { epoch: u64, own: u64 },
    Fatal(String),
}

impl HaltReason {
    fn error(&self) -> Error {
        match self {
            HaltReason::Stopped => Error::ManagerNotRunning {
                reason: "the manager was stopped".to_string(),
            },
            HaltReason::Fenced { epoch, own } => Error::Fenced {
                epoch: *epoch,
                own: *own,
            },
            HaltReason::Fatal(text) => Error::ManagerNotRunning {
                reason: format!("the manager halted: {text}"),
            },
        }
    }
}

/// What the manager knows of one procedure.
pub(crate) struct Entry {
    /// The latest information published through the entry: for a procedure a runner of this manager runs (`live`
    /// set), the one it was submitted or recovered with, its finished state, or the one its channel was closed
    /// with; what it shows in between is `live`'s. For any other procedure, what it shows.
    pub(crate) info: Arc<ProcedureInfo>,
    /// The channel watchers follow, carrying the same shared information as `info`; `None` once no more updates
    /// will come from this manager. Only a finished state or a closed channel is sent: the watchers wait for one of
    /// those, and read anything else from `live`.
    pub(crate) tx: Option<watch::Sender<Arc<ProcedureInfo>>>,
    /// The root id of the procedure's tree (its own id for a root).
    pub(crate) root: ProcedureId,
    /// The record could not be recovered: shown as failed, but its record is left as it is in the store.
    pub(crate) unrecoverable: bool,
    /// What a procedure this manager runs shows, updated in place by its runner (see [`LiveHandle`]), until it
    /// finishes. `None` for a procedure only loaded (finished, or unrecoverable) and once finished: `info` then
    /// holds everything, its history included.
    pub(crate) live: Option<LiveHandle>,
}

impl Entry {
    /// The entry of a procedure this manager shows only (finished, or unrecoverable): `info` keeps its history.
    fn new(info: ProcedureInfo, root: ProcedureId) -> Self {
        let info = Arc::new(info);
        let (tx, _) = watch::channel(Arc::clone(&info));
        Entry {
            info,
            tx: Some(tx),
            root,
            unrecoverable: false,
            live: None,
        }
    }

    /// The entry of a procedure a runner of this manager will run: what it shows, its history included, moves to
    /// a live state the runner takes over ([`Entry::live`]).
    pub(crate) fn to_run(mut info: ProcedureInfo, root: ProcedureId, room: &HistoryRoom) -> Self {
        // The entry's copy is made without the history (set aside, not copied and dropped).
        let events = std::mem::take(&mut info.events);
        let mut entry = Entry::new(info.clone(), root);
        info.events = events;
        entry.live = Some(LiveHandle::with_room(info, room));
        entry
    }

    /// Its state as shown now.
    pub(crate) fn state(&self) -> ProcedureState {
        match &self.live {
            Some(live) => live.lock().shown.state,
            None => self.info.state,
        }
    }

    /// Adds an event to the history the procedure shows: the live one when a runner keeps it, else `info`'s (a
    /// copy of the published information, for the caller to publish). `once`: not when an equal one is there.
    pub(crate) fn add_event(&self, info: &mut ProcedureInfo, kind: EventKind, once: bool) {
        match &self.live {
            Some(live) if once => {
                live.push_once(kind);
            }
            Some(live) => live.push(kind),
            None => {
                if !(once && info.events.iter().any(|e| e.kind == kind)) {
                    push_event(&mut info.events, now_ms(), kind);
                }
            }
        }
    }

    /// Records new information (from outside the runner, or a finished state) and tells the watchers.
    pub(crate) fn publish(&mut self, info: ProcedureInfo) {
        drop(self.publish_shared(Arc::new(info)));
    }

    /// [`Entry::publish`] of information the caller wrapped before it took the manager's state lock. Returns what
    /// it replaced, for the caller to drop after the lock.
    ///
    /// An unfinished state of a procedure with a live state is shown through it ([`crate::manager::live::Live::show`],
    /// its history left aside); nothing is sent. Any other unfinished state replaces the channel's value without
    /// waking the watchers: a watcher waits for the end ([`Watcher::wait`]) or reads the latest
    /// ([`Watcher::info`]), so waking its task at every change would be a thread wake-up for nothing. (A closed
    /// channel wakes them: see [`Entry::close`].)
    ///
    /// A finished state is the last word on a procedure, so its channel is dropped once it is sent: the watchers
    /// it woke read it from their receivers, and later ones get a channel of their own that already holds it (see
    /// [`Entry::watcher`]). A finished procedure stays in memory for `finished_in_memory` (ten minutes by
    /// default); its channel's shared state (the value's lock and the receivers' notifiers) would stay with it.
    pub(crate) fn publish_shared(
        &mut self,
        info: Arc<ProcedureInfo>,
    ) -> (Arc<ProcedureInfo>, Option<Arc<ProcedureInfo>>) {
        let finished = info.state.is_finished();
        if !finished && let Some(live) = &self.live {
            live.lock().show(&info);
            return (info, None);
        }
        let sent = self.tx.as_ref().and_then(|tx| {
            let mut replaced = None;
            tx.send_if_modified(|shown| {
                replaced = Some(std::mem::replace(shown, Arc::clone(&info)));
                finished
            });
            replaced
        });
        if finished {
            self.tx = None;
            // A finished state's information carries its history: the live state is no longer read through the
            // entry (a watcher taken before may still hold it).
            self.live = None;
        }
        (std::mem::replace(&mut self.info, info), sent)
    }

    /// Records `info`, a finished state its runner publishes, as the entry's last word, and hands its watch channel
    /// to the caller to send it on **after** the manager's state lock: the send wakes the watchers, and a woken
    /// submitter's next call takes that lock at once (it would wait for it, a second thread hand-off per procedure,
    /// were it still held). Until the send, a watcher of the channel reads the finished state from the live state
    /// (see [`Watcher::info`]); a watcher taken meanwhile gets a channel of its own that already holds `info`.
    /// Returns the information it replaced (to drop after the lock) and the channel.
    pub(crate) fn finish(
        &mut self,
        info: Arc<ProcedureInfo>,
    ) -> (
        Arc<ProcedureInfo>,
        Option<watch::Sender<Arc<ProcedureInfo>>>,
    ) {
        self.live = None;
        (std::mem::replace(&mut self.info, info), self.tx.take())
    }

    /// A copy of the latest information with its history (the live one while a runner keeps it), to show, or to
    /// change and publish.
    pub(crate) fn info_copy(&self) -> ProcedureInfo {
        match &self.live {
            Some(live) => live.info(),
            None => ProcedureInfo::clone(&self.info),
        }
    }

    /// Publishes `info` as the last word of this manager on the procedure: it is sent to the watchers whatever its
    /// state, and watchers of an unfinished procedure then resolve with [`Error::ManagerNotRunning`] (or
    /// [`Error::ProcedureStalled`]).
    pub(crate) fn close(&mut self, info: ProcedureInfo) {
        let finished = info.state.is_finished();
        if !finished && let Some(live) = &self.live {
            live.lock().show(&info);
        }
        let info = Arc::new(info);
        if let Some(tx) = self.tx.take() {
            tx.send_replace(Arc::clone(&info));
        }
        if finished {
            self.live = None;
        }
        self.info = info;
    }

    /// A watcher; for a closed channel, one that resolves at once from the last information.
    pub(crate) fn watcher(&self) -> Watcher {
        let watcher = match &self.tx {
            Some(tx) => Watcher::new(self.info.id.clone(), tx.subscribe()),
            None => {
                let (_, rx) = watch::channel(Arc::clone(&self.info));
                Watcher::new(self.info.id.clone(), rx)
            }
        };
        match &self.live {
            Some(live) => watcher.with_live(live.clone()),
            None => watcher,
        }
    }
}

/// The control requests locked to be changed; dropping it notes whether any request is in force.
pub(crate) struct ControlsGuard<'a> {
    requests: MutexGuard<'a, ControlRequests>,
    any: &'a AtomicBool,
}

impl std::ops::Deref for ControlsGuard<'_> {
    type Target = ControlRequests;

    fn deref(&self) -> &ControlRequests {
        &self.requests
    }
}

impl std::ops::DerefMut for ControlsGuard<'_> {
    fn deref_mut(&mut self) -> &mut ControlRequests {
        &mut self.requests
    }
}

impl ControlsGuard<'_> {
    /// Notes now whether any request is in force (the guard notes it again when it goes): for a change that
    /// publishes something else after it under the same lock, which a reader may act on before the guard goes.
    pub(crate) fn note(&self) {
        let any = self.requests.all_paused || !self.requests.procedures.is_empty();
        self.any.store(any, Ordering::Release);
    }
}

impl Drop for ControlsGuard<'_> {
    fn drop(&mut self) {
        // Noted before the lock is released, so a reader that finds the flag clear read it after the last change
        // that cleared the requests, or before a change that a later read sees.
        self.note();
    }
}

pub(crate) struct State {
    pub(crate) phase: Phase,
    pub(crate) epoch: Option<u64>,
    /// Keyed by a hash of the id: every publication looks its entry up, and nothing needs them in id order (a
    /// listing sorts what it copies out).
    pub(crate) procedures: HashMap<ProcedureId, Entry>,
}

impl Inner {
    /// Whether the manager's state lock is free now (a `try_lock`: also answers on the thread that holds it).
    #[cfg(test)]
    pub(crate) fn state_lock_free(&self) -> bool {
        self.state.try_lock().is_ok()
    }
}

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn StateStore>,
    pub(crate) config: ManagerConfig,
    pub(crate) hook: Option<Arc<dyn SideEffectHook>>,
    loaders: RwLock<HashMap<String, BoxedProcedureLoader>>,
    state: Mutex<State>,
    /// Set once the manager halts; runners check it before every step and every write.
    halted: Arc<AtomicBool>,
    /// What a step's context asks to learn whether the manager halted: made once, shared by every runner.
    pub(crate) halted_probe: crate::procedure::HaltedFn,
    /// The room a new procedure's history starts with (see [`HistoryRoom`]).
    pub(crate) history_room: HistoryRoom,
    /// Every task this manager spawned and not yet reaped (see `tasks`).
    pub(crate) tasks: tasks::Tasks,
    /// The epoch of the run while it is running (set with `Phase::Running`, cleared when it halts), 0 otherwise:
    /// what a submission checks first, without the state lock (which it takes later all the same, and where it
    /// finds a halt that came in between).
    running: AtomicU64,
    /// The admission slots of the current run (closed when it halts; a new run gets new ones).
    admission: Mutex<Arc<Semaphore>>,
    pub(crate) locks: Arc<LockTable>,
    /// Procedures that stalled in this manager since it was made (a recovered record without a loader included).
    pub(crate) stalled_total: AtomicU64,
    /// Procedures this manager ended as failed, and records it showed as failed on recovery, since it was made.
    pub(crate) failed_total: AtomicU64,
    /// Serialises `start` and `stop`: a `stop` returns only once every task is gone, also when another `stop` or a
    /// restarting `start` took the tasks first.
    lifecycle: tokio::sync::Mutex<()>,
    /// The control requests (cancel, pause) as last read from the store or made by this manager.
    controls: Mutex<ControlRequests>,
    /// Whether `controls` holds any request, noted under its lock at each change: a step boundary with none in force
    /// (the usual case) reads this flag instead of taking the lock every runner would take.
    any_control: AtomicBool,
    /// Bumped whenever `controls` changes: runners waiting for a resume, a retry or a lock watch it.
    pub(crate) control_changed: watch::Sender<u64>,
    /// The step boundaries' shared reads of the control keys.
    pub(crate) boundary_scans: crate::manager::control::BoundaryScans,
    /// The store's count of changes to the control keys, when it keeps one ([`StateStore::counts_changes`]).
    pub(crate) control_changes: Option<Arc<AtomicU64>>,
    /// One more than the count `control_changes` had when the read of the control keys in force began (0: none):
    /// while the count has not moved past it, what is in force is what the keys hold.
    pub(crate) controls_read: AtomicU64,
    /// This manager's own changes of its requests, counted (see [`crate::manager::control::LocalControlChanges`]).
    pub(crate) local_control_changes: crate::manager::control::LocalControlChanges,
    /// Told of finished steps and retries (see [`crate::ProcedureObserver`]), once one is set.
    observer: RwLock<Option<crate::ProcedureObserverRef>>,
    /// Set once an observer is set: until then `observer` is not read.
    has_observer: AtomicBool,
    /// Set once a finished procedure is known only to the store (it left memory, or `start` did not load it): only
    /// then does a listing read the store too.
    pub(crate) finished_only_in_store: AtomicBool,
}

impl Inner {
    pub(crate) fn new(
        store: Arc<dyn StateStore>,
        config: ManagerConfig,
        hook: Option<Arc<dyn SideEffectHook>>,
    ) -> Arc<Self> {
        let slots = config.max_running_procedures.max(1);
        let halted = Arc::new(AtomicBool::new(false));
        let probed = Arc::clone(&halted);
        Arc::new(Inner {
            halted_probe: Arc::new(move || probed.load(Ordering::Acquire)),
            control_changes: store.counts_changes(crate::control::CONTROL_PREFIX),
            store,
            config,
            hook,
            loaders: RwLock::new(HashMap::new()),
            state: Mutex::new(State {
                phase: Phase::New,
                epoch: None,
                procedures: HashMap::new(),
            }),
            halted,
            history_room: HistoryRoom::default(),
            tasks: tasks::Tasks::default(),
            running: AtomicU64::new(0),
            admission: Mutex::new(Arc::new(Semaphore::new(slots))),
            locks: LockTable::new(),
            stalled_total: AtomicU64::new(0),
            failed_total: AtomicU64::new(0),
            lifecycle: tokio::sync::Mutex::new(()),
            controls: Mutex::new(ControlRequests::default()),
            any_control: AtomicBool::new(false),
            control_changed: watch::channel(0).0,
            boundary_scans: Default::default(),
            controls_read: AtomicU64::new(0),
            local_control_changes: Default::default(),
            observer: RwLock::new(None),
            has_observer: AtomicBool::new(false),
            finished_only_in_store: AtomicBool::new(false),
        })
    }

    /// Makes `observer` the one told of finished steps and retries from now on.
    pub(crate) fn set_observer(&self, observer: crate::ProcedureObserverRef) {
        *self.observer.write().unwrap_or_else(|p| p.into_inner()) = Some(observer);
        self.has_observer.store(true, Ordering::Release);
    }

    /// The observer, if one is set. Every finished step asks: without an observer, the answer is a load of a flag
    /// no runner writes, not a read lock whose count every runner's thread would change.
    pub(crate) fn observer(&self) -> Option<crate::ProcedureObserverRef> {
        if !self.has_observer.load(Ordering::Acquire) {
            return None;
        }
        self.observer
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The control requests as this manager knows them, to change: when the guard goes, whether any request is in
    /// force is noted for [`Inner::control_of`].
    pub(crate) fn controls(&self) -> ControlsGuard<'_> {
        ControlsGuard {
            requests: self.controls_locked(),
            any: &self.any_control,
        }
    }

    /// The control requests, locked, to read.
    pub(crate) fn controls_locked(&self) -> MutexGuard<'_, ControlRequests> {
        // Changes under this lock are a map insert/remove or a whole replacement: they cannot panic half-way.
        self.controls.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether any control request is in force (a procedure's own, or every procedure's pause), as last noted.
    pub(crate) fn any_control(&self) -> bool {
        self.any_control.load(Ordering::Acquire)
    }

    /// The admission slots of the current run.
    pub(crate) fn admission(&self) -> Arc<Semaphore> {
        Arc::clone(&self.admission.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        // Every change under this lock is a few map operations that cannot panic half-way.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn is_halted(&self) -> bool {
        self.halted.load(Ordering::Acquire)
    }

    /// Notes that the run of `epoch` is running; called under the state lock, as its phase becomes `Running`.
    pub(crate) fn note_running(&self, epoch: u64) {
        self.running.store(epoch, Ordering::Release);
    }

    /// The claimed epoch; an error when the manager is not running.
    pub(crate) fn running_epoch(&self) -> Result<u64> {
        let running = self.running.load(Ordering::Acquire);
        if running != 0 && !self.is_halted() {
            return Ok(running);
        }
        let state = self.state();
        match (&state.phase, state.epoch) {
            (Phase::Running, Some(epoch)) => Ok(epoch),
            (Phase::Halted(reason), _) => Err(reason.error()),
            _ => Err(Error::ManagerNotRunning {
                reason: "the manager has not been started".to_string(),
            }),
        }
    }

    /// Stops the manager for good: no runner makes another write, every task ends, and the watchers of unfinished
    /// procedures resolve with [`Error::ManagerNotRunning`]. The in-memory state of every procedure stays at its last
    /// persisted step. Only the first call has an effect.
    pub(crate) fn halt(&self, reason: HaltReason) {
        let mut state = self.state();
        if matches!(state.phase, Phase::Halted(_)) {
            return;
        }
        match &reason {
            HaltReason::Stopped => tracing::info!("procedure manager stopped"),
            HaltReason::Fenced { epoch, own } => {
                tracing::warn!(epoch, own, "procedure manager fenced by a newer epoch")
            }
            HaltReason::Fatal(text) => tracing::warn!(error = %text, "procedure manager halted"),
        }
        let fenced_by = match &reason {
            HaltReason::Fenced { epoch, .. } => Some(*epoch),
            _ => None,
        };
        state.phase = Phase::Halted(reason);
        self.halted.store(true, Ordering::Release);
        self.running.store(0, Ordering::Release);
        self.admission().close();
        self.tasks.close();
        for entry in state.procedures.values_mut() {
            if !entry.state().is_finished() {
                let mut info = entry.info_copy();
                // `retrying` is never persisted: the last persisted state of a retrying procedure is `running`.
                if info.state == ProcedureState::Retrying {
                    info.state = ProcedureState::Running;
                }
                // The fence in each unfinished procedure's history (in memory; a runner that met it noted it).
                if let Some(epoch) = fenced_by {
                    entry.add_event(&mut info, EventKind::Fenced { epoch }, true);
                }
                if entry.live.is_some() {
                    // The history is the live state's (the fence just added included).
                    info.events = Vec::new();
                }
                entry.close(info);
            }
        }
    }

    /// `stop`: halts, then returns once every task this manager spawned has ended (aborted tasks included: their
    /// futures are dropped, so nothing of the manager, its store included, is held by a task afterwards).
    pub(crate) async fn stop(&self) {
        let _lifecycle = self.lifecycle.lock().await;
        self.halt(HaltReason::Stopped);
        self.drain().await;
        // The tasks are gone, so are the callers of writes still queued in the store: those are dropped, the
        // batches in flight are answered, and only then has the manager stopped.
        self.store.quiesce().await;
    }

    /// Awaits every task of a halted manager.
    async fn drain(&self) {
        self.tasks.drain().await;
    }

    /// Makes a halted manager new again, once its tasks are gone: forgets every procedure (their watchers resolved
    /// when it halted), opens new admission slots and clears the halt flag. The next run claims its own epoch and
    /// loads everything from the store.
    async fn reset(&self) {
        self.drain().await;
        let mut state = self.state();
        state.procedures.clear();
        state.epoch = None;
        state.phase = Phase::New;
        let slots = self.config.max_running_procedures.max(1);
        *self.admission.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(Semaphore::new(slots));
        self.halted.store(false, Ordering::Release);
    }

    /// Halts because of a fatal error (fenced, crashed).
    pub(crate) fn halt_on(&self, error: &Error) {
        let reason = match error {
            Error::Fenced { epoch, own } => HaltReason::Fenced {
                epoch: *epoch,
                own: *own,
            },
            other => HaltReason::Fatal(other.to_string()),
        };
        self.halt(reason);
    }

    /// Forgets procedure `id` (its record is gone: it refused its request), resolving its watchers with `info`.
    pub(crate) fn forget(&self, id: &ProcedureId, info: ProcedureInfo) {
        let entry = self.state().procedures.remove(id);
        if let Some(mut entry) = entry {
            entry.close(info);
        }
    }

    /// Runs `f` on the entry of `id`, if known.
    pub(crate) fn with_entry<T>(
        &self,
        id: &ProcedureId,
        f: impl FnOnce(&mut Entry) -> T,
    ) -> Option<T> {
        self.state().procedures.get_mut(id).map(f)
    }

    pub(crate) fn halt_error(&self) -> Error {
        match &self.state().phase {
            Phase::Halted(reason) => reason.error(),
            _ => Error::ManagerNotRunning {
                reason: "the manager is not running".to_string(),
            },
        }
    }
}

#[async_trait]
impl ProcedureManager for LocalManager {
    fn register_loader(&self, type_name: &str, loader: BoxedProcedureLoader) -> Result<()> {
        self.inner.register_loader(type_name, loader)
    }

    async fn start(&self) -> Result<()> {
        self.inner.start().await
    }

    async fn stop(&self) -> Result<()> {
        self.inner.stop().await;
        Ok(())
    }

    async fn submit(&self, procedure: ProcedureWithId) -> Result<Watcher> {
        self.inner.submit_root(procedure).await
    }

    async fn submit_again_if_rolled_back(&self, procedure: ProcedureWithId) -> Result<Watcher> {
        self.inner.submit_again(procedure).await
    }

    async fn watch(&self, id: &ProcedureId) -> Result<Option<Watcher>> {
        let known = self.inner.state().procedures.get(id).map(Entry::watcher);
        if known.is_some() {
            return Ok(known);
        }
        // A finished procedure that left memory: a watcher that resolves at once from its record.
        Ok(self.inner.stored_finished(id).await?.map(|info| {
            let (_, rx) = watch::channel(Arc::new(info));
            Watcher::new(id.clone(), rx)
        }))
    }

    async fn procedure_state(&self, id: &ProcedureId) -> Result<Option<ProcedureInfo>> {
        let info = self.inner.state().procedures.get(id).map(Entry::info_copy);
        let Some(mut info) = info else {
            return self.inner.stored_finished(id).await;
        };
        if let Some(locks) = self.inner.locks.procedure_locks(id) {
            with_locks(&mut info, locks);
        }
        Ok(Some(info))
    }

    async fn list_procedures(&self) -> Result<Vec<ProcedureInfo>> {
        let mut known: BTreeMap<ProcedureId, ProcedureInfo> = self
            .inner
            .state()
            .procedures
            .iter()
            .map(|(id, e)| (id.clone(), e.info_copy()))
            .collect();
        let mut locks: HashMap<ProcedureId, ProcedureLocks> = self
            .inner
            .locks
            .all()
            .into_iter()
            .map(|l| (l.id.clone(), l))
            .collect();
        for info in known.values_mut() {
            if let Some(l) = locks.remove(&info.id) {
                with_locks(info, l);
            }
        }
        // Finished procedures that left memory are read from the store. While the store cannot be read, the list
        // still shows what this manager holds (an outage is when an operator most needs to see it), with a warning.
        if self.inner.finished_only_in_store.load(Ordering::SeqCst) {
            match self.inner.stored_finished_except(&known).await {
                Ok(stored) => known.extend(stored.into_iter().map(|info| (info.id.clone(), info))),
                Err(e) => tracing::warn!(
                    error = %e,
                    "listing procedures: the finished ones that left memory cannot be read from the store now; \
                     listing those in memory"
                ),
            }
        }
        Ok(known.into_values().collect())
    }

    fn epoch(&self) -> Option<u64> {
        self.inner.state().epoch
    }

    async fn cancel(&self, id: &ProcedureId) -> Result<()> {
        self.inner.control(id, ControlOp::Cancel).await
    }

    async fn pause(&self, id: &ProcedureId) -> Result<()> {
        self.inner.control(id, ControlOp::Pause).await
    }

    async fn resume(&self, id: &ProcedureId) -> Result<()> {
        self.inner.control(id, ControlOp::Resume).await
    }

    async fn pause_all(&self) -> Result<()> {
        self.inner.control_all(true).await
    }

    async fn resume_all(&self) -> Result<()> {
        self.inner.control_all(false).await
    }
}

impl Drop for LocalManager {
    fn drop(&mut self) {
        // Tasks hold the shared state; without a handle nobody could stop them.
        self.inner.halt(HaltReason::Stopped);
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Poll, Wake, Waker};

    use super::Inner;
    use crate::procedure::{Context, LockKey, Procedure, Status};
    use crate::testing::Steps;
    use crate::{
        LocalManager, ManagerConfig, MemoryStateStore, ProcedureId, ProcedureManager,
        ProcedureState, ProcedureWithId,
    };

    /// Waits at its one step for a permit of `gate`, then finishes.
    struct Gated {
        gate: Arc<tokio::sync::Semaphore>,
        keys: LockKey,
    }

    #[async_trait::async_trait]
    impl Procedure for Gated {
        fn type_name(&self) -> &str {
            "gated"
        }

        async fn execute(&mut self, _ctx: &Context) -> crate::Result<Status> {
            self.gate
                .acquire()
                .await
                .map_err(|e| crate::Error::ManagerNotRunning {
                    reason: e.to_string(),
                })?
                .forget();
            Ok(Status::done())
        }

        fn dump(&self) -> crate::Result<serde_json::Value> {
            Ok(serde_json::json!({}))
        }

        fn lock_key(&self) -> LockKey {
            self.keys.clone()
        }
    }

    /// A waker that notes, when it is woken, what the runner still held at that moment: the manager's state lock,
    /// a request in the lock table, an admission slot.
    struct LockProbe {
        inner: Arc<Inner>,
        woken: AtomicUsize,
        woken_under_lock: AtomicUsize,
        woken_holding_keys: AtomicUsize,
        woken_holding_a_slot: AtomicUsize,
    }

    impl Wake for LockProbe {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }

        fn wake_by_ref(self: &Arc<Self>) {
            self.woken.fetch_add(1, Ordering::SeqCst);
            if !self.inner.state_lock_free() {
                self.woken_under_lock.fetch_add(1, Ordering::SeqCst);
            }
            if self.inner.locks.requests_held() > 0 {
                self.woken_holding_keys.fetch_add(1, Ordering::SeqCst);
            }
            let slots = self.inner.config.max_running_procedures.max(1);
            if self.inner.admission().available_permits() < slots {
                self.woken_holding_a_slot.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// A watcher is woken by its procedure's end once the runner let go of everything: the manager's state lock,
    /// its keys, its admission slot. The woken task is often a submitter about to submit the next procedure: it
    /// takes the state lock first thing (and would wait for it on another thread), and its runner needs a worker
    /// thread, which the ending runner would still occupy.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_watcher_is_woken_by_the_end_once_the_runner_let_go_of_everything() {
        let manager =
            LocalManager::new(Arc::new(MemoryStateStore::new()), ManagerConfig::default());
        manager.start().await.unwrap();
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let id = ProcedureId::new("gated");
        let watcher = manager
            .submit(ProcedureWithId::new(
                id.clone(),
                Box::new(Gated {
                    gate: Arc::clone(&gate),
                    keys: LockKey::exclusive("k"),
                }),
            ))
            .await
            .unwrap();
        let probe = Arc::new(LockProbe {
            inner: Arc::clone(&manager.inner),
            woken: AtomicUsize::new(0),
            woken_under_lock: AtomicUsize::new(0),
            woken_holding_keys: AtomicUsize::new(0),
            woken_holding_a_slot: AtomicUsize::new(0),
        });
        let waker = Waker::from(Arc::clone(&probe));
        let mut watched = watcher.clone();
        let mut wait = Box::pin(watched.wait());
        assert!(
            wait.as_mut()
                .poll(&mut std::task::Context::from_waker(&waker))
                .is_pending(),
            "the procedure ended before its gate was opened"
        );
        // Taken now: asking the manager for a watcher after the gate opens would take the state lock while the
        // runner ends.
        let mut end = watcher.clone();
        gate.add_permits(1);
        end.wait().await.unwrap();
        // The send wakes both watchers, `end`'s task first perhaps: the probe's wake may still be on its way.
        while probe.woken.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            probe.woken.load(Ordering::SeqCst),
            1,
            "the end woke the watcher once"
        );
        for (count, held) in [
            (&probe.woken_under_lock, "the manager's state lock was held"),
            (&probe.woken_holding_keys, "the runner held its keys"),
            (
                &probe.woken_holding_a_slot,
                "the runner held its admission slot",
            ),
        ] {
            assert_eq!(
                count.load(Ordering::SeqCst),
                0,
                "the watcher was woken while {held}"
            );
        }
        assert!(matches!(
            wait.as_mut()
                .poll(&mut std::task::Context::from_waker(&waker)),
            Poll::Ready(Ok(_))
        ));
        manager.stop().await.unwrap();
    }

    /// A procedure that takes no key stays out of the lock table, while one that takes a key is in it until it ends.
    #[tokio::test]
    async fn a_procedure_without_keys_never_enters_the_lock_table() {
        let manager =
            LocalManager::new(Arc::new(MemoryStateStore::new()), ManagerConfig::default());
        manager.start().await.unwrap();
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let mut watchers = Vec::new();
        for (id, keys) in [
            ("keyless", LockKey::none()),
            ("keyed", LockKey::exclusive("k")),
        ] {
            let procedure = Box::new(Gated {
                gate: Arc::clone(&gate),
                keys,
            });
            watchers.push(
                manager
                    .submit(ProcedureWithId::new(ProcedureId::new(id), procedure))
                    .await
                    .unwrap(),
            );
        }
        // Both reach their step (and wait at the gate) once each shows its step started.
        for id in ["keyless", "keyed"] {
            let id = ProcedureId::new(id);
            while manager
                .procedure_state(&id)
                .await
                .unwrap()
                .is_none_or(|info| info.step_started_at_ms.is_none())
            {
                tokio::task::yield_now().await;
            }
        }
        assert_eq!(
            manager.inner.locks.requests_held(),
            1,
            "only the procedure that takes a key is in the lock table"
        );
        gate.add_permits(2);
        for mut watcher in watchers {
            watcher.wait().await.unwrap();
        }
        assert_eq!(manager.inner.locks.requests_held(), 0);
        manager.stop().await.unwrap();
    }

    /// A finished procedure keeps no watch channel in memory, and both the watcher taken while it ran and one
    /// taken afterwards resolve with its end.
    #[tokio::test]
    async fn a_finished_procedure_drops_its_channel_and_its_watchers_still_resolve() {
        let manager =
            LocalManager::new(Arc::new(MemoryStateStore::new()), ManagerConfig::default());
        manager.start().await.unwrap();
        let id = ProcedureId::new("finishes");
        let mut early = manager
            .submit(ProcedureWithId::new(
                id.clone(),
                Box::new(Steps::new(3, true)),
            ))
            .await
            .unwrap();
        early.wait().await.unwrap();
        {
            let state = manager.inner.state();
            let entry = state.procedures.get(&id).unwrap();
            assert_eq!(entry.info.state, ProcedureState::Done);
            assert!(
                entry.tx.is_none(),
                "the finished procedure still holds its channel"
            );
        }
        let mut late = manager.watch(&id).await.unwrap().unwrap();
        late.wait().await.unwrap();
        assert_eq!(late.info().state, ProcedureState::Done);
        manager.stop().await.unwrap();
    }
}
