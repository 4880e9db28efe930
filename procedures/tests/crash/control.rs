//! Crash matrix of cancel, pause and resume: a procedure that asks for its own cancel and rolls back, one that asks
//! for its own pause, and a second root that resumes it once it is paused. Every durable transition of the three —
//! the `paused`, `running` (resumed), `rolling_back` and `cancelled` records — is crashed, once and twice.
//!
//! The requests are written the way another process writes them: straight into the durable store (not through
//! the crashing wrapper), each followed by a side-effect point, so the harness also crashes just after each.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::support::crash::{Thing, World};
use async_trait::async_trait;
use procedures::control::{self, ControlOp, control_key};
use procedures::testing::{
    CrashScenario, MatrixConfig, StoreDigest, run_crash_matrix, store_digest,
};
use procedures::{
    Context, Error, EventKind, LockKey, MemoryStateStore, Procedure, ProcedureId, ProcedureManager,
    ProcedureRecord, ProcedureWithId, Result, StateStore, Status,
};
use serde::{Deserialize, Serialize};

const ASKER: &str = "asker";
const RESUMER: &str = "resumer";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Ask {
    Cancel,
    Pause,
}

#[derive(Serialize, Deserialize)]
struct AskerState {
    ask: Ask,
    next_step: u32,
}

/// Step 0 creates `{id}-effect`; step 1 asks for its own cancel or pause the first time (the request, then a world
/// flag, then a side-effect point) and changes nothing of its state, so the boundary after it honours the request;
/// run again after a resume, it moves on; step 2 finishes. Rollback removes the effect.
struct Asker {
    state: AskerState,
    world: Arc<World>,
    store: Arc<MemoryStateStore>,
}

#[async_trait]
impl Procedure for Asker {
    fn type_name(&self) -> &str {
        ASKER
    }

    async fn execute(&mut self, ctx: &Context) -> Result<Status> {
        let id = ctx.procedure_id().clone();
        match self.state.next_step {
            0 => {
                self.world.create(&format!("{id}-effect"));
                ctx.side_effect_point("created effect")?;
                self.state.next_step = 1;
                Ok(Status::executing(true))
            }
            1 => {
                let flag = format!("{id}-asked");
                if self.world.is_present(&flag) {
                    self.state.next_step = 2;
                    return Ok(Status::executing(true));
                }
                let op = match self.state.ask {
                    Ask::Cancel => ControlOp::Cancel,
                    Ask::Pause => ControlOp::Pause,
                };
                control::request(self.store.as_ref(), &id, op).await?;
                self.world.create(&flag);
                ctx.side_effect_point("asked")?;
                Ok(Status::executing(false))
            }
            _ => Ok(Status::done_with_output(
                serde_json::json!({ "id": id.as_str() }),
            )),
        }
    }

    fn dump(&self) -> Result<serde_json::Value> {
        serde_json::to_value(&self.state).map_err(Error::external)
    }

    fn lock_key(&self) -> LockKey {
        LockKey::exclusive(format!("asker/{:?}", self.state.ask))
    }

    fn rollback_supported(&self) -> bool {
        true
    }

    async fn rollback(&mut self, ctx: &Context) -> Result<()> {
        self.world.remove(&format!("{}-effect", ctx.procedure_id()));
        ctx.side_effect_point("removed effect")?;
        Ok(())
    }
}

#[derive(Serialize, Deserialize)]
struct ResumerState {
    target: ProcedureId,
    resumed: bool,
}

/// Waits until its target's record says it paused (a `paused` event in its history) or finished, then withdraws
/// the pause by deleting the control key, as `walctl procedures resume` does with no manager of its own.
struct Resumer {
    state: ResumerState,
    store: Arc<MemoryStateStore>,
}

#[async_trait]
impl Procedure for Resumer {
    fn type_name(&self) -> &str {
        RESUMER
    }

