//! [`NamespacedKvBackend`]: one metasrv's view of a shared kv backend, every key under a fixed prefix
//! (`[metadata_store] key_prefix`). Several metasrvs (or test runs) share one etcd cluster without seeing — or
//! fencing — each other's procedures, tables and topic names.

use std::sync::Arc;

use async_trait::async_trait;

use crate::kv::error::Result;
use crate::kv::{
    Compare, CompareAndPutRequest, CompareAndPutResponse, KeyValue, KvBackend, KvBackendRef,
    PutRequest, RangeRequest, RangeResponse, Txn, TxnOp, TxnOpResponse, TxnResponse, prefix_end,
};

/// Prefixes every key on the way in and strips the prefix on the way out. Ranges are clipped to the prefix: "every
/// key from `k` on" means every key of the namespace from `k` on.
#[derive(Debug)]
pub struct NamespacedKvBackend {
    inner: KvBackendRef,
    prefix: Vec<u8>,
}

impl NamespacedKvBackend {
    /// A view of `inner` under `prefix` (non-empty).
    pub fn new(inner: KvBackendRef, prefix: impl Into<Vec<u8>>) -> Self {
        NamespacedKvBackend {
            inner,
            prefix: prefix.into(),
        }
    }

    /// Wraps `inner` when `prefix` is non-empty; returns it unchanged otherwise.
    pub fn wrap(inner: KvBackendRef, prefix: &str) -> KvBackendRef {
        if prefix.is_empty() {
            inner
        } else {
            Arc::new(NamespacedKvBackend::new(inner, prefix.as_bytes()))
        }
    }

    /// The inner key of `key`. An empty key stays empty, so the inner backend rejects it as it would.
    fn key(&self, key: &[u8]) -> Vec<u8> {
        if key.is_empty() {
            return Vec::new();
        }
        let mut k = Vec::with_capacity(self.prefix.len() + key.len());
        k.extend_from_slice(&self.prefix);
        k.extend_from_slice(key);
        k
    }

    /// The inner `[start, end)` of a range in the request convention (empty end = one key, `[0]` = to the end).
    fn range_bounds(&self, key: &[u8], range_end: &[u8]) -> (Vec<u8>, Vec<u8>) {
        if range_end.is_empty() {
            return (self.key(key), Vec::new());
        }
        let mut start = self.prefix.clone();
        start.extend_from_slice(key);
        let end = if range_end == [0] {
            prefix_end(&self.prefix)
        } else {
            let mut end = self.prefix.clone();
            end.extend_from_slice(range_end);
            end
        };
        (start, end)
    }

    fn strip(&self, mut kv: KeyValue) -> KeyValue {
        if kv.key.starts_with(&self.prefix) {
            kv.key.drain(..self.prefix.len());
        }
        kv
    }

    fn strip_all(&self, kvs: Vec<KeyValue>) -> Vec<KeyValue> {
        kvs.into_iter().map(|kv| self.strip(kv)).collect()
    }

    fn compare(&self, c: Compare) -> Compare {
        match c {
            Compare::ValueEquals(k, v) => Compare::ValueEquals(self.key(&k), v),
            Compare::Absent(k) => Compare::Absent(self.key(&k)),
            Compare::Present(k) => Compare::Present(self.key(&k)),
        }
    }

    fn op(&self, op: TxnOp) -> TxnOp {
        match op {
            TxnOp::Put(k, v) => TxnOp::Put(self.key(&k), v),
            TxnOp::Get(k) => TxnOp::Get(self.key(&k)),
            TxnOp::Delete(k) => TxnOp::Delete(self.key(&k)),
        }
    }
}

#[async_trait]
impl KvBackend for NamespacedKvBackend {
    fn name(&self) -> String {
        format!(
            "{} (key prefix '{}')",
            self.inner.name(),
            String::from_utf8_lossy(&self.prefix)
        )
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
        self.inner
            .watch_prefix(&[self.prefix.as_slice(), prefix].concat())
    }

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>> {
        Ok(self
            .inner
            .get(&self.key(key))
            .await?
            .map(|kv| self.strip(kv)))
    }

    async fn batch_get(&self, keys: &[Vec<u8>]) -> Result<Vec<KeyValue>> {
        let keys: Vec<Vec<u8>> = keys.iter().map(|k| self.key(k)).collect();
        Ok(self.strip_all(self.inner.batch_get(&keys).await?))
    }

