//! Request checks and range arithmetic shared by the backends, so every backend accepts and refuses the same
//! requests.

use std::collections::HashSet;
use std::ops::Bound;

use snafu::ensure;

use crate::kv::error::{KvInvalidRequestSnafu, KvLimitSnafu, Result};
use crate::kv::{KeyValue, Txn, TxnOp, display_key};

/// Start and end bounds of a key range, for an ordered map.
pub(crate) type Span<'a> = (Bound<&'a [u8]>, Bound<&'a [u8]>);

/// The keys a `(key, range_end)` pair covers, as bounds for an ordered map; `None` when it covers nothing.
pub(crate) fn span<'a>(key: &'a [u8], range_end: &'a [u8]) -> Option<Span<'a>> {
    if range_end.is_empty() {
        Some((Bound::Included(key), Bound::Included(key)))
    } else if range_end == [0] {
        Some((Bound::Included(key), Bound::Unbounded))
    } else if range_end <= key {
        None
    } else {
        Some((Bound::Included(key), Bound::Excluded(range_end)))
    }
}

/// Refuses an empty key: etcd cannot store one, so no backend does.
pub(crate) fn key(backend: &str, key: &[u8]) -> Result<()> {
    ensure!(
        !key.is_empty(),
        KvInvalidRequestSnafu {
            backend,
            key: "",
            reason: "keys must not be empty",
        }
    );
    Ok(())
}

/// Drops earlier puts of a key given again later in the same batch (the last value wins), keeping first-seen order,
/// and refuses empty keys.
pub(crate) fn dedup_puts(backend: &str, kvs: Vec<KeyValue>) -> Result<Vec<KeyValue>> {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(kvs.len());
    for kv in kvs.into_iter().rev() {
        key(backend, &kv.key)?;
        if seen.insert(kv.key.clone()) {
            out.push(kv);
        }
    }
    out.reverse();
    Ok(out)
}

/// Refuses a transaction that writes an empty key, writes a key twice in one branch (etcd refuses that too), or
/// exceeds `max_ops` (compares + ops of the larger branch) or `max_bytes`.
pub(crate) fn txn(backend: &str, txn: &Txn, max_ops: usize, max_bytes: usize) -> Result<()> {
    let first = txn.first_key();
    let ops = txn.compare.len() + txn.success.len().max(txn.failure.len());
    ensure!(
        ops <= max_ops,
        KvLimitSnafu {
            backend,
            key: display_key(first),
            reason: format!(
                "a transaction may hold at most {max_ops} operations (compares + the larger branch), this one holds {ops}"
            ),
        }
    );
    let bytes = txn_bytes(txn);
    ensure!(
        bytes <= max_bytes,
        KvLimitSnafu {
            backend,
            key: display_key(first),
            reason: format!(
                "a request may carry at most {max_bytes} bytes of keys and values, this one carries {bytes}"
            ),
        }
    );
    for branch in [&txn.success, &txn.failure] {
        let mut written = HashSet::new();
        for op in branch {
            key(backend, op.key())?;
            if matches!(op, TxnOp::Put(..) | TxnOp::Delete(..)) {
                ensure!(
                    written.insert(op.key()),
                    KvInvalidRequestSnafu {
                        backend,
                        key: display_key(op.key()),
                        reason: "a transaction branch may write a key only once",
                    }
                );
            }
        }
    }
    for c in &txn.compare {
        key(backend, c.key())?;
    }
    Ok(())
}

/// Bytes of keys and values a transaction carries.
pub(crate) fn txn_bytes(txn: &Txn) -> usize {
    let compares: usize = txn
        .compare
        .iter()
        .map(|c| match c {
            crate::kv::Compare::ValueEquals(k, v) => k.len() + v.len(),
            crate::kv::Compare::Absent(k) | crate::kv::Compare::Present(k) => k.len(),
        })
        .sum();
    let branch = |ops: &[TxnOp]| -> usize {
        ops.iter()
            .map(|op| match op {
                TxnOp::Put(k, v) => k.len() + v.len(),
                TxnOp::Get(k) | TxnOp::Delete(k) => k.len(),
            })
            .sum()
    };
    compares + branch(&txn.success) + branch(&txn.failure)
}
