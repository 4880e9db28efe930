//! A procedure's event history: what happened to it, kept bounded and written with its state.
//!
//! Each procedure keeps its last [`crate::record::MAX_EVENTS`] events. An event that describes a persisted state
//! change (submitted, a persisted step finished, rolling back, failed, done) is put in the record of that very write;
//! an event that changes no persisted state (a step started, a retry, a lock wait, a recovery, a step that persists
//! nothing) is kept in the manager's memory — shown at once in [`crate::ProcedureInfo::events`] — and rides on the
//! procedure's next write. Events of a procedure that stops without another write (stalled, fenced) are therefore in
//! memory only; see `docs/procedures.md`.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::procedure::ProcedureId;
use crate::record::MAX_EVENTS;

/// The longest text an event keeps (an error message, a reason), in bytes; longer texts are cut at a character
/// boundary and end with `…`.
pub const MAX_EVENT_TEXT: usize = 512;

/// One thing that happened to a procedure, and when.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcedureEvent {
    /// When (ms since the Unix epoch).
    pub at_ms: u64,
    /// What.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// What happened. Stored with the tag `event` and the variant's fields next to it, e.g.
/// `{"at_ms":…,"event":"retry","step":"Allocate","attempt":2,"error":"…","delay_ms":200}`.
///
/// Non-exhaustive: more events may be added.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum EventKind {
    /// Its first record was written.
    Submitted,
    /// A manager of this epoch loaded its unfinished record and resumes it.
    Recovered {
        /// The recovering manager's epoch.
        epoch: u64,
    },
    /// It began to wait for a lock key.
    LockWaitBegan {
        /// The key it waits for.
        key: String,
        /// The procedure in its way (a holder of the key, or a request queued ahead).
        holder: ProcedureId,
    },
    /// It got its lock keys after waiting.
    LockWaitEnded {
        /// The key it waited for.
        key: String,
        /// How long it waited (ms).
        waited_ms: u64,
    },
    /// A step started.
    StepStarted {
        /// The step's name, when the procedure names its steps.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<String>,
        /// The attempt of this step (1 on its first run).
        attempt: u32,
    },
    /// A step finished without error.
    StepFinished {
        /// The step's name, when the procedure names its steps.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<String>,
        /// How long the step ran (ms).
        duration_ms: u64,
    },
    /// A step failed with a retryable error and runs again after a delay.
    Retry {
        /// The step's name, when the procedure names its steps.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<String>,
        /// The attempt that failed.
        attempt: u32,
        /// The error (truncated to [`MAX_EVENT_TEXT`]).
        error: String,
        /// The delay before the next attempt (ms).
        delay_ms: u64,
    },
    /// It suspended itself until its subprocedures finish.
    Suspended {
        /// How many subprocedures it waits for.
        children: usize,
    },
    /// A step failed for good and the procedure undoes its work.
    RollingBack {
        /// The error that caused it (truncated).
        error: String,
    },
    /// It finished with its output.
    Done,
    /// It finished with an error.
    Failed {
        /// The error (truncated).
        error: String,
    },
    /// It cannot make progress in this manager; nothing more is written for it here.
    Stalled {
        /// Why (truncated).
        reason: String,
    },
    /// A newer manager claimed the store; this one stopped without another write.
    Fenced {
        /// The newer epoch.
        epoch: u64,
    },
    /// An operator paused it; it runs no step until resumed (written in its `paused` record).
    Paused,
    /// An operator resumed it (written in the record that sets it `running` again).
    Resumed,
    /// An operator's cancel reached it (written in the `rolling_back` or `cancelled` record it leads to).
    CancelRequested,
    /// Its rollback ended: `completed` when every undo succeeded, else with the rollback's error.
    RolledBack {
        /// Whether the rollback completed.
        completed: bool,
        /// The rollback's error, when it did not complete.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// It ended cancelled (written in the `cancelled` record).
    Cancelled,
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let step = |s: &Option<String>| s.as_deref().map(|s| format!(" {s}")).unwrap_or_default();
        match self {
            EventKind::Submitted => write!(f, "submitted"),
            EventKind::Recovered { epoch } => write!(f, "recovered by epoch {epoch}"),
            EventKind::LockWaitBegan { key, holder } => {
                write!(f, "waits for lock '{key}' (in its way: {holder})")
            }
            EventKind::LockWaitEnded { key, waited_ms } => {
                write!(f, "got lock '{key}' after {waited_ms} ms")
            }
            EventKind::StepStarted { step: s, attempt } => {
                write!(f, "step{} started (attempt {attempt})", step(s))
            }
            EventKind::StepFinished {
                step: s,
                duration_ms,
            } => write!(f, "step{} finished in {duration_ms} ms", step(s)),
            EventKind::Retry {
                step: s,
                attempt,
                error,
                delay_ms,
            } => write!(
                f,
                "step{} attempt {attempt} failed, retry in {delay_ms} ms: {error}",
                step(s)
            ),
            EventKind::Suspended { children } => {
                write!(f, "waits for {children} subprocedure(s)")
            }
            EventKind::RollingBack { error } => write!(f, "rolling back: {error}"),
            EventKind::Done => write!(f, "done"),
            EventKind::Failed { error } => write!(f, "failed: {error}"),
            EventKind::Stalled { reason } => write!(f, "stalled: {reason}"),
            EventKind::Fenced { epoch } => write!(f, "fenced by epoch {epoch}"),
            EventKind::Paused => write!(f, "paused"),
            EventKind::Resumed => write!(f, "resumed"),
            EventKind::CancelRequested => write!(f, "cancel requested"),
            EventKind::RolledBack {
                completed: true, ..
            } => write!(f, "rolled back"),
            EventKind::RolledBack { error, .. } => write!(
                f,
                "rollback failed: {}",
                error.as_deref().unwrap_or("unknown error")
            ),
            EventKind::Cancelled => write!(f, "cancelled"),
        }
    }
}

