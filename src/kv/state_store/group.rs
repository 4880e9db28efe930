//! The write path of the [`KvStateStore`]: each write is prepared into its part of a kv transaction, and with
//! group commit on, the writes of concurrent callers that arrive while a commit is in flight are committed
//! together in the next one.
//!
//! **A batch** is one kv transaction: the epoch condition once (the leader fence's compares when there is one),
//! then every write's own compares; the success branch holds every write's ops, the failure branch reads the epoch
//! key (and the leader key) and every compared key. Writes join a batch only when they name the same epoch
//! condition, touch no key another write of the batch touches (compares and ops alike), and the whole stays within
//! the backend's limits ([`KvBackend::max_txn_ops`], [`KvBackend::max_request_bytes`]); a write that changes the
//! epoch key itself (the manager's claim) always commits alone. The rest wait for the next commit.
//!
//! **Batches in flight**: up to [`KvBackend::max_txns_in_flight`] batches are sent at once (one on redb and
//! memory, several on etcd), on disjoint keys; the epoch claim goes only when nothing else is in flight.
//!
//! **A failed compare** fails only its write. When the transaction is refused, the reads of its failure branch
//! (taken atomically with the compares) say which compares failed: when it is the epoch (or the leader key), every
//! write of the batch is refused as fenced; otherwise the writes whose own compares failed are answered with their
//! rejection, and the others are committed again, without them, in another transaction.
//!
//! **A failed commit** (store unreachable, a connection broken under it) fails the writes of that transaction
//! only, each with the error naming its own key and its retryability: the transaction is one, so any of them may
//! have been applied. Other transactions in flight are answered by their own results.
//!
//! **The durability point**: a caller is answered once the backend has answered the commit that holds its write;
//! the backend answers a commit only once it is durable (redb: the write transaction committed; etcd: the txn
//! applied by a quorum).
//!
//! [`KvBackend::max_txn_ops`]: crate::kv::KvBackend::max_txn_ops
//! [`KvBackend::max_request_bytes`]: crate::kv::KvBackend::max_request_bytes
//! [`KvBackend::max_txns_in_flight`]: crate::kv::KvBackend::max_txns_in_flight

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use procedures::StepWrites;
use procedures::record::EPOCH_KEY;
use procedures::store::{Condition, WriteOp, WriteOutcome};
use tokio::sync::oneshot;

use crate::kv::{Compare, Txn, TxnOp, TxnOpResponse, TxnResponse};

use super::{KvStateStore, LeaderLease, parse_epoch, rejected_by_epoch};

/// The most writes one commit holds, on backends without a limit of their own (redb, memory): it bounds the
/// latency one commit adds to the writes that wait for the next.
pub(super) const MAX_BATCH_WRITES: usize = 512;

/// Bytes set aside in every batch for the epoch condition (its compares and reads).
const EPOCH_RESERVE_BYTES: usize = 512;

/// One write, turned into its part of a kv transaction.
pub(super) struct Prepared {
    /// The store key naming the write in errors.
    first: String,
    /// The write's state conditions, as given (the epoch condition among them).
    conditions: Vec<Condition>,
    /// The step's conditions (raw kv keys), as given.
    step_conditions: Vec<Condition>,
    /// The write's epoch condition: the first state condition on the epoch key.
    epoch: Option<Condition>,
    /// The compares of every other condition (state, then step), in order; each is read back on a refusal.
    compare: Vec<Compare>,
    /// The ops, one per kv key (the last op on a key wins).
    success: Vec<TxnOp>,
    /// Every kv key the write compares (the epoch key excluded) or changes.
    keys: HashSet<Vec<u8>>,
    /// Whether it changes the epoch key (the manager's claim): such a write commits alone.
    writes_epoch: bool,
    /// Bytes of keys and values of its compares, ops and reads.
    bytes: usize,
}

impl Prepared {
    /// Operations it adds to a transaction: compares, and the larger branch.
    fn ops(&self) -> (usize, usize, usize) {
        (self.compare.len(), self.success.len(), self.compare.len())
    }
}

/// How a batch checks its epoch condition.
enum EpochCheck {
    /// No epoch condition.
    None,
    /// A plain compare on the stored epoch; read back on a refusal.
    Plain(Compare),
    /// Under a leader fence: the leader key's value and the stored epoch. Both are read back on a refusal.
    Leader { lease: LeaderLease },
}

