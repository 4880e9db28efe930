//! Injected crashes: where to crash ([`CrashPoint`], [`CrashPlan`]), the shared counter that decides it
//! ([`CrashController`]), and the store wrapper that carries it out ([`CrashingStore`]).

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::procedure::{ProcedureId, SideEffectHook};
use crate::step_writes::{StepStore, StepWrites};
use crate::store::{Condition, StateStore, WriteOp, WriteOutcome};

/// One place where a manager can be crashed. Indices count from 0, in the order the manager reaches them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CrashPoint {
    /// The k-th durable write (`put`, `delete` or `write`) is refused and nothing is written: the process died just
    /// before the store saw it. Outside effects of the step that asked for the write have happened.
    BeforeWrite(usize),
    /// The k-th durable write is applied, then the manager crashes: the store has the new state, the manager never
    /// learns that it does.
    AfterWrite(usize),
    /// The m-th side-effect point ([`crate::Context::side_effect_point`]) reached by any procedure of the manager
    /// returns an [`injected_crash`]: the process died right after that outside effect.
    SideEffect(usize),
    /// The k-th durable write is applied, then the store answers with a **retryable** error (the answer was lost on
    /// the way back, e.g. an etcd leader change after the commit). Not a crash: the manager lives on and retries the
    /// write, which must cope with finding it already applied.
    LostAnswer(usize),
}

impl fmt::Display for CrashPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CrashPoint::BeforeWrite(k) => write!(f, "before write #{k}"),
            CrashPoint::AfterWrite(k) => write!(f, "after write #{k}"),
            CrashPoint::SideEffect(m) => write!(f, "at side-effect point #{m}"),
            CrashPoint::LostAnswer(k) => write!(f, "answer of write #{k} lost"),
        }
    }
}

/// Whether and where one manager run crashes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CrashPlan {
    point: Option<CrashPoint>,
}

impl CrashPlan {
    /// No crash: the run only counts writes and side-effect points.
    pub fn none() -> Self {
        CrashPlan { point: None }
    }

    /// Crash at `point`.
    pub fn at(point: CrashPoint) -> Self {
        CrashPlan { point: Some(point) }
    }

    /// Where the run crashes, if it does.
    pub fn point(&self) -> Option<CrashPoint> {
        self.point
    }
}

/// Where a run actually crashed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrashRecord {
    /// The planned point that was reached.
    pub point: CrashPoint,
    /// What was happening there: the store call and key, or the procedure and side-effect label.
    pub detail: String,
}

#[derive(Debug, Default)]
struct Counters {
    writes: usize,
    side_effects: usize,
    crashed: Option<CrashRecord>,
    lost_answer: Option<CrashRecord>,
}

/// The shared state of one simulated process: it counts durable writes and side-effect points, decides when to
/// crash according to its [`CrashPlan`], and once crashed refuses everything (a dead process neither writes, reads
/// nor runs steps).
///
/// It also counts the procedure steps in flight (through the harness's procedure wrapper), so a caller can wait for
/// the dead manager's last steps to end before a new manager starts on the same store.
#[derive(Debug)]
pub struct CrashController {
    plan: CrashPlan,
    counters: Mutex<Counters>,
    /// Serialises mutations, so "after write k" means no other write of this process landed after it.
    write_gate: tokio::sync::Mutex<()>,
    in_flight: watch::Sender<usize>,
}

impl CrashController {
    /// A controller that will crash as `plan` says.
    pub fn new(plan: CrashPlan) -> Self {
        CrashController {
            plan,
            counters: Mutex::new(Counters::default()),
            write_gate: tokio::sync::Mutex::new(()),
            in_flight: watch::Sender::new(0),
        }
    }

    /// The plan.
    pub fn plan(&self) -> CrashPlan {
        self.plan
    }

    /// Durable writes attempted before the crash (the refused one of [`CrashPoint::BeforeWrite`] included).
    pub fn writes(&self) -> usize {
        self.lock().writes
    }

    /// Side-effect points reached before the crash (the crashing one included).
    pub fn side_effect_points(&self) -> usize {
        self.lock().side_effects
    }

