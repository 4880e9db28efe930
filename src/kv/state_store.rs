//! [`KvStateStore`]: the procedure engine's [`StateStore`] on any [`KvBackend`], under `__procedure__/`.
//!
//! Each `write` is one kv transaction: its conditions become compares, its ops the success branch, and the
//! failure branch reads the condition keys so a rejection reports their current values from the same atomic
//! step. A record or a write that exceeds the backend's limits ([`KvBackend::max_request_bytes`],
//! [`KvBackend::max_txn_ops`]) is refused with [`procedures::Error::StoreLimit`] before anything is sent: a record
//! is written whole or not at all, never in pieces.
//!
//! [`KvBackend`]: crate::kv::KvBackend
//! [`KvBackend::max_request_bytes`]: crate::kv::KvBackend::max_request_bytes
//! [`KvBackend::max_txn_ops`]: crate::kv::KvBackend::max_txn_ops
//!
//! **Where the epoch comes from.** By default the engine claims its own epoch: it reads `epoch`, writes the next
//! number with a compare-and-set, and conditions every later write on it (embedded `walctl` commands). Under a
//! [`LeaderFence`] ([`KvStateStore::with_leader_fence`], used by `walctl serve` on etcd) the epoch is the leader
//! key's create revision from the etcd election instead: the store's claim ([`StateStore::claim_epoch`]) writes
//! exactly the election's epoch in a transaction conditioned on the leader key's value (a kind of write of its
//! own: no write through `write` may put the epoch key), and every write whose condition names `epoch` becomes a
//! transaction that also compares the leader key's value. When the lease behind
//! the leader key ends (expired, revoked) etcd deletes the key, so every later write of that leader is refused
//! by etcd itself, whatever the process believes; the engine sees `Fenced` and stops.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use async_trait::async_trait;
use procedures::record::EPOCH_KEY;
use procedures::store::{Condition, StateStore, WriteOp, WriteOutcome};
use procedures::{StepStore, StepWrites};
use tokio::sync::watch;

use crate::kv::step_store::KvStepStore;
use crate::kv::{KvBackendRef, PutRequest, RangeRequest, Txn, TxnOp, display_key, range_all};

/// The prefix of every procedure-state key in the metadata store.
pub const PROCEDURE_PREFIX: &str = "__procedure__/";

/// Pairs read per request by `scan`.
const SCAN_PAGE: usize = 512;

mod group;
mod page;

/// The leadership a [`LeaderFence`] holds: the election's epoch and the key that proves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderLease {
    /// The epoch: the leader key's create revision in etcd (strictly increasing across leaders).
    pub epoch: u64,
    /// The leader key, as the kv backend names it (without a namespace prefix the backend adds itself).
    pub key: Vec<u8>,
    /// The leader key's value (the election value this server campaigned with).
    pub value: Vec<u8>,
}

/// The epoch source of a [`KvStateStore`] run under an election: the current leadership, if any, and how many
/// writes were refused because it was gone or superseded.
#[derive(Debug)]
pub struct LeaderFence {
    lease: watch::Sender<Option<LeaderLease>>,
    /// The instant the leadership is proven until, if an election bounds it ([`LeaderFence::set_proven_until`]):
    /// from then on [`LeaderFence::current`] holds nothing, whether or not the election's upkeep has run since.
    proven_until: std::sync::Mutex<Option<Instant>>,
    fenced_writes: AtomicU64,
}

impl Default for LeaderFence {
    fn default() -> Self {
        LeaderFence {
            lease: watch::Sender::new(None),
            proven_until: std::sync::Mutex::new(None),
            fenced_writes: AtomicU64::new(0),
        }
    }
}

impl LeaderFence {
    /// A fence holding no leadership: every epoch-conditioned write is refused until [`LeaderFence::set`].
    pub fn new() -> Self {
        Self::default()
    }

    /// This server now leads with `lease`, for as long as it is not cleared (no time bound: an election that
    /// proves its lease by time uses [`LeaderFence::set_proven_until`]).
    pub fn set(&self, lease: LeaderLease) {
        *self.proven_until_slot() = None;
        self.lease.send_replace(Some(lease));
    }

