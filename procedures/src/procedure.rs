//! What a procedure is: the [`Procedure`] trait, its [`Status`], ids, lock keys and the step [`Context`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::step_writes::StepWrites;

/// The value a finished procedure hands back to its submitter.
pub type Output = serde_json::Value;

/// A procedure's identity. Callers choose it when a submission must be idempotent (the same id twice is one
/// procedure), or take a random one.
///
/// The manager keeps an id in several places for a procedure's life (its entry, its record, its runner, each
/// write's list of what it shows), so the text is shared, not copied: a copy of an id is a reference count. It
/// compares, hashes, orders and (as a JSON string) serializes as its text.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcedureId(Arc<str>);

impl ProcedureId {
    /// A caller-chosen id.
    pub fn new(id: impl Into<String>) -> Self {
        ProcedureId(Arc::from(id.into()))
    }

    /// A fresh id: a UUID v7, time-ordered (its first 48 bits are the time in milliseconds, the rest random). Ids
    /// made one after another sort one after another, so the records of procedures submitted together are
    /// neighbours in a store's key order: a commit that holds several of them (group commit) changes a few pages of
    /// an ordered store like redb, not one page per record.
    pub fn random() -> Self {
        ProcedureId::new(uuid::Uuid::now_v7().to_string())
    }

    /// The deterministic id of a child named `name` of this procedure: `{parent}/{name}`. A parent that is replayed
    /// after a crash produces the same child ids, so the engine does not start the children twice.
    pub fn child(&self, name: impl fmt::Display) -> Self {
        ProcedureId::new(format!("{}/{}", self.0, name))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Serialize for ProcedureId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ProcedureId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(ProcedureId::new)
    }
}

impl fmt::Display for ProcedureId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One lock key a procedure holds for its whole run.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum StringKey {
    /// Others may hold the same key shared at the same time.
    Shared(String),
    /// Nobody outside the holder's procedure tree may hold the key at the same time.
    Exclusive(String),
}

impl StringKey {
    /// The key's name.
    pub fn name(&self) -> &str {
        match self {
            StringKey::Shared(k) | StringKey::Exclusive(k) => k,
        }
    }
}

/// The set of keys a procedure locks. The engine takes them all together, in sorted order, before the first step
/// and releases them when the procedure ends. A child may take keys its parent (or any procedure of its tree) holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockKey(Vec<StringKey>);

impl LockKey {
    /// No lock at all.
    pub fn none() -> Self {
        LockKey(Vec::new())
    }

    /// One exclusive key.
    pub fn exclusive(key: impl Into<String>) -> Self {
        LockKey(vec![StringKey::Exclusive(key.into())])
    }

    /// One shared key.
    pub fn shared(key: impl Into<String>) -> Self {
        LockKey(vec![StringKey::Shared(key.into())])
    }

    /// A set of keys; it is sorted and de-duplicated (an exclusive key wins over a shared one of the same name).
    pub fn new(keys: impl IntoIterator<Item = StringKey>) -> Self {
        let mut keys: Vec<StringKey> = keys.into_iter().collect();
        keys.sort_by(|a, b| a.name().cmp(b.name()).then_with(|| b.cmp(a)));
        keys.dedup_by(|later, earlier| later.name() == earlier.name());
        LockKey(keys)
    }

    /// The keys, sorted by name.
    pub fn keys(&self) -> &[StringKey] {
        &self.0
    }
}

/// What a step tells the engine to do next.
#[derive(Debug)]
pub enum Status {
    /// Run `execute` again. With `persist`, the engine first stores [`Procedure::dump`] as a new step, so a crash
    /// resumes after this step instead of before it.
    Executing {
        /// Store the state before the next step.
        persist: bool,
        /// The step's own writes, committed with the stored state (see [`StepWrites`]); non-empty writes make the
        /// engine store the state whatever `persist` says.
        writes: StepWrites,
    },
    /// Start these children and call `execute` again once every one of them is done. Child ids must be
    /// deterministic (see [`ProcedureId::child`]): on replay, children that already exist are awaited, not started
    /// again.
    Suspended {
        /// The children to run.
        subprocedures: Vec<ProcedureWithId>,
        /// Store the state before starting the children.
        persist: bool,
    },
    /// The procedure is finished; `output` goes to the submitter and is kept in the record.
    Done {
        /// The result, if any.
        output: Option<Output>,
        /// The step's own writes, committed with the `done` record (see [`StepWrites`]).
        writes: StepWrites,
    },
}

impl Status {
    /// `Executing { persist: true }`: the common case of a step that changed the state.
    pub fn executing(persist: bool) -> Self {
        Status::Executing {
            persist,
            writes: StepWrites::none(),
        }
    }

