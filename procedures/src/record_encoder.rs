//! [`RecordEncoder`]: the bytes of a procedure's successive records, each part that does not change between them
//! encoded once.
//!
//! A runner writes a record at every persisted transition. Most of it is the same from one record to the next:
//! the type name, the id and the parent (fixed for the procedure's life), the lock keys (fixed in practice), the
//! history (which only grows: each event's JSON is made once, see `manager::live`). The encoder keeps those parts'
//! bytes and writes the rest — step, state, data, output, error, children waited for, times, step name — with
//! the field names as literal bytes. The result is exactly what `serde_json::to_vec` writes for the record with
//! its history (the field order and the fields left out when empty are [`ProcedureRecord`]'s): a test checks it
//! over generated records, and debug builds check every record a runner writes.

use std::io::Write;

use serde::Serialize;

use crate::manager::HeldKey;
use crate::procedure::ProcedureId;
use crate::record::ProcedureRecord;

/// The encoder of one procedure's records (see the module's documentation).
#[derive(Debug, Default)]
pub(crate) struct RecordEncoder {
    /// The id whose `head` is kept.
    id: Option<ProcedureId>,
    /// `,"type_name":…,"id":…,"parent_id":…` of that procedure.
    head: Vec<u8>,
    /// The lock keys `lock_keys_json` encodes.
    lock_keys: Vec<HeldKey>,
    /// `,"lock_keys":[…]`, or nothing when there are none.
    lock_keys_json: Vec<u8>,
    /// The length of the last record written without its history: the size of the next one's buffer.
    body_len: usize,
    /// The buffer of the last record, given back once written ([`RecordEncoder::reuse`]): the store was handed a
    /// copy, so the next record is written into it instead of a new allocation.
    spare: Vec<u8>,
}

