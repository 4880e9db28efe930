//! Issue 16, F11: the manager epoch never wraps. A store whose epoch is at `u64::MAX` refuses a new manager with
//! an error naming the key and value, and the epoch is left as it was (never reset to 0, which every older manager
//! would see as older than its own).

use std::sync::Arc;

use procedures::record::{EPOCH_KEY, record_key};
use procedures::{
    EventKind, LocalManager, ManagerConfig, MemoryStateStore, ProcedureId, ProcedureManager,
    StateStore,
};

use crate::support::manager::{Env, Plan, TYPE, fast_config, within};

#[tokio::test]
async fn a_manager_refuses_to_start_past_the_largest_epoch() {
    let store = Arc::new(MemoryStateStore::new());
    store
        .put(EPOCH_KEY, u64::MAX.to_string().into_bytes())
        .await
        .unwrap();
    let manager = LocalManager::new(store.clone(), ManagerConfig::default());
    let err = manager.start().await.unwrap_err().to_string();
    assert!(err.contains(EPOCH_KEY), "{err}");
    assert!(err.contains(&u64::MAX.to_string()), "{err}");
    assert_eq!(
        store.get(EPOCH_KEY).await.unwrap(),
        Some(u64::MAX.to_string().into_bytes())
    );

    // One below the limit is still claimed.
    let store = Arc::new(MemoryStateStore::new());
    store
        .put(EPOCH_KEY, (u64::MAX - 1).to_string().into_bytes())
        .await
        .unwrap();
    let manager = LocalManager::new(store.clone(), ManagerConfig::default());
    manager.start().await.unwrap();
    assert_eq!(
        store.get(EPOCH_KEY).await.unwrap(),
        Some(u64::MAX.to_string().into_bytes())
    );
    manager.stop().await.unwrap();
}

/// Issue 16, F11 ("a fenced process keeps creating topics"): a manager whose step is busy with outside effects, and
/// writes nothing meanwhile, halts as fenced once a newer manager claims the store — from its control poll, not
/// only at its next write — so the step stops at once and nothing more is written by it.
#[tokio::test]
async fn a_manager_busy_in_a_step_halts_as_soon_as_a_newer_one_claims_the_store() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(false);
    let m1 = LocalManager::new(store.clone(), fast_config());
    m1.register_loader(TYPE, env.loader()).unwrap();
    m1.start().await.unwrap();
    let plan = Plan {
        block_at: Some(0),
        ..Plan::steps(1, true)
    };
    let mut watcher = m1.submit(env.with_id("busy", plan)).await.unwrap();
    let id = ProcedureId::new("busy");
    // The step is running (held at its gate: it writes nothing until it returns).
    within(async {
        while m1.procedure_state(&id).await.unwrap().map(|i| i.attempt) != Some(1) {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;

    // A newer manager claims the store; it has no loader, so it runs nothing itself.
    let m2 = LocalManager::new(store.clone(), fast_config());
    m2.start().await.unwrap();
    let newer = m2.epoch().unwrap();
    let before = store.snapshot()[&record_key(&id)].clone();

    // The busy manager halts with its step still held: its watcher resolves without an output.
    let outcome = within(watcher.wait()).await;
    assert!(outcome.is_err(), "{outcome:?}");
    let info = m1.procedure_state(&id).await.unwrap().expect("known");
    assert!(
        info.events
            .iter()
            .any(|e| e.kind == EventKind::Fenced { epoch: newer }),
        "{:?}",
        info.events
    );
    let err = m1
        .submit(env.with_id("after", Plan::steps(1, true)))
        .await
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(err.contains(&format!("fenced by epoch {newer}")), "{err}");

    // Let the held step go, then stop the manager, which joins every task it had (and waits for its store to be
    // quiet): whatever the step or its runner would still do has happened by then. It was fenced, so the record
    // stays as it was.
    env.gate.add_permits(10);
    m1.stop().await.unwrap();
    assert_eq!(
        store.snapshot()[&record_key(&id)],
        before,
        "a fenced manager wrote"
    );
    m2.stop().await.unwrap();
}
