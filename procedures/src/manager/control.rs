//! Control of running procedures: the manager's view of the control keys (cancel, pause, resume), its own
//! `cancel`/`pause`/`resume` (fenced writes of those keys), and the task that polls the keys written by other
//! processes — and the store's epoch, halting the manager as fenced as soon as a newer one claimed the store.
//!
//! The keys are the truth (see [`crate::control`]); the manager keeps a copy in memory that runners consult while
//! they wait or run a step (a cancel or pause in it interrupts the step), refreshed by the poll every
//! `control_poll_interval` and at once by the manager's own requests. A
//! runner reads the control keys from the store at each step boundary, so a request written anywhere is honoured at
//! the very next boundary. Runners reaching a boundary together share one read (see [`BoundaryScans`]), and on a
//! store that counts the changes to the keys ([`crate::StateStore::counts_changes`]) a boundary reads only when the
//! count moved since the read in force began.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use crate::control::{
    CONTROL_ALL_KEY, ControlAction, ControlOp, ControlRequest, ControlRequests, control_key,
    decide, read_one,
};
use crate::error::{Error, Result};
use crate::manager::local::{Inner, parse_epoch};
use crate::procedure::ProcedureId;
use crate::record::EPOCH_KEY;
use crate::store::{WriteOp, WriteOutcome};

/// The step boundaries' reads of the control keys: one scan of `control/` serves every runner that reached a
/// boundary before it began, so 64 procedures at their boundaries at once cost the store one read, not 64 — on
/// etcd each read is a request the leader answers only after applying the writes before it.
///
/// A runner needs a scan that **began after it reached its boundary** (one that began earlier may have missed a
/// request written meanwhile): it notes how many scans have begun; when no scan is in progress it scans itself,
/// else it waits for the scan in progress to end (every waiter is woken at once) and looks again — done once a
/// scan numbered higher than the one it noted has completed. Scans run one at a time.
#[derive(Debug, Default)]
pub(crate) struct BoundaryScans {
    /// Set while a scan is in progress (by the runner making it).
    scanning: AtomicBool,
    /// Scans begun so far (each takes the next number).
    begun: AtomicU64,
    /// The number of the last scan that completed.
    completed: AtomicU64,
    /// Woken whenever a scan ends.
    ended: tokio::sync::Notify,
    /// The runners waiting for a scan in progress, with the number of scans begun when each arrived: while a
    /// scan is retried (the store not answering), the ones it leaves waiting show as `retrying`, as each runner's
    /// own read did. A runner that finds no scan in progress scans at once and is never listed.
    waiting: std::sync::Mutex<Vec<(ProcedureId, u64)>>,
}

impl BoundaryScans {
    fn waiting(&self) -> std::sync::MutexGuard<'_, Vec<(ProcedureId, u64)>> {
        // Changes under this lock are a push or a removal: they cannot panic half-way.
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `scanner` and the runners still waiting for a scan (none of the scans completed so far began after they
    /// arrived): none of them goes on before the scan in progress ends.
    fn unserved(&self, scanner: &ProcedureId) -> Vec<ProcedureId> {
        let completed = self.completed.load(Ordering::SeqCst);
        let mut ids = vec![scanner.clone()];
        ids.extend(
            self.waiting()
                .iter()
                .filter(|(id, arrived)| *arrived >= completed && id != scanner)
                .map(|(id, _)| id.clone()),
        );
        ids
    }
}

/// A runner waiting for a scan in progress, listed until it leaves (also when its future is dropped).
struct Waiting<'a> {
    scans: &'a BoundaryScans,
    id: &'a ProcedureId,
}

impl<'a> Waiting<'a> {
    fn new(scans: &'a BoundaryScans, id: &'a ProcedureId, arrived: u64) -> Self {
        scans.waiting().push((id.clone(), arrived));
        Waiting { scans, id }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut waiting = self.scans.waiting();
        if let Some(at) = waiting.iter().position(|(w, _)| w == self.id) {
            waiting.swap_remove(at);
        }
    }
}

/// The scan in progress, held by the runner making it: when it ends (completed, or its future dropped) the next
/// scan may begin and every waiting runner looks again.
struct Scanning<'a>(&'a BoundaryScans);

impl<'a> Scanning<'a> {
    fn take(scans: &'a BoundaryScans) -> Option<Self> {
        scans
            .scanning
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
            // Made only when taken: a guard made and dropped would end the scan in progress.
            .then(|| Scanning(scans))
    }