    /// This server now leads with `lease`, proven until `until` (or a later bound [`LeaderFence::extend`] set
    /// meanwhile): past that instant the fence holds nothing unless it is extended again. The bound is kept by the
    /// fence itself, at every write, so a term's end does not wait for the election's upkeep to be scheduled and
    /// notice it. A bound left from an earlier term is always earlier than a later term's: its renewals were sent
    /// before that term's lease was granted.
    pub fn set_proven_until(&self, lease: LeaderLease, until: Instant) {
        // The bound first: a reader that sees the new lease sees its bound too.
        self.extend(until);
        self.lease.send_replace(Some(lease));
    }

    /// The leadership (held or about to be) is proven until `until`: a renewal sent then was acknowledged. A bound
    /// already later stays.
    pub fn extend(&self, until: Instant) {
        let mut slot = self.proven_until_slot();
        *slot = Some(slot.map_or(until, |current| current.max(until)));
    }

    /// The instant the leadership is proven until, when an election bounds it.
    pub fn proven_until(&self) -> Option<Instant> {
        *self.proven_until_slot()
    }

    fn proven_until_slot(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        // A poisoned lock still holds a valid instant: the guarded code only assigns it.
        self.proven_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// This server no longer leads (it stepped down, or its lease could not be proven alive, or a write found the
    /// leader key gone); later writes are refused without asking the store.
    pub fn clear(&self) {
        self.lease.send_replace(None);
    }

    /// The leadership held, if any: none once cleared, and none from the instant it is proven until on.
    pub fn current(&self) -> Option<LeaderLease> {
        let lease = self.lease.borrow().clone()?;
        match self.proven_until() {
            Some(until) if Instant::now() >= until => None,
            _ => Some(lease),
        }
    }

    /// Watches the leadership: a server waits on it to learn that a write found it deposed.
    pub fn subscribe(&self) -> watch::Receiver<Option<LeaderLease>> {
        self.lease.subscribe()
    }

    /// Writes refused because the leadership was gone or superseded (the engine saw `Fenced`).
    pub fn fenced_writes(&self) -> u64 {
        self.fenced_writes.load(Ordering::Relaxed)
    }

    fn fenced(&self) {
        self.fenced_writes.fetch_add(1, Ordering::Relaxed);
    }

    /// Clears the lease only if it is still `lease` (a newer term set meanwhile stays).
    fn clear_if(&self, lease: &LeaderLease) {
        self.lease.send_if_modified(|current| {
            if current.as_ref() == Some(lease) {
                *current = None;
                true
            } else {
                false
            }
        });
    }
}

/// A [`StateStore`] on a [`KvBackendRef`]; the store's key `k` is the kv key `{prefix}k`.
#[derive(Clone, Debug)]
pub struct KvStateStore {
    kv: KvBackendRef,
    prefix: String,
    fence: Option<Arc<LeaderFence>>,
    /// The queue of writes waiting for a commit; `None` with group commit off.
    group: Option<Arc<group::GroupCommit>>,
    /// The crash harness's controller, when the store injects its crashes itself.
    #[cfg(any(test, feature = "testing"))]
    crash: Option<Arc<procedures::testing::CrashController>>,
}

impl KvStateStore {
    /// The store under [`PROCEDURE_PREFIX`].
    pub fn new(kv: KvBackendRef) -> Self {
        Self::with_prefix(kv, PROCEDURE_PREFIX)
    }

    /// The store under another prefix (tests sharing one etcd give each store its own).
    pub fn with_prefix(kv: KvBackendRef, prefix: impl Into<String>) -> Self {
        KvStateStore {
            kv,
            prefix: prefix.into(),
            fence: None,
            group: Some(Arc::default()),
            #[cfg(any(test, feature = "testing"))]
            crash: None,
        }
    }

    /// Turns group commit on (the default) or off. On, the writes of concurrent callers that arrive while a commit
    /// is in flight go into the next commit together (one kv transaction), each caller answered once that commit is
    /// durable; a write whose own condition fails is refused alone. Off, every write is a commit of its own.
    pub fn with_group_commit(mut self, on: bool) -> Self {
        self.group = on.then(Arc::default);
        self
    }

    /// Whether group commit is on.
    pub fn group_commit(&self) -> bool {
        self.group.is_some()
    }

    /// Writes waiting for the next commit (the one in flight not included); 0 with group commit off.
    pub fn queued_writes(&self) -> usize {
        self.group.as_ref().map_or(0, |g| g.queued())
    }

