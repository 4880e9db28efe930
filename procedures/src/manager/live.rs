//! What a runner knows of its procedure beyond its last record ([`Live`]): the event history and the current
//! step's attempt, shared by [`LiveHandle`] with the manager's entry and the procedure's watchers.
//!
//! Why shared and not published: the history is what makes a procedure's information large (up to
//! [`crate::record::MAX_EVENTS`] events), and the runner publishes its information a few times per step. A copy
//! per publication cost more CPU than the step's write. The information published while the procedure runs
//! carries no events; whoever asks for them ([`crate::ProcedureManager::procedure_state`], a listing,
//! [`crate::Watcher::info`]) reads them here, under this procedure's own lock, not the manager's. The last
//! publication, of a finished state, carries the history (one copy per procedure), and the entry lets go of the
//! live state then.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::event::{EventKind, ProcedureEvent, push_event};
use crate::record::{ProcedureInfo, now_ms};

/// What the runner knows of its procedure beyond its last record: the introspection of [`ProcedureInfo`].
#[derive(Default)]
pub(crate) struct Live {
    /// Every event, persisted or not yet (bounded like the record's).
    pub(crate) events: Vec<ProcedureEvent>,
    /// The JSON of the first `encoded.len()` of `events`, each as it appears in a record: a write serialises only
    /// the events new since the last one, not the whole history again.
    pub(crate) encoded: Vec<String>,
    /// Starts of the current step in this manager.
    pub(crate) attempt: u32,
    /// The current step's last error, or the error that stalled it.
    pub(crate) last_error: Option<String>,
    pub(crate) next_retry_at_ms: Option<u64>,
    pub(crate) step_started_at_ms: Option<u64>,
    /// The length of the last record written without its history: the size of the next one's buffer.
    pub(crate) record_body_len: usize,
}

impl Live {
    /// Adds an event at `at_ms`, the oldest dropped beyond the bound with its JSON.
    pub(crate) fn push(&mut self, at_ms: u64, kind: EventKind) {
        let before = self.events.len();
        push_event(&mut self.events, at_ms, kind);
        let dropped = (before + 1 - self.events.len()).min(self.encoded.len());
        self.encoded.drain(..dropped);
    }
}

/// A procedure's [`Live`] state, shared by its runner (the only one that changes it while it runs), the manager's
/// entry and the watchers.
#[derive(Clone, Default)]
pub(crate) struct LiveHandle(Arc<Mutex<Live>>);

impl LiveHandle {
    /// A handle on a new live state holding `events`.
    pub(crate) fn with_events(events: Vec<ProcedureEvent>) -> Self {
        LiveHandle(Arc::new(Mutex::new(Live {
            events,
            ..Live::default()
        })))
    }

    /// The live state, locked.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Live> {
        // Every change under this lock is a field assignment or a bounded push: it cannot panic half-way.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `info` with the history it shows: the live one, unless `info` is finished (its last publication carries
    /// its history).
    pub(crate) fn fill(&self, info: &mut ProcedureInfo) {
        if !info.state.is_finished() {
            info.events.clone_from(&self.lock().events);
        }
    }

    /// Adds an event now, unless one equal to `kind` is in the history already; whether it was added.
    pub(crate) fn push_once(&self, kind: EventKind) -> bool {
        let mut live = self.lock();
        if live.events.iter().any(|e| e.kind == kind) {
            return false;
        }
        live.push(now_ms(), kind);
        true
    }

    /// Adds an event now.
    pub(crate) fn push(&self, kind: EventKind) {
        self.lock().push(now_ms(), kind);
    }

    /// Lets go of what only writes need (the history's JSON, the history's room to grow): the procedure writes no
    /// more records in this run, and a finished one stays in memory for the retention window.
    pub(crate) fn done_writing(&self) {
        let mut live = self.lock();
        live.encoded = Vec::new();
        live.events.shrink_to_fit();
    }
}

impl std::fmt::Debug for LiveHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveHandle")
            .field("events", &self.lock().events.len())
            .finish()
    }
}
