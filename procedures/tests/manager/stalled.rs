//! Stalled, never silent: a procedure that cannot progress for a reason retrying will not fix ends `stalled` (its
//! state write refused for good, no loader on recovery) or `failed` (its step's retries ran out), with the reason in
//! its information and its history, and counted by the manager. None stays `running` with an error string.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_trait::async_trait;
use procedures::record::record_key;
use procedures::testing::StateStoreWrapper;
use procedures::{
    Condition, Context, Error, EventKind, LocalManager, LockKey, MemoryStateStore, Procedure,
    ProcedureId, ProcedureManager, ProcedureRecord, ProcedureState, ProcedureWithId, Result,
    StateStore, Status, WriteOp, WriteOutcome,
};
use serde::{Deserialize, Serialize};

use crate::support::manager::{Env, Plan, TYPE, fast_config, within};

const GROWS: &str = "grows";

/// A state store that refuses, for good, any value larger than `max` bytes (like etcd's request size limit).
struct LimitedStore {
    inner: MemoryStateStore,
    max: usize,
}

impl LimitedStore {
    fn refuse(&self, key: &str, value: &[u8]) -> Result<()> {
        if value.len() > self.max {
            return Err(Error::StoreLimit {
                key: key.to_string(),
                reason: format!("value of {} bytes exceeds {} bytes", value.len(), self.max),
            });
        }
        Ok(())
    }
}

#[async_trait]
impl StateStoreWrapper for LimitedStore {
    fn inner(&self) -> &dyn StateStore {
        &self.inner
    }

    async fn put(&self, key: &str, value: Vec<u8>) -> Result<()> {
        self.refuse(key, &value)?;
        self.inner.put(key, value).await
    }

    async fn write(&self, conditions: Vec<Condition>, ops: Vec<WriteOp>) -> Result<WriteOutcome> {
        for op in &ops {
            if let WriteOp::Put { key, value } = op {
                self.refuse(key, value)?;
            }
        }
        self.inner.write(conditions, ops).await
    }
}

/// Three named steps; the second makes its state `payload` bytes larger.
#[derive(Serialize, Deserialize)]
struct Grows {
    at: u32,
    payload: String,
    payload_len: usize,
}

#[async_trait]
impl Procedure for Grows {
    fn type_name(&self) -> &str {
        GROWS
    }

    async fn execute(&mut self, _ctx: &Context) -> Result<Status> {
        match self.at {
            0 => {
                self.at = 1;
                Ok(Status::executing(true))
            }
            1 => {
                self.payload = "x".repeat(self.payload_len);
                self.at = 2;
                Ok(Status::executing(true))
            }
            _ => Ok(Status::done()),
        }
    }

    fn dump(&self) -> Result<serde_json::Value> {
        serde_json::to_value(self).map_err(Error::external)
    }

    fn lock_key(&self) -> LockKey {
        LockKey::exclusive("grows")
    }

    fn step_name(&self) -> Option<String> {
        Some(["Small", "Grow", "Finish"][self.at.min(2) as usize].to_string())
    }
}

fn grows(id: &str, payload_len: usize) -> ProcedureWithId {
    ProcedureWithId::new(
        ProcedureId::new(id),
        Box::new(Grows {
            at: 0,
            payload: String::new(),
            payload_len,
        }),
    )
}

fn grows_loader() -> procedures::BoxedProcedureLoader {
    Box::new(|data| {
        let p: Grows = serde_json::from_value(data).map_err(Error::external)?;
        Ok(Box::new(p) as procedures::BoxedProcedure)
    })
}

