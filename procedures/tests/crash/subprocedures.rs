//! Crash matrix of a parent procedure that suspends on three children with deterministic ids.

use std::sync::Arc;

use crate::support::crash::{World, WorldScenario, loader, run_matrix};
use async_trait::async_trait;
use procedures::{
    Context, Error, LockKey, Procedure, ProcedureId, ProcedureManager, ProcedureWithId, Result,
    Status,
};
use serde::{Deserialize, Serialize};

const PARENT: &str = "parent";
const CHILD: &str = "child";
const CHILDREN: u32 = 3;

#[derive(Clone, Copy, PartialEq, Serialize, Deserialize)]
enum ParentStep {
    Prepare,
    SpawnChildren,
    Finish,
}

#[derive(Serialize, Deserialize)]
struct ParentState {
    id: ProcedureId,
    step: ParentStep,
    /// Whether the suspension persists the parent's state (already moved on to `Finish`) before the children start.
    persist_suspension: bool,
}

/// Prepare (one effect) → suspend on children `{id}/child-0..2` → finish (one effect, output).
struct Parent {
    state: ParentState,
    world: Arc<World>,
}

#[async_trait]
impl Procedure for Parent {
    fn type_name(&self) -> &str {
        PARENT
    }

    async fn execute(&mut self, ctx: &Context) -> Result<Status> {
        match self.state.step {
            ParentStep::Prepare => {
                self.world.create("parent/prepared");
                ctx.side_effect_point("parent/prepared")?;
                self.state.step = ParentStep::SpawnChildren;
                Ok(Status::executing(true))
            }
            ParentStep::SpawnChildren => {
                let children = (0..CHILDREN)
                    .map(|i| {
                        ProcedureWithId::new(
                            self.state.id.child(format!("child-{i}")),
                            Box::new(Child {
                                state: ChildState {
                                    index: i,
                                    next_step: 0,
                                },
                                world: self.world.clone(),
                            }),
                        )
                    })
                    .collect();
                self.state.step = ParentStep::Finish;
                Ok(Status::Suspended {
                    subprocedures: children,
                    persist: self.state.persist_suspension,
                })
            }
            ParentStep::Finish => {
                for i in 0..CHILDREN {
                    // The children are done before the parent resumes.
                    if !self.world.is_present(&format!("child-{i}/step-1")) {
                        return Err(Error::external(format!(
                            "parent resumed before child {i} finished"
                        )));
                    }
                }
                self.world.create("parent/finished");
                ctx.side_effect_point("parent/finished")?;
                Ok(Status::done_with_output(
                    serde_json::json!({ "children": CHILDREN }),
                ))
            }
        }
    }

    fn dump(&self) -> Result<serde_json::Value> {
        serde_json::to_value(&self.state).map_err(Error::external)
    }

    fn lock_key(&self) -> LockKey {
        LockKey::exclusive("db")
    }
}

#[derive(Serialize, Deserialize)]
struct ChildState {
    index: u32,
    next_step: u32,
}

/// Two steps, one effect each.
struct Child {
    state: ChildState,
    world: Arc<World>,
}

#[async_trait]
impl Procedure for Child {
    fn type_name(&self) -> &str {
        CHILD
    }

    async fn execute(&mut self, ctx: &Context) -> Result<Status> {
        if self.state.next_step == 2 {
            return Ok(Status::done_with_output(serde_json::json!(
                self.state.index
            )));
        }
        let effect = format!("child-{}/step-{}", self.state.index, self.state.next_step);
        self.world.create(&effect);
        ctx.side_effect_point(&effect)?;
        self.state.next_step += 1;
        Ok(Status::executing(true))
    }

    fn dump(&self) -> Result<serde_json::Value> {
        serde_json::to_value(&self.state).map_err(Error::external)
    }

    fn lock_key(&self) -> LockKey {
        // The parent holds `db`; a child may take it too, and its own key.
        LockKey::new([
            procedures::StringKey::Shared("db".to_string()),
            procedures::StringKey::Exclusive(format!("db/child-{}", self.state.index)),
        ])
    }
}

fn register(world: &Arc<World>, manager: &dyn ProcedureManager) -> Result<()> {
    manager.register_loader(
        PARENT,
        loader(world, |state, world| Box::new(Parent { state, world })),
    )?;
    manager.register_loader(
        CHILD,
        loader(world, |state, world| Box::new(Child { state, world })),
    )
}

fn roots_persisting_the_suspension(world: &Arc<World>) -> Vec<ProcedureWithId> {
    root(world, true)
}

fn roots_not_persisting_the_suspension(world: &Arc<World>) -> Vec<ProcedureWithId> {
    root(world, false)
}

fn root(world: &Arc<World>, persist_suspension: bool) -> Vec<ProcedureWithId> {
    let id = ProcedureId::new("parent-1");
    vec![ProcedureWithId::new(
        id.clone(),
        Box::new(Parent {
            state: ParentState {
                id,
                step: ParentStep::Prepare,
                persist_suspension,
            },
            world: world.clone(),
        }),
    )]
}

/// The parent persists its suspension: after a crash between that write and the children's submissions, the
/// recovered parent must still wait for (and start) its children.
#[tokio::test]
async fn parent_persisting_its_suspension_survives_every_single_and_double_crash() {
    let scenario = WorldScenario {
        register,
        roots: roots_persisting_the_suspension,
    };
    let report = run_matrix("subprocedures, suspension persisted", &scenario).await;
    report.assert_no_mismatch();
    assert_eq!(
        report.side_effect_points,
        2 + 2 * CHILDREN as usize,
        "{report}"
    );
    assert!(report.double_crash_cases > 0, "{report}");
}

/// The parent does not persist its suspension: a crash before its next write replays the suspending step, which
/// must await the children already started instead of starting them twice.
#[tokio::test]
async fn parent_replaying_its_suspension_survives_every_single_and_double_crash() {
    let scenario = WorldScenario {
        register,
        roots: roots_not_persisting_the_suspension,
    };
    let report = run_matrix("subprocedures, suspension replayed", &scenario).await;
    report.assert_no_mismatch();
    assert_eq!(
        report.side_effect_points,
        2 + 2 * CHILDREN as usize,
        "{report}"
    );
    assert!(report.double_crash_cases > 0, "{report}");
}
