//! How a run ends other than by finishing: a refusal, a failure (with or without rollback), a cancel.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::control::control_key;
use crate::error::{Error, Result};
use crate::event::{EventKind, truncate_text};
use crate::manager::local::backoff;
use crate::procedure::Context;
use crate::record::{ProcedureState, now_ms, record_key};
use crate::store::{WriteOp, WriteOutcome};

use super::{CANCELLED_BY_REQUEST, Runner, Stopped};

impl Runner {
    /// The procedure refused its request in its first step ([`Error::Refused`]): its record (and any control
    /// request for it) is deleted in one write fenced by this manager's epoch, the manager forgets it, and its
    /// watchers get [`Error::ProcedureRefused`] with `refusal` and `text`. Nothing is counted as failed: a refused
    /// request is the caller's mistake, not a procedure that went wrong. A write that fails stalls the procedure
    /// as any other (its record stays; a later manager runs the first step again and refuses again).
    pub(super) async fn refuse(
        &mut self,
        refusal: crate::Refusal,
        text: String,
    ) -> Result<(), Stopped> {
        if self.inner.is_halted() {
            return Err(Stopped);
        }
        tracing::debug!(id = %self.id(), error = %text, "procedure refused its request");
        let ops = vec![
            WriteOp::Delete {
                key: record_key(self.id()),
            },
            WriteOp::Delete {
                key: control_key(self.id()),
            },
        ];
        match self
            .inner
            .write(
                self.epoch,
                Vec::new(),
                ops,
                std::slice::from_ref(&self.record.id),
            )
            .await
        {
            Ok(WriteOutcome::Applied) => {}
            Ok(WriteOutcome::Rejected { current }) => {
                self.stop_with(format!(
                    "the state store refused the deletion of its refused request's record: {current:?}"
                ));
                return Err(Stopped);
            }
            Err(e) if e.is_fatal() => {
                self.halt_on(&e);
                return Err(Stopped);
            }
            Err(e) => {
                self.stop_with(format!(
                    "cannot delete the record of its refused request: {e}"
                ));
                return Err(Stopped);
            }
        }
        let mut info = self.info(ProcedureState::Failed, Some(text.clone()));
        info.last_error = Some(text);
        info.refusal = Some(refusal);
        self.inner.forget(self.id(), info);
        Ok(())
    }

    /// A non-retryable error: roll back if supported, then persist the failed state.
    pub(super) async fn fail(&mut self, error: Error) -> Result<(), Stopped> {
        self.fail_with(error.to_string()).await
    }

    /// [`Runner::fail`] with the error's text.
    pub(super) async fn fail_with(&mut self, cause: String) -> Result<(), Stopped> {
        tracing::info!(id = %self.id(), error = %cause, "procedure failed");
        self.live().shown.last_error = Some(cause.clone());
        if !self.procedure.rollback_supported() {
            return self.persist_failed(cause).await;
        }
        let event = EventKind::RollingBack {
            error: truncate_text(&cause),
        };
        self.persist(
            ProcedureState::RollingBack,
            None,
            Some(cause.clone()),
            Some(event),
        )
        .await?;
        self.roll_back_and_fail(cause).await
    }

