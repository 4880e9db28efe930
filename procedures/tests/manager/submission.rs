//! Submission semantics: a known id gives a watcher of its procedure (running, finished, or only in the store), an
//! id used by another type is refused, and dropping `submit` at any of its store calls leaves either no procedure
//! or a running one.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use tokio::sync::{Notify, Semaphore};

use crate::support::manager::{Env, Plan, TYPE, fast_config, within};
use procedures::StateStore as _;
use procedures::record::record_key;
use procedures::{
    Context, Error, LocalManager, MemoryStateStore, Procedure, ProcedureId, ProcedureManager,
    ProcedureRecord, ProcedureWithId, Status,
};

async fn manager(store: Arc<dyn procedures::StateStore>, env: &Arc<Env>) -> LocalManager {
    let manager = LocalManager::new(store, fast_config());
    manager.register_loader(TYPE, env.loader()).unwrap();
    manager.start().await.unwrap();
    manager
}

fn entered(env: &Env, id: &str) -> usize {
    env.events()
        .iter()
        .filter(|e| e.starts_with(&format!("enter {id} ")))
        .count()
}

/// How many runs of `id` started (entered its first step).
fn runs(env: &Env, id: &str) -> usize {
    env.events()
        .iter()
        .filter(|e| *e == &format!("enter {id} at 0"))
        .count()
}

/// A procedure of another type than the shared test procedure.
struct Other;

#[async_trait]
impl Procedure for Other {
    fn type_name(&self) -> &str {
        "other_type"
    }
    async fn execute(&mut self, _ctx: &Context) -> procedures::Result<Status> {
        Ok(Status::done())
    }
    fn dump(&self) -> procedures::Result<serde_json::Value> {
        Ok(serde_json::Value::Null)
    }
    fn lock_key(&self) -> procedures::LockKey {
        procedures::LockKey::none()
    }
}

#[tokio::test]
async fn a_known_id_gives_its_running_or_finished_procedure() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(false);
    let m = manager(store.clone(), &env).await;
    let blocked = Plan {
        block_at: Some(0),
        ..Plan::steps(1, true)
    };
    let mut first = m.submit(env.with_id("p", blocked.clone())).await.unwrap();
    assert!(first.is_new_submission());
    // Running: the second submission watches the first procedure; nothing new is written or run.
    let mut second = m.submit(env.with_id("p", blocked)).await.unwrap();
    assert_eq!(second.id().as_str(), "p");
    assert!(!second.is_new_submission());
    env.gate.add_permits(usize::MAX >> 4);
    let output = Some(serde_json::json!({ "steps": 1 }));
    assert_eq!(within(first.wait()).await.unwrap(), output);
    assert_eq!(within(second.wait()).await.unwrap(), output);
    // Finished: its output, at once.
    let mut third = m
        .submit(env.with_id("p", Plan::steps(5, true)))
        .await
        .unwrap();
    assert!(!third.is_new_submission());
    assert_eq!(within(third.wait()).await.unwrap(), output);
    assert_eq!(
        entered(&env, "p"),
        2,
        "the procedure ran again: {:?}",
        env.events()
    );
    m.stop().await.unwrap();

    // A new manager on the store: the finished record's stored output.
    let m2 = manager(store.clone(), &env).await;
    let mut again = m2
        .submit(env.with_id("p", Plan::steps(1, true)))
        .await
        .unwrap();
    assert!(!again.is_new_submission());
    assert_eq!(within(again.wait()).await.unwrap(), output);
    assert_eq!(entered(&env, "p"), 2);
}

