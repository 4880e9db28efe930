//! Behaviour of `LocalManager` on the in-memory store: results, locks, children, retry, rollback,
//! timeout, admission, recovery, unrecoverable records, fencing, retention.
//!
//! Tests marked `start_paused = true` run on tokio's paused clock, and depend on it: time advances only when every
//! task is idle, jumping to the next timer. Backoffs, timeouts, lock hold times (`hold_ms`) and retention periods
//! therefore elapse at once and in a fixed order, so orderings such as "a finished before b started" are
//! deterministic rather than a race with the machine's load. Without the paused clock these tests would be slow and
//! their orderings could flake.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::runtime::Handle;

use crate::support::manager::{Env, Plan, TYPE, fast_config, within};
use procedures::record::{EPOCH_KEY, record_key};
use procedures::{
    Error, LocalManager, ManagerConfig, MemoryStateStore, ProcedureId, ProcedureManager,
    ProcedureRecord, ProcedureState, SideEffectHook, StateStore,
};

async fn manager(
    store: &Arc<MemoryStateStore>,
    config: ManagerConfig,
    env: &Arc<Env>,
) -> LocalManager {
    let manager = LocalManager::new(store.clone(), config);
    manager.register_loader(TYPE, env.loader()).unwrap();
    manager.start().await.unwrap();
    manager
}

fn stored(store: &MemoryStateStore, id: &str) -> ProcedureRecord {
    let bytes = store.snapshot()[&record_key(&ProcedureId::new(id))].clone();
    serde_json::from_slice(&bytes).unwrap()
}

/// Runs this test's tasks until none of them can go on: on the paused clock of a single-threaded runtime, time
/// moves (here by `span`, firing every timer due within it) only when no task is ready to run, so this returns once
/// every task has run as far as it can. What a test asserts after it is what happens when everything that would
/// run has run, not a guess at how long that takes. (A `spawn_blocking` task would escape this; none is used.)
async fn run_until_idle(span: Duration) {
    assert!(
        Handle::current().runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread,
        "run_until_idle needs the single-threaded runtime"
    );
    tokio::time::sleep(span).await;
}

/// Waits (yielding to the runtime) until procedure `id` has persisted at least `step` steps.
async fn until_step(manager: &LocalManager, id: &str, step: u64) {
    within(async {
        loop {
            let info = manager
                .procedure_state(&ProcedureId::new(id))
                .await
                .unwrap();
            if info.is_some_and(|i| i.step >= step) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
}

#[tokio::test]
async fn output_comes_back_through_the_watcher() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let m = manager(&store, fast_config(), &env).await;
    assert_eq!(m.epoch(), Some(1));
    let mut watcher = m
        .submit(env.with_id("p", Plan::steps(3, true)))
        .await
        .unwrap();
    let output = within(watcher.wait()).await.unwrap();
    assert_eq!(output, Some(serde_json::json!({ "steps": 3 })));
    let record = stored(&store, "p");
    assert_eq!(record.state, ProcedureState::Done);
    // Submission, three persisted steps, done.
    assert_eq!(record.step, 4);
    let listed = m.list_procedures().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].state, ProcedureState::Done);
}

/// Counts the wake-ups of the task it is the waker of.
struct Wakes(std::sync::atomic::AtomicUsize);

