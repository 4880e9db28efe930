//! The StateStore conformance suite on the in-memory store, and on the crash harness's store wrapper (which must be
//! transparent while no crash is planned).

use std::sync::Arc;

use procedures::testing::{CrashPlan, CrashingStore, state_store_suite};
use procedures::{MemoryStateStore, StateStore};

#[tokio::test]
async fn memory_state_store_conforms() {
    state_store_suite(|| async { Arc::new(MemoryStateStore::new()) as Arc<dyn StateStore> }).await;
}

#[tokio::test]
async fn crashing_store_without_a_crash_conforms() {
    state_store_suite(|| async {
        Arc::new(CrashingStore::with_plan(
            Arc::new(MemoryStateStore::new()),
            CrashPlan::none(),
        )) as Arc<dyn StateStore>
    })
    .await;
}
