//! A runner's children: suspending with sub-procedures (persisted with the parent's record), starting them, and
//! waiting for them without holding an admission slot.

use tokio::sync::OwnedSemaphorePermit;

use crate::error::{Error, Result};
use crate::manager::local::NewProcedure;
use crate::manager::lock::Requester;
use crate::procedure::{ProcedureId, ProcedureWithId};
use crate::record::{ProcedureState, record_key};
use crate::store::{Condition, WriteOp, WriteOutcome};
use crate::watcher::Watcher;

use super::{Runner, Stopped};

impl Runner {
    /// Refuses children whose lock keys would deadlock with this tree (see [`Requester`]), before anything of them
    /// is written.
    pub(super) fn check_children_locks(&self, children: &[ProcedureWithId]) -> Result<()> {
        let mut ancestors = vec![self.id().clone()];
        ancestors.extend(self.requester().ancestors);
        for child in children {
            let who = Requester {
                id: child.id.clone(),
                ancestors: ancestors.clone(),
            };
            self.inner.locks.check(&who, &child.procedure.lock_key())?;
        }
        Ok(())
    }

    /// Persists a suspension in ONE write: the parent's next record, naming every child in `waiting_for`, and the
    /// first record of every child not known yet (each conditional on its key being absent). Then starts those
    /// children and returns a watcher of every child, in the order given. A crash before the write replays the
    /// step; after it, the recovered parent waits for exactly these children, whose records exist.
    pub(super) async fn persist_suspension(
        &mut self,
        children: Vec<ProcedureWithId>,
    ) -> Result<Vec<Watcher>, Stopped> {
        let waiting_for: Vec<ProcedureId> = children.iter().map(|c| c.id.clone()).collect();
        // No event is added: the live history is the record's (`_tail` changes nothing).
        let (record, value, _tail) = self.next_record(
            ProcedureState::Running,
            None,
            None,
            waiting_for.clone(),
            None,
        )?;
        let step = record.step;
        // Children this manager knows already are only awaited; the others are reserved and written.
        let mut new: Vec<NewProcedure> = Vec::new();
        for child in children {
            let child_id = child.id.clone();
            if self.watch_child(&child_id)?.is_some() {
                continue;
            }
            let reserved = NewProcedure::new(child, Some(self.id()))
                .and_then(|mut prepared| self.inner.reserve(&mut prepared).map(|()| prepared));
            match reserved {
                Ok(prepared) => new.push(prepared),
                // Reserved meanwhile by someone else: awaited like a known child.
                Err(Error::DuplicateProcedure { .. }) => {}
                Err(e) => {
                    self.unreserve(&new);
                    return Err(self.stop_on_child(&child_id, e));
                }
            }
        }
        let key = record_key(self.id());
        loop {
            let mut conditions = Vec::with_capacity(new.len());
            let mut ops = Vec::with_capacity(new.len() + 1);
            let mut shown = Vec::with_capacity(new.len() + 1);
            ops.push(WriteOp::Put {
                key: key.clone(),
                value: value.clone(),
            });
            shown.push(self.id().clone());
            for child in &new {
                conditions.push(Condition::Absent {
                    key: child.key.clone(),
                });
                ops.push(WriteOp::Put {
                    key: child.key.clone(),
                    value: child.value.clone(),
                });
                shown.push(child.record.id.clone());
            }
            match self.inner.write(self.epoch, conditions, ops, &shown).await {
                Ok(WriteOutcome::Applied) => {
                    self.record = record;
                    self.publish(self.record.state, None);
                    for child in new {
                        if self.inner.launch(self.epoch, child).is_err() {
                            // Only a halted manager refuses to launch.
                            return Err(Stopped);
                        }
                    }
                    break;
                }
                Ok(WriteOutcome::Rejected { current }) => {
                    // Children persisted before without this manager knowing them: adopt and await them, and write
                    // the others.
                    let present: Vec<&String> = current
                        .iter()
                        .filter(|(_, value)| value.is_some())
                        .map(|(key, _)| key)
                        .collect();
                    let (existing, absent): (Vec<NewProcedure>, Vec<NewProcedure>) = new
                        .into_iter()
                        .partition(|child| present.contains(&&child.key));
                    new = absent;
                    if existing.is_empty() {
                        self.unreserve(&new);
                        self.stop_with(format!(
                            "the state store refused the write of step {step}: {current:?}"
                        ));
                        return Err(Stopped);
                    }
                    for child in existing {
                        let child_id = child.record.id.clone();
                        self.inner.unreserve(&child_id);
                        if let Err(e) = self.inner.adopt(&child_id).await {
                            self.unreserve(&new);
                            return Err(self.stop_on_child(&child_id, e));
                        }
                    }
                }
                Err(e) => {
                    self.unreserve(&new);
                    if e.is_fatal() {
                        self.halt_on(&e);
                    } else if !self.inner.is_halted() {
                        tracing::warn!(id = %self.id(), error = %e, "procedure stalls: cannot persist its suspension");
                        self.stop_with(e.to_string());
                    }
                    return Err(Stopped);
                }
            }
        }
        self.watch_children(&waiting_for)
    }

    /// Forgets the reservations of children whose records were not written.
    pub(super) fn unreserve(&self, children: &[NewProcedure]) {
        for child in children {
            self.inner.unreserve(&child.record.id);
        }
    }