impl futures::task::ArcWake for Wakes {
    fn wake_by_ref(arc_self: &Arc<Self>) {
        arc_self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A watcher waits for the end: the steps before it publish what they do (a reader sees it at once) but do not wake
/// the waiting task, which would be a thread wake-up per step for nothing; the end wakes it.
#[tokio::test]
async fn a_watcher_is_woken_when_its_procedure_finishes_not_at_every_step() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(false);
    let m = manager(&store, fast_config(), &env).await;
    let plan = Plan {
        block_at: Some(2),
        ..Plan::steps(3, true)
    };
    let watcher = m.submit(env.with_id("p", plan)).await.unwrap();
    let wakes = Arc::new(Wakes(std::sync::atomic::AtomicUsize::new(0)));
    let waker = futures::task::waker(Arc::clone(&wakes));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut reader = watcher.clone();
    let mut wait = Box::pin(async move { reader.wait().await });
    assert!(wait.as_mut().poll(&mut cx).is_pending());
    // Two persisted steps and a third started (blocked at the gate): five publications.
    until_step(&m, "p", 2).await;
    within(async {
        while env.running.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    let shown = watcher.info();
    assert_eq!((shown.state, shown.step), (ProcedureState::Running, 2));
    assert_eq!(shown.attempt, 1, "the watcher reads the third step's start");
    assert_eq!(wakes.0.load(Ordering::SeqCst), 0, "woken before the end");
    env.gate.add_permits(1);
    within(async {
        while wakes.0.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    match wait.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(output) => {
            assert_eq!(output.unwrap(), Some(serde_json::json!({ "steps": 3 })))
        }
        std::task::Poll::Pending => panic!("woken, but the procedure is not done"),
    }
    // The history went to the finished state whole (moved out of the live state the watcher also holds): the
    // watcher, the manager and the last record show the same one, from `submitted` to `done`.
    let done = watcher.info();
    assert_eq!(done.state, ProcedureState::Done);
    assert!(
        matches!(
            done.events.first().map(|e| &e.kind),
            Some(procedures::EventKind::Submitted)
        ) && matches!(
            done.events.last().map(|e| &e.kind),
            Some(procedures::EventKind::Done)
        ),
        "{:?}",
        done.events
    );
    let id = ProcedureId::new("p");
    let shown = m.procedure_state(&id).await.unwrap().unwrap();
    assert_eq!(shown.events, done.events);
    let record: procedures::ProcedureRecord =
        serde_json::from_slice(&store.snapshot()[&record_key(&id)]).unwrap();
    assert_eq!(record.events, done.events);
}

#[tokio::test(start_paused = true)]
async fn conflicting_exclusive_procedures_run_one_after_the_other() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let m = manager(&store, fast_config(), &env).await;
    let plan = Plan {
        exclusive: vec!["table/1".into()],
        hold_ms: 10,
        ..Plan::steps(2, true)
    };
    let mut a = m.submit(env.with_id("a", plan.clone())).await.unwrap();
    let mut b = m.submit(env.with_id("b", plan)).await.unwrap();
    within(a.wait()).await.unwrap();
    within(b.wait()).await.unwrap();
    let (a_in, a_out) = env.span("a");
    let (b_in, b_out) = env.span("b");
    assert!(a_out < b_in || b_out < a_in, "overlap: {:?}", env.events());
    assert_eq!(env.max_running.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn shared_procedures_overlap() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let m = manager(&store, fast_config(), &env).await;
    let plan = Plan {
        shared: vec!["table/1".into()],
        hold_ms: 10,
        ..Plan::steps(2, true)
    };
    let mut a = m.submit(env.with_id("a", plan.clone())).await.unwrap();
    let mut b = m.submit(env.with_id("b", plan)).await.unwrap();
    within(a.wait()).await.unwrap();
    within(b.wait()).await.unwrap();
    assert_eq!(env.max_running.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn children_run_and_the_parent_resumes_even_with_one_slot_and_its_own_key() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let config = ManagerConfig {
        max_running_procedures: 1,
        ..fast_config()
    };
    let m = manager(&store, config, &env).await;
    let child = Plan {
        exclusive: vec!["k".into()],
        ..Plan::steps(1, true)
    };
    let parent = Plan {
        exclusive: vec!["k".into()],
        children: vec![("c1".into(), child.clone()), ("c2".into(), child)],
        ..Plan::steps(1, true)
    };
    let mut w = m.submit(env.with_id("p", parent)).await.unwrap();
    assert_eq!(
        within(w.wait()).await.unwrap(),
        Some(serde_json::json!({ "steps": 1 }))
    );
    for child in ["p/c1", "p/c2"] {
        let record = stored(&store, child);
        assert_eq!(record.state, ProcedureState::Done);
        assert_eq!(record.parent_id, Some(ProcedureId::new("p")));
    }
    // The parent ran again after both children were done.
    let events = env.events();
    let last_parent = events
        .iter()
        .rposition(|e| e.starts_with("enter p at"))
        .unwrap();
    let last_child = events
        .iter()
        .rposition(|e| e.starts_with("exit p/c"))
        .unwrap();
    assert!(last_parent > last_child, "{events:?}");
}

#[tokio::test(start_paused = true)]
async fn a_failed_child_fails_its_parent() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let m = manager(&store, fast_config(), &env).await;
    let parent = Plan {
        children: vec![(
            "bad".into(),
            Plan {
                fail: true,
                ..Plan::steps(0, true)
            },
        )],
        ..Plan::steps(1, true)
    };
    let mut w = m.submit(env.with_id("p", parent)).await.unwrap();
    let err = within(w.wait()).await.unwrap_err().to_string();
    assert!(err.contains("subprocedure p/bad of p failed"), "{err}");
    assert_eq!(stored(&store, "p").state, ProcedureState::Failed);
}

#[tokio::test(start_paused = true)]
async fn a_retryable_error_is_retried_then_succeeds() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let m = manager(&store, fast_config(), &env).await;
    let plan = Plan {
        retryable_failures: 2,
        ..Plan::steps(1, true)
    };
    let mut w = m.submit(env.with_id("r", plan)).await.unwrap();
    assert!(within(w.wait()).await.is_ok());
    assert_eq!(env.attempts.load(Ordering::SeqCst), 2);
    assert_eq!(stored(&store, "r").state, ProcedureState::Done);
}

#[tokio::test(start_paused = true)]
async fn exhausted_retries_roll_back_then_fail() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let m = manager(&store, fast_config(), &env).await;
    let plan = Plan {
        retryable_failures: 100,
        rollback: true,
        ..Plan::steps(1, true)
    };
    let mut w = m.submit(env.with_id("r", plan)).await.unwrap();
    let err = within(w.wait()).await.unwrap_err().to_string();
    assert!(
        err.contains("flaky step") && err.contains("rolled back"),
        "{err}"
    );
    // The first attempt and max_retries = 3 retries.
    assert_eq!(env.attempts.load(Ordering::SeqCst), 4);
    assert_eq!(env.rollbacks.load(Ordering::SeqCst), 1);
    let record = stored(&store, "r");
    assert_eq!(record.state, ProcedureState::Failed);
    assert!(record.error.unwrap().contains("rolled back"));
}

#[tokio::test(start_paused = true)]
async fn a_procedure_past_its_timeout_fails() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let m = manager(&store, fast_config(), &env).await;
    let plan = Plan {
        timeout_ms: Some(50),
        hold_ms: 20,
        ..Plan::steps(10, true)
    };
    let mut w = m.submit(env.with_id("t", plan)).await.unwrap();
    let err = within(w.wait()).await.unwrap_err().to_string();
    assert!(err.contains("procedure t timed out after 50ms"), "{err}");
    let record = stored(&store, "t");
    assert_eq!(record.state, ProcedureState::Failed);
    // It got through some steps, not all ten.
    assert!(record.step < 10, "{record:?}");
}

#[tokio::test(start_paused = true)]
async fn admission_limits_how_many_execute_at_once() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let config = ManagerConfig {
        max_running_procedures: 2,
        ..fast_config()
    };
    let m = manager(&store, config, &env).await;
    let mut watchers = Vec::new();
    for i in 0..6 {
        let plan = Plan {
            hold_ms: 10,
            ..Plan::steps(2, true)
        };
        watchers.push(m.submit(env.with_id(&format!("a{i}"), plan)).await.unwrap());
    }
    for w in &mut watchers {
        within(w.wait()).await.unwrap();
    }
    assert_eq!(env.max_running.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_new_manager_resumes_from_the_persisted_step() {
    let store = Arc::new(MemoryStateStore::new());
    let blocked = Env::new(false);
    let m1 = manager(&store, fast_config(), &blocked).await;
    let plan = Plan {
        block_at: Some(1),
        ..Plan::steps(3, true)
    };
    let mut w1 = m1.submit(blocked.with_id("p", plan)).await.unwrap();
    until_step(&m1, "p", 1).await;
    m1.stop().await.unwrap();
    assert!(matches!(
        within(w1.wait()).await,
        Err(Error::ManagerNotRunning { .. })
    ));
    assert_eq!(stored(&store, "p").step, 1);
    assert_eq!(stored(&store, "p").state, ProcedureState::Running);

    let env = Env::new(true);
    let m2 = manager(&store, fast_config(), &env).await;
    assert_eq!(m2.epoch(), Some(2));
    let mut w2 = m2.watch(&ProcedureId::new("p")).await.unwrap().unwrap();
    assert_eq!(
        within(w2.wait()).await.unwrap(),
        Some(serde_json::json!({ "steps": 3 }))
    );
    let events = env.events();
    assert_eq!(events.first().map(String::as_str), Some("enter p at 1"));
    assert!(!events.iter().any(|e| e == "enter p at 0"), "{events:?}");
}

#[tokio::test(start_paused = true)]
async fn a_new_manager_resumes_a_rollback() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    // A record left rolling back by a crashed manager.
    let record = ProcedureRecord {
        format_version: 1,
        type_name: TYPE.into(),
        id: ProcedureId::new("rb"),
        parent_id: None,
        step: 3,
        state: ProcedureState::RollingBack,
        data: serde_json::to_value(Plan {
            rollback: true,
            ..Plan::steps(1, true)
        })
        .unwrap(),
        output: None,
        error: Some("it broke".into()),
        waiting_for: Vec::new(),
        created_at_ms: 1,
        updated_at_ms: 1,
        step_name: None,
        lock_keys: Vec::new(),
        events: Vec::new(),
    };
    store
        .put("proc/rb", serde_json::to_vec(&record).unwrap())
        .await
        .unwrap();
    let m = manager(&store, fast_config(), &env).await;
    let err = within(
        m.watch(&ProcedureId::new("rb"))
            .await
            .unwrap()
            .unwrap()
            .wait(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("it broke (rolled back)"), "{err}");
    assert_eq!(env.rollbacks.load(Ordering::SeqCst), 1);
    // Rolled back without running a step.
    assert!(env.events().is_empty());
    assert_eq!(stored(&store, "rb").step, 4);
}

#[tokio::test(start_paused = true)]
async fn unrecoverable_records_show_as_failed_and_stay_untouched() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let good = ProcedureRecord {
        format_version: 1,
        type_name: TYPE.into(),
        id: ProcedureId::new("ok"),
        parent_id: None,
        step: 1,
        state: ProcedureState::Running,
        data: serde_json::to_value(Plan::steps(2, true)).unwrap(),
        output: None,
        error: None,
        waiting_for: Vec::new(),
        created_at_ms: 1,
        updated_at_ms: 1,
        step_name: None,
        lock_keys: Vec::new(),
        events: Vec::new(),
    };
    let unknown = ProcedureRecord {
        id: ProcedureId::new("unknown"),
        type_name: "no_such_type".into(),
        ..good.clone()
    };
    let bad_data = ProcedureRecord {
        id: ProcedureId::new("bad_data"),
        data: serde_json::json!({ "steps": "many" }),
        ..good.clone()
    };
    let newer = ProcedureRecord {
        id: ProcedureId::new("newer"),
        format_version: 99,
        ..good.clone()
    };
    for record in [&good, &unknown, &bad_data, &newer] {
        store
            .put(&record_key(&record.id), serde_json::to_vec(record).unwrap())
            .await
            .unwrap();
    }
    store
        .put("proc/garbled", b"{not json".to_vec())
        .await
        .unwrap();
    let before = store.snapshot();

    let m = manager(&store, fast_config(), &env).await;
    within(
        m.watch(&ProcedureId::new("ok"))
            .await
            .unwrap()
            .unwrap()
            .wait(),
    )
    .await
    .unwrap();

    let listed = m.list_procedures().await.unwrap();
    let ids: Vec<&str> = listed.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["bad_data", "garbled", "newer", "ok", "unknown"]);
    let expect = [
        ("unknown", "type 'no_such_type', key 'proc/unknown'"),
        ("bad_data", "type 'test_steps', key 'proc/bad_data'"),
        ("garbled", "type 'unknown', key 'proc/garbled'"),
        ("newer", "format version 99"),
    ];
    for (id, text) in expect {
        let info = m
            .procedure_state(&ProcedureId::new(id))
            .await
            .unwrap()
            .unwrap();
        // No loader: a manager with one resumes it, so it is stalled; a record no manager can read is failed.
        let expected = if id == "unknown" {
            ProcedureState::Stalled
        } else {
            ProcedureState::Failed
        };
        assert_eq!(info.state, expected, "{id}");
        let error = info.error.unwrap();
        assert!(error.contains(&format!("procedure {id} ")), "{error}");
        assert!(error.contains(text), "{error}");
        // Watchers resolve at once.
        assert!(
            within(m.watch(&info.id).await.unwrap().unwrap().wait())
                .await
                .is_err()
        );
    }
    assert_eq!((m.stalled_count(), m.failed_count()), (1, 3));
    // Only the good record changed.
    let after = store.snapshot();
    for key in [
        "proc/unknown",
        "proc/bad_data",
        "proc/newer",
        "proc/garbled",
    ] {
        assert_eq!(before[key], after[key], "{key}");
    }
    assert_eq!(stored(&store, "ok").state, ProcedureState::Done);
    m.stop().await.unwrap();

