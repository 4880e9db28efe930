//! The crash harness, and the [`StateStore`](crate::StateStore) conformance suite.
//!
//! A crash test runs a [`CrashScenario`] (procedures, a store, a fake outside world) through
//! [`run_crash_matrix`]: a golden run counts the N durable writes and M side-effect points; then, for every write
//! (crash just before it, and just after it) and every side-effect point, a manager crashes there, a new manager
//! recovers on the same store and finishes, and the end (each root's result, the store's
//! [`store_digest`], the outside world) must equal the golden run's. Each recovery is crashed again at each of its
//! own points. The pieces are public so a test can also crash one run by hand:
//!
//! - [`CrashPoint`] / [`CrashPlan`]: where to crash.
//! - [`CrashController`]: counts writes and side-effect points, decides the crash, then refuses everything.
//! - [`CrashingStore`]: a [`StateStore`](crate::StateStore) wrapper (and
//!   [`SideEffectHook`](crate::SideEffectHook)) carrying out a controller's plan.
//! - [`state_store_suite`]: the behaviour every state store must have.
//! - [`StateStoreWrapper`]: a test store that changes a few calls of another and forwards the rest.
//! - [`Steps`]: the smallest procedure, for measuring the engine itself, and [`run_steps`], a burst of them.
//!
//! See `docs/crash-testing.md` in the repository for the semantics and how to write a scenario.

mod crash;
mod diff;
mod digest;
mod matrix;
mod scenario;
mod steps;
mod store_suite;
mod tracked;
mod wrapper;

pub use crash::{
    CrashController, CrashPlan, CrashPoint, CrashRecord, CrashingStore, InjectedCrash,
    injected_crash, injected_crash_of, is_injected_crash,
};
pub use digest::{DigestEntry, RecordDigest, StoreDigest, store_digest};
pub use matrix::{MatrixConfig, MatrixReport, Mismatch, RootResult, run_crash_matrix};
pub use scenario::CrashScenario;
pub use steps::{Steps, run_steps};
pub use store_suite::state_store_suite;
pub use wrapper::StateStoreWrapper;