/// What the epoch part of a refused transaction read.
enum EpochRead {
    /// It held: another compare failed. The value to report for the epoch condition.
    Held(Option<Vec<u8>>),
    /// It failed: every write of the batch is refused, reporting this value for the epoch condition.
    Refused(Option<Vec<u8>>),
}

/// The queue of writes waiting for a commit, and whether a commit task is running.
#[derive(Debug, Default)]
pub(super) struct GroupCommit {
    queue: Mutex<Queue>,
    /// Notified whenever the commit task ends (see [`GroupCommit::idle`]).
    ended: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Queue {
    pending: VecDeque<Pending>,
    committing: bool,
}

struct Pending {
    write: Prepared,
    reply: oneshot::Sender<procedures::Result<WriteOutcome>>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("first", &self.write.first)
            .finish_non_exhaustive()
    }
}

impl GroupCommit {
    /// Writes waiting for the next commit.
    pub(super) fn queued(&self) -> usize {
        self.lock().pending.len()
    }

    /// Waits until no commit task runs: every batch it sent was answered, and every write queued was committed or
    /// dropped with its caller.
    pub(super) async fn idle(&self) {
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            // Registered before the look, so an end between the look and the wait is not missed.
            ended.as_mut().enable();
            if !self.lock().committing {
                return;
            }
            ended.await;
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // Every change under the lock is a push, a drain or a flag: a poisoned lock still holds a usable queue.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Resets the committing flag when the commit task ends without doing so itself (it panicked, or the runtime
/// dropped it, even before it ever ran: the guard is made before the task is spawned and moves into it): the
/// writes still queued are answered with a retryable error (their senders are dropped), so their callers retry and
/// a new commit task starts.
struct CommitTaskGuard {
    group: Arc<GroupCommit>,
    armed: bool,
}

impl Drop for CommitTaskGuard {
    fn drop(&mut self) {
        if self.armed {
            {
                let mut queue = self.group.lock();
                queue.committing = false;
                queue.pending.clear();
            }
            self.group.ended.notify_waiters();
        }
    }
}

impl KvStateStore {
    /// Turns one write into its part of a kv transaction: `conditions` and `ops` on state keys (under the prefix),
    /// plus `step`'s conditions and ops on raw kv keys. Refuses with [`procedures::Error::StoreLimit`] a write that
    /// could not fit in one transaction even alone.
    pub(super) fn prepare(
        &self,
        conditions: Vec<Condition>,
        ops: Vec<WriteOp>,
        step: Option<&StepWrites>,
    ) -> procedures::Result<Prepared> {
        // The kv txn refuses a key written twice in a branch; applied in order, the last op on a key wins (a step's
        // op after the state's).
        let mut all: Vec<(Vec<u8>, &WriteOp)> =
            ops.iter().map(|op| (self.kv_key(op.key()), op)).collect();
        if let Some(step) = step {
            all.extend(
                step.ops()
                    .iter()
                    .map(|op| (op.key().as_bytes().to_vec(), op)),
            );
        }
        let mut seen = HashSet::new();
        let mut last: Vec<(Vec<u8>, &WriteOp)> = all
            .into_iter()
            .rev()
            .filter(|(key, _)| seen.insert(key.clone()))
            .collect();
        last.reverse();

        let first = last
            .first()
            .map(|(_, op)| op.key().to_string())
            .or_else(|| conditions.first().map(|c| c.key().to_string()))
            .unwrap_or_default();
        let epoch_kv_key = self.kv_key(EPOCH_KEY);
        let epoch_at = conditions.iter().position(|c| c.key() == EPOCH_KEY);
        let epoch = epoch_at.map(|i| conditions[i].clone());
        let step_conditions: Vec<Condition> =
            step.map(|s| s.conditions().to_vec()).unwrap_or_default();

        let mut keys = HashSet::new();
        let mut compare = Vec::with_capacity(conditions.len() + step_conditions.len());
        let mut bytes = 0;
        let state = conditions
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != epoch_at)
            .map(|(_, c)| (self.kv_key(c.key()), c));
        let raw = step_conditions
            .iter()
            .map(|c| (c.key().as_bytes().to_vec(), c));
        for (key, c) in state.chain(raw) {
            bytes += 2 * key.len();
            compare.push(match c {
                Condition::Equals { value, .. } => {
                    bytes += value.len();
                    Compare::ValueEquals(key.clone(), value.clone())
                }
                Condition::Absent { .. } => Compare::Absent(key.clone()),
            });
            keys.insert(key);
        }
        let mut writes_epoch = false;
        let success: Vec<TxnOp> = last
            .into_iter()
            .map(|(kv_key, op)| {
                writes_epoch |= kv_key == epoch_kv_key;
                keys.insert(kv_key.clone());
                match op {
                    WriteOp::Put { value, .. } => {
                        bytes += kv_key.len() + value.len();
                        TxnOp::Put(kv_key, value.clone())
                    }
                    WriteOp::Delete { .. } => {
                        bytes += kv_key.len();
                        TxnOp::Delete(kv_key)
                    }
                }
            })
            .collect();
        let prepared = Prepared {
            first,
            conditions,
            step_conditions,
            epoch,
            compare,
            success,
            keys,
            writes_epoch,
            bytes,
        };
        let (c, s, f) = prepared.ops();
        let epoch_ops = if prepared.epoch.is_some() {
            self.epoch_ops()
        } else {
            0
        };
        let epoch_bytes = if prepared.epoch.is_some() {
            self.epoch_reserve_bytes()
        } else {
            0
        };
        self.check_limits(
            &prepared.first,
            epoch_ops + c + s.max(f + epoch_ops),
            prepared.bytes + epoch_bytes,
        )?;
        Ok(prepared)
    }

    /// Compares (and reads) of the epoch condition of a batch: the stored epoch, and under a leader fence the
    /// leader key too.
    fn epoch_ops(&self) -> usize {
        if self.fence.is_some() { 2 } else { 1 }
    }

    /// Bytes set aside for the epoch condition of a batch.
    fn epoch_reserve_bytes(&self) -> usize {
        let lease = self
            .fence
            .as_ref()
            .and_then(|f| f.current())
            .map(|l| 2 * (l.key.len() + l.value.len()))
            .unwrap_or(0);
        EPOCH_RESERVE_BYTES + 3 * self.kv_key(EPOCH_KEY).len() + lease
    }

    /// Commits `write`: with group commit on, in the next commit of the queue (see the module documentation);
    /// else alone, at once.
    pub(super) async fn commit_write(&self, write: Prepared) -> procedures::Result<WriteOutcome> {
        let Some(group) = &self.group else {
            return self.commit_one(write).await;
        };
        let (reply, answer) = oneshot::channel();
        let first = write.first.clone();
        let start = {
            let mut queue = group.lock();
            queue.pending.push_back(Pending { write, reply });
            !std::mem::replace(&mut queue.committing, true)
        };
        if start {
            let store = self.clone();
            let guard = CommitTaskGuard {
                group: Arc::clone(group),
                armed: true,
            };
            tokio::spawn(async move { store.run_commits(guard).await });
        }
        match answer.await {
            Ok(outcome) => outcome,
            // The commit task ended without answering (it panicked, or the runtime is shutting down): whether the
            // write landed is unknown, as when an answer is lost.
            Err(_) => Err(procedures::Error::Store {
                action: "write",
                key: first,
                source: "the commit holding this write ended without an answer; it may or may not have been applied"
                    .into(),
                retryable: true,
            }),
        }
    }

    /// The commit task: takes the next batch off the queue and commits it, until the queue is empty. Up to
    /// [`KvBackend::max_txns_in_flight`](crate::kv::KvBackend::max_txns_in_flight) batches are in flight at once
    /// (one on redb and memory); batches in flight together touch no key in common, and the manager's claim of
    /// the epoch is sent only when nothing else is in flight, and nothing is sent beside it.
    async fn run_commits(self, mut guard: CommitTaskGuard) {
        let group = Arc::clone(&guard.group);
        let slots = self.kv.max_txns_in_flight().max(1);
        let mut in_flight = FuturesUnordered::new();
        // Keys of the batches in flight; and whether one of them is the epoch claim.
        let mut busy: HashSet<Vec<u8>> = HashSet::new();
        let mut claim_in_flight = false;
        loop {
            // Let the tasks already woken run first: writes they are about to make join this commit rather than
            // wait for the next one. (While commits are in flight, the next batch gathers behind them.)
            tokio::task::yield_now().await;
            while in_flight.len() < slots && !claim_in_flight {
                let batch = {
                    let mut queue = group.lock();
                    self.take_batch(&mut queue.pending, &busy, in_flight.is_empty())
                };
                if batch.is_empty() {
                    break;
                }
                let (writes, replies): (Vec<Prepared>, Vec<_>) =
                    batch.into_iter().map(|p| (p.write, p.reply)).unzip();
                let keys: Vec<Vec<u8>> =
                    writes.iter().flat_map(|w| w.keys.iter().cloned()).collect();
                let claim = writes.iter().any(|w| w.writes_epoch);
                claim_in_flight |= claim;
                busy.extend(keys.iter().cloned());
                let store = &self;
                in_flight.push(async move {
                    let outcomes = store.commit_batch(writes).await;
                    (keys, claim, replies, outcomes)
                });
            }
            let Some((keys, claim, replies, outcomes)) = in_flight.next().await else {
                // Nothing in flight and nothing taken: done, unless a write arrived since the last look (its
                // caller saw this task running and left the write to it).
                let mut queue = group.lock();
                if queue.pending.is_empty() {
                    queue.committing = false;
                    guard.armed = false;
                    drop(queue);
                    group.ended.notify_waiters();
                    return;
                }
                continue;
            };
            for key in &keys {
                busy.remove(key);
            }
            claim_in_flight &= !claim;
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                // A caller that went away after its batch was sent no longer wants the answer; the write is
                // committed (or not) all the same, as a write in flight when its sender crashes.
                let _ = reply.send(outcome);
            }
        }
    }

