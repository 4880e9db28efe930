//! Crash matrix of a step with several outside effects, crashed between any two of them.

use std::sync::Arc;

use crate::support::crash::{Thing, World, WorldScenario, loader, run_matrix};
use async_trait::async_trait;
use procedures::{
    Context, Error, LockKey, Procedure, ProcedureId, ProcedureManager, ProcedureWithId, Result,
    Status,
};
use serde::{Deserialize, Serialize};

const TYPE: &str = "create_many";
const THINGS: usize = 5;

#[derive(Serialize, Deserialize)]
struct State {
    created: bool,
}

/// Step 0 creates `thing-0` … `thing-4`, declaring a side-effect point after each; step 1 creates `registry` (the
/// list of things) and finishes.
struct CreateMany {
    state: State,
    world: Arc<World>,
}

#[async_trait]
impl Procedure for CreateMany {
    fn type_name(&self) -> &str {
        TYPE
    }

    async fn execute(&mut self, ctx: &Context) -> Result<Status> {
        if !self.state.created {
            for i in 0..THINGS {
                let name = format!("thing-{i}");
                self.world.create(&name);
                ctx.side_effect_point(&name)?;
            }
            self.state.created = true;
            return Ok(Status::executing(true));
        }
        self.world.create("registry");
        ctx.side_effect_point("registry")?;
        Ok(Status::done_with_output(serde_json::json!(THINGS)))
    }

    fn dump(&self) -> Result<serde_json::Value> {
        serde_json::to_value(&self.state).map_err(Error::external)
    }

    fn lock_key(&self) -> LockKey {
        LockKey::exclusive("things")
    }
}

fn register(world: &Arc<World>, manager: &dyn ProcedureManager) -> Result<()> {
    manager.register_loader(
        TYPE,
        loader(world, |state, world| Box::new(CreateMany { state, world })),
    )
}

fn roots(world: &Arc<World>) -> Vec<ProcedureWithId> {
    vec![ProcedureWithId::new(
        ProcedureId::new("create-many"),
        Box::new(CreateMany {
            state: State { created: false },
            world: world.clone(),
        }),
    )]
}

#[tokio::test]
async fn step_with_several_effects_survives_a_crash_between_any_two() {
    let scenario = WorldScenario { register, roots };
    let report = run_matrix("several side effects in one step", &scenario).await;
    report.assert_no_mismatch();
    assert_eq!(report.side_effect_points, THINGS + 1, "{report}");
    assert_eq!(report.unreached_crash_points, 0, "{report}");
    assert!(report.double_crash_cases > 0, "{report}");
}

/// The golden end is what the procedure means to do: every thing and the registry present.
#[tokio::test]
async fn golden_world_has_every_thing() {
    let (env, result) = WorldScenario { register, roots }.golden_run().await;
    let output = result.unwrap();
    assert_eq!(output, Some(serde_json::json!(THINGS)));
    let world = env.world.snapshot();
    assert_eq!(world.len(), THINGS + 1);
    assert!(world.values().all(|t| *t == Thing::Present));
}
