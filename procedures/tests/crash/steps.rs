//! Crash matrix of a four-step procedure with one outside effect per step.

use std::sync::Arc;

use crate::support::crash::{World, WorldScenario, loader, run_matrix};
use async_trait::async_trait;
use procedures::testing::CrashPoint;
use procedures::{
    Context, Error, LockKey, Procedure, ProcedureId, ProcedureManager, ProcedureWithId, Result,
    Status,
};
use serde::{Deserialize, Serialize};

const TYPE: &str = "four_steps";
const STEPS: u32 = 4;
const FLAKY_STEP: u32 = 2;

#[derive(Serialize, Deserialize)]
struct State {
    name: String,
    next_step: u32,
}

/// Step i creates `{name}/effect-{i}` in the world. Step 1 does not persist (so a crash after it replays two steps);
/// the others do. A flaky instance fails step 2 once with a retryable error, after its effect (a target that times
/// out after acting): every manager's instance fails once, so recovery retries too.
struct FourSteps {
    state: State,
    world: Arc<World>,
    flaky: bool,
}

#[async_trait]
impl Procedure for FourSteps {
    fn type_name(&self) -> &str {
        TYPE
    }

    async fn execute(&mut self, ctx: &Context) -> Result<Status> {
        let step = self.state.next_step;
        if step == STEPS {
            return Ok(Status::done_with_output(
                serde_json::json!({ "name": self.state.name, "effects": STEPS }),
            ));
        }
        let effect = format!("{}/effect-{step}", self.state.name);
        self.world.create(&effect);
        ctx.side_effect_point(&effect)?;
        if step == FLAKY_STEP && self.flaky {
            self.flaky = false;
            return Err(Error::retry_later(format!(
                "{effect}: the target timed out"
            )));
        }
        self.state.next_step += 1;
        Ok(Status::executing(step != 1))
    }

    fn dump(&self) -> Result<serde_json::Value> {
        serde_json::to_value(&self.state).map_err(Error::external)
    }

    fn lock_key(&self) -> LockKey {
        LockKey::exclusive(self.state.name.clone())
    }
}

fn register(world: &Arc<World>, manager: &dyn ProcedureManager) -> Result<()> {
    register_with(world, manager, false)
}

fn register_flaky(world: &Arc<World>, manager: &dyn ProcedureManager) -> Result<()> {
    register_with(world, manager, true)
}

fn register_with(world: &Arc<World>, manager: &dyn ProcedureManager, flaky: bool) -> Result<()> {
    manager.register_loader(
        TYPE,
        loader(world, move |state, world| {
            Box::new(FourSteps {
                state,
                world,
                flaky,
            })
        }),
    )
}

fn root(world: &Arc<World>, name: &str) -> ProcedureWithId {
    root_with(world, name, false)
}

fn root_with(world: &Arc<World>, name: &str, flaky: bool) -> ProcedureWithId {
    ProcedureWithId::new(
        ProcedureId::new(name),
        Box::new(FourSteps {
            state: State {
                name: name.to_string(),
                next_step: 0,
            },
            world: world.clone(),
            flaky,
        }),
    )
}

#[tokio::test]
async fn four_step_procedure_survives_every_single_and_double_crash() {
    let scenario = WorldScenario {
        register,
        roots: |world| vec![root(world, "alpha")],
    };
    let report = run_matrix("four steps", &scenario).await;
    report.assert_no_mismatch();
    // The epoch claim, the submission, the three persisting steps, the done record.
    assert_eq!(report.transitions, 6, "{report}");
    assert_eq!(report.side_effect_points, STEPS as usize, "{report}");
    assert_eq!(
        report.single_crash_cases,
        2 * report.transitions + report.side_effect_points
    );
    assert!(
        report.double_crash_cases > report.single_crash_cases,
        "{report}"
    );
    assert_eq!(report.unreached_crash_points, 0, "{report}");
}

#[tokio::test]
async fn four_step_procedure_with_a_retried_step_survives_every_single_and_double_crash() {
    let scenario = WorldScenario {
        register: register_flaky,
        roots: |world| vec![root_with(world, "alpha", true)],
    };
    let report = run_matrix("four steps, step 2 retried", &scenario).await;
    report.assert_no_mismatch();
    // Retries are not persisted; the retried step reaches its side-effect point twice.
    assert_eq!(report.transitions, 6, "{report}");
    assert_eq!(report.side_effect_points, STEPS as usize + 1, "{report}");
    assert_eq!(report.unreached_crash_points, 0, "{report}");
}

#[tokio::test]
async fn two_concurrent_roots_survive_every_single_and_double_crash() {
    let scenario = WorldScenario {
        register,
        roots: |world| vec![root(world, "alpha"), root(world, "beta")],
    };
    let report = run_matrix("four steps, two roots", &scenario).await;
    report.assert_no_mismatch();
    assert_eq!(report.side_effect_points, 2 * STEPS as usize, "{report}");
}

/// The matrix really crashes where it says: a manager crashed at the first side-effect point leaves the first
/// effect in the world and nothing persisted after the submission.
#[tokio::test]
async fn a_crash_at_the_first_side_effect_stops_the_manager_there() {
    use procedures::testing::{CrashPlan, CrashingStore};
    use procedures::{LocalManager, MemoryStateStore};

    let world = Arc::new(World::default());
    let memory = Arc::new(MemoryStateStore::new());
    let store = Arc::new(CrashingStore::with_plan(
        memory.clone(),
        CrashPlan::at(CrashPoint::SideEffect(0)),
    ));
    let manager = LocalManager::with_side_effect_hook(
        store.clone(),
        procedures::testing::MatrixConfig::default().manager,
        store.clone(),
    );
    register(&world, &manager).unwrap();
    manager.start().await.unwrap();
    let mut watcher = manager.submit(root(&world, "alpha")).await.unwrap();
    let err = watcher.wait().await.unwrap_err();
    assert!(matches!(err, Error::ManagerNotRunning { .. }), "{err}");
    assert_eq!(
        store.controller().crashed().map(|c| c.point),
        Some(CrashPoint::SideEffect(0))
    );
    assert!(world.is_present("alpha/effect-0"));
    assert!(!world.is_present("alpha/effect-1"));
    // Only the submission record is persisted: the crash came before the first step's write.
    let digest = procedures::testing::store_digest(memory.as_ref())
        .await
        .unwrap();
    let record = digest.record(&ProcedureId::new("alpha")).unwrap();
    assert_eq!(record.step, 0);
    assert!(!record.state.is_finished());
    // The dead manager writes nothing more, even when stopped.
    let writes = store.controller().writes();
    let _ = manager.stop().await;
    assert_eq!(store.controller().writes(), writes);
    assert_eq!(
        procedures::testing::store_digest(memory.as_ref())
            .await
            .unwrap(),
        digest
    );
}
