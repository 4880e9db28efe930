//! A durable, resumable procedure engine.
//!
//! A [`Procedure`] is a state machine run step by step by a [`ProcedureManager`]. After each step that asks for
//! it, the procedure's state is persisted in a [`StateStore`]; after a crash, [`ProcedureManager::start`] rebuilds
//! every unfinished procedure through its registered loader and runs it again from its last persisted step. Steps
//! must therefore be idempotent. A manager claims an epoch when it starts and every write it makes is conditional on
//! that epoch, so a stale manager (a second leader) is fenced off instead of corrupting state.
//!
//! The engine knows nothing of what its procedures do. See `docs/procedures.md` in the repository for how to write
//! one, the record format, and the recovery and fencing semantics. With the `testing` feature, `testing` holds the
//! crash harness that proves a procedure survives a crash at every durable transition.
#![warn(missing_docs)]

pub mod config;
pub mod control;
mod encoded_history;
pub mod error;
pub mod event;
pub mod listing;
pub mod manager;
pub mod memory_store;
pub mod observer;
pub mod procedure;
pub mod purge;
pub mod record;
mod record_encoder;
pub mod snapshot;
pub mod step_writes;
pub mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod watcher;

pub use config::{ManagerConfig, RetryPolicy};
pub use control::{ControlAction, ControlOp, ControlRequests};
pub use error::{BoxedError, Error, Refusal, Result};
pub use event::{EventKind, ProcedureEvent};
pub use manager::{
    HeldKey, LocalManager, LockWait, ProcedureLocks, ProcedureManager, ProcedureManagerRef,
};
pub use memory_store::MemoryStateStore;
pub use observer::{ProcedureObserver, ProcedureObserverRef};
pub use procedure::{
    BoxedProcedure, BoxedProcedureLoader, Context, LockKey, Output, Procedure, ProcedureId,
    ProcedureWithId, SideEffectHook, Status, StringKey,
};
pub use record::{ProcedureInfo, ProcedureRecord, ProcedureState};
pub use step_writes::{StepStore, StepStoreRef, StepWrites};
pub use store::{Condition, StateStore, WriteOp, WriteOutcome};
pub use watcher::Watcher;
