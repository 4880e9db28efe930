//! [`CountingKvBackend`]: a [`KvBackend`] wrapper that counts the store commits made through it.
//!
//! A *commit* is one call that writes: `put`, `batch_put`, `delete_range`, `batch_delete`, a `compare_and_put`
//! whose expectation held, and a `txn` whose branch that ran holds a put or a delete. A refused compare-and-put and
//! a transaction that only read are not commits (etcd's revision does not move for them either). Calls that
//! return an error are not counted. A `batch_put` or `batch_delete` the backend splits into several requests to
//! stay within its limits counts once.
//!
//! A [`CommitObserver`] set on the wrapper is also told how long each commit took (from the call to its answer).

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::kv::error::Result;
use crate::kv::{
    CompareAndPutRequest, CompareAndPutResponse, KeyValue, KvBackend, KvBackendRef, PutRequest,
    RangeRequest, RangeResponse, Txn, TxnOp, TxnResponse,
};

/// Told of each commit made through a [`CountingKvBackend`] and how long it took. Called on the committing task:
/// an implementation must return quickly and must not block.
pub trait CommitObserver: Send + Sync + Debug {
    /// A commit was answered `elapsed` after it was sent.
    fn committed(&self, elapsed: Duration);
}

/// Wraps a backend and counts its commits (see the module documentation); reads pass through uncounted.
#[derive(Debug)]
pub struct CountingKvBackend {
    inner: KvBackendRef,
    commits: AtomicU64,
    observer: RwLock<Option<Arc<dyn CommitObserver>>>,
}

impl CountingKvBackend {
    /// Counts the commits made through this wrapper onto `inner`, from 0.
    pub fn new(inner: KvBackendRef) -> Self {
        CountingKvBackend {
            inner,
            commits: AtomicU64::new(0),
            observer: RwLock::new(None),
        }
    }

    /// Tells `observer` of every commit from now on (replacing an observer set before).
    pub fn set_observer(&self, observer: Arc<dyn CommitObserver>) {
        *self.observer.write().unwrap_or_else(|p| p.into_inner()) = Some(observer);
    }

    /// The commits made through this wrapper so far.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Counts one commit sent at `sent` and tells the observer.
    fn committed(&self, sent: Instant) {
        self.commits.fetch_add(1, Ordering::Relaxed);
        let observer = self
            .observer
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(observer) = observer {
            observer.committed(sent.elapsed());
        }
    }

    fn count<T>(&self, sent: Instant, result: Result<T>) -> Result<T> {
        if result.is_ok() {
            self.committed(sent);
        }
        result
    }
}

/// Whether `ops` change the store.
fn writes(ops: &[TxnOp]) -> bool {
    ops.iter()
        .any(|op| matches!(op, TxnOp::Put(..) | TxnOp::Delete(_)))
}

#[async_trait]
impl KvBackend for CountingKvBackend {
    fn name(&self) -> String {
        self.inner.name()
    }

    fn max_txn_ops(&self) -> usize {
        self.inner.max_txn_ops()
    }

    fn max_request_bytes(&self) -> usize {
        self.inner.max_request_bytes()
    }

    fn max_txns_in_flight(&self) -> usize {
        self.inner.max_txns_in_flight()
    }

