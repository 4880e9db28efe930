//! The one error type of the `procedures` crate.

use snafu::Snafu;

use crate::procedure::ProcedureId;

/// A boxed error from outside the engine (a procedure's own error, a store backend's error).
pub type BoxedError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result alias of the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the engine, in a procedure step, or in a state store.
#[derive(Debug, Snafu)]
#[snafu(visibility(pub))]
#[non_exhaustive]
pub enum Error {
    /// A procedure step failed with its own error. `retryable` tells the engine whether running the step again may
    /// succeed (a broker timeout) or not (bad input).
    #[snafu(display("{source}"))]
    External {
        /// The procedure's error.
        source: BoxedError,
        /// Whether the engine should retry the step.
        retryable: bool,
    },

    /// A procedure refused its request in its first step, before doing anything (see [`Error::refused`]): the
    /// engine deletes its record instead of writing a failed one, and its watchers get
    /// [`Error::ProcedureRefused`] with the same kind. Returned later than the first step, it is an ordinary
    /// failure. Never retryable.
    #[snafu(display("{source}"))]
    Refused {
        /// Why the request is refused.
        refusal: Refusal,
        /// The procedure's error, naming the culprit.
        source: BoxedError,
    },

    /// What a [`crate::Watcher`] returns for a procedure that refused its request ([`Error::Refused`]): no record
    /// of it is left, and the id is free again. The text is a failure's (`procedure <id> failed: …`); `refusal`
    /// tells a caller what kind of refusal it is (to answer 409 or 400 rather than 500).
    #[snafu(display("procedure {id} failed: {message}"))]
    ProcedureRefused {
        /// The procedure.
        id: ProcedureId,
        /// Why it refused.
        refusal: Refusal,
        /// The procedure's error text.
        message: String,
    },

    /// A procedure with this id is already known to the manager (running, or finished and still retained).
    #[snafu(display("procedure {id} already exists"))]
    DuplicateProcedure {
        /// The id that was submitted twice.
        id: ProcedureId,
    },

