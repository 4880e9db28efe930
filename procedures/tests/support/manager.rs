//! A configurable test procedure shared by the manager tests.
#![allow(dead_code)]

use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use procedures::{
    BoxedProcedure, BoxedProcedureLoader, Context, Error, LockKey, ManagerConfig, Procedure,
    ProcedureId, ProcedureWithId, Result, RetryPolicy, Status, StringKey,
};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

pub const TYPE: &str = "test_steps";

/// What a [`Steps`] procedure does; also its persisted data.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Plan {
    /// `Executing` steps before `Done`.
    pub steps: u32,
    /// Steps run so far.
    pub at: u32,
    /// Whether the steps ask to be persisted.
    pub persist: bool,
    pub exclusive: Vec<String>,
    pub shared: Vec<String>,
    /// Children (by name) started in one `Suspended` before the first step.
    pub children: Vec<(String, Plan)>,
    pub children_started: bool,
    /// How many times the step fails with a retryable error first (counted in the [`Env`]).
    pub retryable_failures: u32,
    /// Fails with a non-retryable error once the steps are done.
    pub fail: bool,
    pub rollback: bool,
    pub timeout_ms: Option<u64>,
    /// Each `execute` sleeps this long.
    pub hold_ms: u64,
    /// At this step, waits for a permit of the env's gate.
    pub block_at: Option<u32>,
}

impl Plan {
    pub fn steps(steps: u32, persist: bool) -> Self {
        Plan {
            steps,
            persist,
            ..Plan::default()
        }
    }
}

/// What the test observes of the procedures it runs.
pub struct Env {
    pub events: Mutex<Vec<String>>,
    pub running: AtomicUsize,
    pub max_running: AtomicUsize,
    pub attempts: AtomicU32,
    pub rollbacks: AtomicU32,
    pub gate: Arc<Semaphore>,
}

impl Env {
    /// An env whose gate is closed (`block_at` blocks) or open.
    pub fn new(gate_open: bool) -> Arc<Self> {
        Arc::new(Env {
            events: Mutex::new(Vec::new()),
            running: AtomicUsize::new(0),
            max_running: AtomicUsize::new(0),
            attempts: AtomicU32::new(0),
            rollbacks: AtomicU32::new(0),
            gate: Arc::new(Semaphore::new(if gate_open {
                Semaphore::MAX_PERMITS
            } else {
                0
            })),
        })
    }

    pub fn events(&self) -> Vec<String> {
        self.events.lock().unwrap().clone()
    }

    fn log(&self, event: String) {
        self.events.lock().unwrap().push(event);
    }

    pub fn procedure(self: &Arc<Self>, plan: Plan) -> BoxedProcedure {
        Box::new(Steps {
            plan,
            env: Arc::clone(self),
        })
    }

    pub fn with_id(self: &Arc<Self>, id: &str, plan: Plan) -> ProcedureWithId {
        ProcedureWithId::new(ProcedureId::new(id), self.procedure(plan))
    }

    pub fn loader(self: &Arc<Self>) -> BoxedProcedureLoader {
        let env = Arc::clone(self);
        Box::new(move |data| {
            let plan: Plan = serde_json::from_value(data).map_err(Error::external)?;
            Ok(env.procedure(plan))
        })
    }

    /// The span (first enter, last exit) of each procedure's executions in the event log.
    pub fn span(&self, id: &str) -> (usize, usize) {
        let events = self.events();
        let enter = events
            .iter()
            .position(|e| e.starts_with(&format!("enter {id} ")))
            .expect("procedure entered");
        let exit = events
            .iter()
            .rposition(|e| e == &format!("exit {id}"))
            .expect("procedure exited");
        (enter, exit)
    }
}

pub struct Steps {
    pub plan: Plan,
    pub env: Arc<Env>,
}

impl Steps {
    fn exit(&self, ctx: &Context) {
        self.env.running.fetch_sub(1, Ordering::SeqCst);
        self.env.log(format!("exit {}", ctx.procedure_id()));
    }
}

#[async_trait]
impl Procedure for Steps {
    fn type_name(&self) -> &str {
        TYPE
    }

    async fn execute(&mut self, ctx: &Context) -> Result<Status> {
        let now = self.env.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.env.max_running.fetch_max(now, Ordering::SeqCst);
        self.env
            .log(format!("enter {} at {}", ctx.procedure_id(), self.plan.at));
        if self.plan.hold_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.plan.hold_ms)).await;
        }
        if self.plan.block_at == Some(self.plan.at) {
            // Permits are never closed; a closed gate blocks until the test ends.
            let _ = self.env.gate.acquire().await;
        }
        if self.env.attempts.load(Ordering::SeqCst) < self.plan.retryable_failures {
            self.env.attempts.fetch_add(1, Ordering::SeqCst);
            self.exit(ctx);
            return Err(Error::retry_later("flaky step"));
        }
        if !self.plan.children.is_empty() && !self.plan.children_started {
            self.plan.children_started = true;
            let children = self
                .plan
                .children
                .iter()
                .map(|(name, plan)| {
                    ProcedureWithId::new(
                        ctx.procedure_id().child(name),
                        self.env.procedure(plan.clone()),
                    )
                })
                .collect();
            self.exit(ctx);
            return Ok(Status::Suspended {
                subprocedures: children,
                persist: self.plan.persist,
            });
        }
        if self.plan.at < self.plan.steps {
            if let Err(e) = ctx.side_effect_point(&format!("step {}", self.plan.at)) {
                self.exit(ctx);
                return Err(e);
            }
            self.plan.at += 1;
            self.exit(ctx);
            return Ok(Status::executing(self.plan.persist));
        }
        self.exit(ctx);
        if self.plan.fail {
            return Err(Error::external("step refused for good"));
        }
        Ok(Status::done_with_output(
            serde_json::json!({ "steps": self.plan.at }),
        ))
    }

    fn dump(&self) -> Result<serde_json::Value> {
        Ok(serde_json::to_value(&self.plan).expect("plan serialises"))
    }

    fn lock_key(&self) -> LockKey {
        LockKey::new(
            self.plan
                .exclusive
                .iter()
                .map(|k| StringKey::Exclusive(k.clone()))
                .chain(
                    self.plan
                        .shared
                        .iter()
                        .map(|k| StringKey::Shared(k.clone())),
                ),
        )
    }

    fn rollback_supported(&self) -> bool {
        self.plan.rollback
    }

    async fn rollback(&mut self, _ctx: &Context) -> Result<()> {
        self.env.rollbacks.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn timeout(&self) -> Option<Duration> {
        self.plan.timeout_ms.map(Duration::from_millis)
    }
}

/// A config with tiny retry delays, so failing paths finish quickly.
pub fn fast_config() -> ManagerConfig {
    let retry = RetryPolicy {
        max_retries: 3,
        initial_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(4),
        factor: 2.0,
    };
    ManagerConfig {
        max_running_procedures: 16,
        step_retry: retry.clone(),
        store_retry: retry,
        retention: Duration::from_secs(3600),
        retention_check_interval: Duration::from_secs(3600),
        finished_in_memory: Duration::from_secs(3600),
        control_poll_interval: Duration::from_millis(20),
    }
}

/// Fails the test instead of hanging when `f` never completes (a deadlock would otherwise hang the suite).
pub async fn within<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .expect("did not complete: the manager hangs")
}
