//! The run loop of one procedure: locks, admission, steps, retry, control boundaries (pause, cancel, interrupt).
//!
//! Beside it: `persist` (the next record and its write with the step's writes), `children` (suspending with
//! sub-procedures and waiting for them) and `ending` (refusal, failure, rollback, cancel).

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

use futures::FutureExt;

use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::event::{EventKind, ProcedureEvent, truncate_text};
use crate::manager::live::{Live, LiveHandle};
use crate::manager::local::{Inner, backoff};
use crate::manager::lock::{LockGuard, Requester};
use crate::procedure::{BoxedProcedure, Context, LockKey, ProcedureId, Status};
use crate::record::{MAX_EVENTS, ProcedureInfo, ProcedureRecord, ProcedureState, now_ms};
use crate::store::WriteOp;

mod children;
mod ending;
mod persist;

/// `id` (whose record is `record`) with its ancestors, parent first: the record's parent, then each known
/// entry's parent. The walk is bounded: a cycle of parent links in damaged records must not hang the runner.
fn descendant_of(id: ProcedureId, inner: &Inner, record: &ProcedureRecord) -> Requester {
    let mut ancestors: Vec<ProcedureId> = Vec::new();
    let mut next = record.parent_id.clone();
    while let Some(parent) = next.take() {
        if ancestors.contains(&parent) || parent == id || ancestors.len() > 1024 {
            break;
        }
        next = inner
            .with_entry(&parent, |e| e.info.parent_id.clone())
            .flatten();
        ancestors.push(parent);
    }
    Requester { id, ancestors }
}