    /// Where the run crashed, if it did.
    pub fn crashed(&self) -> Option<CrashRecord> {
        self.lock().crashed.clone()
    }

    /// Whether the run crashed.
    pub fn is_crashed(&self) -> bool {
        self.lock().crashed.is_some()
    }

    /// Procedure steps (or rollbacks) currently running under this controller.
    pub fn steps_in_flight(&self) -> usize {
        *self.in_flight.borrow()
    }

    /// Waits until no step runs under this controller, at most `timeout`. Returns whether it got there.
    pub async fn wait_steps_idle(&self, timeout: Duration) -> bool {
        let mut rx = self.in_flight.subscribe();
        matches!(
            tokio::time::timeout(timeout, rx.wait_for(|n| *n == 0)).await,
            Ok(Ok(_))
        )
    }

    /// Marks a step as running; the guard marks it ended when dropped. Fails once the process has crashed: a dead
    /// process starts no step.
    pub(crate) fn enter_step(self: &Arc<Self>, id: &ProcedureId) -> Result<StepGuard> {
        if let Some(dead) = self.crashed() {
            return Err(dead_error(&dead, &format!("start a step of {id}")));
        }
        self.in_flight.send_modify(|n| *n += 1);
        Ok(StepGuard {
            controller: Arc::clone(self),
        })
    }

    /// Called before a read: fails once the process has crashed.
    fn check_alive(&self, what: &str) -> Result<()> {
        match self.crashed() {
            Some(dead) => Err(dead_error(&dead, what)),
            None => Ok(()),
        }
    }

    /// Counts a durable write about to happen. Returns its index, or the injected crash.
    fn before_write(&self, what: &str) -> Result<usize> {
        let mut c = self.lock();
        if let Some(dead) = &c.crashed {
            return Err(dead_error(dead, what));
        }
        let index = c.writes;
        c.writes += 1;
        if self.plan.point == Some(CrashPoint::BeforeWrite(index)) {
            return Err(crash(&mut c, CrashPoint::BeforeWrite(index), what));
        }
        Ok(index)
    }

    /// Called once write `index` is applied: crashes if the plan says so.
    fn after_write(&self, index: usize, what: &str) -> Result<()> {
        if self.plan.point == Some(CrashPoint::AfterWrite(index)) {
            let mut c = self.lock();
            return Err(crash(&mut c, CrashPoint::AfterWrite(index), what));
        }
        if self.plan.point == Some(CrashPoint::LostAnswer(index)) {
            let point = CrashPoint::LostAnswer(index);
            self.lock().lost_answer = Some(CrashRecord {
                point,
                detail: what.to_string(),
            });
            return Err(Error::Store {
                action: "write",
                key: what.to_string(),
                source: format!("injected: {point}, the write was applied").into(),
                retryable: true,
            });
        }
        Ok(())
    }

    /// Runs `op` as one durable write of this process, for a store that injects the crashes itself below its own
    /// batching (see [`crate::testing::CrashScenario::crashing_state_store`]): a store that commits the writes of
    /// several calls at once counts each commit once. Serialised with the other writes of this process, counted,
    /// and crashed before `op` (nothing runs) or after it (`op` ran, the answer is an [`injected_crash`]) as the
    /// plan says; `what` names the write in the crash record. Fails at once when the process has crashed.
    pub async fn durable_write<T, F>(&self, what: &str, op: F) -> Result<T>
    where
        F: Future<Output = Result<T>>,
    {
        let _gate = self.write_gate.lock().await;
        let index = self.before_write(what)?;
        let value = op.await?;
        self.after_write(index, what)?;
        Ok(value)
    }

    /// Fails with an [`injected_crash`] once the process has crashed: what a store that injects the crashes itself
    /// calls before a read (`what` names it).
    pub fn ensure_alive(&self, what: &str) -> Result<()> {
        self.check_alive(what)
    }

    /// Where the answer of a write was lost, once the planned [`CrashPoint::LostAnswer`] was reached.
    pub fn lost_answer(&self) -> Option<CrashRecord> {
        self.lock().lost_answer.clone()
    }

