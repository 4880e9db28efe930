//! [`RedbKvBackend`]: the metadata store in one embedded redb file — the CLI's default store.
//!
//! One table holds every pair. Every write call (puts, batches, deletes, compare-and-put, txn) is one redb write
//! transaction committed with immediate durability: when the call returns `Ok`, the change survives a crash.
//! Compares are read inside the same write transaction, and redb runs one write transaction at a time, so a txn's
//! compares and ops are atomic. redb's calls block on disk I/O, so each runs on tokio's blocking pool.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use redb::{Database, ReadableDatabase, ReadableTable, Table, TableDefinition};
use snafu::ResultExt;

use crate::error::{RedbLockedSnafu, RedbOpSnafu, RedbOpenSnafu, RedbTaskSnafu, Result};
use crate::kv::{
    Compare, CompareAndPutRequest, CompareAndPutResponse, KeyValue, KvBackend, PutRequest,
    RangeRequest, RangeResponse, Txn, TxnOp, TxnOpResponse, TxnResponse, check, display_key,
};

const TABLE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("kv");

/// A [`KvBackend`] on one redb database file. Only one handle (in any process) may hold the file at a time.
#[derive(Clone)]
pub struct RedbKvBackend {
    db: Arc<Database>,
    path: PathBuf,
}

impl std::fmt::Debug for RedbKvBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbKvBackend")
            .field("path", &self.path)
            .finish()
    }
}

