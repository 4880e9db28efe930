//! [`Sequence`]: ids from a kv-backed counter, reserved in batches.
//!
//! The key holds, as decimal text, the first id not yet reserved by anyone. To hand out ids, a sequence reserves
//! `[current, current + n)` with one compare-and-put and then serves that range from memory. Only its first
//! reservation reads the key: later ones expect the value it wrote, and a compare that fails answers with the key's
//! value. Ids of a reserved range that were never handed out (the process stopped) are skipped, never reused: a new
//! sequence on the same kv continues after the last reserved range. A key holding less than the sequence's start is
//! read as the start.
//!
//! `n` is the sequence's step, or, when more callers than that are waiting for an id at the moment a reservation
//! starts, their number (at most [`MAX_RESERVATION`]): a burst of concurrent callers (a DDL storm) is served by one
//! reservation instead of one per `step` callers, each of which would hold the others behind one store commit.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use snafu::ensure;
use tokio::sync::Mutex;

use crate::ddl::error::{
    CorruptSequenceSnafu, Result, SequenceContentionSnafu, SequenceExhaustedSnafu,
};
use crate::kv::{CompareAndPutRequest, KvBackendRef};

/// How many times a batch reservation retries after losing a compare-and-put race.
const MAX_RESERVE_ATTEMPTS: usize = 16;

/// The most ids one reservation takes when many callers wait at once.
pub const MAX_RESERVATION: u64 = 1024;

/// A kv-backed id sequence. Ids are strictly increasing within one instance and unique across every instance
/// sharing the key.
#[derive(Debug)]
pub struct Sequence {
    kv: KvBackendRef,
    key: String,
    start: u64,
    step: u64,
    max: u64,
    /// The ids reserved and not handed out yet, and what this sequence last wrote to its key (`None` before its
    /// first reservation): the expected value of the next reservation's compare-and-put, so it needs no read first.
    /// A key moved by another writer meanwhile fails that compare, which answers with the key's value.
    range: Mutex<(Range<u64>, Option<Vec<u8>>)>,
    /// Callers inside [`Sequence::next`] (waiting for the range or holding it).
    waiting: AtomicU64,
}

/// Counts a caller of [`Sequence::next`] for as long as it is inside, cancelled or not.
struct Waiting<'a>(&'a AtomicU64);

