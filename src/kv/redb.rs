//! [`RedbKvBackend`]: the metadata store in one embedded redb file — the CLI's default store.
//!
//! One table holds every pair. Every write call (puts, batches, deletes, compare-and-put, txn) is one redb write
//! transaction committed with immediate durability: when the call returns `Ok`, the change survives a crash.
//! Compares are read inside the same write transaction, and redb runs one write transaction at a time, so a txn's
//! compares and ops are atomic. redb's calls block on disk I/O, so each runs on tokio's blocking pool.
//!
//! A damaged file is an error naming the path, never a panic: the file is opened with redb's integrity check and
//! every redb call runs behind `catch_unwind` (redb panics on some damaged bytes). An empty file is refused, never
//! re-initialised, and only a [`RedbOpenMode::CreateIfMissing`] opener creates a missing one.

use std::cell::{Cell, RefCell};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Once};

use async_trait::async_trait;
use redb::{Builder, Database, ReadableDatabase, ReadableTable, Table, TableDefinition};
use snafu::ResultExt;

use crate::kv::error::{
    RedbDamagedSnafu, RedbEmptyFileSnafu, RedbFileSnafu, RedbLockedSnafu, RedbMissingSnafu,
    RedbOpSnafu, RedbOpenSnafu, RedbTaskSnafu, Result,
};
use crate::kv::{
    Compare, CompareAndPutRequest, CompareAndPutResponse, KeyValue, KvBackend, PutRequest,
    RangeRequest, RangeResponse, Txn, TxnOp, TxnOpResponse, TxnResponse, check, display_key,
};

const TABLE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("kv");

/// Whether [`RedbKvBackend::open_with`] may create a missing file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RedbOpenMode {
    /// Create the file when it does not exist (an opener that writes metadata). The default.
    #[default]
    CreateIfMissing,
    /// The file must exist: a missing file is [`Error::RedbMissing`](crate::kv::Error::RedbMissing) naming the path
    /// (an opener that only reads metadata).
    MustExist,
}

/// The open database and what is known about its health.
struct Inner {
    /// `None` only while dropping.
    db: Option<Database>,
    path: PathBuf,
    /// Set when redb panicked in a call: the message, repeated by every later call.
    damaged: Mutex<Option<String>>,
}

impl Inner {
    fn damaged(&self) -> Option<String> {
        self.damaged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let Some(db) = self.db.take() else { return };
        if self.damaged().is_some() {
            // redb's state in memory is not trustworthy after a panic: closing could write it (or panic again).
            std::mem::forget(db);
        } else if let Err(message) = guarded(move || drop(db)) {
            tracing::warn!(path = %self.path.display(), %message, "closing the redb metadata store failed");
        }
    }
}

/// A [`KvBackend`] on one redb database file. Only one handle (in any process) may hold the file at a time.
///
/// Every redb call runs behind [`catch_unwind`]: redb panics on some damaged bytes, and such a panic becomes
/// [`Error::RedbDamaged`](crate::kv::Error::RedbDamaged) naming the path; the handle then refuses every later call.
#[derive(Clone)]
pub struct RedbKvBackend {
    inner: Arc<Inner>,
    path: PathBuf,
}

impl std::fmt::Debug for RedbKvBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbKvBackend")
            .field("path", &self.path)
            .finish()
    }
}

thread_local! {
    /// How many guarded redb calls this thread is inside.
    static IN_REDB: Cell<u32> = const { Cell::new(0) };
    /// Where the last panic inside a guarded call was raised.
    static PANIC_LOCATION: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Installs (once) a panic hook that keeps panics inside guarded redb calls off stderr — they become errors — and
/// hands every other panic to the hook that was installed before.
fn install_quiet_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_REDB.with(Cell::get) > 0 {
                let location = info.location().map(|l| l.to_string());
                PANIC_LOCATION.with(|p| *p.borrow_mut() = location);
            } else {
                previous(info);
            }
        }));
    });
}

/// Runs `f`, turning a panic into its message (and location).
fn guarded<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    install_quiet_hook();
    IN_REDB.with(|c| c.set(c.get() + 1));
    let result = catch_unwind(AssertUnwindSafe(f));
    IN_REDB.with(|c| c.set(c.get().saturating_sub(1)));
    result.map_err(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_string());
        let message = message.lines().next().unwrap_or_default().to_string();
        match PANIC_LOCATION.with(|p| p.borrow_mut().take()) {
            Some(at) => format!("{message} at {at}"),
            None => message,
        }
    })
}

