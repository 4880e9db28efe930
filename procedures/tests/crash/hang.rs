//! The harness never hangs: a procedure that stops making progress after a crash is reported as a mismatch.

use std::sync::Arc;
use std::time::Duration;

use crate::support::crash::{World, WorldScenario, loader};
use async_trait::async_trait;
use procedures::testing::{CrashPoint, MatrixConfig, run_crash_matrix};
use procedures::{
    Context, Error, LockKey, Procedure, ProcedureId, ProcedureManager, ProcedureWithId, Result,
    Status,
};
use serde::{Deserialize, Serialize};

const TYPE: &str = "stuck_after_restart";

#[derive(Serialize, Deserialize)]
struct State {
    started: bool,
}

/// Step 0 marks `started` in the world; step 1 finishes, unless it finds the world marked by an earlier run and the
/// procedure was rebuilt from the store: then it waits forever (a procedure that deadlocks after recovery).
struct StuckAfterRestart {
    state: State,
    world: Arc<World>,
    recovered: bool,
}

#[async_trait]
impl Procedure for StuckAfterRestart {
    fn type_name(&self) -> &str {
        TYPE
    }

    async fn execute(&mut self, ctx: &Context) -> Result<Status> {
        if !self.state.started {
            self.world.create("started");
            ctx.side_effect_point("started")?;
            self.state.started = true;
            return Ok(Status::executing(true));
        }
        if self.recovered {
            std::future::pending::<()>().await;
        }
        Ok(Status::done())
    }

    fn dump(&self) -> Result<serde_json::Value> {
        serde_json::to_value(&self.state).map_err(Error::external)
    }

    fn lock_key(&self) -> LockKey {
        LockKey::none()
    }
}

fn register(world: &Arc<World>, manager: &dyn ProcedureManager) -> Result<()> {
    manager.register_loader(
        TYPE,
        loader(world, |state, world| {
            Box::new(StuckAfterRestart {
                state,
                world,
                recovered: true,
            })
        }),
    )
}

fn roots(world: &Arc<World>) -> Vec<ProcedureWithId> {
    vec![ProcedureWithId::new(
        ProcedureId::new("stuck"),
        Box::new(StuckAfterRestart {
            state: State { started: false },
            world: world.clone(),
            recovered: false,
        }),
    )]
}

#[tokio::test]
async fn harness_reports_a_hang_instead_of_hanging() {
    let scenario = WorldScenario { register, roots };
    let config = MatrixConfig {
        phase_timeout: Duration::from_millis(200),
        second_crash: false,
        ..MatrixConfig::default()
    };
    let report = run_crash_matrix(&scenario, config).await;
    // Writes: #0 epoch, #1 submission, #2 step 0, #3 done. The golden run never recovers, so it finishes; every case
    // whose recovery rebuilds the procedure from a stored record before #3 hangs, and only those.
    assert_eq!(report.transitions, 4, "{report}");
    let hung: Vec<Vec<CrashPoint>> = report
        .mismatches
        .iter()
        .inspect(|m| assert!(m.detail.contains("hung"), "{m}"))
        .map(|m| m.crashes.clone())
        .collect();
    assert_eq!(
        hung,
        vec![
            vec![CrashPoint::AfterWrite(1)],
            vec![CrashPoint::BeforeWrite(2)],
            vec![CrashPoint::AfterWrite(2)],
            vec![CrashPoint::BeforeWrite(3)],
            vec![CrashPoint::SideEffect(0)],
        ],
        "{report}"
    );
}
