//! [`WatchedKvBackend`]: a [`KvBackend`] wrapper that tells its readers whether a key under some watched prefixes
//! may have changed through it, so that what they decoded from those keys can be kept until it has.
//!
//! The wrapper keeps a [`WriteGeneration`]: a counter that moves at the **end** of every write call through the
//! wrapper that may touch a watched key, whatever the call's outcome (an error may still have been applied). A reader
//! that takes the generation *before* it reads, and finds it unchanged later, knows that no such write call ended in
//! between; a write that was in flight while it read ends after the read began, so it moves the generation past the
//! one the reader took. What the counter cannot see: writes made by other processes, or through another handle of
//! the store, and a write whose call ended (say, timed out) before the store applied it. A cache built on it must
//! say why those cannot happen, or bound its entries' age (the metasrv's datanode registry does both: only the
//! leader writes routes, its writes are fenced by its term, and a cached assignment is trusted for a bounded time).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;

use crate::kv::error::Result;
use crate::kv::{
    CompareAndPutRequest, CompareAndPutResponse, KeyValue, KvBackend, KvBackendRef, PutRequest,
    RangeRequest, RangeResponse, Txn, TxnOp, TxnResponse,
};

/// The generation of the watched keys of a [`WatchedKvBackend`]: moves after every write call that may have
/// touched one of them has ended. Cheap to clone; every clone reads the same counter.
#[derive(Clone, Debug, Default)]
pub struct WriteGeneration(Arc<AtomicU64>);

impl WriteGeneration {
    /// The generation now. Take it before reading what it guards.
    pub fn current(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    fn bump(&self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
}

/// Forwards every call to the backend underneath and moves its [`WriteGeneration`] at the end of each write call
/// that may touch a key under one of its prefixes.
#[derive(Debug)]
pub struct WatchedKvBackend {
    inner: KvBackendRef,
    prefixes: Vec<Vec<u8>>,
    generation: WriteGeneration,
}

impl WatchedKvBackend {
    /// Watches the keys of `inner` that start with one of `prefixes`.
    pub fn new(inner: KvBackendRef, prefixes: Vec<Vec<u8>>) -> Self {
        WatchedKvBackend {
            inner,
            prefixes,
            generation: WriteGeneration::default(),
        }
    }

    /// The generation of the watched keys.
    pub fn generation(&self) -> WriteGeneration {
        self.generation.clone()
    }

    fn watched(&self, key: &[u8]) -> bool {
        self.prefixes.iter().any(|p| key.starts_with(p))
    }

    /// Moves the generation when any of `keys` is watched, then hands back `result`.
    fn ended<'a, T>(&self, mut keys: impl Iterator<Item = &'a [u8]>, result: T) -> T {
        if keys.any(|k| self.watched(k)) {
            self.generation.bump();
        }
        result
    }
}

#[async_trait]
impl KvBackend for WatchedKvBackend {
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
        let key = req.key.clone();
        let result = self.inner.put(req).await;
        self.ended(std::iter::once(key.as_slice()), result)
    }

    async fn batch_put(&self, kvs: Vec<KeyValue>, prev_kv: bool) -> Result<Vec<KeyValue>> {
        let keys: Vec<Vec<u8>> = kvs.iter().map(|kv| kv.key.clone()).collect();
        let result = self.inner.batch_put(kvs, prev_kv).await;
        self.ended(keys.iter().map(Vec::as_slice), result)
    }

    async fn compare_and_put(&self, req: CompareAndPutRequest) -> Result<CompareAndPutResponse> {
        let key = req.key.clone();
        let result = self.inner.compare_and_put(req).await;
        self.ended(std::iter::once(key.as_slice()), result)
    }

    async fn delete_range(
        &self,
        key: &[u8],
        range_end: &[u8],
        prev_kv: bool,
    ) -> Result<(u64, Vec<KeyValue>)> {
        let result = self.inner.delete_range(key, range_end, prev_kv).await;
        // A range may span a watched prefix whatever its first key: always counted.
        self.generation.bump();
        result
    }

    async fn batch_delete(&self, keys: &[Vec<u8>], prev_kv: bool) -> Result<Vec<KeyValue>> {
        let result = self.inner.batch_delete(keys, prev_kv).await;
        self.ended(keys.iter().map(Vec::as_slice), result)
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        let keys: Vec<Vec<u8>> = txn
            .success
            .iter()
            .chain(txn.failure.iter())
            .filter(|op| matches!(op, TxnOp::Put(..) | TxnOp::Delete(_)))
            .map(|op| op.key().to_vec())
            .collect();
        let result = self.inner.txn(txn).await;
        self.ended(keys.iter().map(Vec::as_slice), result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::MemoryKvBackend;

    fn watched() -> WatchedKvBackend {
        WatchedKvBackend::new(
            Arc::new(MemoryKvBackend::new()),
            vec![b"__table_route/".to_vec(), b"__dn_table/".to_vec()],
        )
    }

    fn put(key: &str) -> PutRequest {
        PutRequest {
            key: key.as_bytes().to_vec(),
            value: b"v".to_vec(),
            prev_kv: false,
        }
    }

    #[tokio::test]
    async fn only_writes_that_may_touch_a_watched_key_move_the_generation() {
        let kv = watched();
        let generation = kv.generation();
        kv.put(put("__topic_region/t/1")).await.unwrap();
        kv.get(b"__table_route/1").await.unwrap();
        kv.range(RangeRequest::prefix(b"__dn_table/".to_vec()))
            .await
            .unwrap();
        assert_eq!(generation.current(), 0, "reads and unwatched writes");

        kv.put(put("__table_route/1")).await.unwrap();
        assert_eq!(generation.current(), 1);
        kv.batch_put(
            vec![
                KeyValue {
                    key: b"a".to_vec(),
                    value: b"1".to_vec(),
                },
                KeyValue {
                    key: b"__dn_table/1/1".to_vec(),
                    value: b"1".to_vec(),
                },
            ],
            false,
        )
        .await
        .unwrap();
        assert_eq!(generation.current(), 2);
        // A refused compare-and-put still counts: the reader cannot tell from outside.
        let refused = kv
            .compare_and_put(CompareAndPutRequest {
                key: b"__table_route/1".to_vec(),
                expect: Some(b"other".to_vec()),
                value: b"w".to_vec(),
            })
            .await
            .unwrap();
        assert!(!refused.success);
        assert_eq!(generation.current(), 3);
        kv.batch_delete(&[b"b".to_vec()], false).await.unwrap();
        assert_eq!(generation.current(), 3);
        kv.delete_range(b"x", b"y", false).await.unwrap();
        assert_eq!(generation.current(), 4, "a range delete always counts");
        let txn = Txn {
            compare: Vec::new(),
            success: vec![TxnOp::Get(b"__table_route/1".to_vec())],
            failure: vec![TxnOp::Delete(b"__dn_table/1/1".to_vec())],
        };
        kv.txn(txn).await.unwrap();
        assert_eq!(generation.current(), 5, "a write in either branch counts");
        let read_only = Txn {
            compare: Vec::new(),
            success: vec![TxnOp::Get(b"__table_route/1".to_vec())],
            failure: Vec::new(),
        };
        kv.txn(read_only).await.unwrap();
        assert_eq!(generation.current(), 5);
    }
}
