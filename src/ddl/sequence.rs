//! [`Sequence`]: ids from a kv-backed counter, reserved in batches.
//!
//! The key holds, as decimal text, the first id not yet reserved by anyone. To hand out ids, a sequence reserves
//! `[current, current + step)` with one compare-and-put and then serves that range from memory. Ids of a reserved
//! range that were never handed out (the process stopped) are skipped, never reused: a new sequence on the same kv
//! continues after the last reserved range.

use std::ops::Range;

use snafu::ensure;
use tokio::sync::Mutex;

use crate::error::{CorruptSequenceSnafu, Result, SequenceContentionSnafu, SequenceExhaustedSnafu};
use crate::kv::{CompareAndPutRequest, KvBackendRef};

/// How many times a batch reservation retries after losing a compare-and-put race.
const MAX_RESERVE_ATTEMPTS: usize = 16;

/// A kv-backed id sequence. Ids are strictly increasing within one instance and unique across every instance
/// sharing the key.
#[derive(Debug)]
pub struct Sequence {
    kv: KvBackendRef,
    key: String,
    start: u64,
    step: u64,
    max: u64,
    range: Mutex<Range<u64>>,
}

impl Sequence {
    /// A sequence at `key` whose first id is `start`, reserving `step` ids at a time (at least 1), never handing
    /// out an id above `max`.
    pub fn new(kv: KvBackendRef, key: impl Into<String>, start: u64, step: u64, max: u64) -> Self {
        Sequence {
            kv,
            key: key.into(),
            start,
            step: step.max(1),
            max,
            range: Mutex::new(0..0),
        }
    }

    /// The key the sequence lives at.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The next id.
    pub async fn next(&self) -> Result<u64> {
        let mut range = self.range.lock().await;
        if range.is_empty() {
            *range = self.reserve().await?;
        }
        let id = range.start;
        range.start += 1;
        Ok(id)
    }

    /// Reserves the next batch in the kv.
    async fn reserve(&self) -> Result<Range<u64>> {
        let mut current = self.kv.get(self.key.as_bytes()).await?.map(|kv| kv.value);
        for _ in 0..MAX_RESERVE_ATTEMPTS {
            let first = match &current {
                Some(bytes) => self.decode(bytes)?,
                None => self.start,
            };
            ensure!(
                first <= self.max,
                SequenceExhaustedSnafu {
                    key: self.key.clone(),
                    next: first,
                    max: self.max,
                }
            );
            // `end` is exclusive; it may be `max + 1`, which is what the key then holds.
            let end = first
                .saturating_add(self.step)
                .min(self.max.saturating_add(1));
            let resp = self
                .kv
                .compare_and_put(CompareAndPutRequest {
                    key: self.key.as_bytes().to_vec(),
                    expect: current.clone(),
                    value: end.to_string().into_bytes(),
                })
                .await?;
            if resp.success {
                return Ok(first..end);
            }
            current = resp.prev_kv.map(|kv| kv.value);
        }
        SequenceContentionSnafu {
            key: self.key.clone(),
            attempts: MAX_RESERVE_ATTEMPTS,
        }
        .fail()
    }

    fn decode(&self, bytes: &[u8]) -> Result<u64> {
        std::str::from_utf8(bytes)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| {
                CorruptSequenceSnafu {
                    key: self.key.clone(),
                    value: String::from_utf8_lossy(bytes).to_string(),
                }
                .build()
            })
    }
}
