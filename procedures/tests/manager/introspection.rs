//! What `ProcedureInfo` says about a running procedure (its step's name and attempt, last error, next retry, time in
//! step and in total, lock keys held or awaited with the holder), and its event history: each event that describes
//! a state change is in the record of that very write, the others ride on the next write, and the history stays
//! bounded however long the procedure runs.
//!
//! Tests marked `start_paused = true` run on tokio's paused clock and rely on it: time advances only when every task
//! is idle, so a retry delay of an hour elapses only once the test stops polling, and the polling loops below see the
//! procedure while it waits.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use procedures::event::MAX_EVENT_TEXT;
use procedures::record::{MAX_EVENTS, record_key};
use procedures::testing::StateStoreWrapper;
use procedures::{
    Condition, Context, Error, EventKind, LocalManager, LockKey, MemoryStateStore, Procedure,
    ProcedureId, ProcedureInfo, ProcedureManager, ProcedureRecord, ProcedureState, ProcedureWithId,
    Result, RetryPolicy, StateStore, Status, WriteOp, WriteOutcome,
};
use serde::{Deserialize, Serialize};

use crate::support::manager::{Env, Plan, TYPE, fast_config, within};

const NAMED: &str = "named";

/// Named steps `Fetch` (fails `failures` times with a retryable error of `error_len` bytes, then succeeds) and
/// `Store`, `steps` times over, each persisted; then done.
#[derive(Serialize, Deserialize)]
struct Named {
    at: u32,
    steps: u32,
    failures: u32,
    error_len: usize,
    #[serde(skip)]
    failed: Arc<AtomicU32>,
}

#[async_trait]
impl Procedure for Named {
    fn type_name(&self) -> &str {
        NAMED
    }

    async fn execute(&mut self, _ctx: &Context) -> Result<Status> {
        if self.at >= self.steps {
            return Ok(Status::done());
        }
        if self.at == 0 && self.failed.load(Ordering::SeqCst) < self.failures {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Err(Error::retry_later(format!(
                "broker busy {}",
                "x".repeat(self.error_len)
            )));
        }
        self.at += 1;
        Ok(Status::executing(true))
    }

    fn dump(&self) -> Result<serde_json::Value> {
        serde_json::to_value(self).map_err(Error::external)
    }

    fn lock_key(&self) -> LockKey {
        LockKey::exclusive("named")
    }

    fn step_name(&self) -> Option<String> {
        Some(
            if self.at.is_multiple_of(2) {
                "Fetch"
            } else {
                "Store"
            }
            .to_string(),
        )
    }
}

fn named(id: &str, steps: u32, failures: u32, error_len: usize) -> ProcedureWithId {
    ProcedureWithId::new(
        ProcedureId::new(id),
        Box::new(Named {
            at: 0,
            steps,
            failures,
            error_len,
            failed: Arc::new(AtomicU32::new(0)),
        }),
    )
}

/// A memory store that keeps every record value it was asked to write, in order.
#[derive(Default)]
struct Recording {
    inner: MemoryStateStore,
    written: Mutex<Vec<ProcedureRecord>>,
}

#[async_trait]
impl StateStoreWrapper for Recording {
    fn inner(&self) -> &dyn StateStore {
        &self.inner
    }

    async fn write(&self, conditions: Vec<Condition>, ops: Vec<WriteOp>) -> Result<WriteOutcome> {
        let records: Vec<ProcedureRecord> = ops
            .iter()
            .filter_map(|op| match op {
                WriteOp::Put { key, value } if key.starts_with("proc/") => {
                    serde_json::from_slice(value).ok()
                }
                _ => None,
            })
            .collect();
        let outcome = self.inner.write(conditions, ops).await?;
        if outcome == WriteOutcome::Applied {
            self.written.lock().unwrap().extend(records);
        }
        Ok(outcome)
    }
}

async fn started(store: Arc<dyn StateStore>, config: procedures::ManagerConfig) -> LocalManager {
    let m = LocalManager::new(store, config);
    m.register_loader(
        NAMED,
        Box::new(|data| {
            let p: Named = serde_json::from_value(data).map_err(Error::external)?;
            Ok(Box::new(p) as procedures::BoxedProcedure)
        }),
    )
    .unwrap();
    m.start().await.unwrap();
    m
}

async fn info(m: &LocalManager, id: &str) -> ProcedureInfo {
    m.procedure_state(&ProcedureId::new(id))
        .await
        .unwrap()
        .unwrap()
}

