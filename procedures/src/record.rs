//! The persisted record of a procedure (a versioned JSON envelope), its states, and the store's key layout.

use serde::{Deserialize, Serialize};

use crate::procedure::{Output, ProcedureId};

/// The newest record format this manager reads and writes. A manager refuses (marks failed, visibly) records of a
/// newer format.
///
/// - 1: the original envelope.
/// - 2: adds `waiting_for` (the children a parent persisted its suspension on). Only records that use it carry
///   version 2 (see [`ProcedureRecord::required_format_version`]), so every other record stays readable by a
///   version-1 manager, and a version-1 manager refuses a suspended parent instead of resuming it without waiting.
pub const RECORD_FORMAT_VERSION: u32 = 2;

/// Store key of the manager epoch (fencing).
pub const EPOCH_KEY: &str = "epoch";

/// Prefix of procedure records; a record lives at `{RECORD_PREFIX}{id}`.
pub const RECORD_PREFIX: &str = "proc/";

/// The store key of a procedure's record.
pub fn record_key(id: &ProcedureId) -> String {
    format!("{RECORD_PREFIX}{id}")
}

/// Where a procedure is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcedureState {
    /// Running its steps (or waiting for locks, admission or children).
    Running,
    /// A step failed with a retryable error; the engine is waiting to run it again.
    Retrying,
    /// A step failed for good; the procedure is undoing its work.
    RollingBack,
    /// Finished; the output is in the record.
    Done,
    /// Finished with an error (rolled back first when the procedure supports it).
    Failed,
}

impl ProcedureState {
    /// Done or failed.
    pub fn is_finished(self) -> bool {
        matches!(self, ProcedureState::Done | ProcedureState::Failed)
    }

    /// The state's name as stored (`running`, `retrying`, `rolling_back`, `done`, `failed`).
    pub fn as_str(self) -> &'static str {
        match self {
            ProcedureState::Running => "running",
            ProcedureState::Retrying => "retrying",
            ProcedureState::RollingBack => "rolling_back",
            ProcedureState::Done => "done",
            ProcedureState::Failed => "failed",
        }
    }
}

impl std::fmt::Display for ProcedureState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The JSON envelope stored for each procedure, rewritten at every persisted transition.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcedureRecord {
    /// [`RECORD_FORMAT_VERSION`] when written.
    pub format_version: u32,
    /// The procedure's type name (selects the loader on recovery).
    pub type_name: String,
    /// The procedure's id.
    pub id: ProcedureId,
    /// The parent's id, for a subprocedure.
    #[serde(default)]
    pub parent_id: Option<ProcedureId>,
    /// How many transitions have been persisted (0 for the submission record).
    pub step: u64,
    /// The state at the time of writing.
    pub state: ProcedureState,
    /// The procedure's own data, as [`crate::Procedure::dump`] returned it (a JSON value, not a string).
    pub data: serde_json::Value,
    /// The output, once done.
    #[serde(default)]
    pub output: Option<Output>,
    /// The error text, when failed (or rolling back).
    #[serde(default)]
    pub error: Option<String>,
    /// The children a parent suspended on, written in the same atomic write as their first records. A recovered
    /// parent waits for every one of them before its next step. Empty (and left out of the JSON) otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_for: Vec<ProcedureId>,
    /// When it was submitted (ms since the Unix epoch).
    pub created_at_ms: u64,
    /// When this record was written (ms since the Unix epoch).
    pub updated_at_ms: u64,
}

impl ProcedureRecord {
    /// The oldest format version that describes this record: 2 when it names children it waits for, else 1.
    pub fn required_format_version(&self) -> u32 {
        if self.waiting_for.is_empty() { 1 } else { 2 }
    }
}

/// What a manager reports about a procedure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcedureInfo {
    /// The id.
    pub id: ProcedureId,
    /// The type name.
    pub type_name: String,
    /// The parent, for a subprocedure.
    pub parent_id: Option<ProcedureId>,
    /// The current state.
    pub state: ProcedureState,
    /// Persisted transitions so far.
    pub step: u64,
    /// The output, once done.
    pub output: Option<Output>,
    /// The error text (failed, or the last error while retrying / rolling back).
    pub error: Option<String>,
    /// Submission time (ms since the Unix epoch).
    pub created_at_ms: u64,
    /// Last change (ms since the Unix epoch).
    pub updated_at_ms: u64,
}

impl From<&ProcedureRecord> for ProcedureInfo {
    fn from(r: &ProcedureRecord) -> Self {
        ProcedureInfo {
            id: r.id.clone(),
            type_name: r.type_name.clone(),
            parent_id: r.parent_id.clone(),
            state: r.state,
            step: r.step,
            output: r.output.clone(),
            error: r.error.clone(),
            created_at_ms: r.created_at_ms,
            updated_at_ms: r.updated_at_ms,
        }
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