fn stored(store: &MemoryStateStore, id: &str) -> ProcedureRecord {
    let bytes = store.snapshot()[&record_key(&ProcedureId::new(id))].clone();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_state_write_refused_for_good_stalls_the_procedure_with_the_reason() {
    let store = Arc::new(LimitedStore {
        inner: MemoryStateStore::new(),
        max: 4096,
    });
    let m = LocalManager::new(store.clone(), fast_config());
    m.register_loader(GROWS, grows_loader()).unwrap();
    m.start().await.unwrap();

    let mut w = m.submit(grows("big", 10_000)).await.unwrap();
    let err = within(w.wait()).await.unwrap_err();
    assert!(matches!(err, Error::ProcedureStalled { .. }), "{err}");
    assert!(
        err.to_string()
            .starts_with("procedure big is stalled: state store refuses"),
        "{err}"
    );

    let info = m
        .procedure_state(&ProcedureId::new("big"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.state, ProcedureState::Stalled, "{info:?}");
    // It stays at its last persisted step: the write of the grown state was refused.
    assert_eq!(info.step, 1);
    let error = info.error.clone().unwrap();
    assert!(
        error.contains("state store refuses 'proc/big'") && error.contains("exceeds 4096 bytes"),
        "{error}"
    );
    assert_eq!(info.last_error.as_deref(), Some(error.as_str()));
    match &info.events.last().unwrap().kind {
        EventKind::Stalled { reason } => assert!(reason.contains("refuses"), "{reason}"),
        other => panic!("last event {other:?}"),
    }
    assert_eq!(m.stalled_count(), 1);
    assert_eq!(m.failed_count(), 0);
    let listed = m.list_procedures().await.unwrap();
    assert_eq!(listed[0].state, ProcedureState::Stalled);

    // Nothing more was written: the record is the last accepted one, still unfinished.
    let record = stored(&store.inner, "big");
    assert_eq!((record.step, record.state), (1, ProcedureState::Running));
    m.stop().await.unwrap();

    // A later manager resumes it; the store still refuses, so it stalls again — visibly, and counted there too.
    let m2 = LocalManager::new(store.clone(), fast_config());
    m2.register_loader(GROWS, grows_loader()).unwrap();
    m2.start().await.unwrap();
    let mut w = m2.watch(&ProcedureId::new("big")).await.unwrap().unwrap();
    assert!(within(w.wait()).await.is_err());
    let info = m2
        .procedure_state(&ProcedureId::new("big"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.state, ProcedureState::Stalled);
    assert!(
        info.events
            .iter()
            .any(|e| matches!(e.kind, EventKind::Recovered { .. })),
        "{:?}",
        info.events
    );
    assert_eq!(m2.stalled_count(), 1);
    m2.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_recovered_record_without_a_loader_stalls_and_a_manager_with_the_loader_resumes_it() {
    let store = Arc::new(MemoryStateStore::new());
    // An unfinished record of a type the next manager has no loader for.
    let record = serde_json::json!({
        "format_version": 1, "type_name": GROWS, "id": "orphan", "parent_id": null, "step": 1,
        "state": "running", "data": {"at": 1, "payload": "", "payload_len": 8}, "output": null,
        "error": null, "created_at_ms": 1, "updated_at_ms": 2
    });
    store
        .put("proc/orphan", serde_json::to_vec(&record).unwrap())
        .await
        .unwrap();

    let without = LocalManager::new(store.clone(), fast_config());
    without.start().await.unwrap();
    let info = without
        .procedure_state(&ProcedureId::new("orphan"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.state, ProcedureState::Stalled, "{info:?}");
    let error = info.error.unwrap();
    assert!(
        error.contains("orphan") && error.contains("'grows'") && error.contains("proc/orphan"),
        "{error}"
    );
    assert!(matches!(
        info.events.last().map(|e| &e.kind),
        Some(EventKind::Stalled { .. })
    ));
    assert_eq!((without.stalled_count(), without.failed_count()), (1, 0));
    let err = within(
        without
            .watch(&ProcedureId::new("orphan"))
            .await
            .unwrap()
            .unwrap()
            .wait(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::ProcedureStalled { .. }), "{err}");
    without.stop().await.unwrap();

    let with = LocalManager::new(store.clone(), fast_config());
    with.register_loader(GROWS, grows_loader()).unwrap();
    with.start().await.unwrap();
    within(
        with.watch(&ProcedureId::new("orphan"))
            .await
            .unwrap()
            .unwrap()
            .wait(),
    )
    .await
    .unwrap();
    assert_eq!(stored(&store, "orphan").state, ProcedureState::Done);
    assert_eq!(with.stalled_count(), 0);
    with.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_step_whose_retries_run_out_fails_saying_so() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let m = LocalManager::new(store.clone(), fast_config());
    m.register_loader(TYPE, env.loader()).unwrap();
    m.start().await.unwrap();
    let plan = Plan {
        retryable_failures: 100,
        ..Plan::steps(1, true)
    };
    let mut w = m.submit(env.with_id("flaky", plan)).await.unwrap();
    let err = within(w.wait()).await.unwrap_err();
    assert!(matches!(err, Error::ProcedureFailed { .. }), "{err}");
    // The first attempt and max_retries = 3 retries.
    assert_eq!(env.attempts.load(Ordering::SeqCst), 4);

    let info = m
        .procedure_state(&ProcedureId::new("flaky"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.state, ProcedureState::Failed);
    let error = info.error.unwrap();
    assert!(
        error.contains("flaky step") && error.contains("gave up after 4 attempt(s)"),
        "{error}"
    );
    let retries = info
        .events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Retry { .. }))
        .count();
    assert_eq!(retries, 3, "{:?}", info.events);
    assert!(matches!(
        info.events.last().map(|e| &e.kind),
        Some(EventKind::Failed { .. })
    ));
    assert_eq!((m.failed_count(), m.stalled_count()), (1, 0));
    // Written, not only shown: the failed record holds the reason and the history.
    let record = stored(&store, "flaky");
    assert_eq!(record.state, ProcedureState::Failed);
    assert!(record.error.unwrap().contains("retries ran out"));
    assert!(matches!(
        record.events.last().map(|e| &e.kind),
        Some(EventKind::Failed { .. })
    ));
    m.stop().await.unwrap();
}
