//! Cancel, pause and resume: at step boundaries, during retry and lock waits, across restarts, and written by
//! another process straight into the store.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::support::manager::{Env, Plan, TYPE, fast_config, within};
use procedures::control::{self, CONTROL_ALL_KEY, ControlOp, control_key};
use procedures::{
    EventKind, LocalManager, ManagerConfig, MemoryStateStore, ProcedureId, ProcedureManager,
    ProcedureRecord, ProcedureState, RetryPolicy, StateStore,
};

async fn started(
    store: &Arc<MemoryStateStore>,
    env: &Arc<Env>,
    config: ManagerConfig,
) -> LocalManager {
    let manager = LocalManager::new(store.clone(), config);
    manager.register_loader(TYPE, env.loader()).unwrap();
    manager.start().await.unwrap();
    manager
}

fn stored(store: &MemoryStateStore, id: &str) -> ProcedureRecord {
    let value = store
        .snapshot()
        .get(&format!("proc/{id}"))
        .cloned()
        .expect("record stored");
    serde_json::from_slice(&value).unwrap()
}

fn event_names(record: &ProcedureRecord) -> Vec<String> {
    record
        .events
        .iter()
        .map(|e| {
            serde_json::to_value(&e.kind).unwrap()["event"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

/// Waits until `id` shows `state` in `m`.
async fn until_state(m: &LocalManager, id: &str, state: ProcedureState) {
    within(async {
        loop {
            if let Some(info) = m.procedure_state(&ProcedureId::new(id)).await.unwrap()
                && info.state == state
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
}

/// Waits until a step of `id` at `at` has been entered (it then blocks at the env's closed gate).
async fn until_entered(env: &Env, id: &str, at: u32) {
    let entered = format!("enter {id} at {at}");
    within(async {
        while !env.events().contains(&entered) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
}

fn blocked_plan(rollback: bool) -> Plan {
    Plan {
        steps: 3,
        persist: true,
        exclusive: vec!["k".into()],
        block_at: Some(1),
        rollback,
        ..Plan::default()
    }
}

#[tokio::test]
async fn a_paused_procedure_keeps_its_locks_runs_no_step_and_finishes_once_resumed() {
    let env = Env::new(false);
    let store = Arc::new(MemoryStateStore::new());
    let m = started(&store, &env, fast_config()).await;
    let id = ProcedureId::new("p");
    let mut w = m
        .submit(env.with_id("p", blocked_plan(false)))
        .await
        .unwrap();
    until_entered(&env, "p", 1).await;
    m.pause(&id).await.unwrap();
    assert!(
        store.snapshot().contains_key(&control_key(&id)),
        "the pause is persisted"
    );
    env.gate.add_permits(1);
    until_state(&m, "p", ProcedureState::Paused).await;

    let record = stored(&store, "p");
    assert_eq!(record.state, ProcedureState::Paused);
    assert_eq!(
        event_names(&record).last().map(String::as_str),
        Some("paused")
    );
    let held = m.procedure_locks(&id).expect("holds its keys").held;
    assert_eq!(held.len(), 1, "{held:?}");
    assert!(
        !env.events().contains(&"enter p at 2".to_string()),
        "{:?}",
        env.events()
    );

    // Another procedure wanting the key waits while p is paused.
    env.gate.add_permits(100);
    let mut other = m
        .submit(env.with_id(
            "q",
            Plan {
                exclusive: vec!["k".into()],
                ..Plan::steps(1, true)
            },
        ))
        .await
        .unwrap();
    until_state(&m, "q", ProcedureState::Running).await;
    // Its runner may not have asked for the key yet when `submit` returns: wait until it queued for it.
    within(async {
        while m
            .procedure_locks(&ProcedureId::new("q"))
            .and_then(|l| l.waiting)
            .is_none()
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;

    m.resume(&id).await.unwrap();
    assert!(!store.snapshot().contains_key(&control_key(&id)));
    within(w.wait()).await.unwrap();
    within(other.wait()).await.unwrap();
    let names = event_names(&stored(&store, "p"));
    let paused = names.iter().position(|n| n == "paused").unwrap();
    let resumed = names.iter().position(|n| n == "resumed").unwrap();
    assert!(paused < resumed, "{names:?}");
    assert_eq!(names.last().map(String::as_str), Some("done"));
}

#[tokio::test]
async fn a_paused_procedure_stays_paused_across_a_restart() {
    let env = Env::new(false);
    let store = Arc::new(MemoryStateStore::new());
    let m = started(&store, &env, fast_config()).await;
    let id = ProcedureId::new("p");
    let _w = m
        .submit(env.with_id("p", blocked_plan(false)))
        .await
        .unwrap();
    until_entered(&env, "p", 1).await;
    m.pause(&id).await.unwrap();
    env.gate.add_permits(100);
    until_state(&m, "p", ProcedureState::Paused).await;
    let step = stored(&store, "p").step;
    m.stop().await.unwrap();

    let m2 = started(&store, &env, fast_config()).await;
    until_state(&m2, "p", ProcedureState::Paused).await;
    // The recovered procedure is paused without a write and runs no step.
    assert_eq!(stored(&store, "p").step, step);
    assert!(!env.events().contains(&"enter p at 2".to_string()));
    m2.resume(&id).await.unwrap();
    let mut w = m2.watch(&id).await.unwrap().unwrap();
    within(w.wait()).await.unwrap();
    assert_eq!(stored(&store, "p").state, ProcedureState::Done);
}

/// A cancel the manager learns of only at a step boundary: written by another process while the step runs, with
/// no poll of the control keys before the boundary (a cancel the manager knows of during the step interrupts it:
/// `interrupt.rs`). The step ends on its own, and the boundary's read of the keys finds the request.
#[tokio::test]
async fn a_cancel_at_a_step_boundary_rolls_back_and_ends_cancelled() {
    let env = Env::new(false);
    let store = Arc::new(MemoryStateStore::new());
    let config = ManagerConfig {
        control_poll_interval: Duration::from_secs(3600),
        ..fast_config()
    };
    let m = started(&store, &env, config).await;
    let id = ProcedureId::new("p");
    let mut w = m
        .submit(env.with_id("p", blocked_plan(true)))
        .await
        .unwrap();
    until_entered(&env, "p", 1).await;
    let outside: &dyn StateStore = store.as_ref();
    control::request(outside, &id, ControlOp::Cancel)
        .await
        .unwrap();
    env.gate.add_permits(100);
    let err = within(w.wait()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "procedure p was cancelled: cancelled (rolled back)"
    );
    assert_eq!(env.rollbacks.load(Ordering::SeqCst), 1);
    assert_eq!(
        env.events(),
        ["enter p at 0", "exit p", "enter p at 1", "exit p"],
        "the step the cancel was written during ran to its end, and no step after it"
    );
    let record = stored(&store, "p");
    assert_eq!(record.state, ProcedureState::Cancelled);
    assert_eq!(record.error.as_deref(), Some("cancelled (rolled back)"));
    let names = event_names(&record);
    assert_eq!(
        names[names.len() - 4..],
        [
            "cancel_requested",
            "rolling_back",
            "rolled_back",
            "cancelled"
        ]
    );
    assert!(
        !store.snapshot().contains_key(&control_key(&id)),
        "the request is consumed with the record"
    );
    // A finished procedure cannot be cancelled again.
    let again = m.cancel(&id).await.unwrap_err();
    assert_eq!(
        again.to_string(),
        "cannot cancel procedure p: it is already finished (cancelled)"
    );
}

#[tokio::test]
async fn a_cancel_of_a_procedure_without_rollback_says_so() {
    let env = Env::new(false);
    let store = Arc::new(MemoryStateStore::new());
    let m = started(&store, &env, fast_config()).await;
    let mut w = m
        .submit(env.with_id("p", blocked_plan(false)))
        .await
        .unwrap();
    until_entered(&env, "p", 1).await;
    m.cancel(&ProcedureId::new("p")).await.unwrap();
    env.gate.add_permits(100);
    let err = within(w.wait()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "procedure p was cancelled: cancelled (no rollback: procedure type '{TYPE}' has none at this step)"
        )
    );
    assert_eq!(env.rollbacks.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_cancel_ends_a_retry_wait_at_once() {
    let env = Env::new(true);
    let store = Arc::new(MemoryStateStore::new());
    // The retry delay is an hour: only the cancel can end the wait before `within` gives up.
    let config = ManagerConfig {
        step_retry: RetryPolicy {
            max_retries: 5,
            initial_delay: Duration::from_secs(3600),
            max_delay: Duration::from_secs(3600),
            factor: 2.0,
        },
        ..fast_config()
    };
    let m = started(&store, &env, config).await;
    let plan = Plan {
        retryable_failures: 1,
        rollback: true,
        ..Plan::steps(2, true)
    };
    let mut w = m.submit(env.with_id("p", plan)).await.unwrap();
    until_state(&m, "p", ProcedureState::Retrying).await;
    m.cancel(&ProcedureId::new("p")).await.unwrap();
    let err = within(w.wait()).await.unwrap_err();
    assert!(
        err.to_string().ends_with("cancelled (rolled back)"),
        "{err}"
    );
}

#[tokio::test]
async fn a_pause_ends_a_retry_wait_at_once_and_the_resume_runs_the_step_again() {
    let env = Env::new(true);
    let store = Arc::new(MemoryStateStore::new());
    // The retry delay is an hour: only the pause can end the wait before `within` gives up.
    let config = ManagerConfig {
        step_retry: RetryPolicy {
            max_retries: 5,
            initial_delay: Duration::from_secs(3600),
            max_delay: Duration::from_secs(3600),
            factor: 2.0,
        },
        ..fast_config()
    };
    let m = started(&store, &env, config).await;
    let plan = Plan {
        retryable_failures: 1,
        ..Plan::steps(2, true)
    };
    let id = ProcedureId::new("p");
    let mut w = m.submit(env.with_id("p", plan)).await.unwrap();
    until_state(&m, "p", ProcedureState::Retrying).await;
    m.pause(&id).await.unwrap();
    until_state(&m, "p", ProcedureState::Paused).await;
    assert_eq!(stored(&store, "p").state, ProcedureState::Paused);
    m.resume(&id).await.unwrap();
    within(w.wait()).await.unwrap();
    assert_eq!(stored(&store, "p").state, ProcedureState::Done);
}

#[tokio::test]
async fn a_cancel_ends_a_lock_wait_at_once_without_a_rollback() {
    let env = Env::new(false);
    let store = Arc::new(MemoryStateStore::new());
    let m = started(&store, &env, fast_config()).await;
    let _holder = m
        .submit(env.with_id("h", blocked_plan(false)))
        .await
        .unwrap();
    until_entered(&env, "h", 1).await;
    let mut w = m
        .submit(env.with_id("w", blocked_plan(true)))
        .await
        .unwrap();
    within(async {
        while m
            .procedure_locks(&ProcedureId::new("w"))
            .and_then(|l| l.waiting)
            .is_none()
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    m.cancel(&ProcedureId::new("w")).await.unwrap();
    let err = within(w.wait()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "procedure w was cancelled: cancelled before its first step (nothing to roll back)"
    );
    assert_eq!(env.rollbacks.load(Ordering::SeqCst), 0);
    assert!(
        m.procedure_locks(&ProcedureId::new("w")).is_none(),
        "left the lock queue"
    );
}

#[tokio::test]
async fn requests_written_by_another_process_are_honoured_by_the_running_manager() {
    let env = Env::new(false);
    let store = Arc::new(MemoryStateStore::new());
    let m = started(&store, &env, fast_config()).await;
    let id = ProcedureId::new("p");
    let mut w = m
        .submit(env.with_id("p", blocked_plan(true)))
        .await
        .unwrap();
    until_entered(&env, "p", 1).await;
    // Another process: the store only, no manager.
    let outside: &dyn StateStore = store.as_ref();
    control::request(outside, &id, ControlOp::Pause)
        .await
        .unwrap();
    env.gate.add_permits(100);
    until_state(&m, "p", ProcedureState::Paused).await;
    // A resume written outside reaches the paused procedure through the poll.
    control::request(outside, &id, ControlOp::Resume)
        .await
        .unwrap();
    within(w.wait()).await.unwrap();
    let unknown = control::request(outside, &ProcedureId::new("nope"), ControlOp::Cancel)
        .await
        .unwrap_err();
    assert_eq!(
        unknown.to_string(),
        "cannot cancel procedure nope: the store holds no record at 'proc/nope'"
    );
}

#[tokio::test]
async fn a_cancel_written_while_no_manager_runs_is_honoured_on_recovery() {
    let env = Env::new(false);
    let store = Arc::new(MemoryStateStore::new());
    let m = started(&store, &env, fast_config()).await;
    let id = ProcedureId::new("p");
    let _w = m
        .submit(env.with_id("p", blocked_plan(true)))
        .await
        .unwrap();
    until_entered(&env, "p", 1).await;
    m.stop().await.unwrap();
    control::request(store.as_ref(), &id, ControlOp::Cancel)
        .await
        .unwrap();
    let pause = control::request(store.as_ref(), &id, ControlOp::Pause)
        .await
        .unwrap_err();
    assert_eq!(
        pause.to_string(),
        "cannot pause procedure p: its cancel is already requested"
    );

    env.gate.add_permits(100);
    let m2 = started(&store, &env, fast_config()).await;
    let mut w = m2.watch(&id).await.unwrap().unwrap();
    let err = within(w.wait()).await.unwrap_err();
    assert!(
        err.to_string().ends_with("cancelled (rolled back)"),
        "{err}"
    );
    assert!(!store.snapshot().contains_key(&control_key(&id)));
}

#[tokio::test]
async fn pause_all_pauses_every_procedure_and_resume_all_lets_them_finish() {
    let env = Env::new(false);
    let store = Arc::new(MemoryStateStore::new());
    let m = started(&store, &env, fast_config()).await;
    let plan = |key: &str| Plan {
        exclusive: vec![key.into()],
        ..blocked_plan(false)
    };
    let mut a = m.submit(env.with_id("a", plan("ka"))).await.unwrap();
    let mut b = m.submit(env.with_id("b", plan("kb"))).await.unwrap();
    until_entered(&env, "a", 1).await;
    until_entered(&env, "b", 1).await;
    m.pause_all().await.unwrap();
    assert!(store.snapshot().contains_key(CONTROL_ALL_KEY));
    env.gate.add_permits(100);
    until_state(&m, "a", ProcedureState::Paused).await;
    until_state(&m, "b", ProcedureState::Paused).await;
    // A procedure paused with every procedure has no pause of its own to withdraw.
    let own = m.resume(&ProcedureId::new("a")).await.unwrap_err();
    assert_eq!(
        own.to_string(),
        "cannot resume procedure a: it has no pause request of its own (paused with every procedure? resume them all)"
    );
    m.resume_all().await.unwrap();
    within(a.wait()).await.unwrap();
    within(b.wait()).await.unwrap();
    for id in ["a", "b"] {
        assert!(
            stored(&store, id)
                .events
                .iter()
                .any(|e| e.kind == EventKind::Resumed)
        );
    }
}

/// The one-second bound for a request written by another process, with the DEFAULT poll interval: the default is
/// at most one second, and a cancel written straight into the store while the procedure waits (for a retry an hour
/// away, so no step boundary comes to read its key) is picked up by the very next poll.
///
/// This test runs on tokio's paused clock, on purpose: time moves only through the timers of the manager and the
/// test, so the time measured from the write to the state change is the manager's poll schedule, not the speed of
/// the machine, and the bound asserted is exact.
#[tokio::test(start_paused = true)]
async fn with_the_default_poll_interval_a_cancel_from_another_process_is_honoured_within_one_second()
 {
    let default = ManagerConfig::default();
    assert!(
        default.control_poll_interval <= Duration::from_secs(1),
        "{:?}",
        default.control_poll_interval
    );
    let env = Env::new(true);
    let store = Arc::new(MemoryStateStore::new());
    let config = ManagerConfig {
        step_retry: RetryPolicy {
            max_retries: 5,
            initial_delay: Duration::from_secs(3600),
            max_delay: Duration::from_secs(3600),
            factor: 2.0,
        },
        ..ManagerConfig::default()
    };
    assert_eq!(config.control_poll_interval, default.control_poll_interval);
    let m = started(&store, &env, config).await;
    let plan = Plan {
        retryable_failures: 1,
        rollback: true,
        ..Plan::steps(2, true)
    };
    let mut w = m.submit(env.with_id("p", plan)).await.unwrap();
    until_state(&m, "p", ProcedureState::Retrying).await;
    // Another process: the store only, no manager.
    let outside: &dyn StateStore = store.as_ref();
    let written = tokio::time::Instant::now();
    control::request(outside, &ProcedureId::new("p"), ControlOp::Cancel)
        .await
        .unwrap();
    let err = within(w.wait()).await.unwrap_err();
    let took = written.elapsed();
    assert!(
        err.to_string().ends_with("cancelled (rolled back)"),
        "{err}"
    );
    assert!(
        took <= default.control_poll_interval,
        "honoured {took:?} after the write; the poll runs every {:?}",
        default.control_poll_interval
    );
}
