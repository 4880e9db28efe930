//! What the crash tests share: a fake outside world, an environment per case, and a scenario built from a few
//! functions.
#![allow(dead_code)] // each test file uses part of it

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use procedures::testing::{
    CrashScenario, MatrixConfig, MatrixReport, StoreDigest, run_crash_matrix, store_digest,
};
use procedures::{
    BoxedProcedure, BoxedProcedureLoader, Error, MemoryStateStore, ProcedureManager,
    ProcedureWithId, Result, StateStore,
};
use serde::de::DeserializeOwned;

/// One thing in the fake outside world.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Thing {
    /// Created (creating it again changes nothing).
    Present,
    /// Created, then removed (a rollback's trace).
    Removed,
    /// Appended to this many times (the non-idempotent effect).
    Appended(u32),
}

/// The outside world procedures act on: things keyed by name.
#[derive(Debug, Default)]
pub struct World {
    things: Mutex<BTreeMap<String, Thing>>,
}

impl World {
    /// Creates `name`; idempotent.
    pub fn create(&self, name: &str) {
        self.things
            .lock()
            .unwrap()
            .insert(name.to_string(), Thing::Present);
    }

    /// Removes `name` if it is present; idempotent.
    pub fn remove(&self, name: &str) {
        if let Some(thing) = self.things.lock().unwrap().get_mut(name) {
            *thing = Thing::Removed;
        }
    }

    /// Adds one to `name`'s count, without checking whether this append already happened: NOT idempotent.
    pub fn append(&self, name: &str) {
        let mut things = self.things.lock().unwrap();
        let thing = things.entry(name.to_string()).or_insert(Thing::Appended(0));
        if let Thing::Appended(n) = thing {
            *n += 1;
        }
    }

    /// Whether `name` is present.
    pub fn is_present(&self, name: &str) -> bool {
        self.things.lock().unwrap().get(name) == Some(&Thing::Present)
    }

    /// Everything in the world.
    pub fn snapshot(&self) -> BTreeMap<String, Thing> {
        self.things.lock().unwrap().clone()
    }
}

/// One case's store and world.
pub struct Env {
    pub store: Arc<MemoryStateStore>,
    pub world: Arc<World>,
}

/// What must come out the same whatever crashed.
#[derive(Debug, PartialEq)]
pub struct Outcome {
    pub store: StoreDigest,
    pub world: BTreeMap<String, Thing>,
}

/// A scenario over a [`World`]: how to register the loaders, which roots to submit.
pub struct WorldScenario {
    pub register: fn(&Arc<World>, &dyn ProcedureManager) -> Result<()>,
    pub roots: fn(&Arc<World>) -> Vec<ProcedureWithId>,
}

#[async_trait]
impl CrashScenario for WorldScenario {
    type Env = Env;
    type Outcome = Outcome;

    async fn new_env(&self) -> Env {
        Env {
            store: Arc::new(MemoryStateStore::new()),
            world: Arc::new(World::default()),
        }
    }

    fn state_store(&self, env: &Env) -> Arc<dyn StateStore> {
        env.store.clone()
    }

    fn register_loaders(&self, env: &Env, manager: &dyn ProcedureManager) -> Result<()> {
        (self.register)(&env.world, manager)
    }

    fn procedures(&self, env: &Env) -> Vec<ProcedureWithId> {
        (self.roots)(&env.world)
    }

    async fn outcome(&self, env: &Env) -> Outcome {
        Outcome {
            store: store_digest(env.store.as_ref()).await.unwrap(),
            world: env.world.snapshot(),
        }
    }
}

impl WorldScenario {
    /// Runs the first root once without any crash on a fresh environment and returns the environment (its world and
    /// store as the run left them) and the root's result.
    pub async fn golden_run(&self) -> (Env, Result<Option<procedures::Output>>) {
        let env = self.new_env().await;
        let manager =
            procedures::LocalManager::new(env.store.clone(), MatrixConfig::default().manager);
        (self.register)(&env.world, &manager).unwrap();
        manager.start().await.unwrap();
        let root = (self.roots)(&env.world).remove(0);
        let result = manager.submit(root).await.unwrap().wait().await;
        manager.stop().await.unwrap();
        (env, result)
    }
}

/// A loader that decodes the procedure's state and rebuilds it over `world`.
pub fn loader<S, F>(world: &Arc<World>, build: F) -> BoxedProcedureLoader
where
    S: DeserializeOwned,
    F: Fn(S, Arc<World>) -> BoxedProcedure + Send + Sync + 'static,
{
    let world = world.clone();
    Box::new(move |data| {
        let state: S = serde_json::from_value(data).map_err(Error::external)?;
        Ok(build(state, world.clone()))
    })
}

/// Runs the matrix with the default configuration and prints its size, bypassing the test harness's output
/// capture so the figures show in every run.
pub async fn run_matrix(name: &str, scenario: &WorldScenario) -> MatrixReport {
    let report = run_crash_matrix(scenario, MatrixConfig::default()).await;
    let _ = writeln!(
        std::io::stderr(),
        "crash matrix '{name}': {} transitions, {} side-effect points, {} cases run ({} single crash, {} double \
         crash), {} lost-answer cases, {} unreached, {} mismatches",
        report.transitions,
        report.side_effect_points,
        report.cases_run,
        report.single_crash_cases,
        report.double_crash_cases,
        report.lost_answer_cases,
        report.unreached_crash_points,
        report.mismatches.len()
    );
    report
}