    /// A submission names an id the manager knows (in memory or in its store) as a procedure of another type: a
    /// caller-chosen id is an idempotency key for one task only.
    #[snafu(display(
        "procedure id {id} is already used by a procedure of type '{existing}'; this submission is of type '{submitted}' (choose another id)"
    ))]
    ProcedureIdInUse {
        /// The id.
        id: ProcedureId,
        /// The type of the procedure that has the id.
        existing: String,
        /// The type of the refused submission.
        submitted: String,
    },

    /// A loader for this type name was registered twice.
    #[snafu(display("a loader for procedure type '{type_name}' is already registered"))]
    LoaderConflict {
        /// The type name.
        type_name: String,
    },

    /// A persisted record names a procedure type with no registered loader.
    #[snafu(display(
        "procedure {id} (type '{type_name}', key '{key}') cannot be recovered: no loader is registered for type '{type_name}'"
    ))]
    LoaderNotFound {
        /// The procedure's id.
        id: ProcedureId,
        /// The unknown type name.
        type_name: String,
        /// The store key holding the record.
        key: String,
    },

    /// A persisted record could not be decoded, or its data was refused by the procedure's loader.
    #[snafu(display(
        "procedure {id} (type '{type_name}', key '{key}') cannot be recovered: {reason}"
    ))]
    CorruptRecord {
        /// The procedure's id, or the key's suffix when the record is too damaged to name it.
        id: ProcedureId,
        /// The type name, or `unknown` when it cannot be read.
        type_name: String,
        /// The store key holding the record.
        key: String,
        /// What is wrong with it.
        reason: String,
    },

    /// Serialising a procedure's state or output failed.
    #[snafu(display("cannot serialise {what} of procedure {id}: {source}"))]
    Serialize {
        /// The procedure.
        id: ProcedureId,
        /// What was being serialised (`state`, `output`, `record`).
        what: &'static str,
        /// The serde error.
        source: serde_json::Error,
    },

    /// The state store failed.
    #[snafu(display("state store failed to {action} '{key}': {source}"))]
    Store {
        /// The verb: `get`, `put`, `scan`, `delete`, `write`.
        action: &'static str,
        /// The key or prefix touched.
        key: String,
        /// The backend's error.
        source: BoxedError,
        /// Whether retrying the same call may succeed (the backend was unreachable, a timeout).
        retryable: bool,
    },

    /// A value does not fit the store's limits; nothing was written.
    #[snafu(display("state store refuses '{key}': {reason}"))]
    StoreLimit {
        /// The key that was refused.
        key: String,
        /// The limit that was hit.
        reason: String,
    },

    /// A condition of a step's own writes ([`crate::StepWrites`]) failed: nothing of the step's writes nor the
    /// procedure's next state was written. The step's error: not retryable (the key's value will not change by
    /// itself), so the procedure rolls back or fails.
    #[snafu(display(
        "a condition of the step's writes failed: key '{key}' was expected {expected}"
    ))]
    StepConditionFailed {
        /// The key whose condition failed.
        key: String,
        /// What the condition expected.
        expected: String,
    },

    /// A newer manager claimed the store: this manager must not write any more.
    #[snafu(display(
        "fenced by epoch {epoch}: this manager holds epoch {own} and may no longer write procedure state"
    ))]
    Fenced {
        /// The epoch now current in the store.
        epoch: u64,
        /// This manager's epoch.
        own: u64,
    },

    /// A procedure ran longer than its timeout.
    #[snafu(display("procedure {id} timed out after {timeout:?}"))]
    Timeout {
        /// The procedure.
        id: ProcedureId,
        /// Its timeout.
        timeout: std::time::Duration,
    },

    /// A subprocedure failed, which fails its parent.
    #[snafu(display("subprocedure {child} of {parent} failed: {message}"))]
    SubprocedureFailed {
        /// The parent.
        parent: ProcedureId,
        /// The child that failed.
        child: ProcedureId,
        /// The child's error text.
        message: String,
    },

    /// What a [`crate::Watcher`] returns for a procedure that ended in the failed state.
    #[snafu(display("procedure {id} failed: {message}"))]
    ProcedureFailed {
        /// The procedure.
        id: ProcedureId,
        /// The error text recorded for it.
        message: String,
    },

    /// What a [`crate::Watcher`] returns for a procedure that stalled: it cannot make progress in this manager for a
    /// reason retrying will not fix, and nothing more is written for it here (its record stays at its last persisted
    /// step; a later manager resumes it). Not retryable by the caller.
    #[snafu(display("procedure {id} is stalled: {reason}"))]
    ProcedureStalled {
        /// The procedure.
        id: ProcedureId,
        /// Why it cannot make progress.
        reason: String,
    },

    /// What a [`crate::Watcher`] returns for a procedure an operator cancelled; `message` says whether its rollback
    /// completed.
    #[snafu(display("procedure {id} was cancelled: {message}"))]
    ProcedureCancelled {
        /// The procedure.
        id: ProcedureId,
        /// The text recorded for it (`cancelled (rolled back)`, …).
        message: String,
    },

    /// A cancel, pause or resume the procedure's state refuses (finished, or a resume of a procedure whose cancel
    /// is already requested), or whose record does not parse.
    #[snafu(display("cannot {action} procedure {id}: {reason}"))]
    ControlRefused {
        /// `cancel`, `pause` or `resume`.
        action: &'static str,
        /// The procedure.
        id: ProcedureId,
        /// Why.
        reason: String,
    },

    /// A cancel, pause or resume names a procedure the store holds no record of (never submitted, or purged after
    /// it finished): nothing to control. Its own kind, so that a caller can tell "no such procedure" from a refusal
    /// of the procedure's state ([`Error::ControlRefused`]).
    #[snafu(display("cannot {action} procedure {id}: the store holds no record at '{key}'"))]
    ControlUnknown {
        /// `cancel`, `pause` or `resume`.
        action: &'static str,
        /// The procedure.
        id: ProcedureId,
        /// The record key that holds nothing.
        key: String,
    },

    /// The procedure asked for a rollback it does not implement.
    #[snafu(display("procedure type '{type_name}' does not support rollback"))]
    RollbackNotSupported {
        /// The procedure type.
        type_name: String,
    },

    /// A procedure's lock keys would wait for a holder that waits for the procedure itself (an ancestor holds
    /// them, or through a chain of waiting procedures waits for them): it could never run. Not retryable.
    #[snafu(display(
        "procedure {procedure} cannot take lock key '{key}' held by {holder}: it would deadlock ({cycle})"
    ))]
    LockDeadlock {
        /// The procedure refused.
        procedure: ProcedureId,
        /// The first key of the cycle it asked for.
        key: String,
        /// The procedure holding that key.
        holder: ProcedureId,
        /// Every wait of the cycle, from the holder back to the procedure.
        cycle: String,
    },

    /// The manager is not running (never started, stopped, or halted after being fenced or told to halt).
    #[snafu(display("procedure manager is not running: {reason}"))]
    ManagerNotRunning {
        /// Why.
        reason: String,
    },
}

/// Why a procedure refused its request ([`Error::Refused`]): a kind for callers to map (an HTTP status), never
/// found by matching the error's text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Refusal {
    /// What the request would create exists already (a table of that name).
    AlreadyExists,
    /// The request itself is invalid (a name, a value).
    InvalidRequest,
    /// The request conflicts with the state of something else.
    Conflict,
    /// What the request acts on does not exist (a table to drop).
    NotFound,
}

impl Error {
    /// Wraps a procedure's error refusing its request (see [`Error::Refused`]): to be returned by a procedure's
    /// first step only, before it did anything, since the engine then deletes the procedure's record.
    pub fn refused(refusal: Refusal, source: impl Into<BoxedError>) -> Self {
        Error::Refused {
            refusal,
            source: source.into(),
        }
    }

