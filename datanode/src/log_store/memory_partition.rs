//! [`MemoryPartition`]: an in-memory Kafka partition for tests (feature `testing`): offsets from 0, a high and a
//! low watermark, fetches returning whole "batches" as produced, and counters of the calls made, so a test can
//! check how many fetches and records a read cost. Records can also be put in raw (a torn entry, a duplicate) and
//! the log truncated at its head (what DeleteRecords does).

use std::sync::Mutex;

use async_trait::async_trait;

use super::kafka::{FetchedRecord, PartitionLog};
use super::record::EncodedRecord;
use remote_wal::wal::error::Result;

/// Calls made on a [`MemoryPartition`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartitionCalls {
    /// Produce requests.
    pub produces: u64,
    /// Fetch requests.
    pub fetches: u64,
    /// Records handed out by fetches.
    pub records_fetched: u64,
}

#[derive(Debug, Default)]
struct State {
    /// Offset `low + i` is `records[i]`.
    records: Vec<FetchedRecord>,
    /// The first offset of each produce request (fetches return from the batch holding the offset asked for).
    batch_starts: Vec<i64>,
    low: i64,
    next: i64,
    calls: PartitionCalls,
}

/// A raw record: key and value, either possibly missing.
pub type RawRecord = (Option<Vec<u8>>, Option<Vec<u8>>);

/// An in-memory partition 0 of `topic`.
#[derive(Debug)]
pub struct MemoryPartition {
    topic: String,
    state: Mutex<State>,
}

impl MemoryPartition {
    /// An empty partition.
    pub fn new(topic: impl Into<String>) -> Self {
        MemoryPartition {
            topic: topic.into(),
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A test that panicked while holding the lock poisoned it; the data is still what the test wrote.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends raw records (key, value) as one batch, bypassing the log store; returns their offsets.
    pub fn push_raw(&self, records: Vec<RawRecord>) -> Vec<i64> {
        let mut s = self.state();
        if !records.is_empty() {
            let start = s.next;
            s.batch_starts.push(start);
        }
        records
            .into_iter()
            .map(|(key, value)| {
                let offset = s.next;
                s.records.push(FetchedRecord { offset, key, value });
                s.next += 1;
                offset
            })
            .collect()
    }

    /// Every record still kept, in offset order.
    pub fn records(&self) -> Vec<FetchedRecord> {
        self.state().records.clone()
    }

    /// Deletes the records below `offset` (DeleteRecords).
    pub fn delete_below(&self, offset: i64) {
        let mut s = self.state();
        let offset = offset.min(s.next);
        while s.low < offset {
            s.records.remove(0);
            s.low += 1;
        }
    }

    /// The calls made so far.
    pub fn calls(&self) -> PartitionCalls {
        self.state().calls
    }
}

#[async_trait]
impl PartitionLog for MemoryPartition {
    fn topic(&self) -> &str {
        &self.topic
    }

    async fn produce(&self, records: Vec<EncodedRecord>) -> Result<Vec<i64>> {
        self.state().calls.produces += 1;
        Ok(self.push_raw(
            records
                .into_iter()
                .map(|r| (Some(r.key), Some(r.value)))
                .collect(),
        ))
    }

    async fn fetch(&self, offset: i64, max_bytes: i32) -> Result<(Vec<FetchedRecord>, i64)> {
        let mut s = self.state();
        s.calls.fetches += 1;
        // Like Kafka: start at the batch holding `offset`, return at least one record, then stop near max_bytes.
        let batch_start = s
            .batch_starts
            .iter()
            .rev()
            .find(|b| **b <= offset)
            .copied()
            .unwrap_or(offset)
            .max(s.low);
        let first = usize::try_from(batch_start - s.low).unwrap_or(0);
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let limit = usize::try_from(max_bytes).unwrap_or(0);
        for record in s.records.iter().skip(first) {
            let size =
                record.key.as_ref().map_or(0, Vec::len) + record.value.as_ref().map_or(0, Vec::len);
            if !out.is_empty() && bytes + size > limit {
                break;
            }
            bytes += size;
            out.push(record.clone());
        }
        s.calls.records_fetched += out.len() as u64;
        let high = s.next;
        Ok((out, high))
    }

    async fn high_watermark(&self) -> Result<i64> {
        Ok(self.state().next)
    }

    async fn low_watermark(&self) -> Result<i64> {
        Ok(self.state().low)
    }
}
