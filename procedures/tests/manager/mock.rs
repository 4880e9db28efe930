//! The exact writes `LocalManager` makes, checked against a mocked `StateStore`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::manager::{Env, Plan, TYPE, fast_config, within};
use procedures::control::CONTROL_PREFIX;
use procedures::record::{EPOCH_KEY, RECORD_PREFIX};
use procedures::{
    Condition, Error, LocalManager, ManagerConfig, ProcedureId, ProcedureManager, ProcedureRecord,
    ProcedureState, Result, StateStore, WriteOp, WriteOutcome,
};

mockall::mock! {
    pub Store {}
    #[async_trait::async_trait]
    impl StateStore for Store {
        async fn get(&self, key: &str) -> Result<Option<Vec<u8>>>;
        async fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>>;
        async fn put(&self, key: &str, value: Vec<u8>) -> Result<()>;
        async fn delete(&self, keys: &[String]) -> Result<()>;
        async fn write(&self, conditions: Vec<Condition>, ops: Vec<WriteOp>) -> Result<WriteOutcome>;
    }
}

/// How the mocked store answers one write.
#[derive(Clone, Copy, Debug)]
enum Reply {
    Applied,
    /// Refused: the epoch is now this.
    RejectEpoch(u64),
    StoreError {
        retryable: bool,
    },
    /// An injected crash (after the write was applied, as far as the manager can tell).
    Crashed,
}

type Writes = Arc<Mutex<Vec<(Vec<Condition>, Vec<WriteOp>)>>>;

/// The control keys of a mocked store (`control/…`): the mock answers their reads from here, and applied writes
/// update them, so the manager's control reads and polls see what was written.
type Controls = Arc<Mutex<std::collections::BTreeMap<String, Vec<u8>>>>;

/// Lets `mock` answer the manager's reads of control keys (a runner's `get` at each step boundary, the poll's
/// `scan`) from `controls`.
fn expect_control_reads(mock: &mut MockStore, controls: &Controls) {
    let read = controls.clone();
    mock.expect_get()
        .withf(|key| key.starts_with(CONTROL_PREFIX))
        .returning(move |key| Ok(read.lock().unwrap().get(key).cloned()));
    let scanned = controls.clone();
    mock.expect_scan()
        .withf(|prefix| prefix == CONTROL_PREFIX)
        .returning(move |_| {
            Ok(scanned
                .lock()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect())
        });
}

/// Applies the control-key ops of an applied write to `controls`.
fn apply_controls(controls: &Controls, ops: &[WriteOp]) {
    let mut controls = controls.lock().unwrap();
    for op in ops {
        match op {
            WriteOp::Put { key, value } if key.starts_with(CONTROL_PREFIX) => {
                controls.insert(key.clone(), value.clone());
            }
            WriteOp::Delete { key } if key.starts_with(CONTROL_PREFIX) => {
                controls.remove(key);
            }
            _ => {}
        }
    }
}

/// Applies the record ops of an applied write to `records`.
fn apply_records(records: &Controls, ops: &[WriteOp]) {
    let mut records = records.lock().unwrap();
    for op in ops {
        match op {
            WriteOp::Put { key, value } if key.starts_with(RECORD_PREFIX) => {
                records.insert(key.clone(), value.clone());
            }
            WriteOp::Delete { key } if key.starts_with(RECORD_PREFIX) => {
                records.remove(key);
            }
            _ => {}
        }
    }
}

/// A mocked store that holds epoch `previous`, no records, answers writes in `replies` order (then `Applied`),
/// and records every write.
fn store(previous: Option<u64>, replies: Vec<Reply>) -> (Arc<MockStore>, Writes) {
    let (mock, writes, _) = store_with_controls(previous, replies);
    (mock, writes)
}