    /// Injects the crashes of `controller` (the crash harness, `procedures::testing`) at this store's own commits:
    /// each kv transaction it sends (a whole batch with group commit on), each `put` and `delete`, is one durable
    /// write of the simulated process, and once it crashed every call fails. What
    /// [`procedures::testing::CrashScenario::crashing_state_store`] returns for a group-committing store.
    #[cfg(any(test, feature = "testing"))]
    pub fn with_crash_controller(
        mut self,
        controller: Arc<procedures::testing::CrashController>,
    ) -> Self {
        self.crash = Some(controller);
        self
    }

    /// Fails once the crash harness's simulated process crashed (before a read).
    fn ensure_alive(&self, what: &str) -> procedures::Result<()> {
        #[cfg(any(test, feature = "testing"))]
        if let Some(crash) = &self.crash {
            return crash.ensure_alive(what);
        }
        let _ = what;
        Ok(())
    }

    /// Runs a mutation other than a commit of writes (`put`, `delete`); under the crash harness as one durable write.
    async fn mutation<F>(&self, what: &str, op: F) -> procedures::Result<()>
    where
        F: Future<Output = procedures::Result<()>>,
    {
        #[cfg(any(test, feature = "testing"))]
        if let Some(crash) = &self.crash {
            return crash.durable_write(what, op).await;
        }
        let _ = what;
        op.await
    }

    /// Takes the epoch from an election instead of claiming one (see the module documentation): every write
    /// conditioned on the epoch is applied only while `fence`'s leader key still holds its value in the store.
    pub fn with_leader_fence(mut self, fence: Arc<LeaderFence>) -> Self {
        self.fence = Some(fence);
        self
    }

    /// The leader fence, when the epoch comes from an election.
    pub fn leader_fence(&self) -> Option<&Arc<LeaderFence>> {
        self.fence.as_ref()
    }

    /// The kv backend underneath.
    pub fn backend(&self) -> &KvBackendRef {
        &self.kv
    }

    fn kv_key(&self, key: &str) -> Vec<u8> {
        format!("{}{key}", self.prefix).into_bytes()
    }

    /// A kv error as the engine's error: a limit becomes `StoreLimit` naming the store key; anything else `Store`,
    /// keeping the source and whether a retry may help.
    fn error(&self, action: &'static str, key: &str, e: crate::kv::Error) -> procedures::Error {
        match e {
            crate::kv::Error::KvLimit { reason, .. } => procedures::Error::StoreLimit {
                key: key.to_string(),
                reason: format!("{reason} (backend {})", self.kv.name()),
            },
            e => {
                let retryable = e.is_retryable();
                procedures::Error::Store {
                    action,
                    key: key.to_string(),
                    source: Box::new(e),
                    retryable,
                }
            }
        }
    }

    /// Refuses a transaction of `ops` operations and `bytes` bytes the backend cannot take, naming `key`.
    fn check_limits(&self, key: &str, ops: usize, bytes: usize) -> procedures::Result<()> {
        let (max_ops, max_bytes) = (self.kv.max_txn_ops(), self.kv.max_request_bytes());
        if ops > max_ops {
            return Err(procedures::Error::StoreLimit {
                key: key.to_string(),
                reason: format!(
                    "the write needs {ops} operations in one transaction; backend {} allows {max_ops}",
                    self.kv.name()
                ),
            });
        }
        if bytes > max_bytes {
            return Err(procedures::Error::StoreLimit {
                key: key.to_string(),
                reason: format!(
                    "the write carries {bytes} bytes of keys and values; backend {} allows {max_bytes} per request",
                    self.kv.name()
                ),
            });
        }
        Ok(())
    }
}

#[async_trait]
impl StateStore for KvStateStore {
    /// Without a leader fence, the engine's own claim. Under one, the election's epoch, written in one transaction
    /// conditioned on the leader key holding this server's value (present only while its lease lives): a claim is
    /// its own kind of write, never a write of the epoch key recognised by its number. A refusal means the
    /// leadership is gone: the fence is cleared and the claim fails.
    async fn claim_epoch(&self) -> procedures::Result<Option<u64>> {
        let Some(fence) = &self.fence else {
            return procedures::store::claim_next_epoch(self).await;
        };
        self.ensure_alive("claim the epoch")?;
        let Some(lease) = fence.current() else {
            return Err(not_leader(EPOCH_KEY));
        };
        let txn = Txn {
            compare: vec![crate::kv::Compare::ValueEquals(
                lease.key.clone(),
                lease.value.clone(),
            )],
            success: vec![TxnOp::Put(
                self.kv_key(EPOCH_KEY),
                lease.epoch.to_string().into_bytes(),
            )],
            failure: Vec::new(),
        };
        let resp = self
            .kv
            .txn(txn)
            .await
            .map_err(|e| self.error("claim the epoch", EPOCH_KEY, e))?;
        if resp.succeeded {
            return Ok(Some(lease.epoch));
        }
        fence.fenced();
        fence.clear_if(&lease);
        Err(not_leader(EPOCH_KEY))
    }

