//! [`MemoryKvBackend`]: an ordered map under a lock. For tests and single-process tools; nothing survives the
//! process.

use std::collections::BTreeMap;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use async_trait::async_trait;

use crate::kv::error::Result;
use crate::kv::{
    Compare, CompareAndPutRequest, CompareAndPutResponse, KeyValue, KvBackend, PutRequest,
    RangeRequest, RangeResponse, Txn, TxnOp, TxnOpResponse, TxnResponse, check,
};

const NAME: &str = "memory";

/// A [`KvBackend`] over a `BTreeMap` behind a read-write lock. Every call holds the lock for its whole duration,
/// so every call (batches and transactions included) is atomic.
#[derive(Debug, Default)]
pub struct MemoryKvBackend {
    map: RwLock<BTreeMap<Vec<u8>, Vec<u8>>>,
}

impl MemoryKvBackend {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every pair, in key order (for tests and dumps).
    pub fn dump(&self) -> Vec<KeyValue> {
        self.read().iter().map(|(k, v)| pair(k, v)).collect()
    }

    // A panic while holding the lock cannot leave the map half-changed (every call checks before it writes), so a
    // poisoned lock is still usable.
    fn read(&self) -> RwLockReadGuard<'_, BTreeMap<Vec<u8>, Vec<u8>>> {
        self.map.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, BTreeMap<Vec<u8>, Vec<u8>>> {
        self.map.write().unwrap_or_else(|e| e.into_inner())
    }
}

fn pair(k: &[u8], v: &[u8]) -> KeyValue {
    KeyValue {
        key: k.to_vec(),
        value: v.to_vec(),
    }
}

/// Whether `c` holds on `map`.
pub(crate) fn holds(map: &BTreeMap<Vec<u8>, Vec<u8>>, c: &Compare) -> bool {
    match c {
        Compare::ValueEquals(k, v) => map.get(k) == Some(v),
        Compare::Absent(k) => !map.contains_key(k),
        Compare::Present(k) => map.contains_key(k),
    }
}

#[async_trait]
impl KvBackend for MemoryKvBackend {
    fn name(&self) -> String {
        NAME.to_string()
    }

    fn max_txn_ops(&self) -> usize {
        usize::MAX
    }

    fn max_request_bytes(&self) -> usize {
        usize::MAX
    }

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>> {
        Ok(self.read().get(key).map(|v| pair(key, v)))
    }

    async fn batch_get(&self, keys: &[Vec<u8>]) -> Result<Vec<KeyValue>> {
        let map = self.read();
        Ok(keys
            .iter()
            .filter_map(|k| map.get(k).map(|v| pair(k, v)))
            .collect())
    }

    async fn range(&self, req: RangeRequest) -> Result<RangeResponse> {
        let map = self.read();
        let Some(bounds) = check::span(&req.key, &req.range_end) else {
            return Ok(RangeResponse::default());
        };
        let limit = if req.limit == 0 {
            usize::MAX
        } else {
            req.limit
        };
        let mut iter = map.range::<[u8], _>(bounds);
        let kvs: Vec<KeyValue> = iter
            .by_ref()
            .take(limit)
            .map(|(k, v)| KeyValue {
                key: k.clone(),
                value: if req.keys_only { Vec::new() } else { v.clone() },
            })
            .collect();
        let more = kvs.len() == limit && iter.next().is_some();
        Ok(RangeResponse { kvs, more })
    }

    async fn put(&self, req: PutRequest) -> Result<Option<KeyValue>> {
        check::key(NAME, &req.key)?;
        let prev = self.write().insert(req.key.clone(), req.value);
        Ok(prev.filter(|_| req.prev_kv).map(|v| KeyValue {
            key: req.key,
            value: v,
        }))
    }

    async fn batch_put(&self, kvs: Vec<KeyValue>, prev_kv: bool) -> Result<Vec<KeyValue>> {
        let kvs = check::dedup_puts(NAME, kvs)?;
        let mut map = self.write();
        let mut prevs = Vec::new();
        for kv in kvs {
            if let Some(prev) = map.insert(kv.key.clone(), kv.value)
                && prev_kv
            {
                prevs.push(KeyValue {
                    key: kv.key,
                    value: prev,
                });
            }
        }
        Ok(prevs)
    }