    /// The next batch: the first write waiting that may go now, and every later one that may join it (see the
    /// module documentation). A write touching a key of a batch in flight (`busy`), or of a write left waiting
    /// before it, waits; the epoch claim goes alone and only when nothing is in flight (`idle`), and nothing after
    /// it overtakes it. The others stay queued, in order.
    fn take_batch(
        &self,
        pending: &mut VecDeque<Pending>,
        busy: &HashSet<Vec<u8>>,
        idle: bool,
    ) -> Vec<Pending> {
        let (max_ops, max_bytes) = (self.kv.max_txn_ops(), self.kv.max_request_bytes());
        let max_writes = if max_ops == usize::MAX {
            MAX_BATCH_WRITES
        } else {
            usize::MAX
        };
        let epoch_ops = self.epoch_ops();
        let (mut compares, mut success, mut failure) = (0usize, 0usize, 0usize);
        let mut bytes = 0usize;
        let mut taken: HashSet<Vec<u8>> = HashSet::new();
        let mut deferred_keys: HashSet<Vec<u8>> = HashSet::new();
        let mut epoch: Option<Condition> = None;
        // Set once the batch is closed to every later write (a claim is in it, or waits before them).
        let mut closed = false;
        let mut batch: Vec<Pending> = Vec::new();
        let mut rest = VecDeque::with_capacity(pending.len());
        while let Some(p) = pending.pop_front() {
            // A caller that went away (its task aborted, the manager stopped) left a write nobody waits for: it is
            // not sent, as if the caller had crashed before sending it.
            if p.reply.is_closed() {
                continue;
            }
            let blocked = closed
                || !p.write.keys.is_disjoint(busy)
                || !p.write.keys.is_disjoint(&deferred_keys);
            if !blocked && p.write.writes_epoch {
                if batch.is_empty() && idle {
                    batch.push(p);
                } else {
                    rest.push_back(p);
                }
                closed = true;
                continue;
            }
            let (c, s, f) = p.write.ops();
            let fits = !blocked
                && (batch.is_empty()
                    || (batch.len() < max_writes
                        && p.write.epoch == epoch
                        && p.write.keys.is_disjoint(&taken)
                        && compares + c + (success + s).max(failure + f) <= max_ops
                        && bytes.saturating_add(p.write.bytes) <= max_bytes));
            if fits {
                if batch.is_empty() {
                    (compares, success, failure) = (epoch_ops, 0, epoch_ops);
                    bytes = self.epoch_reserve_bytes();
                    epoch = p.write.epoch.clone();
                }
                compares += c;
                success += s;
                failure += f;
                bytes += p.write.bytes;
                taken.extend(p.write.keys.iter().cloned());
                batch.push(p);
            } else {
                // A later write on one of its keys must not overtake it.
                deferred_keys.extend(p.write.keys.iter().cloned());
                rest.push_back(p);
            }
        }
        *pending = rest;
        batch
    }