    /// The kv backend's watch of the prefix (on etcd: an etcd watch; `None` on redb and memory).
    fn watch_changes(&self, prefix: &str) -> Option<watch::Receiver<u64>> {
        self.kv.watch_prefix(&self.kv_key(prefix))
    }

    /// Waits for the group commit's task to end (see [`procedures::StateStore::quiesce`]).
    async fn quiesce(&self) {
        if let Some(group) = &self.group {
            group.idle().await;
        }
    }

    async fn get(&self, key: &str) -> procedures::Result<Option<Vec<u8>>> {
        self.ensure_alive(&format!("get '{key}'"))?;
        let kv = self
            .kv
            .get(&self.kv_key(key))
            .await
            .map_err(|e| self.error("get", key, e))?;
        Ok(kv.map(|kv| kv.value))
    }

    async fn scan(&self, prefix: &str) -> procedures::Result<Vec<(String, Vec<u8>)>> {
        self.ensure_alive(&format!("scan '{prefix}'"))?;
        let kvs = range_all(
            self.kv.as_ref(),
            RangeRequest::prefix(self.kv_key(prefix)),
            SCAN_PAGE,
        )
        .await
        .map_err(|e| self.error("scan", prefix, e))?;
        kvs.into_iter()
            .map(|kv| {
                let unreadable = |reason: String| procedures::Error::Store {
                    action: "scan",
                    key: prefix.to_string(),
                    source: reason.into(),
                    retryable: false,
                };
                let rest = kv.key.strip_prefix(self.prefix.as_bytes()).ok_or_else(|| {
                    unreadable(format!(
                        "backend returned key '{}' outside the prefix",
                        display_key(&kv.key)
                    ))
                })?;
                let key = String::from_utf8(rest.to_vec()).map_err(|_| {
                    unreadable(format!("key '{}' is not UTF-8", display_key(&kv.key)))
                })?;
                Ok((key, kv.value))
            })
            .collect()
    }