/// `text` cut to at most [`MAX_EVENT_TEXT`] bytes at a character boundary, ending with `…` when cut.
pub fn truncate_text(text: &str) -> String {
    if text.len() <= MAX_EVENT_TEXT {
        return text.to_string();
    }
    let ellipsis = '…';
    let mut end = MAX_EVENT_TEXT - ellipsis.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = text[..end].to_string();
    out.push(ellipsis);
    out
}

/// Appends an event at `at_ms` to `events`, dropping the oldest beyond [`MAX_EVENTS`].
pub(crate) fn push_event(events: &mut Vec<ProcedureEvent>, at_ms: u64, kind: EventKind) {
    events.push(ProcedureEvent { at_ms, kind });
    if events.len() > MAX_EVENTS {
        let extra = events.len() - MAX_EVENTS;
        events.drain(..extra);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_texts_are_cut_at_a_character_boundary() {
        let text = "é".repeat(MAX_EVENT_TEXT);
        let cut = truncate_text(&text);
        assert!(cut.len() <= MAX_EVENT_TEXT, "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert_eq!(truncate_text("short"), "short");
    }

    #[test]
    fn the_history_keeps_the_newest_events() {
        let mut events = Vec::new();
        for i in 0..(MAX_EVENTS as u64 + 10) {
            push_event(&mut events, i, EventKind::Done);
        }
        assert_eq!(events.len(), MAX_EVENTS);
        assert_eq!(events[0].at_ms, 10);
        assert_eq!(events[MAX_EVENTS - 1].at_ms, MAX_EVENTS as u64 + 9);
    }

    #[test]
    fn an_event_is_stored_with_its_tag_next_to_its_fields() {
        let event = ProcedureEvent {
            at_ms: 5,
            kind: EventKind::Retry {
                step: Some("Allocate".into()),
                attempt: 2,
                error: "boom".into(),
                delay_ms: 200,
            },
        };
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"at_ms":5,"event":"retry","step":"Allocate","attempt":2,"error":"boom","delay_ms":200})
        );
        assert_eq!(
            serde_json::from_value::<ProcedureEvent>(json).unwrap(),
            event
        );
    }
}