    async fn range(&self, req: RangeRequest) -> Result<RangeResponse> {
        let (key, range_end) = self.range_bounds(&req.key, &req.range_end);
        let resp = self
            .inner
            .range(RangeRequest {
                key,
                range_end,
                ..req
            })
            .await?;
        Ok(RangeResponse {
            kvs: self.strip_all(resp.kvs),
            more: resp.more,
        })
    }

    async fn put(&self, req: PutRequest) -> Result<Option<KeyValue>> {
        let req = PutRequest {
            key: self.key(&req.key),
            ..req
        };
        Ok(self.inner.put(req).await?.map(|kv| self.strip(kv)))
    }

    async fn batch_put(&self, kvs: Vec<KeyValue>, prev_kv: bool) -> Result<Vec<KeyValue>> {
        let kvs = kvs
            .into_iter()
            .map(|kv| KeyValue {
                key: self.key(&kv.key),
                value: kv.value,
            })
            .collect();
        Ok(self.strip_all(self.inner.batch_put(kvs, prev_kv).await?))
    }

    async fn compare_and_put(&self, req: CompareAndPutRequest) -> Result<CompareAndPutResponse> {
        let req = CompareAndPutRequest {
            key: self.key(&req.key),
            ..req
        };
        let resp = self.inner.compare_and_put(req).await?;
        Ok(CompareAndPutResponse {
            success: resp.success,
            prev_kv: resp.prev_kv.map(|kv| self.strip(kv)),
        })
    }

    async fn delete_range(
        &self,
        key: &[u8],
        range_end: &[u8],
        prev_kv: bool,
    ) -> Result<(u64, Vec<KeyValue>)> {
        let (key, range_end) = self.range_bounds(key, range_end);
        let (n, kvs) = self.inner.delete_range(&key, &range_end, prev_kv).await?;
        Ok((n, self.strip_all(kvs)))
    }

    async fn batch_delete(&self, keys: &[Vec<u8>], prev_kv: bool) -> Result<Vec<KeyValue>> {
        let keys: Vec<Vec<u8>> = keys.iter().map(|k| self.key(k)).collect();
        Ok(self.strip_all(self.inner.batch_delete(&keys, prev_kv).await?))
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        let txn = Txn {
            compare: txn.compare.into_iter().map(|c| self.compare(c)).collect(),
            success: txn.success.into_iter().map(|o| self.op(o)).collect(),
            failure: txn.failure.into_iter().map(|o| self.op(o)).collect(),
        };
        let resp = self.inner.txn(txn).await?;
        Ok(TxnResponse {
            succeeded: resp.succeeded,
            responses: resp
                .responses
                .into_iter()
                .map(|r| match r {
                    TxnOpResponse::Get(kv) => TxnOpResponse::Get(kv.map(|kv| self.strip(kv))),
                    other => other,
                })
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::MemoryKvBackend;

    #[tokio::test]
    async fn passes_the_kv_conformance_suite() {
        crate::kv::conformance::run_all(|| async {
            let inner: KvBackendRef = Arc::new(MemoryKvBackend::new());
            let kv: KvBackendRef = Arc::new(NamespacedKvBackend::new(inner, b"ns/".to_vec()));
            (kv, Vec::new())
        })
        .await;
    }

    #[tokio::test]
    async fn two_namespaces_on_one_store_do_not_see_each_other() {
        let inner: KvBackendRef = Arc::new(MemoryKvBackend::new());
        let a = NamespacedKvBackend::new(inner.clone(), b"a/".to_vec());
        let b = NamespacedKvBackend::new(inner.clone(), b"b/".to_vec());
        for (kv, v) in [(&a, b"1"), (&b, b"2")] {
            kv.put(PutRequest {
                key: b"k".to_vec(),
                value: v.to_vec(),
                prev_kv: false,
            })
            .await
            .unwrap();
        }
        assert_eq!(a.get(b"k").await.unwrap().unwrap().value, b"1");
        assert_eq!(b.get(b"k").await.unwrap().unwrap().value, b"2");
        let all_a = a.range(RangeRequest::prefix(Vec::new())).await.unwrap();
        assert_eq!(all_a.kvs.len(), 1);
        assert_eq!(all_a.kvs[0].key, b"k");
        let (n, _) = a.delete_range(b"", &[0], false).await.unwrap();
        assert_eq!(n, 1);
        assert_eq!(inner.get(b"b/k").await.unwrap().unwrap().value, b"2");
        assert!(inner.get(b"a/k").await.unwrap().is_none());
    }
}
