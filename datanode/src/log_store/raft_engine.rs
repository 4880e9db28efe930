//! [`RaftEngineLogStore`]: the log of every raft-engine region of one datanode, in one raft-engine directory
//! (`[datanodes] wal_dir`, default `./walctl-data/wal/{datanode}`).
//!
//! Each region is a raft-engine group (group id = region id). An entry is stored under the key `e` + its entry id
//! (u64 big-endian), so a scan from a key reads a region's entries in entry-id order; a region's entry ids start
//! at 1 and increase by one per entry. Every append is one raft-engine write batch, synced before it returns.
//!
//! **Flush.** [`RaftEngineLogStore::flush`] records a region's flushed entry id under the key `c` of its group and
//! deletes its entries at or below it, in one synced write batch: a replay reads only what is above the checkpoint,
//! and entry ids keep increasing from the checkpoint even when every entry of the region was deleted.
//!
//! raft-engine keeps key-value pairs in memory as well as in its files, so this store holds the entries not yet
//! pruned in memory: fine for the WAL between two flushes, which is what it is for.
//!
//! raft-engine's calls block (file I/O, fsync), so they run on tokio's blocking pool. Its errors are I/O or
//! corruption of the directory: none is retryable.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use raft_engine::{Config, Engine, LogBatch};
use snafu::IntoError;

use super::{AppendedEntry, Entry, EntryId, EntryToWrite, LogStore, RegionId};
use remote_wal::wal::error::Result;
use remote_wal::wal::error::{
    RaftEngineOpSnafu, RaftEngineOpenSnafu, RaftEngineTaskSnafu, WalFlushBeyondEndSnafu,
};

/// The first byte of every entry key.
const ENTRY_KEY_PREFIX: u8 = b'e';

/// The key of a region's flushed entry id (u64 big-endian); it sorts below every entry key.
const CHECKPOINT_KEY: &[u8] = b"c";

fn entry_key(entry_id: EntryId) -> Vec<u8> {
    let mut key = Vec::with_capacity(9);
    key.push(ENTRY_KEY_PREFIX);
    key.extend_from_slice(&entry_id.to_be_bytes());
    key
}

fn entry_id_of_key(key: &[u8]) -> Option<EntryId> {
    let rest = key.strip_prefix(&[ENTRY_KEY_PREFIX])?;
    let bytes: [u8; 8] = rest.try_into().ok()?;
    Some(u64::from_be_bytes(bytes))
}

struct Inner {
    engine: Engine,
    dir: PathBuf,
    /// The last entry id of each region, loaded lazily from the engine; appends hold it across the write.
    last: std::sync::Mutex<BTreeMap<RegionId, EntryId>>,
}

/// The raft-engine log of one datanode.
#[derive(Clone)]
pub struct RaftEngineLogStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RaftEngineLogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftEngineLogStore")
            .field("dir", &self.inner.dir)
            .finish()
    }
}

impl RaftEngineLogStore {
    /// Opens (or creates, with its parents) the engine directory `dir`, recovering what it holds.
    pub async fn open(dir: &Path) -> Result<Self> {
        let dir = dir.to_path_buf();
        let path = dir.clone();
        let engine = run_blocking(&dir, "open", move || {
            std::fs::create_dir_all(&path).map_err(|e| {
                RaftEngineOpenSnafu {
                    dir: path.display().to_string(),
                }
                .into_error(raft_engine::Error::Io(e))
            })?;
            let config = Config {
                dir: path.display().to_string(),
                ..Config::default()
            };
            Engine::open(config).map_err(|e| {
                RaftEngineOpenSnafu {
                    dir: path.display().to_string(),
                }
                .into_error(e)
            })
        })
        .await?;
        Ok(RaftEngineLogStore {
            inner: Arc::new(Inner {
                engine,
                dir,
                last: std::sync::Mutex::new(BTreeMap::new()),
            }),
        })
    }

