//! [`EncodedHistory`]: the JSON of a procedure's events as its records carry them, kept in one buffer.
//!
//! A record's `events` array is its events' JSON joined by commas. A runner serialises each event once, straight
//! into this buffer, and a write copies the buffer (less the oldest events beyond [`crate::record::MAX_EVENTS`])
//! into the record: no string per event, no list of them per write.

use std::collections::VecDeque;

use serde::Serialize;

/// The comma-joined JSON of a run of events, oldest first, and the length of each one's JSON.
#[derive(Debug, Default)]
pub(crate) struct EncodedHistory {
    /// `event,event,…` (no brackets).
    bytes: Vec<u8>,
    /// The length of each event's JSON, oldest first.
    lens: VecDeque<usize>,
}

impl EncodedHistory {
    /// Empty, with room for `bytes` of JSON in `events` events.
    pub(crate) fn with_capacity(bytes: usize, events: usize) -> Self {
        EncodedHistory {
            bytes: Vec::with_capacity(bytes),
            lens: VecDeque::with_capacity(events),
        }
    }

    /// How many events it holds.
    pub(crate) fn len(&self) -> usize {
        self.lens.len()
    }

    /// How many bytes of JSON it has room for.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.bytes.capacity()
    }

    /// How many bytes of JSON it holds.
    pub(crate) fn bytes_len(&self) -> usize {
        self.bytes.len()
    }

    /// Appends `event`'s JSON. On an error nothing is appended.
    pub(crate) fn push<T: Serialize + ?Sized>(&mut self, event: &T) -> serde_json::Result<()> {
        let before = self.bytes.len();
        if !self.lens.is_empty() {
            self.bytes.push(b',');
        }
        let start = self.bytes.len();
        if let Err(e) = serde_json::to_writer(&mut self.bytes, event) {
            self.bytes.truncate(before);
            return Err(e);
        }
        self.lens.push_back(self.bytes.len() - start);
        Ok(())
    }

    /// Appends an event's JSON made already (by [`serde_json::to_string`] of the event).
    pub(crate) fn push_json(&mut self, json: &str) {
        if !self.lens.is_empty() {
            self.bytes.push(b',');
        }
        self.bytes.extend_from_slice(json.as_bytes());
        self.lens.push_back(json.len());
    }

    /// Drops the `n` oldest events (all of them when `n` is at least [`EncodedHistory::len`]).
    pub(crate) fn drop_oldest(&mut self, n: usize) {
        if n >= self.lens.len() {
            self.clear();
            return;
        }
        // Each dropped event's JSON and the comma after it.
        let cut: usize = self.lens.drain(..n).map(|len| len + 1).sum();
        self.bytes.drain(..cut);
    }

    /// Drops every event.
    pub(crate) fn clear(&mut self) {
        self.bytes.clear();
        self.lens.clear();
    }

    /// The comma-joined JSON of the events after the `skip` oldest.
    pub(crate) fn after(&self, skip: usize) -> &[u8] {
        if skip >= self.lens.len() {
            return &[];
        }
        let cut: usize = self.lens.iter().take(skip).map(|len| len + 1).sum();
        &self.bytes[cut..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The buffer is always the comma-joined JSON of the events it holds, through pushes, drops and skips.
    #[test]
    fn holds_the_comma_joined_json_of_its_events() {
        let mut history = EncodedHistory::default();
        let mut plain: Vec<String> = Vec::new();
        for i in 0..12u32 {
            if i % 3 == 0 {
                let json = serde_json::to_string(&format!("e\"{i}")).unwrap();
                history.push_json(&json);
                plain.push(json);
            } else {
                history.push(&i).unwrap();
                plain.push(i.to_string());
            }
            if i % 5 == 4 {
                history.drop_oldest(2);
                plain.drain(..2);
            }
            assert_eq!(history.len(), plain.len());
            for skip in 0..=plain.len() + 1 {
                let expected = plain
                    .iter()
                    .skip(skip)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(",");
                assert_eq!(
                    String::from_utf8(history.after(skip).to_vec()).unwrap(),
                    expected,
                    "after {skip} of {plain:?}"
                );
            }
        }
        history.drop_oldest(100);
        assert_eq!((history.len(), history.after(0)), (0, &[][..]));
    }
}