    /// Scan `number` completed.
    fn completed(self, number: u64) {
        self.0.completed.fetch_max(number, Ordering::SeqCst);
        // Dropped now: the scan in progress is cleared, then the waiters are woken.
    }
}

impl Drop for Scanning<'_> {
    fn drop(&mut self) {
        // Cleared before the waiters are woken, so a waiter that must scan again finds no scan in progress; a scan
        // dropped before it completed leaves `completed` as it was, and a waiter scans instead.
        self.0.scanning.store(false, Ordering::SeqCst);
        self.0.ended.notify_waiters();
    }
}

/// Bumped by this manager's own changes of its requests (`set_control`, `control_all`): a scan that saw one
/// happen while it read does not replace the requests with what it read (it could be older).
#[derive(Debug, Default)]
pub(crate) struct LocalControlChanges(AtomicU64);

/// What the control keys ask of one procedure now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Control {
    /// Its cancel is requested.
    pub(crate) cancel: bool,
    /// It is paused (by its own request or with every procedure).
    pub(crate) paused: bool,
}

impl Inner {
    /// What the control keys ask of `id`, as this manager last saw them.
    pub(crate) fn control_of(&self, id: &ProcedureId) -> Control {
        if !self.any_control() {
            return Control::default();
        }
        let controls = self.controls_locked();
        let own = controls.procedures.get(id).copied();
        Control {
            cancel: own == Some(ControlAction::Cancel),
            paused: controls.all_paused || own == Some(ControlAction::Pause),
        }
    }

    /// [`Inner::control_of`] after a read of the control keys that began after this call (a step boundary), shared
    /// with the runners at their boundaries meanwhile (see [`BoundaryScans`]). While the read is retried the
    /// procedures waiting for it show the store's error. A store that cannot be read leaves the last known requests
    /// in force (logged); the poll tries again.
    ///
    /// A store that counts the changes to the control keys ([`crate::StateStore::counts_changes`]) spares the
    /// read while the count has not moved since the read in force began: every request written before this call is
    /// in it.
    pub(crate) async fn control_now(&self, id: &ProcedureId) -> Control {
        if let Some(count) = &self.control_changes {
            let now = count.load(Ordering::SeqCst);
            if self.controls_read.load(Ordering::SeqCst) > now {
                return self.control_of(id);
            }
        }
        let scans = &self.boundary_scans;
        let arrived = scans.begun.load(Ordering::SeqCst);
        let mut listed = None;
        loop {
            // Enabled before looking: a scan ending after the look wakes this runner.
            let ended = scans.ended.notified();
            let mut ended = std::pin::pin!(ended);
            ended.as_mut().enable();
            if scans.completed.load(Ordering::SeqCst) > arrived {
                break;
            }
            if let Some(scanning) = Scanning::take(scans) {
                let number = scans.begun.fetch_add(1, Ordering::SeqCst) + 1;
                self.scan_controls(id).await;
                scanning.completed(number);
                break;
            }
            if listed.is_none() {
                listed = Some(Waiting::new(scans, id, arrived));
            }
            ended.await;
        }
        drop(listed);
        self.control_of(id)
    }

