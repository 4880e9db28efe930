//! Operator control of procedures: cancel, pause and resume requests, stored next to the records.
//!
//! A request is a key under [`CONTROL_PREFIX`]: `control/proc/{id}` holds the request for one procedure
//! (`{"action":"cancel"|"pause","requested_at_ms":…}`), [`CONTROL_ALL_KEY`] pauses every procedure of the store. A
//! manager reads a procedure's key at each step boundary and polls the prefix all the time, interrupting a step in
//! progress or a wait (for a retry, a lock, or a resume) as soon as it sees a request, so a request written by any
//! process — the manager's own [`crate::ProcedureManager::cancel`], or
//! `walctl` while a manager runs elsewhere or none runs — is honoured by whichever manager runs the procedure, now
//! or after a restart. Resuming deletes the pause key; a cancel key is deleted in the same write as the procedure's
//! `cancelled` record, so a cancel requested before a crash is honoured on recovery.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::procedure::ProcedureId;
use crate::record::{ProcedureRecord, ProcedureState, now_ms, record_key};
use crate::store::{Condition, StateStore, WriteOp, WriteOutcome};

/// Prefix of every control key.
pub const CONTROL_PREFIX: &str = "control/";

/// Prefix of the per-procedure control keys: `control/proc/{id}`.
pub const CONTROL_PROC_PREFIX: &str = "control/proc/";

/// The key that pauses every procedure of the store (`pause_all`); deleted by `resume_all`.
pub const CONTROL_ALL_KEY: &str = "control/all";

/// How many times [`request`] re-reads a record that changed under its conditional write.
const REQUEST_ATTEMPTS: usize = 20;

/// The control key of procedure `id`.
pub fn control_key(id: &ProcedureId) -> String {
    format!("{CONTROL_PROC_PREFIX}{id}")
}

/// What an operator asks of a procedure, as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ControlAction {
    /// Stop it and roll it back if it can; it ends `cancelled`.
    Cancel,
    /// Run no step until resumed.
    Pause,
}

/// A stored control request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlRequest {
    /// What is asked.
    pub action: ControlAction,
    /// When it was asked (ms since the Unix epoch).
    pub requested_at_ms: u64,
}

impl ControlRequest {
    /// A request made now.
    pub fn now(action: ControlAction) -> Self {
        ControlRequest {
            action,
            requested_at_ms: now_ms(),
        }
    }

    /// Its stored bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        // A struct of an enum and an integer always serialises.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads stored bytes; `None` when they are not a request (such a key is ignored, and reported by the reader).
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        serde_json::from_slice(bytes).ok()
    }
}

/// What an operator does (the three commands).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlOp {
    /// Request a cancel.
    Cancel,
    /// Request a pause.
    Pause,
    /// Withdraw a pause.
    Resume,
}

impl ControlOp {
    /// The command's name (`cancel`, `pause`, `resume`).
    pub fn as_str(self) -> &'static str {
        match self {
            ControlOp::Cancel => "cancel",
            ControlOp::Pause => "pause",
            ControlOp::Resume => "resume",
        }
    }
}

/// Every control request of a store.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ControlRequests {
    /// Every procedure is paused ([`CONTROL_ALL_KEY`] is set).
    pub all_paused: bool,
    /// The request of each procedure that has one.
    pub procedures: std::collections::BTreeMap<ProcedureId, ControlAction>,
}

impl ControlRequests {
    /// Reads every control key of `store` (one scan of [`CONTROL_PREFIX`]). A key whose value is not a request is
    /// skipped with a warning.
    pub async fn read(store: &dyn StateStore) -> Result<Self> {
        let mut requests = ControlRequests::default();
        for (key, value) in store.scan(CONTROL_PREFIX).await? {
            let Some(request) = ControlRequest::from_bytes(&value) else {
                tracing::warn!(%key, "ignoring a control key that holds no control request");
                continue;
            };
            if key == CONTROL_ALL_KEY {
                requests.all_paused = request.action == ControlAction::Pause;
            } else if let Some(id) = key.strip_prefix(CONTROL_PROC_PREFIX) {
                requests
                    .procedures
                    .insert(ProcedureId::new(id), request.action);
            }
        }
        Ok(requests)
    }
}

/// Reads the request stored for `id`, if any.
pub(crate) async fn read_one(
    store: &dyn StateStore,
    id: &ProcedureId,
) -> Result<Option<ControlAction>> {
    Ok(store
        .get(&control_key(id))
        .await?
        .and_then(|bytes| ControlRequest::from_bytes(&bytes))
        .map(|r| r.action))
}

