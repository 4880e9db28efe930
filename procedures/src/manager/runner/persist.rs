//! A runner's writes: the next record of its procedure (with its history, encoded once per event), written under
//! the manager's epoch with the step's own writes, and reloading the procedure after a write that may have landed.

use std::future::Future;

use crate::error::{Error, Result};
use crate::event::{EventKind, ProcedureEvent};
use crate::procedure::{Output, ProcedureId};
use crate::record::{
    MAX_EVENTS, ProcedureRecord, ProcedureState, RECORD_FORMAT_VERSION, declared_keys, now_ms,
};
use crate::step_writes::StepWrites;
use crate::store::{WriteOp, WriteOutcome};

use super::{HistoryTail, Live, Runner, Stopped};

impl Runner {
    pub(super) fn finish(
        &mut self,
        output: Option<Output>,
    ) -> impl Future<Output = Result<(), Stopped>> + Send + '_ {
        self.persist(ProcedureState::Done, output, None, Some(EventKind::Done))
    }

    /// Persists a step of a running procedure (its history since the last write rides along).
    pub(super) fn persist_step(&mut self) -> impl Future<Output = Result<(), Stopped>> + Send + '_ {
        self.persist(ProcedureState::Running, None, None, None)
    }

    /// The next record (step + 1) with the procedure's current data, its history plus `event` (the state change
    /// this write makes), and its bytes. When the data cannot be dumped or serialised, the procedure stops without
    /// writing.
    pub(super) fn next_record(
        &self,
        state: ProcedureState,
        output: Option<Output>,
        error: Option<String>,
        waiting_for: Vec<ProcedureId>,
        event: Option<EventKind>,
    ) -> Result<(ProcedureRecord, Vec<u8>, HistoryTail), Stopped> {
        let data = match self.procedure.dump() {
            Ok(data) => data,
            Err(e) if state.is_finished() || state == ProcedureState::RollingBack => {
                // The last persisted data still describes the procedure; the state change matters more.
                tracing::warn!(id = %self.id(), error = %e, "cannot dump procedure state; keeping the last one");
                self.record.data.clone()
            }
            Err(e) => {
                self.stop_with(format!("cannot dump its state: {e}"));
                return Err(Stopped);
            }
        };
        let now = now_ms();
        let mut record = ProcedureRecord {
            format_version: RECORD_FORMAT_VERSION,
            type_name: self.record.type_name.clone(),
            id: self.record.id.clone(),
            parent_id: self.record.parent_id.clone(),
            step: self.record.step + 1,
            state,
            data,
            output,
            error,
            waiting_for,
            created_at_ms: self.record.created_at_ms,
            updated_at_ms: now,
            step_name: self.procedure.step_name(),
            lock_keys: declared_keys(&self.procedure.lock_key()),
            events: Vec::new(),
        };
        record.format_version = record.required_format_version();
        // Encoded under the live lock (the history's JSON is borrowed from it), the error handled after it: stopping
        // takes that lock too.
        let encoded = encode_next(&mut self.live(), &record, event, now);
        let (value, tail, events) = match encoded {
            Ok(encoded) => encoded,
            Err(source) => return Err(self.unserialisable(source)),
        };
        if cfg!(debug_assertions) {
            record.events = events;
            debug_assert_eq!(
                serde_json::to_vec(&record).ok().as_deref(),
                Some(value.as_slice()),
                "a record encoded with its cached history differs from its plain encoding"
            );
            record.events = Vec::new();
        }
        Ok((record, value, tail))
    }

    /// A record that cannot be serialised: the procedure stops without writing.
    pub(super) fn unserialisable(&self, source: serde_json::Error) -> Stopped {
        let e = Error::Serialize {
            id: self.record.id.clone(),
            what: "record",
            source,
        };
        self.stop_with(e.to_string());
        Stopped
    }

    /// Writes the next record (step + 1) and publishes it. On a write that fails for good, the procedure stops
    /// without any further write; the error shows in its information.
    /// A plain function around `persist_with`, so its future is that one, not one more layer holding the same
    /// arguments.
    pub(super) fn persist(
        &mut self,
        state: ProcedureState,
        output: Option<Output>,
        error: Option<String>,
        event: Option<EventKind>,
    ) -> impl Future<Output = Result<(), Stopped>> + Send + '_ {
        self.persist_with(state, output, error, event, Vec::new())
    }

    /// [`Runner::persist`], with `extra` ops in the same atomic write.
    pub(super) async fn persist_with(
        &mut self,
        state: ProcedureState,
        output: Option<Output>,
        error: Option<String>,
        event: Option<EventKind>,
        extra: Vec<WriteOp>,
    ) -> Result<(), Stopped> {
        if self.inner.is_halted() {
            return Err(Stopped);
        }
        let (record, value, tail) = self.next_record(state, output, error, Vec::new(), event)?;
        self.lend_put(value, extra);
        let written = self
            .inner
            .write_joined(
                self.epoch,
                Vec::new(),
                &self.put,
                None,
                std::slice::from_ref(&record.id),
            )
            .await;
        let value = self.take_put();
        self.live().encoder.reuse(value);
        match written {
            Ok(WriteOutcome::Applied) => {
                self.written_history(tail);
                self.record = record;
                self.publish_written();
                Ok(())
            }
            Ok(WriteOutcome::Rejected { current }) => {
                self.stop_with(format!(
                    "the state store refused the write of step {}: {current:?}",
                    record.step
                ));
                Err(Stopped)
            }
            Err(e) if e.is_fatal() => {
                self.halt_on(&e);
                Err(Stopped)
            }
            Err(e) => {
                if !self.inner.is_halted() {
                    tracing::warn!(id = %self.id(), error = %e, "procedure stalls: cannot persist its state");
                    self.stop_with(e.to_string());
                }
                Err(Stopped)
            }
        }
    }

    /// Lends the record's bytes `value` to the kept write of the next record ([`Runner::put`]), followed by `extra`
    /// ops.
    fn lend_put(&mut self, value: Vec<u8>, extra: Vec<WriteOp>) {
        if let Some(WriteOp::Put { value: lent, .. }) = self.put.first_mut() {
            *lent = value;
        }
        self.put.extend(extra);
    }

    /// Takes back the bytes [`Runner::lend_put`] lent, once the write is over, leaving the kept write as it was.
    fn take_put(&mut self) -> Vec<u8> {
        self.put.truncate(1);
        match self.put.first_mut() {
            Some(WriteOp::Put { value, .. }) => std::mem::take(value),
            _ => Vec::new(),
        }
    }

    /// Writes the next record with `state` together with a step's own `writes`: in one commit when the state store
    /// joins their store, else the writes alone first (a side-effect point follows, for the crash harness) and then
    /// the record. `Ok(Err(e))`: the writes were refused or could not be applied — the step's error; the procedure
    /// goes back to its last stored state first (its in-memory state ran ahead), so a retry or a rollback starts
    /// from what is stored.
    pub(super) async fn persist_step_writes(
        &mut self,
        state: ProcedureState,
        output: Option<Output>,
        event: Option<EventKind>,
        writes: StepWrites,
    ) -> Result<Result<(), Error>, Stopped> {
        if self.inner.is_halted() {
            return Err(Stopped);
        }
        let joined = writes
            .store()
            .is_some_and(|store| self.inner.store.joins(store.as_ref()));
        if !joined {
            let applied = match writes.apply_alone().await {
                Ok(()) => match &self.inner.hook {
                    Some(hook) => hook.on_side_effect(self.id(), "applied the step's writes"),
                    None => Ok(()),
                },
                Err(e) => Err(e),
            };
            return match applied {
                Ok(()) => {
                    Box::pin(self.persist(state, output, None, event)).await?;
                    Ok(Ok(()))
                }
                Err(e) if e.is_fatal() => {
                    self.halt_on(&e);
                    Err(Stopped)
                }
                Err(e) => {
                    self.reload()?;
                    Ok(Err(e))
                }
            };
        }
        let (record, value, tail) = self.next_record(state, output, None, Vec::new(), event)?;
        self.lend_put(value, Vec::new());
        let written = self
            .inner
            .write_joined(
                self.epoch,
                Vec::new(),
                &self.put,
                Some(&writes),
                std::slice::from_ref(&record.id),
            )
            .await;
        let value = self.take_put();
        match written {
            Ok(WriteOutcome::Applied) => {
                self.written_history(tail);
                self.record = record;
                self.publish_written();
                Ok(Ok(()))
            }
            Ok(WriteOutcome::Rejected { current }) => {
                // A write retried after its answer was lost finds its own step writes applied: the record it wrote
                // is there, byte for byte (it carries its own timestamp).
                // Borrowed from the kept write's field alone: the read's future holds the borrow.
                let key = self.put.first().map_or("", WriteOp::key);
                let stored = Box::pin(self.inner.read(|| self.inner.store.get(key))).await;
                if matches!(&stored, Ok(Some(bytes)) if *bytes == value) {
                    self.written_history(tail);
                    self.record = record;
                    self.publish_written();
                    return Ok(Ok(()));
                }
                self.reload()?;
                Ok(Err(writes.rejected(&current)))
            }
            Err(e) if e.is_fatal() => {
                self.halt_on(&e);
                Err(Stopped)
            }
            // Too large for one commit: the step's writes do not fit with the record (bad input, not a store fault).
            Err(e @ Error::StoreLimit { .. }) => {
                self.reload()?;
                Ok(Err(e))
            }
            Err(e) => {
                if !self.inner.is_halted() {
                    tracing::warn!(id = %self.id(), error = %e, "procedure stalls: cannot persist its state");
                    self.stop_with(e.to_string());
                }
                Err(Stopped)
            }
        }
    }

    /// Rebuilds the procedure from its last stored record (see [`Runner::persist_step_writes`] and
    /// [`Runner::interrupted`]); it stalls when its loader refuses.
    pub(super) fn reload(&mut self) -> Result<(), Stopped> {
        match self.inner.reload(&self.record) {
            Ok(procedure) => {
                self.procedure = procedure;
                Ok(())
            }
            Err(e) => {
                self.stop_with(format!("cannot go back to its stored state: {e}"));
                Err(Stopped)
            }
        }
    }
}

