//! What a procedure run by this manager shows while it runs ([`Live`]): its information, updated in place by its
//! runner, and its event history — shared by [`LiveHandle`] between the runner, the manager's entry and the
//! procedure's watchers.
//!
//! Why a handle updated in place and not a publication: a runner changes what its procedure shows a few times per
//! step (a step starts, its record is written, a retry waits). Building a new [`ProcedureInfo`] for each change
//! and swapping it into the manager's map under the manager's state lock, which every runner and every listing
//! takes, cost more CPU than the step's write. A change is now a few field assignments under this procedure's own
//! lock, which only its runner and its readers take. The manager's state lock is taken when a procedure is
//! submitted, when it finishes (its last information, with its history, goes to the entry and its watchers, and
//! the entry lets go of the live state), for a listing, and by the rare changes made from outside the runner (a
//! store retry shown, a halt, a stall).
//!
//! Readers ([`crate::ProcedureManager::procedure_state`], a listing, [`crate::Watcher::info`]) copy the
//! information and the history out on demand; nothing is copied per change.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

use crate::encoded_history::EncodedHistory;
use crate::event::{EventKind, ProcedureEvent, push_event};
use crate::record::{MAX_EVENTS, ProcedureInfo, now_ms};
use crate::record_encoder::RecordEncoder;

/// What a procedure shows while this manager runs it.
pub(crate) struct Live {
    /// Its information as shown now, without its history (`shown.events` stays empty: the history is `events`).
    pub(crate) shown: ProcedureInfo,
    /// Every event, persisted or not yet (bounded like the record's).
    pub(crate) events: Vec<ProcedureEvent>,
    /// The JSON of the first `encoded.len()` of `events`, as a record carries them: a write serialises only the
    /// events new since the last one, not the whole history again.
    pub(crate) encoded: EncodedHistory,
    /// The encoder of the procedure's records, which keeps the parts they repeat.
    pub(crate) encoder: RecordEncoder,
    /// Once the procedure finished: its finished state, as its entry holds it (with the history, moved there).
    pub(crate) finished: Option<Arc<ProcedureInfo>>,
    /// The watch channel its watchers wait on and the finished state to send them, from the finish until the
    /// runner's end, which sends it (see [`LiveHandle::done_writing`]).
    pub(crate) to_send: Option<(watch::Sender<Arc<ProcedureInfo>>, Arc<ProcedureInfo>)>,
}

impl Live {
    /// Adds an event at `at_ms`, the oldest dropped beyond the bound with its JSON.
    pub(crate) fn push(&mut self, at_ms: u64, kind: EventKind) {
        let before = self.events.len();
        push_event(&mut self.events, at_ms, kind);
        let dropped = before + 1 - self.events.len();
        if dropped > 0 {
            self.encoded.drop_oldest(dropped);
        }
    }

    /// The information shown, with the history.
    pub(crate) fn info(&self) -> ProcedureInfo {
        let mut info = self.shown.clone();
        info.events.clone_from(&self.events);
        info
    }

    /// Shows `info` (from outside the runner: a store retry, a halt, a stall), its history left aside: the live
    /// one is the procedure's.
    pub(crate) fn show(&mut self, info: &ProcedureInfo) {
        let ProcedureInfo {
            id,
            type_name,
            parent_id,
            state,
            step,
            output,
            error,
            created_at_ms,
            updated_at_ms,
            step_name,
            attempt,
            last_error,
            next_retry_at_ms,
            step_started_at_ms,
            lock_keys,
            locks_held,
            lock_wait,
            events: _,
            refusal,
        } = info;
        let shown = &mut self.shown;
        shown.id.clone_from(id);
        shown.type_name.clone_from(type_name);
        shown.parent_id.clone_from(parent_id);
        shown.state = *state;
        shown.step = *step;
        shown.output.clone_from(output);
        shown.error.clone_from(error);
        shown.created_at_ms = *created_at_ms;
        shown.updated_at_ms = *updated_at_ms;
        shown.step_name.clone_from(step_name);
        shown.attempt = *attempt;
        shown.last_error.clone_from(last_error);
        shown.next_retry_at_ms = *next_retry_at_ms;
        shown.step_started_at_ms = *step_started_at_ms;
        shown.lock_keys.clone_from(lock_keys);
        shown.locks_held.clone_from(locks_held);
        shown.lock_wait.clone_from(lock_wait);
        shown.refusal = *refusal;
    }
}

/// The room a new live state starts with: what the history, its JSON and the record reached in the procedure that
/// finished last. A history grows an event or two per step; from nothing, its list and its JSON would be grown (and
/// copied, into fresh memory) again and again in every procedure, while the procedures of one manager tend to run
/// the same steps. Only a starting size: a history that outgrows it grows as before, and a finished one keeps only
/// its length.
#[derive(Debug, Default)]
pub(crate) struct HistoryRoom {
    events: AtomicUsize,
    json: AtomicUsize,
    record: AtomicUsize,
}

