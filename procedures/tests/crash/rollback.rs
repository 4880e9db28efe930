//! Crash matrix of a procedure that fails for good at its fourth step and rolls back its three effects.

use std::sync::Arc;

use crate::support::crash::{Thing, World, WorldScenario, loader, run_matrix};
use async_trait::async_trait;
use procedures::{
    Context, Error, LockKey, Procedure, ProcedureId, ProcedureManager, ProcedureWithId, Result,
    Status,
};
use serde::{Deserialize, Serialize};

const TYPE: &str = "doomed";
const FAILING_STEP: u32 = 3;

#[derive(Serialize, Deserialize)]
struct State {
    next_step: u32,
}

/// Steps 0–2 each create `effect-{i}`; step 3 fails with a non-retryable error; rollback removes every effect of the
/// steps done (in reverse), declaring a side-effect point after each removal.
struct Doomed {
    state: State,
    world: Arc<World>,
}

#[async_trait]
impl Procedure for Doomed {
    fn type_name(&self) -> &str {
        TYPE
    }

    async fn execute(&mut self, ctx: &Context) -> Result<Status> {
        let step = self.state.next_step;
        if step == FAILING_STEP {
            return Err(Error::external("the target refused step 3"));
        }
        let effect = format!("effect-{step}");
        self.world.create(&effect);
        ctx.side_effect_point(&effect)?;
        self.state.next_step += 1;
        Ok(Status::executing(true))
    }

    fn dump(&self) -> Result<serde_json::Value> {
        serde_json::to_value(&self.state).map_err(Error::external)
    }

    fn lock_key(&self) -> LockKey {
        LockKey::exclusive("doomed")
    }

    fn rollback_supported(&self) -> bool {
        true
    }

    async fn rollback(&mut self, ctx: &Context) -> Result<()> {
        // The failing step never ran, so the state names every step whose effect may exist.
        for i in (0..self.state.next_step).rev() {
            let effect = format!("effect-{i}");
            self.world.remove(&effect);
            ctx.side_effect_point(&format!("removed {effect}"))?;
        }
        Ok(())
    }
}

fn register(world: &Arc<World>, manager: &dyn ProcedureManager) -> Result<()> {
    manager.register_loader(
        TYPE,
        loader(world, |state, world| Box::new(Doomed { state, world })),
    )
}

fn roots(world: &Arc<World>) -> Vec<ProcedureWithId> {
    vec![ProcedureWithId::new(
        ProcedureId::new("doomed-1"),
        Box::new(Doomed {
            state: State { next_step: 0 },
            world: world.clone(),
        }),
    )]
}

#[tokio::test]
async fn rollback_survives_every_single_and_double_crash() {
    let scenario = WorldScenario { register, roots };
    let report = run_matrix("rollback", &scenario).await;
    report.assert_no_mismatch();
    // Three effects, three removals.
    assert_eq!(report.side_effect_points, 6, "{report}");
    // The size docs/crash-testing.md quotes as its example: the matrix is deterministic.
    assert_eq!(report.transitions, 7, "{report}");
    assert_eq!(report.unreached_crash_points, 0, "{report}");
    assert_eq!(report.single_crash_cases, 20, "{report}");
    assert_eq!(report.double_crash_cases, 250, "{report}");
    assert_eq!(report.cases_run, 270, "{report}");
}

/// The golden end the matrix compares against is a failure with every effect rolled back.
#[tokio::test]
async fn golden_run_fails_and_rolls_back_every_effect() {
    let (env, result) = WorldScenario { register, roots }.golden_run().await;
    let err = result.unwrap_err();
    assert!(err.to_string().contains("refused step 3"), "{err}");
    let world = env.world.snapshot();
    assert_eq!(world.len(), 3, "{world:?}");
    assert!(world.values().all(|t| *t == Thing::Removed), "{world:?}");
}