    async fn compare_and_put(&self, req: CompareAndPutRequest) -> Result<CompareAndPutResponse> {
        check::key(NAME, &req.key)?;
        let mut map = self.write();
        let prev = map.get(&req.key).cloned();
        let success = prev == req.expect;
        if success {
            map.insert(req.key.clone(), req.value);
        }
        Ok(CompareAndPutResponse {
            success,
            prev_kv: prev.map(|value| KeyValue {
                key: req.key,
                value,
            }),
        })
    }

    async fn delete_range(
        &self,
        key: &[u8],
        range_end: &[u8],
        prev_kv: bool,
    ) -> Result<(u64, Vec<KeyValue>)> {
        let mut map = self.write();
        let Some(bounds) = check::span(key, range_end) else {
            return Ok((0, Vec::new()));
        };
        let doomed: Vec<Vec<u8>> = map
            .range::<[u8], _>(bounds)
            .map(|(k, _)| k.clone())
            .collect();
        let mut prevs = Vec::new();
        for k in &doomed {
            if let Some(v) = map.remove(k)
                && prev_kv
            {
                prevs.push(pair(k, &v));
            }
        }
        Ok((doomed.len() as u64, prevs))
    }

    async fn batch_delete(&self, keys: &[Vec<u8>], prev_kv: bool) -> Result<Vec<KeyValue>> {
        let mut map = self.write();
        let mut prevs = Vec::new();
        for k in keys {
            if let Some(v) = map.remove(k)
                && prev_kv
            {
                prevs.push(pair(k, &v));
            }
        }
        Ok(prevs)
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        check::txn(NAME, &txn, self.max_txn_ops(), self.max_request_bytes())?;
        let mut map = self.write();
        let succeeded = txn.compare.iter().all(|c| holds(&map, c));
        let ops = if succeeded { txn.success } else { txn.failure };
        let responses = ops
            .into_iter()
            .map(|op| match op {
                TxnOp::Put(k, v) => {
                    map.insert(k, v);
                    TxnOpResponse::Put
                }
                TxnOp::Get(k) => TxnOpResponse::Get(map.get(&k).map(|v| pair(&k, v))),
                TxnOp::Delete(k) => TxnOpResponse::Delete(u64::from(map.remove(&k).is_some())),
            })
            .collect();
        Ok(TxnResponse {
            succeeded,
            responses,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{RangeRequest, range_all};

    fn kv(k: &str, v: &str) -> KeyValue {
        KeyValue {
            key: k.into(),
            value: v.into(),
        }
    }

    #[tokio::test]
    async fn range_all_pages_through_a_prefix() {
        let store = MemoryKvBackend::new();
        let kvs: Vec<KeyValue> = (0..25).map(|i| kv(&format!("p/{i:02}"), "v")).collect();
        store.batch_put(kvs.clone(), false).await.unwrap();
        store
            .put(PutRequest {
                key: "q".into(),
                value: "x".into(),
                prev_kv: false,
            })
            .await
            .unwrap();
        let all = range_all(&store, RangeRequest::prefix("p/"), 7)
            .await
            .unwrap();
        assert_eq!(all, kvs);
        let capped = range_all(&store, RangeRequest::prefix("p/").with_limit(10), 4)
            .await
            .unwrap();
        assert_eq!(capped, kvs[..10].to_vec());
    }

    #[tokio::test]
    async fn txn_runs_the_failure_branch_when_a_compare_fails() {
        let store = MemoryKvBackend::new();
        store
            .put(PutRequest {
                key: "a".into(),
                value: "1".into(),
                prev_kv: false,
            })
            .await
            .unwrap();
        let resp = store
            .txn(Txn {
                compare: vec![Compare::ValueEquals("a".into(), "2".into())],
                success: vec![TxnOp::Put("b".into(), "x".into())],
                failure: vec![TxnOp::Get("a".into())],
            })
            .await
            .unwrap();
        assert!(!resp.succeeded);
        assert_eq!(resp.responses, vec![TxnOpResponse::Get(Some(kv("a", "1")))]);
        assert_eq!(store.dump(), vec![kv("a", "1")]);
    }
}
