//! The persisted record of a procedure (a versioned JSON envelope), its states, and the store's key layout.

use serde::{Deserialize, Serialize};

use crate::manager::{HeldKey, LockWait};
use crate::procedure::{Output, ProcedureId};

pub use crate::event::{EventKind, ProcedureEvent};

/// The newest record format this manager reads and writes. A manager refuses (marks failed, visibly) records of a
/// newer format.
///
/// - 1: the original envelope.
/// - 2: adds `waiting_for` (the children a parent persisted its suspension on). Only records that use it carry
///   version 2 (see [`ProcedureRecord::required_format_version`]), so every other record stays readable by a
///   version-1 manager, and a version-1 manager refuses a suspended parent instead of resuming it without waiting.
///
/// The fields added since (`step_name`, `lock_keys`, `events`) are information only: a manager that does not know
/// them ignores them when it reads a record and resumes the procedure correctly all the same (it only loses the
/// history at its next write). They therefore do not raise a record's version: a record carries the oldest version
/// a manager must understand to *resume* it, so an older manager still in the cluster keeps recovering the
/// procedures a newer one wrote.
pub const RECORD_FORMAT_VERSION: u32 = 2;

/// Store key of the manager epoch (fencing).
pub const EPOCH_KEY: &str = "epoch";

/// Prefix of procedure records; a record lives at `{RECORD_PREFIX}{id}`.
pub const RECORD_PREFIX: &str = "proc/";

/// The store key of a procedure's record.
pub fn record_key(id: &ProcedureId) -> String {
    format!("{RECORD_PREFIX}{id}")
}

/// Where a procedure is in its life. Non-exhaustive: states such as `paused` or `cancelled` may be added, so a
/// `match` outside this crate needs a fallback arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
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
    /// Cannot make progress in this manager for a reason retrying will not fix (its state write refused for good,
    /// no loader for its type, a subprocedure that cannot be recovered, a panic). Shown with the reason; never
    /// written: its record stays at its last persisted step, so a later manager (with the loader, a store that takes
    /// the write) resumes it.
    Stalled,
    /// Paused by an operator (its step in progress interrupted, to run again from its last persisted state): it
    /// keeps its lock keys and its state and runs no step until it is resumed (or cancelled). Persisted: it stays paused across a restart.
    Paused,
    /// Finished because an operator cancelled it. The error text says whether its rollback completed
    /// (`cancelled (rolled back)`), failed (`cancelled; rollback failed: …`), or did not run (`cancelled (no rollback: …)`,
    /// `cancelled before its first step (nothing to roll back)`).
    Cancelled,
}

impl ProcedureState {
    /// Every state, in the order they are documented.
    pub const ALL: [ProcedureState; 8] = [
        ProcedureState::Running,
        ProcedureState::Retrying,
        ProcedureState::RollingBack,
        ProcedureState::Done,
        ProcedureState::Failed,
        ProcedureState::Stalled,
        ProcedureState::Paused,
        ProcedureState::Cancelled,
    ];

    /// Done, failed or cancelled.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            ProcedureState::Done | ProcedureState::Failed | ProcedureState::Cancelled
        )
    }

    /// The state's name as shown and stored (`running`, `retrying`, `rolling_back`, `done`, `failed`, `stalled`,
    /// `paused`, `cancelled`).
    pub fn as_str(self) -> &'static str {
        match self {
            ProcedureState::Running => "running",
            ProcedureState::Retrying => "retrying",
            ProcedureState::RollingBack => "rolling_back",
            ProcedureState::Done => "done",
            ProcedureState::Failed => "failed",
            ProcedureState::Stalled => "stalled",
            ProcedureState::Paused => "paused",
            ProcedureState::Cancelled => "cancelled",
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
    /// The name of the step the procedure runs next ([`crate::Procedure::step_name`]); left out when it names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_name: Option<String>,
    /// The lock keys the procedure declares (held while it runs in a manager). Information only: a manager never
    /// reads locks back from the store, a recovered procedure asks for its keys again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lock_keys: Vec<HeldKey>,
    /// Its last [`MAX_EVENTS`] events, oldest first, written in the same write as the state change they describe.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<ProcedureEvent>,
}