    /// One boundary scan: every control key, read and put in force — unless this manager changed its requests
    /// while the scan read, in which case the scan reads again (what it read may predate the change), a few times
    /// at most. A retryable error is retried with the store retry policy, the runners left waiting shown as
    /// `retrying` meanwhile; a read that fails for good leaves the last known requests in force (logged).
    async fn scan_controls(&self, scanner: &ProcedureId) {
        for _ in 0..3 {
            let before = self.local_control_changes.0.load(Ordering::SeqCst);
            let noted = self.control_changes_now();
            let read = match ControlRequests::read(self.store.as_ref()).await {
                Err(e) if e.is_retryable() => {
                    let shown = self.boundary_scans.unserved(scanner);
                    self.read_shown(&shown, || ControlRequests::read(self.store.as_ref()))
                        .await
                }
                read => read,
            };
            match read {
                Ok(requests) => {
                    if self.local_control_changes.0.load(Ordering::SeqCst) == before {
                        self.set_controls(requests, noted);
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the control keys at a step boundary");
                    return;
                }
            }
        }
    }

    /// Records the request of `id` (`None`: none) and wakes the waiting runners if it changed.
    pub(crate) fn set_control(&self, id: &ProcedureId, action: Option<ControlAction>) {
        self.local_control_changes.0.fetch_add(1, Ordering::SeqCst);
        let changed = {
            let mut controls = self.controls();
            let before = controls.procedures.get(id).copied();
            match action {
                Some(action) => controls.procedures.insert(id.clone(), action),
                None => controls.procedures.remove(id),
            };
            before != action
        };
        if changed {
            self.control_changed.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Replaces every request with what the store holds, waking the waiting runners if anything changed.
    ///
    /// `noted`: the store's count of changes to the control keys when the read that found `requests` began (see
    /// [`Inner::control_changes_now`]). A read that began before the one in force is older than it and is dropped
    /// (a poll and a boundary reading at once); a newer one records its count, which lets the boundaries skip
    /// their read until the count moves.
    pub(crate) fn set_controls(&self, requests: ControlRequests, noted: Option<u64>) {
        let changed = {
            let mut controls = self.controls();
            if let Some(noted) = noted
                && noted.saturating_add(1) < self.controls_read.load(Ordering::SeqCst)
            {
                return;
            }
            let changed = *controls != requests;
            *controls = requests;
            // Before the count below: a boundary that sees the count skips the lock and reads only this flag.
            controls.note();
            if let Some(noted) = noted {
                // After the requests, under their lock: a boundary that sees the count sees them.
                self.controls_read
                    .fetch_max(noted.saturating_add(1), Ordering::SeqCst);
            }
            changed
        };
        if changed {
            self.control_changed.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// The store's count of changes to the control keys now, when it keeps one: noted before a read of the keys.
    pub(crate) fn control_changes_now(&self) -> Option<u64> {
        self.control_changes
            .as_ref()
            .map(|count| count.load(Ordering::SeqCst))
    }

    /// Cancels, pauses or resumes `id`: one write of its control key, conditional on this manager's epoch, then
    /// the procedure's runner is woken at once. [`Error::ControlUnknown`] for an id neither this manager nor its
    /// store knows; refused ([`Error::ControlRefused`]) for a finished one.
    pub(crate) async fn control(&self, id: &ProcedureId, op: ControlOp) -> Result<()> {
        let epoch = self.running_epoch()?;
        let known = self.with_entry(id, |e| e.state());
        // A finished procedure that left memory is judged by its record (a request for it is refused as finished).
        let stored = match known {
            Some(_) => None,
            None => self.stored_finished(id).await?.map(|info| info.state),
        };
        let Some(state) = known.or(stored) else {
            return Err(Error::ControlUnknown {
                action: op.as_str(),
                id: id.clone(),
                key: crate::record::record_key(id),
            });
        };
        let current = self.read(|| read_one(self.store.as_ref(), id)).await?;
        let Some(write) = decide(op, id, state, current)? else {
            self.set_control(id, current);
            return Ok(());
        };
        let action = match &write {
            WriteOp::Put { value, .. } => ControlRequest::from_bytes(value).map(|r| r.action),
            WriteOp::Delete { .. } => None,
        };
        self.fenced_control_write(epoch, write).await?;
        self.set_control(id, action);
        Ok(())
    }

    /// Pauses (`true`) or resumes every procedure: one fenced write of [`CONTROL_ALL_KEY`].
    pub(crate) async fn control_all(&self, pause: bool) -> Result<()> {
        let epoch = self.running_epoch()?;
        let write = if pause {
            WriteOp::Put {
                key: CONTROL_ALL_KEY.to_string(),
                value: ControlRequest::now(ControlAction::Pause).to_bytes(),
            }
        } else {
            WriteOp::Delete {
                key: CONTROL_ALL_KEY.to_string(),
            }
        };
        self.fenced_control_write(epoch, write).await?;
        self.local_control_changes.0.fetch_add(1, Ordering::SeqCst);
        let changed = {
            let mut controls = self.controls();
            let changed = controls.all_paused != pause;
            controls.all_paused = pause;
            changed
        };
        if changed {
            self.control_changed.send_modify(|n| *n = n.wrapping_add(1));
        }
        Ok(())
    }

    async fn fenced_control_write(&self, epoch: u64, write: WriteOp) -> Result<()> {
        match self.write(epoch, Vec::new(), vec![write], &[]).await {
            Ok(WriteOutcome::Applied) => Ok(()),
            // Only the epoch condition can refuse it, and that comes back as `Fenced`.
            Ok(WriteOutcome::Rejected { current }) => Err(Error::ManagerNotRunning {
                reason: format!("the state store refused a control write: {current:?}"),
            }),
            Err(e) => {
                if e.is_fatal() {
                    self.halt_on(&e);
                }
                Err(e)
            }
        }
    }
}

/// How often the control keys are read anyway while the store watches them (a safety net for a change the watch
/// did not tell of).
const WATCHED_POLL: std::time::Duration = std::time::Duration::from_secs(5);

/// The poll task: reads every control key, hands the requests to the runners, and deletes the keys left for
/// procedures this manager knows as finished (a request that arrived as it finished). When the store watches the
/// control keys and the epoch key ([`crate::StateStore::watch_changes`]), it reads them when they change, and
/// otherwise every [`WATCHED_POLL`] (or `control_poll_interval`, if longer); else every `control_poll_interval`.
pub(crate) async fn run(inner: Weak<Inner>) {
    let (interval, watches) = match inner.upgrade() {
        Some(inner) => (
            inner.config.control_poll_interval,
            inner
                .store
                .watch_changes(crate::control::CONTROL_PREFIX)
                .zip(inner.store.watch_changes(EPOCH_KEY)),
        ),
        None => return,
    };
    let Some((mut control, mut epoch)) = watches else {
        loop {
            tokio::time::sleep(interval).await;
            let Some(inner) = inner.upgrade() else {
                return;
            };
            if inner.is_halted() {
                return;
            }
            poll(&inner).await;
        }
    };
    let pause = interval.max(WATCHED_POLL);
    loop {
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            changed = control.changed() => if changed.is_err() { return },
            changed = epoch.changed() => if changed.is_err() { return },
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if inner.is_halted() {
            return;
        }
        poll(&inner).await;
    }
}

/// One poll (see [`run`]).
pub(crate) async fn poll(inner: &Arc<Inner>) {
    let epoch = inner.state().epoch;
    // A newer manager claimed the store: halt now, not only at this manager's next write, so a step with several
    // outside effects (a bootstrap creating topics batch after batch) stops at its next side-effect point or await.
    if let Some(own) = epoch
        && let Ok(Some(bytes)) = inner.store.get(EPOCH_KEY).await
        && let Some(current) = parse_epoch(&bytes)
        && current > own
    {
        inner.halt_on(&Error::Fenced {
            epoch: current,
            own,
        });
        return;
    }
    let mut noted = inner.control_changes_now();
    let mut requests = match ControlRequests::read(inner.store.as_ref()).await {
        Ok(requests) => requests,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the control keys; keeping the last ones");
            return;
        }
    };
    // Keys of procedures this manager knows as finished are stale (a request that arrived as it finished) — when
    // they were finished before the scan that found the key: a procedure finishing during the scan is left for the
    // next poll, since its own last write may be the one deleting its key. So the finished ones among the keys'
    // procedures are noted, and the keys read again. (Only the procedures that have a key are looked at: a poll
    // costs nothing per procedure the manager holds.)
    let mut finished = std::collections::BTreeSet::new();
    if !requests.procedures.is_empty() {
        {
            let state = inner.state();
            for id in requests.procedures.keys() {
                if state
                    .procedures
                    .get(id)
                    .is_some_and(|e| e.info.state.is_finished() && !e.unrecoverable)
                {
                    finished.insert(id.clone());
                }
            }
        }
        if !finished.is_empty() {
            noted = inner.control_changes_now();
            requests = match ControlRequests::read(inner.store.as_ref()).await {
                Ok(requests) => requests,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the control keys; keeping the last ones");
                    return;
                }
            };
        }
    }
    let stale: Vec<WriteOp> = requests
        .procedures
        .keys()
        .filter(|id| finished.contains(*id))
        .map(|id| WriteOp::Delete {
            key: control_key(id),
        })
        .collect();
    inner.set_controls(requests, noted);
    if let (Some(epoch), false) = (epoch, stale.is_empty())
        && let Err(e) = inner.write(epoch, Vec::new(), stale, &[]).await
    {
        if e.is_fatal() {
            inner.halt_on(&e);
        } else {
            tracing::warn!(error = %e, "cannot delete the control keys of finished procedures");
        }
    }
}