    fn side_effect(&self, procedure_id: &ProcedureId, label: &str) -> Result<()> {
        let what = format!("side effect '{label}' of {procedure_id}");
        let mut c = self.lock();
        if let Some(dead) = &c.crashed {
            return Err(dead_error(dead, &what));
        }
        let index = c.side_effects;
        c.side_effects += 1;
        if self.plan.point == Some(CrashPoint::SideEffect(index)) {
            return Err(crash(&mut c, CrashPoint::SideEffect(index), &what));
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, Counters> {
        // Every change to the counters is a few plain assignments: a poisoned lock still holds consistent counters.
        self.counters
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn crash(c: &mut Counters, point: CrashPoint, what: &str) -> Error {
    c.crashed = Some(CrashRecord {
        point,
        detail: what.to_string(),
    });
    injected_crash(format!("{point} ({what})"))
}

fn dead_error(dead: &CrashRecord, what: &str) -> Error {
    injected_crash(format!(
        "{} ({}); the dead process cannot {what}",
        dead.point, dead.detail
    ))
}

/// The cause of an injected crash, inside the [`Halt`](crate::error::Halt) of an ordinary store error: the manager
/// halts on it as on any halt, and a test recognises it with [`is_injected_crash`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InjectedCrash {
    /// Where the crash was injected (and, after it, what the dead process was asked to do).
    pub point: String,
}

impl fmt::Display for InjectedCrash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "injected crash at {}", self.point)
    }
}

impl std::error::Error for InjectedCrash {}

/// The error a crashed process answers with: a store error carrying a [`Halt`](crate::error::Halt) whose cause is an
/// [`InjectedCrash`] at `point`. The manager stops on it at once, as if its process had died.
pub fn injected_crash(point: impl Into<String>) -> Error {
    Error::halt(
        "go on after",
        "",
        InjectedCrash {
            point: point.into(),
        },
    )
}

/// The injected crash `error` carries, if it is one built by [`injected_crash`].
pub fn injected_crash_of(error: &Error) -> Option<&InjectedCrash> {
    error.as_halt()?.cause().downcast_ref::<InjectedCrash>()
}

/// Whether `error` is a crash injected by the harness (see [`injected_crash`]).
pub fn is_injected_crash(error: &Error) -> bool {
    injected_crash_of(error).is_some()
}

/// Marks one running step; ends it when dropped (also when the step's future is dropped).
pub(crate) struct StepGuard {
    controller: Arc<CrashController>,
}

impl Drop for StepGuard {
    fn drop(&mut self) {
        self.controller
            .in_flight
            .send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// A [`StateStore`] that crashes its manager as a [`CrashController`] says, over any other store. It is also the
/// [`SideEffectHook`] of that manager, so writes and side-effect points share one controller.
///
/// Every mutation (`put`, `delete`, `write`) counts as one durable write, whether a conditional `write` is applied
/// or rejected (either way the manager attempted a transition). Reads are not counted. After the crash every call
/// fails with an [`injected_crash`] and reaches nothing below.
pub struct CrashingStore {
    inner: Arc<dyn StateStore>,
    controller: Arc<CrashController>,
}

impl CrashingStore {
    /// Wraps `inner`, crashing as `controller` says.
    pub fn new(inner: Arc<dyn StateStore>, controller: Arc<CrashController>) -> Self {
        CrashingStore { inner, controller }
    }

    /// Wraps `inner` with a fresh controller following `plan`.
    pub fn with_plan(inner: Arc<dyn StateStore>, plan: CrashPlan) -> Self {
        Self::new(inner, Arc::new(CrashController::new(plan)))
    }

    /// The controller (to read the counts and where the run crashed).
    pub fn controller(&self) -> &Arc<CrashController> {
        &self.controller
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<dyn StateStore> {
        &self.inner
    }

    async fn mutate<T, F>(&self, what: String, op: F) -> Result<T>
    where
        F: Future<Output = Result<T>>,
    {
        let _gate = self.controller.write_gate.lock().await;
        let index = self.controller.before_write(&what)?;
        let value = op.await?;
        self.controller.after_write(index, &what)?;
        Ok(value)
    }
}

impl fmt::Debug for CrashingStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CrashingStore")
            .field("controller", &self.controller)
            .finish_non_exhaustive()
    }
}

fn describe_write(conditions: &[Condition], ops: &[WriteOp]) -> String {
    let keys: Vec<&str> = ops.iter().map(WriteOp::key).collect();
    let conds: Vec<&str> = conditions.iter().map(Condition::key).collect();
    format!("write {keys:?} if {conds:?}")
}

#[async_trait]
impl StateStore for CrashingStore {
    async fn quiesce(&self) {
        self.inner.quiesce().await;
    }

