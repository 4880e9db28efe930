//! The run loop of one procedure: locks, admission, steps, persistence, children, retry, rollback.

use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::manager::local::{Inner, backoff};
use crate::procedure::{BoxedProcedure, Context, Output, ProcedureId, ProcedureWithId, Status};
use crate::record::{
    ProcedureInfo, ProcedureRecord, ProcedureState, RECORD_FORMAT_VERSION, now_ms, record_key,
};
use crate::store::{WriteOp, WriteOutcome};

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

pub(crate) struct Runner {
    inner: Arc<Inner>,
    epoch: u64,
    root: ProcedureId,
    procedure: BoxedProcedure,
    /// The last record persisted for the procedure.
    record: ProcedureRecord,
}

impl Runner {
    pub(crate) fn new(
        inner: Arc<Inner>,
        epoch: u64,
        root: ProcedureId,
        record: ProcedureRecord,
        procedure: BoxedProcedure,
    ) -> Self {
        Runner {
            inner,
            epoch,
            root,
            procedure,
            record,
        }
    }

    fn id(&self) -> &ProcedureId {
        &self.record.id
    }

    /// Runs the procedure until it is done, failed, or stopped.
    pub(crate) async fn run(mut self, resume: Resume) {
        let keys = self.procedure.lock_key();
        // Locks before the admission slot: a procedure holding a slot never waits for a lock, so waiting for locks
        // cannot starve the procedures (children included) that would release them.
        let _locks = self
            .inner
            .locks
            .acquire(&self.root, &self.record.id, &keys)
            .await;
        let Ok(permit) = Arc::clone(&self.inner.admission).acquire_owned().await else {
            return;
        };
        let _ = match resume {
            Resume::Execute => self.execute_loop(permit).await,
            Resume::RollBack(cause) => {
                let _permit = permit;
                self.roll_back_and_fail(cause).await
            }
        };
    }

    async fn execute_loop(&mut self, mut permit: OwnedSemaphorePermit) -> Result<(), Stopped> {
        let ctx = Context::with_hook(self.id().clone(), self.inner.hook.clone());
        let deadline = self.procedure.timeout().map(|t| (Instant::now() + t, t));
        let mut retry = backoff(&self.inner.config.step_retry);
        loop {
            if self.inner.is_halted() {
                return Err(Stopped);
            }
            let result = match deadline {
                None => self.procedure.execute(&ctx).await,
                Some((deadline, timeout)) => {
                    let timed_out = || Error::Timeout {
                        id: self.record.id.clone(),
                        timeout,
                    };
                    match deadline.checked_duration_since(Instant::now()) {
                        Some(left) if !left.is_zero() => {
                            match tokio::time::timeout(left, self.procedure.execute(&ctx)).await {
                                Ok(result) => result,
                                Err(_) => Err(timed_out()),
                            }
                        }
                        _ => Err(timed_out()),
                    }
                }
            };
            match result {
                Ok(Status::Executing { persist }) => {
                    retry = backoff(&self.inner.config.step_retry);
                    self.running_again();
                    if persist {
                        self.persist_step().await?;
                    }
                }
                Ok(Status::Suspended {
                    subprocedures,
                    persist,
                }) => {
                    retry = backoff(&self.inner.config.step_retry);
                    self.running_again();
                    if persist {
                        self.persist_step().await?;
                    }
                    // Give the slot back while the children run, so they can be admitted.
                    drop(permit);
                    let failed = self.run_children(subprocedures).await?;
                    permit = match Arc::clone(&self.inner.admission).acquire_owned().await {
                        Ok(permit) => permit,
                        Err(_) => return Err(Stopped),
                    };
                    if let Some(error) = failed {
                        return self.fail(error).await;
                    }
                }
                Ok(Status::Done { output }) => {
                    return self.finish(output).await;
                }
                Err(e) if e.is_fatal() => {
                    self.inner.halt_on(&e);
                    return Err(Stopped);
                }
                Err(e) if e.is_retryable() => match retry.next() {
                    Some(delay) => {
                        tracing::debug!(id = %self.id(), error = %e, ?delay, "retrying a step");
                        self.show(ProcedureState::Retrying, Some(e.to_string()));
                        tokio::time::sleep(delay).await;
                    }
                    None => return self.fail(e).await,
                },
                Err(e) => return self.fail(e).await,
            }
        }
    }