/// [`store`], also returning its control keys.
fn store_with_controls(
    previous: Option<u64>,
    replies: Vec<Reply>,
) -> (Arc<MockStore>, Writes, Controls) {
    let writes: Writes = Arc::default();
    let controls: Controls = Arc::default();
    let replies = Arc::new(Mutex::new(VecDeque::from(replies)));
    let mut mock = MockStore::new();
    expect_control_reads(&mut mock, &controls);
    mock.expect_get()
        .withf(|key| key == EPOCH_KEY)
        .returning(move |_| Ok(previous.map(|e| e.to_string().into_bytes())));
    // The records the applied writes left: recovery finds none (it runs before any write), a retention sweep
    // reads what was written.
    let records: Controls = Arc::default();
    let scanned = records.clone();
    mock.expect_scan()
        .withf(|prefix| prefix == RECORD_PREFIX)
        .returning(move |_| {
            Ok(scanned
                .lock()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect())
        });
    let recorded = writes.clone();
    let applied = controls.clone();
    mock.expect_write().returning(move |conditions, ops| {
        recorded.lock().unwrap().push((conditions, ops.clone()));
        match replies
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Reply::Applied)
        {
            Reply::Applied => {
                apply_controls(&applied, &ops);
                apply_records(&records, &ops);
                Ok(WriteOutcome::Applied)
            }
            Reply::RejectEpoch(epoch) => Ok(WriteOutcome::Rejected {
                current: vec![(EPOCH_KEY.into(), Some(epoch.to_string().into_bytes()))],
            }),
            Reply::Crashed => Err(procedures::testing::injected_crash("after write")),
            Reply::StoreError { retryable } => Err(Error::Store {
                action: "write",
                key: "proc/p".into(),
                source: "backend unavailable".into(),
                retryable,
            }),
        }
    });
    (Arc::new(mock), writes, controls)
}

async fn started(store: &Arc<MockStore>, config: ManagerConfig, env: &Arc<Env>) -> LocalManager {
    let manager = LocalManager::new(store.clone(), config);
    manager.register_loader(TYPE, env.loader()).unwrap();
    manager.start().await.unwrap();
    manager
}

fn epoch_condition(epoch: u64) -> Condition {
    Condition::Equals {
        key: EPOCH_KEY.into(),
        value: epoch.to_string().into_bytes(),
    }
}

/// The record a write puts at `proc/p`.
fn put_record(ops: &[WriteOp]) -> ProcedureRecord {
    match ops {
        [WriteOp::Put { key, value }] => {
            assert_eq!(key, "proc/p");
            serde_json::from_slice(value).unwrap()
        }
        other => panic!("expected one put of proc/p, got {other:?}"),
    }
}

/// The record writes after the epoch claim: (step, state, error) of each, each checked to be conditional on the
/// epoch (and, for the submission, on the record being absent).
fn record_writes(writes: &Writes, epoch: u64) -> Vec<ProcedureRecord> {
    let writes = writes.lock().unwrap();
    writes[1..]
        .iter()
        .map(|(conditions, ops)| {
            let record = put_record(ops);
            let mut expected = vec![epoch_condition(epoch)];
            if record.step == 0 {
                expected.push(Condition::Absent {
                    key: "proc/p".into(),
                });
            }
            assert_eq!(conditions, &expected, "conditions of step {}", record.step);
            record
        })
        .collect()
}

fn steps_states(records: &[ProcedureRecord]) -> Vec<(u64, ProcedureState)> {
    records.iter().map(|r| (r.step, r.state)).collect()
}

#[tokio::test]
async fn start_claims_the_next_epoch_with_a_compare_and_set() {
    let env = Env::new(true);
    let (fresh, writes) = store(None, vec![]);
    let m = started(&fresh, fast_config(), &env).await;
    assert_eq!(m.epoch(), Some(1));
    assert_eq!(
        writes.lock().unwrap()[0],
        (
            vec![Condition::Absent {
                key: EPOCH_KEY.into()
            }],
            vec![WriteOp::Put {
                key: EPOCH_KEY.into(),
                value: b"1".to_vec()
            }]
        )
    );

    let (claimed, writes) = store(Some(7), vec![]);
    let m = started(&claimed, fast_config(), &env).await;
    assert_eq!(m.epoch(), Some(8));
    assert_eq!(
        writes.lock().unwrap()[0],
        (
            vec![epoch_condition(7)],
            vec![WriteOp::Put {
                key: EPOCH_KEY.into(),
                value: b"8".to_vec()
            }]
        )
    );
}

