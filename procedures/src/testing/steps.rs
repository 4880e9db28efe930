//! [`Steps`]: the smallest procedure there is, for measuring the engine itself (benches, the memory test, the CPU
//! example): it does nothing but step.

use async_trait::async_trait;

use crate::error::Result;
use crate::procedure::{Context, LockKey, Procedure, Status};

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