#[tokio::test]
async fn a_record_only_in_the_store_is_loaded_and_watched() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let m = manager(store.clone(), &env).await;
    within(
        m.submit(env.with_id("d", Plan::steps(1, true)))
            .await
            .unwrap()
            .wait(),
    )
    .await
    .unwrap();
    // A finished record and an unfinished one, written behind the manager's back.
    let mut finished: ProcedureRecord =
        serde_json::from_slice(&store.snapshot()[&record_key(&ProcedureId::new("d"))]).unwrap();
    finished.id = ProcedureId::new("e");
    finished.output = Some(serde_json::json!("from the store"));
    let mut unfinished = finished.clone();
    unfinished.id = ProcedureId::new("f");
    unfinished.state = procedures::ProcedureState::Running;
    unfinished.output = None;
    unfinished.step = 0;
    unfinished.data = serde_json::to_value(Plan::steps(2, true)).unwrap();
    for record in [&finished, &unfinished] {
        procedures::StateStore::put(
            store.as_ref(),
            &record_key(&record.id),
            serde_json::to_vec(record).unwrap(),
        )
        .await
        .unwrap();
    }
    let mut e = m
        .submit(env.with_id("e", Plan::steps(1, true)))
        .await
        .unwrap();
    assert!(!e.is_new_submission(), "e was in the store already");
    assert_eq!(
        within(e.wait()).await.unwrap(),
        Some(serde_json::json!("from the store"))
    );
    assert_eq!(entered(&env, "e"), 0);
    // The unfinished one runs from its stored data (two steps), not from the submission's (five).
    let mut f = m
        .submit(env.with_id("f", Plan::steps(5, true)))
        .await
        .unwrap();
    assert_eq!(
        within(f.wait()).await.unwrap(),
        Some(serde_json::json!({ "steps": 2 }))
    );
}

#[tokio::test]
async fn an_id_used_by_another_type_is_refused_naming_it() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let m = manager(store.clone(), &env).await;
    within(
        m.submit(env.with_id("x", Plan::steps(1, true)))
            .await
            .unwrap()
            .wait(),
    )
    .await
    .unwrap();
    let other = || ProcedureWithId::new(ProcedureId::new("x"), Box::new(Other));
    let err = m.submit(other()).await.unwrap_err();
    assert!(
        matches!(&err, Error::ProcedureIdInUse { id, existing, submitted }
            if id.as_str() == "x" && existing == TYPE && submitted == "other_type"),
        "{err:?}"
    );
    assert!(err.to_string().contains("procedure id x"), "{err}");
    m.stop().await.unwrap();
    // Also when the id is known only from the store.
    let m2 = manager(store, &env).await;
    assert!(matches!(
        m2.submit(other()).await,
        Err(Error::ProcedureIdInUse { .. })
    ));
}

/// A store whose `write`s and `get`s can be held at a gate the test opens, and whose next held write can fail.
struct GateStore {
    inner: MemoryStateStore,
    hold_writes: AtomicBool,
    hold_gets: AtomicBool,
    fail_held_write: AtomicBool,
    reached: Notify,
    gate: Semaphore,
}

impl GateStore {
    fn new() -> Self {
        GateStore {
            inner: MemoryStateStore::new(),
            hold_writes: AtomicBool::new(false),
            hold_gets: AtomicBool::new(false),
            fail_held_write: AtomicBool::new(false),
            reached: Notify::new(),
            gate: Semaphore::new(0),
        }
    }

    async fn hold(&self) {
        self.reached.notify_one();
        if let Ok(permit) = self.gate.acquire().await {
            permit.forget();
        }
    }
}

#[async_trait]
impl procedures::StateStore for GateStore {
    async fn get(&self, key: &str) -> procedures::Result<Option<Vec<u8>>> {
        if self.hold_gets.swap(false, Ordering::SeqCst) {
            self.hold().await;
        }
        self.inner.get(key).await
    }
    async fn scan(&self, prefix: &str) -> procedures::Result<Vec<(String, Vec<u8>)>> {
        self.inner.scan(prefix).await
    }
    async fn put(&self, key: &str, value: Vec<u8>) -> procedures::Result<()> {
        self.inner.put(key, value).await
    }
    async fn delete(&self, keys: &[String]) -> procedures::Result<()> {
        self.inner.delete(keys).await
    }
    async fn write(
        &self,
        conditions: Vec<procedures::Condition>,
        ops: Vec<procedures::WriteOp>,
    ) -> procedures::Result<procedures::WriteOutcome> {
        if self.hold_writes.swap(false, Ordering::SeqCst) {
            self.hold().await;
            if self.fail_held_write.swap(false, Ordering::SeqCst) {
                return Err(Error::Store {
                    action: "write",
                    key: ops
                        .first()
                        .map(|op| op.key().to_string())
                        .unwrap_or_default(),
                    source: "refused for the test".into(),
                    retryable: false,
                });
            }
        }
        self.inner.write(conditions, ops).await
    }
}