/// Writes a control request for `id` from any process, without a manager: no epoch is claimed, so a manager
/// running elsewhere is not fenced; it sees the request at its next poll of the control keys (interrupting the
/// procedure's step in progress) or at the procedure's next step boundary, whichever comes first. With no manager running, the next manager to start honours it.
///
/// The write is conditional on the record being the one read (unfinished), so a request never lands for a
/// procedure that finished meanwhile. An id the store does not hold is [`Error::ControlUnknown`]; refused
/// ([`Error::ControlRefused`]) are a finished procedure, a pause or resume of a procedure whose cancel is
/// requested, and a resume of a procedure with no pause request.
pub async fn request(store: &dyn StateStore, id: &ProcedureId, op: ControlOp) -> Result<()> {
    let key = record_key(id);
    let ctl = control_key(id);
    let refused = |reason: String| Error::ControlRefused {
        action: op.as_str(),
        id: id.clone(),
        reason,
    };
    for _ in 0..REQUEST_ATTEMPTS {
        let Some(value) = store.get(&key).await? else {
            return Err(Error::ControlUnknown {
                action: op.as_str(),
                id: id.clone(),
                key,
            });
        };
        let record: ProcedureRecord = serde_json::from_slice(&value)
            .map_err(|e| refused(format!("its record at '{key}' does not parse: {e}")))?;
        let current_bytes = store.get(&ctl).await?;
        let current = current_bytes
            .as_deref()
            .and_then(ControlRequest::from_bytes)
            .map(|r| r.action);
        let Some(op_write) = decide(op, id, record.state, current)? else {
            return Ok(());
        };
        let mut conditions = vec![Condition::Equals {
            key: key.clone(),
            value,
        }];
        conditions.push(match current_bytes {
            Some(bytes) => Condition::Equals {
                key: ctl.clone(),
                value: bytes,
            },
            None => Condition::Absent { key: ctl.clone() },
        });
        match store.write(conditions, vec![op_write]).await? {
            WriteOutcome::Applied => return Ok(()),
            WriteOutcome::Rejected { .. } => continue,
        }
    }
    Err(refused(format!(
        "its record at '{key}' changed under each of {REQUEST_ATTEMPTS} attempts (it is running fast; try again)"
    )))
}

/// The write that carries out `op` on procedure `id`, in `state`, whose stored request is `current`; `None` when the
/// request is already there (nothing to write). Shared by [`request`] and the manager's own control methods.
pub(crate) fn decide(
    op: ControlOp,
    id: &ProcedureId,
    state: ProcedureState,
    current: Option<ControlAction>,
) -> Result<Option<WriteOp>> {
    let refused = |reason: String| Error::ControlRefused {
        action: op.as_str(),
        id: id.clone(),
        reason,
    };
    if state.is_finished() {
        return Err(refused(format!("it is already finished ({state})")));
    }
    let key = control_key(id);
    let put = |action| {
        Ok(Some(WriteOp::Put {
            key: key.clone(),
            value: ControlRequest::now(action).to_bytes(),
        }))
    };
    match (op, current) {
        (ControlOp::Cancel, Some(ControlAction::Cancel)) => Ok(None),
        (ControlOp::Cancel, _) => put(ControlAction::Cancel),
        (_, Some(ControlAction::Cancel)) => {
            Err(refused("its cancel is already requested".to_string()))
        }
        (ControlOp::Pause, Some(ControlAction::Pause)) => Ok(None),
        (ControlOp::Pause, None) => put(ControlAction::Pause),
        (ControlOp::Resume, Some(ControlAction::Pause)) => {
            Ok(Some(WriteOp::Delete { key: key.clone() }))
        }
        (ControlOp::Resume, None) => Err(refused(
            "it has no pause request of its own (paused with every procedure? resume them all)"
                .to_string(),
        )),
    }
}

/// Pauses (`pause: true`) or resumes every procedure of `store` from any process, like [`request`].
pub async fn request_all(store: &dyn StateStore, pause: bool) -> Result<()> {
    let op = if pause {
        WriteOp::Put {
            key: CONTROL_ALL_KEY.to_string(),
            value: ControlRequest::now(ControlAction::Pause).to_bytes(),
        }
    } else {
        WriteOp::Delete {
            key: CONTROL_ALL_KEY.to_string(),
        }
    };
    store.write(Vec::new(), vec![op]).await.map(|_| ())
}
