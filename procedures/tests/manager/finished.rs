//! Finished procedures in memory for `finished_in_memory` only: afterwards their records in the store answer
//! `procedure_state`, `watch`, `list_procedures` and a `submit` of their id; `start` leaves older finished records
//! in the store; the retention sweep deletes expired records it reads from the store, in memory or not.
//!
//! These tests run on the real clock: the times they configure are short (tens of milliseconds), and they assert
//! only that something happens (within the generous `within` bound), or not before a time that is certain.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use procedures::record::{RECORD_PREFIX, now_ms};
use procedures::testing::StateStoreWrapper;
use procedures::{
    LocalManager, ManagerConfig, MemoryStateStore, ProcedureId, ProcedureManager, ProcedureRecord,
    ProcedureState, Result, StateStore,
};

use crate::support::manager::{Env, Plan, TYPE, fast_config, within};

/// The memory store, counting the reads of single procedure records (what a lookup outside memory does).
struct Reads {
    inner: MemoryStateStore,
    record_gets: AtomicUsize,
}

impl Reads {
    fn new() -> Arc<Self> {
        Arc::new(Reads {
            inner: MemoryStateStore::new(),
            record_gets: AtomicUsize::new(0),
        })
    }

    fn record_gets(&self) -> usize {
        self.record_gets.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl StateStoreWrapper for Reads {
    fn inner(&self) -> &dyn StateStore {
        &self.inner
    }

    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        if key.starts_with(RECORD_PREFIX) {
            self.record_gets.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.get(key).await
    }
}

async fn started(
    store: Arc<dyn StateStore>,
    config: ManagerConfig,
    env: &Arc<Env>,
) -> LocalManager {
    let manager = LocalManager::new(store, config);
    manager.register_loader(TYPE, env.loader()).unwrap();
    manager.start().await.unwrap();
    manager
}

fn entered(env: &Env, id: &str) -> usize {
    let prefix = format!("enter {id} ");
    env.events()
        .iter()
        .filter(|e| e.starts_with(&prefix))
        .count()
}

/// Makes the record of `id` say it was written `by_ms` earlier.
async fn age(store: &MemoryStateStore, id: &str, by_ms: u64) {
    let key = format!("{RECORD_PREFIX}{id}");
    let value = store.get(&key).await.unwrap().expect("a record");
    let mut record: ProcedureRecord = serde_json::from_slice(&value).unwrap();
    record.updated_at_ms -= by_ms;
    store
        .put(&key, serde_json::to_vec(&record).unwrap())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_finished_procedure_leaves_memory_after_finished_in_memory_and_answers_from_its_record() {
    let store = Reads::new();
    let env = Env::new(true);
    let config = ManagerConfig {
        finished_in_memory: Duration::from_millis(50),
        ..fast_config()
    };
    let m = started(store.clone(), config, &env).await;
    let id = ProcedureId::new("p");
    let mut w = m
        .submit(env.with_id("p", Plan::steps(1, true)))
        .await
        .unwrap();
    let output = within(w.wait()).await.unwrap();
    assert!(output.is_some());

    // Right after it finished it is in memory: no record is read.
    let shown = m.procedure_state(&id).await.unwrap().unwrap();
    assert_eq!(shown.state, ProcedureState::Done);
    assert_eq!(store.record_gets(), 0);

    // It leaves memory, and from then on its record answers; not before `finished_in_memory` has passed.
    within(async {
        while store.record_gets() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
            m.procedure_state(&id).await.unwrap();
        }
    })
    .await;
    assert!(
        now_ms() >= shown.updated_at_ms + 50,
        "left memory before finished_in_memory had passed"
    );
    let stored = m.procedure_state(&id).await.unwrap().unwrap();
    assert_eq!(
        (stored.state, &stored.output, stored.step),
        (ProcedureState::Done, &output, shown.step)
    );

    // A watcher of it resolves at once from its record.
    let reads = store.record_gets();
    let mut watcher = m.watch(&id).await.unwrap().expect("watched from the store");
    assert_eq!(within(watcher.wait()).await.unwrap(), output);
    assert_eq!(store.record_gets(), reads + 1);
    // The listing reads it from the store.
    let listed: Vec<(ProcedureId, ProcedureState)> = m
        .list_procedures()
        .await
        .unwrap()
        .into_iter()
        .map(|i| (i.id, i.state))
        .collect();
    assert_eq!(listed, [(id.clone(), ProcedureState::Done)]);
    // A control request is refused as for a finished procedure in memory.
    let refused = m.pause(&id).await.unwrap_err().to_string();
    assert_eq!(
        refused,
        "cannot pause procedure p: it is already finished (done)"
    );
    assert!(m.watch(&ProcedureId::new("nope")).await.unwrap().is_none());
    assert!(
        m.procedure_state(&ProcedureId::new("nope"))
            .await
            .unwrap()
            .is_none()
    );

    // Submitted again under its id, it is not run a second time: the watcher gives its stored output.
    let runs = entered(&env, "p");
    let mut again = m
        .submit(env.with_id("p", Plan::steps(1, true)))
        .await
        .unwrap();
    assert_eq!(within(again.wait()).await.unwrap(), output);
    assert_eq!(entered(&env, "p"), runs);
    // Its record stays in the store (retention is an hour).
    assert!(store.inner.snapshot().contains_key("proc/p"));
    m.stop().await.unwrap();
}

#[tokio::test]
async fn start_leaves_finished_records_older_than_finished_in_memory_in_the_store() {
    let store = Reads::new();
    let env = Env::new(true);
    let first = started(store.clone(), fast_config(), &env).await;
    for id in ["new", "old"] {
        let mut w = first
            .submit(env.with_id(id, Plan::steps(1, true)))
            .await
            .unwrap();
        within(w.wait()).await.unwrap();
    }
    first.stop().await.unwrap();
    // "old" finished twenty minutes ago, as its record says; "new" just now.
    age(&store.inner, "old", 20 * 60 * 1000).await;

    let config = ManagerConfig {
        finished_in_memory: Duration::from_secs(600),
        ..fast_config()
    };
    let second = started(store.clone(), config, &env).await;
    let reads = store.record_gets();
    let new = second
        .procedure_state(&ProcedureId::new("new"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(new.state, ProcedureState::Done);
    assert_eq!(store.record_gets(), reads, "`new` was loaded at start");
    let old = second
        .procedure_state(&ProcedureId::new("old"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(old.state, ProcedureState::Done);
    assert_eq!(
        store.record_gets(),
        reads + 1,
        "`old` was not loaded: it was read from the store"
    );
    let listed: Vec<String> = second
        .list_procedures()
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id.to_string())
        .collect();
    assert_eq!(listed, ["new", "old"]);
    second.stop().await.unwrap();
}

#[tokio::test]
async fn the_retention_sweep_deletes_expired_trees_it_reads_from_the_store_and_keeps_the_rest() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let first = started(store.clone(), fast_config(), &env).await;
    let tree = Plan {
        children: vec![("c".into(), Plan::steps(1, true))],
        ..Plan::steps(1, true)
    };
    for (id, plan) in [
        ("t", tree),
        ("r", Plan::steps(1, true)),
        ("fresh", Plan::steps(1, true)),
    ] {
        let mut w = first.submit(env.with_id(id, plan)).await.unwrap();
        within(w.wait()).await.unwrap();
    }
    first.stop().await.unwrap();
    // The tree `t` (with its child) and `r` finished two hours ago: past retention, and never loaded by the next
    // manager (past `finished_in_memory` as well), so only the store knows them. `fresh` finished just now.
    for id in ["t", "t/c", "r"] {
        age(&store, id, 2 * 3600 * 1000).await;
    }
    // A damaged record is never deleted.
    store.put("proc/bad", b"not json".to_vec()).await.unwrap();

    let config = ManagerConfig {
        retention: Duration::from_secs(3600),
        retention_check_interval: Duration::from_millis(10),
        ..fast_config()
    };
    let second = started(store.clone(), config, &env).await;
    within(async {
        while ["proc/t", "proc/t/c", "proc/r"]
            .iter()
            .any(|k| store.snapshot().contains_key(*k))
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let keys: Vec<String> = store
        .snapshot()
        .into_keys()
        .filter(|k| k.starts_with(RECORD_PREFIX))
        .collect();
    assert_eq!(keys, ["proc/bad", "proc/fresh"]);
    let listed: Vec<String> = second
        .list_procedures()
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id.to_string())
        .collect();
    assert_eq!(listed, ["bad", "fresh"]);
    second.stop().await.unwrap();
}
