//! Submission: a new root procedure (or the same id sent again), reserving its id, persisting its first record
//! and launching its runner.

use std::sync::Arc;

use tokio::sync::oneshot;

use crate::error::{Error, Result};
use crate::event::{EventKind, push_event};
use crate::manager::live::LiveHandle;
use crate::manager::lock::ProcedureLocks;
use crate::manager::runner::{Resume, Runner};
use crate::procedure::{BoxedProcedure, ProcedureId, ProcedureWithId};
use crate::record::{
    ProcedureInfo, ProcedureRecord, ProcedureState, RECORD_FORMAT_VERSION, declared_keys, now_ms,
    record_key,
};
use crate::store::{Condition, WriteOp, WriteOutcome};
use crate::watcher::Watcher;

use super::{Entry, Inner, Phase, State};

impl Inner {
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
        let mut new = NewProcedure::new(procedure, None)?;
        let id = new.record.id.clone();
        // Made before the manager's state lock (dropped unused when the id is known already): under it, only the
        // checks and the insert.
        let entry = Entry::to_run(
            ProcedureInfo::from(&new.record),
            id.clone(),
            &self.history_room,
        );
        new.reserved = entry.live.clone().map(|live| (id.clone(), live));
        {
            let mut state = self.state();
            if let Phase::Halted(reason) = &state.phase {
                return Err(reason.error());
            }
            // One look-up of the id, for the check and the insert.
            match state.procedures.entry(id.clone()) {
                std::collections::hash_map::Entry::Occupied(known) => {
                    return existing_watcher(known.get(), &new.record.type_name);
                }
                std::collections::hash_map::Entry::Vacant(vacant) => {
                    vacant.insert(entry);
                }
            }
        }
        // Boxed, so that a submission still pending after its first poll can move into a task.
        let mut settle = Box::pin(Arc::clone(self).settle_root(epoch, new));
        if let std::task::Poll::Ready(answer) = futures::poll!(&mut settle) {
            return answer;
        }
        let stopped = || Error::ManagerNotRunning {
            reason: format!("the manager stopped while procedure {id} was being submitted"),
        };
        let (tx, answer) = oneshot::channel();
        let spawned = self.tasks.spawn(epoch, async move {
            // The caller may be gone; the submission is settled all the same.
            let _ = tx.send(settle.await);
        });
        if !spawned {
            // Halted since the poll (`stop` may have drained the tasks already, so none may be spawned), or started
            // again: the write in flight is dropped like an aborted task; the next start recovers it if it landed.
            return Err(stopped());
        }
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
        let mut new = NewProcedure::new(procedure, None)?;
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
            let entry = Entry::to_run(
                ProcedureInfo::from(&new.record),
                id.clone(),
                &self.history_room,
            );
            new.reserved = entry.live.clone().map(|live| (id.clone(), live));
            state.procedures.insert(id.clone(), entry);
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
                if holds_own_record(&current, &key, &new.value) =>
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
    pub(super) async fn watch_stored(
        self: &Arc<Self>,
        id: &ProcedureId,
        type_name: &str,
    ) -> Result<Watcher> {
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
    pub(super) async fn settle_root(
        self: Arc<Self>,
        epoch: u64,
        mut new: NewProcedure,
    ) -> Result<Watcher> {
        let id = new.record.id.clone();
        let key = new.key.clone();
        // The record's bytes are lent to the write (each attempt hands the store its own copy) and taken back after
        // it, for the check of a refusal below: not copied once more for the lending.
        let ops = [WriteOp::Put {
            key: key.clone(),
            value: std::mem::take(&mut new.value),
        }];
        let outcome = self
            .write_joined(
                epoch,
                vec![Condition::Absent { key: key.clone() }],
                &ops,
                None,
                std::slice::from_ref(&id),
            )
            .await;
        if let [WriteOp::Put { value, .. }] = ops {
            new.value = value;
        }
        match outcome {
            Ok(WriteOutcome::Applied) => self.launch(epoch, new),
            // A retried write that finds exactly its own record: an earlier attempt landed but its answer was lost.
            Ok(WriteOutcome::Rejected { current })
                if holds_own_record(&current, &key, &new.value) =>
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
    pub(super) fn abandon(&self, id: &ProcedureId, why: &str) {
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
        let mut new = NewProcedure::new(procedure, parent)?;
        let id = new.record.id.clone();
        // Reserve the id in memory first, so two submissions of one id cannot both write.
        self.reserve(&mut new)?;
        let key = new.key.clone();
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
                    .any(|(k, v)| *k == new.key && v.as_ref() == Some(&new.value)) =>
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
    pub(crate) fn reserve(&self, new: &mut NewProcedure) -> Result<()> {
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
        let entry = Entry::to_run(
            ProcedureInfo::from(&new.record),
            root.clone(),
            &self.history_room,
        );
        let id = id.clone();
        new.reserved = entry.live.clone().map(|live| (root, live));
        state.procedures.insert(id, entry);
        Ok(())
    }

    /// Forgets a reservation whose record was not written.
    pub(crate) fn unreserve(&self, id: &ProcedureId) {
        self.state().procedures.remove(id);
    }

    /// Starts the runner of a reserved procedure whose first record is written, and returns its watcher. The runner
    /// and its task's future are built before the manager's state lock is taken, when the reservation handed over
    /// its live state; under the lock, only the checks, the watcher and the spawn.
    pub(crate) fn launch(self: &Arc<Self>, epoch: u64, new: NewProcedure) -> Result<Watcher> {
        let NewProcedure {
            record,
            key,
            procedure,
            reserved,
            ..
        } = new;
        let id = record.id.clone();
        let restarted = || Error::ManagerNotRunning {
            reason: format!("the manager restarted while procedure {id} was being submitted"),
        };
        let forgotten = || Error::ManagerNotRunning {
            reason: format!("procedure {id} was forgotten while it was being submitted"),
        };
        // Every submission reserves its id (`submit_root`, `submit_again`, `reserve`) before its first write.
        let Some((root, live)) = reserved else {
            return Err(forgotten());
        };
        let runner = Box::new(Runner::new(
            Arc::clone(self),
            epoch,
            (root, live.clone()),
            record,
            key,
            procedure,
            false,
        ));
        let task = Box::pin(runner.run(Resume::Execute));
        let watcher = {
            let state = self.state();
            if let Phase::Halted(reason) = &state.phase {
                return Err(reason.error());
            }
            if state.epoch != Some(epoch) {
                // A submission settled in its caller's poll outlived the run it was made in (stopped and started
                // again meanwhile): the new run loaded its record, if it landed, and runs it.
                return Err(restarted());
            }
            // The entry its reservation made, with the live state the runner was built with.
            state
                .procedures
                .get(&id)
                .filter(|entry| entry.live.as_ref().is_some_and(|l| l.same(&live)))
                .map(|entry| entry.watcher().stored_by_this_submission())
                .ok_or_else(forgotten)?
        };
        // Spawned after the state lock: a halt or a new run since the checks refuses it (the halt closed the
        // procedure's watchers already).
        if !self.tasks.spawn(epoch, task) {
            return Err(if self.is_halted() {
                self.halt_error()
            } else {
                restarted()
            });
        }
        Ok(watcher)
    }

    /// Starts the runner task of a procedure whose entry is already in `state`; `recovered` when its record was
    /// loaded from the store rather than written by this manager's submission.
    pub(super) fn spawn_locked(
        self: &Arc<Self>,
        state: &mut State,
        epoch: u64,
        record: ProcedureRecord,
        procedure: BoxedProcedure,
        resume: Resume,
        recovered: bool,
    ) {
        let Some(entry) = state.procedures.get_mut(&record.id) else {
            return;
        };
        // Every entry of a procedure to run is made with its live state (`Entry::to_run`); one made otherwise
        // gets it here, so the runner's history is always the one its readers see.
        let live = entry
            .live
            .get_or_insert_with(|| LiveHandle::new(ProcedureInfo::from(&record)))
            .clone();
        let key = record_key(&record.id);
        let runner = Box::new(Runner::new(
            Arc::clone(self),
            epoch,
            (entry.root.clone(), live),
            record,
            key,
            procedure,
            recovered,
        ));
        // Boxed where it is made: the task then holds a pointer, and spawning it (into the set, then the runtime's
        // cell) or storing its end moves that, not the runner's whole future, kilobytes, at each hand-over.
        // Under the caller's state lock, checked to be of the running run: the set is open for it.
        self.tasks.spawn(epoch, Box::pin(runner.run(resume)));
    }
}

/// Whether a refused write's `current` values show `key` holding exactly `value`: the write's own record, put by
/// an earlier attempt whose answer was lost.
fn holds_own_record(current: &[(String, Option<Vec<u8>>)], key: &str, value: &[u8]) -> bool {
    current
        .iter()
        .any(|(k, v)| k == key && v.as_deref() == Some(value))
}

/// Whether `record` ended failed after a rollback that completed (its last rollback event says so).
pub(super) fn rolled_back_failure(record: &ProcedureRecord) -> bool {
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

/// A watcher of the procedure a submission found under its id; [`Error::ProcedureIdInUse`] when it is of another
/// type than the submission.
pub(super) fn existing_watcher(entry: &Entry, submitted: &str) -> Result<Watcher> {
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
pub(super) fn with_locks(info: &mut ProcedureInfo, locks: ProcedureLocks) {
    info.locks_held = locks.held;
    info.lock_wait = locks.waiting;
}

pub(super) fn self_not_started() -> Error {
    Error::ManagerNotRunning {
        reason: "the manager has not been started".to_string(),
    }
}

/// A procedure about to be persisted for the first time: its submission record (step 0), the record's bytes, and
/// the procedure itself.
pub(crate) struct NewProcedure {
    pub(crate) record: ProcedureRecord,
    /// The store key of its record, made once.
    pub(crate) key: String,
    pub(crate) value: Vec<u8>,
    pub(crate) procedure: BoxedProcedure,
    /// Set once its id is reserved: the root of its tree and the live state of the entry the reservation made,
    /// which its runner will change.
    pub(crate) reserved: Option<(ProcedureId, LiveHandle)>,
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
            key: record_key(&record.id),
            record,
            value,
            procedure,
            reserved: None,
        })
    }
}