    // A later manager that knows the type recovers the record.
    let m2 = LocalManager::new(store.clone(), fast_config());
    m2.register_loader(TYPE, env.loader()).unwrap();
    m2.register_loader("no_such_type", env.loader()).unwrap();
    m2.start().await.unwrap();
    within(
        m2.watch(&ProcedureId::new("unknown"))
            .await
            .unwrap()
            .unwrap()
            .wait(),
    )
    .await
    .unwrap();
    assert_eq!(stored(&store, "unknown").state, ProcedureState::Done);
}

#[tokio::test(start_paused = true)]
async fn a_second_manager_fences_the_first() {
    let store = Arc::new(MemoryStateStore::new());
    let env1 = Env::new(false);
    let m1 = manager(&store, fast_config(), &env1).await;
    let plan = Plan {
        block_at: Some(1),
        ..Plan::steps(3, true)
    };
    let mut w1 = m1.submit(env1.with_id("p", plan)).await.unwrap();
    until_step(&m1, "p", 1).await;

    // The second manager does not know the type: it leaves the record alone.
    let m2 = LocalManager::new(store.clone(), fast_config());
    m2.start().await.unwrap();
    assert_eq!(m2.epoch(), Some(2));
    assert_eq!(store.snapshot()[EPOCH_KEY], b"2".to_vec());

    // The first manager's next write is refused: it halts.
    env1.gate.add_permits(1);
    let err = within(w1.wait()).await.unwrap_err();
    assert!(matches!(err, Error::ManagerNotRunning { .. }), "{err}");
    assert_eq!(stored(&store, "p").step, 1);
    let refused = m1.submit(env1.with_id("q", Plan::steps(1, true))).await;
    let text = refused.unwrap_err().to_string();
    assert!(text.contains("fenced by epoch 2"), "{text}");
    assert!(!store.snapshot().contains_key("proc/q"));
}

