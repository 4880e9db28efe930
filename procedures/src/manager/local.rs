//! The local manager's shared state: the epoch, the known procedures and their watch channels, the admission
//! semaphore, the lock table; plus `start` (claim the epoch, recover), `submit`, and halting.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use async_trait::async_trait;
use backon::{BackoffBuilder, ExponentialBuilder};
use tokio::sync::{Semaphore, oneshot, watch};
use tokio::task::JoinSet;

use crate::config::{ManagerConfig, RetryPolicy};
use crate::control::{ControlOp, ControlRequests};
use crate::error::{Error, Result};
use crate::event::{EventKind, push_event, truncate_text};
use crate::manager::lock::{LockTable, ProcedureLocks};
use crate::manager::runner::{Resume, Runner};
use crate::manager::{LocalManager, ProcedureManager, control, retention};
use crate::procedure::{
    BoxedProcedure, BoxedProcedureLoader, ProcedureId, ProcedureWithId, SideEffectHook,
};
use crate::record::{
    EPOCH_KEY, ProcedureInfo, ProcedureRecord, ProcedureState, RECORD_FORMAT_VERSION,
    RECORD_PREFIX, declared_keys, now_ms, record_key,
};
use crate::step_writes::StepWrites;
use crate::store::{Condition, StateStore, WriteOp, WriteOutcome};
use crate::watcher::Watcher;

/// How many times `start` re-reads the epoch when another manager claims it at the same moment.
const EPOCH_CLAIM_ATTEMPTS: usize = 5;
/// Records read per store request while recovering (`StateStore::scan_page`).
const RECOVERY_PAGE: usize = 1024;

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
    /// The latest information (also after the channel is closed).
    pub(crate) info: Arc<ProcedureInfo>,
    /// The channel watchers follow, carrying the same shared information as `info`; `None` once no more updates
    /// will come from this manager.
    pub(crate) tx: Option<watch::Sender<Arc<ProcedureInfo>>>,
    /// The root id of the procedure's tree (its own id for a root).
    pub(crate) root: ProcedureId,
    /// The record could not be recovered: shown as failed, but its record is left as it is in the store.
    pub(crate) unrecoverable: bool,
}

impl Entry {
    fn new(info: ProcedureInfo, root: ProcedureId) -> Self {
        let info = Arc::new(info);
        let (tx, _) = watch::channel(Arc::clone(&info));
        Entry {
            info,
            tx: Some(tx),
            root,
            unrecoverable: false,
        }
    }

    /// Records new information and tells the watchers.
    pub(crate) fn publish(&mut self, info: ProcedureInfo) {
        drop(self.publish_shared(Arc::new(info)));
    }

    /// [`Entry::publish`] of information the caller wrapped before it took the manager's state lock: the entry
    /// and the watchers share it. Returns what it replaced, for the caller to drop after the lock.
    ///
    /// The watchers read the new information at once, but only a finished state wakes them: a watcher waits for
    /// the end ([`Watcher::wait`]) or reads the latest ([`Watcher::info`]), so waking its task at every step
    /// would be a thread wake-up for nothing. (A closed channel wakes them too: see [`Entry::close`].)
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
        }
        (std::mem::replace(&mut self.info, info), sent)
    }

    /// A copy of the latest information, to change and publish.
    pub(crate) fn info_copy(&self) -> ProcedureInfo {
        ProcedureInfo::clone(&self.info)
    }

    /// Publishes `info` as the last word of this manager on the procedure: watchers of an unfinished procedure then
    /// resolve with [`Error::ManagerNotRunning`].
    pub(crate) fn close(&mut self, info: ProcedureInfo) {
        self.publish(info);
        self.tx = None;
    }

    /// A watcher; for a closed channel, one that resolves at once from the last information.
    pub(crate) fn watcher(&self) -> Watcher {
        match &self.tx {
            Some(tx) => Watcher::new(self.info.id.clone(), tx.subscribe()),
            None => {
                let (_, rx) = watch::channel(Arc::clone(&self.info));
                Watcher::new(self.info.id.clone(), rx)
            }
        }
    }
}

pub(crate) struct State {
    pub(crate) phase: Phase,
    pub(crate) epoch: Option<u64>,
    /// Keyed by a hash of the id: every publication looks its entry up, and nothing needs them in id order (a
    /// listing sorts what it copies out).
    pub(crate) procedures: HashMap<ProcedureId, Entry>,
    /// Every task this manager spawned (runners, submissions, retention) and not yet reaped: `stop` aborts them and
    /// awaits each, so no task of the manager outlives it. Spawning happens only under the state lock while
    /// running, so a halted manager's set only shrinks.
    tasks: JoinSet<()>,
}

impl State {
    /// Spawns a task of this manager, reaping the ones already finished (the set would grow without bound in a
    /// long-lived manager otherwise). The set holds the only handle to a task: a finished task's memory goes when
    /// it is reaped, not when its procedure is forgotten.
    pub(crate) fn spawn(&mut self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.reap();
        self.tasks.spawn(task);
    }

    /// Frees the tasks that have ended. Every spawn does; so does the retention task at each of its rounds, so a
    /// burst's tasks do not wait for the next submission to go.
    pub(crate) fn reap(&mut self) {
        while self.tasks.try_join_next().is_some() {}
    }