#[tokio::test]
async fn only_persisting_steps_are_written() {
    for persist in [false, true] {
        let env = Env::new(true);
        let (store, writes) = store(Some(4), vec![]);
        let m = started(&store, fast_config(), &env).await;
        let mut w = m
            .submit(env.with_id("p", Plan::steps(2, persist)))
            .await
            .unwrap();
        within(w.wait()).await.unwrap();
        let records = record_writes(&writes, 5);
        let expected = if persist {
            vec![
                (0, ProcedureState::Running),
                (1, ProcedureState::Running),
                (2, ProcedureState::Running),
                (3, ProcedureState::Done),
            ]
        } else {
            vec![(0, ProcedureState::Running), (1, ProcedureState::Done)]
        };
        assert_eq!(steps_states(&records), expected, "persist = {persist}");
        // The submission holds the initial data; each persisted step the data dumped after it.
        assert_eq!(records[0].data["at"], 0);
        assert_eq!(records[0].type_name, TYPE);
        if persist {
            assert_eq!(records[1].data["at"], 1);
            assert_eq!(records[2].data["at"], 2);
        }
        let done = records.last().unwrap();
        assert_eq!(done.output, Some(serde_json::json!({ "steps": 2 })));
        assert_eq!(done.error, None);
    }
}

#[tokio::test]
async fn a_failure_writes_the_failed_record() {
    let env = Env::new(true);
    let (store, writes) = store(Some(1), vec![]);
    let m = started(&store, fast_config(), &env).await;
    let plan = Plan {
        fail: true,
        ..Plan::steps(1, true)
    };
    let mut w = m.submit(env.with_id("p", plan)).await.unwrap();
    assert!(within(w.wait()).await.is_err());
    let records = record_writes(&writes, 2);
    assert_eq!(
        steps_states(&records),
        [
            (0, ProcedureState::Running),
            (1, ProcedureState::Running),
            (2, ProcedureState::Failed)
        ]
    );
    assert_eq!(records[2].error.as_deref(), Some("step refused for good"));
}

#[tokio::test]
async fn a_rollback_writes_rolling_back_then_failed() {
    let env = Env::new(true);
    let (store, writes) = store(Some(1), vec![]);
    let m = started(&store, fast_config(), &env).await;
    let plan = Plan {
        fail: true,
        rollback: true,
        ..Plan::steps(0, true)
    };
    let mut w = m.submit(env.with_id("p", plan)).await.unwrap();
    assert!(within(w.wait()).await.is_err());
    let records = record_writes(&writes, 2);
    assert_eq!(
        steps_states(&records),
        [
            (0, ProcedureState::Running),
            (1, ProcedureState::RollingBack),
            (2, ProcedureState::Failed)
        ]
    );
    assert_eq!(records[1].error.as_deref(), Some("step refused for good"));
    assert_eq!(
        records[2].error.as_deref(),
        Some("step refused for good (rolled back)")
    );
}