/// Polls a `submit` of `id` until its store call is held at the gate, then drops it. Returns a watcher taken while
/// the submission was in flight.
async fn drop_submit_at_the_gate(
    m: &LocalManager,
    store: &GateStore,
    env: &Arc<Env>,
    id: &str,
) -> Option<procedures::Watcher> {
    let reached = store.reached.notified();
    tokio::pin!(reached);
    {
        let submit = m.submit(env.with_id(id, Plan::steps(1, true)));
        tokio::pin!(submit);
        tokio::select! {
            biased;
            result = &mut submit => panic!("submit finished past a closed gate: {result:?}"),
            () = &mut reached => {}
        }
        // `submit` is dropped here, in the middle of its store call.
    }
    m.watch(&ProcedureId::new(id)).await.unwrap()
}

#[tokio::test]
async fn dropping_submit_during_its_write_leaves_a_running_procedure() {
    let store = Arc::new(GateStore::new());
    let env = Env::new(true);
    let m = manager(store.clone(), &env).await;
    store.hold_writes.store(true, Ordering::SeqCst);
    let watcher = drop_submit_at_the_gate(&m, &store, &env, "w").await;
    let mut watcher = watcher.expect("the reserved procedure is watchable while its write is held");
    store.gate.add_permits(1);
    // The write lands after the caller left: the procedure runs, and its watcher resolves.
    let output = Some(serde_json::json!({ "steps": 1 }));
    assert_eq!(within(watcher.wait()).await.unwrap(), output);
    // Resubmitting finds it.
    let mut again = m
        .submit(env.with_id("w", Plan::steps(1, true)))
        .await
        .unwrap();
    assert_eq!(within(again.wait()).await.unwrap(), output);
    assert_eq!(entered(&env, "w"), 2);
}

#[tokio::test]
async fn dropping_submit_during_a_failing_write_leaves_no_procedure() {
    let store = Arc::new(GateStore::new());
    let env = Env::new(true);
    let m = manager(store.clone(), &env).await;
    store.hold_writes.store(true, Ordering::SeqCst);
    store.fail_held_write.store(true, Ordering::SeqCst);
    let mut watcher = drop_submit_at_the_gate(&m, &store, &env, "n")
        .await
        .expect("the reserved procedure is watchable while its write is held");
    store.gate.add_permits(1);
    // The write failed: the watcher resolves (no hang) and says so; the id is free again.
    let err = within(watcher.wait()).await.unwrap_err();
    assert!(err.to_string().contains("not submitted"), "{err}");
    assert!(m.watch(&ProcedureId::new("n")).await.unwrap().is_none());
    assert!(
        procedures::StateStore::get(store.as_ref(), &record_key(&ProcedureId::new("n")))
            .await
            .unwrap()
            .is_none()
    );
    let mut again = m
        .submit(env.with_id("n", Plan::steps(1, true)))
        .await
        .unwrap();
    assert_eq!(
        within(again.wait()).await.unwrap(),
        Some(serde_json::json!({ "steps": 1 }))
    );
}

