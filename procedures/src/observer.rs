//! [`ProcedureObserver`]: a hook the manager calls when a step finishes or is retried, for whoever keeps
//! measurements (a metrics exporter, a test). The engine only calls it; it keeps no measurement itself.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

/// Told of every step a [`crate::LocalManager`] runs to the end and of every retry it schedules. Calls are made
/// from the procedure's task, synchronously: an implementation must return quickly and must not block.
pub trait ProcedureObserver: Send + Sync + Debug {
    /// A step of a procedure of `type_name` returned without error after running for `elapsed`. `step` is the
    /// step's name when the procedure names its steps.
    fn step_finished(&self, type_name: &str, step: Option<&str>, elapsed: Duration);

    /// A step (or a rollback, whose `step` is `"rollback"`) of a procedure of `type_name` failed with the
    /// retryable `error` and runs again after a delay.
    fn retried(&self, type_name: &str, step: Option<&str>, error: &str);
}

/// A shared [`ProcedureObserver`].
pub type ProcedureObserverRef = Arc<dyn ProcedureObserver>;