impl RedbKvBackend {
    /// [`RedbKvBackend::open_with`] in [`RedbOpenMode::CreateIfMissing`]: opens the file at `path`, creating it
    /// (not its directory) when missing.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, RedbOpenMode::CreateIfMissing)
    }

    /// Opens the database file at `path`. Blocks on file I/O: call it at startup or from a blocking context.
    ///
    /// - A missing file is created (in [`RedbOpenMode::CreateIfMissing`], atomically: a fresh database is written
    ///   next to it and linked into place, so a crash never leaves a half-made file at `path`) or is
    ///   [`Error::RedbMissing`](crate::kv::Error::RedbMissing) ([`RedbOpenMode::MustExist`]).
    /// - An empty (0-byte) file is [`Error::RedbEmptyFile`](crate::kv::Error::RedbEmptyFile) in both modes: it is
    ///   never re-initialised.
    /// - An existing file is opened with redb's integrity check, so a damaged or truncated file is an error naming
    ///   the path ([`Error::RedbOpen`](crate::kv::Error::RedbOpen) or [`Error::RedbDamaged`](crate::kv::Error::RedbDamaged)),
    ///   never a panic.
    /// - A file already held by another process or handle gives [`Error::RedbLocked`](crate::kv::Error::RedbLocked).
    pub fn open_with(path: impl AsRef<Path>, mode: RedbOpenMode) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() && meta.len() == 0 => {
                return RedbEmptyFileSnafu { path }.fail();
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match mode {
                RedbOpenMode::MustExist => return RedbMissingSnafu { path }.fail(),
                RedbOpenMode::CreateIfMissing => create_new(&path)?,
            },
            Err(source) => {
                return Err(source).context(RedbFileSnafu {
                    path,
                    action: "read the file's metadata",
                });
            }
        }
        let db = open_existing(&path)?;
        let backend = RedbKvBackend {
            inner: Arc::new(Inner {
                db: Some(db),
                path: path.clone(),
                damaged: Mutex::new(None),
            }),
            path,
        };
        backend.ensure_table()?;
        Ok(backend)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Creates the table unless it exists, so that readers never meet a missing table (a read-only opener of a
    /// store made by this crate writes nothing).
    fn ensure_table(&self) -> Result<()> {
        self.run_sync("open", b"", |db| {
            let exists = match db.begin_read()?.open_table(TABLE) {
                Ok(_) => true,
                Err(redb::TableError::TableDoesNotExist(_)) => false,
                Err(e) => return Err(e.into()),
            };
            if !exists {
                let tx = db.begin_write()?;
                tx.open_table(TABLE)?;
                tx.commit()?;
            }
            Ok(())
        })
    }

    /// Runs `f` on this thread behind the panic guard; errors name the path, `action` and `key`.
    fn run_sync<T>(
        &self,
        action: &'static str,
        key: &[u8],
        f: impl FnOnce(&Database) -> Result<T, redb::Error>,
    ) -> Result<T> {
        run_guarded(&self.inner, action, &display_key(key), f)
    }

    /// Runs `f` on the blocking pool behind the panic guard; its redb error is reported with `action` and `key`.
    async fn blocking<T, F>(&self, action: &'static str, key: &[u8], f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Database) -> Result<T, redb::Error> + Send + 'static,
    {
        let inner = self.inner.clone();
        let key = display_key(key);
        let task_key = key.clone();
        let joined =
            tokio::task::spawn_blocking(move || run_guarded(&inner, action, &task_key, f)).await;
        joined.context(RedbTaskSnafu {
            path: self.path.clone(),
            action,
            key,
        })?
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

/// Runs `f` on the database behind the panic guard. A panic marks the handle damaged; a damaged handle refuses.
fn run_guarded<T>(
    inner: &Inner,
    action: &'static str,
    key: &str,
    f: impl FnOnce(&Database) -> Result<T, redb::Error>,
) -> Result<T> {
    let damaged = |message: String| {
        RedbDamagedSnafu {
            path: inner.path.clone(),
            operation: if key.is_empty() {
                action.to_string()
            } else {
                format!("{action} on key '{key}'")
            },
            message,
        }
        .fail()
    };
    if let Some(earlier) = inner.damaged() {
        return damaged(format!(
            "refused after an earlier internal error: {earlier}"
        ));
    }
    let Some(db) = inner.db.as_ref() else {
        return damaged("the handle is closing".to_string());
    };
    match guarded(|| f(db)) {
        Ok(result) => result.map_err(Box::new).context(RedbOpSnafu {
            path: inner.path.clone(),
            action,
            key,
        }),
        Err(message) => {
            *inner.damaged.lock().unwrap_or_else(|p| p.into_inner()) = Some(message.clone());
            damaged(message)
        }
    }
}

/// Opens an existing file with redb's integrity check, behind the panic guard.
fn open_existing(path: &Path) -> Result<Database> {
    let opened = guarded(|| {
        let mut builder = Builder::new();
        builder.set_check_integrity_on_open(true);
        builder.open(path)
    });
    match opened {
        Ok(Ok(db)) => Ok(db),
        Ok(Err(
            source @ (redb::DatabaseError::DatabaseAlreadyOpen
            | redb::DatabaseError::LockProtocolMismatch),
        )) => Err(source).context(RedbLockedSnafu { path }),
        Ok(Err(source)) => Err(source).context(RedbOpenSnafu { path }),
        Err(message) => RedbDamagedSnafu {
            path,
            operation: "open",
            message,
        }
        .fail(),
    }
}

/// Creates a fresh database at `path` without ever leaving a half-made file there: the database (with its table)
/// is written to a temporary file in the same directory, then hard-linked to `path` (which fails, changing
/// nothing, when another opener created `path` meanwhile) and the temporary name removed.
fn create_new(path: &Path) -> Result<()> {
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "metadata.redb".to_string());
    static CREATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nth = CREATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_file_name(format!(
        ".{file_name}.creating-{}-{nth}",
        std::process::id()
    ));
    // A leftover of an earlier process with the same id that died while creating.
    let _ = std::fs::remove_file(&tmp);
    let made = guarded(|| -> Result<Result<(), redb::Error>, redb::DatabaseError> {
        let db = Builder::new().create(&tmp)?;
        let init = || -> Result<(), redb::Error> {
            let tx = db.begin_write()?;
            tx.open_table(TABLE)?;
            tx.commit()?;
            Ok(())
        };
        let init = init();
        drop(db);
        Ok(init)
    });
    let made = match made {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Err(source)) => Err(source).context(RedbOpenSnafu { path }),
        Ok(Ok(Err(source))) => Err(Box::new(source)).context(RedbOpSnafu {
            path: path.to_path_buf(),
            action: "create",
            key: "",
        }),
        Err(message) => RedbDamagedSnafu {
            path,
            operation: "create",
            message,
        }
        .fail(),
    };
    let linked = made.and_then(|()| match std::fs::hard_link(&tmp, path) {
        Ok(()) => Ok(()),
        // Another opener created it first: open theirs.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(source).context(RedbFileSnafu {
            path: path.to_path_buf(),
            action: "create the file",
        }),
    });
    let _ = std::fs::remove_file(&tmp);
    linked?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        // Make the new name durable; a failure only weakens durability of an empty store, so it is not fatal.
        if let Err(e) = std::fs::File::open(dir).and_then(|d| d.sync_all()) {
            tracing::debug!(path = %path.display(), error = %e, "could not sync the directory of the new redb file");
        }
    }
    Ok(())
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

    // Point reads run on the caller's thread: a read transaction never waits for the writer (redb keeps the last
    // committed version for readers), and a lookup in its page cache takes microseconds, less than handing the
    // call to the blocking pool and waking the task again. Ranges, which may read many pages, and every write go
    // to the blocking pool.
    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>> {
        self.run_sync("get", key, |db| {
            let table = db.begin_read()?.open_table(TABLE)?;
            Ok(read_value(&table, key)?.map(|value| KeyValue {
                key: key.to_vec(),
                value,
            }))
        })
    }

    async fn batch_get(&self, keys: &[Vec<u8>]) -> Result<Vec<KeyValue>> {
        let first = keys.first().map(Vec::as_slice).unwrap_or_default();
        self.run_sync("batch_get", first, |db| {
            let table = db.begin_read()?.open_table(TABLE)?;
            let mut out = Vec::new();
            for k in keys {
                if let Some(value) = read_value(&table, k)? {
                    out.push(KeyValue {
                        key: k.clone(),
                        value,
                    });
                }
            }
            Ok(out)
        })
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
        let first = txn.first_key().to_vec();
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