    /// The engine directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Records that `region_id`'s entries up to `entry_id` are flushed and deletes them, in one synced write
    /// batch; a stored checkpoint at or above `entry_id` is kept (a checkpoint only moves forward). An `entry_id`
    /// above the region's last entry id is refused naming the region: a checkpoint past the end would make the
    /// region's next entries look flushed. Returns the checkpoint stored afterwards.
    pub async fn flush(&self, region_id: RegionId, entry_id: EntryId) -> Result<EntryId> {
        let inner = self.inner.clone();
        run_blocking(&self.inner.dir, "flush", move || {
            inner.flush(region_id, entry_id)
        })
        .await
    }

    /// Deletes everything the engine holds of `region_id` (entries and checkpoint), in one synced write: the
    /// region's table was dropped. A region it holds nothing of is no error.
    pub async fn delete_region(&self, region_id: RegionId) -> Result<()> {
        let inner = self.inner.clone();
        run_blocking(&self.inner.dir, "delete a dropped region", move || {
            inner.delete_region(region_id)
        })
        .await
    }

    /// The region's flushed entry id (0 when it was never flushed).
    pub async fn flushed_entry_id(&self, region_id: RegionId) -> Result<EntryId> {
        let inner = self.inner.clone();
        run_blocking(&self.inner.dir, "read the checkpoint", move || {
            inner.checkpoint(region_id)
        })
        .await
    }
}

impl Inner {
    fn op_error(
        &self,
        operation: &str,
        region_id: RegionId,
        e: raft_engine::Error,
    ) -> remote_wal::wal::Error {
        RaftEngineOpSnafu {
            dir: self.dir.display().to_string(),
            operation,
            region_id,
        }
        .into_error(e)
    }

    /// The region's flushed entry id as stored (0 when it has none).
    fn checkpoint(&self, region_id: RegionId) -> Result<EntryId> {
        Ok(self
            .engine
            .get(region_id, CHECKPOINT_KEY)
            .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
            .map_or(0, u64::from_be_bytes))
    }

    /// The region's last entry id as stored: its last entry's, or its checkpoint when every entry up to it was
    /// flushed (0 when it has neither).
    fn stored_last(&self, region_id: RegionId) -> Result<EntryId> {
        let mut last = self.checkpoint(region_id)?;
        self.engine
            .scan_raw_messages(
                region_id,
                None,
                None,
                true,
                |key, _| match entry_id_of_key(key) {
                    Some(id) => {
                        last = last.max(id);
                        false
                    }
                    None => true,
                },
            )
            .map_err(|e| self.op_error("find the last entry", region_id, e))?;
        Ok(last)
    }

    fn last_entry_id(&self, region_id: RegionId) -> Result<EntryId> {
        let mut cache = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(id) = cache.get(&region_id) {
            return Ok(*id);
        }
        let id = self.stored_last(region_id)?;
        cache.insert(region_id, id);
        Ok(id)
    }