    /// Commits one write alone (group commit off).
    async fn commit_one(&self, write: Prepared) -> procedures::Result<WriteOutcome> {
        let first = write.first.clone();
        self.commit_batch(vec![write])
            .await
            .into_iter()
            .next()
            .unwrap_or_else(|| {
                Err(procedures::Error::Store {
                    action: "write",
                    key: first,
                    source: "the commit gave no answer for the write".into(),
                    retryable: false,
                })
            })
    }

    /// Commits `writes` (which share one epoch condition and no key) in one kv transaction, and again without the
    /// writes whose own compares failed; one answer per write, in order.
    async fn commit_batch(&self, writes: Vec<Prepared>) -> Vec<procedures::Result<WriteOutcome>> {
        let mut answers: Vec<Option<procedures::Result<WriteOutcome>>> =
            writes.iter().map(|_| None).collect();
        let check = match self.epoch_check(&writes) {
            Ok(check) => check,
            Err(now) => {
                if let Some(fence) = &self.fence {
                    writes.iter().for_each(|_| fence.fenced());
                }
                return writes
                    .iter()
                    .map(|w| Ok(rejected_by_epoch(&w.conditions, now)))
                    .collect();
            }
        };
        let mut live: Vec<usize> = (0..writes.len()).collect();
        while !live.is_empty() {
            let txn = self.batch_txn(&check, &writes, &live);
            let first = &writes[live[0]].first;
            let bytes = crate::kv::check::txn_bytes(&txn);
            let ops = txn.compare.len() + txn.success.len().max(txn.failure.len());
            if live.len() > 1 && self.check_limits(first, ops, bytes).is_err() {
                // Assembled within the limits, so this should not happen; commit them one by one rather than fail.
                for i in std::mem::take(&mut live) {
                    let alone = self.batch_txn(&check, &writes, &[i]);
                    let answer = self.run_txn(&check, &writes, &[i], alone).await;
                    answers[i] = answer.into_iter().next().and_then(|(_, a)| a);
                }
                break;
            }
            let mut retry = Vec::new();
            for (i, answer) in self.run_txn(&check, &writes, &live, txn).await {
                match answer {
                    Some(answer) => answers[i] = Some(answer),
                    None => retry.push(i),
                }
            }
            if retry.len() == live.len() {
                // Refused, yet every compare held in the reads of the same step: the backend broke its contract.
                for i in retry {
                    answers[i] = Some(Err(procedures::Error::Store {
                        action: "write",
                        key: writes[i].first.clone(),
                        source: format!(
                            "backend {} refused the transaction although every compare held in its reads",
                            self.kv.name()
                        )
                        .into(),
                        retryable: true,
                    }));
                }
                break;
            }
            live = retry;
        }
        answers
            .into_iter()
            .zip(&writes)
            .map(|(answer, w)| {
                answer.unwrap_or_else(|| {
                    Err(procedures::Error::Store {
                        action: "write",
                        key: w.first.clone(),
                        source: "the commit gave no answer for the write".into(),
                        retryable: true,
                    })
                })
            })
            .collect()
    }

