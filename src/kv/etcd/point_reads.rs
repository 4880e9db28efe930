//! Point reads of concurrent callers, sent to etcd as one request.
//!
//! Every read on etcd is linearizable: the member answers it only once it has applied the writes committed before
//! it arrived. What such a read costs is mostly per request — the gRPC call on both sides, the read-index round,
//! the wait for the apply loop — whatever the number of keys it names. Procedures in flight together each read a
//! few single keys between their commits (a create-table reads its name at Prepare and its id's keys at Allocate),
//! and those requests compete with the batched writes for the same member.
//!
//! So a point read (a `get`, or a `batch_get` within one request's limits) that arrives while another point read
//! is in flight does not go out on its own: it waits for that read's answer, then goes out together with every
//! point read queued meanwhile, as one read-only transaction of gets (within the backend's operation and byte
//! limits; what does not fit waits for the next). A point read that finds none in flight is sent at once, as it
//! would be without this.
//!
//! - **Still linearizable.** A queued read is sent after it was queued, so it sees every write answered before the
//!   call was made.
//! - **Bounded.** A queued caller waits at most twice the request timeout (the read ahead of it, then its own) and
//!   then gets a timeout naming its own key.
//! - **Errors are the caller's own.** When a shared read times out, each of its callers gets the timeout naming its
//!   own key at once. When it fails otherwise, each caller reads alone, so the error it gets is the one its own keys
//!   meet (failing fast, as such errors do).
//! - **A caller dropped while its read is in flight** (its future cancelled): the reads queued behind it each go
//!   out alone.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::oneshot;

use crate::kv::error::{Error, EtcdTimeoutSnafu, Result};
use crate::kv::{KeyValue, display_key};

/// One entry per key read, in the order of the keys: its pair, or `None` when the key is absent.
pub(crate) type Values = Vec<Option<KeyValue>>;

/// Sends one read request.
#[async_trait]
pub(crate) trait Reader: Clone + Send + Sync + 'static {
    /// Reads `keys` in one request; `action` names the call in errors.
    async fn read(&self, action: &'static str, keys: &[Vec<u8>]) -> Result<Values>;
}

/// What one shared read may hold, and how long a queued caller waits.
#[derive(Clone, Debug)]
pub(crate) struct Limits {
    /// Keys per request (etcd's `--max-txn-ops`).
    pub(crate) max_keys: usize,
    /// Key bytes per request.
    pub(crate) max_bytes: usize,
    /// The request timeout: a queued caller waits at most twice this.
    pub(crate) request_timeout: Duration,
    /// The endpoints, for a queued caller's timeout error.
    pub(crate) endpoints: String,
}

/// The point reads in flight and queued (see the module documentation).
#[derive(Debug)]
pub(crate) struct PointReads {
    queue: Mutex<Queue>,
    limits: Limits,
}

#[derive(Debug, Default)]
struct Queue {
    /// A point read is in flight: the next ones queue.
    in_flight: bool,
    waiting: VecDeque<Waiter>,
}

#[derive(Debug)]
struct Waiter {
    action: &'static str,
    keys: Vec<Vec<u8>>,
    answer: oneshot::Sender<Result<Values>>,
}

/// The turn of the read in flight. Handed over, it sends the queued reads next; dropped (its future cancelled, or
/// the task sending it aborted), it leaves no read in flight and lets every queued caller read alone.
struct Turn<'a>(&'a Arc<PointReads>);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let waiting = {
            let mut queue = self.0.queue();
            queue.in_flight = false;
            std::mem::take(&mut queue.waiting)
        };
        // Each sender dropped: its caller reads alone.
        drop(waiting);
    }
}

