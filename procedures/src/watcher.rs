//! [`Watcher`]: how a submitter waits for a procedure's result.

use std::sync::Arc;

use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::manager::live::LiveHandle;
use crate::procedure::{Output, ProcedureId};
use crate::record::{ProcedureInfo, ProcedureState};

/// Follows one procedure until it finishes.
#[derive(Clone, Debug)]
pub struct Watcher {
    id: ProcedureId,
    rx: watch::Receiver<Arc<ProcedureInfo>>,
    stored: bool,
    /// What the procedure shows while a runner of this manager runs it (the channel then carries only its end).
    live: Option<LiveHandle>,
}

impl Watcher {
    /// A watcher over the manager's state channel of procedure `id` (the information is shared, not copied, with
    /// every watcher).
    pub fn new(id: ProcedureId, rx: watch::Receiver<Arc<ProcedureInfo>>) -> Self {
        Watcher {
            id,
            rx,
            stored: false,
            live: None,
        }
    }

    /// This watcher, reading what the procedure shows until its end from `live` (see `manager::live`).
    pub(crate) fn with_live(mut self, live: LiveHandle) -> Self {
        self.live = Some(live);
        self
    }

    /// This watcher, marked as the answer of the submission that stored the procedure's first record.
    pub(crate) fn stored_by_this_submission(mut self) -> Self {
        self.stored = true;
        self
    }

    /// Whether the submission that returned this watcher is the one that stored the procedure (its record holds
    /// exactly what was submitted). False when the id named a procedure that existed already (running, finished,
    /// or only in the store: the watcher follows that one) and for watchers taken any other way.
    pub fn is_new_submission(&self) -> bool {
        self.stored
    }

    /// The watched procedure.
    pub fn id(&self) -> &ProcedureId {
        &self.id
    }

    /// The latest known information, with the procedure's history.
    pub fn info(&self) -> ProcedureInfo {
        let sent = self.rx.borrow();
        let Some(live) = self.live.as_ref().filter(|_| !sent.state.is_finished()) else {
            return ProcedureInfo::clone(&sent);
        };
        drop(sent);
        // Only a finished state or a closed channel is sent; until then the runner shows the rest live. A live
        // state marked finished gave its history to the finished state, which it keeps until the runner's end sends
        // it.
        let live = live.lock();
        if let Some(finished) = &live.finished {
            return ProcedureInfo::clone(finished);
        }
        if live.shown.state.is_finished() {
            drop(live);
            return ProcedureInfo::clone(&self.rx.borrow());
        }
        live.info()
    }

    /// Waits until the procedure is done (its output) or failed ([`Error::ProcedureFailed`] with the recorded
    /// error; [`Error::ProcedureRefused`] when it refused its request and left no record), is cancelled ([`Error::ProcedureCancelled`]), or stalls ([`Error::ProcedureStalled`] with the reason).
    /// If the manager stops first (stopped, fenced,
    /// crashed), returns [`Error::ManagerNotRunning`]; the procedure then resumes in the next manager started on the
    /// store (a stalled one too).
    pub async fn wait(&mut self) -> Result<Option<Output>> {
        loop {
            {
                let info = self.rx.borrow_and_update();
                match info.state {
                    ProcedureState::Done => return Ok(info.output.clone()),
                    ProcedureState::Failed => {
                        let message = info
                            .error
                            .clone()
                            .unwrap_or_else(|| "unknown error".to_string());
                        return Err(match info.refusal {
                            Some(refusal) => Error::ProcedureRefused {
                                id: self.id.clone(),
                                refusal,
                                message,
                            },
                            None => Error::ProcedureFailed {
                                id: self.id.clone(),
                                message,
                            },
                        });
                    }
                    ProcedureState::Cancelled => {
                        return Err(Error::ProcedureCancelled {
                            id: self.id.clone(),
                            message: info
                                .error
                                .clone()
                                .unwrap_or_else(|| "cancelled".to_string()),
                        });
                    }
                    _ => {}
                }
            }
            if self.rx.changed().await.is_err() {
                let info = self.rx.borrow();
                if info.state.is_finished() {
                    continue;
                }
                if info.state == ProcedureState::Stalled {
                    return Err(Error::ProcedureStalled {
                        id: self.id.clone(),
                        reason: info
                            .error
                            .clone()
                            .unwrap_or_else(|| "unknown reason".to_string()),
                    });
                }
                return Err(Error::ManagerNotRunning {
                    reason: format!(
                        "the manager stopped before procedure {} finished (last state: {}{})",
                        self.id,
                        info.state,
                        info.error
                            .as_ref()
                            .map(|e| format!(", error: {e}"))
                            .unwrap_or_default()
                    ),
                });
            }
        }
    }
}