    /// `Executing`, storing the state together with the step's `writes` in one commit.
    pub fn executing_with(writes: StepWrites) -> Self {
        Status::Executing {
            persist: true,
            writes,
        }
    }

    /// `Done` without output.
    pub fn done() -> Self {
        Status::Done {
            output: None,
            writes: StepWrites::none(),
        }
    }

    /// `Done` with an output.
    pub fn done_with_output(output: Output) -> Self {
        Status::Done {
            output: Some(output),
            writes: StepWrites::none(),
        }
    }

    /// `Done` with an output, the `done` record committed together with the step's `writes`.
    pub fn done_with(output: Option<Output>, writes: StepWrites) -> Self {
        Status::Done { output, writes }
    }

    /// The step's own writes, if any.
    pub fn writes(&self) -> Option<&StepWrites> {
        match self {
            Status::Executing { writes, .. } | Status::Done { writes, .. } => {
                (!writes.is_empty()).then_some(writes)
            }
            Status::Suspended { .. } => None,
        }
    }
}

/// A hook called at each side-effect point a step declares (see [`Context::side_effect_point`]). Production managers
/// have none; the crash harness (`procedures::testing`, with the `testing` feature) installs one to crash a manager
/// in the middle of a step.
pub trait SideEffectHook: Send + Sync {
    /// Called after a procedure completed one outside effect. An error stops the step (and, for an injected crash,
    /// the whole manager).
    fn on_side_effect(&self, procedure_id: &ProcedureId, label: &str) -> Result<()>;
}

/// What a step can see of the engine.
#[derive(Clone)]
pub struct Context {
    procedure_id: ProcedureId,
    hook: Option<Arc<dyn SideEffectHook>>,
    /// The epoch of the manager running the step and whether that manager has halted, when a manager runs it.
    manager: Option<(u64, HaltedFn)>,
}

/// Whether the manager running a step has halted.
pub(crate) type HaltedFn = Arc<dyn Fn() -> bool + Send + Sync>;

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("procedure_id", &self.procedure_id)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// A context for the procedure `procedure_id`, without hook (what unit tests of single steps use).
    pub fn new(procedure_id: ProcedureId) -> Self {
        Context {
            procedure_id,
            hook: None,
            manager: None,
        }
    }

    /// A context whose side-effect points go to `hook`.
    pub fn with_hook(procedure_id: ProcedureId, hook: Option<Arc<dyn SideEffectHook>>) -> Self {
        Context {
            procedure_id,
            hook,
            manager: None,
        }
    }

    /// The same context, for a step run by the manager `inner` under `epoch`.
    pub(crate) fn run_by(mut self, epoch: u64, halted: HaltedFn) -> Self {
        self.manager = Some((epoch, halted));
        self
    }

    /// The epoch of the manager running the step (`None` outside a manager, e.g. in unit tests of single steps).
    /// A step whose outside effect must not happen once another manager took over (fencing) makes that effect
    /// conditional on the store's epoch still being this one, and reports a refusal as [`Error::Fenced`], which
    /// halts the manager.
    pub fn epoch(&self) -> Option<u64> {
        self.manager.as_ref().map(|(epoch, _)| *epoch)
    }

    /// Whether the manager running the step has halted: fenced by a newer manager, stopped, or failed fatally. A
    /// halted manager's steps must stop their outside effects at once.
    pub fn is_halted(&self) -> bool {
        self.manager.as_ref().is_some_and(|(_, halted)| halted())
    }

    /// The running procedure's id.
    pub fn procedure_id(&self) -> &ProcedureId {
        &self.procedure_id
    }

    /// Declares that one outside effect of the current step has just completed (e.g. "created topic t_3"). A step
    /// with several effects calls this after each, so crash tests can stop the manager between them. Returns an
    /// error when a crash is injected here, or when the manager running the step has halted (e.g. fenced by a newer
    /// manager, which now runs the procedure): the step must return it at once and do no further outside effect.
    pub fn side_effect_point(&self, label: &str) -> Result<()> {
        if self.is_halted() {
            return Err(Error::ManagerNotRunning {
                reason: format!(
                    "procedure {} stops after '{label}': its manager halted (fenced by a newer manager, or stopped)",
                    self.procedure_id
                ),
            });
        }
        match &self.hook {
            Some(hook) => hook.on_side_effect(&self.procedure_id, label),
            None => Ok(()),
        }
    }
}

/// A persisted, resumable state machine.
///
/// `execute` runs one step and says what to do next. It **must be idempotent**: after a crash the engine calls it
/// again from the last persisted state, so a step whose outside effects already (partly) happened runs again and
/// must converge to the same result without doing them twice in a harmful way.
#[async_trait]
pub trait Procedure: Send {
    /// The type name under which the loader is registered; stored in the record.
    fn type_name(&self) -> &str;