impl PointReads {
    /// No read in flight, nothing queued.
    pub(crate) fn new(limits: Limits) -> Arc<Self> {
        Arc::new(PointReads {
            queue: Mutex::new(Queue::default()),
            limits,
        })
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        // Changes under this lock are pushes, pops and flag stores: none can panic half-way.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The callers queued behind the read in flight.
    #[cfg(test)]
    fn queued(&self) -> usize {
        self.queue().waiting.len()
    }

    /// Reads `keys` — non-empty, within [`Limits`] — sharing the request with the point reads queued at the same
    /// time (see the module documentation).
    pub(crate) async fn read<R: Reader>(
        self: &Arc<Self>,
        reader: &R,
        action: &'static str,
        keys: Vec<Vec<u8>>,
    ) -> Result<Values> {
        let queued = {
            let mut queue = self.queue();
            if queue.in_flight {
                let (answer, answered) = oneshot::channel();
                queue.waiting.push_back(Waiter {
                    action,
                    keys: keys.clone(),
                    answer,
                });
                Some(answered)
            } else {
                queue.in_flight = true;
                None
            }
        };
        let Some(answered) = queued else {
            let turn = Turn(self);
            let values = reader.read(action, &keys).await;
            self.hand_over(turn, reader);
            return values;
        };
        match tokio::time::timeout(self.limits.request_timeout * 2, answered).await {
            Ok(Ok(values)) => values,
            // The shared read failed (not by its timeout), or its turn was dropped: alone.
            Ok(Err(_)) => reader.read(action, &keys).await,
            Err(_) => self.timed_out(action, &keys[0], self.limits.request_timeout * 2),
        }
    }

    /// After the read of `turn`: the queued reads go out next, on a task of their own (their callers are waiting
    /// on other tasks), or, with nothing queued, no read is in flight any more.
    fn hand_over<R: Reader>(self: &Arc<Self>, turn: Turn<'_>, reader: &R) {
        let Some(batch) = self.next_batch() else {
            // `next_batch` cleared the flag: nothing for the turn's drop to do.
            std::mem::forget(turn);
            return;
        };
        std::mem::forget(turn);
        let reads = self.clone();
        let reader = reader.clone();
        tokio::spawn(async move { reads.serve(reader, batch).await });
    }

    /// The next shared read: as many queued callers, oldest first, as fit [`Limits`] (at least one). With none
    /// queued, clears the in-flight flag and returns `None`.
    fn next_batch(&self) -> Option<Vec<Waiter>> {
        let mut queue = self.queue();
        // Callers that gave up waiting need no read.
        queue.waiting.retain(|w| !w.answer.is_closed());
        if queue.waiting.is_empty() {
            queue.in_flight = false;
            return None;
        }
        let (mut keys, mut bytes) = (0usize, 0usize);
        let mut batch = Vec::new();
        while let Some(next) = queue.waiting.front() {
            let next_bytes: usize = next.keys.iter().map(Vec::len).sum();
            let fits = keys + next.keys.len() <= self.limits.max_keys
                && bytes + next_bytes <= self.limits.max_bytes;
            if !batch.is_empty() && !fits {
                break;
            }
            keys += next.keys.len();
            bytes += next_bytes;
            batch.extend(queue.waiting.pop_front());
        }
        Some(batch)
    }

    /// Sends `batch` as one read and answers its callers, then the batches queued meanwhile, until none is left.
    async fn serve<R: Reader>(self: Arc<Self>, reader: R, mut batch: Vec<Waiter>) {
        let turn = Turn(&self);
        loop {
            let keys: Vec<Vec<u8>> = batch.iter().flat_map(|w| w.keys.iter().cloned()).collect();
            let values = reader.read(batch[0].action, &keys).await;
            self.answer(batch, values);
            match self.next_batch() {
                Some(next) => batch = next,
                None => break,
            }
        }
        // `next_batch` cleared the flag.
        std::mem::forget(turn);
    }

    /// Splits a shared read's answer among its callers, in order.
    fn answer(&self, batch: Vec<Waiter>, values: Result<Values>) {
        match values {
            Ok(values) if values.len() == batch.iter().map(|w| w.keys.len()).sum::<usize>() => {
                let mut values = values.into_iter();
                for waiter in batch {
                    let own = values.by_ref().take(waiter.keys.len()).collect();
                    // A caller that stopped waiting drops its receiver: nothing to tell it.
                    let _ = waiter.answer.send(Ok(own));
                }
            }
            Err(Error::EtcdTimeout { timeout, .. }) => {
                for waiter in batch {
                    let timed_out = self.timed_out(waiter.action, &waiter.keys[0], timeout);
                    let _ = waiter.answer.send(timed_out);
                }
            }
            // Any other error (or an answer of the wrong length, which etcd does not give): each caller reads
            // alone, its sender dropped with the batch.
            _ => drop(batch),
        }
    }

    fn timed_out(&self, action: &'static str, key: &[u8], timeout: Duration) -> Result<Values> {
        EtcdTimeoutSnafu {
            endpoints: self.limits.endpoints.clone(),
            action,
            key: display_key(key),
            timeout,
        }
        .fail()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use tokio::sync::Semaphore;

    use super::*;
    use crate::kv::error::EtcdConfigSnafu;

    /// Builds the error a shared request fails with.
    type MakeError = fn() -> Error;

    /// Reads from a map; holds every read at a gate until the test lets it through; records the keys of each
    /// request; fails requests of several keys when told to.
    #[derive(Clone)]
    struct Fake {
        values: Arc<BTreeMap<Vec<u8>, Vec<u8>>>,
        gate: Arc<Semaphore>,
        requests: Arc<Mutex<Vec<Vec<Vec<u8>>>>>,
        fail_shared: Arc<Mutex<Option<MakeError>>>,
    }

    impl Fake {
        fn new(present: &[&str]) -> Self {
            Fake {
                values: Arc::new(
                    present
                        .iter()
                        .map(|k| (k.as_bytes().to_vec(), format!("v-{k}").into_bytes()))
                        .collect(),
                ),
                gate: Arc::new(Semaphore::new(0)),
                requests: Arc::default(),
                fail_shared: Arc::default(),
            }
        }

        fn requests(&self) -> Vec<Vec<String>> {
            let requests = self.requests.lock().unwrap_or_else(|p| p.into_inner());
            requests
                .iter()
                .map(|keys| {
                    keys.iter()
                        .map(|k| String::from_utf8_lossy(k).into_owned())
                        .collect()
                })
                .collect()
        }
    }

    #[async_trait]
    impl Reader for Fake {
        async fn read(&self, action: &'static str, keys: &[Vec<u8>]) -> Result<Values> {
            self.requests
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(keys.to_vec());
            let permit = self.gate.acquire().await;
            drop(permit);
            let fail = *self.fail_shared.lock().unwrap_or_else(|p| p.into_inner());
            if let (Some(fail), true) = (fail, keys.len() > 1) {
                return Err(fail());
            }
            if keys.len() == 1 && keys[0] == b"broken" {
                return EtcdConfigSnafu {
                    reason: format!("{action} of 'broken' refused"),
                }
                .fail();
            }
            Ok(keys
                .iter()
                .map(|k| {
                    self.values.get(k).map(|v| KeyValue {
                        key: k.clone(),
                        value: v.clone(),
                    })
                })
                .collect())
        }
    }

    fn reads(max_keys: usize) -> Arc<PointReads> {
        PointReads::new(Limits {
            max_keys,
            max_bytes: 1 << 20,
            request_timeout: Duration::from_secs(5),
            endpoints: "fake:1".to_string(),
        })
    }

    fn keys(names: &[&str]) -> Vec<Vec<u8>> {
        names.iter().map(|k| k.as_bytes().to_vec()).collect()
    }

    /// Starts a read of `names` on a task of its own.
    fn spawn_read(
        reads: &Arc<PointReads>,
        fake: &Fake,
        names: &[&str],
    ) -> tokio::task::JoinHandle<Result<Values>> {
        let (reads, fake, keys) = (reads.clone(), fake.clone(), keys(names));
        tokio::spawn(async move { reads.read(&fake, "get", keys).await })
    }

    /// A read of `a` in flight (the fake's gate shut), then reads of `second` and `third` queued behind it.
    async fn two_queued_behind_a(
        reads: &Arc<PointReads>,
        fake: &Fake,
        second: &str,
        third: &str,
    ) -> [tokio::task::JoinHandle<Result<Values>>; 3] {
        let first = spawn_read(reads, fake, &["a"]);
        settle(reads, fake, 1, 0).await;
        let queued = [
            spawn_read(reads, fake, &[second]),
            spawn_read(reads, fake, &[third]),
        ];
        settle(reads, fake, 1, 2).await;
        let [b, c] = queued;
        [first, b, c]
    }

    /// Waits until `n` requests were sent and `queued` callers wait.
    async fn settle(reads: &PointReads, fake: &Fake, n: usize, queued: usize) {
        for _ in 0..10_000 {
            if fake.requests().len() == n && reads.queued() == queued {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!(
            "expected {n} requests and {queued} queued, saw {:?} and {}",
            fake.requests(),
            reads.queued()
        );
    }

    fn present(values: &Values) -> Vec<Option<String>> {
        values
            .iter()
            .map(|v| {
                v.as_ref()
                    .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
            })
            .collect()
    }

    #[tokio::test]
    async fn reads_queued_behind_one_in_flight_go_out_as_one_request_each_answered_its_own() {
        let fake = Fake::new(&["a", "b", "d"]);
        let reads = reads(128);
        let first = spawn_read(&reads, &fake, &["a"]);
        settle(&reads, &fake, 1, 0).await;
        let b = spawn_read(&reads, &fake, &["b"]);
        settle(&reads, &fake, 1, 1).await;
        let cd = spawn_read(&reads, &fake, &["c", "d"]);
        settle(&reads, &fake, 1, 2).await;
        fake.gate.add_permits(100);
        assert_eq!(
            present(&first.await.unwrap().unwrap()),
            [Some("v-a".into())]
        );
        assert_eq!(present(&b.await.unwrap().unwrap()), [Some("v-b".into())]);
        assert_eq!(
            present(&cd.await.unwrap().unwrap()),
            [None, Some("v-d".into())]
        );
        assert_eq!(fake.requests(), [vec!["a"], vec!["b", "c", "d"]]);
        // Nothing left in flight: the next read goes out at once, alone.
        let e = reads.read(&fake, "get", keys(&["e"])).await.unwrap();
        assert_eq!(present(&e), [None]);
        assert_eq!(fake.requests().len(), 3);
    }

    #[tokio::test]
    async fn a_queue_larger_than_one_request_goes_out_in_several_in_order() {
        let fake = Fake::new(&["a", "b", "c", "d"]);
        let reads = reads(2);
        let first = spawn_read(&reads, &fake, &["a"]);
        settle(&reads, &fake, 1, 0).await;
        let mut queued = Vec::new();
        for (i, name) in ["b", "c", "d"].into_iter().enumerate() {
            queued.push(spawn_read(&reads, &fake, &[name]));
            settle(&reads, &fake, 1, i + 1).await;
        }
        fake.gate.add_permits(100);
        first.await.unwrap().unwrap();
        for (read, name) in queued.into_iter().zip(["b", "c", "d"]) {
            assert_eq!(
                present(&read.await.unwrap().unwrap()),
                [Some(format!("v-{name}"))]
            );
        }
        assert_eq!(fake.requests(), [vec!["a"], vec!["b", "c"], vec!["d"]]);
    }

    #[tokio::test]
    async fn a_shared_read_that_fails_leaves_each_caller_its_own_read_and_error() {
        let fake = Fake::new(&["a", "b"]);
        *fake.fail_shared.lock().unwrap() = Some(|| {
            EtcdConfigSnafu {
                reason: "shared read refused",
            }
            .build()
        });
        let reads = reads(128);
        let [first, b, broken] = two_queued_behind_a(&reads, &fake, "b", "broken").await;
        fake.gate.add_permits(100);
        first.await.unwrap().unwrap();
        assert_eq!(present(&b.await.unwrap().unwrap()), [Some("v-b".into())]);
        let e = broken.await.unwrap().unwrap_err().to_string();
        assert!(e.contains("get of 'broken' refused"), "{e}");
        // The shared request, then each caller alone.
        let mut requests = fake.requests();
        requests[2..].sort();
        assert_eq!(
            requests,
            [vec!["a"], vec!["b", "broken"], vec!["b"], vec!["broken"]]
        );
    }

    #[tokio::test]
    async fn a_shared_read_that_times_out_names_each_callers_own_key() {
        let fake = Fake::new(&[]);
        *fake.fail_shared.lock().unwrap() = Some(|| {
            EtcdTimeoutSnafu {
                endpoints: "fake:1",
                action: "get",
                key: "b",
                timeout: Duration::from_secs(5),
            }
            .build()
        });
        let reads = reads(128);
        let [first, b, c] = two_queued_behind_a(&reads, &fake, "b", "c").await;
        fake.gate.add_permits(100);
        first.await.unwrap().unwrap();
        for (read, key) in [(b, "b"), (c, "c")] {
            let e = read.await.unwrap().unwrap_err();
            assert!(
                matches!(&e, Error::EtcdTimeout { key: k, .. } if k == key),
                "{e:?}"
            );
            assert!(e.is_retryable());
        }
        // Not read again alone: the shared request only.
        assert_eq!(fake.requests().len(), 2);
    }

    #[tokio::test]
    async fn the_callers_queued_behind_a_cancelled_read_each_read_alone() {
        let fake = Fake::new(&["b", "c"]);
        let reads = reads(128);
        let [first, b, c] = two_queued_behind_a(&reads, &fake, "b", "c").await;
        first.abort();
        assert!(first.await.unwrap_err().is_cancelled());
        fake.gate.add_permits(100);
        assert_eq!(present(&b.await.unwrap().unwrap()), [Some("v-b".into())]);
        assert_eq!(present(&c.await.unwrap().unwrap()), [Some("v-c".into())]);
        let mut requests = fake.requests();
        requests[1..].sort();
        assert_eq!(requests, [vec!["a"], vec!["b"], vec!["c"]]);
        // No read is left in flight.
        let read = reads.read(&fake, "get", keys(&["b"])).await.unwrap();
        assert_eq!(present(&read), [Some("v-b".into())]);
    }

    #[tokio::test]
    async fn a_queued_caller_gives_up_after_twice_the_request_timeout_naming_its_key() {
        let fake = Fake::new(&[]);
        let reads = PointReads::new(Limits {
            max_keys: 128,
            max_bytes: 1 << 20,
            request_timeout: Duration::from_millis(20),
            endpoints: "fake:1".to_string(),
        });
        // The gate stays shut: the read in flight never ends.
        let _first = spawn_read(&reads, &fake, &["a"]);
        settle(&reads, &fake, 1, 0).await;
        let e = reads.read(&fake, "get", keys(&["b"])).await.unwrap_err();
        assert!(
            matches!(&e, Error::EtcdTimeout { key, timeout, .. }
                if key == "b" && *timeout == Duration::from_millis(40)),
            "{e:?}"
        );
        // The caller that gave up is skipped by the next shared read: no request is sent for it.
        assert!(reads.queue().waiting.iter().all(|w| w.answer.is_closed()));
        assert_eq!(fake.requests().len(), 1);
    }
}