/// Resolves once `inner` knows a cancel of `id` is requested (never otherwise).
async fn cancel_requested(inner: Arc<Inner>, id: ProcedureId) {
    let mut changed = inner.control_changed.subscribe();
    while !inner.control_of(&id).cancel {
        if changed.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Resolves once `inner` knows a cancel or a pause of `id` is requested (its own pause, or every procedure's);
/// never otherwise. What the request asks is read again at the step boundary that follows.
async fn interrupt_requested(inner: &Inner, id: &ProcedureId) {
    let mut changed = inner.control_changed.subscribe();
    loop {
        let control = inner.control_of(id);
        if control.cancel || control.paused {
            return;
        }
        if changed.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// One run of `procedure`'s `execute`, bounded by the procedure's `deadline` (with the `timeout` it came from) when
/// it has one: a step that runs past it is [`Error::Timeout`].
async fn execute_step(
    procedure: &mut BoxedProcedure,
    ctx: &Context,
    id: &ProcedureId,
    deadline: Option<(Instant, std::time::Duration)>,
) -> Result<Status> {
    let Some((deadline, timeout)) = deadline else {
        return procedure.execute(ctx).await;
    };
    let timed_out = || Error::Timeout {
        id: id.clone(),
        timeout,
    };
    match deadline.checked_duration_since(Instant::now()) {
        Some(left) if !left.is_zero() => {
            match tokio::time::timeout(left, procedure.execute(ctx)).await {
                Ok(result) => result,
                Err(_) => Err(timed_out()),
            }
        }
        _ => Err(timed_out()),
    }
}

/// The admission slot kept through a boundary, or a new one of `inner`'s admission after a pause gave it back (the
/// admission slots are looked up only then: a lock and a reference count every runner's thread would change).
async fn take_slot(
    inner: &Inner,
    slot: Option<OwnedSemaphorePermit>,
) -> Result<OwnedSemaphorePermit, Stopped> {
    match slot {
        Some(permit) => Ok(permit),
        None => inner.admission().acquire_owned().await.map_err(|_| Stopped),
    }
}

/// Where a runner picks a procedure up.
#[derive(Debug)]
pub(crate) enum Resume {
    /// Run `execute` (a new procedure, or a recovered running one).
    Execute,
    /// Finish a rollback that was under way; the text is the error that caused it.
    RollBack(String),
}

/// The runner stopped the procedure without finishing it (halted, or a store write failed for good).
struct Stopped;

/// The error text of a rollback an operator's cancel caused.
const CANCELLED_BY_REQUEST: &str = "cancelled by request";

/// What a step boundary decided.
enum Boundary {
    /// Run the next step (with this admission slot).
    Run(OwnedSemaphorePermit),
    /// End the procedure cancelled.
    Cancel(OwnedSemaphorePermit),
}

/// What the history of a record [`Runner::next_record`] made adds to the live one it encoded (the oldest beyond
/// [`MAX_EVENTS`] left out).
struct HistoryTail {
    /// The event the record adds, with its JSON, if any.
    added: Option<(ProcedureEvent, String)>,
}

pub(crate) struct Runner {
    inner: Arc<Inner>,
    epoch: u64,
    root: ProcedureId,
    procedure: BoxedProcedure,
    /// The last record persisted for the procedure — without its history, which is `live`'s (written with every
    /// record, so never behind it).
    record: ProcedureRecord,
    /// The write of its next record, `[Put { key, value }]` under the record's store key, kept from one write to
    /// the next so that its list and key are made once: each write lends it the record's bytes and takes them back
    /// (see `Runner::persist_with`). It holds the runner's only copy of the key.
    put: Vec<WriteOp>,
    /// A loader of its type is registered (checked at each step until it is).
    has_loader: bool,
    /// The epoch of this manager when it loaded the procedure from the store (not when it submitted it).
    recovered_by: Option<u64>,
    /// What it shows (its state, step, attempt, …) and its history, which it changes in place and shares with the
    /// manager's entry and the watchers (see `manager::live`).
    live: LiveHandle,
}

impl Drop for Runner {
    fn drop(&mut self) {
        // The history stays readable while the procedure is in memory; its JSON served only the writes. A finished
        // procedure's watchers are woken now, once its locks and admission slot are given back (they were dropped
        // before the runner: see `run_to_end`).
        self.live.done_writing();
    }
}

impl Runner {
    /// A runner of `record`'s procedure whose history is `live`'s (the entry's: the record's history went there
    /// when the entry was made, so the record's own copy is dropped).
    pub(crate) fn new(
        inner: Arc<Inner>,
        epoch: u64,
        (root, live): (ProcedureId, LiveHandle),
        mut record: ProcedureRecord,
        key: String,
        procedure: BoxedProcedure,
        recovered: bool,
    ) -> Self {
        record.events = Vec::new();
        Runner {
            inner,
            epoch,
            root,
            procedure,
            put: vec![WriteOp::Put {
                key,
                value: Vec::new(),
            }],
            has_loader: false,
            record,
            recovered_by: recovered.then_some(epoch),
            live,
        }
    }

    fn id(&self) -> &ProcedureId {
        &self.record.id
    }

    fn live(&self) -> MutexGuard<'_, Live> {
        self.live.lock()
    }

    /// Adds an event to the history (kept in memory until the next write takes it along).
    fn event(&self, kind: EventKind) {
        // The observer is looked up (a read lock and a reference count) for a retry only, not for every event.
        if let EventKind::Retry { step, error, .. } = &kind
            && let Some(observer) = self.inner.observer()
        {
            observer.retried(&self.record.type_name, step.as_deref(), error);
        }
        self.live().push(now_ms(), kind);
    }

    /// Makes the live history the one of the record just written: the live one [`Runner::next_record`] encoded plus
    /// the event `tail` adds (with its JSON), bounded like every history. Only this runner changes its history, and
    /// not while it writes, so the live one is still the one that was encoded.
    fn written_history(&self, tail: HistoryTail) {
        let mut live = self.live();
        let live = &mut *live;
        if let Some((event, json)) = tail.added {
            let complete = live.encoded.len() == live.events.len();
            live.events.push(event);
            if complete {
                live.encoded.push_json(&json);
            } else {
                // Not fully encoded (cannot happen after `next_record`): encode afresh at the next write rather
                // than keep JSON that does not match its event.
                live.encoded.clear();
            }
        }
        let extra = live.events.len().saturating_sub(MAX_EVENTS);
        if extra > 0 {
            live.events.drain(..extra);
            live.encoded.drop_oldest(extra);
        }
    }

    /// What the procedure shows: its last record with `state` and `error`, plus the live introspection and (for a
    /// finished state only, as that is copied once) its history. Built for the states that go through the manager's
    /// entry: a finished one, a stall, a refusal.
    fn info(&self, state: ProcedureState, error: Option<String>) -> ProcedureInfo {
        let r = &self.record;
        let step_name = self.procedure.step_name();
        let live = self.live();
        let shown = &live.shown;
        // Built field by field (not from `ProcedureInfo::from(&self.record)`): the record's own copies of the
        // history and the error would be cloned only to be replaced.
        ProcedureInfo {
            id: r.id.clone(),
            type_name: r.type_name.clone(),
            parent_id: r.parent_id.clone(),
            state,
            step: r.step,
            output: r.output.clone(),
            error,
            created_at_ms: r.created_at_ms,
            updated_at_ms: r.updated_at_ms,
            step_name,
            attempt: shown.attempt,
            last_error: shown.last_error.clone(),
            next_retry_at_ms: shown.next_retry_at_ms,
            step_started_at_ms: shown.step_started_at_ms,
            lock_keys: r.lock_keys.clone(),
            locks_held: Vec::new(),
            lock_wait: None,
            events: if state.is_finished() {
                live.events.clone()
            } else {
                Vec::new()
            },
            refusal: None,
        }
    }

    /// Shows `state` and `error` with the procedure's last record and its current step's name (nothing is
    /// written). An unfinished state changes the live state in place, under this procedure's lock only; a finished
    /// one is the procedure's last word, published through the manager's entry with its history.
    fn publish(&self, state: ProcedureState, error: Option<String>) {
        if state.is_finished() {
            return self.publish_finished(state, error);
        }
        let step_name = self.procedure.step_name();
        let mut live = self.live();
        self.show_record(&mut live.shown, state, error);
        live.shown.step_name = step_name;
    }

    /// Publishes a finished state, the procedure's last word, through the manager's entry, with the history
    /// **moved** out of the live state, not copied: the runner writes nothing more. The move and the entry's change
    /// happen under the manager's state lock (so a reader under it sees the history in the live state or in the
    /// entry, never in neither) and under the live state's lock, which also marks the live state finished and keeps
    /// the finished state there for the procedure's watchers. Their channel is sent on at the runner's very end
    /// (see [`LiveHandle::done_writing`]).
    fn publish_finished(&self, state: ProcedureState, error: Option<String>) {
        // The history is kept at its length for as long as the finished procedure stays in memory, without the room
        // it had to grow; only this runner adds events, and it adds none after its last write.
        self.live().events.shrink_to_fit();
        // Built outside the manager's state lock (every runner takes it), without the history.
        let mut info = self.info(ProcedureState::Running, error);
        info.state = state;
        let mut entries = self.inner.state();
        let Some(entry) = entries.procedures.get_mut(&self.record.id) else {
            return;
        };
        let mut live = self.live();
        self.inner.history_room.note(&live);
        info.events = std::mem::take(&mut live.events);
        live.encoded.clear();
        live.shown.state = state;
        let info = Arc::new(info);
        let (replaced, channel) = entry.finish(Arc::clone(&info));
        drop(entries);
        live.finished = Some(Arc::clone(&info));
        live.to_send = channel.map(|channel| (channel, info));
        drop(live);
        // The replaced information is dropped after both locks.
        drop(replaced);
    }

    /// Shows the record just written: its state, error and step name ([`Runner::publish`] without asking the
    /// procedure for its step's name, which the record holds).
    fn publish_written(&self) {
        let (state, error) = (self.record.state, self.record.error.clone());
        if state.is_finished() {
            return self.publish(state, error);
        }
        let mut live = self.live();
        self.show_record(&mut live.shown, state, error);
        live.shown.step_name.clone_from(&self.record.step_name);
    }

    /// `shown` with `state`, `error` and what the last record says (step, update time, lock keys).
    fn show_record(&self, shown: &mut ProcedureInfo, state: ProcedureState, error: Option<String>) {
        let r = &self.record;
        shown.state = state;
        shown.error = error;
        shown.step = r.step;
        shown.updated_at_ms = r.updated_at_ms;
        if shown.lock_keys != r.lock_keys {
            shown.lock_keys.clone_from(&r.lock_keys);
        }
    }

    /// Halts the manager on a fatal error; a fence is noted in the history first (in memory: nothing more is
    /// written by this manager).
    fn halt_on(&self, e: &Error) {
        if let Error::Fenced { epoch, .. } = e {
            self.event(EventKind::Fenced { epoch: *epoch });
        }
        self.inner.halt_on(e);
    }

    /// The procedure and its ancestors (parent first) for the lock table, from the parent links this manager knows.
    fn requester(&self) -> Requester {
        let mut who = descendant_of(self.id().clone(), &self.inner, &self.record);
        // A parent this manager does not know cuts the walk short; the tree's root is an ancestor all the same.
        if &self.root != self.id() && !who.ancestors.contains(&self.root) {
            who.ancestors.push(self.root.clone());
        }
        who
    }

    /// Runs the procedure until it is done, failed, or stopped. A panic in the procedure stops it like a write that
    /// fails for good (no further write, its watchers resolve, its locks and slot are released): without this the
    /// task would end silently and leave its watchers and its parent waiting forever.
    pub(crate) async fn run(mut self: Box<Self>, resume: Resume) {
        // The runner is dropped here, after its run (its keys and slot went at the run's end): its watchers are
        // woken last (see `Runner::drop`).
        let Err(panic) = AssertUnwindSafe(self.run_to_end(resume))
            .catch_unwind()
            .await
        else {
            return;
        };
        Self::stall_on_panic(&self.inner, &self.record.id, panic);
    }

    /// Shows a procedure whose step panicked as stalled, with the panic's text, and closes its channel.
    fn stall_on_panic(inner: &Inner, id: &ProcedureId, panic: Box<dyn std::any::Any + Send>) {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-text panic payload".to_string());
        tracing::error!(%id, panic = %message, "procedure stalls: it panicked");
        let stalled = inner.with_entry(id, |entry| {
            if entry.info.state.is_finished() {
                return false;
            }
            let mut info = ProcedureInfo::clone(&entry.info);
            let reason = format!("the procedure panicked: {message}");
            info.state = ProcedureState::Stalled;
            info.error = Some(reason.clone());
            info.last_error = Some(reason.clone());
            info.next_retry_at_ms = None;
            let stalled = EventKind::Stalled {
                reason: truncate_text(&reason),
            };
            entry.add_event(&mut info, stalled, false);
            entry.close(info);
            true
        });
        if stalled == Some(true) {
            inner.stalled_total.fetch_add(1, Ordering::Relaxed);
        }
    }

    async fn run_to_end(&mut self, resume: Resume) {
        if let Some(epoch) = self.recovered_by {
            self.event(EventKind::Recovered { epoch });
            self.publish(self.record.state, self.record.error.clone());
        }
        let keys = self.procedure.lock_key();
        // Locks before the admission slot: a procedure holding a slot never waits for a lock, so waiting for locks
        // cannot starve the procedures (children included) that would release them. A procedure that takes no key
        // never waits for one and is in nobody's way (the lock table's listings show only the procedures that hold
        // or wait for keys): it skips the table, and the walk of its ancestors made for it.
        let _locks = if keys.keys().is_empty() {
            None
        } else {
            match self.take_locks(&keys).await {
                Some(guard) => Some(guard),
                None => return,
            }
        };
        let Ok(permit) = self.inner.admission().acquire_owned().await else {
            return;
        };
        let _ = match resume {
            Resume::Execute => self.execute_loop(permit).await,
            Resume::RollBack(cause) => {
                let _permit = permit;
                Box::pin(self.roll_back_and_fail(cause)).await
            }
        };
    }

    /// Takes the procedure's `keys` in the lock table, waiting (shown, with its events) while another procedure is in
    /// the way. `None` when the procedure ended instead: cancelled while it waited, or failed because its keys would
    /// deadlock with its own tree.
    async fn take_locks(&mut self, keys: &LockKey) -> Option<LockGuard> {
        let requester = self.requester();
        let table = Arc::clone(&self.inner.locks);
        // Boxed, so a cancel while waiting can drop the request (leaving the lock queues) before it writes.
        let mut acquire = Box::pin(table.acquire(&requester, keys));
        let acquired = match futures::poll!(&mut acquire) {
            std::task::Poll::Ready(acquired) => acquired,
            std::task::Poll::Pending => {
                // Queued: the lock table knows what it waits for (the request was queued by the first poll).
                let waiting = self
                    .inner
                    .locks
                    .procedure_locks(self.id())
                    .and_then(|l| l.waiting);
                let started = Instant::now();
                if let Some(wait) = &waiting {
                    self.event(EventKind::LockWaitBegan {
                        key: wait.key.clone(),
                        holder: wait.blocked_by.clone(),
                    });
                    self.publish(self.record.state, self.record.error.clone());
                }
                let acquired = tokio::select! {
                    acquired = &mut acquire => acquired,
                    () = self.cancel_requested(), if self.may_cancel_without_locks() => {
                        // Nothing of it ran (or it cannot undo anything): it ends cancelled without its keys. Dropping
                        // the request leaves the lock queues.
                        drop(acquire);
                        let _ = Box::pin(self.cancel_run(true)).await;
                        return None;
                    }
                };
                if let (Some(wait), Ok(_)) = (waiting, &acquired) {
                    self.event(EventKind::LockWaitEnded {
                        key: wait.key,
                        waited_ms: started.elapsed().as_millis() as u64,
                    });
                }
                acquired
            }
        };
        match acquired {
            Ok(guard) => Some(guard),
            Err(e) => {
                // Its locks would deadlock with its own tree: it fails without a step (its parent then fails).
                let _ = Box::pin(self.fail(e)).await;
                None
            }
        }
    }

    async fn execute_loop(&mut self, mut permit: OwnedSemaphorePermit) -> Result<(), Stopped> {
        let ctx = Context::with_hook(self.id().clone(), self.inner.hook.clone())
            .run_by(self.epoch, Arc::clone(&self.inner.halted_probe));
        let deadline = self.procedure.timeout().map(|t| (Instant::now() + t, t));
        if !self.record.waiting_for.is_empty() {
            // Recovered after persisting a suspension: the children its record names finish before its next step.
            let watchers = Box::pin(self.recorded_children()).await?;
            let (slot, failed) =
                Box::pin(self.wait_children_without_slot(permit, watchers)).await?;
            permit = slot;
            if let Some(error) = failed {
                return Box::pin(self.fail(error)).await;
            }
        }
        // Built when a step first fails (most never do), and dropped when a step returns.
        let mut retry = None;
        loop {
            if self.inner.is_halted() {
                return Err(Stopped);
            }
            permit = match self.boundary(permit).await? {
                Boundary::Run(permit) => permit,
                Boundary::Cancel(permit) => {
                    let _permit = permit;
                    return Box::pin(self.cancel_run(false)).await;
                }
            };
            let step = self.procedure.step_name();
            let started = Instant::now();
            // The step starts, shown in place: its attempt, its start, its name and its event, in one pass under
            // this procedure's own lock (the state and error shown stay: a retried step still shows `retrying`).
            let attempt = {
                let now = now_ms();
                let mut live = self.live();
                let shown = &mut live.shown;
                shown.attempt += 1;
                shown.step_started_at_ms = Some(now);
                shown.next_retry_at_ms = None;
                shown.step_name.clone_from(&step);
                let attempt = shown.attempt;
                live.push(
                    now,
                    EventKind::StepStarted {
                        step: step.clone(),
                        attempt,
                    },
                );
                attempt
            };
            // A cancel or pause the manager learns of while the step runs (its own request at once, another
            // process's at the next poll of the control keys) drops the step's future where it awaits, and what
            // follows works from the last persisted record, as a recovery after a crash at that await would: see
            // `Runner::interrupted`. Only `execute` is raced: the write of what it returned (its record, and the
            // step's own writes committed with it) is never interrupted, so they land whole or not at all. A step
            // that finishes in the same poll as the request wins (`biased`): its result is kept, and the boundary
            // then honours the request. A procedure whose type has no loader cannot be rebuilt from its record, so
            // its step is not interrupted: the request waits for the step's end, as at any boundary.
            let step_run = execute_step(&mut self.procedure, &ctx, &self.record.id, deadline);
            // Loaders are only ever added: once found, the type's loader is there for good.
            self.has_loader = self.has_loader || self.inner.has_loader(&self.record.type_name);
            let result = if self.has_loader {
                // Borrowed, not cloned: a step that finishes at its first poll never polls it (`biased`).
                let interrupt = interrupt_requested(&self.inner, &self.record.id);
                let raced = tokio::select! {
                    biased;
                    result = step_run => Some(result),
                    () = interrupt => None,
                };
                let Some(result) = raced else {
                    if self.inner.is_halted() {
                        return Err(Stopped);
                    }
                    self.interrupted(step)?;
                    continue;
                };
                result
            } else {
                step_run.await
            };
            // A manager halted during the step (fenced: another manager runs the procedure now) acts on nothing
            // the step returned: no write, no retry, no child, no rollback.
            if self.inner.is_halted() {
                return Err(Stopped);
            }
            if result.is_ok() {
                self.step_finished(step.clone(), started);
            }
            // A step's own writes commit with its next record; a refusal of theirs is the step's error.
            let result = match result {
                Ok(Status::Executing { writes, .. }) if !writes.is_empty() => {
                    match self
                        .persist_step_writes(ProcedureState::Running, None, None, writes)
                        .await?
                    {
                        Ok(()) => {
                            retry = None;
                            continue;
                        }
                        Err(e) => Err(e),
                    }
                }
                Ok(Status::Done { output, writes }) if !writes.is_empty() => {
                    match self
                        .persist_step_writes(
                            ProcedureState::Done,
                            output,
                            Some(EventKind::Done),
                            writes,
                        )
                        .await?
                    {
                        Ok(()) => return Ok(()),
                        Err(e) => Err(e),
                    }
                }
                other => other,
            };
            match result {
                Ok(Status::Executing { persist, .. }) => {
                    retry = None;
                    if persist {
                        self.persist_step().await?;
                    } else {
                        self.publish(self.record.state, None);
                    }
                }
                Ok(Status::Suspended {
                    subprocedures,
                    persist,
                }) => {
                    retry = None;
                    self.event(EventKind::Suspended {
                        children: subprocedures.len(),
                    });
                    self.publish(self.record.state, None);
                    if let Err(e) = self.check_children_locks(&subprocedures) {
                        return Box::pin(self.fail(e)).await;
                    }
                    let watchers = if persist {
                        Box::pin(self.persist_suspension(subprocedures)).await?
                    } else {
                        Box::pin(self.start_children(subprocedures)).await?
                    };
                    let (slot, failed) =
                        Box::pin(self.wait_children_without_slot(permit, watchers)).await?;
                    permit = slot;
                    if let Some(error) = failed {
                        return Box::pin(self.fail(error)).await;
                    }
                }
                Ok(Status::Done { output, .. }) => {
                    return self.finish(output).await;
                }
                Err(e) if e.is_fatal() => {
                    self.halt_on(&e);
                    return Err(Stopped);
                }
                // A refusal of a root's request while nothing after its first record was written: no record is
                // left. Later, it is an ordinary failure (below).
                Err(Error::Refused { refusal, source })
                    if self.record.step == 0 && self.record.parent_id.is_none() =>
                {
                    return Box::pin(self.refuse(refusal, source.to_string())).await;
                }
                Err(e) if e.is_retryable() => match retry
                    .get_or_insert_with(|| backoff(&self.inner.config.step_retry))
                    .next()
                {
                    Some(delay) => {
                        tracing::debug!(id = %self.id(), error = %e, ?delay, "retrying a step");
                        let text = e.to_string();
                        {
                            let mut live = self.live();
                            live.shown.last_error = Some(text.clone());
                            live.shown.next_retry_at_ms =
                                Some(now_ms().saturating_add(delay.as_millis() as u64));
                        }
                        self.event(EventKind::Retry {
                            step,
                            attempt,
                            error: truncate_text(&text),
                            delay_ms: delay.as_millis() as u64,
                        });
                        self.publish(ProcedureState::Retrying, Some(text));
                        // A cancel or pause ends the wait at once; the boundary then honours it.
                        tokio::select! {
                            () = tokio::time::sleep(delay) => {}
                            () = interrupt_requested(&self.inner, &self.record.id) => {}
                        }
                    }
                    None => {
                        let cause = format!(
                            "{e} (gave up after {attempt} attempt(s): the step's retries ran out)"
                        );
                        return Box::pin(self.fail_with(cause)).await;
                    }
                },
                Err(e) => return Box::pin(self.fail(e)).await,
            }
        }
    }

    /// The step in progress was dropped at an await because a cancel or pause arrived (see `execute_loop`); the
    /// next boundary honours the request (or runs the step again if it was withdrawn meanwhile).
    ///
    /// What the procedure works from next: its **last persisted record**, rebuilt by its registered loader as a
    /// recovering manager rebuilds it after a crash — not the in-memory procedure the step was changing. `execute`
    /// takes `&mut self` and may have changed the procedure's state before the await where it was dropped (a field
    /// set ahead of the effect it records, half of a list updated): nothing guarantees that state describes what
    /// happened outside, while the record does, and every step is written to resume from its record after a crash
    /// at any await (steps are idempotent; the crash matrices check it at every side-effect point and durable
    /// write). Reloading makes an interrupt exactly a crash at that await followed by a recovery in the same
    /// manager, which keeps the procedure's locks, so a rollback (cancel) or the step's re-run (pause, then resume)
    /// starts from a state the engine already proves safe. A loader that refuses the record stalls the procedure,
    /// as it would make a recovery fail.
    fn interrupted(&mut self, step: Option<String>) -> Result<(), Stopped> {
        tracing::info!(
            id = %self.id(),
            step = step.as_deref().unwrap_or("-"),
            "step interrupted by a cancel or pause request; going back to its last persisted record"
        );
        {
            let mut live = self.live();
            live.shown.step_started_at_ms = None;
            live.shown.next_retry_at_ms = None;
        }
        self.reload()
    }

    /// A step returned without error: its history entry, and the next step starts from attempt 0.
    fn step_finished(&self, step: Option<String>, started: Instant) {
        let elapsed = started.elapsed();
        if let Some(observer) = self.inner.observer() {
            observer.step_finished(&self.record.type_name, step.as_deref(), elapsed);
        }
        // Shown and noted in one pass under this procedure's lock.
        let mut live = self.live();
        live.shown.attempt = 0;
        live.shown.last_error = None;
        live.shown.next_retry_at_ms = None;
        live.shown.step_started_at_ms = None;
        live.push(
            now_ms(),
            EventKind::StepFinished {
                step,
                duration_ms: elapsed.as_millis() as u64,
            },
        );
    }

    /// What the control keys ask at a step boundary. A cancel is returned at once. A pause is persisted (a
    /// `paused` record with its event, unless the record is `paused` already, as after a restart) and the
    /// procedure waits — keeping its locks, giving its admission slot back — until the pause is withdrawn (then a
    /// `running` record with a `resumed` event) or a cancel arrives.
    async fn boundary(&mut self, permit: OwnedSemaphorePermit) -> Result<Boundary, Stopped> {
        let mut slot = Some(permit);
        // Subscribed to the control changes only once a pause makes the runner wait (a subscription is a count every
        // runner's thread would change at every boundary), and then before the requests are read again, so a change
        // between that read and the wait is not missed.
        let mut changed = None;
        loop {
            let control = self.inner.control_now(self.id()).await;
            if self.inner.is_halted() {
                return Err(Stopped);
            }
            if control.cancel {
                let permit = take_slot(&self.inner, slot).await?;
                return Ok(Boundary::Cancel(permit));
            }
            if !control.paused {
                let permit = take_slot(&self.inner, slot).await?;
                if self.record.state == ProcedureState::Paused {
                    tracing::info!(id = %self.id(), "procedure resumed");
                    Box::pin(self.persist(
                        ProcedureState::Running,
                        None,
                        None,
                        Some(EventKind::Resumed),
                    ))
                    .await?;
                }
                return Ok(Boundary::Run(permit));
            }
            let Some(changes) = changed.as_mut() else {
                changed = Some(self.inner.control_changed.subscribe());
                continue;
            };
            if self.record.state != ProcedureState::Paused {
                tracing::info!(id = %self.id(), "procedure paused");
                Box::pin(self.persist(ProcedureState::Paused, None, None, Some(EventKind::Paused)))
                    .await?;
            }
            slot = None;
            if changes.changed().await.is_err() {
                return Err(Stopped);
            }
        }
    }

    /// Resolves once this manager knows a cancel of the procedure is requested (never otherwise).
    fn cancel_requested(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        cancel_requested(Arc::clone(&self.inner), self.id().clone())
    }

    /// The procedure stalls in this manager, without another write: it shows `stalled` at its last persisted step
    /// with `reason` (and a `stalled` event), is counted in [`crate::LocalManager::stalled_count`], and its
    /// watchers resolve with [`Error::ManagerNotRunning`]. Its record is untouched: a later manager resumes it.
    fn stop_with(&self, reason: String) {
        {
            let mut live = self.live();
            live.shown.last_error = Some(reason.clone());
            live.shown.next_retry_at_ms = None;
        }
        self.event(EventKind::Stalled {
            reason: truncate_text(&reason),
        });
        let info = self.info(ProcedureState::Stalled, Some(reason));
        self.inner
            .with_entry(&self.record.id, |entry| entry.close(info));
        self.inner.stalled_total.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::local::NewProcedure;
    use crate::procedure::ProcedureWithId;
    use crate::testing::Steps;
    use crate::{ManagerConfig, MemoryStateStore};

    /// Every procedure's task holds its runner's future, allocated (and copied into place) at each submission. The
    /// paths a procedure rarely takes (failure, cancel, rollback, pause, children) are boxed when taken, so they do
    /// not set the size of every task: the bound is the run of steps and records.
    #[test]
    fn a_runner_task_holds_under_3_kib() {
        let inner = Inner::new(
            Arc::new(MemoryStateStore::new()),
            ManagerConfig::default(),
            None,
        );
        let id = ProcedureId::new("p");
        let new = NewProcedure::new(
            ProcedureWithId::new(id.clone(), Box::new(Steps::new(0, false))),
            None,
        )
        .unwrap();
        let live = LiveHandle::new(ProcedureInfo::from(&new.record));
        let runner = Box::new(Runner::new(
            inner,
            1,
            (id, live),
            new.record,
            new.key,
            new.procedure,
            false,
        ));
        let size = std::mem::size_of_val(&runner.run(Resume::Execute));
        assert!(
            size < 3 * 1024,
            "a runner's future is {size} bytes: box the await of a path most procedures never take"
        );
    }
}