    /// Sends one transaction of the writes `live` and reads its answer: for each write, `Some(answer)`, or `None`
    /// when its own compares held in a refused transaction (it is to be committed again).
    async fn run_txn(
        &self,
        check: &EpochCheck,
        writes: &[Prepared],
        live: &[usize],
        txn: Txn,
    ) -> Vec<(usize, Option<procedures::Result<WriteOutcome>>)> {
        let first = writes[live[0]].first.clone();
        let resp = self.commit_txn(&first, writes, live, txn).await;
        let resp = match resp {
            Ok(resp) => resp,
            Err(e) => {
                let mut answers: Vec<_> = live
                    .iter()
                    .skip(1)
                    .map(|&i| (i, Some(Err(self.shared_error(&e, &writes[i].first)))))
                    .collect();
                answers.push((live[0], Some(Err(e))));
                return answers;
            }
        };
        if resp.succeeded {
            return live
                .iter()
                .map(|&i| (i, Some(Ok(WriteOutcome::Applied))))
                .collect();
        }
        let mut values = resp.responses.into_iter().map(|r| match r {
            TxnOpResponse::Get(kv) => kv.map(|kv| kv.value),
            _ => None,
        });
        let epoch = self.read_epoch(check, &mut values);
        let (epoch_held, epoch_value) = match epoch {
            EpochRead::Held(v) => (true, v),
            EpochRead::Refused(v) => (false, v),
        };
        if !epoch_held && let Some(fence) = &self.fence {
            live.iter().skip(1).for_each(|_| fence.fenced());
        }
        live.iter()
            .map(|&i| {
                let w = &writes[i];
                let read: Vec<Option<Vec<u8>>> =
                    w.compare.iter().map(|_| values.next().flatten()).collect();
                let held = w
                    .compare
                    .iter()
                    .zip(&read)
                    .all(|(c, v)| compare_holds(c, v.as_deref()));
                if epoch_held && held {
                    return (i, None);
                }
                let mut read = read.into_iter();
                let mut current = Vec::with_capacity(w.conditions.len() + w.step_conditions.len());
                let mut epoch_seen = false;
                for c in &w.conditions {
                    let value = if c.key() == EPOCH_KEY && !epoch_seen {
                        epoch_seen = true;
                        epoch_value.clone()
                    } else {
                        read.next().flatten()
                    };
                    current.push((c.key().to_string(), value));
                }
                for c in &w.step_conditions {
                    current.push((c.key().to_string(), read.next().flatten()));
                }
                (i, Some(Ok(WriteOutcome::Rejected { current })))
            })
            .collect()
    }

