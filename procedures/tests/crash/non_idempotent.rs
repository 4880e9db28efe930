//! The harness can fail: a procedure whose step is not idempotent is reported.

use std::sync::Arc;

use crate::support::crash::{World, WorldScenario, loader, run_matrix};
use async_trait::async_trait;
use procedures::testing::CrashPoint;
use procedures::{
    Context, Error, LockKey, Procedure, ProcedureId, ProcedureManager, ProcedureWithId, Result,
    Status,
};
use serde::{Deserialize, Serialize};

const TYPE: &str = "careless_counter";

#[derive(Serialize, Deserialize)]
struct State {
    appended: bool,
}

/// Step 0 appends to `counter` without checking whether it already did; step 1 finishes. Replaying step 0 after a
/// crash counts twice.
struct CarelessCounter {
    state: State,
    world: Arc<World>,
}

#[async_trait]
impl Procedure for CarelessCounter {
    fn type_name(&self) -> &str {
        TYPE
    }

    async fn execute(&mut self, ctx: &Context) -> Result<Status> {
        if self.state.appended {
            return Ok(Status::done());
        }
        self.world.append("counter");
        ctx.side_effect_point("appended to counter")?;
        self.state.appended = true;
        Ok(Status::executing(true))
    }

    fn dump(&self) -> Result<serde_json::Value> {
        serde_json::to_value(&self.state).map_err(Error::external)
    }

    fn lock_key(&self) -> LockKey {
        LockKey::exclusive("counter")
    }
}

fn register(world: &Arc<World>, manager: &dyn ProcedureManager) -> Result<()> {
    manager.register_loader(
        TYPE,
        loader(world, |state, world| {
            Box::new(CarelessCounter { state, world })
        }),
    )
}

fn roots(world: &Arc<World>) -> Vec<ProcedureWithId> {
    vec![ProcedureWithId::new(
        ProcedureId::new("careless"),
        Box::new(CarelessCounter {
            state: State { appended: false },
            world: world.clone(),
        }),
    )]
}

#[tokio::test]
async fn harness_reports_a_non_idempotent_step() {
    let scenario = WorldScenario { register, roots };
    let report = run_matrix("non-idempotent (must mismatch)", &scenario).await;
    assert!(
        !report.mismatches.is_empty(),
        "the harness missed a double append: {report}"
    );
    // A crash right after the append replays the step: the counter ends at 2 where the golden run has 1.
    let at_effect = report
        .mismatches
        .iter()
        .find(|m| m.crashes == [CrashPoint::SideEffect(0)])
        .unwrap_or_else(|| panic!("no mismatch for a crash at the append: {report}"));
    let lines: Vec<&str> = at_effect.detail.lines().collect();
    assert!(
        lines.iter().any(|l| l.contains("\"counter\": Appended(")),
        "{}",
        at_effect.detail
    );
    let changed = |tag: char, value: &str| {
        lines
            .iter()
            .any(|l| l.strip_prefix(tag).is_some_and(|rest| rest.trim() == value))
    };
    assert!(
        changed('-', "1,") && changed('+', "2,"),
        "{}",
        at_effect.detail
    );
    // The crashes after the step's state was stored do not replay it: those cases match.
    assert!(
        report.mismatches.len() < report.cases_run,
        "every case mismatched, so the harness tells nothing apart: {report}"
    );
    // And the summary used by assert_no_mismatch names the case.
    let panic = std::panic::catch_unwind(|| report.assert_no_mismatch()).unwrap_err();
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("at side-effect point #0"), "{message}");
}
