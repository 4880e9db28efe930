//! The tasks of a manager's run: runners, pending submissions, retention and the control poll.
//!
//! `stop` aborts every one and awaits each, so no task of the manager outlives it. They sit in a set of their own,
//! under a lock of their own, not under the manager's state lock: spawning a task may wake a worker thread (a
//! system call), and every runner takes the state lock when its procedure finishes. The set is opened for one run
//! (its epoch) when the run starts, and closed when it halts; a spawn names the run it belongs to and is refused
//! unless that run is the open one, so a halted run's set only shrinks, and a task of an old run can never join a
//! newer run's set.
//!
//! The set keeps each task's `JoinHandle`, not a `JoinSet`: a task of a `JoinSet` moves itself to the set's list of
//! ended tasks when it ends, under the set's own lock, which the next spawn (often on the thread the end just woke)
//! takes too. A handle is looked at only when the set is reaped or drained.

use std::future::Future;
use std::sync::{Mutex, MutexGuard};

use tokio::task::JoinHandle;

/// The set and the run it is open for.
#[derive(Default)]
struct Set {
    /// The epoch of the run whose tasks may be spawned; `None` while no run is running.
    open: Option<u64>,
    tasks: Vec<JoinHandle<()>>,
    /// The set's size at which a spawn reaps the tasks that ended (twice what a reap left, and at least
    /// [`REAP_AT_LEAST`]): a reap at every spawn met each task's own end on the set's lock.
    reap_at: usize,
}

/// The fewest tasks a set holds before a spawn reaps the ended ones.
const REAP_AT_LEAST: usize = 64;

/// The tasks of a manager (see the module's documentation).
#[derive(Default)]
pub(crate) struct Tasks(Mutex<Set>);

impl Tasks {
    fn set(&self) -> MutexGuard<'_, Set> {
        // Every change under this lock is a set operation that cannot panic half-way.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens the set for the run of `epoch`.
    pub(crate) fn open(&self, epoch: u64) {
        self.set().open = Some(epoch);
    }

    /// Spawns `task` for the run of `epoch`, first reaping the tasks already ended once the set has doubled since
    /// the last reap (it would grow without bound in a long-lived manager otherwise; the set holds at most about
    /// twice the tasks running, or [`REAP_AT_LEAST`]). Returns `false`, dropping `task` unstarted, when that run is
    /// not the open one (it halted, or another run started since).
    pub(crate) fn spawn(
        &self,
        epoch: u64,
        task: impl Future<Output = ()> + Send + 'static,
    ) -> bool {
        let mut set = self.set();
        if set.open != Some(epoch) {
            return false;
        }
        if set.tasks.len() >= set.reap_at {
            Self::reap_set(&mut set);
        }
        set.tasks.push(tokio::spawn(task));
        true
    }

    /// Frees the tasks that have ended; the retention task does at each of its rounds, so a burst's tasks do not
    /// wait for the next spawn to go.
    pub(crate) fn reap(&self) {
        Self::reap_set(&mut self.set());
    }

    fn reap_set(set: &mut Set) {
        set.tasks.retain(|task| !task.is_finished());
        set.reap_at = (2 * set.tasks.len()).max(REAP_AT_LEAST);
    }

    /// Closes the set (no spawn is accepted until the next run opens it) and aborts every task in it.
    pub(crate) fn close(&self) {
        let mut set = self.set();
        set.open = None;
        for task in &set.tasks {
            task.abort();
        }
    }

    /// Takes every task out of the set, aborts them, and returns once each has ended (its future dropped).
    pub(crate) async fn drain(&self) {
        let tasks = std::mem::take(&mut self.set().tasks);
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            // Ended, cancelled or panicked: each way its future is gone.
            let _ = task.await;
        }
    }

    /// The tasks spawned and not reaped yet, running or ended.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.set().tasks.len()
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::oneshot;

    use super::*;

    /// Only the open run's tasks are spawned; closing aborts the rest, and a drain returns once they are gone.
    #[tokio::test]
    async fn only_the_open_runs_tasks_are_spawned_and_closing_aborts_them() {
        let tasks = Tasks::default();
        assert!(!tasks.spawn(1, async {}), "no run is open yet");
        tasks.open(1);
        let (held, dropped) = oneshot::channel::<()>();
        assert!(tasks.spawn(1, async move {
            let _held = held;
            std::future::pending::<()>().await
        }));
        assert!(!tasks.spawn(2, async {}), "a task of another run");
        assert_eq!(tasks.held(), 1);
        tasks.close();
        assert!(!tasks.spawn(1, async {}), "the run's set is closed");
        tasks.drain().await;
        assert!(
            dropped.await.is_err(),
            "the pending task was aborted and dropped"
        );
        assert_eq!(tasks.held(), 0);
        tasks.open(2);
        assert!(tasks.spawn(2, async {}), "the next run's set is open");
        tasks.drain().await;
    }

    /// Ended tasks stay in the set until it reaches twice what the last reap left (at least `REAP_AT_LEAST`): the
    /// spawn that finds it there reaps them.
    #[tokio::test]
    async fn a_spawn_reaps_the_ended_tasks_once_the_set_has_doubled() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};

        let tasks = Tasks::default();
        tasks.open(1);
        let ended = Arc::new(AtomicUsize::new(0));
        for _ in 0..REAP_AT_LEAST {
            let ended = Arc::clone(&ended);
            assert!(tasks.spawn(1, async move {
                ended.fetch_add(1, Ordering::SeqCst);
            }));
        }
        while ended.load(Ordering::SeqCst) < REAP_AT_LEAST {
            tokio::task::yield_now().await;
        }
        assert_eq!(tasks.held(), REAP_AT_LEAST, "ended, not reaped yet");
        assert!(tasks.spawn(1, std::future::pending::<()>()));
        assert_eq!(tasks.held(), 1, "the ended ones were reaped");
        tasks.close();
        tasks.drain().await;
    }
}