    fn watch_changes(&self, prefix: &str) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.inner.watch_changes(prefix)
    }

    fn counts_changes(&self, prefix: &str) -> Option<Arc<std::sync::atomic::AtomicU64>> {
        self.inner.counts_changes(prefix)
    }

    async fn claim_epoch(&self) -> Result<Option<u64>> {
        self.mutate("claim the epoch".to_string(), self.inner.claim_epoch())
            .await
    }

    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.controller.check_alive(&format!("get '{key}'"))?;
        self.inner.get(key).await
    }

    async fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        self.controller.check_alive(&format!("scan '{prefix}'"))?;
        self.inner.scan(prefix).await
    }

    async fn put(&self, key: &str, value: Vec<u8>) -> Result<()> {
        self.mutate(format!("put '{key}'"), self.inner.put(key, value))
            .await
    }

    async fn delete(&self, keys: &[String]) -> Result<()> {
        self.mutate(format!("delete {keys:?}"), self.inner.delete(keys))
            .await
    }

    async fn write(&self, conditions: Vec<Condition>, ops: Vec<WriteOp>) -> Result<WriteOutcome> {
        let what = describe_write(&conditions, &ops);
        self.mutate(what, self.inner.write(conditions, ops)).await
    }

    fn joins(&self, store: &dyn StepStore) -> bool {
        self.inner.joins(store)
    }

    async fn write_with_step(
        &self,
        conditions: Vec<Condition>,
        ops: Vec<WriteOp>,
        step: &StepWrites,
    ) -> Result<WriteOutcome> {
        let mut what = describe_write(&conditions, &ops);
        what.push_str(&format!(
            " with step writes {}",
            describe_write(step.conditions(), step.ops())
        ));
        self.mutate(what, self.inner.write_with_step(conditions, ops, step))
            .await
    }
}

impl SideEffectHook for CrashingStore {
    fn on_side_effect(&self, procedure_id: &ProcedureId, label: &str) -> Result<()> {
        self.controller.side_effect(procedure_id, label)
    }
}

