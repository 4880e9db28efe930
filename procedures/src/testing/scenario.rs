//! [`CrashScenario`]: what a crash matrix runs, described by the code under test.

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;

use crate::error::Result;
use crate::manager::ProcedureManager;
use crate::procedure::ProcedureWithId;
use crate::store::StateStore;
use crate::testing::matrix::RootResult;

/// A set of procedures, the world they act on, and how to read the end result. The crash matrix
/// ([`crate::testing::run_crash_matrix`]) builds a fresh environment per case, runs the procedures under managers
/// that crash at chosen points, and compares [`CrashScenario::outcome`] with an uncrashed run.
///
/// An implementation typically holds nothing; its `Env` holds the state store and the fakes of the outside world
/// (shared with the procedures through `Arc`s), so that every case starts from nothing.
#[async_trait]
pub trait CrashScenario: Send + Sync {
    /// Everything one case needs: the store and the outside world, fresh for each case.
    type Env: Send + Sync;
    /// What must come out the same whatever crashed: usually the [`crate::testing::store_digest`] of the store plus
    /// a snapshot of the outside world.
    type Outcome: PartialEq + Debug + Send;

    /// A fresh environment: an empty store (a unique key prefix on a shared backend) and fresh fakes.
    async fn new_env(&self) -> Self::Env;

    /// The durable store of `env`. Every manager of a case runs on it (through a crashing wrapper).
    fn state_store(&self, env: &Self::Env) -> Arc<dyn StateStore>;

    /// A state store of `env` that injects `controller`'s crashes itself, at its own durable commits
    /// ([`crate::testing::CrashController::durable_write`], and
    /// [`crate::testing::CrashController::ensure_alive`] before reads), instead of being wrapped in the harness's
    /// [`crate::testing::CrashingStore`]. The wrapper serialises the manager's store calls, one call one write; a
    /// store that batches the writes of concurrent calls into one commit (group commit) is only tested as it runs
    /// when the crash points are its commits. `None` (the default): the harness wraps
    /// [`CrashScenario::state_store`].
    fn crashing_state_store(
        &self,
        env: &Self::Env,
        controller: &Arc<crate::testing::CrashController>,
    ) -> Option<Arc<dyn StateStore>> {
        let _ = (env, controller);
        None
    }

    /// Registers the loaders of every procedure type the scenario uses (children included) on `manager`.
    fn register_loaders(&self, env: &Self::Env, manager: &dyn ProcedureManager) -> Result<()>;

    /// The root procedures to submit, with fixed ids. They are built and submitted again after every crash, as a
    /// submitter that retries would: a root the store already knows gives
    /// [`crate::Error::DuplicateProcedure`] and is watched instead.
    fn procedures(&self, env: &Self::Env) -> Vec<ProcedureWithId>;

    /// The end result of a case, read once the last manager has finished and stopped.
    async fn outcome(&self, env: &Self::Env) -> Self::Outcome;

    /// What the submitters saw, as compared with the golden run: as they are by default. A scenario whose
    /// procedures may legitimately draw a value again after a crash that came before the value was durable (a new
    /// id from a sequence) replaces it with a placeholder here, as its `Outcome` comparison does.
    fn canonical_results(&self, results: Vec<RootResult>) -> Vec<RootResult> {
        results
    }
}
