//! The metadata store: the [`KvBackend`] trait and its implementations (memory, redb, etcd, PostgreSQL).
//!
//! Keys and values are bytes. Ranges follow etcd's convention: a request names a start `key` and an exclusive
//! `range_end`; an empty `range_end` means the single key, `[0]` means every key from `key` on.

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;

pub mod error;

pub use error::{Error, Result};

mod check;
#[cfg(any(test, feature = "testing"))]
pub mod conformance;
pub mod counting;
pub mod etcd;
pub mod generation;
pub mod memory;
pub mod namespace;
pub mod postgres;
pub mod redb;
pub mod state_store;
pub mod step_store;
#[cfg(any(test, feature = "testing"))]
pub mod wrapper;

pub use counting::{CommitObserver, CountingKvBackend};
pub use etcd::{EtcdConfig, EtcdKvBackend};
pub use generation::{WatchedKvBackend, WriteGeneration};
pub use memory::MemoryKvBackend;
pub use namespace::NamespacedKvBackend;
pub use postgres::{PostgresKvBackend, PostgresKvConfig};
pub use redb::RedbKvBackend;
pub use state_store::KvStateStore;
pub use step_store::KvStepStore;
#[cfg(any(test, feature = "testing"))]
pub use wrapper::KvWrapper;

/// A key with its value.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyValue {
    /// The key.
    pub key: Vec<u8>,
    /// The value (empty when the request asked for keys only).
    pub value: Vec<u8>,
}

/// A range read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeRequest {
    /// First key of the range.
    pub key: Vec<u8>,
    /// Exclusive end: empty = only `key`; `[0]` = every key ≥ `key`.
    pub range_end: Vec<u8>,
    /// At most this many pairs (0 = no limit). When more remain, the response says so.
    pub limit: usize,
    /// Return keys with empty values.
    pub keys_only: bool,
}

impl RangeRequest {
    /// Every key starting with `prefix` (every key at all for an empty prefix).
    pub fn prefix(prefix: impl Into<Vec<u8>>) -> Self {
        let key = prefix.into();
        let range_end = prefix_end(&key);
        RangeRequest {
            key,
            range_end,
            limit: 0,
            keys_only: false,
        }
    }

    /// Keys in `[start, end)`.
    pub fn range(start: impl Into<Vec<u8>>, end: impl Into<Vec<u8>>) -> Self {
        RangeRequest {
            key: start.into(),
            range_end: end.into(),
            limit: 0,
            keys_only: false,
        }
    }

    /// At most `limit` pairs.
    pub fn with_limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// Keys only.
    pub fn with_keys_only(mut self) -> Self {
        self.keys_only = true;
        self
    }
}

/// The end key of a prefix range: the prefix with its last byte below 0xff incremented and what follows dropped;
/// `[0]` (everything) when the prefix is empty or all 0xff.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// The pairs of a range read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeResponse {
    /// The pairs, in key order.
    pub kvs: Vec<KeyValue>,
    /// Whether keys beyond the limit remain (continue from the last key + `\0`).
    pub more: bool,
}

/// A put.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PutRequest {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// Return the previous pair.
    pub prev_kv: bool,
}

/// A compare-and-put.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompareAndPutRequest {
    /// The key.
    pub key: Vec<u8>,
    /// `None`: the key must be absent; `Some(v)`: it must hold exactly `v`.
    pub expect: Option<Vec<u8>>,
    /// The new value.
    pub value: Vec<u8>,
}

/// What a compare-and-put did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompareAndPutResponse {
    /// Whether the expectation held and the value was written.
    pub success: bool,
    /// The pair before the call (absent: `None`).
    pub prev_kv: Option<KeyValue>,
}

/// A comparison in a [`Txn`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Compare {
    /// The key holds exactly this value.
    ValueEquals(Vec<u8>, Vec<u8>),
    /// The key is absent.
    Absent(Vec<u8>),
    /// The key is present.
    Present(Vec<u8>),
}

impl Compare {
    /// The key compared.
    pub fn key(&self) -> &[u8] {
        match self {
            Compare::ValueEquals(key, _) | Compare::Absent(key) | Compare::Present(key) => key,
        }
    }
}

/// An operation in a [`Txn`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxnOp {
    /// Put key → value.
    Put(Vec<u8>, Vec<u8>),
    /// Read a key.
    Get(Vec<u8>),
    /// Delete a key.
    Delete(Vec<u8>),
}

impl TxnOp {
    /// The key the op reads or writes.
    pub fn key(&self) -> &[u8] {
        match self {
            TxnOp::Put(key, _) | TxnOp::Get(key) | TxnOp::Delete(key) => key,
        }
    }
}

/// The result of one [`TxnOp`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxnOpResponse {
    /// A put was applied.
    Put,
    /// The value read (absent: `None`).
    Get(Option<KeyValue>),
    /// How many keys the delete removed (0 or 1).
    Delete(u64),
}

/// A transaction: if every comparison holds, apply `success`, else `failure` — atomically either way.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Txn {
    /// The comparisons.
    pub compare: Vec<Compare>,
    /// Ops applied when every comparison holds.
    pub success: Vec<TxnOp>,
    /// Ops applied otherwise.
    pub failure: Vec<TxnOp>,
}