impl SideEffectHook for CrashController {
    fn on_side_effect(&self, procedure_id: &ProcedureId, label: &str) -> Result<()> {
        self.side_effect(procedure_id, label)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory_store::MemoryStateStore;

    fn store(plan: CrashPlan) -> (Arc<MemoryStateStore>, CrashingStore) {
        let inner = Arc::new(MemoryStateStore::new());
        let crashing = CrashingStore::with_plan(inner.clone(), plan);
        (inner, crashing)
    }

    #[tokio::test]
    async fn counts_every_mutation_and_not_reads() {
        let (_, s) = store(CrashPlan::none());
        s.put("a", b"1".to_vec()).await.unwrap();
        s.get("a").await.unwrap();
        s.scan("").await.unwrap();
        s.delete(&["a".to_string()]).await.unwrap();
        let applied = s
            .write(vec![Condition::Absent { key: "b".into() }], vec![])
            .await
            .unwrap();
        assert_eq!(applied, WriteOutcome::Applied);
        s.put("c", b"1".to_vec()).await.unwrap();
        let rejected = s
            .write(vec![Condition::Absent { key: "c".into() }], vec![])
            .await
            .unwrap();
        assert!(matches!(rejected, WriteOutcome::Rejected { .. }));
        assert_eq!(s.controller().writes(), 5);
        assert!(!s.controller().is_crashed());
    }

    #[tokio::test]
    async fn a_lost_answer_applies_the_write_and_answers_a_retryable_error_without_a_crash() {
        let (inner, s) = store(CrashPlan::at(CrashPoint::LostAnswer(1)));
        s.put("a", b"1".to_vec()).await.unwrap();
        let err = s.put("b", b"2".to_vec()).await.unwrap_err();
        assert!(err.is_retryable() && !err.is_fatal(), "{err}");
        assert!(err.to_string().contains("answer of write #1 lost"), "{err}");
        assert_eq!(inner.get("b").await.unwrap(), Some(b"2".to_vec()));
        assert_eq!(
            s.controller().lost_answer().map(|c| c.point),
            Some(CrashPoint::LostAnswer(1))
        );
        // Alive: the retry goes through.
        assert!(!s.controller().is_crashed());
        s.put("b", b"2".to_vec()).await.unwrap();
        assert_eq!(s.controller().writes(), 3);
    }

    #[tokio::test]
    async fn before_write_writes_nothing_and_kills_the_process() {
        let (inner, s) = store(CrashPlan::at(CrashPoint::BeforeWrite(1)));
        s.put("a", b"1".to_vec()).await.unwrap();
        let err = s.put("b", b"2".to_vec()).await.unwrap_err();
        assert!(err.is_fatal(), "{err}");
        assert_eq!(inner.get("b").await.unwrap(), None);
        assert_eq!(
            s.controller().crashed().map(|c| c.point),
            Some(CrashPoint::BeforeWrite(1))
        );
        // Dead: no further write, no read.
        assert!(s.put("c", b"3".to_vec()).await.unwrap_err().is_fatal());
        assert!(s.get("a").await.unwrap_err().is_fatal());
        assert_eq!(inner.get("c").await.unwrap(), None);
        assert_eq!(s.controller().writes(), 2);
    }

    #[tokio::test]
    async fn after_write_writes_then_kills_the_process() {
        let (inner, s) = store(CrashPlan::at(CrashPoint::AfterWrite(0)));
        let err = s
            .write(
                vec![Condition::Absent { key: "a".into() }],
                vec![WriteOp::Put {
                    key: "a".into(),
                    value: b"1".to_vec(),
                }],
            )
            .await
            .unwrap_err();
        assert!(err.is_fatal(), "{err}");
        assert_eq!(inner.get("a").await.unwrap(), Some(b"1".to_vec()));
        assert!(s.delete(&["a".to_string()]).await.unwrap_err().is_fatal());
        assert_eq!(inner.get("a").await.unwrap(), Some(b"1".to_vec()));
    }

    #[tokio::test]
    async fn side_effect_point_crashes_and_later_writes_fail() {
        let (inner, s) = store(CrashPlan::at(CrashPoint::SideEffect(1)));
        let id = ProcedureId::new("p");
        s.on_side_effect(&id, "one").unwrap();
        s.put("a", b"1".to_vec()).await.unwrap();
        let err = s.on_side_effect(&id, "two").unwrap_err();
        assert!(err.to_string().contains("two"), "{err}");
        assert!(s.on_side_effect(&id, "three").is_err());
        assert!(s.put("b", b"1".to_vec()).await.is_err());
        assert_eq!(inner.get("b").await.unwrap(), None);
        assert_eq!(s.controller().side_effect_points(), 2);
        assert_eq!(s.controller().writes(), 1);
    }

    #[tokio::test]
    async fn no_step_starts_after_the_crash_and_in_flight_steps_are_counted() {
        let controller = Arc::new(CrashController::new(CrashPlan::at(CrashPoint::SideEffect(
            0,
        ))));
        let id = ProcedureId::new("p");
        let guard = controller.enter_step(&id).unwrap();
        assert_eq!(controller.steps_in_flight(), 1);
        assert!(controller.on_side_effect(&id, "x").is_err());
        assert!(controller.enter_step(&id).is_err());
        assert!(!controller.wait_steps_idle(Duration::from_millis(1)).await);
        drop(guard);
        assert!(controller.wait_steps_idle(Duration::from_secs(5)).await);
    }
}
