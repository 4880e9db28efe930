//! The thread a term's upkeep runs on: a single-threaded runtime of its own, apart from the server's.
//!
//! A lease is kept alive (etcd, every sixth of its TTL) or renewed (PostgreSQL, every third), and the term is lost
//! when no renewal was acknowledged for two thirds of it. On the server's runtime that upkeep competes with request work:
//! a burst of requests, procedures polling the store or a handler that blocks its worker delay the keep-alive's
//! send and the reading of its answer, and a leader loses its term under load though etcd answered in time. Here
//! the upkeep's tasks, and the connections they use (created on this runtime, so their I/O is driven here too),
//! share a thread with nothing else; the operating system schedules it whatever the server's runtime is doing.
//!
//! The thread lives as long as the election that started it: dropping the [`Upkeep`] ends the runtime, which
//! drops every task still on it.

use std::future::Future;

use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A runtime on a thread of its own for one election's lease upkeep.
#[derive(Debug)]
pub(super) struct Upkeep {
    handle: Handle,
    /// Dropped with the election: the thread's runtime stops then.
    _stop: oneshot::Sender<()>,
}

impl Upkeep {
    /// Starts the thread; `election` names it (in thread listings and panics).
    pub fn start(election: &str) -> std::io::Result<Self> {
        let runtime = Builder::new_current_thread().enable_all().build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(format!("lease-upkeep {election}"))
            .spawn(move || {
                // Returns when the sender is dropped; the runtime, and every task on it, goes with this thread.
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })?;
        Ok(Upkeep {
            handle,
            _stop: stop,
        })
    }

    /// Runs `task` on the upkeep's thread. The handle can be awaited (and aborted) from any runtime.
    pub fn spawn<F>(&self, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.spawn(task)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The upkeep's tasks run while the runtime that started them is blocked: this test's runtime has one thread,
    /// and it is held in a blocking sleep until the upkeep's task has answered over a std channel.
    #[tokio::test(flavor = "current_thread")]
    async fn a_task_runs_while_the_starting_runtime_is_blocked() {
        let upkeep = Upkeep::start("test").unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let _task = upkeep.spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            let _ = tx.send(std::thread::current().name().map(str::to_string));
        });
        // Blocks this runtime's only thread: a task on it could not run until this returns.
        let name = rx.recv_timeout(std::time::Duration::from_secs(30)).unwrap();
        assert_eq!(name.as_deref(), Some("lease-upkeep test"));
    }

    /// Dropping the upkeep ends its thread's runtime, and the tasks on it with it.
    #[tokio::test]
    async fn dropping_the_upkeep_ends_its_tasks() {
        let upkeep = Upkeep::start("test").unwrap();
        let task = upkeep.spawn(std::future::pending::<()>());
        drop(upkeep);
        let ended = task.await;
        assert!(ended.is_err_and(|e| e.is_cancelled()));
    }
}