    fn append(&self, entries: Vec<EntryToWrite>) -> Result<Vec<AppendedEntry>> {
        // Held across the write: two appends of a region never get the same ids.
        let mut cache = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let mut next: BTreeMap<RegionId, EntryId> = BTreeMap::new();
        let mut batch = LogBatch::default();
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            let region_id = entry.region_id;
            let last = match next.get(&region_id).or(cache.get(&region_id)) {
                Some(id) => *id,
                None => self.stored_last(region_id)?,
            };
            let entry_id = last + 1;
            next.insert(region_id, entry_id);
            batch
                .put(region_id, entry_key(entry_id), entry.data)
                .map_err(|e| self.op_error("append", region_id, e))?;
            out.push(AppendedEntry {
                region_id,
                entry_id,
            });
        }
        if !batch.is_empty() {
            let first = out.first().map_or(0, |e| e.region_id);
            self.engine
                .write(&mut batch, true)
                .map_err(|e| self.op_error("append", first, e))?;
        }
        cache.extend(next);
        Ok(out)
    }

    fn flush(&self, region_id: RegionId, entry_id: EntryId) -> Result<EntryId> {
        // Held across the write: an append never takes an id the flush is deleting.
        let mut cache = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let last = match cache.get(&region_id) {
            Some(id) => *id,
            None => self.stored_last(region_id)?,
        };
        cache.insert(region_id, last);
        snafu::ensure!(
            entry_id <= last,
            WalFlushBeyondEndSnafu {
                region_id,
                wal: format!("raft-engine '{}'", self.dir.display()),
                entry_id,
                end: last,
            }
        );
        let stored = self.checkpoint(region_id)?;
        if stored >= entry_id {
            return Ok(stored);
        }
        let mut batch = LogBatch::default();
        batch
            .put(
                region_id,
                CHECKPOINT_KEY.to_vec(),
                entry_id.to_be_bytes().to_vec(),
            )
            .map_err(|e| self.op_error("flush", region_id, e))?;
        let start = entry_key(1);
        let end = entry_key(entry_id.saturating_add(1));
        let mut flushed = Vec::new();
        self.engine
            .scan_raw_messages(region_id, Some(&start), Some(&end), false, |key, _| {
                flushed.push(key.to_vec());
                true
            })
            .map_err(|e| self.op_error("flush", region_id, e))?;
        for key in flushed {
            batch.delete(region_id, key);
        }
        self.engine
            .write(&mut batch, true)
            .map_err(|e| self.op_error("flush", region_id, e))?;
        Ok(entry_id)
    }

    fn delete_region(&self, region_id: RegionId) -> Result<()> {
        // Held across the write: no append of the region interleaves with its deletion.
        let mut cache = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let mut batch = LogBatch::default();
        batch.add_command(region_id, raft_engine::Command::Clean);
        self.engine
            .write(&mut batch, true)
            .map_err(|e| self.op_error("delete a dropped region", region_id, e))?;
        cache.remove(&region_id);
        Ok(())
    }

    fn read(&self, region_id: RegionId, from: EntryId) -> Result<Vec<Entry>> {
        let mut out = Vec::new();
        let start = entry_key(from.max(1));
        let end = vec![ENTRY_KEY_PREFIX + 1];
        self.engine
            .scan_raw_messages(region_id, Some(&start), Some(&end), false, |key, value| {
                if let Some(entry_id) = entry_id_of_key(key) {
                    out.push(Entry {
                        region_id,
                        entry_id,
                        data: value.to_vec(),
                    });
                }
                true
            })
            .map_err(|e| self.op_error("read", region_id, e))?;
        Ok(out)
    }
}

/// Runs a blocking raft-engine call on tokio's blocking pool.
async fn run_blocking<T: Send + 'static>(
    dir: &Path,
    operation: &'static str,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        RaftEngineTaskSnafu {
            dir: dir.display().to_string(),
            operation,
            reason: e.to_string(),
        }
        .build()
    })?
}

#[async_trait]
impl LogStore for RaftEngineLogStore {
    async fn append(&self, entries: Vec<EntryToWrite>) -> Result<Vec<AppendedEntry>> {
        let inner = self.inner.clone();
        run_blocking(&self.inner.dir, "append", move || inner.append(entries)).await
    }

    async fn read_regions(
        &self,
        from: &BTreeMap<RegionId, EntryId>,
    ) -> Result<BTreeMap<RegionId, Vec<Entry>>> {
        let inner = self.inner.clone();
        let from = from.clone();
        run_blocking(&self.inner.dir, "read", move || {
            from.into_iter()
                .map(|(region_id, from)| Ok((region_id, inner.read(region_id, from)?)))
                .collect()
        })
        .await
    }

    async fn last_entry_id(&self, region_id: RegionId) -> Result<EntryId> {
        let inner = self.inner.clone();
        run_blocking(&self.inner.dir, "last entry id", move || {
            inner.last_entry_id(region_id)
        })
        .await
    }
}