#[tokio::test(start_paused = true)]
async fn finished_procedures_are_deleted_after_retention() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let config = ManagerConfig {
        retention: Duration::ZERO,
        retention_check_interval: Duration::from_millis(10),
        ..fast_config()
    };
    let m = manager(&store, config, &env).await;
    let parent = Plan {
        children: vec![("c".into(), Plan::steps(1, true))],
        ..Plan::steps(1, true)
    };
    let mut w = m.submit(env.with_id("p", parent)).await.unwrap();
    within(w.wait()).await.unwrap();
    within(async {
        while !m.list_procedures().await.unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let keys: Vec<String> = store.snapshot().into_keys().collect();
    assert_eq!(keys, [EPOCH_KEY]);
}

#[tokio::test(start_paused = true)]
async fn a_replayed_parent_waits_for_its_recovered_child() {
    let store = Arc::new(MemoryStateStore::new());
    let blocked = Env::new(false);
    let m1 = manager(&store, fast_config(), &blocked).await;
    let child = Plan {
        block_at: Some(1),
        ..Plan::steps(2, true)
    };
    // The parent does not persist its suspension: replayed, it asks for the same child again.
    let parent = Plan {
        children: vec![("c".into(), child)],
        ..Plan::steps(1, false)
    };
    m1.submit(blocked.with_id("p", parent)).await.unwrap();
    until_step(&m1, "p/c", 1).await;
    m1.stop().await.unwrap();
    assert_eq!(stored(&store, "p").step, 0);

    let env = Env::new(true);
    let m2 = manager(&store, fast_config(), &env).await;
    let output = within(
        m2.watch(&ProcedureId::new("p"))
            .await
            .unwrap()
            .unwrap()
            .wait(),
    )
    .await
    .unwrap();
    assert_eq!(output, Some(serde_json::json!({ "steps": 1 })));
    let events = env.events();
    assert!(events.iter().any(|e| e == "enter p/c at 1"), "{events:?}");
    assert!(!events.iter().any(|e| e == "enter p/c at 0"), "{events:?}");
    let child = stored(&store, "p/c");
    assert_eq!((child.state, child.step), (ProcedureState::Done, 3));
}

/// Crashes at the side-effect point with this label.
struct CrashAt(&'static str);

impl SideEffectHook for CrashAt {
    fn on_side_effect(&self, _id: &ProcedureId, label: &str) -> procedures::Result<()> {
        if label == self.0 {
            return Err(procedures::testing::injected_crash(label));
        }
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_crash_at_a_side_effect_point_halts_without_writing() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let m = LocalManager::with_side_effect_hook(
        store.clone(),
        fast_config(),
        Arc::new(CrashAt("step 1")),
    );
    m.register_loader(TYPE, env.loader()).unwrap();
    m.start().await.unwrap();
    let other = Plan {
        block_at: Some(0),
        ..Plan::steps(0, true)
    };
    let blocked = Env::new(false);
    let mut w_other = m.submit(blocked.with_id("other", other)).await.unwrap();
    let mut w = m
        .submit(env.with_id("p", Plan::steps(3, true)))
        .await
        .unwrap();
    let err = within(w.wait()).await.unwrap_err();
    assert!(matches!(err, Error::ManagerNotRunning { .. }), "{err}");
    // Every watcher of an unfinished procedure resolves, not only the crashed one's.
    assert!(matches!(
        within(w_other.wait()).await,
        Err(Error::ManagerNotRunning { .. })
    ));
    let after_crash = store.snapshot();
    assert_eq!(stored(&store, "p").step, 1);
    let info = m
        .procedure_state(&ProcedureId::new("p"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((info.step, info.state), (1, ProcedureState::Running));
    let refused = m.submit(env.with_id("q", Plan::steps(1, true))).await;
    let text = refused.unwrap_err().to_string();
    assert!(text.contains("injected crash at step 1"), "{text}");
    // The blocked procedure, released, writes nothing either: its task has ended. Once every task has run as far
    // as it can, the permit is still there (a live task would have taken it) and the store is unchanged.
    blocked.gate.add_permits(1);
    run_until_idle(Duration::from_millis(50)).await;
    assert_eq!(
        blocked.gate.available_permits(),
        1,
        "a task took the permit"
    );
    assert_eq!(store.snapshot(), after_crash);

    // A fresh manager on the same store finishes the work.
    let m2 = manager(&store, fast_config(), &env).await;
    let output = within(
        m2.watch(&ProcedureId::new("p"))
            .await
            .unwrap()
            .unwrap()
            .wait(),
    )
    .await
    .unwrap();
    assert_eq!(output, Some(serde_json::json!({ "steps": 3 })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_trees_on_many_threads_finish_and_never_share_an_exclusive_key() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let config = ManagerConfig {
        max_running_procedures: 3,
        ..fast_config()
    };
    let m = manager(&store, config, &env).await;
    let mut watchers = Vec::new();
    for i in 0..24usize {
        let key = format!("k{}", i % 3);
        let child = Plan {
            exclusive: vec![key.clone()],
            shared: vec!["all".into()],
            ..Plan::steps(2, i % 2 == 0)
        };
        let plan = Plan {
            exclusive: vec![key],
            shared: vec!["all".into()],
            children: if i.is_multiple_of(4) {
                vec![("a".into(), child.clone()), ("b".into(), child)]
            } else {
                Vec::new()
            },
            ..Plan::steps(3, i % 2 == 1)
        };
        watchers.push(m.submit(env.with_id(&format!("t{i}"), plan)).await.unwrap());
    }
    for w in &mut watchers {
        within(w.wait()).await.unwrap();
    }
    // Trees sharing an exclusive key ran one after the other (a tree's span covers its children's).
    let span = |i: usize| {
        let (mut enter, mut exit) = env.span(&format!("t{i}"));
        if i.is_multiple_of(4) {
            for c in ["a", "b"] {
                let (e, x) = env.span(&format!("t{i}/{c}"));
                enter = enter.min(e);
                exit = exit.max(x);
            }
        }
        (enter, exit)
    };
    for i in 0..24 {
        for j in (i + 1)..24 {
            if i % 3 == j % 3 {
                let ((a_in, a_out), (b_in, b_out)) = (span(i), span(j));
                assert!(a_out < b_in || b_out < a_in, "t{i} and t{j} overlap");
            }
        }
    }
    assert!(env.max_running.load(Ordering::SeqCst) <= 3);
}

#[tokio::test(start_paused = true)]
async fn a_recovered_parent_waits_for_the_children_its_persisted_suspension_names() {
    let store = Arc::new(MemoryStateStore::new());
    let blocked = Env::new(false);
    let m1 = manager(&store, fast_config(), &blocked).await;
    let child = Plan {
        block_at: Some(1),
        ..Plan::steps(2, true)
    };
    // The parent persists its suspension: its record moves on together with the child's first record.
    let parent = Plan {
        children: vec![("c".into(), child)],
        ..Plan::steps(1, true)
    };
    m1.submit(blocked.with_id("p", parent)).await.unwrap();
    until_step(&m1, "p/c", 1).await;
    m1.stop().await.unwrap();
    let suspended = stored(&store, "p");
    assert_eq!(suspended.step, 1);
    assert_eq!(suspended.waiting_for, [ProcedureId::new("p/c")]);
    assert_eq!(suspended.format_version, 2);
    assert_eq!(suspended.data["children_started"], true);

    let env = Env::new(true);
    let m2 = manager(&store, fast_config(), &env).await;
    let output = within(
        m2.watch(&ProcedureId::new("p"))
            .await
            .unwrap()
            .unwrap()
            .wait(),
    )
    .await
    .unwrap();
    assert_eq!(output, Some(serde_json::json!({ "steps": 1 })));
    // The child finished before the parent ran its next step, which it ran once, without suspending again.
    let events = env.events();
    let (_, child_exit) = env.span("p/c");
    let (parent_enter, _) = env.span("p");
    assert!(child_exit < parent_enter, "{events:?}");
    assert_eq!(
        events
            .iter()
            .filter(|e| e.starts_with("enter p at"))
            .count(),
        2,
        "{events:?}"
    );
    let done = stored(&store, "p");
    assert_eq!(done.state, ProcedureState::Done);
    assert!(done.waiting_for.is_empty());
    assert_eq!(done.format_version, 1);
}

#[tokio::test(start_paused = true)]
async fn a_recovered_parent_fails_when_a_child_its_suspension_names_failed() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let parent = ProcedureRecord {
        format_version: 2,
        type_name: TYPE.into(),
        id: ProcedureId::new("p"),
        parent_id: None,
        step: 1,
        state: ProcedureState::Running,
        data: serde_json::to_value(Plan {
            children: vec![("c".into(), Plan::steps(1, true))],
            children_started: true,
            ..Plan::steps(1, true)
        })
        .unwrap(),
        output: None,
        error: None,
        waiting_for: vec![ProcedureId::new("p/c")],
        created_at_ms: 1,
        updated_at_ms: 1,
        step_name: None,
        lock_keys: Vec::new(),
        events: Vec::new(),
    };
    let child = ProcedureRecord {
        format_version: 1,
        id: ProcedureId::new("p/c"),
        parent_id: Some(ProcedureId::new("p")),
        step: 2,
        state: ProcedureState::Failed,
        data: serde_json::to_value(Plan::steps(1, true)).unwrap(),
        error: Some("it broke".into()),
        waiting_for: Vec::new(),
        ..parent.clone()
    };
    for record in [&parent, &child] {
        store
            .put(&record_key(&record.id), serde_json::to_vec(record).unwrap())
            .await
            .unwrap();
    }
    let m = manager(&store, fast_config(), &env).await;
    let err = within(
        m.watch(&ProcedureId::new("p"))
            .await
            .unwrap()
            .unwrap()
            .wait(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("subprocedure p/c of p failed: it broke"),
        "{err}"
    );
    // The parent failed without running a step.
    assert!(env.events().is_empty(), "{:?}", env.events());
    let failed = stored(&store, "p");
    assert_eq!((failed.state, failed.step), (ProcedureState::Failed, 2));
    assert!(failed.waiting_for.is_empty());
}

#[test]
fn records_without_waiting_for_read_and_write_as_format_1() {
    let old = serde_json::json!({
        "format_version": 1,
        "type_name": TYPE,
        "id": "p",
        "parent_id": null,
        "step": 1,
        "state": "running",
        "data": { "steps": 2 },
        "output": null,
        "error": null,
        "created_at_ms": 1,
        "updated_at_ms": 2
    });
    let record: ProcedureRecord = serde_json::from_value(old.clone()).unwrap();
    assert!(record.waiting_for.is_empty());
    assert_eq!(record.required_format_version(), 1);
    // Written back, it is the same JSON: no `waiting_for` key for an older manager to stumble on.
    assert_eq!(serde_json::to_value(&record).unwrap(), old);
}

#[tokio::test(start_paused = true)]
async fn a_persisted_suspension_awaits_a_child_already_in_the_store_instead_of_writing_it() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let m = manager(&store, fast_config(), &env).await;
    // Written behind the manager's back after its start: the suspension's write finds the key taken.
    let child = ProcedureRecord {
        format_version: 1,
        type_name: TYPE.into(),
        id: ProcedureId::new("p/c"),
        parent_id: Some(ProcedureId::new("p")),
        step: 2,
        state: ProcedureState::Done,
        data: serde_json::to_value(Plan::steps(1, true)).unwrap(),
        output: Some(serde_json::json!("earlier")),
        error: None,
        waiting_for: Vec::new(),
        created_at_ms: 1,
        updated_at_ms: 1,
        step_name: None,
        lock_keys: Vec::new(),
        events: Vec::new(),
    };
    store
        .put("proc/p/c", serde_json::to_vec(&child).unwrap())
        .await
        .unwrap();
    let parent = Plan {
        children: vec![("c".into(), Plan::steps(1, true))],
        ..Plan::steps(1, true)
    };
    let mut w = m.submit(env.with_id("p", parent)).await.unwrap();
    assert_eq!(
        within(w.wait()).await.unwrap(),
        Some(serde_json::json!({ "steps": 1 }))
    );
    assert_eq!(stored(&store, "p/c"), child);
    let events = env.events();
    assert!(!events.iter().any(|e| e.contains("p/c")), "{events:?}");
    let info = m
        .procedure_state(&ProcedureId::new("p/c"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.output, Some(serde_json::json!("earlier")));
}

/// A child record found in the store during a suspension (not loaded at start), as a loader would see it.
fn unloaded_child(state: ProcedureState, plan: Plan) -> ProcedureRecord {
    ProcedureRecord {
        format_version: 1,
        type_name: TYPE.into(),
        id: ProcedureId::new("p/c"),
        parent_id: Some(ProcedureId::new("p")),
        step: if state == ProcedureState::Running {
            0
        } else {
            2
        },
        state,
        data: serde_json::to_value(plan).unwrap(),
        output: (state == ProcedureState::Done).then(|| serde_json::json!("earlier")),
        error: None,
        waiting_for: Vec::new(),
        created_at_ms: 1,
        updated_at_ms: 1,
        step_name: None,
        lock_keys: Vec::new(),
        events: Vec::new(),
    }
}

#[tokio::test(start_paused = true)]
async fn an_adopted_unfinished_child_takes_the_key_its_parent_holds() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let m = manager(&store, fast_config(), &env).await;
    let child = Plan {
        exclusive: vec!["k".into()],
        ..Plan::steps(1, true)
    };
    // Written behind the manager's back: the suspension's write finds it and the manager adopts it. It belongs to
    // the parent's tree, so the parent's exclusive key must not block it (else each waits for the other).
    let record = unloaded_child(ProcedureState::Running, child.clone());
    store
        .put("proc/p/c", serde_json::to_vec(&record).unwrap())
        .await
        .unwrap();
    let parent = Plan {
        exclusive: vec!["k".into()],
        children: vec![("c".into(), child)],
        ..Plan::steps(1, true)
    };
    let mut w = m.submit(env.with_id("p", parent)).await.unwrap();
    assert_eq!(
        within(w.wait()).await.unwrap(),
        Some(serde_json::json!({ "steps": 1 }))
    );
    assert_eq!(stored(&store, "p/c").state, ProcedureState::Done);
}

#[tokio::test(start_paused = true)]
async fn an_adopted_finished_child_is_not_deleted_while_its_parent_runs() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(false);
    let config = ManagerConfig {
        retention: Duration::ZERO,
        retention_check_interval: Duration::from_millis(10),
        ..fast_config()
    };
    let m = manager(&store, config, &env).await;
    let record = unloaded_child(ProcedureState::Done, Plan::steps(1, true));
    store
        .put("proc/p/c", serde_json::to_vec(&record).unwrap())
        .await
        .unwrap();
    // The parent adopts its finished child, takes one step, then blocks while running.
    let parent = Plan {
        children: vec![("c".into(), Plan::steps(1, true))],
        block_at: Some(1),
        ..Plan::steps(2, true)
    };
    let _w = m.submit(env.with_id("p", parent)).await.unwrap();
    until_step(&m, "p", 2).await;
    // Many retention checks while the parent runs: its tree (the child included) must stay. This runs ten check
    // intervals, each one to completion.
    run_until_idle(Duration::from_millis(100)).await;
    assert_eq!(stored(&store, "p").state, ProcedureState::Running);
    assert_eq!(stored(&store, "p/c"), record);
    assert!(
        m.procedure_state(&ProcedureId::new("p/c"))
            .await
            .unwrap()
            .is_some()
    );
}

/// A procedure whose step panics (a bug in the procedure, not in the engine).
struct Panics;

#[async_trait::async_trait]
impl procedures::Procedure for Panics {
    fn type_name(&self) -> &str {
        "panics"
    }

    async fn execute(
        &mut self,
        _ctx: &procedures::Context,
    ) -> procedures::Result<procedures::Status> {
        panic!("step bug")
    }

    fn dump(&self) -> procedures::Result<serde_json::Value> {
        Ok(serde_json::Value::Null)
    }

    fn lock_key(&self) -> procedures::LockKey {
        procedures::LockKey::exclusive("k")
    }
}

#[tokio::test(start_paused = true)]
async fn a_panicking_step_stops_its_procedure_and_resolves_its_watcher() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let m = manager(&store, fast_config(), &env).await;
    let mut w = m
        .submit(procedures::ProcedureWithId::new(
            ProcedureId::new("bad"),
            Box::new(Panics),
        ))
        .await
        .unwrap();
    let err = within(w.wait()).await.unwrap_err();
    assert!(matches!(err, Error::ProcedureStalled { .. }), "{err}");
    let info = m
        .procedure_state(&ProcedureId::new("bad"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.state, ProcedureState::Stalled);
    assert_eq!(m.stalled_count(), 1);
    let error = info.error.unwrap_or_default();
    assert!(
        error.contains("panicked") && error.contains("step bug"),
        "{error}"
    );
    // Nothing written beyond the submission: a later manager resumes it.
    assert_eq!(stored(&store, "bad").step, 0);
    // Its key is free again and the manager goes on.
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
    within(other.wait()).await.unwrap();
}

/// A store that yields to the runtime before every call, as a networked store would.
struct Yielding(MemoryStateStore);

#[async_trait::async_trait]
impl StateStore for Yielding {
    async fn get(&self, key: &str) -> procedures::Result<Option<Vec<u8>>> {
        tokio::task::yield_now().await;
        self.0.get(key).await
    }
    async fn scan(&self, prefix: &str) -> procedures::Result<Vec<(String, Vec<u8>)>> {
        tokio::task::yield_now().await;
        self.0.scan(prefix).await
    }
    async fn put(&self, key: &str, value: Vec<u8>) -> procedures::Result<()> {
        tokio::task::yield_now().await;
        self.0.put(key, value).await
    }
    async fn delete(&self, keys: &[String]) -> procedures::Result<()> {
        tokio::task::yield_now().await;
        self.0.delete(keys).await
    }
    async fn write(
        &self,
        conditions: Vec<procedures::Condition>,
        ops: Vec<procedures::WriteOp>,
    ) -> procedures::Result<procedures::WriteOutcome> {
        tokio::task::yield_now().await;
        self.0.write(conditions, ops).await
    }
}

#[tokio::test(start_paused = true)]
async fn two_concurrent_starts_of_one_manager_do_not_fence_it() {
    let store = Arc::new(Yielding(MemoryStateStore::new()));
    let env = Env::new(true);
    let m = LocalManager::new(store.clone(), fast_config());
    m.register_loader(TYPE, env.loader()).unwrap();
    let (a, b) = tokio::join!(m.start(), m.start());
    assert!(a.is_ok() != b.is_ok(), "{a:?} {b:?}");
    // The manager that started holds the store's current epoch: it can work.
    let epoch = store.0.snapshot()[EPOCH_KEY].clone();
    assert_eq!(m.epoch().map(|e| e.to_string().into_bytes()), Some(epoch));
    let mut w = m
        .submit(env.with_id("p", Plan::steps(1, true)))
        .await
        .unwrap();
    within(w.wait()).await.unwrap();
}

/// A store that applies the first write of `proc/p` but answers it with a retryable error, as a backend does when
/// the connection drops after the commit (the caller cannot tell that the write landed).
struct LostAck {
    inner: MemoryStateStore,
    lost: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl procedures::testing::StateStoreWrapper for LostAck {
    fn inner(&self) -> &dyn StateStore {
        &self.inner
    }

    async fn write(
        &self,
        conditions: Vec<procedures::Condition>,
        ops: Vec<procedures::WriteOp>,
    ) -> procedures::Result<procedures::WriteOutcome> {
        let first =
            ops.iter().any(|op| op.key() == "proc/p") && !self.lost.swap(true, Ordering::SeqCst);
        let outcome = self.inner.write(conditions, ops).await?;
        if first {
            return Err(Error::Store {
                action: "write",
                key: "proc/p".into(),
                source: "connection reset after commit".into(),
                retryable: true,
            });
        }
        Ok(outcome)
    }
}

#[tokio::test(start_paused = true)]
async fn a_submission_whose_write_landed_but_whose_answer_was_lost_runs() {
    let store = Arc::new(LostAck {
        inner: MemoryStateStore::new(),
        lost: std::sync::atomic::AtomicBool::new(false),
    });
    let env = Env::new(true);
    let m = LocalManager::new(store.clone(), fast_config());
    m.register_loader(TYPE, env.loader()).unwrap();
    m.start().await.unwrap();
    // The retried write finds the key taken by its own first attempt: that is not somebody else's procedure.
    let mut w = m
        .submit(env.with_id("p", Plan::steps(1, true)))
        .await
        .unwrap();
    assert_eq!(
        within(w.wait()).await.unwrap(),
        Some(serde_json::json!({ "steps": 1 }))
    );
    let record: ProcedureRecord =
        serde_json::from_slice(&store.inner.snapshot()["proc/p"]).unwrap();
    assert_eq!(record.state, ProcedureState::Done);
}

#[tokio::test(start_paused = true)]
async fn a_record_naming_another_id_than_its_key_is_corrupt_and_writes_nothing() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let done = ProcedureRecord {
        format_version: 1,
        type_name: TYPE.into(),
        id: ProcedureId::new("y"),
        parent_id: None,
        step: 2,
        state: ProcedureState::Done,
        data: serde_json::to_value(Plan::steps(1, true)).unwrap(),
        output: Some(serde_json::json!("y's output")),
        error: None,
        waiting_for: Vec::new(),
        created_at_ms: 1,
        updated_at_ms: 1,
        step_name: None,
        lock_keys: Vec::new(),
        events: Vec::new(),
    };
    // Damaged: stored under proc/x but naming y. Resumed as y, it would overwrite y's record.
    let misplaced = ProcedureRecord {
        step: 0,
        state: ProcedureState::Running,
        output: None,
        ..done.clone()
    };
    let x = serde_json::to_vec(&misplaced).unwrap();
    store.put("proc/x", x.clone()).await.unwrap();
    store
        .put("proc/y", serde_json::to_vec(&done).unwrap())
        .await
        .unwrap();
    let m = manager(&store, fast_config(), &env).await;
    // Let anything that would run, run.
    run_until_idle(Duration::from_millis(100)).await;
    assert_eq!(stored(&store, "y"), done);
    assert_eq!(store.snapshot()["proc/x"], x);
    let info = m
        .procedure_state(&ProcedureId::new("x"))
        .await
        .unwrap()
        .expect("the damaged record is listed under its key");
    assert_eq!(info.state, ProcedureState::Failed);
    let error = info.error.unwrap_or_default();
    assert!(
        error.contains("proc/x") && error.contains("names procedure y"),
        "{error}"
    );
    let y = m
        .procedure_state(&ProcedureId::new("y"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(y.output, Some(serde_json::json!("y's output")));
}