    async fn scan_page(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> procedures::Result<Vec<(String, Vec<u8>)>> {
        self.ensure_alive(&format!("scan '{prefix}'"))?;
        self.read_page(prefix, after, limit).await
    }

    async fn put(&self, key: &str, value: Vec<u8>) -> procedures::Result<()> {
        if key == EPOCH_KEY && self.fence.is_some() {
            // Under an election the epoch is written only by the conditional claim.
            return Err(not_leader(key));
        }
        let kv_key = self.kv_key(key);
        self.check_limits(key, 1, kv_key.len() + value.len())?;
        let put = async {
            self.kv
                .put(PutRequest {
                    key: kv_key,
                    value,
                    prev_kv: false,
                })
                .await
                .map_err(|e| self.error("put", key, e))?;
            Ok(())
        };
        self.mutation(&format!("put '{key}'"), put).await
    }

    async fn delete(&self, keys: &[String]) -> procedures::Result<()> {
        let mut seen = HashSet::new();
        let ops: Vec<TxnOp> = keys
            .iter()
            .filter(|k| seen.insert(k.as_str()))
            .map(|k| TxnOp::Delete(self.kv_key(k)))
            .collect();
        let Some(first) = keys.first() else {
            return Ok(());
        };
        let bytes = ops.iter().map(|op| op.key().len()).sum();
        self.check_limits(first, ops.len(), bytes)?;
        let delete = async {
            self.kv
                .txn(Txn {
                    compare: Vec::new(),
                    success: ops,
                    failure: Vec::new(),
                })
                .await
                .map_err(|e| self.error("delete", first, e))?;
            Ok(())
        };
        self.mutation(&format!("delete {keys:?}"), delete).await
    }

    async fn write(
        &self,
        conditions: Vec<Condition>,
        ops: Vec<WriteOp>,
    ) -> procedures::Result<WriteOutcome> {
        let write = self.prepare(conditions, ops, None)?;
        self.commit_write(write).await
    }

    /// Joins the writes of a [`KvStepStore`] on the same backend (the same `Arc`).
    fn joins(&self, store: &dyn StepStore) -> bool {
        store
            .as_any()
            .downcast_ref::<KvStepStore>()
            .is_some_and(|step| Arc::ptr_eq(step.backend(), &self.kv))
    }

    async fn write_with_step(
        &self,
        conditions: Vec<Condition>,
        ops: Vec<WriteOp>,
        step: &StepWrites,
    ) -> procedures::Result<WriteOutcome> {
        let write = self.prepare(conditions, ops, Some(step))?;
        self.commit_write(write).await
    }
}

/// The error of an epoch read or write under a [`LeaderFence`] that holds no leadership.
fn not_leader(key: &str) -> procedures::Error {
    procedures::Error::Store {
        action: "claim the epoch",
        key: key.to_string(),
        source: "this server does not hold the leadership (its epoch comes from the election)"
            .into(),
        retryable: false,
    }
}

/// A rejection naming `epoch` as the current epoch (the others conditions' values unknown), without asking the
/// store.
fn rejected_by_epoch(conditions: &[Condition], epoch: u64) -> WriteOutcome {
    WriteOutcome::Rejected {
        current: conditions
            .iter()
            .map(|c| {
                let value = (c.key() == EPOCH_KEY).then(|| epoch.to_string().into_bytes());
                (c.key().to_string(), value)
            })
            .collect(),
    }
}

fn parse_epoch(bytes: &[u8]) -> Option<u64> {
    std::str::from_utf8(bytes).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use async_trait::async_trait;
    use procedures::{LocalManager, ManagerConfig, ProcedureManager};

    use super::*;
    use crate::kv::memory::MemoryKvBackend;

    const LEADER_KEY: &[u8] = b"__metasrv/election/694d";

    fn lease(epoch: u64) -> LeaderLease {
        LeaderLease {
            epoch,
            key: LEADER_KEY.to_vec(),
            value: br#"{"address":"127.0.0.1:3002"}"#.to_vec(),
        }
    }

    async fn fenced_store(epoch: u64) -> (KvBackendRef, Arc<LeaderFence>, KvStateStore) {
        let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
        let fence = Arc::new(LeaderFence::new());
        let lease = lease(epoch);
        kv.put(PutRequest {
            key: lease.key.clone(),
            value: lease.value.clone(),
            prev_kv: false,
        })
        .await
        .unwrap();
        fence.set(lease);
        let store = KvStateStore::new(kv.clone()).with_leader_fence(fence.clone());
        (kv, fence, store)
    }

    fn epoch_is(epoch: u64) -> Condition {
        Condition::Equals {
            key: EPOCH_KEY.to_string(),
            value: epoch.to_string().into_bytes(),
        }
    }

    fn put(key: &str) -> WriteOp {
        WriteOp::Put {
            key: key.to_string(),
            value: b"v".to_vec(),
        }
    }

    #[tokio::test]
    async fn a_manager_under_a_leader_fence_takes_the_election_epoch() {
        let (kv, _fence, store) = fenced_store(42).await;
        // Whatever an embedded run left in the epoch key, the election's epoch is the one claimed.
        kv.put(PutRequest {
            key: b"__procedure__/epoch".to_vec(),
            value: b"7".to_vec(),
            prev_kv: false,
        })
        .await
        .unwrap();
        let manager = LocalManager::new(Arc::new(store), ManagerConfig::default());
        manager.start().await.unwrap();
        assert_eq!(manager.epoch(), Some(42));
        let stored = kv.get(b"__procedure__/epoch").await.unwrap().unwrap();
        assert_eq!(stored.value, b"42");
        manager.stop().await.unwrap();
    }

    /// The fence's time bound holds on its own: nobody clears the lease (no upkeep runs here), yet once the
    /// instant it was proven until has passed, a write is refused as fenced and nothing reaches the store; a
    /// renewal's extension lets writes through again, and an earlier bound never shortens a later one.
    #[tokio::test]
    async fn a_write_past_the_proven_bound_is_refused_without_anyone_clearing_the_fence() {
        let (kv, fence, store) = fenced_store(42).await;
        let now = Instant::now();
        fence.set_proven_until(lease(42), now + std::time::Duration::from_secs(3600));
        assert_eq!(store.claim_epoch().await.unwrap(), Some(42));
        assert_eq!(
            store
                .write(vec![epoch_is(42)], vec![put("proc/a")])
                .await
                .unwrap(),
            WriteOutcome::Applied
        );
        // A bound that has passed: a fresh fence, since an extension never moves a bound back.
        let expired = Arc::new(LeaderFence::new());
        expired.set_proven_until(lease(42), now);
        expired.extend(now - std::time::Duration::from_secs(1));
        assert_eq!(expired.proven_until(), Some(now));
        assert_eq!(expired.current(), None);
        let late = KvStateStore::new(kv.clone()).with_leader_fence(expired.clone());
        let before = kv.get(b"__procedure__/proc/b").await.unwrap();
        let outcome = late
            .write(vec![epoch_is(42)], vec![put("proc/b")])
            .await
            .unwrap();
        assert!(
            matches!(outcome, WriteOutcome::Rejected { .. }),
            "{outcome:?}"
        );
        assert_eq!(before, None);
        assert_eq!(kv.get(b"__procedure__/proc/b").await.unwrap(), None);
        assert_eq!(expired.fenced_writes(), 1);
        // The lease itself was never cleared: only its bound passed. A renewal's extension revives it.
        assert!(expired.subscribe().borrow().is_some());
        expired.extend(now + std::time::Duration::from_secs(3600));
        assert_eq!(expired.current().map(|l| l.epoch), Some(42));
        assert_eq!(
            late.write(vec![epoch_is(42)], vec![put("proc/b")])
                .await
                .unwrap(),
            WriteOutcome::Applied
        );
        drop(fence);
    }

    #[tokio::test]
    async fn writes_stop_once_the_leader_key_is_gone() {
        let (kv, fence, store) = fenced_store(42).await;
        assert_eq!(store.get(EPOCH_KEY).await.unwrap(), None);
        // The claim is its own write: the election's epoch, conditioned on the leader key.
        assert_eq!(store.claim_epoch().await.unwrap(), Some(42));
        assert_eq!(store.get(EPOCH_KEY).await.unwrap(), Some(b"42".to_vec()));
        // A write that would put the epoch key itself is refused as fenced, whatever number it names.
        let forged = store
            .write(
                vec![epoch_is(42)],
                vec![WriteOp::Put {
                    key: EPOCH_KEY.to_string(),
                    value: b"42".to_vec(),
                }],
            )
            .await
            .unwrap();
        assert!(
            matches!(forged, WriteOutcome::Rejected { .. }),
            "{forged:?}"
        );
        fence.set(lease(42));
        let ok = store.write(vec![epoch_is(42)], vec![put("proc/a")]).await;
        assert_eq!(ok.unwrap(), WriteOutcome::Applied);

        // The lease ended: etcd deleted the leader key. The next write is refused by the store itself.
        kv.batch_delete(&[LEADER_KEY.to_vec()], false)
            .await
            .unwrap();
        let refused = store
            .write(vec![epoch_is(42)], vec![put("proc/b")])
            .await
            .unwrap();
        assert_eq!(
            refused,
            WriteOutcome::Rejected {
                current: vec![(EPOCH_KEY.to_string(), Some(b"43".to_vec()))]
            }
        );
        assert!(kv.get(b"__procedure__/proc/b").await.unwrap().is_none());
        assert_eq!(fence.current(), None);
        assert_eq!(fence.fenced_writes(), 2);
        // With the fence cleared, nothing reaches the store any more.
        let refused = store
            .write(vec![epoch_is(42)], vec![put("proc/c")])
            .await
            .unwrap();
        assert!(matches!(refused, WriteOutcome::Rejected { .. }));
        assert_eq!(fence.fenced_writes(), 3);
        // Nor can the claim be made again without the leadership.
        assert!(store.claim_epoch().await.is_err());
    }

    #[tokio::test]
    async fn an_epoch_claimed_by_another_manager_fences_the_leader() {
        let (kv, fence, store) = fenced_store(42).await;
        kv.put(PutRequest {
            key: b"__procedure__/epoch".to_vec(),
            value: b"43".to_vec(),
            prev_kv: false,
        })
        .await
        .unwrap();
        let refused = store
            .write(vec![epoch_is(42)], vec![put("proc/a")])
            .await
            .unwrap();
        assert_eq!(
            refused,
            WriteOutcome::Rejected {
                current: vec![(EPOCH_KEY.to_string(), Some(b"43".to_vec()))]
            }
        );
        assert_eq!(fence.current(), None);
        // A manager of an older term is refused without a round trip.
        fence.set(lease(50));
        let old = store
            .write(vec![epoch_is(42)], vec![put("proc/a")])
            .await
            .unwrap();
        assert_eq!(
            old,
            WriteOutcome::Rejected {
                current: vec![(EPOCH_KEY.to_string(), Some(b"50".to_vec()))]
            }
        );
    }

    #[tokio::test]
    async fn another_failed_condition_is_reported_with_the_epoch_intact() {
        let (_kv, fence, store) = fenced_store(42).await;
        assert_eq!(store.claim_epoch().await.unwrap(), Some(42));
        let absent = Condition::Absent {
            key: "proc/a".to_string(),
        };
        store
            .write(vec![epoch_is(42)], vec![put("proc/a")])
            .await
            .unwrap();
        let refused = store
            .write(vec![epoch_is(42), absent], vec![put("proc/a")])
            .await
            .unwrap();
        assert_eq!(
            refused,
            WriteOutcome::Rejected {
                current: vec![
                    (EPOCH_KEY.to_string(), Some(b"42".to_vec())),
                    ("proc/a".to_string(), Some(b"v".to_vec())),
                ]
            }
        );
        assert!(fence.current().is_some());
        assert_eq!(fence.fenced_writes(), 0);
    }

    /// A procedure of one step that hands the engine `writes` with its `done` record.
    struct Writing(Option<procedures::StepWrites>);

    #[async_trait]
    impl procedures::Procedure for Writing {
        fn type_name(&self) -> &str {
            "writing"
        }
        async fn execute(
            &mut self,
            _ctx: &procedures::Context,
        ) -> procedures::Result<procedures::Status> {
            let writes = self.0.take().unwrap_or_default();
            Ok(procedures::Status::done_with(None, writes))
        }
        fn dump(&self) -> procedures::Result<serde_json::Value> {
            Ok(serde_json::Value::Null)
        }
        fn lock_key(&self) -> procedures::LockKey {
            procedures::LockKey::none()
        }
    }

    #[tokio::test]
    async fn step_writes_commit_with_the_done_record_and_a_failed_condition_fails_only_the_step() {
        let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
        let store = KvStateStore::new(kv.clone());
        let step = Arc::new(KvStepStore::new(kv.clone()));
        assert!(store.joins(step.as_ref()));
        assert!(!store.joins(&KvStepStore::new(Arc::new(MemoryKvBackend::new()))));
        let manager = LocalManager::new(Arc::new(store), ManagerConfig::default());
        manager
            .register_loader("writing", Box::new(|_| Ok(Box::new(Writing(None)))))
            .unwrap();
        manager.start().await.unwrap();
        kv.put(PutRequest {
            key: b"taken".to_vec(),
            value: b"1".to_vec(),
            prev_kv: false,
        })
        .await
        .unwrap();

        let put_free = procedures::StepWrites::new(
            step.clone(),
            vec![Condition::Absent { key: "free".into() }],
            vec![WriteOp::Put {
                key: "free".into(),
                value: b"v".to_vec(),
            }],
        );
        let run = |id: &str, writes| {
            procedures::ProcedureWithId::new(
                procedures::ProcedureId::new(id),
                Box::new(Writing(Some(writes))),
            )
        };
        manager
            .submit(run("ok", put_free))
            .await
            .unwrap()
            .wait()
            .await
            .unwrap();
        assert_eq!(kv.get(b"free").await.unwrap().unwrap().value, b"v");

        let clash = procedures::StepWrites::new(
            step,
            vec![Condition::Absent {
                key: "taken".into(),
            }],
            vec![WriteOp::Put {
                key: "other".into(),
                value: b"v".to_vec(),
            }],
        );
        let err = manager
            .submit(run("clash", clash))
            .await
            .unwrap()
            .wait()
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(
                "a condition of the step's writes failed: key 'taken' was expected to be absent"
            ),
            "{err}"
        );
        // The step failed, not the manager: nothing of the step was written, and the manager still runs.
        assert!(kv.get(b"other").await.unwrap().is_none());
        assert_eq!(manager.epoch(), Some(1));
        let info = manager
            .procedure_state(&procedures::ProcedureId::new("clash"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(info.state, procedures::ProcedureState::Failed);
        manager.stop().await.unwrap();
    }
}
