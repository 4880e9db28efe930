//! The manager's lifecycle: `stop` returns only once no task of the manager is left, and a stopped manager starts
//! again with a new epoch and recovers what it left unfinished.

use std::sync::Arc;

use crate::support::manager::{Env, Plan, TYPE, fast_config, within};
use procedures::{
    Error, LocalManager, MemoryStateStore, ProcedureId, ProcedureManager, ProcedureState,
};

fn blocked(steps: u32) -> Plan {
    Plan {
        block_at: Some(0),
        ..Plan::steps(steps, true)
    }
}

/// Yields to the runtime until the procedures of `env` have entered `n` steps.
async fn until_entered(env: &Env, n: usize) {
    within(async {
        while env
            .events()
            .iter()
            .filter(|e| e.starts_with("enter "))
            .count()
            < n
        {
            tokio::task::yield_now().await;
        }
    })
    .await
}

#[tokio::test]
async fn stop_returns_once_no_task_of_the_manager_holds_anything() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(false);
    let m = LocalManager::new(store.clone(), fast_config());
    m.register_loader(TYPE, env.loader()).unwrap();
    m.start().await.unwrap();
    let mut watchers = Vec::new();
    for id in ["a", "b", "c"] {
        watchers.push(m.submit(env.with_id(id, blocked(2))).await.unwrap());
    }
    // Every runner is inside a step, holding its procedure (and through it the env).
    until_entered(&env, 3).await;

    m.stop().await.unwrap();
    // No yield since `stop` returned: had it only asked the tasks to end, their futures (each holding the manager,
    // the store and a procedure) would still be alive here.
    drop(m);
    assert_eq!(Arc::strong_count(&store), 1, "a task still holds the store");
    assert_eq!(Arc::strong_count(&env), 1, "a task still holds a procedure");
    for mut watcher in watchers {
        let err = watcher.wait().await.unwrap_err();
        assert!(matches!(err, Error::ManagerNotRunning { .. }), "{err}");
    }
}

#[tokio::test]
async fn concurrent_stops_both_return_after_the_tasks_ended() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(false);
    let m = LocalManager::new(store.clone(), fast_config());
    m.register_loader(TYPE, env.loader()).unwrap();
    m.start().await.unwrap();
    m.submit(env.with_id("a", blocked(1))).await.unwrap();
    until_entered(&env, 1).await;
    // The loader holds one reference, the test one; the running procedure a third.
    assert_eq!(Arc::strong_count(&env), 3);
    let (first, second) = tokio::join!(m.stop(), m.stop());
    first.unwrap();
    second.unwrap();
    assert_eq!(Arc::strong_count(&env), 2, "a runner outlived both stops");
}

#[tokio::test]
async fn a_stopped_manager_starts_again_with_a_new_epoch_and_recovers() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(false);
    let m = LocalManager::new(store.clone(), fast_config());
    m.register_loader(TYPE, env.loader()).unwrap();
    m.start().await.unwrap();
    let first_epoch = m.epoch().unwrap();
    let mut done = m
        .submit(env.with_id("done", Plan::steps(1, true)))
        .await
        .unwrap();
    within(done.wait()).await.unwrap();
    let mut before = m.submit(env.with_id("p", blocked(2))).await.unwrap();
    until_entered(&env, 2).await;

    m.stop().await.unwrap();
    assert!(matches!(
        before.wait().await,
        Err(Error::ManagerNotRunning { .. })
    ));
    // Stopped: no submission.
    let refused = m.submit(env.with_id("q", Plan::steps(1, true))).await;
    assert!(
        matches!(refused, Err(Error::ManagerNotRunning { .. })),
        "{refused:?}"
    );

    m.start().await.unwrap();
    assert_eq!(m.epoch(), Some(first_epoch + 1));
    // Recovered from the store: the finished one as finished, the blocked one running again from its last step.
    let listed = m.list_procedures().await.unwrap();
    let states: Vec<(String, ProcedureState)> =
        listed.iter().map(|p| (p.id.to_string(), p.state)).collect();
    assert_eq!(
        states,
        vec![
            ("done".to_string(), ProcedureState::Done),
            ("p".to_string(), ProcedureState::Running),
        ]
    );
    env.gate.add_permits(usize::MAX >> 4);
    let mut after = m.watch(&ProcedureId::new("p")).await.unwrap().unwrap();
    assert_eq!(
        within(after.wait()).await.unwrap(),
        Some(serde_json::json!({ "steps": 2 }))
    );
    // And it takes new work.
    let mut q = m
        .submit(env.with_id("q", Plan::steps(1, true)))
        .await
        .unwrap();
    within(q.wait()).await.unwrap();
    // A second start of a running manager is refused and does not claim an epoch.
    assert!(matches!(
        m.start().await,
        Err(Error::ManagerNotRunning { .. })
    ));
    assert_eq!(m.epoch(), Some(first_epoch + 1));
    m.stop().await.unwrap();
}

/// Before, `start` held the manager's state lock around every loader call, so this deadlocked its thread: the
/// body runs on a thread of its own, so that a regression fails this test instead of hanging the run.
#[test]
fn a_loader_that_calls_the_manager_does_not_deadlock_its_start() {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(loader_calls_the_manager_while_it_starts());
        let _ = done.send(());
    });
    finished
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the manager's start returned: a loader calling the manager must not deadlock it");
}

async fn loader_calls_the_manager_while_it_starts() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{OnceLock, Weak};

    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(false);
    // A first manager leaves a procedure unfinished in the store.
    let first = LocalManager::new(store.clone(), fast_config());
    first.register_loader(TYPE, env.loader()).unwrap();
    first.start().await.unwrap();
    let _left = first.submit(env.with_id("left", blocked(2))).await.unwrap();
    until_entered(&env, 1).await;
    first.stop().await.unwrap();

    // The next manager's loader calls back into it while it recovers that procedure: its epoch and a watcher
    // both take the manager's state lock, which start held around every loader call before.
    let second = Arc::new(LocalManager::new(store.clone(), fast_config()));
    let handle: Arc<OnceLock<Weak<LocalManager>>> = Arc::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let inner = env.loader();
    let (h, c) = (handle.clone(), calls.clone());
    second
        .register_loader(
            TYPE,
            Box::new(move |data| {
                if let Some(m) = h.get().and_then(Weak::upgrade) {
                    let _ = m.epoch();
                    let _ = futures::executor::block_on(m.watch(&ProcedureId::new("left")));
                    c.fetch_add(1, Ordering::SeqCst);
                }
                inner(data)
            }),
        )
        .unwrap();
    assert!(handle.set(Arc::downgrade(&second)).is_ok());
    second.start().await.unwrap();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the loader ran once, for the unfinished procedure, and called the manager"
    );
    assert!(
        second
            .watch(&ProcedureId::new("left"))
            .await
            .unwrap()
            .is_some()
    );
    second.stop().await.unwrap();
}