impl RecordEncoder {
    /// The bytes of `record` (whose own `events` are left aside) with `history` (its events' JSON joined by
    /// commas, oldest first, as [`crate::encoded_history::EncodedHistory`] keeps it) and then `added` (one more
    /// event's JSON) as its events.
    pub(crate) fn encode(
        &mut self,
        record: &ProcedureRecord,
        history: &[u8],
        added: Option<&str>,
    ) -> serde_json::Result<Vec<u8>> {
        self.refresh(record)?;
        let history_len = history.len() + added.map_or(0, |a| a.len() + 1);
        let needed = self.body_len.max(192) + 64 + history_len + 12;
        let mut bytes = std::mem::take(&mut self.spare);
        bytes.clear();
        if bytes.capacity() < needed {
            // A new buffer, not a grown one: growing would copy the old record for nothing. With room for a few
            // more steps' events, as the history grows with every write.
            bytes = Vec::with_capacity(needed + needed / 4);
        }
        bytes.extend_from_slice(br#"{"format_version":"#);
        write_json(&mut bytes, &record.format_version)?;
        bytes.extend_from_slice(&self.head);
        bytes.extend_from_slice(br#","step":"#);
        write_json(&mut bytes, &record.step)?;
        bytes.extend_from_slice(br#","state":"#);
        write_json(&mut bytes, &record.state)?;
        bytes.extend_from_slice(br#","data":"#);
        write_json(&mut bytes, &record.data)?;
        bytes.extend_from_slice(br#","output":"#);
        write_json(&mut bytes, &record.output)?;
        bytes.extend_from_slice(br#","error":"#);
        write_json(&mut bytes, &record.error)?;
        if !record.waiting_for.is_empty() {
            bytes.extend_from_slice(br#","waiting_for":"#);
            write_json(&mut bytes, &record.waiting_for)?;
        }
        bytes.extend_from_slice(br#","created_at_ms":"#);
        write_json(&mut bytes, &record.created_at_ms)?;
        bytes.extend_from_slice(br#","updated_at_ms":"#);
        write_json(&mut bytes, &record.updated_at_ms)?;
        if let Some(step_name) = &record.step_name {
            bytes.extend_from_slice(br#","step_name":"#);
            write_json(&mut bytes, step_name)?;
        }
        bytes.extend_from_slice(&self.lock_keys_json);
        self.body_len = bytes.len() + 1;
        if !history.is_empty() || added.is_some() {
            bytes.extend_from_slice(br#","events":["#);
            bytes.extend_from_slice(history);
            if let Some(added) = added {
                if !history.is_empty() {
                    bytes.push(b',');
                }
                bytes.extend_from_slice(added.as_bytes());
            }
            bytes.push(b']');
        }
        bytes.push(b'}');
        Ok(bytes)
    }

    /// Takes back the buffer of a record [`RecordEncoder::encode`] made, once its write no longer needs it (or an
    /// empty one with room for the records to come).
    pub(crate) fn reuse(&mut self, bytes: Vec<u8>) {
        self.spare = bytes;
    }

    /// The room of the buffer the next record is written into.
    #[cfg(test)]
    pub(crate) fn spare_capacity(&self) -> usize {
        self.spare.capacity()
    }

    /// The length of the record last given back with [`RecordEncoder::reuse`] (0 before any).
    pub(crate) fn last_len(&self) -> usize {
        self.spare.len()
    }

    /// Encodes again the kept parts `record` changes: the head for another procedure (an encoder is made per
    /// runner, so only at its first record), the lock keys when they differ from the last ones.
    fn refresh(&mut self, record: &ProcedureRecord) -> serde_json::Result<()> {
        if self.id.as_ref() != Some(&record.id) {
            let mut head = Vec::with_capacity(64);
            head.extend_from_slice(br#","type_name":"#);
            write_json(&mut head, &record.type_name)?;
            head.extend_from_slice(br#","id":"#);
            write_json(&mut head, &record.id)?;
            head.extend_from_slice(br#","parent_id":"#);
            write_json(&mut head, &record.parent_id)?;
            self.head = head;
            self.id = Some(record.id.clone());
        }
        if self.lock_keys != record.lock_keys {
            self.lock_keys_json.clear();
            if !record.lock_keys.is_empty() {
                self.lock_keys_json.extend_from_slice(br#","lock_keys":"#);
                write_json(&mut self.lock_keys_json, &record.lock_keys)?;
            }
            self.lock_keys.clone_from(&record.lock_keys);
        }
        Ok(())
    }
}

/// Appends `value`'s JSON to `bytes`.
fn write_json<T: Serialize + ?Sized>(bytes: &mut Vec<u8>, value: &T) -> serde_json::Result<()> {
    serde_json::to_writer(bytes.by_ref(), value)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::event::{EventKind, ProcedureEvent};
    use crate::record::ProcedureState;

    fn text() -> impl Strategy<Value = String> {
        // Plain, quoted, escaped and non-ASCII text: what the encoder must escape exactly as serde_json does.
        prop_oneof![
            "[a-z_]{0,12}",
            any::<String>(),
            Just("a \"quoted\"\\ text\n\t".to_string()),
        ]
    }

    fn state() -> impl Strategy<Value = ProcedureState> {
        prop::sample::select(ProcedureState::ALL.to_vec())
    }

    fn event() -> impl Strategy<Value = ProcedureEvent> {
        (any::<u64>(), prop::option::of(text()), any::<u32>(), text()).prop_map(
            |(at_ms, step, attempt, error)| ProcedureEvent {
                at_ms,
                kind: if attempt % 2 == 0 {
                    EventKind::StepStarted { step, attempt }
                } else {
                    EventKind::Retry {
                        step,
                        attempt,
                        error,
                        delay_ms: at_ms / 3,
                    }
                },
            },
        )
    }

    prop_compose! {
        fn record()(
            format_version in 1u32..3,
            type_name in text(),
            id in text(),
            parent in prop::option::of(text()),
            step in any::<u64>(),
            state in state(),
            data in prop_oneof![
                Just(serde_json::Value::Null),
                (any::<u32>(), text()).prop_map(|(n, s)| serde_json::json!({ "n": n, "s": s, "list": [1, 2] })),
            ],
            output in prop::option::of(text().prop_map(serde_json::Value::String)),
            error in prop::option::of(text()),
            waiting_for in prop::collection::vec(text(), 0..3),
            created_at_ms in any::<u64>(),
            updated_at_ms in any::<u64>(),
            step_name in prop::option::of(text()),
            lock_keys in prop::collection::vec((text(), any::<bool>()), 0..3),
        ) -> ProcedureRecord {
            ProcedureRecord {
                format_version,
                type_name,
                id: ProcedureId::new(id),
                parent_id: parent.map(ProcedureId::new),
                step,
                state,
                data,
                output,
                error,
                waiting_for: waiting_for.into_iter().map(ProcedureId::new).collect(),
                created_at_ms,
                updated_at_ms,
                step_name,
                lock_keys: lock_keys
                    .into_iter()
                    .map(|(key, exclusive)| HeldKey { key, exclusive })
                    .collect(),
                events: Vec::new(),
            }
        }
    }

    proptest! {
        /// Every record, and every next record of the same procedure (its kept parts reused or refreshed), is byte
        /// for byte what serde_json writes for it with its history.
        #[test]
        fn records_are_byte_for_byte_their_plain_encoding(
            first in record(),
            next in record(),
            events in prop::collection::vec(event(), 0..4),
        ) {
            let mut encoder = RecordEncoder::default();
            let mut second = next;
            // The next record of the same procedure: same id, type and parent; everything else may change.
            second.id = first.id.clone();
            second.type_name = first.type_name.clone();
            second.parent_id = first.parent_id.clone();
            for (record, split) in [(&first, 0), (&second, events.len()), (&first, events.len() / 2)] {
                // The history's JSON as kept (the events before `split`), then each later one as the added one of
                // its own record, as a runner writes them.
                let mut history = crate::encoded_history::EncodedHistory::default();
                for event in &events[..split] {
                    history.push(event).unwrap();
                }
                let mut full = record.clone();
                full.events = events[..split].to_vec();
                let encoded = encoder.encode(record, history.after(0), None).unwrap();
                prop_assert_eq!(
                    String::from_utf8(encoded).unwrap(),
                    serde_json::to_string(&full).unwrap()
                );
                for event in &events[split..] {
                    let added = serde_json::to_string(event).unwrap();
                    full.events.push(event.clone());
                    let encoded = encoder.encode(record, history.after(0), Some(&added)).unwrap();
                    prop_assert_eq!(
                        String::from_utf8(encoded).unwrap(),
                        serde_json::to_string(&full).unwrap()
                    );
                    history.push_json(&added);
                }
            }
        }
    }

    /// An encoder used for another procedure (not what a runner does) encodes that one's head, not the first's.
    #[test]
    fn a_record_of_another_procedure_gets_its_own_head() {
        let mut encoder = RecordEncoder::default();
        let mut record = ProcedureRecord {
            format_version: 1,
            type_name: "t".to_string(),
            id: ProcedureId::new("a"),
            parent_id: None,
            step: 1,
            state: ProcedureState::Running,
            data: serde_json::Value::Null,
            output: None,
            error: None,
            waiting_for: Vec::new(),
            created_at_ms: 1,
            updated_at_ms: 2,
            step_name: None,
            lock_keys: Vec::new(),
            events: Vec::new(),
        };
        encoder.encode(&record, &[], None).unwrap();
        record.id = ProcedureId::new("b");
        assert_eq!(
            encoder.encode(&record, &[], None).unwrap(),
            serde_json::to_vec(&record).unwrap()
        );
    }
}