impl<'a> Waiting<'a> {
    fn enter(count: &'a AtomicU64) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
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
            range: Mutex::new((0..0, None)),
            waiting: AtomicU64::new(0),
        }
    }

    /// The key the sequence lives at.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The next id.
    pub async fn next(&self) -> Result<u64> {
        let _waiting = Waiting::enter(&self.waiting);
        let mut guard = self.range.lock().await;
        let (range, written) = &mut *guard;
        if range.is_empty() {
            // This caller and every one queued behind it get an id of the same reservation.
            let callers = self.waiting.load(Ordering::Relaxed);
            let n = self.step.max(callers.min(MAX_RESERVATION));
            let (reserved, value) = self.reserve(n, written.take()).await?;
            *range = reserved;
            *written = Some(value);
        }
        let id = range.start;
        range.start += 1;
        Ok(id)
    }

    /// Reserves the next `n` ids in the kv (fewer at `max`); returns them and the value written. `known` is what
    /// the key is believed to hold (what this sequence last wrote); without it the key is read first.
    async fn reserve(&self, n: u64, known: Option<Vec<u8>>) -> Result<(Range<u64>, Vec<u8>)> {
        let mut current = match known {
            Some(value) => Some(value),
            None => self.kv.get(self.key.as_bytes()).await?.map(|kv| kv.value),
        };
        for _ in 0..MAX_RESERVE_ATTEMPTS {
            // A key below the start (written by hand or by another tool) never makes ids below the start: they are
            // reserved for others (system tables for table ids).
            let first = match &current {
                Some(bytes) => self.decode(bytes)?.max(self.start),
                None => self.start,
            };
            // `end` is exclusive; it may be `max + 1`, which is what the key then holds. At `u64::MAX` no end past
            // the id can be stored, so that id is never handed out.
            let end = first.saturating_add(n).min(self.max.saturating_add(1));
            ensure!(
                first <= self.max && first < end,
                SequenceExhaustedSnafu {
                    key: self.key.clone(),
                    next: first,
                    max: self.max,
                }
            );
            let value = end.to_string().into_bytes();
            let resp = self
                .kv
                .compare_and_put(CompareAndPutRequest {
                    key: self.key.as_bytes().to_vec(),
                    expect: current.clone(),
                    value: value.clone(),
                })
                .await?;
            if resp.success {
                return Ok((first..end, value));
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use super::*;
    use crate::kv::{MemoryKvBackend, PutRequest};

    fn kv() -> KvBackendRef {
        Arc::new(MemoryKvBackend::new())
    }

    #[tokio::test]
    async fn reserves_in_batches_and_a_new_instance_continues_after_the_last_batch() {
        let kv = kv();
        let a = Sequence::new(kv.clone(), "seq", 1024, 10, u64::MAX);
        assert_eq!(a.next().await.unwrap(), 1024);
        assert_eq!(a.next().await.unwrap(), 1025);
        assert_eq!(kv.get(b"seq").await.unwrap().unwrap().value, b"1034");
        // A restart: the unused ids of the first batch are skipped, never handed out again.
        let b = Sequence::new(kv.clone(), "seq", 1024, 10, u64::MAX);
        assert_eq!(b.next().await.unwrap(), 1034);
        assert_eq!(a.next().await.unwrap(), 1026);
        for expected in 1027..1034 {
            assert_eq!(a.next().await.unwrap(), expected);
        }
        // `a` used up its batch and reserves after `b`'s.
        assert_eq!(a.next().await.unwrap(), 1044);
    }

    /// A backend that counts the reads of its key.
    #[derive(Debug)]
    struct CountedReads {
        inner: KvBackendRef,
        reads: AtomicU64,
    }

    #[async_trait::async_trait]
    impl crate::kv::KvWrapper for CountedReads {
        fn inner(&self) -> &dyn crate::kv::KvBackend {
            self.inner.as_ref()
        }

        async fn get(&self, key: &[u8]) -> crate::kv::Result<Option<crate::kv::KeyValue>> {
            self.reads.fetch_add(1, Ordering::Relaxed);
            self.inner.get(key).await
        }
    }

    #[tokio::test]
    async fn only_the_first_reservation_reads_the_key_and_a_key_moved_meanwhile_is_honoured() {
        let inner = kv();
        let counted = Arc::new(CountedReads {
            inner: inner.clone(),
            reads: AtomicU64::new(0),
        });
        let seq = Sequence::new(counted.clone(), "seq", 0, 2, u64::MAX);
        for expected in 0..6 {
            assert_eq!(seq.next().await.unwrap(), expected);
        }
        // Three reservations, one read: the later ones expect what the sequence itself wrote.
        assert_eq!(counted.reads.load(Ordering::Relaxed), 1);
        assert_eq!(inner.get(b"seq").await.unwrap().unwrap().value, b"6");
        // Another writer moves the key: the next compare-and-put fails, answers with the key's value, and the
        // reservation continues from there.
        inner
            .put(PutRequest {
                key: b"seq".to_vec(),
                value: b"100".to_vec(),
                prev_kv: false,
            })
            .await
            .unwrap();
        assert_eq!(seq.next().await.unwrap(), 100);
        assert_eq!(inner.get(b"seq").await.unwrap().unwrap().value, b"102");
        assert_eq!(counted.reads.load(Ordering::Relaxed), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn callers_waiting_at_once_share_one_reservation() {
        let kv = kv();
        let seq = Arc::new(Sequence::new(kv.clone(), "seq", 1024, 10, u64::MAX));
        // Hold the range so that 50 callers queue behind it, as while a reservation is in flight.
        let held = seq.range.lock().await;
        let callers: Vec<_> = (0..50)
            .map(|_| {
                let seq = seq.clone();
                tokio::spawn(async move { seq.next().await.unwrap() })
            })
            .collect();
        while seq.waiting.load(Ordering::Relaxed) < 50 {
            tokio::task::yield_now().await;
        }
        drop(held);
        let mut ids = BTreeSet::new();
        for caller in callers {
            assert!(
                ids.insert(caller.await.unwrap()),
                "an id was handed out twice"
            );
        }
        // One reservation of 50 ids (not five of 10), served in order.
        assert_eq!(
            ids.into_iter().collect::<Vec<_>>(),
            (1024..1074).collect::<Vec<_>>()
        );
        assert_eq!(kv.get(b"seq").await.unwrap().unwrap().value, b"1074");
        assert_eq!(seq.waiting.load(Ordering::Relaxed), 0);
        // Alone again: the step.
        assert_eq!(seq.next().await.unwrap(), 1074);
        assert_eq!(kv.get(b"seq").await.unwrap().unwrap().value, b"1084");
    }

    #[tokio::test]
    async fn a_cancelled_caller_is_no_longer_counted() {
        let kv = kv();
        let seq = Sequence::new(kv.clone(), "seq", 0, 2, u64::MAX);
        let held = seq.range.lock().await;
        {
            let waiting = std::pin::pin!(seq.next());
            // Polled once: it waits for the range, counted; then dropped.
            assert!(futures::poll!(waiting).is_pending());
        }
        assert_eq!(seq.waiting.load(Ordering::Relaxed), 0);
        drop(held);
        assert_eq!(seq.next().await.unwrap(), 0);
        assert_eq!(kv.get(b"seq").await.unwrap().unwrap().value, b"2");
    }

    /// A backend whose first compare-and-put waits at a gate, sent but not yet applied, until the test lets it go.
    #[derive(Debug)]
    struct HeldFirstReservation {
        inner: KvBackendRef,
        reached: tokio::sync::Notify,
        release: tokio::sync::Semaphore,
        held: std::sync::atomic::AtomicBool,
    }

    #[async_trait::async_trait]
    impl crate::kv::KvWrapper for HeldFirstReservation {
        fn inner(&self) -> &dyn crate::kv::KvBackend {
            self.inner.as_ref()
        }

        async fn compare_and_put(
            &self,
            req: CompareAndPutRequest,
        ) -> crate::kv::Result<crate::kv::CompareAndPutResponse> {
            if !self.held.swap(true, Ordering::SeqCst) {
                self.reached.notify_one();
                let _permit = self.release.acquire().await;
            }
            self.inner.compare_and_put(req).await
        }
    }

    /// The late reservation of a deposed leader: its compare-and-put on the key is held in flight while the new
    /// leader's sequence reserves and hands out ids. Let go, the held compare-and-put is refused (the key moved), and
    /// the old sequence reserves above everything the new one took: its ids are a gap at worst, never one handed out
    /// twice. The new leader's sequence, its expected value now stale, moves on above both. With the reservation a
    /// blind put, the old sequence would hand out ids the new one had already handed out, and this test fails.
    #[tokio::test]
    async fn a_deposed_leaders_late_reservation_never_hands_out_an_id_twice() {
        let inner = kv();
        let held = Arc::new(HeldFirstReservation {
            inner: inner.clone(),
            reached: tokio::sync::Notify::new(),
            release: tokio::sync::Semaphore::new(0),
            held: std::sync::atomic::AtomicBool::new(false),
        });
        let old = Arc::new(Sequence::new(held.clone(), "seq", 0, 10, u64::MAX));
        let reached = held.reached.notified();
        let late = {
            let old = old.clone();
            tokio::spawn(async move { old.next().await })
        };
        reached.await;
        // The old leader's reservation is in flight; the new leader takes over and hands out ids.
        let new = Sequence::new(inner.clone(), "seq", 0, 10, u64::MAX);
        let mut handed: BTreeSet<u64> = BTreeSet::new();
        for _ in 0..15 {
            assert!(handed.insert(new.next().await.unwrap()));
        }
        held.release.add_permits(1);
        let late_id = late.await.unwrap().unwrap();
        assert!(
            !handed.contains(&late_id),
            "the late reservation handed out {late_id}, already handed out by the new leader"
        );
        assert!(handed.insert(late_id));
        for _ in 0..15 {
            assert!(handed.insert(old.next().await.unwrap()), "an id twice");
            assert!(handed.insert(new.next().await.unwrap()), "an id twice");
        }
        assert_eq!(handed.len(), 46);
    }

    #[tokio::test]
    async fn concurrent_instances_never_share_an_id() {
        let kv = kv();
        let seqs: Vec<_> = (0..4)
            .map(|_| Arc::new(Sequence::new(kv.clone(), "seq", 0, 3, u64::MAX)))
            .collect();
        let mut handles = Vec::new();
        for s in &seqs {
            for _ in 0..25 {
                let s = s.clone();
                handles.push(tokio::spawn(async move { s.next().await.unwrap() }));
            }
        }
        let mut ids = BTreeSet::new();
        for h in handles {
            assert!(ids.insert(h.await.unwrap()), "an id was handed out twice");
        }
        assert_eq!(ids.len(), 100);
    }

    #[tokio::test]
    async fn a_sequence_up_to_u64_max_ends_with_an_error_not_a_repeated_id() {
        let kv = kv();
        let s = Sequence::new(kv.clone(), "seq", u64::MAX - 1, 10, u64::MAX);
        assert_eq!(s.next().await.unwrap(), u64::MAX - 1);
        // The exclusive end of a batch holding u64::MAX cannot be stored: the sequence is exhausted there, and every
        // instance says so instead of handing out (or wrapping past) an id it cannot record as taken.
        let err = s.next().await.unwrap_err().to_string();
        assert!(err.contains("'seq'") && err.contains("exhausted"), "{err}");
        let other = Sequence::new(kv, "seq", 0, 10, u64::MAX);
        let err = other.next().await.unwrap_err().to_string();
        assert!(err.contains("'seq'") && err.contains("exhausted"), "{err}");
    }

    #[tokio::test]
    async fn exhaustion_and_corruption_are_errors_naming_the_key() {
        let kv = kv();
        let s = Sequence::new(kv.clone(), "seq", 5, 10, 6);
        assert_eq!(s.next().await.unwrap(), 5);
        assert_eq!(s.next().await.unwrap(), 6);
        let err = s.next().await.unwrap_err().to_string();
        assert!(err.contains("'seq'") && err.contains("exhausted"), "{err}");

        kv.put(PutRequest {
            key: b"bad".to_vec(),
            value: b"x1".to_vec(),
            prev_kv: false,
        })
        .await
        .unwrap();
        let err = Sequence::new(kv, "bad", 0, 1, u64::MAX)
            .next()
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("'bad'") && err.contains("'x1'"), "{err}");
    }
}