    /// The kv transaction of the writes `live`: the epoch compares, then each write's compares; its ops; the
    /// epoch reads, then each write's compared keys.
    fn batch_txn(&self, check: &EpochCheck, writes: &[Prepared], live: &[usize]) -> Txn {
        let mut compare = Vec::new();
        let mut failure = Vec::new();
        let epoch_key = self.kv_key(EPOCH_KEY);
        match check {
            EpochCheck::None => {}
            EpochCheck::Plain(c) => {
                compare.push(c.clone());
                failure.push(TxnOp::Get(epoch_key));
            }
            EpochCheck::Leader { lease } => {
                compare.push(Compare::ValueEquals(lease.key.clone(), lease.value.clone()));
                compare.push(Compare::ValueEquals(
                    epoch_key.clone(),
                    lease.epoch.to_string().into_bytes(),
                ));
                failure.push(TxnOp::Get(lease.key.clone()));
                failure.push(TxnOp::Get(epoch_key));
            }
        }
        let mut success = Vec::new();
        for &i in live {
            let w = &writes[i];
            compare.extend(w.compare.iter().cloned());
            failure.extend(w.compare.iter().map(|c| TxnOp::Get(c.key().to_vec())));
            success.extend(w.success.iter().cloned());
        }
        Txn {
            compare,
            success,
            failure,
        }
    }

    /// The epoch check of a batch, from its (shared) epoch condition; `Err(epoch)` when the batch is refused
    /// without asking the store (no leadership, or a manager of another term), `epoch` being the epoch to report.
    fn epoch_check(&self, writes: &[Prepared]) -> Result<EpochCheck, u64> {
        let Some(c) = writes.first().and_then(|w| w.epoch.as_ref()) else {
            return Ok(EpochCheck::None);
        };
        let Some(fence) = &self.fence else {
            return Ok(EpochCheck::Plain(match c {
                Condition::Equals { value, .. } => {
                    Compare::ValueEquals(self.kv_key(EPOCH_KEY), value.clone())
                }
                Condition::Absent { .. } => Compare::Absent(self.kv_key(EPOCH_KEY)),
            }));
        };
        let asked = match c {
            Condition::Equals { value, .. } => parse_epoch(value),
            Condition::Absent { .. } => None,
        };
        let Some(lease) = fence.current() else {
            // No leadership: report an epoch above the one asked for (a later leader's is larger still).
            return Err(asked.unwrap_or(0).saturating_add(1));
        };
        if asked != Some(lease.epoch) {
            // A manager of another term: it is fenced by this one.
            return Err(lease.epoch);
        }
        // Under an election the epoch key is written only by the store's own claim (`claim_epoch`), never by a
        // write: one that would is refused as fenced.
        let epoch_key = self.kv_key(EPOCH_KEY);
        let puts_epoch = writes
            .iter()
            .flat_map(|w| &w.success)
            .any(|op| matches!(op, TxnOp::Put(key, _) if *key == epoch_key));
        if puts_epoch {
            return Err(lease.epoch);
        }
        Ok(EpochCheck::Leader { lease })
    }