/// Polls (yielding to the runtime) until `id`'s information satisfies `check`.
async fn until(
    m: &LocalManager,
    id: &str,
    check: impl Fn(&ProcedureInfo) -> bool,
) -> ProcedureInfo {
    within(async {
        loop {
            if let Some(info) = m.procedure_state(&ProcedureId::new(id)).await.unwrap()
                && check(&info)
            {
                return info;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn a_retrying_step_shows_its_name_attempt_error_and_next_retry() {
    let store = Arc::new(MemoryStateStore::new());
    let mut config = fast_config();
    config.step_retry = RetryPolicy {
        max_retries: 5,
        initial_delay: Duration::from_secs(3600),
        max_delay: Duration::from_secs(3600),
        factor: 1.0,
    };
    let m = started(store.clone(), config).await;
    let mut w = m.submit(named("r", 2, 2, 8)).await.unwrap();

    let shown = until(&m, "r", |i| i.state == ProcedureState::Retrying).await;
    assert_eq!(shown.step_name.as_deref(), Some("Fetch"));
    assert_eq!(shown.attempt, 1);
    assert!(
        shown
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("broker busy")),
        "{shown:?}"
    );
    let now = procedures::record::now_ms();
    let next = shown.next_retry_at_ms.expect("next retry time");
    // Jitter may shorten the delay but an hour-long delay is still far ahead of now.
    assert!(next > now + 60_000, "next retry at {next}, now {now}");
    assert!(shown.step_started_at_ms.is_some());
    assert!(shown.step_ms(now).is_some());
    assert!(shown.total_ms(now) >= shown.step_ms(now).unwrap());
    assert_eq!(shown.locks_held.len(), 1, "{shown:?}");
    assert_eq!(shown.locks_held[0].key, "named");
    assert!(shown.locks_held[0].exclusive);
    assert_eq!(shown.lock_keys, shown.locks_held);
    assert!(matches!(
        shown.events.last().map(|e| &e.kind),
        Some(EventKind::Retry { attempt: 1, step: Some(s), .. }) if s == "Fetch"
    ));

    // After the first delay (an hour or more of the paused clock, jitter included: waited for without polling) the
    // second attempt fails too and counts 2; then the step succeeds and the next step starts afresh.
    let hours = |h: u64| Duration::from_secs(h * 3600);
    // The wall clock stands almost still while the paused one jumps: the delay left is `next - now`.
    let left = next.saturating_sub(procedures::record::now_ms());
    tokio::time::sleep(Duration::from_millis(left) + Duration::from_secs(60)).await;
    let shown = info(&m, "r").await;
    assert_eq!(
        (shown.attempt, shown.state, shown.step_name.as_deref()),
        (2, ProcedureState::Retrying, Some("Fetch"))
    );
    tokio::time::timeout(hours(5), w.wait())
        .await
        .expect("the procedure finishes after its two retries")
        .unwrap();
    let done = info(&m, "r").await;
    assert_eq!(done.state, ProcedureState::Done);
    assert_eq!(
        (done.attempt, done.last_error.clone(), done.next_retry_at_ms),
        (0, None, None)
    );
    assert!(done.locks_held.is_empty());
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_procedure_waiting_for_a_lock_names_the_key_and_the_holder() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(false);
    let m = LocalManager::new(store.clone(), fast_config());
    m.register_loader(TYPE, env.loader()).unwrap();
    m.start().await.unwrap();
    let holds = Plan {
        exclusive: vec!["table/7".into()],
        block_at: Some(0),
        ..Plan::steps(1, true)
    };
    let waits = Plan {
        exclusive: vec!["table/7".into()],
        ..Plan::steps(1, true)
    };
    let mut a = m.submit(env.with_id("a", holds)).await.unwrap();
    until(&m, "a", |i| !i.locks_held.is_empty()).await;
    let mut b = m.submit(env.with_id("b", waits)).await.unwrap();

    let waiting = until(&m, "b", |i| i.lock_wait.is_some()).await;
    let wait = waiting.lock_wait.clone().unwrap();
    assert_eq!(
        (wait.key.as_str(), wait.blocked_by.as_str()),
        ("table/7", "a")
    );
    assert!(wait.blocker_holds && wait.exclusive);
    assert!(waiting.locks_held.is_empty());
    assert!(
        waiting.events.iter().any(|e| matches!(
            &e.kind,
            EventKind::LockWaitBegan { key, holder } if key == "table/7" && holder.as_str() == "a"
        )),
        "{:?}",
        waiting.events
    );
    let listed = m.list_procedures().await.unwrap();
    let a_listed = listed.iter().find(|i| i.id.as_str() == "a").unwrap();
    assert_eq!(a_listed.locks_held[0].key, "table/7");

    env.gate.add_permits(1);
    within(a.wait()).await.unwrap();
    within(b.wait()).await.unwrap();
    // The wait's events, which change no state, rode on b's next write.
    let bytes = store.snapshot()[&record_key(&ProcedureId::new("b"))].clone();
    let record: ProcedureRecord = serde_json::from_slice(&bytes).unwrap();
    let kinds: Vec<&EventKind> = record.events.iter().map(|e| &e.kind).collect();
    assert!(
        kinds
            .iter()
            .any(|k| matches!(k, EventKind::LockWaitBegan { .. }))
            && kinds
                .iter()
                .any(|k| matches!(k, EventKind::LockWaitEnded { key, .. } if key == "table/7")),
        "{kinds:?}"
    );
    m.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn each_write_carries_the_event_of_the_change_it_makes() {
    let store = Arc::new(Recording::default());
    let m = started(store.clone(), fast_config()).await;
    let mut w = m.submit(named("h", 3, 1, 8)).await.unwrap();
    within(w.wait()).await.unwrap();

    let written = store.written.lock().unwrap().clone();
    // The submission, three persisted steps, done.
    assert_eq!(written.len(), 5, "{written:?}");
    for record in &written {
        let last = &record.events.last().expect("every record has events").kind;
        let describes = match (record.step, record.state) {
            (0, ProcedureState::Running) => matches!(last, EventKind::Submitted),
            (_, ProcedureState::Running) => matches!(last, EventKind::StepFinished { .. }),
            (_, ProcedureState::Done) => matches!(last, EventKind::Done),
            _ => false,
        };
        assert!(describes, "step {} {}: {last:?}", record.step, record.state);
        assert!(record.step_name.is_some());
        assert_eq!(record.lock_keys.len(), 1);
    }
    // A record only grows its history: the previous write's events are a prefix of this one's.
    for pair in written.windows(2) {
        assert!(pair[1].events.starts_with(&pair[0].events), "{pair:?}");
    }
    // The retry of the first step rode on the write of that step.
    assert!(
        written[1]
            .events
            .iter()
            .any(|e| matches!(e.kind, EventKind::Retry { .. })),
        "{:?}",
        written[1].events
    );
    m.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_history_and_the_record_stay_bounded() {
    let store = Arc::new(Recording::default());
    let mut config = fast_config();
    config.step_retry.max_retries = 40;
    // 30 failures with a 10 kB error each, then 300 persisted steps.
    let m = started(store.clone(), config).await;
    let mut w = m.submit(named("long", 300, 30, 10_000)).await.unwrap();
    within(w.wait()).await.unwrap();

    let written = store.written.lock().unwrap().clone();
    let size = |r: &ProcedureRecord| serde_json::to_vec(r).unwrap().len();
    let first = size(&written[0]);
    let largest = written.iter().map(size).max().unwrap();
    let last = written.last().unwrap();
    println!(
        "record growth: submission {first} B, largest {largest} B, final {} B ({} events, {} writes)",
        size(last),
        last.events.len(),
        written.len()
    );
    assert_eq!(last.events.len(), MAX_EVENTS);
    assert!(written.iter().all(|r| r.events.len() <= MAX_EVENTS));
    for event in written.iter().flat_map(|r| &r.events) {
        if let EventKind::Retry { error, .. } = &event.kind {
            assert!(error.len() <= MAX_EVENT_TEXT, "{}", error.len());
        }
    }
    // Every event is at most its text plus a little JSON: the record never grows past that.
    let bound = first + MAX_EVENTS * (MAX_EVENT_TEXT + 160);
    assert!(
        largest <= bound,
        "largest record {largest} B > bound {bound} B"
    );
    // Once the history is full, a later record is no larger than one written a hundred steps earlier (give or take
    // a few digits of counters and durations).
    let at_200 = size(&written[200]);
    assert!(
        size(last).abs_diff(at_200) < 200,
        "record at write 200: {at_200} B, final: {} B",
        size(last)
    );
    m.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_recovered_procedure_records_the_epoch_that_recovered_it() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(false);
    let m = LocalManager::new(store.clone(), fast_config());
    m.register_loader(TYPE, env.loader()).unwrap();
    m.start().await.unwrap();
    let plan = Plan {
        block_at: Some(1),
        ..Plan::steps(2, true)
    };
    let _w = m.submit(env.with_id("p", plan)).await.unwrap();
    until(&m, "p", |i| i.step >= 1).await;
    m.stop().await.unwrap();

    let m2 = LocalManager::new(store.clone(), fast_config());
    m2.register_loader(TYPE, env.loader()).unwrap();
    m2.start().await.unwrap();
    let epoch = m2.epoch().unwrap();
    env.gate.add_permits(10);
    within(
        m2.watch(&ProcedureId::new("p"))
            .await
            .unwrap()
            .unwrap()
            .wait(),
    )
    .await
    .unwrap();
    let bytes = store.snapshot()[&record_key(&ProcedureId::new("p"))].clone();
    let record: ProcedureRecord = serde_json::from_slice(&bytes).unwrap();
    assert!(
        record
            .events
            .iter()
            .any(|e| e.kind == EventKind::Recovered { epoch }),
        "{:?}",
        record.events
    );
    m2.stop().await.unwrap();
}

#[tokio::test]
async fn a_fenced_manager_notes_the_newer_epoch_in_the_history_without_writing_it() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(false);
    let m1 = LocalManager::new(store.clone(), fast_config());
    m1.register_loader(TYPE, env.loader()).unwrap();
    m1.start().await.unwrap();
    let plan = Plan {
        block_at: Some(0),
        ..Plan::steps(1, true)
    };
    let _w = m1.submit(env.with_id("f", plan)).await.unwrap();
    until(&m1, "f", |i| i.attempt == 1).await;

    // A newer manager claims the store; it has no loader, so it only fences m1 (the record stalls there).
    let m2 = LocalManager::new(store.clone(), fast_config());
    m2.start().await.unwrap();
    let newer = m2.epoch().unwrap();
    let before = store.snapshot()[&record_key(&ProcedureId::new("f"))].clone();
    // m1's step finishes and its write is refused: m1 halts.
    env.gate.add_permits(1);
    let fenced = until(&m1, "f", |i| {
        i.events
            .iter()
            .any(|e| e.kind == EventKind::Fenced { epoch: newer })
    })
    .await;
    assert!(!fenced.state.is_finished(), "{fenced:?}");
    assert_eq!(
        store.snapshot()[&record_key(&ProcedureId::new("f"))],
        before,
        "a fenced manager wrote"
    );
    m1.stop().await.unwrap();
    m2.stop().await.unwrap();
}

/// Keeps what a [`procedures::ProcedureObserver`] is told: `(type, step, elapsed)` per finished step, `(type, step,
/// error)` per retry.
#[derive(Debug, Default)]
struct Observed {
    steps: Mutex<Vec<(String, Option<String>, Duration)>>,
    retries: Mutex<Vec<(String, Option<String>, String)>>,
}

impl procedures::ProcedureObserver for Observed {
    fn step_finished(&self, type_name: &str, step: Option<&str>, elapsed: Duration) {
        self.steps
            .lock()
            .unwrap()
            .push((type_name.to_string(), step.map(str::to_string), elapsed));
    }

    fn retried(&self, type_name: &str, step: Option<&str>, error: &str) {
        self.retries.lock().unwrap().push((
            type_name.to_string(),
            step.map(str::to_string),
            error.to_string(),
        ));
    }
}

#[tokio::test(start_paused = true)]
async fn the_observer_is_told_of_each_finished_step_and_each_retry() {
    let m = started(Arc::new(MemoryStateStore::new()), fast_config()).await;
    let observed = Arc::new(Observed::default());
    m.set_observer(observed.clone());
    let mut w = m.submit(named("o", 3, 2, 4)).await.unwrap();
    within(w.wait()).await.unwrap();

    let steps = observed.steps.lock().unwrap().clone();
    let names: Vec<(&str, Option<&str>)> = steps
        .iter()
        .map(|(t, s, _)| (t.as_str(), s.as_deref()))
        .collect();
    // Fetch, Store, Fetch, then the step that returns done (named Store: it runs at an odd position).
    assert_eq!(
        names,
        vec![
            (NAMED, Some("Fetch")),
            (NAMED, Some("Store")),
            (NAMED, Some("Fetch")),
            (NAMED, Some("Store")),
        ]
    );
    let retries = observed.retries.lock().unwrap().clone();
    assert_eq!(retries.len(), 2, "{retries:?}");
    for (type_name, step, error) in &retries {
        assert_eq!(type_name, NAMED);
        assert_eq!(step.as_deref(), Some("Fetch"));
        assert!(error.starts_with("broker busy"), "{error}");
    }
    // The elapsed time handed over is the one the history records.
    let info = info(&m, "o").await;
    let recorded: Vec<u64> = info
        .events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::StepFinished { duration_ms, .. } => Some(duration_ms),
            _ => None,
        })
        .collect();
    let observed_ms: Vec<u64> = steps.iter().map(|(_, _, d)| d.as_millis() as u64).collect();
    assert_eq!(recorded, observed_ms);
    m.stop().await.unwrap();
}
