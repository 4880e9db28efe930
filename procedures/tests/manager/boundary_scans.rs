//! The step boundaries' shared reads of the control keys: runners at their boundaries together cost one scan, and
//! a runner never settles for a scan that began before it reached its boundary.
//!
//! Both tests run on the current-thread runtime of `#[tokio::test]` with a memory store: a runner runs only while the
//! test awaits, and a store call never suspends except at the test's gate.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use procedures::testing::StateStoreWrapper;
use tokio::sync::Semaphore;

use crate::support::manager::{Env, Plan, TYPE, fast_config, within};
use procedures::control::{self, CONTROL_PREFIX, ControlOp};
use procedures::{
    LocalManager, ManagerConfig, MemoryStateStore, ProcedureId, ProcedureManager, ProcedureState,
    Result, StateStore,
};

/// A memory store whose scans of the control keys are counted and, while `hold` is set, each wait for a permit of
/// `gate` after reading: what such a scan returns was read before the permit was given.
struct GatedScans {
    inner: MemoryStateStore,
    hold: AtomicBool,
    gate: Semaphore,
    scans: AtomicUsize,
}

impl GatedScans {
    fn new() -> Arc<Self> {
        Arc::new(GatedScans {
            inner: MemoryStateStore::new(),
            hold: AtomicBool::new(false),
            gate: Semaphore::new(0),
            scans: AtomicUsize::new(0),
        })
    }

    fn scans(&self) -> usize {
        self.scans.load(Ordering::SeqCst)
    }

    /// Lets every scan through from now on.
    fn open(&self) {
        self.hold.store(false, Ordering::SeqCst);
        self.gate.add_permits(1_000);
    }
}

#[async_trait]
impl StateStoreWrapper for GatedScans {
    fn inner(&self) -> &dyn StateStore {
        &self.inner
    }

    async fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let read = self.inner.scan(prefix).await?;
        if prefix == CONTROL_PREFIX {
            self.scans.fetch_add(1, Ordering::SeqCst);
            if self.hold.load(Ordering::SeqCst)
                && let Ok(permit) = self.gate.acquire().await
            {
                permit.forget();
            }
        }
        Ok(read)
    }
}

/// A manager on `store` whose poll never runs during a test (its scans would take the gate's permits).
async fn started(store: &Arc<GatedScans>, env: &Arc<Env>) -> LocalManager {
    let config = ManagerConfig {
        control_poll_interval: Duration::from_secs(3600),
        ..fast_config()
    };
    let manager = LocalManager::new(store.clone(), config);
    manager.register_loader(TYPE, env.loader()).unwrap();
    manager.start().await.unwrap();
    manager
}