    /// Reads the epoch part of a refused transaction's failure branch.
    fn read_epoch(
        &self,
        check: &EpochCheck,
        values: &mut impl Iterator<Item = Option<Vec<u8>>>,
    ) -> EpochRead {
        match check {
            EpochCheck::None => EpochRead::Held(None),
            EpochCheck::Plain(c) => {
                let stored = values.next().flatten();
                if compare_holds(c, stored.as_deref()) {
                    EpochRead::Held(stored)
                } else {
                    EpochRead::Refused(stored)
                }
            }
            EpochCheck::Leader { lease } => {
                let leader = values.next().flatten();
                let stored = values.next().flatten();
                let stored_epoch = stored.as_deref().and_then(parse_epoch);
                if leader.as_deref() == Some(lease.value.as_slice())
                    && stored_epoch == Some(lease.epoch)
                {
                    return EpochRead::Held(Some(lease.epoch.to_string().into_bytes()));
                }
                // The leader key is gone (the lease ended) or another manager claimed the epoch since: this term is
                // over. Report an epoch above this one; a later leader's is larger still.
                if let Some(fence) = &self.fence {
                    fence.fenced();
                    fence.clear_if(lease);
                }
                let now = stored_epoch
                    .filter(|e| *e > lease.epoch)
                    .unwrap_or(lease.epoch.saturating_add(1));
                tracing::warn!(
                    epoch = lease.epoch,
                    now,
                    leader_key_present = leader.is_some(),
                    "a state write found this server's leadership gone; the write was refused"
                );
                EpochRead::Refused(Some(now.to_string().into_bytes()))
            }
        }
    }

    /// Sends `txn` (the commit of the writes `live`) to the backend; under the crash harness, as one durable write
    /// of the simulated process.
    async fn commit_txn(
        &self,
        first: &str,
        writes: &[Prepared],
        live: &[usize],
        txn: Txn,
    ) -> procedures::Result<TxnResponse> {
        let run = async {
            self.kv
                .txn(txn)
                .await
                .map_err(|e| self.error("write", first, e))
        };
        #[cfg(any(test, feature = "testing"))]
        if let Some(crash) = &self.crash {
            let keys: Vec<&str> = live
                .iter()
                .flat_map(|&i| writes[i].success.iter())
                .map(|op| std::str::from_utf8(op.key()).unwrap_or("<binary>"))
                .collect();
            let what = format!("commit of {} write(s) {keys:?}", live.len());
            return crash.durable_write(&what, run).await;
        }
        let _ = (writes, live);
        run.await
    }

    /// `e`, the error of a commit, as the error of another write of the same commit, naming `key`.
    fn shared_error(&self, e: &procedures::Error, key: &str) -> procedures::Error {
        match e {
            procedures::Error::StoreLimit { reason, .. } => procedures::Error::StoreLimit {
                key: key.to_string(),
                reason: reason.clone(),
            },
            e if e.is_fatal() => procedures::Error::halt("write", key, e.to_string()),
            e => procedures::Error::Store {
                action: "write",
                key: key.to_string(),
                source: format!("the commit holding this write failed: {e}").into(),
                retryable: e.is_retryable(),
            },
        }
    }
}

/// Whether `c` holds for a key whose value is `value`.
fn compare_holds(c: &Compare, value: Option<&[u8]>) -> bool {
    match c {
        Compare::ValueEquals(_, expected) => value == Some(expected.as_slice()),
        Compare::Absent(_) => value.is_none(),
        Compare::Present(_) => value.is_some(),
    }
}