impl Txn {
    /// The key that names the transaction in messages: its first compare's, else its first success op's, else its
    /// first failure op's (empty when it has none).
    pub fn first_key(&self) -> &[u8] {
        self.compare
            .first()
            .map(Compare::key)
            .or_else(|| self.success.first().map(TxnOp::key))
            .or_else(|| self.failure.first().map(TxnOp::key))
            .unwrap_or_default()
    }
}

/// What a [`Txn`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxnResponse {
    /// Whether the comparisons held (so `success` ran).
    pub succeeded: bool,
    /// One response per op of the branch that ran.
    pub responses: Vec<TxnOpResponse>,
}

/// An ordered key-value store shared by every part of remote-wal. Object safe: share it as [`KvBackendRef`].
#[async_trait]
pub trait KvBackend: Send + Sync + Debug {
    /// A short name for messages: `memory`, `redb:<path>`, `etcd:<endpoints>`.
    fn name(&self) -> String;

    /// The most operations (compares + ops of the larger branch) one [`Txn`] may hold; `usize::MAX` if unbounded.
    fn max_txn_ops(&self) -> usize;

    /// The largest request, in bytes of keys and values, one call may carry; `usize::MAX` if unbounded.
    fn max_request_bytes(&self) -> usize;

    /// How many transactions a writer should keep in flight at once to use the backend well: 1 (the default) for
    /// a backend that commits one write at a time anyway (redb's single writer, memory), more for one that
    /// pipelines independent transactions (etcd). The state store's group commit sends up to this many batches
    /// at once, on disjoint keys.
    fn max_txns_in_flight(&self) -> usize {
        1
    }

    /// Tells of changes under `prefix` as they happen, when the backend can: a counter raised after every change
    /// under the prefix (and after the watch had to be set up again, when changes may have been missed). `None`
    /// (the default) when the backend cannot watch; the caller then polls. Needs a tokio runtime (the watch runs as
    /// a task, ended when every receiver is dropped).
    fn watch_prefix(&self, prefix: &[u8]) -> Option<tokio::sync::watch::Receiver<u64>> {
        let _ = prefix;
        None
    }

    /// One key.
    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>>;

    /// Several keys; the found ones, in the order asked.
    async fn batch_get(&self, keys: &[Vec<u8>]) -> Result<Vec<KeyValue>>;

    /// A range, limited and paginated.
    async fn range(&self, req: RangeRequest) -> Result<RangeResponse>;

    /// One put; returns the previous pair when asked.
    async fn put(&self, req: PutRequest) -> Result<Option<KeyValue>>;

    /// Several puts (split into several requests when over the backend's limits); returns the previous pairs when
    /// `prev_kv`.
    async fn batch_put(&self, kvs: Vec<KeyValue>, prev_kv: bool) -> Result<Vec<KeyValue>>;

    /// Put if the key is absent / holds exactly the expected value.
    async fn compare_and_put(&self, req: CompareAndPutRequest) -> Result<CompareAndPutResponse>;

    /// Deletes `[key, range_end)` (same convention as [`RangeRequest`]); returns the count and, when `prev_kv`,
    /// the deleted pairs.
    async fn delete_range(
        &self,
        key: &[u8],
        range_end: &[u8],
        prev_kv: bool,
    ) -> Result<(u64, Vec<KeyValue>)>;

    /// Deletes several keys; returns the deleted pairs when `prev_kv`.
    async fn batch_delete(&self, keys: &[Vec<u8>], prev_kv: bool) -> Result<Vec<KeyValue>>;

    /// An atomic transaction. Refused with a clear error (nothing applied) when it exceeds the backend's limits.
    async fn txn(&self, txn: Txn) -> Result<TxnResponse>;
}

/// A shared [`KvBackend`].
pub type KvBackendRef = Arc<dyn KvBackend>;

/// Reads a whole range, `page` pairs per request (0 = one unlimited request), following the `more` flag: each next
/// page starts at the last key + `\0`. `req.limit` caps the total (0 = no cap). Pages are separate reads: on a store
/// changed meanwhile, the result is not one snapshot.
pub async fn range_all(
    kv: &dyn KvBackend,
    req: RangeRequest,
    page: usize,
) -> Result<Vec<KeyValue>> {
    let total = req.limit;
    let mut next = RangeRequest { limit: page, ..req };
    let mut out = Vec::new();
    loop {
        if total > 0 {
            let left = total - out.len();
            next.limit = if page == 0 { left } else { page.min(left) };
        }
        let resp = kv.range(next.clone()).await?;
        let last = resp.kvs.last().map(|kv| kv.key.clone());
        out.extend(resp.kvs);
        let done = total > 0 && out.len() >= total;
        match last {
            Some(mut key) if resp.more && !done => {
                // Resuming a single-key range (empty range_end) is never needed: it cannot have more.
                key.push(0);
                next.key = key;
            }
            _ => return Ok(out),
        }
    }
}

/// A key as printable text for messages: ASCII as is, other bytes escaped (`\xff`).
pub fn display_key(key: &[u8]) -> String {
    key.escape_ascii().to_string()
}