    /// The tasks spawned and not reaped yet, running or ended.
    #[cfg(test)]
    pub(crate) fn tasks_held(&self) -> usize {
        self.tasks.len()
    }
}

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn StateStore>,
    pub(crate) config: ManagerConfig,
    pub(crate) hook: Option<Arc<dyn SideEffectHook>>,
    loaders: RwLock<HashMap<String, BoxedProcedureLoader>>,
    state: Mutex<State>,
    /// Set once the manager halts; runners check it before every step and every write.
    halted: AtomicBool,
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
    /// Bumped whenever `controls` changes: runners waiting for a resume, a retry or a lock watch it.
    pub(crate) control_changed: watch::Sender<u64>,
    /// The step boundaries' shared reads of the control keys.
    pub(crate) boundary_scans: crate::manager::control::BoundaryScans,
    /// This manager's own changes of its requests, counted (see [`crate::manager::control::LocalControlChanges`]).
    pub(crate) local_control_changes: crate::manager::control::LocalControlChanges,
    /// Told of finished steps and retries (see [`crate::ProcedureObserver`]), once one is set.
    observer: RwLock<Option<crate::ProcedureObserverRef>>,
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
        Arc::new(Inner {
            store,
            config,
            hook,
            loaders: RwLock::new(HashMap::new()),
            state: Mutex::new(State {
                phase: Phase::New,
                epoch: None,
                procedures: HashMap::new(),
                tasks: JoinSet::new(),
            }),
            halted: AtomicBool::new(false),
            admission: Mutex::new(Arc::new(Semaphore::new(slots))),
            locks: LockTable::new(),
            stalled_total: AtomicU64::new(0),
            failed_total: AtomicU64::new(0),
            lifecycle: tokio::sync::Mutex::new(()),
            controls: Mutex::new(ControlRequests::default()),
            control_changed: watch::channel(0).0,
            boundary_scans: Default::default(),
            local_control_changes: Default::default(),
            observer: RwLock::new(None),
            finished_only_in_store: AtomicBool::new(false),
        })
    }

    /// Makes `observer` the one told of finished steps and retries from now on.
    pub(crate) fn set_observer(&self, observer: crate::ProcedureObserverRef) {
        *self.observer.write().unwrap_or_else(|p| p.into_inner()) = Some(observer);
    }

    /// The observer, if one is set.
    pub(crate) fn observer(&self) -> Option<crate::ProcedureObserverRef> {
        self.observer
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The control requests as this manager knows them.
    pub(crate) fn controls(&self) -> MutexGuard<'_, ControlRequests> {
        // Changes under this lock are a map insert/remove or a whole replacement: they cannot panic half-way.
        self.controls.lock().unwrap_or_else(|p| p.into_inner())
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

    /// The claimed epoch; an error when the manager is not running.
    pub(crate) fn running_epoch(&self) -> Result<u64> {
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
        self.admission().close();
        state.tasks.abort_all();
        for entry in state.procedures.values_mut() {
            if !entry.info.state.is_finished() {
                let mut info = entry.info_copy();
                // `retrying` is never persisted: the last persisted state of a retrying procedure is `running`.
                if info.state == ProcedureState::Retrying {
                    info.state = ProcedureState::Running;
                }
                // The fence in each unfinished procedure's history (in memory; a runner that met it noted it).
                if let Some(epoch) = fenced_by {
                    let kind = EventKind::Fenced { epoch };
                    if !info.events.iter().any(|e| e.kind == kind) {
                        push_event(&mut info.events, now_ms(), kind);
                    }
                }
                if info != *entry.info {
                    entry.publish(info);
                }
                entry.tx = None;
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
        let mut tasks = std::mem::take(&mut self.state().tasks);
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
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

    /// One atomic write conditional on this manager's epoch (plus `conditions`), retried with the store retry
    /// policy while the store error is retryable. A refusal because the epoch moved is [`Error::Fenced`]; a
    /// refusal of one of the other `conditions` comes back as [`WriteOutcome::Rejected`].
    ///
    /// While the write is retried, the procedures in `shown` (those whose records it writes) show as `retrying`
    /// with the store's error; once the store answers, they show what they showed before (the caller then
    /// publishes the outcome). When the retries run out, the error is returned and the caller decides what shows.
    pub(crate) async fn write(
        &self,
        epoch: u64,
        conditions: Vec<Condition>,
        ops: Vec<WriteOp>,
        shown: &[ProcedureId],
    ) -> Result<WriteOutcome> {
        self.write_joined(epoch, conditions, ops, None, shown).await
    }

    /// [`Inner::write`] with a step's writes in the same commit (the store [joins](crate::StateStore::joins)
    /// them). A rejection lists the epoch, then `conditions`, then the step's conditions.
    pub(crate) async fn write_joined(
        &self,
        epoch: u64,
        conditions: Vec<Condition>,
        ops: Vec<WriteOp>,
        step: Option<&StepWrites>,
        shown: &[ProcedureId],
    ) -> Result<WriteOutcome> {
        let mut before: Option<Vec<(ProcedureId, ProcedureInfo)>> = None;
        let outcome = self
            .write_retried(epoch, conditions, ops, step, shown, &mut before)
            .await;
        if let (Ok(_), Some(before)) = (&outcome, before) {
            for (id, info) in before {
                self.with_entry(&id, |entry| entry.publish(info));
            }
        }
        outcome
    }

    async fn write_retried(
        &self,
        epoch: u64,
        conditions: Vec<Condition>,
        ops: Vec<WriteOp>,
        step: Option<&StepWrites>,
        shown: &[ProcedureId],
        before: &mut Option<Vec<(ProcedureId, ProcedureInfo)>>,
    ) -> Result<WriteOutcome> {
        let mut all = Vec::with_capacity(conditions.len() + 1);
        all.push(Condition::Equals {
            key: EPOCH_KEY.to_string(),
            value: epoch.to_string().into_bytes(),
        });
        all.extend(conditions);
        let mut backoff = backoff(&self.config.store_retry);
        loop {
            if self.is_halted() {
                return Err(self.halt_error());
            }
            let written = match step {
                Some(step) => {
                    self.store
                        .write_with_step(all.clone(), ops.clone(), step)
                        .await
                }
                None => self.store.write(all.clone(), ops.clone()).await,
            };
            match written {
                Ok(WriteOutcome::Applied) => return Ok(WriteOutcome::Applied),
                Ok(WriteOutcome::Rejected { current }) => {
                    let now = current
                        .iter()
                        .find(|(key, _)| key == EPOCH_KEY)
                        .map(|(_, value)| value.as_deref().and_then(parse_epoch).unwrap_or(0));
                    return match now {
                        Some(now) if now != epoch => Err(Error::Fenced {
                            epoch: now,
                            own: epoch,
                        }),
                        _ => Ok(WriteOutcome::Rejected { current }),
                    };
                }
                Err(e) if e.is_retryable() => match backoff.next() {
                    Some(delay) => {
                        tracing::warn!(procedures = ?shown, error = %e, ?delay, "retrying a state store write");
                        self.show_store_retry(shown, &e, before);
                        tokio::time::sleep(delay).await;
                    }
                    None => return Err(e),
                },
                Err(e) => return Err(e),
            }
        }
    }

    /// Shows every procedure of `shown` as `retrying` with the store error `e`; the first time, keeps what they
    /// showed in `before`.
    fn show_store_retry(
        &self,
        shown: &[ProcedureId],
        e: &Error,
        before: &mut Option<Vec<(ProcedureId, ProcedureInfo)>>,
    ) {
        let mut state = self.state();
        let first = before.is_none();
        let kept = before.get_or_insert_with(Vec::new);
        let text = e.to_string();
        let now = now_ms();
        for id in shown {
            let Some(entry) = state.procedures.get_mut(id) else {
                continue;
            };
            if first {
                kept.push((id.clone(), entry.info_copy()));
            }
            let mut info = entry.info_copy();
            info.state = ProcedureState::Retrying;
            info.error = Some(text.clone());
            info.updated_at_ms = now;
            entry.publish(info);
        }
    }

    /// A read, retried like a write.
    pub(crate) async fn read<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        self.read_shown(&[], f).await
    }

    /// [`Inner::read`] made for a procedure: while the read is retried, the procedures in `shown` show as
    /// `retrying` with the store's error (as during a write), and once the store answers they show what they showed
    /// before. A runner reading at a step boundary is thus never silently stuck behind a store outage.
    pub(crate) async fn read_shown<T, F, Fut>(&self, shown: &[ProcedureId], f: F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut backoff = backoff(&self.config.store_retry);
        let mut before: Option<Vec<(ProcedureId, ProcedureInfo)>> = None;
        let outcome = loop {
            match f().await {
                Err(e) if e.is_retryable() => match backoff.next() {
                    Some(delay) => {
                        if !shown.is_empty() {
                            tracing::warn!(procedures = ?shown, error = %e, ?delay, "retrying a state store read");
                            self.show_store_retry(shown, &e, &mut before);
                        }
                        tokio::time::sleep(delay).await;
                    }
                    None => break Err(e),
                },
                other => break other,
            }
        };
        if let (Ok(_), Some(before)) = (&outcome, before) {
            for (id, info) in before {
                self.with_entry(&id, |entry| entry.publish(info));
            }
        }
        outcome
    }

    pub(crate) fn halt_error(&self) -> Error {
        match &self.state().phase {
            Phase::Halted(reason) => reason.error(),
            _ => Error::ManagerNotRunning {
                reason: "the manager is not running".to_string(),
            },
        }
    }

    /// Claims the epoch through the store ([`StateStore::claim_epoch`]), trying again while another manager
    /// changes the epoch key at the same time.
    async fn claim_epoch(&self) -> Result<u64> {
        for _ in 0..EPOCH_CLAIM_ATTEMPTS {
            if let Some(epoch) = self.read(|| self.store.claim_epoch()).await? {
                return Ok(epoch);
            }
            tracing::debug!("another manager claimed the epoch at the same time; retrying");
        }
        Err(Error::ManagerNotRunning {
            reason: format!(
                "could not claim an epoch: '{EPOCH_KEY}' changed under every one of {EPOCH_CLAIM_ATTEMPTS} attempts"
            ),
        })
    }

    /// Claims the epoch, loads every record, and starts a runner for every unfinished recoverable one.
    pub(crate) async fn start(self: &Arc<Self>) -> Result<()> {
        // Held for the whole start: a `stop` meanwhile waits and then stops what this start began.
        let _lifecycle = self.lifecycle.lock().await;
        let halted = matches!(self.state().phase, Phase::Halted(_));
        if halted {
            self.reset().await;
        }
        {
            let mut state = self.state();
            if !matches!(state.phase, Phase::New) {
                return Err(Error::ManagerNotRunning {
                    reason: "the manager is already started".to_string(),
                });
            }
            state.phase = Phase::Starting;
        }
        let loaded = async {
            let epoch = self.claim_epoch().await?;
            let records = self.read_records().await?;
            let controls = self
                .read(|| ControlRequests::read(self.store.as_ref()))
                .await?;
            Ok::<_, Error>((epoch, records, controls))
        }
        .await;
        let (epoch, records, controls) = match loaded {
            Ok(loaded) => loaded,
            Err(e) => {
                let mut state = self.state();
                // Not started: `start` may be tried again (unless the manager was stopped meanwhile).
                if matches!(state.phase, Phase::Starting) {
                    state.phase = Phase::New;
                }
                return Err(e);
            }
        };

        self.set_controls(controls);
        // Records are decoded and loaders run before the manager's state is locked: a loader may call the manager
        // (its epoch, a watcher) without deadlocking it.
        let recovered: Vec<Recovered> = records
            .iter()
            .map(|(key, value)| self.recover(key, value))
            .collect();
        let mut runners = Vec::new();
        // Finished records older than `finished_in_memory` stay in the store only (read there when asked for).
        let keep_ms = u64::try_from(self.config.finished_in_memory.as_millis()).unwrap_or(u64::MAX);
        let loaded_at = now_ms();
        {
            let mut state = self.state();
            if let Phase::Halted(reason) = &state.phase {
                // Stopped while starting.
                return Err(reason.error());
            }
            state.epoch = Some(epoch);
            state.phase = Phase::Running;
            for recovered in recovered {
                match recovered {
                    Recovered::Finished(record)
                        if record.updated_at_ms.saturating_add(keep_ms) <= loaded_at =>
                    {
                        self.finished_only_in_store.store(true, Ordering::SeqCst);
                    }
                    Recovered::Finished(record) => {
                        let info = ProcedureInfo::from(&record);
                        state
                            .procedures
                            .insert(record.id.clone(), Entry::new(info, record.id.clone()));
                    }
                    Recovered::Unfinished(record, procedure) => {
                        let info = ProcedureInfo::from(&record);
                        state
                            .procedures
                            .insert(record.id.clone(), Entry::new(info, record.id.clone()));
                        runners.push((record, procedure));
                    }
                    Recovered::Unrecoverable {
                        id,
                        type_name,
                        parent_id,
                        error,
                    } => {
                        tracing::warn!(%error, "procedure record cannot be recovered");
                        let now = now_ms();
                        // No loader: a manager that has one resumes it, so it is stalled, not failed. A record
                        // that no manager can read as it is (damaged, newer) is failed.
                        let shown = if matches!(error, Error::LoaderNotFound { .. }) {
                            self.stalled_total.fetch_add(1, Ordering::Relaxed);
                            ProcedureState::Stalled
                        } else {
                            self.failed_total.fetch_add(1, Ordering::Relaxed);
                            ProcedureState::Failed
                        };
                        let text = error.to_string();
                        let mut events = Vec::new();
                        let kind = if shown == ProcedureState::Stalled {
                            EventKind::Stalled {
                                reason: truncate_text(&text),
                            }
                        } else {
                            EventKind::Failed {
                                error: truncate_text(&text),
                            }
                        };
                        push_event(&mut events, now, kind);
                        let info = ProcedureInfo {
                            id: id.clone(),
                            type_name,
                            parent_id,
                            state: shown,
                            step: 0,
                            output: None,
                            error: Some(text.clone()),
                            created_at_ms: now,
                            updated_at_ms: now,
                            step_name: None,
                            attempt: 0,
                            last_error: Some(text),
                            next_retry_at_ms: None,
                            step_started_at_ms: None,
                            lock_keys: Vec::new(),
                            locks_held: Vec::new(),
                            lock_wait: None,
                            events,
                            refusal: None,
                        };
                        let mut entry = Entry::new(info, id.clone());
                        entry.unrecoverable = true;
                        entry.tx = None;
                        // Two damaged records may name the same id; keep the first.
                        state.procedures.entry(id).or_insert(entry);
                    }
                }
            }
            // Roots: follow parent links among the known procedures.
            let roots: Vec<(ProcedureId, ProcedureId)> = state
                .procedures
                .keys()
                .map(|id| (id.clone(), root_of(&state.procedures, id)))
                .collect();
            for (id, root) in roots {
                if let Some(entry) = state.procedures.get_mut(&id) {
                    entry.root = root;
                }
            }
            tracing::info!(
                epoch,
                recovering = runners.len(),
                "procedure manager started"
            );
            for (record, procedure) in runners {
                let resume = if record.state == ProcedureState::RollingBack {
                    Resume::RollBack(record.error.clone().unwrap_or_default())
                } else {
                    Resume::Execute
                };
                self.spawn_locked(&mut state, epoch, record, procedure, resume, true);
            }
            state.spawn(retention::run(Arc::downgrade(self)));
            state.spawn(control::run(Arc::downgrade(self)));
        }
        Ok(())
    }

    /// Every procedure record, read [`RECOVERY_PAGE`] keys at a time (each page retried like any read), so no
    /// single request to the store carries every record.
    async fn read_records(&self) -> Result<Vec<(String, Vec<u8>)>> {
        let mut records: Vec<(String, Vec<u8>)> = Vec::new();
        loop {
            let after = records.last().map(|(key, _)| key.clone());
            let page = self
                .read(|| {
                    self.store
                        .scan_page(RECORD_PREFIX, after.as_deref(), RECOVERY_PAGE)
                })
                .await?;
            if page.is_empty() {
                return Ok(records);
            }
            records.extend(page);
        }
    }

    /// A finished procedure that is not in memory (it left after `finished_in_memory`, or was not loaded at start),
    /// read from its record. `None` when the store has no record under `id`, or one that is not finished (this
    /// manager knows every unfinished procedure it runs).
    pub(crate) async fn stored_finished(&self, id: &ProcedureId) -> Result<Option<ProcedureInfo>> {
        let key = record_key(id);
        let Some(value) = self.read(|| self.store.get(&key)).await? else {
            return Ok(None);
        };
        let record = decode_record(&key, &value)?;
        if record.id != *id {
            return Err(Error::CorruptRecord {
                id: id.clone(),
                type_name: record.type_name.clone(),
                key,
                reason: format!(
                    "the record names procedure {}, not the one of its key",
                    record.id
                ),
            });
        }
        Ok(record
            .state
            .is_finished()
            .then(|| ProcedureInfo::from(&record)))
    }

    /// Every finished procedure of the store that is not in `known`, read [`RECOVERY_PAGE`] records at a time. A
    /// record that cannot be read is left out (logged): this manager shows the damaged records it loaded at start.
    pub(crate) async fn stored_finished_except(
        &self,
        known: &BTreeMap<ProcedureId, ProcedureInfo>,
    ) -> Result<Vec<ProcedureInfo>> {
        let mut found = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = self
                .read(|| {
                    self.store
                        .scan_page(RECORD_PREFIX, after.as_deref(), RECOVERY_PAGE)
                })
                .await?;
            let Some((last, _)) = page.last() else {
                return Ok(found);
            };
            after = Some(last.clone());
            for (key, value) in page {
                let key_id = ProcedureId::new(key.strip_prefix(RECORD_PREFIX).unwrap_or(&key));
                if known.contains_key(&key_id) {
                    continue;
                }
                match decode_record(&key, &value) {
                    Ok(record) if record.id == key_id && record.state.is_finished() => {
                        found.push(ProcedureInfo::from(&record));
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "a procedure record cannot be listed"),
                }
            }
        }
    }

    /// Rebuilds one record.
    fn recover(&self, key: &str, value: &[u8]) -> Recovered {
        let key_id = ProcedureId::new(key.strip_prefix(RECORD_PREFIX).unwrap_or(key));
        let record: ProcedureRecord = match serde_json::from_slice(value) {
            Ok(record) => record,
            Err(e) => {
                // Name what can still be read of a damaged envelope.
                let loose: Option<serde_json::Value> = serde_json::from_slice(value).ok();
                let field = |name: &str| {
                    loose
                        .as_ref()
                        .and_then(|v| v.get(name))
                        .and_then(|v| v.as_str())
                        .map(str::to_string)
                };
                let id = field("id").map(ProcedureId::new).unwrap_or(key_id);
                let type_name = field("type_name").unwrap_or_else(|| "unknown".to_string());
                return Recovered::Unrecoverable {
                    error: Error::CorruptRecord {
                        id: id.clone(),
                        type_name: type_name.clone(),
                        key: key.to_string(),
                        reason: format!("the record envelope does not parse: {e}"),
                    },
                    id,
                    type_name,
                    parent_id: field("parent_id").map(ProcedureId::new),
                };
            }
        };
        if record.id != key_id {
            // Resumed (or deleted by retention) as the id it names, it would write over that procedure's record.
            return Recovered::Unrecoverable {
                error: Error::CorruptRecord {
                    id: key_id.clone(),
                    type_name: record.type_name.clone(),
                    key: key.to_string(),
                    reason: format!(
                        "the record names procedure {}, not the one of its key",
                        record.id
                    ),
                },
                id: key_id,
                type_name: record.type_name,
                parent_id: record.parent_id,
            };
        }
        let unrecoverable = |error: Error| Recovered::Unrecoverable {
            id: record.id.clone(),
            type_name: record.type_name.clone(),
            parent_id: record.parent_id.clone(),
            error,
        };
        if record.format_version > RECORD_FORMAT_VERSION {
            return unrecoverable(Error::CorruptRecord {
                id: record.id.clone(),
                type_name: record.type_name.clone(),
                key: key.to_string(),
                reason: format!(
                    "record format version {} is newer than the {} this manager reads",
                    record.format_version, RECORD_FORMAT_VERSION
                ),
            });
        }
        if record.state.is_finished() {
            return Recovered::Finished(record);
        }
        let loaders = self.loaders.read().unwrap_or_else(|p| p.into_inner());
        let Some(loader) = loaders.get(&record.type_name) else {
            return unrecoverable(Error::LoaderNotFound {
                id: record.id.clone(),
                type_name: record.type_name.clone(),
                key: key.to_string(),
            });
        };
        match loader(record.data.clone()) {
            Ok(procedure) => {
                drop(loaders);
                Recovered::Unfinished(record, procedure)
            }
            Err(e) => unrecoverable(Error::CorruptRecord {
                id: record.id.clone(),
                type_name: record.type_name.clone(),
                key: key.to_string(),
                reason: format!("the loader refused its data: {e}"),
            }),
        }
    }

    /// Whether a loader is registered for `type_name`, so that [`Inner::reload`] can rebuild its procedures
    /// (loaders are never unregistered).
    pub(crate) fn has_loader(&self, type_name: &str) -> bool {
        self.loaders
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(type_name)
    }

    /// The procedure of `record` rebuilt from its persisted data by its registered loader: what a step whose
    /// writes were refused, or whose run a cancel or pause interrupted, goes back to (its in-memory state ran ahead
    /// of what is stored).
    pub(crate) fn reload(&self, record: &ProcedureRecord) -> Result<BoxedProcedure> {
        let loaders = self.loaders.read().unwrap_or_else(|p| p.into_inner());
        let Some(loader) = loaders.get(&record.type_name) else {
            return Err(Error::LoaderNotFound {
                id: record.id.clone(),
                type_name: record.type_name.clone(),
                key: record_key(&record.id),
            });
        };
        loader(record.data.clone())
    }

    pub(crate) fn register_loader(
        &self,
        type_name: &str,
        loader: BoxedProcedureLoader,
    ) -> Result<()> {
        let mut loaders = self.loaders.write().unwrap_or_else(|p| p.into_inner());
        if loaders.contains_key(type_name) {
            return Err(Error::LoaderConflict {
                type_name: type_name.to_string(),
            });
        }
        loaders.insert(type_name.to_string(), loader);
        Ok(())
    }

    /// Submits a root procedure: the public `submit`.
    ///
    /// An id the manager knows (in memory, or as a record in its store) gives a watcher of that procedure, running
    /// or finished, when it is of the same type ([`Error::ProcedureIdInUse`] otherwise): a caller-chosen id is an
    /// idempotency key.
    ///
    /// Cancellation-safe: the id is reserved, the submission is polled once, and — when the store did not answer in
    /// that poll — handed to a submission task, all without an await in between; the caller then only awaits the
    /// task's answer. Dropping this future therefore never cancels the write: the task still runs the procedure if
    /// its record is written, or forgets the reservation if not. Only `stop` aborts the task (and then the next
    /// start recovers whatever record landed). A store that answers at once (in memory) settles the submission in
    /// the caller's own poll, without a task and the two thread hand-offs it would cost.
    pub(crate) async fn submit_root(
        self: &Arc<Self>,
        procedure: ProcedureWithId,
    ) -> Result<Watcher> {
        let epoch = self.running_epoch()?;
        let new = NewProcedure::new(procedure, None)?;
        let id = new.record.id.clone();
        {
            let mut state = self.state();
            if let Phase::Halted(reason) = &state.phase {
                return Err(reason.error());
            }
            if let Some(entry) = state.procedures.get(&id) {
                return existing_watcher(entry, &new.record.type_name);
            }
            state.procedures.insert(
                id.clone(),
                Entry::new(ProcedureInfo::from(&new.record), id.clone()),
            );
        }
        // Boxed, so that a submission still pending after its first poll can move into a task.
        let mut settle = Box::pin(Arc::clone(self).settle_root(epoch, new));
        if let std::task::Poll::Ready(answer) = futures::poll!(&mut settle) {
            return answer;
        }
        let stopped = || Error::ManagerNotRunning {
            reason: format!("the manager stopped while procedure {id} was being submitted"),
        };
        let answer = {
            let mut state = self.state();
            if matches!(state.phase, Phase::Halted(_)) || state.epoch != Some(epoch) {
                // Halted since the poll: `stop` may have drained the tasks already, so none may be spawned. The
                // write in flight is dropped like an aborted task; the next start recovers it if it landed.
                return Err(stopped());
            }
            let (tx, rx) = oneshot::channel();
            state.spawn(async move {
                // The caller may be gone; the submission is settled all the same.
                let _ = tx.send(settle.await);
            });
            rx
        };
        answer.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// [`crate::ProcedureManager::submit_again_if_rolled_back`]: replaces a failed, rolled-back root's record with
    /// this submission's (conditioned on the stored bytes) and runs it; anything else is `submit_root`'s answer.
    pub(crate) async fn submit_again(
        self: &Arc<Self>,
        procedure: ProcedureWithId,
    ) -> Result<Watcher> {
        let epoch = self.running_epoch()?;
        let key = record_key(&procedure.id);
        let Some(stored) = self.read(|| self.store.get(&key)).await? else {
            return self.submit_root(procedure).await;
        };
        let replaceable = serde_json::from_slice::<ProcedureRecord>(&stored)
            .is_ok_and(|old| old.parent_id.is_none() && rolled_back_failure(&old));
        if !replaceable {
            return self.submit_root(procedure).await;
        }
        let new = NewProcedure::new(procedure, None)?;
        let id = new.record.id.clone();
        {
            let mut state = self.state();
            if let Phase::Halted(reason) = &state.phase {
                return Err(reason.error());
            }
            match state.procedures.get(&id) {
                // Finished (the failed one, kept in memory): forgotten, the new submission takes its place.
                Some(entry) if entry.info.state.is_finished() => {
                    if entry.info.type_name != new.record.type_name {
                        return existing_watcher(entry, &new.record.type_name);
                    }
                    state.procedures.remove(&id);
                }
                // Another submission of the id got here first.
                Some(entry) => return existing_watcher(entry, &new.record.type_name),
                None => {}
            }
            state.procedures.insert(
                id.clone(),
                Entry::new(ProcedureInfo::from(&new.record), id.clone()),
            );
        }
        let outcome = self
            .write(
                epoch,
                vec![Condition::Equals {
                    key: key.clone(),
                    value: stored,
                }],
                vec![WriteOp::Put {
                    key: key.clone(),
                    value: new.value.clone(),
                }],
                std::slice::from_ref(&id),
            )
            .await;
        match outcome {
            Ok(WriteOutcome::Applied) => {
                tracing::info!(%id, "a failed, rolled-back procedure submitted again: it runs again");
                self.launch(epoch, new)
            }
            Ok(WriteOutcome::Rejected { current })
                if current
                    .iter()
                    .any(|(k, v)| *k == key && v.as_ref() == Some(&new.value)) =>
            {
                self.launch(epoch, new)
            }
            // Replaced (or changed) meanwhile by another writer: watch what the store holds now.
            Ok(WriteOutcome::Rejected { .. }) => {
                self.abandon(&id, "the record under its id changed meanwhile");
                self.watch_stored(&id, &new.record.type_name).await
            }
            Err(e) => {
                self.abandon(&id, &format!("its record could not be replaced: {e}"));
                if e.is_fatal() {
                    self.halt_on(&e);
                }
                Err(e)
            }
        }
    }

    /// A watcher of the procedure the store holds under `id`, loaded (and resumed when unfinished) if this manager
    /// did not know it: what a submission answers when it finds the id taken by a record it did not write.
    async fn watch_stored(self: &Arc<Self>, id: &ProcedureId, type_name: &str) -> Result<Watcher> {
        self.adopt(id).await?;
        let state = self.state();
        match state.procedures.get(id) {
            Some(entry) => existing_watcher(entry, type_name),
            None => Err(Error::ManagerNotRunning {
                reason: format!("procedure {id} was forgotten while it was being loaded"),
            }),
        }
    }

    /// The submission task of a root reserved by `submit_root`: writes its first record and runs it, or finds the
    /// procedure the store already has under its id.
    async fn settle_root(self: Arc<Self>, epoch: u64, new: NewProcedure) -> Result<Watcher> {
        let id = new.record.id.clone();
        let key = new.key();
        let outcome = self
            .write(
                epoch,
                vec![Condition::Absent { key: key.clone() }],
                vec![WriteOp::Put {
                    key: key.clone(),
                    value: new.value.clone(),
                }],
                std::slice::from_ref(&id),
            )
            .await;
        match outcome {
            Ok(WriteOutcome::Applied) => self.launch(epoch, new),
            // A retried write that finds exactly its own record: an earlier attempt landed but its answer was lost.
            Ok(WriteOutcome::Rejected { current })
                if current
                    .iter()
                    .any(|(k, v)| *k == key && v.as_ref() == Some(&new.value)) =>
            {
                self.launch(epoch, new)
            }
            // The store has a record under this id that this manager did not load: load it (resuming it when
            // unfinished) and watch it.
            Ok(WriteOutcome::Rejected { .. }) => {
                self.abandon(&id, "the store already has a record under its id");
                self.watch_stored(&id, &new.record.type_name).await
            }
            // Only the run that made the submission forgets it or halts on its error: a submission settled in its
            // caller's poll may outlive its run, and a later run must not halt on a write fenced by its own epoch.
            Err(e) if self.state().epoch == Some(epoch) => {
                self.abandon(&id, &format!("its first record could not be written: {e}"));
                if e.is_fatal() {
                    self.halt_on(&e);
                }
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Forgets the reservation of a root whose first record this submission did not write; a watcher taken
    /// meanwhile resolves with [`Error::ManagerNotRunning`] naming `why`.
    fn abandon(&self, id: &ProcedureId, why: &str) {
        let mut state = self.state();
        if let Some(mut entry) = state.procedures.remove(id) {
            let mut info = entry.info_copy();
            info.error = Some(format!("not submitted: {why}"));
            entry.close(info);
        }
    }

    /// Persists a new procedure (a child of `parent`, or a root when `None`) and starts its runner.
    pub(crate) async fn submit(
        self: &Arc<Self>,
        procedure: ProcedureWithId,
        parent: Option<&ProcedureId>,
    ) -> Result<Watcher> {
        let epoch = self.running_epoch()?;
        let new = NewProcedure::new(procedure, parent)?;
        let id = new.record.id.clone();
        // Reserve the id in memory first, so two submissions of one id cannot both write.
        self.reserve(&new)?;
        let key = new.key();
        let outcome = self
            .write(
                epoch,
                vec![Condition::Absent { key: key.clone() }],
                vec![WriteOp::Put {
                    key,
                    value: new.value.clone(),
                }],
                std::slice::from_ref(&id),
            )
            .await;
        match outcome {
            Ok(WriteOutcome::Applied) => self.launch(epoch, new),
            // A retried write that finds exactly its own record: an earlier attempt landed but its answer was lost
            // (only this manager writes under its epoch, and it reserved the id). The procedure is submitted.
            Ok(WriteOutcome::Rejected { current })
                if current
                    .iter()
                    .any(|(k, v)| *k == new.key() && v.as_ref() == Some(&new.value)) =>
            {
                self.launch(epoch, new)
            }
            Ok(WriteOutcome::Rejected { .. }) => {
                self.unreserve(&id);
                Err(Error::DuplicateProcedure { id })
            }
            Err(e) => {
                self.unreserve(&id);
                if e.is_fatal() {
                    self.halt_on(&e);
                }
                Err(e)
            }
        }
    }

    /// Takes the id of a procedure about to be persisted in memory, in its parent's tree: from now on a submission
    /// of the same id is a duplicate. [`Error::DuplicateProcedure`] when the id is known already.
    pub(crate) fn reserve(&self, new: &NewProcedure) -> Result<()> {
        let mut state = self.state();
        let id = &new.record.id;
        if state.procedures.contains_key(id) {
            return Err(Error::DuplicateProcedure { id: id.clone() });
        }
        let root = match &new.record.parent_id {
            Some(parent) => state
                .procedures
                .get(parent)
                .map(|p| p.root.clone())
                .unwrap_or_else(|| parent.clone()),
            None => id.clone(),
        };
        state.procedures.insert(
            id.clone(),
            Entry::new(ProcedureInfo::from(&new.record), root),
        );
        Ok(())
    }

    /// Forgets a reservation whose record was not written.
    pub(crate) fn unreserve(&self, id: &ProcedureId) {
        self.state().procedures.remove(id);
    }

    /// Starts the runner of a reserved procedure whose first record is written, and returns its watcher.
    pub(crate) fn launch(self: &Arc<Self>, epoch: u64, new: NewProcedure) -> Result<Watcher> {
        let NewProcedure {
            record, procedure, ..
        } = new;
        let id = record.id.clone();
        let mut state = self.state();
        if let Phase::Halted(reason) = &state.phase {
            return Err(reason.error());
        }
        if state.epoch != Some(epoch) {
            // A submission settled in its caller's poll outlived the run it was made in (stopped and started again
            // meanwhile): the new run loaded its record, if it landed, and runs it.
            return Err(Error::ManagerNotRunning {
                reason: format!("the manager restarted while procedure {id} was being submitted"),
            });
        }
        self.spawn_locked(&mut state, epoch, record, procedure, Resume::Execute, false);
        state
            .procedures
            .get(&id)
            .map(|entry| entry.watcher().stored_by_this_submission())
            .ok_or_else(|| Error::ManagerNotRunning {
                reason: format!("procedure {id} was forgotten while it was being submitted"),
            })
    }

    /// Loads a record that exists in the store but not in memory (a child submitted before a crash that this
    /// manager did not see at start), so its parent can wait for it.
    pub(crate) async fn adopt(self: &Arc<Self>, id: &ProcedureId) -> Result<()> {
        let key = record_key(id);
        let Some(value) = self.read(|| self.store.get(&key)).await? else {
            return Err(Error::ManagerNotRunning {
                reason: format!("procedure {id} was reported to exist at '{key}' but is absent"),
            });
        };
        let recovered = self.recover(&key, &value);
        let mut state = self.state();
        let epoch = match (&state.phase, state.epoch) {
            (Phase::Running, Some(epoch)) => epoch,
            (Phase::Halted(reason), _) => return Err(reason.error()),
            _ => return Err(self_not_started()),
        };
        if state.procedures.contains_key(id) {
            return Ok(());
        }
        match recovered {
            Recovered::Finished(record) => {
                let root = adopted_root(&state.procedures, &record);
                state
                    .procedures
                    .insert(id.clone(), Entry::new(ProcedureInfo::from(&record), root));
            }
            Recovered::Unfinished(record, procedure) => {
                let root = adopted_root(&state.procedures, &record);
                state
                    .procedures
                    .insert(id.clone(), Entry::new(ProcedureInfo::from(&record), root));
                let resume = if record.state == ProcedureState::RollingBack {
                    Resume::RollBack(record.error.clone().unwrap_or_default())
                } else {
                    Resume::Execute
                };
                self.spawn_locked(&mut state, epoch, record, procedure, resume, true);
            }
            Recovered::Unrecoverable { error, .. } => return Err(error),
        }
        Ok(())
    }

    /// Starts the runner task of a procedure whose entry is already in `state`; `recovered` when its record was
    /// loaded from the store rather than written by this manager's submission.
    fn spawn_locked(
        self: &Arc<Self>,
        state: &mut State,
        epoch: u64,
        record: ProcedureRecord,
        procedure: BoxedProcedure,
        resume: Resume,
        recovered: bool,
    ) {
        let Some(entry) = state.procedures.get(&record.id) else {
            return;
        };
        let runner = Box::new(Runner::new(
            Arc::clone(self),
            epoch,
            entry.root.clone(),
            record,
            procedure,
            recovered,
        ));
        state.spawn(runner.run(resume));
    }
}

/// A watcher of the procedure a submission found under its id; [`Error::ProcedureIdInUse`] when it is of another
/// type than the submission.
/// Whether `record` ended failed after a rollback that completed (its last rollback event says so).
fn rolled_back_failure(record: &ProcedureRecord) -> bool {
    record.state == ProcedureState::Failed
        && record
            .events
            .iter()
            .rev()
            .find_map(|e| match &e.kind {
                EventKind::RolledBack { completed, .. } => Some(*completed),
                _ => None,
            })
            .unwrap_or(false)
}

fn existing_watcher(entry: &Entry, submitted: &str) -> Result<Watcher> {
    if entry.info.type_name != submitted {
        return Err(Error::ProcedureIdInUse {
            id: entry.info.id.clone(),
            existing: entry.info.type_name.clone(),
            submitted: submitted.to_string(),
        });
    }
    Ok(entry.watcher())
}

/// Adds the keys a procedure holds, or what it waits for, as the lock table shows them now.
fn with_locks(info: &mut ProcedureInfo, locks: ProcedureLocks) {
    info.locks_held = locks.held;
    info.lock_wait = locks.waiting;
}

fn self_not_started() -> Error {
    Error::ManagerNotRunning {
        reason: "the manager has not been started".to_string(),
    }
}

/// A procedure about to be persisted for the first time: its submission record (step 0), the record's bytes, and
/// the procedure itself.
pub(crate) struct NewProcedure {
    pub(crate) record: ProcedureRecord,
    pub(crate) value: Vec<u8>,
    pub(crate) procedure: BoxedProcedure,
}

impl NewProcedure {
    /// The submission record of `procedure`, a child of `parent` if given.
    pub(crate) fn new(procedure: ProcedureWithId, parent: Option<&ProcedureId>) -> Result<Self> {
        let ProcedureWithId { id, procedure } = procedure;
        let data = procedure.dump()?;
        let now = now_ms();
        let mut events = Vec::new();
        push_event(&mut events, now, EventKind::Submitted);
        let mut record = ProcedureRecord {
            format_version: RECORD_FORMAT_VERSION,
            type_name: procedure.type_name().to_string(),
            id: id.clone(),
            parent_id: parent.cloned(),
            step: 0,
            state: ProcedureState::Running,
            data,
            output: None,
            error: None,
            waiting_for: Vec::new(),
            created_at_ms: now,
            updated_at_ms: now,
            step_name: procedure.step_name(),
            lock_keys: declared_keys(&procedure.lock_key()),
            events,
        };
        record.format_version = record.required_format_version();
        // Sized for a typical first record, so it is not grown (and copied) as it is written.
        let mut value = Vec::with_capacity(512);
        serde_json::to_writer(&mut value, &record).map_err(|source| Error::Serialize {
            id,
            what: "record",
            source,
        })?;
        Ok(NewProcedure {
            record,
            value,
            procedure,
        })
    }

    /// The store key of its record.
    pub(crate) fn key(&self) -> String {
        record_key(&self.record.id)
    }
}

/// The record stored at `key`, or [`Error::CorruptRecord`] naming the key when it does not parse.
fn decode_record(key: &str, value: &[u8]) -> Result<ProcedureRecord> {
    serde_json::from_slice(value).map_err(|e| Error::CorruptRecord {
        id: ProcedureId::new(key.strip_prefix(RECORD_PREFIX).unwrap_or(key)),
        type_name: "unknown".to_string(),
        key: key.to_string(),
        reason: format!("the record envelope does not parse: {e}"),
    })
}

/// What a stored record turned into.
enum Recovered {
    Finished(ProcedureRecord),
    Unfinished(ProcedureRecord, BoxedProcedure),
    Unrecoverable {
        id: ProcedureId,
        type_name: String,
        parent_id: Option<ProcedureId>,
        error: Error,
    },
}

/// The root of the tree of `record`, a record being adopted (not in `procedures` yet): its parent's root, or the
/// parent's id when the parent is unknown, or its own id for a root. (`root_of` on its id would stop at once, since
/// the id is not known yet, and make it a tree of its own: locked out of its parent's keys, deleted apart from it.)
fn adopted_root(procedures: &HashMap<ProcedureId, Entry>, record: &ProcedureRecord) -> ProcedureId {
    match &record.parent_id {
        Some(parent) => procedures
            .get(parent)
            .map(|p| p.root.clone())
            .unwrap_or_else(|| parent.clone()),
        None => record.id.clone(),
    }
}

/// The root of `id`'s tree among `procedures` (a procedure whose parent is unknown is its own root).
fn root_of(procedures: &HashMap<ProcedureId, Entry>, id: &ProcedureId) -> ProcedureId {
    let mut current = id.clone();
    // Bounded walk: a cycle of parent links in damaged records must not hang the manager.
    for _ in 0..=procedures.len() {
        match procedures
            .get(&current)
            .and_then(|e| e.info.parent_id.clone())
        {
            Some(parent) if procedures.contains_key(&parent) => current = parent,
            Some(parent) => {
                // The parent may be known by its root already.
                return procedures
                    .get(&parent)
                    .map(|p| p.root.clone())
                    .unwrap_or(parent);
            }
            None => return current,
        }
    }
    current
}

pub(crate) fn parse_epoch(bytes: &[u8]) -> Option<u64> {
    std::str::from_utf8(bytes).ok()?.trim().parse().ok()
}

/// The exponential backoff with jitter of `policy`.
pub(crate) fn backoff(policy: &RetryPolicy) -> impl Iterator<Item = std::time::Duration> + use<> {
    ExponentialBuilder::default()
        .with_min_delay(policy.initial_delay)
        .with_max_delay(policy.max_delay)
        .with_factor(policy.factor)
        .with_max_times(policy.max_retries)
        .with_jitter()
        .build()
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
    use std::sync::Arc;

    use crate::testing::Steps;
    use crate::{
        LocalManager, ManagerConfig, MemoryStateStore, ProcedureId, ProcedureManager,
        ProcedureState, ProcedureWithId,
    };

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