    /// Runs the next step.
    async fn execute(&mut self, ctx: &Context) -> Result<Status>;

    /// The state to persist, as a JSON value; the loader rebuilds the procedure from it.
    fn dump(&self) -> Result<serde_json::Value>;

    /// The keys to lock for the whole run.
    fn lock_key(&self) -> LockKey;

    /// The name of the step `execute` runs next (e.g. `Allocate`), shown in [`crate::ProcedureInfo::step_name`],
    /// stored in the record and named in step events. `None` (the default): the procedure does not name its steps.
    fn step_name(&self) -> Option<String> {
        None
    }

    /// Whether [`Procedure::rollback`] undoes a failed run.
    fn rollback_supported(&self) -> bool {
        false
    }

    /// Undoes what the procedure did, after a non-retryable error (or retries ran out). Must be idempotent too.
    async fn rollback(&mut self, _ctx: &Context) -> Result<()> {
        crate::error::RollbackNotSupportedSnafu {
            type_name: self.type_name().to_string(),
        }
        .fail()
    }

    /// The most this procedure may run, measured from when this manager started running it. `None`: no limit.
    fn timeout(&self) -> Option<Duration> {
        None
    }
}

/// A boxed procedure.
pub type BoxedProcedure = Box<dyn Procedure>;

/// Rebuilds a procedure from the data it dumped.
pub type BoxedProcedureLoader =
    Box<dyn Fn(serde_json::Value) -> Result<BoxedProcedure> + Send + Sync>;

/// A procedure with the id it runs under.
pub struct ProcedureWithId {
    /// The id.
    pub id: ProcedureId,
    /// The procedure.
    pub procedure: BoxedProcedure,
}

impl ProcedureWithId {
    /// Pairs a procedure with an id.
    pub fn new(id: ProcedureId, procedure: BoxedProcedure) -> Self {
        ProcedureWithId { id, procedure }
    }

    /// Pairs a procedure with a random id.
    pub fn with_random_id(procedure: BoxedProcedure) -> Self {
        ProcedureWithId {
            id: ProcedureId::random(),
            procedure,
        }
    }
}

impl fmt::Debug for ProcedureWithId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcedureWithId")
            .field("id", &self.id)
            .field("type_name", &self.procedure.type_name())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[test]
    fn a_copied_id_shares_its_text_and_serializes_as_that_text() {
        let id = ProcedureId::new("create-table/\"demo\" \u{e9}");
        let copy = id.clone();
        assert!(
            std::ptr::eq(id.as_str().as_ptr(), copy.as_str().as_ptr()),
            "a copy of an id holds its own copy of the text"
        );
        // The JSON of a plain string, so records written before and after read the same.
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, serde_json::to_string(id.as_str()).unwrap());
        assert_eq!(serde_json::from_str::<ProcedureId>(&json).unwrap(), id);
        assert!(serde_json::from_str::<ProcedureId>("17").is_err());
    }

    #[test]
    fn fresh_ids_sort_in_the_order_they_were_made() {
        // Many within the same millisecond: the order holds within one, not only across milliseconds.
        let ids: Vec<ProcedureId> = (0..10_000).map(|_| ProcedureId::random()).collect();
        assert!(
            ids.windows(2).all(|w| w[0].as_str() < w[1].as_str()),
            "ids made one after another are not in key order"
        );
    }

    #[test]
    fn a_step_of_a_halted_manager_stops_at_its_next_side_effect_point() {
        let halted = Arc::new(AtomicBool::new(false));
        let flag = halted.clone();
        let ctx = Context::new(ProcedureId::new("p"))
            .run_by(7, Arc::new(move || flag.load(Ordering::SeqCst)));
        assert_eq!(ctx.epoch(), Some(7));
        assert!(!ctx.is_halted());
        ctx.side_effect_point("created region 1").unwrap();

        // Fenced by a newer manager while the step runs: the next point stops the step.
        halted.store(true, Ordering::SeqCst);
        assert!(ctx.is_halted());
        let err = ctx.side_effect_point("created region 2").unwrap_err();
        assert!(!err.is_retryable(), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("procedure p stops after 'created region 2'") && text.contains("halted"),
            "{text}"
        );

        // Outside a manager (unit tests of single steps) there is no epoch and nothing halts.
        let plain = Context::new(ProcedureId::new("q"));
        assert_eq!(plain.epoch(), None);
        assert!(!plain.is_halted());
        plain.side_effect_point("x").unwrap();
    }
}
