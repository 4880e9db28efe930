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

use std::collections::HashSet;

use async_trait::async_trait;
use procedures::store::{Condition, StateStore, WriteOp, WriteOutcome};

use crate::error::Error;
use crate::kv::{
    Compare, KvBackendRef, PutRequest, RangeRequest, Txn, TxnOp, TxnOpResponse, display_key,
    range_all,
};

/// The prefix of every procedure-state key in the metadata store.
pub const PROCEDURE_PREFIX: &str = "__procedure__/";

/// Pairs read per request by `scan`.
const SCAN_PAGE: usize = 512;

/// A [`StateStore`] on a [`KvBackendRef`]; the store's key `k` is the kv key `{prefix}k`.
#[derive(Clone, Debug)]
pub struct KvStateStore {
    kv: KvBackendRef,
    prefix: String,
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
        }
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
    fn error(&self, action: &'static str, key: &str, e: Error) -> procedures::Error {
        match e {
            Error::KvLimit { reason, .. } => procedures::Error::StoreLimit {
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
    async fn get(&self, key: &str) -> procedures::Result<Option<Vec<u8>>> {
        let kv = self
            .kv
            .get(&self.kv_key(key))
            .await
            .map_err(|e| self.error("get", key, e))?;
        Ok(kv.map(|kv| kv.value))
    }

    async fn scan(&self, prefix: &str) -> procedures::Result<Vec<(String, Vec<u8>)>> {
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

    async fn put(&self, key: &str, value: Vec<u8>) -> procedures::Result<()> {
        let kv_key = self.kv_key(key);
        self.check_limits(key, 1, kv_key.len() + value.len())?;
        self.kv
            .put(PutRequest {
                key: kv_key,
                value,
                prev_kv: false,
            })
            .await
            .map_err(|e| self.error("put", key, e))?;
        Ok(())
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
        self.kv
            .txn(Txn {
                compare: Vec::new(),
                success: ops,
                failure: Vec::new(),
            })
            .await
            .map_err(|e| self.error("delete", first, e))?;
        Ok(())
    }

    async fn write(
        &self,
        conditions: Vec<Condition>,
        ops: Vec<WriteOp>,
    ) -> procedures::Result<WriteOutcome> {
        // The kv txn refuses a key written twice in a branch; applied in order, the last op on a key wins.
        let mut seen = HashSet::new();
        let mut last_ops: Vec<WriteOp> = ops
            .into_iter()
            .rev()
            .filter(|op| seen.insert(op.key().to_string()))
            .collect();
        last_ops.reverse();

        let first = last_ops
            .first()
            .map(|op| op.key().to_string())
            .or_else(|| conditions.first().map(|c| c.key().to_string()))
            .unwrap_or_default();
        let compare: Vec<Compare> = conditions
            .iter()
            .map(|c| match c {
                Condition::Equals { key, value } => {
                    Compare::ValueEquals(self.kv_key(key), value.clone())
                }
                Condition::Absent { key } => Compare::Absent(self.kv_key(key)),
            })
            .collect();
        let success: Vec<TxnOp> = last_ops
            .iter()
            .map(|op| match op {
                WriteOp::Put { key, value } => TxnOp::Put(self.kv_key(key), value.clone()),
                WriteOp::Delete { key } => TxnOp::Delete(self.kv_key(key)),
            })
            .collect();
        let failure: Vec<TxnOp> = conditions
            .iter()
            .map(|c| TxnOp::Get(self.kv_key(c.key())))
            .collect();
        let txn = Txn {
            compare,
            success,
            failure,
        };
        let ops = txn.compare.len() + txn.success.len().max(txn.failure.len());
        self.check_limits(&first, ops, crate::kv::check::txn_bytes(&txn))?;

        let resp = self
            .kv
            .txn(txn)
            .await
            .map_err(|e| self.error("write", &first, e))?;
        if resp.succeeded {
            return Ok(WriteOutcome::Applied);
        }
        let current = conditions
            .iter()
            .zip(resp.responses)
            .map(|(c, r)| {
                let value = match r {
                    TxnOpResponse::Get(kv) => kv.map(|kv| kv.value),
                    _ => None,
                };
                (c.key().to_string(), value)
            })
            .collect();
        Ok(WriteOutcome::Rejected { current })
    }
}
