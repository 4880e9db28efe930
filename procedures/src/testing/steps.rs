//! [`Steps`]: the smallest procedure there is, for measuring the engine itself (benches, the memory test, the CPU
//! example): it does nothing but step.

use async_trait::async_trait;

use crate::error::Result;
use crate::manager::ProcedureManager;
use crate::procedure::{Context, LockKey, Procedure, ProcedureId, ProcedureWithId, Status};

/// Runs `steps` steps, each asking to be persisted or not, then finishes with no output. It takes no lock and
/// touches nothing outside its own record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Steps {
    steps: u32,
    at: u32,
    persist: bool,
}

impl Steps {
    /// Its type name.
    pub const TYPE: &'static str = "testing_steps";

    /// A procedure of `steps` steps (then done), each persisted when `persist`.
    pub fn new(steps: u32, persist: bool) -> Self {
        Steps {
            steps,
            at: 0,
            persist,
        }
    }
}

#[async_trait]
impl Procedure for Steps {
    fn type_name(&self) -> &str {
        Self::TYPE
    }

    async fn execute(&mut self, _ctx: &Context) -> Result<Status> {
        if self.at < self.steps {
            self.at += 1;
            return Ok(Status::executing(self.persist));
        }
        Ok(Status::done())
    }

    fn dump(&self) -> Result<serde_json::Value> {
        Ok(serde_json::json!({ "steps": self.steps, "at": self.at, "persist": self.persist }))
    }

    fn lock_key(&self) -> LockKey {
        LockKey::none()
    }
}

/// Submits a [`Steps`] of `steps` steps (persisted when `persist`) under each of `ids`, all at once, then waits for
/// every one to finish: a burst of procedures in flight together. The first error (of a submission or a procedure)
/// is returned.
pub async fn run_steps(
    manager: &dyn ProcedureManager,
    ids: impl IntoIterator<Item = ProcedureId>,
    steps: u32,
    persist: bool,
) -> Result<()> {
    let mut watchers = Vec::new();
    for id in ids {
        let procedure = Box::new(Steps::new(steps, persist));
        watchers.push(manager.submit(ProcedureWithId::new(id, procedure)).await?);
    }
    for mut watcher in watchers {
        watcher.wait().await?;
    }
    Ok(())
}