/// The bytes of `record` with its history: the live events' JSON (encoded once each, here or at an earlier write),
/// then the event this write adds (`event`, at `now`), the oldest dropped beyond [`MAX_EVENTS`]. Returns the bytes,
/// the history they add to the live one, and (debug builds only, to check the encoding) the full history.
pub(super) fn encode_next(
    live: &mut Live,
    record: &ProcedureRecord,
    event: Option<EventKind>,
    now: u64,
) -> serde_json::Result<(Vec<u8>, HistoryTail, Vec<ProcedureEvent>)> {
    while live.encoded.len() < live.events.len() {
        let next = &live.events[live.encoded.len()];
        live.encoded.push(next)?;
    }
    let added = match event {
        Some(kind) => {
            let event = ProcedureEvent { at_ms: now, kind };
            let json = serde_json::to_string(&event)?;
            Some((event, json))
        }
        None => None,
    };
    let total = live.events.len() + usize::from(added.is_some());
    let dropped = total.saturating_sub(MAX_EVENTS);
    let live = &mut *live;
    let value = live.encoder.encode(
        record,
        live.encoded.after(dropped),
        added.as_ref().map(|(_, json)| json.as_str()),
    )?;
    let events = if cfg!(debug_assertions) {
        let mut events = live.events.clone();
        events.extend(added.as_ref().map(|(event, _)| event.clone()));
        let extra = events.len().saturating_sub(MAX_EVENTS);
        events.drain(..extra);
        events
    } else {
        Vec::new()
    };
    Ok((value, HistoryTail { added }, events))
}