impl HistoryRoom {
    /// Notes the sizes `live` reached, as its procedure finishes (before its history moves out).
    pub(crate) fn note(&self, live: &Live) {
        self.events
            .store(live.events.len().min(MAX_EVENTS), Ordering::Relaxed);
        self.json.store(live.encoded.bytes_len(), Ordering::Relaxed);
        self.record
            .store(live.encoder.last_len(), Ordering::Relaxed);
    }
}

/// A procedure's [`Live`] state, shared by its runner (the only one that changes it while it runs, apart from the
/// rare changes [`Live::show`] makes), the manager's entry and the watchers.
#[derive(Clone)]
pub(crate) struct LiveHandle(Arc<Mutex<Live>>);

impl LiveHandle {
    /// A handle on a new live state showing `info`, whose history moves to the live state.
    pub(crate) fn new(mut info: ProcedureInfo) -> Self {
        let events = std::mem::take(&mut info.events);
        LiveHandle(Arc::new(Mutex::new(Live {
            shown: info,
            events,
            encoded: EncodedHistory::default(),
            encoder: RecordEncoder::default(),
            finished: None,
            to_send: None,
        })))
    }

    /// [`LiveHandle::new`], with the room `room` gives the history, its JSON and the record buffer.
    pub(crate) fn with_room(mut info: ProcedureInfo, room: &HistoryRoom) -> Self {
        let room_for = room.events.load(Ordering::Relaxed);
        // Made with its room, then given the events it starts with: not grown (and copied) to it.
        let mut events = Vec::with_capacity(room_for.max(info.events.len()));
        events.append(&mut info.events);
        let mut encoder = RecordEncoder::default();
        encoder.reuse(Vec::with_capacity(room.record.load(Ordering::Relaxed)));
        LiveHandle(Arc::new(Mutex::new(Live {
            shown: info,
            events,
            encoded: EncodedHistory::with_capacity(room.json.load(Ordering::Relaxed), room_for),
            encoder,
            finished: None,
            to_send: None,
        })))
    }

    /// Whether `other` is a handle on this same live state.
    pub(crate) fn same(&self, other: &LiveHandle) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// The live state, locked.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Live> {
        // Every change under this lock is a field assignment or a bounded push: it cannot panic half-way.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The information shown now, with its history.
    pub(crate) fn info(&self) -> ProcedureInfo {
        self.lock().info()
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

    /// The runner's end: lets go of what only writes need (the history's JSON, the history's room to grow), as the
    /// procedure writes no more records in this run and a finished one stays in memory for the retention window;
    /// then wakes the watchers of a finished procedure with its finished state.
    ///
    /// Why the watchers are woken here, last, and not when the procedure finished: a woken watcher is often a
    /// submitter about to submit the next procedure, whose task then needs a worker thread. Woken while the runner
    /// still had its own end to run (its locks, its admission slot, its task's end), that task found the runner's
    /// thread busy and woke another one, one more thread hand-off per procedure. Until then a watcher reading the
    /// procedure finds the finished state here ([`crate::Watcher::info`]), and a watcher taken from the manager
    /// gets a channel that holds it already.
    pub(crate) fn done_writing(&self) {
        let to_send = {
            let mut live = self.lock();
            live.encoded = EncodedHistory::default();
            live.encoder = RecordEncoder::default();
            live.events.shrink_to_fit();
            live.to_send.take()
        };
        if let Some((channel, finished)) = to_send {
            channel.send_replace(finished);
        }
    }
}

impl std::fmt::Debug for LiveHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let live = self.lock();
        f.debug_struct("LiveHandle")
            .field("state", &live.shown.state)
            .field("step", &live.shown.step)
            .field("events", &live.events.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::local::NewProcedure;
    use crate::procedure::{ProcedureId, ProcedureWithId};
    use crate::testing::Steps;

    fn info(id: &str) -> ProcedureInfo {
        let new = NewProcedure::new(
            ProcedureWithId::new(ProcedureId::new(id), Box::new(Steps::new(1, true))),
            None,
        )
        .unwrap();
        ProcedureInfo::from(&new.record)
    }

    /// A live state starts with the room the last noted one reached: its history's list and JSON and its record
    /// buffer grow into it instead of from nothing. Before anything was noted, it starts empty.
    #[test]
    fn a_new_live_state_starts_with_the_room_the_last_finished_one_reached() {
        let room = HistoryRoom::default();
        let first = LiveHandle::with_room(info("first"), &room);
        assert!(first.lock().events.capacity() < 21, "nothing noted yet");
        {
            let mut live = first.lock();
            for attempt in 0..20 {
                live.push(
                    now_ms(),
                    EventKind::StepStarted {
                        step: None,
                        attempt,
                    },
                );
            }
            let live = &mut *live;
            for event in &live.events {
                live.encoded.push(event).unwrap();
            }
            live.encoder.reuse(vec![b' '; 700]);
            room.note(live);
        }
        let second = LiveHandle::with_room(info("second"), &room);
        let live = second.lock();
        assert!(live.events.capacity() >= 21, "{}", live.events.capacity());
        assert!(
            live.encoded.capacity() >= first.lock().encoded.bytes_len(),
            "{} < {}",
            live.encoded.capacity(),
            first.lock().encoded.bytes_len()
        );
        assert!(live.encoder.spare_capacity() >= 700);
    }
}
