//! Issue 16, F11: the manager epoch never wraps. A store whose epoch is at `u64::MAX` refuses a new manager with
//! an error naming the key and value, and the epoch is left as it was (never reset to 0, which every older manager
//! would see as older than its own).

use std::sync::Arc;

use procedures::record::EPOCH_KEY;
use procedures::{LocalManager, ManagerConfig, MemoryStateStore, ProcedureManager, StateStore};

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