#[tokio::test]
async fn dropping_submit_while_it_reads_a_stored_record_leaves_that_procedure_running() {
    let store = Arc::new(GateStore::new());
    let env = Env::new(true);
    let m = manager(store.clone(), &env).await;
    // An unfinished record only in the store: the submission's write is refused and it reads the record.
    let record = ProcedureRecord {
        format_version: procedures::record::RECORD_FORMAT_VERSION,
        type_name: TYPE.to_string(),
        id: ProcedureId::new("s"),
        parent_id: None,
        step: 0,
        state: procedures::ProcedureState::Running,
        data: serde_json::to_value(Plan::steps(3, true)).unwrap(),
        output: None,
        error: None,
        waiting_for: Vec::new(),
        created_at_ms: 0,
        updated_at_ms: 0,
        step_name: None,
        lock_keys: Vec::new(),
        events: Vec::new(),
    };
    procedures::StateStore::put(
        &store.inner,
        &record_key(&record.id),
        serde_json::to_vec(&record).unwrap(),
    )
    .await
    .unwrap();
    store.hold_gets.store(true, Ordering::SeqCst);
    let _ = drop_submit_at_the_gate(&m, &store, &env, "s").await;
    store.gate.add_permits(1);
    // The read finishes after the caller left: the stored procedure is loaded and runs; a resubmission watches it.
    let mut again = m
        .submit(env.with_id("s", Plan::steps(1, true)))
        .await
        .unwrap();
    assert_eq!(
        within(again.wait()).await.unwrap(),
        Some(serde_json::json!({ "steps": 3 }))
    );
    assert_eq!(entered(&env, "s"), 4);
}

/// A root that failed and rolled back completely runs again when submitted again with
/// `submit_again_if_rolled_back`; two such submissions at once run it once. One that failed without a completed
/// rollback, or that is done, is answered as `submit` answers it.
#[tokio::test]
async fn a_failed_rolled_back_root_submitted_again_runs_again_once() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let m = manager(store.clone(), &env).await;
    let failing = Plan {
        fail: true,
        rollback: true,
        ..Plan::steps(1, true)
    };
    let err = within(
        m.submit(env.with_id("again", failing))
            .await
            .unwrap()
            .wait(),
    )
    .await
    .expect_err("it fails");
    assert!(matches!(err, Error::ProcedureFailed { .. }), "{err}");
    assert_eq!(env.rollbacks.load(Ordering::SeqCst), 1);
    // `submit` keeps answering the failure.
    let same = within(
        m.submit(env.with_id("again", Plan::steps(1, true)))
            .await
            .unwrap()
            .wait(),
    )
    .await;
    assert!(same.is_err());

    // Submitted again twice at once: one replaces the record and runs, the other watches that run.
    let (a, b) = tokio::join!(
        m.submit_again_if_rolled_back(env.with_id("again", Plan::steps(1, true))),
        m.submit_again_if_rolled_back(env.with_id("again", Plan::steps(1, true))),
    );
    let (mut a, mut b) = (a.unwrap(), b.unwrap());
    within(a.wait()).await.expect("the run again succeeds");
    within(b.wait()).await.expect("the other watcher sees it");
    assert_eq!(
        runs(&env, "again"),
        2,
        "one failed run and one run again: {:?}",
        env.events()
    );
    let record: ProcedureRecord = serde_json::from_slice(
        &store
            .get(&record_key(&ProcedureId::new("again")))
            .await
            .unwrap()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(record.state, procedures::ProcedureState::Done);

    // Done: submitting again does not run it again.
    let mut done = m
        .submit_again_if_rolled_back(env.with_id("again", Plan::steps(1, true)))
        .await
        .unwrap();
    within(done.wait()).await.unwrap();
    assert_eq!(runs(&env, "again"), 2);

    // Failed without a rollback: its failure is the answer.
    let no_rollback = Plan {
        fail: true,
        ..Plan::steps(1, true)
    };
    let _ = within(
        m.submit(env.with_id("kept", no_rollback))
            .await
            .unwrap()
            .wait(),
    )
    .await;
    let again = within(
        m.submit_again_if_rolled_back(env.with_id("kept", Plan::steps(1, true)))
            .await
            .unwrap()
            .wait(),
    )
    .await;
    assert!(
        again.is_err(),
        "a failure without a rollback is not run again"
    );
    assert_eq!(runs(&env, "kept"), 1);
}