    fn watch_prefix(&self, prefix: &[u8]) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.inner.watch_prefix(prefix)
    }

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>> {
        self.inner.get(key).await
    }

    async fn batch_get(&self, keys: &[Vec<u8>]) -> Result<Vec<KeyValue>> {
        self.inner.batch_get(keys).await
    }

    async fn range(&self, req: RangeRequest) -> Result<RangeResponse> {
        self.inner.range(req).await
    }

    async fn put(&self, req: PutRequest) -> Result<Option<KeyValue>> {
        self.count(Instant::now(), self.inner.put(req).await)
    }

    async fn batch_put(&self, kvs: Vec<KeyValue>, prev_kv: bool) -> Result<Vec<KeyValue>> {
        if kvs.is_empty() {
            return self.inner.batch_put(kvs, prev_kv).await;
        }
        self.count(Instant::now(), self.inner.batch_put(kvs, prev_kv).await)
    }

    async fn compare_and_put(&self, req: CompareAndPutRequest) -> Result<CompareAndPutResponse> {
        let sent = Instant::now();
        let resp = self.inner.compare_and_put(req).await?;
        if resp.success {
            self.committed(sent);
        }
        Ok(resp)
    }

    async fn delete_range(
        &self,
        key: &[u8],
        range_end: &[u8],
        prev_kv: bool,
    ) -> Result<(u64, Vec<KeyValue>)> {
        self.count(
            Instant::now(),
            self.inner.delete_range(key, range_end, prev_kv).await,
        )
    }

    async fn batch_delete(&self, keys: &[Vec<u8>], prev_kv: bool) -> Result<Vec<KeyValue>> {
        if keys.is_empty() {
            return self.inner.batch_delete(keys, prev_kv).await;
        }
        self.count(Instant::now(), self.inner.batch_delete(keys, prev_kv).await)
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        let (on_success, on_failure) = (writes(&txn.success), writes(&txn.failure));
        let sent = Instant::now();
        let resp = self.inner.txn(txn).await?;
        if (resp.succeeded && on_success) || (!resp.succeeded && on_failure) {
            self.committed(sent);
        }
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::kv::{Compare, MemoryKvBackend};

    fn counting() -> CountingKvBackend {
        CountingKvBackend::new(Arc::new(MemoryKvBackend::new()))
    }

    fn kv(k: &str, v: &str) -> KeyValue {
        KeyValue {
            key: k.as_bytes().to_vec(),
            value: v.as_bytes().to_vec(),
        }
    }

    #[tokio::test]
    async fn every_write_call_counts_once_and_reads_do_not() {
        let kv_backend = counting();
        kv_backend
            .put(PutRequest {
                key: b"a".to_vec(),
                value: b"1".to_vec(),
                prev_kv: false,
            })
            .await
            .unwrap();
        assert_eq!(kv_backend.commits(), 1);
        kv_backend
            .batch_put(vec![kv("b", "2"), kv("c", "3")], false)
            .await
            .unwrap();
        assert_eq!(kv_backend.commits(), 2, "one batch is one commit");
        kv_backend.get(b"a").await.unwrap();
        kv_backend.range(RangeRequest::prefix("")).await.unwrap();
        kv_backend
            .batch_get(&[b"a".to_vec(), b"b".to_vec()])
            .await
            .unwrap();
        assert_eq!(kv_backend.commits(), 2, "reads are not commits");
        kv_backend
            .batch_delete(&[b"b".to_vec()], false)
            .await
            .unwrap();
        kv_backend.delete_range(b"c", b"", false).await.unwrap();
        assert_eq!(kv_backend.commits(), 4);
        kv_backend.batch_put(Vec::new(), false).await.unwrap();
        kv_backend.batch_delete(&[], false).await.unwrap();
        assert_eq!(kv_backend.commits(), 4, "empty batches send nothing");
    }

    #[tokio::test]
    async fn refused_compare_and_put_and_read_only_txn_are_not_commits() {
        let kv_backend = counting();
        let cas = |expect: Option<&str>| CompareAndPutRequest {
            key: b"k".to_vec(),
            expect: expect.map(|e| e.as_bytes().to_vec()),
            value: b"v".to_vec(),
        };
        assert!(kv_backend.compare_and_put(cas(None)).await.unwrap().success);
        assert!(!kv_backend.compare_and_put(cas(None)).await.unwrap().success);
        assert_eq!(kv_backend.commits(), 1);

        // The failure branch only reads: a refused txn is no commit.
        let refused = kv_backend
            .txn(Txn {
                compare: vec![Compare::Absent(b"k".to_vec())],
                success: vec![TxnOp::Put(b"x".to_vec(), b"1".to_vec())],
                failure: vec![TxnOp::Get(b"k".to_vec())],
            })
            .await
            .unwrap();
        assert!(!refused.succeeded);
        assert_eq!(kv_backend.commits(), 1);

        // The failure branch writes: it counts.
        kv_backend
            .txn(Txn {
                compare: vec![Compare::Absent(b"k".to_vec())],
                success: Vec::new(),
                failure: vec![TxnOp::Delete(b"k".to_vec())],
            })
            .await
            .unwrap();
        assert_eq!(kv_backend.commits(), 2);

        // A successful txn of gets only is a read.
        kv_backend
            .txn(Txn {
                compare: Vec::new(),
                success: vec![TxnOp::Get(b"k".to_vec())],
                failure: Vec::new(),
            })
            .await
            .unwrap();
        assert_eq!(kv_backend.commits(), 2);
    }

    /// Counts the commits it is told of.
    #[derive(Debug, Default)]
    struct Told(AtomicU64);

    impl CommitObserver for Told {
        fn committed(&self, _elapsed: Duration) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[tokio::test]
    async fn the_observer_is_told_of_each_commit_and_of_nothing_else() {
        let kv_backend = counting();
        let told = Arc::new(Told::default());
        kv_backend.set_observer(told.clone());
        let cas = CompareAndPutRequest {
            key: b"k".to_vec(),
            expect: None,
            value: b"v".to_vec(),
        };
        assert!(
            kv_backend
                .compare_and_put(cas.clone())
                .await
                .unwrap()
                .success
        );
        assert!(!kv_backend.compare_and_put(cas).await.unwrap().success);
        kv_backend
            .batch_put(vec![kv("a", "1"), kv("b", "2")], false)
            .await
            .unwrap();
        kv_backend.get(b"a").await.unwrap();
        kv_backend
            .txn(Txn {
                compare: Vec::new(),
                success: vec![TxnOp::Delete(b"a".to_vec())],
                failure: Vec::new(),
            })
            .await
            .unwrap();
        assert_eq!(kv_backend.commits(), 3);
        assert_eq!(told.0.load(Ordering::Relaxed), 3);
    }

    #[tokio::test]
    async fn a_failed_call_is_not_counted() {
        let kv_backend = counting();
        // An empty key is refused by every backend.
        let refused = kv_backend
            .put(PutRequest {
                key: Vec::new(),
                value: b"v".to_vec(),
                prev_kv: false,
            })
            .await;
        assert!(refused.is_err());
        assert_eq!(kv_backend.commits(), 0);
    }
}