    /// The kind of refusal, for [`Error::Refused`] and [`Error::ProcedureRefused`].
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            Error::Refused { refusal, .. } | Error::ProcedureRefused { refusal, .. } => {
                Some(*refusal)
            }
            _ => None,
        }
    }

    /// Wraps a procedure's error that a retry may cure (the engine retries it with backoff).
    pub fn retry_later(source: impl Into<BoxedError>) -> Self {
        Error::External {
            source: source.into(),
            retryable: true,
        }
    }

    /// Wraps a procedure's error that a retry will not cure (the engine rolls back or fails at once).
    pub fn external(source: impl Into<BoxedError>) -> Self {
        Error::External {
            source: source.into(),
            retryable: false,
        }
    }

    /// Whether running the same step (or store call) again may succeed. Decided per kind, with no catch-all arm: a
    /// new kind must say.
    pub fn is_retryable(&self) -> bool {
        match self {
            // The step or the store said, where the error was built.
            Error::External { retryable, .. } | Error::Store { retryable, .. } => *retryable,
            // Refusals of the request: the same request is refused again.
            Error::Refused { .. } | Error::ProcedureRefused { .. } => false,
            // The id or the type is taken, or a loader is missing or registered twice: a fact of this manager, not
            // of a moment.
            Error::DuplicateProcedure { .. }
            | Error::ProcedureIdInUse { .. }
            | Error::LoaderConflict { .. }
            | Error::LoaderNotFound { .. } => false,
            // Bad bytes stay bad; a value over the store's limit stays over it.
            Error::CorruptRecord { .. } | Error::Serialize { .. } | Error::StoreLimit { .. } => {
                false
            }
            // A step's own condition failed: the key's value does not change by itself.
            Error::StepConditionFailed { .. } => false,
            // Another manager owns the store, or this one is not running: retrying here writes nothing.
            Error::Fenced { .. } | Error::ManagerNotRunning { .. } => false,
            // Ends of a procedure, as its watchers see them: final.
            Error::Timeout { .. }
            | Error::SubprocedureFailed { .. }
            | Error::ProcedureFailed { .. }
            | Error::ProcedureStalled { .. }
            | Error::ProcedureCancelled { .. } => false,
            // Controls of a finished or unknown procedure, a rollback the procedure lacks, a lock cycle: the same
            // call meets the same state.
            Error::ControlRefused { .. }
            | Error::ControlUnknown { .. }
            | Error::RollbackNotSupported { .. }
            | Error::LockDeadlock { .. } => false,
        }
    }

    /// Wraps `source` in a store error that makes the manager halt at once (see [`Halt`]): for a state store or a
    /// [`crate::SideEffectHook`] whose process is going away. Never retryable.
    pub fn halt(
        action: &'static str,
        key: impl Into<String>,
        source: impl Into<BoxedError>,
    ) -> Self {
        Error::Store {
            action,
            key: key.into(),
            source: Box::new(Halt::new(source)),
            retryable: false,
        }
    }

    /// Whether this error means the manager itself must stop at once without writing anything more: it was fenced
    /// by a newer manager, or a store or side-effect hook answered with a [`Halt`].
    pub fn is_fatal(&self) -> bool {
        match self {
            Error::Fenced { .. } => true,
            Error::Store { source, .. } | Error::External { source, .. } => source.is::<Halt>(),
            _ => false,
        }
    }

    /// The [`Halt`] this error carries, if it is one (see [`Error::halt`]).
    pub fn as_halt(&self) -> Option<&Halt> {
        match self {
            Error::Store { source, .. } | Error::External { source, .. } => {
                source.downcast_ref::<Halt>()
            }
            _ => None,
        }
    }
}

/// The source of a store (or side-effect hook) error after which the manager must stop at once and write nothing
/// more, as when it is fenced: the process is going away, or the store can no longer be used by it. Build one with
/// [`Error::halt`]; [`Error::is_fatal`] recognises it. Its own source says why (the crash harness puts its injected
/// crash there and recognises it by downcasting).
#[derive(Debug)]
pub struct Halt {
    source: BoxedError,
}

impl Halt {
    /// A halt caused by `source`.
    pub fn new(source: impl Into<BoxedError>) -> Self {
        Halt {
            source: source.into(),
        }
    }

    /// Why the manager halts.
    pub fn cause(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.source
    }
}

impl std::fmt::Display for Halt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the manager halts: {}", self.source)
    }
}

impl std::error::Error for Halt {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_halt_stops_the_manager_and_is_never_retried() {
        let halt = Error::halt("put", "proc/p", "process going away");
        assert!(halt.is_fatal() && !halt.is_retryable(), "{halt}");
        assert!(halt.as_halt().is_some());
        assert!(halt.to_string().contains("process going away"), "{halt}");
        let plain = Error::Store {
            action: "put",
            key: "proc/p".into(),
            source: "backend unavailable".into(),
            retryable: false,
        };
        assert!(!plain.is_fatal() && plain.as_halt().is_none());
        let fenced = Error::Fenced { epoch: 2, own: 1 };
        assert!(fenced.is_fatal());
    }
}