impl ProcedureRecord {
    /// The oldest format version that describes this record: 2 when it names children it waits for, else 1.
    pub fn required_format_version(&self) -> u32 {
        if self.waiting_for.is_empty() { 1 } else { 2 }
    }
}

/// How many events a procedure keeps (in memory and in its record); older ones are dropped.
pub const MAX_EVENTS: usize = 100;

/// What a manager reports about a procedure.
///
/// The fields after `updated_at_ms` are the introspection of a running procedure. A manager fills them all; a
/// reader of the store without a manager ([`crate::snapshot`]) can only fill what records hold (`step_name`,
/// `lock_keys`, `events`): attempts, retries and locks held or awaited live in the running manager only.
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
    /// The name of the current step ([`crate::Procedure::step_name`]), when the procedure names its steps.
    #[serde(default)]
    pub step_name: Option<String>,
    /// How many times the current step has been started in this manager (1 on its first run; 0 before it runs).
    #[serde(default)]
    pub attempt: u32,
    /// The last error of the current step (kept while it is retried, cleared when a step succeeds), or the error
    /// that failed or stalled the procedure.
    #[serde(default)]
    pub last_error: Option<String>,
    /// While it waits to retry: when the next attempt starts (ms since the Unix epoch).
    #[serde(default)]
    pub next_retry_at_ms: Option<u64>,
    /// When the current step started (ms since the Unix epoch), while it runs in this manager.
    #[serde(default)]
    pub step_started_at_ms: Option<u64>,
    /// The lock keys it declares.
    #[serde(default)]
    pub lock_keys: Vec<HeldKey>,
    /// The keys it holds now in this manager (empty while it waits for them, and when read from the store).
    #[serde(default)]
    pub locks_held: Vec<HeldKey>,
    /// While it waits for its lock keys: the key it waits for and the procedure in its way.
    #[serde(default)]
    pub lock_wait: Option<LockWait>,
    /// Its last [`MAX_EVENTS`] events, oldest first (persisted ones and those not written yet).
    #[serde(default)]
    pub events: Vec<ProcedureEvent>,
    /// Set (with the state `failed`) when the procedure refused its request: its record was deleted, and its
    /// watchers get [`crate::Error::ProcedureRefused`]. Never in a listing: the manager forgets it at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<crate::error::Refusal>,
}

impl ProcedureInfo {
    /// How long it has existed at `now_ms` until it finished (its last write), or until `now_ms` when unfinished.
    pub fn total_ms(&self, now_ms: u64) -> u64 {
        let end = if self.state.is_finished() {
            self.updated_at_ms
        } else {
            now_ms
        };
        end.saturating_sub(self.created_at_ms)
    }

    /// How long the current step has been running at `now_ms`; `None` when no step runs in this manager.
    pub fn step_ms(&self, now_ms: u64) -> Option<u64> {
        self.step_started_at_ms
            .map(|started| now_ms.saturating_sub(started))
    }
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
            step_name: r.step_name.clone(),
            attempt: 0,
            last_error: r.error.clone(),
            next_retry_at_ms: None,
            step_started_at_ms: None,
            lock_keys: r.lock_keys.clone(),
            locks_held: Vec::new(),
            lock_wait: None,
            events: r.events.clone(),
            refusal: None,
        }
    }
}

/// The keys of `keys` as a record and [`ProcedureInfo`] show them.
pub(crate) fn declared_keys(keys: &crate::procedure::LockKey) -> Vec<HeldKey> {
    keys.keys()
        .iter()
        .map(|k| HeldKey {
            key: k.name().to_string(),
            exclusive: matches!(k, crate::procedure::StringKey::Exclusive(_)),
        })
        .collect()
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
