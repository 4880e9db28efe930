//! [`ManagerConfig`]: retries, admission, retention, finished procedures in memory, control polling.

use std::time::Duration;

/// Exponential backoff with jitter, bounded by a number of retries.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first attempt; 0 = never retry.
    pub max_retries: usize,
    /// Delay before the first retry.
    pub initial_delay: Duration,
    /// Largest delay between two attempts.
    pub max_delay: Duration,
    /// Growth factor of the delay.
    pub factor: f32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 10,
            initial_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(10),
            factor: 2.0,
        }
    }
}

/// How a [`crate::LocalManager`] runs procedures.
#[derive(Clone, Debug, PartialEq)]
pub struct ManagerConfig {
    /// At most this many procedures execute at once; further ones wait for a slot (a suspended parent gives its
    /// slot up while its children run).
    pub max_running_procedures: usize,
    /// Retries of a step that failed with a retryable error.
    pub step_retry: RetryPolicy,
    /// Retries of a state-store write that failed with a retryable error.
    pub store_retry: RetryPolicy,
    /// How long a finished procedure's record stays listable before its keys are deleted.
    pub retention: Duration,
    /// How often finished records are checked against `retention` (a sweep reads every record of the store, page
    /// by page).
    pub retention_check_interval: Duration,
    /// How long a finished procedure stays in the manager's memory after it finished. Afterwards only its record in
    /// the store is left (until `retention` deletes it), and `procedure_state`, `watch`, `list_procedures` and a
    /// `submit` of its id read it there. A tree (a root and its subprocedures) leaves together, once all of it
    /// finished this long ago. Checked every half of this time (but at least every `retention_check_interval`, and
    /// at most every 10 ms), so a finished tree leaves memory within 1.5 times this after it finished.
    pub finished_in_memory: Duration,
    /// How often the control keys (cancel, pause, resume written by any process) are read for the procedures that
    /// run a step or wait — for a retry, a lock, or a resume: a cancel or pause seen here interrupts the step or the
    /// wait. A running procedure also reads the control keys at each step boundary.
    pub control_poll_interval: Duration,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        ManagerConfig {
            max_running_procedures: 128,
            step_retry: RetryPolicy::default(),
            store_retry: RetryPolicy::default(),
            retention: Duration::from_secs(24 * 3600),
            retention_check_interval: Duration::from_secs(60),
            finished_in_memory: Duration::from_secs(600),
            control_poll_interval: Duration::from_millis(250),
        }
    }
}