#[tokio::test]
async fn retention_deletes_the_finished_record_under_the_epoch() {
    let env = Env::new(true);
    let (store, writes) = store(Some(1), vec![]);
    let config = ManagerConfig {
        retention: Duration::ZERO,
        retention_check_interval: Duration::from_millis(5),
        ..fast_config()
    };
    let m = started(&store, config, &env).await;
    let mut w = m
        .submit(env.with_id("p", Plan::steps(0, true)))
        .await
        .unwrap();
    within(w.wait()).await.unwrap();
    within(async {
        while writes.lock().unwrap().len() < 4 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    // Gone from memory with its record; a later sweep finds nothing more to delete: a second procedure, finished
    // after, is deleted by a sweep that runs after the first one's, and nothing of `p` is written again meanwhile.
    within(async {
        while !m.list_procedures().await.unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let mut later = m
        .submit(env.with_id("q", Plan::steps(0, true)))
        .await
        .unwrap();
    within(later.wait()).await.unwrap();
    within(async {
        while writes.lock().unwrap().len() < 7 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let writes = writes.lock().unwrap();
    assert_eq!(
        writes[6].1,
        vec![WriteOp::Delete {
            key: "proc/q".into()
        }],
        "{writes:?}"
    );
    // Epoch claim, submission, done, delete; then q's submission, done, delete.
    assert_eq!(
        writes[3],
        (
            vec![epoch_condition(2)],
            vec![WriteOp::Delete {
                key: "proc/p".into()
            }]
        )
    );
    assert_eq!(writes.len(), 7, "{writes:?}");
}

#[tokio::test]
async fn a_refused_epoch_fences_the_manager() {
    let env = Env::new(true);
    // Epoch claim and submission applied; the first step's write finds epoch 9.
    let (store, writes) = store(
        Some(1),
        vec![Reply::Applied, Reply::Applied, Reply::RejectEpoch(9)],
    );
    let m = started(&store, fast_config(), &env).await;
    let mut w = m
        .submit(env.with_id("p", Plan::steps(3, true)))
        .await
        .unwrap();
    let err = within(w.wait()).await.unwrap_err();
    assert!(matches!(err, Error::ManagerNotRunning { .. }), "{err}");
    // No write after the refused one.
    assert_eq!(writes.lock().unwrap().len(), 3);
    let refused = m.submit(env.with_id("q", Plan::steps(1, true))).await;
    assert_eq!(
        refused.unwrap_err().to_string(),
        "fenced by epoch 9: this manager holds epoch 2 and may no longer write procedure state"
    );
    assert_eq!(writes.lock().unwrap().len(), 3);
    // The procedure shows its last persisted step.
    let info = m
        .procedure_state(&ProcedureId::new("p"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((info.step, info.state), (0, ProcedureState::Running));
}

#[tokio::test]
async fn a_retryable_store_error_is_retried() {
    let env = Env::new(true);
    let (store, writes) = store(
        Some(1),
        vec![
            Reply::Applied,
            Reply::Applied,
            Reply::StoreError { retryable: true },
            Reply::StoreError { retryable: true },
        ],
    );
    let m = started(&store, fast_config(), &env).await;
    let mut w = m
        .submit(env.with_id("p", Plan::steps(1, true)))
        .await
        .unwrap();
    within(w.wait()).await.unwrap();
    let records = record_writes(&writes, 2);
    // Step 1 was attempted three times, the same record each time.
    assert_eq!(
        steps_states(&records),
        [
            (0, ProcedureState::Running),
            (1, ProcedureState::Running),
            (1, ProcedureState::Running),
            (1, ProcedureState::Running),
            (2, ProcedureState::Done)
        ]
    );
}

#[tokio::test]
async fn a_store_error_that_persists_stops_the_procedure_without_writes() {
    for replies in [
        vec![Reply::StoreError { retryable: false }],
        // max_retries = 3: the first attempt and three retries all fail.
        vec![Reply::StoreError { retryable: true }; 4],
    ] {
        let env = Env::new(true);
        let mut all = vec![Reply::Applied, Reply::Applied];
        all.extend(replies.iter().copied());
        let (store, writes) = store(Some(1), all);
        let m = started(&store, fast_config(), &env).await;
        let mut w = m
            .submit(env.with_id("p", Plan::steps(3, true)))
            .await
            .unwrap();
        let err = within(w.wait()).await.unwrap_err().to_string();
        assert!(err.contains("backend unavailable"), "{err}");
        assert_eq!(
            writes.lock().unwrap().len(),
            2 + replies.len(),
            "{replies:?}"
        );
        let info = m
            .procedure_state(&ProcedureId::new("p"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((info.step, info.state), (0, ProcedureState::Stalled));
        let error = info.error.unwrap();
        assert!(
            error.contains("state store failed to write 'proc/p': backend unavailable"),
            "{error}"
        );
        // The manager itself still runs: another procedure is accepted.
        assert!(
            m.submit(env.with_id("q", Plan::steps(0, true)))
                .await
                .is_ok()
        );
    }
}

#[tokio::test]
async fn a_crashed_write_halts_the_manager_without_another_write() {
    let env = Env::new(true);
    let (store, writes) = store(
        Some(1),
        vec![Reply::Applied, Reply::Applied, Reply::Crashed],
    );
    let m = started(&store, fast_config(), &env).await;
    let mut w = m
        .submit(env.with_id("p", Plan::steps(3, true)))
        .await
        .unwrap();
    let err = within(w.wait()).await.unwrap_err();
    assert!(matches!(err, Error::ManagerNotRunning { .. }), "{err}");
    assert_eq!(writes.lock().unwrap().len(), 3);
    let refused = m.submit(env.with_id("q", Plan::steps(1, true))).await;
    assert!(matches!(refused, Err(Error::ManagerNotRunning { .. })));
    assert_eq!(writes.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn a_persisted_suspension_writes_the_parent_and_its_children_in_one_write() {
    let env = Env::new(true);
    let (store, writes) = store(Some(1), vec![]);
    let m = started(&store, fast_config(), &env).await;
    let parent = Plan {
        children: vec![
            ("c1".into(), Plan::steps(0, true)),
            ("c2".into(), Plan::steps(0, true)),
        ],
        ..Plan::steps(0, true)
    };
    let mut w = m.submit(env.with_id("p", parent)).await.unwrap();
    within(w.wait()).await.unwrap();
    let writes = writes.lock().unwrap();
    // Epoch claim, submission, then the suspension: one write, conditional on the epoch and on each child's key
    // being absent, putting the parent's next record and each child's submission record.
    let (conditions, ops) = &writes[2];
    assert_eq!(
        conditions,
        &vec![
            epoch_condition(2),
            Condition::Absent {
                key: "proc/p/c1".into()
            },
            Condition::Absent {
                key: "proc/p/c2".into()
            },
        ]
    );
    let puts: Vec<(&str, ProcedureRecord)> = ops
        .iter()
        .map(|op| match op {
            WriteOp::Put { key, value } => (key.as_str(), serde_json::from_slice(value).unwrap()),
            other => panic!("expected puts only, got {other:?}"),
        })
        .collect();
    let keys: Vec<&str> = puts.iter().map(|(key, _)| *key).collect();
    assert_eq!(keys, ["proc/p", "proc/p/c1", "proc/p/c2"]);
    let suspended = &puts[0].1;
    assert_eq!(
        (suspended.step, suspended.state),
        (1, ProcedureState::Running)
    );
    assert_eq!(
        suspended.waiting_for,
        [ProcedureId::new("p/c1"), ProcedureId::new("p/c2")]
    );
    assert_eq!(suspended.format_version, 2);
    assert_eq!(suspended.data["children_started"], true);
    for (_, child) in &puts[1..] {
        assert_eq!((child.step, child.state), (0, ProcedureState::Running));
        assert_eq!(child.parent_id, Some(ProcedureId::new("p")));
        assert!(child.waiting_for.is_empty());
        assert_eq!(child.format_version, 1);
    }
    // Each child then finishes with one write of its own, and the parent with its done record (its waiting list
    // cleared): no other submission write for the children.
    let rest: Vec<(String, u64, ProcedureState, usize)> = writes[3..]
        .iter()
        .map(|(conditions, ops)| match ops.as_slice() {
            [WriteOp::Put { key, value }] => {
                let r: ProcedureRecord = serde_json::from_slice(value).unwrap();
                assert_eq!(conditions, &vec![epoch_condition(2)], "{key}");
                (key.clone(), r.step, r.state, r.waiting_for.len())
            }
            other => panic!("expected one put, got {other:?}"),
        })
        .collect();
    let mut children: Vec<_> = rest[..2].to_vec();
    children.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        children,
        [
            ("proc/p/c1".to_string(), 1, ProcedureState::Done, 0),
            ("proc/p/c2".to_string(), 1, ProcedureState::Done, 0),
        ]
    );
    assert_eq!(
        rest[2..],
        [("proc/p".to_string(), 2, ProcedureState::Done, 0)]
    );
}

/// A mocked store (epoch 1, no records) whose writes fail with a retryable error while `down` is set.
fn switchable_store(down: Arc<std::sync::atomic::AtomicBool>) -> (Arc<MockStore>, Writes) {
    let writes: Writes = Arc::default();
    let mut mock = MockStore::new();
    expect_control_reads(&mut mock, &Controls::default());
    mock.expect_get()
        .withf(|key| key == EPOCH_KEY)
        .returning(|_| Ok(Some(b"1".to_vec())));
    // A procedure the manager does not know yet (its submission not reserved yet) is looked up in the store, which
    // holds none before the submission write applies (the manager knows it from then on).
    mock.expect_get()
        .withf(|key| key.starts_with(RECORD_PREFIX))
        .returning(|_| Ok(None));
    // Recovery finds no record; a listing reads the store for finished procedures the manager no longer holds, of
    // which there are none (the one procedure of this test is in memory throughout).
    mock.expect_scan()
        .withf(|prefix| prefix == RECORD_PREFIX)
        .returning(|_| Ok(Vec::new()));
    let recorded = writes.clone();
    mock.expect_write().returning(move |conditions, ops| {
        let key = ops
            .first()
            .map(|op| op.key().to_string())
            .unwrap_or_default();
        recorded.lock().unwrap().push((conditions, ops));
        if down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Store {
                action: "write",
                key,
                source: "backend unavailable".into(),
                retryable: true,
            });
        }
        Ok(WriteOutcome::Applied)
    });
    (Arc::new(mock), writes)
}

/// Waits until procedure `id` shows `state`, and returns what it shows.
async fn until_state(
    m: &LocalManager,
    id: &str,
    state: ProcedureState,
) -> procedures::ProcedureInfo {
    within(async {
        loop {
            if let Some(info) = m.procedure_state(&ProcedureId::new(id)).await.unwrap()
                && info.state == state
            {
                return info;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
}

#[tokio::test]
async fn a_retried_store_write_shows_the_procedure_retrying_with_the_store_error() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let down = Arc::new(AtomicBool::new(false));
    let (store, writes) = switchable_store(down.clone());
    let config = ManagerConfig {
        store_retry: procedures::RetryPolicy {
            max_retries: 100_000,
            ..fast_config().store_retry
        },
        ..fast_config()
    };
    let m = Arc::new(started(&store, config, &Env::new(true)).await);
    let env = Env::new(false);
    // The procedure blocks at its first step until the gate opens.
    let plan = Plan {
        block_at: Some(0),
        ..Plan::steps(1, true)
    };

    // The epoch claim went through; now the store goes down and the submission write is retried.
    down.store(true, Ordering::SeqCst);
    let submit = {
        let (m, procedure) = (m.clone(), env.with_id("p", plan));
        tokio::spawn(async move { m.submit(procedure).await })
    };
    let retrying = until_state(&m, "p", ProcedureState::Retrying).await;
    assert_eq!(retrying.step, 0);
    assert_eq!(
        retrying.error.as_deref(),
        Some("state store failed to write 'proc/p': backend unavailable")
    );
    let listed = m.list_procedures().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].state, ProcedureState::Retrying);
    assert!(listed[0].error.is_some());

    down.store(false, Ordering::SeqCst);
    let mut watcher = within(submit).await.unwrap().unwrap();
    // Written: running again at step 0, the error gone (the step is blocked at the gate).
    let info = m
        .procedure_state(&ProcedureId::new("p"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((info.step, info.state), (0, ProcedureState::Running));
    assert_eq!(info.error, None);

    // The step's write is retried the same way.
    let before = writes.lock().unwrap().len();
    down.store(true, Ordering::SeqCst);
    env.gate.add_permits(1);
    let retrying = until_state(&m, "p", ProcedureState::Retrying).await;
    assert_eq!(retrying.step, 0);
    assert_eq!(
        retrying.error.as_deref(),
        Some("state store failed to write 'proc/p': backend unavailable")
    );
    assert!(writes.lock().unwrap().len() > before);
    down.store(false, Ordering::SeqCst);
    assert_eq!(
        within(watcher.wait()).await.unwrap(),
        Some(serde_json::json!({ "steps": 1 }))
    );
    let done = m
        .procedure_state(&ProcedureId::new("p"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((done.step, done.state), (2, ProcedureState::Done));
    assert_eq!(done.error, None);
}

/// A store whose reads of the control keys (a step boundary's scan, the poll's) fail (retryably) while `down` is
/// set; every other call answers.
fn store_with_failing_control_reads(down: Arc<std::sync::atomic::AtomicBool>) -> Arc<MockStore> {
    let mut mock = MockStore::new();
    mock.expect_get()
        .withf(|key| key.starts_with(CONTROL_PREFIX))
        .returning(|_| Ok(None));
    mock.expect_scan()
        .withf(|prefix| prefix == CONTROL_PREFIX)
        .returning(move |prefix| {
            if down.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(Error::Store {
                    action: "scan",
                    key: prefix.to_string(),
                    source: "backend unavailable".into(),
                    retryable: true,
                });
            }
            Ok(Vec::new())
        });
    mock.expect_get()
        .withf(|key| key == EPOCH_KEY)
        .returning(|_| Ok(Some(b"1".to_vec())));
    // A procedure the manager does not know yet (its submission not reserved yet) is looked up in the store, which
    // holds none before the submission write applies (the manager knows it from then on).
    mock.expect_get()
        .withf(|key| key.starts_with(RECORD_PREFIX))
        .returning(|_| Ok(None));
    // Recovery finds no record; a listing reads the store for finished procedures the manager no longer holds, of
    // which there are none (the one procedure of this test is in memory throughout).
    mock.expect_scan()
        .withf(|prefix| prefix == RECORD_PREFIX)
        .returning(|_| Ok(Vec::new()));
    mock.expect_write()
        .returning(|_, _| Ok(WriteOutcome::Applied));
    Arc::new(mock)
}

#[tokio::test]
async fn a_retried_control_read_at_a_step_boundary_shows_the_procedure_retrying_with_the_store_error()
 {
    use std::sync::atomic::{AtomicBool, Ordering};
    let down = Arc::new(AtomicBool::new(false));
    let store = store_with_failing_control_reads(down.clone());
    let config = ManagerConfig {
        store_retry: procedures::RetryPolicy {
            max_retries: 100_000,
            ..fast_config().store_retry
        },
        ..fast_config()
    };
    let m = Arc::new(started(&store, config, &Env::new(true)).await);
    let env = Env::new(false);
    // Two persisted steps; the first waits at the gate.
    let plan = Plan {
        block_at: Some(0),
        ..Plan::steps(2, true)
    };
    let mut watcher = m.submit(env.with_id("p", plan)).await.unwrap();
    until_state(&m, "p", ProcedureState::Running).await;
    // Its first step is entered (past the boundary's read) before the store goes down.
    within(async {
        while !env.events().contains(&"enter p at 0".to_string()) {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    })
    .await;

    // The store stops answering reads; the first step ends and the boundary before the second reads the control
    // keys: the procedure shows the read's error while it is retried, not a silent `running`.
    down.store(true, Ordering::SeqCst);
    env.gate.add_permits(1);
    let retrying = until_state(&m, "p", ProcedureState::Retrying).await;
    assert_eq!(retrying.step, 1);
    assert_eq!(
        retrying.error.as_deref(),
        Some("state store failed to scan 'control/': backend unavailable")
    );

    // The store answers again: the procedure goes on and finishes, the error gone.
    down.store(false, Ordering::SeqCst);
    assert_eq!(
        within(watcher.wait()).await.unwrap(),
        Some(serde_json::json!({ "steps": 2 }))
    );
    let done = m
        .procedure_state(&ProcedureId::new("p"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.state, ProcedureState::Done);
    assert_eq!(done.error, None);
}

/// Each write after the epoch claim, as text: its ops (`put proc/p 2 paused`, `put control/proc/p pause`,
/// `delete control/proc/p`), each write checked to be conditional on the epoch (and a submission on its key
/// being absent) and on nothing else.
fn described_writes(writes: &Writes, epoch: u64) -> Vec<String> {
    let writes = writes.lock().unwrap();
    writes[1..]
        .iter()
        .map(|(conditions, ops)| {
            let mut expected = vec![epoch_condition(epoch)];
            let text: Vec<String> = ops
                .iter()
                .map(|op| match op {
                    WriteOp::Put { key, value } if key.starts_with(RECORD_PREFIX) => {
                        let r: ProcedureRecord = serde_json::from_slice(value).unwrap();
                        if r.step == 0 {
                            expected.push(Condition::Absent { key: key.clone() });
                        }
                        format!("put {key} {} {}", r.step, r.state)
                    }
                    WriteOp::Put { key, value } => {
                        let v: serde_json::Value = serde_json::from_slice(value).unwrap();
                        format!("put {key} {}", v["action"].as_str().unwrap())
                    }
                    WriteOp::Delete { key } => format!("delete {key}"),
                })
                .collect();
            assert_eq!(conditions, &expected, "conditions of {text:?}");
            text.join(" + ")
        })
        .collect()
}

fn gated_plan(rollback: bool) -> Plan {
    Plan {
        steps: 2,
        persist: true,
        block_at: Some(1),
        rollback,
        ..Plan::default()
    }
}

/// Waits until the step at `at` of `p` is entered (it blocks at the closed gate).
async fn until_entered(env: &Env, at: u32) {
    let entered = format!("enter p at {at}");
    within(async {
        while !env.events().contains(&entered) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
}

#[tokio::test]
async fn pause_and_resume_write_the_control_key_then_the_paused_and_running_records() {
    let env = Env::new(false);
    let (store, writes, _) = store_with_controls(Some(1), vec![]);
    let m = started(&store, fast_config(), &env).await;
    let id = ProcedureId::new("p");
    let mut w = m.submit(env.with_id("p", gated_plan(false))).await.unwrap();
    until_entered(&env, 1).await;
    m.pause(&id).await.unwrap();
    env.gate.add_permits(10);
    until_state(&m, "p", ProcedureState::Paused).await;
    m.resume(&id).await.unwrap();
    within(w.wait()).await.unwrap();
    assert_eq!(
        described_writes(&writes, 2),
        [
            "put proc/p 0 running",
            "put proc/p 1 running",
            "put control/proc/p pause",
            "put proc/p 2 running",
            "put proc/p 3 paused",
            "delete control/proc/p",
            "put proc/p 4 running",
            "put proc/p 5 done",
        ]
    );
}

#[tokio::test]
async fn cancel_writes_the_control_key_then_rolling_back_then_cancelled_with_the_key_deleted() {
    let env = Env::new(false);
    let (store, writes, controls) = store_with_controls(Some(1), vec![]);
    let m = started(&store, fast_config(), &env).await;
    let mut w = m.submit(env.with_id("p", gated_plan(true))).await.unwrap();
    until_entered(&env, 1).await;
    m.cancel(&ProcedureId::new("p")).await.unwrap();
    env.gate.add_permits(10);
    within(w.wait()).await.unwrap_err();
    assert_eq!(
        described_writes(&writes, 2),
        [
            "put proc/p 0 running",
            "put proc/p 1 running",
            "put control/proc/p cancel",
            "put proc/p 2 running",
            "put proc/p 3 rolling_back",
            "put proc/p 4 cancelled + delete control/proc/p",
        ]
    );
    assert!(controls.lock().unwrap().is_empty());
}

#[tokio::test]
async fn pause_all_and_resume_all_write_one_key() {
    let env = Env::new(true);
    let (store, writes, _) = store_with_controls(Some(1), vec![]);
    let m = started(&store, fast_config(), &env).await;
    m.pause_all().await.unwrap();
    m.resume_all().await.unwrap();
    assert_eq!(
        described_writes(&writes, 2),
        ["put control/all pause", "delete control/all"]
    );
}