    /// A watcher of every child in `ids`, each known to this manager.
    pub(super) fn watch_children(&self, ids: &[ProcedureId]) -> Result<Vec<Watcher>, Stopped> {
        let mut watchers = Vec::with_capacity(ids.len());
        for id in ids {
            match self.watch_child(id)? {
                Some(watcher) => watchers.push(watcher),
                None => {
                    let e = Error::ManagerNotRunning {
                        reason: format!("subprocedure {id} vanished"),
                    };
                    return Err(self.stop_on_child(id, e));
                }
            }
        }
        Ok(watchers)
    }

    /// Watchers of the children a recovered parent's record waits for: recovered by `start`, or loaded from the
    /// store now (finished ones included).
    pub(super) async fn recorded_children(&mut self) -> Result<Vec<Watcher>, Stopped> {
        let ids = self.record.waiting_for.clone();
        for id in &ids {
            if self.inner.is_halted() {
                return Err(Stopped);
            }
            if self.inner.with_entry(id, |_| ()).is_none()
                && let Err(e) = self.inner.adopt(id).await
            {
                if e.is_fatal() {
                    self.halt_on(&e);
                    return Err(Stopped);
                }
                return Err(self.stop_on_child(id, e));
            }
        }
        self.watch_children(&ids)
    }

    /// Starts (or finds) every child, each with its own submission write (a suspension that is not persisted).
    pub(super) async fn start_children(
        &mut self,
        children: Vec<ProcedureWithId>,
    ) -> Result<Vec<Watcher>, Stopped> {
        let mut watchers = Vec::with_capacity(children.len());
        for child in children {
            let child_id = child.id.clone();
            if let Some(watcher) = self.watch_child(&child_id)? {
                watchers.push(watcher);
                continue;
            }
            match self.inner.submit(child, Some(&self.record.id)).await {
                Ok(watcher) => watchers.push(watcher),
                Err(Error::DuplicateProcedure { .. }) => {
                    // Known in memory by now, or persisted earlier without this manager knowing it.
                    if self.inner.with_entry(&child_id, |_| ()).is_none()
                        && let Err(e) = self.inner.adopt(&child_id).await
                    {
                        return Err(self.stop_on_child(&child_id, e));
                    }
                    match self.watch_child(&child_id)? {
                        Some(watcher) => watchers.push(watcher),
                        None => {
                            let e = Error::ManagerNotRunning {
                                reason: format!("subprocedure {child_id} vanished"),
                            };
                            return Err(self.stop_on_child(&child_id, e));
                        }
                    }
                }
                Err(e) if e.is_fatal() => {
                    self.halt_on(&e);
                    return Err(Stopped);
                }
                Err(e) => return Err(self.stop_on_child(&child_id, e)),
            }
        }
        Ok(watchers)
    }

    /// Gives the admission slot back while the children run (so they can be admitted), waits for all of them, and
    /// takes a slot again. `Some(error)` when one failed.
    pub(super) async fn wait_children_without_slot(
        &mut self,
        permit: OwnedSemaphorePermit,
        watchers: Vec<Watcher>,
    ) -> Result<(OwnedSemaphorePermit, Option<Error>), Stopped> {
        drop(permit);
        let failed = self.wait_children(watchers).await?;
        match self.inner.admission().acquire_owned().await {
            Ok(permit) => Ok((permit, failed)),
            Err(_) => Err(Stopped),
        }
    }

    /// Waits for every child. `Ok(Some(error))` when one failed.
    pub(super) async fn wait_children(
        &mut self,
        watchers: Vec<Watcher>,
    ) -> Result<Option<Error>, Stopped> {
        // Every child ends before the parent goes on (or rolls back): the first failure is reported.
        let mut failed = None;
        for mut watcher in watchers {
            let child_id = watcher.id().clone();
            match watcher.wait().await {
                Ok(_) => {}
                Err(Error::ProcedureFailed { message, .. })
                | Err(Error::ProcedureCancelled { message, .. }) => {
                    failed.get_or_insert(Error::SubprocedureFailed {
                        parent: self.record.id.clone(),
                        child: child_id,
                        message,
                    });
                }
                Err(e) => {
                    if self.inner.is_halted() {
                        return Err(Stopped);
                    }
                    return Err(self.stop_on_child(&child_id, e));
                }
            }
        }
        Ok(failed)
    }

    /// A watcher of a known child; `Stopped` when the child is known but cannot be recovered (the parent then
    /// waits for a later manager that can run it, without writing).
    pub(super) fn watch_child(&self, child: &ProcedureId) -> Result<Option<Watcher>, Stopped> {
        let known = self.inner.with_entry(child, |e| {
            (e.unrecoverable, e.info.error.clone(), e.watcher())
        });
        match known {
            None => Ok(None),
            Some((true, error, _)) => {
                let e = Error::ManagerNotRunning {
                    reason: format!(
                        "subprocedure {child} cannot be recovered: {}",
                        error.unwrap_or_default()
                    ),
                };
                Err(self.stop_on_child(child, e))
            }
            Some((false, _, watcher)) => Ok(Some(watcher)),
        }
    }

    pub(super) fn stop_on_child(&self, child: &ProcedureId, e: Error) -> Stopped {
        tracing::warn!(id = %self.id(), %child, error = %e, "procedure stalls: a subprocedure cannot finish here");
        self.stop_with(format!("waiting for subprocedure {child}: {e}"));
        Stopped
    }
}