    /// Starts (or finds) every child and waits for all of them. `Ok(Some(error))` when one failed.
    async fn run_children(
        &mut self,
        children: Vec<ProcedureWithId>,
    ) -> Result<Option<Error>, Stopped> {
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
                    self.inner.halt_on(&e);
                    return Err(Stopped);
                }
                Err(e) => return Err(self.stop_on_child(&child_id, e)),
            }
        }
        // Every child ends before the parent goes on (or rolls back): the first failure is reported.
        let mut failed = None;
        for mut watcher in watchers {
            let child_id = watcher.id().clone();
            match watcher.wait().await {
                Ok(_) => {}
                Err(Error::ProcedureFailed { message, .. }) => {
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
    fn watch_child(&self, child: &ProcedureId) -> Result<Option<crate::Watcher>, Stopped> {
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

    fn stop_on_child(&self, child: &ProcedureId, e: Error) -> Stopped {
        tracing::warn!(id = %self.id(), %child, error = %e, "procedure stops: a subprocedure cannot finish here");
        self.stop_with(format!("waiting for subprocedure {child}: {e}"));
        Stopped
    }

    /// A non-retryable error: roll back if supported, then persist the failed state.
    async fn fail(&mut self, error: Error) -> Result<(), Stopped> {
        tracing::info!(id = %self.id(), %error, "procedure failed");
        let cause = error.to_string();
        if !self.procedure.rollback_supported() {
            return self
                .persist(ProcedureState::Failed, None, Some(cause))
                .await;
        }
        self.persist(ProcedureState::RollingBack, None, Some(cause.clone()))
            .await?;
        self.roll_back_and_fail(cause).await
    }

    /// Runs the rollback (retrying retryable errors), then persists the failed state.
    async fn roll_back_and_fail(&mut self, cause: String) -> Result<(), Stopped> {
        let ctx = Context::with_hook(self.id().clone(), self.inner.hook.clone());
        let mut retry = backoff(&self.inner.config.step_retry);
        let text = loop {
            if self.inner.is_halted() {
                return Err(Stopped);
            }
            match self.procedure.rollback(&ctx).await {
                Ok(()) => break format!("{cause} (rolled back)"),
                Err(e) if e.is_fatal() => {
                    self.inner.halt_on(&e);
                    return Err(Stopped);
                }
                Err(e) if e.is_retryable() => match retry.next() {
                    Some(delay) => {
                        self.show(
                            ProcedureState::RollingBack,
                            Some(format!("{cause}; rollback: {e}")),
                        );
                        tokio::time::sleep(delay).await;
                    }
                    None => break format!("{cause}; rollback failed: {e}"),
                },
                Err(e) => break format!("{cause}; rollback failed: {e}"),
            }
        };
        self.persist(ProcedureState::Failed, None, Some(text)).await
    }

    async fn finish(&mut self, output: Option<Output>) -> Result<(), Stopped> {
        self.persist(ProcedureState::Done, output, None).await
    }

    /// Persists a step of a running procedure.
    async fn persist_step(&mut self) -> Result<(), Stopped> {
        self.persist(ProcedureState::Running, None, None).await
    }

    /// Writes the next record (step + 1) and publishes it. On a write that fails for good, the procedure stops
    /// without any further write; the error shows in its information.
    async fn persist(
        &mut self,
        state: ProcedureState,
        output: Option<Output>,
        error: Option<String>,
    ) -> Result<(), Stopped> {
        if self.inner.is_halted() {
            return Err(Stopped);
        }
        let data = match self.procedure.dump() {
            Ok(data) => data,
            Err(e) if state.is_finished() || state == ProcedureState::RollingBack => {
                // The last persisted data still describes the procedure; the state change matters more.
                tracing::warn!(id = %self.id(), error = %e, "cannot dump procedure state; keeping the last one");
                self.record.data.clone()
            }
            Err(e) => {
                self.stop_with(format!("cannot dump its state: {e}"));
                return Err(Stopped);
            }
        };
        let record = ProcedureRecord {
            format_version: RECORD_FORMAT_VERSION,
            type_name: self.record.type_name.clone(),
            id: self.record.id.clone(),
            parent_id: self.record.parent_id.clone(),
            step: self.record.step + 1,
            state,
            data,
            output,
            error,
            created_at_ms: self.record.created_at_ms,
            updated_at_ms: now_ms(),
        };
        let value = match serde_json::to_vec(&record) {
            Ok(value) => value,
            Err(source) => {
                let e = Error::Serialize {
                    id: record.id.clone(),
                    what: "record",
                    source,
                };
                self.stop_with(e.to_string());
                return Err(Stopped);
            }
        };
        let key = record_key(&record.id);
        match self
            .inner
            .write(self.epoch, Vec::new(), vec![WriteOp::Put { key, value }])
            .await
        {
            Ok(WriteOutcome::Applied) => {
                self.record = record;
                let info = ProcedureInfo::from(&self.record);
                self.inner
                    .with_entry(&self.record.id, |entry| entry.publish(info));
                Ok(())
            }
            Ok(WriteOutcome::Rejected { current }) => {
                self.stop_with(format!(
                    "the state store refused the write of step {}: {current:?}",
                    record.step
                ));
                Err(Stopped)
            }
            Err(e) if e.is_fatal() => {
                self.inner.halt_on(&e);
                Err(Stopped)
            }
            Err(e) => {
                if !self.inner.is_halted() {
                    tracing::warn!(id = %self.id(), error = %e, "procedure stops: cannot persist its state");
                    self.stop_with(e.to_string());
                }
                Err(Stopped)
            }
        }
    }

    /// Shows a transient state in memory (nothing is written).
    fn show(&self, state: ProcedureState, error: Option<String>) {
        let mut info = ProcedureInfo::from(&self.record);
        info.state = state;
        info.error = error;
        info.updated_at_ms = now_ms();
        self.inner
            .with_entry(&self.record.id, |entry| entry.publish(info));
    }

    /// Back to `running` in memory after a retry succeeded.
    fn running_again(&self) {
        let shows_retry = self
            .inner
            .with_entry(&self.record.id, |e| e.info.state != self.record.state)
            .unwrap_or(false);
        if shows_retry {
            self.show(self.record.state, None);
        }
    }

    /// The procedure stops in this manager without another write: its information keeps the last persisted step
    /// and shows `error`; its watchers resolve with [`Error::ManagerNotRunning`].
    fn stop_with(&self, error: String) {
        let mut info = ProcedureInfo::from(&self.record);
        info.error = Some(error);
        self.inner
            .with_entry(&self.record.id, |entry| entry.close(info));
    }
}