/// Waits until `store` has seen `n` scans of the control keys.
async fn until_scans(store: &GatedScans, n: usize) {
    within(async {
        while store.scans() < n {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
}

/// Lets the runners spawned so far run until each waits (at its boundary's turn, or at the gate).
async fn settle() {
    for _ in 0..1_000 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn runners_at_their_boundaries_together_share_one_read_of_the_control_keys() {
    let env = Env::new(true);
    let store = GatedScans::new();
    let m = started(&store, &env).await;
    let before = store.scans();
    store.hold.store(true, Ordering::SeqCst);

    // p0's first boundary scans and waits at the gate; p1..p10 reach theirs meanwhile and queue.
    let mut watchers = vec![
        m.submit(env.with_id("p0", Plan::steps(1, true)))
            .await
            .unwrap(),
    ];
    until_scans(&store, before + 1).await;
    for i in 1..=10 {
        let id = format!("p{i}");
        watchers.push(
            m.submit(env.with_id(&id, Plan::steps(1, true)))
                .await
                .unwrap(),
        );
    }
    settle().await;

    // p0's scan ends; the first of the queue scans for all ten (it waits at the gate in turn).
    store.gate.add_permits(1);
    until_scans(&store, before + 2).await;
    // That one scan lets all ten into their first step: two permits, eleven boundaries passed.
    store.gate.add_permits(1);
    within(async {
        while !(1..=10).all(|i| env.events().contains(&format!("enter p{i} at 0"))) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    // At most one more scan has begun (a second boundary's, held at the gate).
    assert!(
        store.scans() <= before + 3,
        "{} scans for the first boundaries of 11 procedures",
        store.scans() - before
    );

    store.open();
    for mut watcher in watchers {
        within(watcher.wait()).await.unwrap();
    }
}

#[tokio::test]
async fn a_request_written_while_a_scan_reads_is_seen_by_a_runner_that_arrives_after_it() {
    let env = Env::new(true);
    let store = GatedScans::new();
    let m = started(&store, &env).await;
    let before = store.scans();
    store.hold.store(true, Ordering::SeqCst);

    // p0's boundary scan has read the control keys (none) and waits at the gate.
    let mut first = m
        .submit(env.with_id("p0", Plan::steps(1, true)))
        .await
        .unwrap();
    until_scans(&store, before + 1).await;
    // p1 is submitted and cancelled by another process after that read; it reaches its boundary while the scan
    // that cannot have seen the cancel is still in flight.
    let mut second = m
        .submit(env.with_id("p1", Plan::steps(1, true)))
        .await
        .unwrap();
    let outside: &dyn StateStore = store.as_ref();
    control::request(outside, &ProcedureId::new("p1"), ControlOp::Cancel)
        .await
        .unwrap();
    settle().await;

    store.open();
    within(first.wait()).await.unwrap();
    let cancelled = within(second.wait()).await.unwrap_err();
    assert!(
        matches!(cancelled, procedures::Error::ProcedureCancelled { .. }),
        "{cancelled}"
    );
    let info = m
        .procedure_state(&ProcedureId::new("p1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.state, ProcedureState::Cancelled);
    assert!(
        !env.events().contains(&"enter p1 at 0".to_string()),
        "p1 ran a step although its cancel was stored before it reached its boundary: {:?}",
        env.events()
    );
}

/// A memory store that counts its changes to the control keys ([`StateStore::counts_changes`], forwarded) and its
/// scans of them.
struct CountedScans {
    inner: MemoryStateStore,
    scans: AtomicUsize,
}

#[async_trait]
impl StateStore for CountedScans {
    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.inner.get(key).await
    }

    async fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        if prefix == CONTROL_PREFIX {
            self.scans.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.scan(prefix).await
    }

    async fn put(&self, key: &str, value: Vec<u8>) -> Result<()> {
        self.inner.put(key, value).await
    }

    async fn delete(&self, keys: &[String]) -> Result<()> {
        self.inner.delete(keys).await
    }

    async fn write(
        &self,
        conditions: Vec<procedures::Condition>,
        ops: Vec<procedures::WriteOp>,
    ) -> Result<procedures::WriteOutcome> {
        self.inner.write(conditions, ops).await
    }

    fn counts_changes(&self, prefix: &str) -> Option<Arc<std::sync::atomic::AtomicU64>> {
        self.inner.counts_changes(prefix)
    }
}

/// On a store that counts the changes to the control keys, a boundary reads them only when the count moved since
/// the read in force: ten boundaries with no request written read nothing, and a cancel written by another process
/// while a step runs is still found at the next boundary (the count moved, so that boundary reads).
#[tokio::test]
async fn boundaries_read_the_control_keys_only_when_a_store_that_counts_their_changes_saw_one() {
    let env = Env::new(false);
    let store = Arc::new(CountedScans {
        inner: MemoryStateStore::new(),
        scans: AtomicUsize::new(0),
    });
    let config = ManagerConfig {
        control_poll_interval: Duration::from_secs(3600),
        ..fast_config()
    };
    let m = LocalManager::new(store.clone(), config);
    m.register_loader(TYPE, env.loader()).unwrap();
    m.start().await.unwrap();

    let before = store.scans.load(Ordering::SeqCst);
    let mut quiet = m
        .submit(env.with_id("quiet", Plan::steps(10, true)))
        .await
        .unwrap();
    within(quiet.wait()).await.unwrap();
    assert_eq!(
        store.scans.load(Ordering::SeqCst),
        before,
        "the boundaries of ten steps read the control keys although no request was written"
    );

    let id = ProcedureId::new("cancelled");
    let plan = Plan {
        steps: 3,
        persist: true,
        block_at: Some(1),
        ..Plan::default()
    };
    let mut w = m.submit(env.with_id("cancelled", plan)).await.unwrap();
    within(async {
        while !env.events().contains(&"enter cancelled at 1".to_string()) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    let outside: &dyn StateStore = store.as_ref();
    control::request(outside, &id, ControlOp::Cancel)
        .await
        .unwrap();
    env.gate.add_permits(100);
    let err = within(w.wait()).await.unwrap_err();
    assert!(
        matches!(err, procedures::Error::ProcedureCancelled { .. }),
        "{err}"
    );
    assert!(
        !env.events().contains(&"enter cancelled at 2".to_string()),
        "a step ran after the boundary that followed the cancel: {:?}",
        env.events()
    );
    assert!(
        store.scans.load(Ordering::SeqCst) > before,
        "the boundary after the cancel did not read the control keys"
    );
}