impl RedbKvBackend {
    /// Opens the database file at `path`, creating it (not its directory) if missing. Blocks on file I/O: call it
    /// at startup or from a blocking context. A file already held by another process or handle gives
    /// [`Error::RedbLocked`] naming the path.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let db = match Database::create(&path) {
            Ok(db) => db,
            Err(
                source @ (redb::DatabaseError::DatabaseAlreadyOpen
                | redb::DatabaseError::LockProtocolMismatch),
            ) => return Err(source).context(RedbLockedSnafu { path }),
            Err(source) => return Err(source).context(RedbOpenSnafu { path }),
        };
        // Create the table once so that readers never meet a missing table.
        let init = || -> Result<(), redb::Error> {
            let tx = db.begin_write()?;
            tx.open_table(TABLE)?;
            tx.commit()?;
            Ok(())
        };
        init().map_err(Box::new).context(RedbOpSnafu {
            path: path.clone(),
            action: "create table",
            key: "",
        })?;
        Ok(RedbKvBackend {
            db: Arc::new(db),
            path,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on the blocking pool; its redb error is reported with `action` and `key`.
    async fn blocking<T, F>(&self, action: &'static str, key: &[u8], f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Database) -> Result<T, redb::Error> + Send + 'static,
    {
        let db = self.db.clone();
        let joined = tokio::task::spawn_blocking(move || f(&db)).await;
        let key = display_key(key);
        joined
            .context(RedbTaskSnafu {
                path: self.path.clone(),
                action,
                key: key.clone(),
            })?
            .map_err(Box::new)
            .context(RedbOpSnafu {
                path: self.path.clone(),
                action,
                key,
            })
    }

    /// Runs `f` in one write transaction and commits it durably.
    async fn write<T, F>(&self, action: &'static str, key: &[u8], f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Table<&[u8], &[u8]>) -> Result<T, redb::Error> + Send + 'static,
    {
        self.blocking(action, key, move |db| {
            let tx = db.begin_write()?;
            let out = {
                let mut table = tx.open_table(TABLE)?;
                f(&mut table)?
            };
            tx.commit()?;
            Ok(out)
        })
        .await
    }
}

fn pair(k: &[u8], v: &[u8]) -> KeyValue {
    KeyValue {
        key: k.to_vec(),
        value: v.to_vec(),
    }
}

fn read_value<T: ReadableTable<&'static [u8], &'static [u8]>>(
    table: &T,
    key: &[u8],
) -> Result<Option<Vec<u8>>, redb::Error> {
    Ok(table.get(key)?.map(|v| v.value().to_vec()))
}

fn holds(table: &Table<&[u8], &[u8]>, c: &Compare) -> Result<bool, redb::Error> {
    Ok(match c {
        Compare::ValueEquals(k, v) => read_value(table, k)?.as_ref() == Some(v),
        Compare::Absent(k) => read_value(table, k)?.is_none(),
        Compare::Present(k) => read_value(table, k)?.is_some(),
    })
}

fn insert(
    table: &mut Table<&[u8], &[u8]>,
    k: &[u8],
    v: &[u8],
) -> Result<Option<Vec<u8>>, redb::Error> {
    Ok(table.insert(k, v)?.map(|prev| prev.value().to_vec()))
}

fn remove(table: &mut Table<&[u8], &[u8]>, k: &[u8]) -> Result<Option<Vec<u8>>, redb::Error> {
    Ok(table.remove(k)?.map(|prev| prev.value().to_vec()))
}

#[async_trait]
impl KvBackend for RedbKvBackend {
    fn name(&self) -> String {
        format!("redb:{}", self.path.display())
    }

    fn max_txn_ops(&self) -> usize {
        usize::MAX
    }

    fn max_request_bytes(&self) -> usize {
        usize::MAX
    }

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>> {
        let k = key.to_vec();
        self.blocking("get", key, move |db| {
            let table = db.begin_read()?.open_table(TABLE)?;
            Ok(read_value(&table, &k)?.map(|value| KeyValue { key: k, value }))
        })
        .await
    }

    async fn batch_get(&self, keys: &[Vec<u8>]) -> Result<Vec<KeyValue>> {
        let first = keys.first().cloned().unwrap_or_default();
        let keys = keys.to_vec();
        self.blocking("batch_get", &first, move |db| {
            let table = db.begin_read()?.open_table(TABLE)?;
            let mut out = Vec::new();
            for k in keys {
                if let Some(value) = read_value(&table, &k)? {
                    out.push(KeyValue { key: k, value });
                }
            }
            Ok(out)
        })
        .await
    }

    async fn range(&self, req: RangeRequest) -> Result<RangeResponse> {
        let key = req.key.clone();
        self.blocking("range", &key, move |db| {
            let Some(bounds) = check::span(&req.key, &req.range_end) else {
                return Ok(RangeResponse::default());
            };
            let table = db.begin_read()?.open_table(TABLE)?;
            let limit = if req.limit == 0 {
                usize::MAX
            } else {
                req.limit
            };
            let mut kvs = Vec::new();
            let mut more = false;
            for entry in table.range::<&[u8]>(bounds)? {
                if kvs.len() == limit {
                    more = true;
                    break;
                }
                let (k, v) = entry?;
                kvs.push(KeyValue {
                    key: k.value().to_vec(),
                    value: if req.keys_only {
                        Vec::new()
                    } else {
                        v.value().to_vec()
                    },
                });
            }
            Ok(RangeResponse { kvs, more })
        })
        .await
    }

    async fn put(&self, req: PutRequest) -> Result<Option<KeyValue>> {
        check::key(&self.name(), &req.key)?;
        let key = req.key.clone();
        self.write("put", &key, move |table| {
            let prev = insert(table, &req.key, &req.value)?;
            Ok(prev.filter(|_| req.prev_kv).map(|value| KeyValue {
                key: req.key,
                value,
            }))
        })
        .await
    }

    async fn batch_put(&self, kvs: Vec<KeyValue>, prev_kv: bool) -> Result<Vec<KeyValue>> {
        let kvs = check::dedup_puts(&self.name(), kvs)?;
        let first = kvs.first().map(|kv| kv.key.clone()).unwrap_or_default();
        self.write("batch_put", &first, move |table| {
            let mut prevs = Vec::new();
            for kv in kvs {
                if let Some(value) = insert(table, &kv.key, &kv.value)?
                    && prev_kv
                {
                    prevs.push(KeyValue { key: kv.key, value });
                }
            }
            Ok(prevs)
        })
        .await
    }

    async fn compare_and_put(&self, req: CompareAndPutRequest) -> Result<CompareAndPutResponse> {
        check::key(&self.name(), &req.key)?;
        let key = req.key.clone();
        self.blocking("compare_and_put", &key, move |db| {
            let tx = db.begin_write()?;
            let (success, prev) = {
                let mut table = tx.open_table(TABLE)?;
                let prev = read_value(&table, &req.key)?;
                let success = prev == req.expect;
                if success {
                    insert(&mut table, &req.key, &req.value)?;
                }
                (success, prev)
            };
            if success {
                tx.commit()?;
            } else {
                tx.abort()?;
            }
            Ok(CompareAndPutResponse {
                success,
                prev_kv: prev.map(|value| KeyValue {
                    key: req.key,
                    value,
                }),
            })
        })
        .await
    }

    async fn delete_range(
        &self,
        key: &[u8],
        range_end: &[u8],
        prev_kv: bool,
    ) -> Result<(u64, Vec<KeyValue>)> {
        if check::span(key, range_end).is_none() {
            return Ok((0, Vec::new()));
        }
        let (start, end) = (key.to_vec(), range_end.to_vec());
        self.write("delete_range", key, move |table| {
            let Some(bounds) = check::span(&start, &end) else {
                return Ok((0, Vec::new()));
            };
            let mut doomed = Vec::new();
            for entry in table.range::<&[u8]>(bounds)? {
                let (k, v) = entry?;
                doomed.push(pair(k.value(), if prev_kv { v.value() } else { &[] }));
            }
            for kv in &doomed {
                table.remove(kv.key.as_slice())?;
            }
            let n = doomed.len() as u64;
            Ok((n, if prev_kv { doomed } else { Vec::new() }))
        })
        .await
    }

    async fn batch_delete(&self, keys: &[Vec<u8>], prev_kv: bool) -> Result<Vec<KeyValue>> {
        let first = keys.first().cloned().unwrap_or_default();
        let keys = keys.to_vec();
        self.write("batch_delete", &first, move |table| {
            let mut prevs = Vec::new();
            for k in keys {
                if let Some(value) = remove(table, &k)?
                    && prev_kv
                {
                    prevs.push(KeyValue { key: k, value });
                }
            }
            Ok(prevs)
        })
        .await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        check::txn(
            &self.name(),
            &txn,
            self.max_txn_ops(),
            self.max_request_bytes(),
        )?;
        let first = txn
            .compare
            .first()
            .map(|c| c.key().to_vec())
            .or_else(|| txn.success.first().map(|op| op.key().to_vec()))
            .unwrap_or_default();
        self.blocking("txn", &first, move |db| {
            let tx = db.begin_write()?;
            let (succeeded, responses, wrote) = {
                let mut table = tx.open_table(TABLE)?;
                let mut succeeded = true;
                for c in &txn.compare {
                    if !holds(&table, c)? {
                        succeeded = false;
                        break;
                    }
                }
                let ops = if succeeded { txn.success } else { txn.failure };
                let wrote = ops.iter().any(|op| !matches!(op, TxnOp::Get(_)));
                let mut responses = Vec::with_capacity(ops.len());
                for op in ops {
                    responses.push(match op {
                        TxnOp::Put(k, v) => {
                            insert(&mut table, &k, &v)?;
                            TxnOpResponse::Put
                        }
                        TxnOp::Get(k) => {
                            TxnOpResponse::Get(read_value(&table, &k)?.map(|v| pair(&k, &v)))
                        }
                        TxnOp::Delete(k) => {
                            TxnOpResponse::Delete(u64::from(remove(&mut table, &k)?.is_some()))
                        }
                    });
                }
                (succeeded, responses, wrote)
            };
            if wrote {
                tx.commit()?;
            } else {
                tx.abort()?;
            }
            Ok(TxnResponse {
                succeeded,
                responses,
            })
        })
        .await
    }
}