    /// Persists the failed state with `text`, and counts it.
    pub(super) async fn persist_failed(&mut self, text: String) -> Result<(), Stopped> {
        let event = EventKind::Failed {
            error: truncate_text(&text),
        };
        self.persist(ProcedureState::Failed, None, Some(text), Some(event))
            .await?;
        self.inner.failed_total.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Runs the rollback (retrying retryable errors), then persists the failed state — or the cancelled state when
    /// an operator's cancel caused it (its control key is still there until the `cancelled` record is written, so a
    /// manager that recovers the `rolling_back` record ends it the same way).
    pub(super) async fn roll_back_and_fail(&mut self, cause: String) -> Result<(), Stopped> {
        let rolled_back = self.roll_back(&cause).await?;
        if self.inner.control_now(self.id()).await.cancel {
            return self.persist_cancelled(rolled_back).await;
        }
        let text = match rolled_back {
            Ok(()) => format!("{cause} (rolled back)"),
            Err(e) => format!("{cause}; rollback failed: {e}"),
        };
        self.persist_failed(text).await
    }

    /// Runs the rollback, retrying its retryable errors; `Err(text)` when it did not complete. Its outcome is added
    /// to the history (a `rolled_back` event, written with the next record).
    pub(super) async fn roll_back(&mut self, cause: &str) -> Result<Result<(), String>, Stopped> {
        let inner = Arc::clone(&self.inner);
        let ctx = Context::with_hook(self.id().clone(), self.inner.hook.clone())
            .run_by(self.epoch, Arc::new(move || inner.is_halted()));
        let mut retry = backoff(&self.inner.config.step_retry);
        let outcome = loop {
            if self.inner.is_halted() {
                return Err(Stopped);
            }
            match self.procedure.rollback(&ctx).await {
                Ok(()) => break Ok(()),
                Err(e) if e.is_fatal() => {
                    self.halt_on(&e);
                    return Err(Stopped);
                }
                Err(e) if e.is_retryable() => match retry.next() {
                    Some(delay) => {
                        let text = format!("{cause}; rollback: {e}");
                        {
                            let mut live = self.live();
                            live.shown.last_error = Some(text.clone());
                            live.shown.next_retry_at_ms =
                                Some(now_ms().saturating_add(delay.as_millis() as u64));
                        }
                        self.event(EventKind::Retry {
                            step: Some("rollback".to_string()),
                            attempt: 0,
                            error: truncate_text(&e.to_string()),
                            delay_ms: delay.as_millis() as u64,
                        });
                        self.publish(ProcedureState::RollingBack, Some(text));
                        tokio::time::sleep(delay).await;
                    }
                    None => break Err(e.to_string()),
                },
                Err(e) => break Err(e.to_string()),
            }
        };
        if self.inner.is_halted() {
            return Err(Stopped);
        }
        self.live().shown.next_retry_at_ms = None;
        self.event(EventKind::RolledBack {
            completed: outcome.is_ok(),
            error: outcome.as_ref().err().map(|e| truncate_text(e)),
        });
        Ok(outcome)
    }

    /// Whether a cancel may end the procedure while it waits for its lock keys: when it has nothing to undo (a new
    /// submission whose first step never ran) or cannot undo anything. A recovered procedure that supports rollback
    /// waits for its keys and rolls back under them.
    pub(super) fn may_cancel_without_locks(&self) -> bool {
        !self.procedure.rollback_supported()
            || (self.recovered_by.is_none()
                && self.record.step == 0
                && self.record.state == ProcedureState::Running)
    }

    /// Ends the procedure cancelled: rolls back first when it supports rollback and may have done something (a
    /// `rolling_back` record with the cancel's event, then the rollback), then writes the `cancelled` record and
    /// deletes the control key in the same write.
    ///
    /// `before_locks`: it is cancelled while waiting for its lock keys (see [`Runner::may_cancel_without_locks`]):
    /// no rollback runs without the keys; a procedure that supports rollback has done nothing yet.
    pub(super) async fn cancel_run(&mut self, before_locks: bool) -> Result<(), Stopped> {
        tracing::info!(id = %self.id(), "procedure cancelled by request");
        self.event(EventKind::CancelRequested);
        if before_locks && self.procedure.rollback_supported() {
            let text = "cancelled before its first step (nothing to roll back)".to_string();
            return self.persist_cancelled_with(text).await;
        }
        if !self.procedure.rollback_supported() {
            let text = format!(
                "cancelled (no rollback: procedure type '{}' has none at this step)",
                self.record.type_name
            );
            return self.persist_cancelled_with(text).await;
        }
        if !self.may_roll_back_nothing() {
            self.persist(
                ProcedureState::RollingBack,
                None,
                Some(CANCELLED_BY_REQUEST.to_string()),
                Some(EventKind::RollingBack {
                    error: CANCELLED_BY_REQUEST.to_string(),
                }),
            )
            .await?;
        }
        let rolled_back = self.roll_back(CANCELLED_BY_REQUEST).await?;
        self.persist_cancelled(rolled_back).await
    }

    /// Whether the `rolling_back` record can be skipped: it is one already.
    pub(super) fn may_roll_back_nothing(&self) -> bool {
        self.record.state == ProcedureState::RollingBack
    }

    /// Writes the `cancelled` record saying how its rollback went.
    pub(super) async fn persist_cancelled(
        &mut self,
        rolled_back: Result<(), String>,
    ) -> Result<(), Stopped> {
        let text = match rolled_back {
            Ok(()) => "cancelled (rolled back)".to_string(),
            Err(e) => format!("cancelled; rollback failed: {e}"),
        };
        self.persist_cancelled_with(text).await
    }

    /// Writes the `cancelled` record with `text` and deletes the control key, in one write.
    pub(super) async fn persist_cancelled_with(&mut self, text: String) -> Result<(), Stopped> {
        let delete = WriteOp::Delete {
            key: control_key(self.id()),
        };
        self.persist_with(
            ProcedureState::Cancelled,
            None,
            Some(text),
            Some(EventKind::Cancelled),
            vec![delete],
        )
        .await?;
        self.inner.set_control(self.id(), None);
        Ok(())
    }
}