    async fn execute(&mut self, ctx: &Context) -> Result<Status> {
        if self.state.resumed {
            return Ok(Status::done());
        }
        let key = format!("proc/{}", self.state.target);
        loop {
            let paused = match self.store.get(&key).await? {
                Some(value) => {
                    let record: ProcedureRecord =
                        serde_json::from_slice(&value).map_err(Error::external)?;
                    record.state.is_finished()
                        || record.events.iter().any(|e| e.kind == EventKind::Paused)
                }
                None => false,
            };
            if paused {
                break;
            }
            if ctx.is_halted() {
                return Err(Error::external("the manager halted while waiting"));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        self.store
            .delete(&[control_key(&self.state.target)])
            .await?;
        ctx.side_effect_point("resumed")?;
        self.state.resumed = true;
        Ok(Status::executing(true))
    }

    fn dump(&self) -> Result<serde_json::Value> {
        serde_json::to_value(&self.state).map_err(Error::external)
    }

    fn lock_key(&self) -> LockKey {
        LockKey::none()
    }
}

struct Env {
    store: Arc<MemoryStateStore>,
    world: Arc<World>,
}

#[derive(Debug, PartialEq)]
struct Outcome {
    store: StoreDigest,
    world: BTreeMap<String, Thing>,
}

struct ControlScenario;

#[async_trait]
impl CrashScenario for ControlScenario {
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
        let (world, store) = (env.world.clone(), env.store.clone());
        manager.register_loader(
            ASKER,
            Box::new(move |data| {
                let state: AskerState = serde_json::from_value(data).map_err(Error::external)?;
                Ok(Box::new(Asker {
                    state,
                    world: world.clone(),
                    store: store.clone(),
                }) as procedures::BoxedProcedure)
            }),
        )?;
        let store = env.store.clone();
        manager.register_loader(
            RESUMER,
            Box::new(move |data| {
                let state: ResumerState = serde_json::from_value(data).map_err(Error::external)?;
                Ok(Box::new(Resumer {
                    state,
                    store: store.clone(),
                }) as procedures::BoxedProcedure)
            }),
        )
    }

    fn procedures(&self, env: &Env) -> Vec<ProcedureWithId> {
        let asker = |ask| {
            Box::new(Asker {
                state: AskerState { ask, next_step: 0 },
                world: env.world.clone(),
                store: env.store.clone(),
            })
        };
        vec![
            ProcedureWithId::new(ProcedureId::new("cancelled"), asker(Ask::Cancel)),
            ProcedureWithId::new(ProcedureId::new("paused"), asker(Ask::Pause)),
            ProcedureWithId::new(
                ProcedureId::new("resumer"),
                Box::new(Resumer {
                    state: ResumerState {
                        target: ProcedureId::new("paused"),
                        resumed: false,
                    },
                    store: env.store.clone(),
                }),
            ),
        ]
    }

    async fn outcome(&self, env: &Env) -> Outcome {
        Outcome {
            store: store_digest(env.store.as_ref()).await.unwrap(),
            world: env.world.snapshot(),
        }
    }
}

fn config() -> MatrixConfig {
    let mut config = MatrixConfig::default();
    // The paused procedure learns of the resume written outside through the poll.
    config.manager.control_poll_interval = Duration::from_millis(5);
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_pause_and_resume_survive_every_single_and_double_crash() {
    let report = run_crash_matrix(&ControlScenario, config()).await;
    eprintln!(
        "crash matrix 'control': {} transitions, {} side-effect points, {} cases run ({} single crash, {} double \
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
    report.assert_no_mismatch();
    // The epoch claim; cancelled: submission, step 0, rolling_back, cancelled; paused: submission, step 0, paused,
    // running (resumed), step 1, done; resumer: submission, its step, done.
    assert_eq!(report.transitions, 14, "{report}");
    assert_eq!(report.single_crash_cases, 34, "{report}");
    // And the answer of each write lost (applied, then a retryable error): the manager retries and finishes alike.
    assert_eq!(report.lost_answer_cases, 14, "{report}");
    // Three roots run at once, so which root's write is the k-th of a recovery varies between runs, and a second
    // crash point counted in one run may lie past the end of another: such a case still runs to the end and is
    // compared (it is not a mismatch).
    assert!(report.double_crash_cases > 600, "{report}");
}

/// The golden end: the cancelled procedure rolled back and ended cancelled, its request consumed; the paused one
/// paused, was resumed and finished; no control key is left.
#[tokio::test]
async fn the_golden_run_cancels_one_and_pauses_then_resumes_the_other() {
    let env = ControlScenario.new_env().await;
    let manager = procedures::LocalManager::new(env.store.clone(), config().manager);
    ControlScenario.register_loaders(&env, &manager).unwrap();
    manager.start().await.unwrap();
    let mut watchers = Vec::new();
    for p in ControlScenario.procedures(&env) {
        watchers.push(manager.submit(p).await.unwrap());
    }
    let results: Vec<_> = futures_results(&mut watchers).await;
    assert!(
        results[0]
            .as_ref()
            .unwrap_err()
            .to_string()
            .ends_with("cancelled (rolled back)")
    );
    assert!(results[1].is_ok() && results[2].is_ok(), "{results:?}");
    manager.stop().await.unwrap();
    let world = env.world.snapshot();
    assert_eq!(world["cancelled-effect"], Thing::Removed);
    assert_eq!(world["paused-effect"], Thing::Present);
    assert!(
        env.store
            .snapshot()
            .keys()
            .all(|k| !k.starts_with("control/")),
        "{:?}",
        env.store.snapshot().keys().collect::<Vec<_>>()
    );
    let paused: ProcedureRecord =
        serde_json::from_slice(&env.store.snapshot()["proc/paused"]).unwrap();
    let kinds: Vec<&EventKind> = paused.events.iter().map(|e| &e.kind).collect();
    assert!(
        kinds.contains(&&EventKind::Paused) && kinds.contains(&&EventKind::Resumed),
        "{kinds:?}"
    );
}

async fn futures_results(
    watchers: &mut [procedures::Watcher],
) -> Vec<Result<Option<procedures::Output>>> {
    let mut results = Vec::new();
    for w in watchers {
        results.push(
            tokio::time::timeout(Duration::from_secs(30), w.wait())
                .await
                .expect("finishes"),
        );
    }
    results
}
