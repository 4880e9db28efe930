//! Region storage: where a flush puts a region's entries, in a directory every datanode reaches (it stands in for
//! the object store a database's datanodes share). Files outlive any one datanode, so a region reopened anywhere
//! reads them and replays its WAL only above the last entry they hold.
//!
//! Layout: `{root}/{region_id}/{last_entry_id:020}.seg`, one file per flush, named by the last entry id it holds
//! (a flush of no entries writes an empty file: it still moves the region's flushed entry id). A file is written
//! to a `.tmp` name, fsynced, renamed into place and the directory fsynced, so a crash leaves either the whole
//! file or none (a `.tmp` left behind is ignored). Contents: the magic `RWSEG1\n`, then per entry its entry id
//! (u64 big-endian), length (u32 big-endian), CRC-32 of its bytes (u32 big-endian) and its bytes.

use std::io::Write;
use std::path::{Path, PathBuf};

use snafu::{ResultExt, ensure};

use crate::error::{Result, StorageCorruptSnafu, StorageIoSnafu, StorageLateSnafu};
use crate::log_store::{Entry, EntryId, RegionId};

/// The magic at the start of every segment file.
const MAGIC: &[u8] = b"RWSEG1\n";

/// Bytes in front of each entry's data.
const ENTRY_HEADER: usize = 16;

/// What a region's storage holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoredRegion {
    /// Every flushed entry, in entry-id order.
    pub entries: Vec<Entry>,
    /// The highest entry id a flush recorded (0: never flushed).
    pub flushed_entry_id: EntryId,
}

/// Region storage under one root directory.
#[derive(Clone, Debug)]
pub struct RegionStorage {
    root: PathBuf,
}

impl RegionStorage {
    /// Storage under `root` (created on the first flush).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        RegionStorage { root: root.into() }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory of `region_id`.
    pub fn region_dir(&self, region_id: RegionId) -> PathBuf {
        self.root.join(region_id.to_string())
    }

    /// Writes `entries` (in entry-id order) as one file durable before this returns, recording
    /// `flushed_entry_id` (at least the last entry's id) as the region's flushed entry id. With `publish_before`,
    /// the file is renamed into place only if that instant has not passed once it is durable (a lease's deadline);
    /// otherwise it is removed and the flush fails, publishing nothing.
    pub async fn flush(
        &self,
        region_id: RegionId,
        entries: Vec<Entry>,
        flushed_entry_id: EntryId,
        publish_before: Option<std::time::Instant>,
    ) -> Result<()> {
        let dir = self.region_dir(region_id);
        tokio::task::spawn_blocking(move || {
            write_segment(&dir, region_id, &entries, flushed_entry_id, publish_before)
        })
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))
        .context(StorageIoSnafu {
            region_id,
            path: self.region_dir(region_id).display().to_string(),
        })?
    }

    /// Deletes the region's storage (its table was dropped): its directory and every file in it. A region with
    /// no storage is no error, so a repeated delete is one.
    pub async fn delete_region(&self, region_id: RegionId) -> Result<()> {
        let dir = self.region_dir(region_id);
        let path = dir.display().to_string();
        tokio::task::spawn_blocking(move || match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        })
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))
        .and_then(|r| r)
        .context(StorageIoSnafu { region_id, path })
    }

    /// Everything the region's storage holds (nothing for a region never flushed).
    pub async fn read(&self, region_id: RegionId) -> Result<StoredRegion> {
        let dir = self.region_dir(region_id);
        tokio::task::spawn_blocking(move || read_region(&dir, region_id))
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))
            .context(StorageIoSnafu {
                region_id,
                path: self.region_dir(region_id).display().to_string(),
            })?
    }
}

fn write_segment(
    dir: &Path,
    region_id: RegionId,
    entries: &[Entry],
    flushed_entry_id: EntryId,
    publish_before: Option<std::time::Instant>,
) -> Result<()> {
    let io = |path: &Path| StorageIoSnafu {
        region_id,
        path: path.display().to_string(),
    };
    std::fs::create_dir_all(dir).context(io(dir))?;
    let name = format!("{flushed_entry_id:020}.seg");
    let tmp = dir.join(format!("{name}.tmp"));
    let path = dir.join(&name);
    let mut bytes = Vec::with_capacity(
        MAGIC.len()
            + entries
                .iter()
                .map(|e| ENTRY_HEADER + e.data.len())
                .sum::<usize>(),
    );
    bytes.extend_from_slice(MAGIC);
    for entry in entries {
        bytes.extend_from_slice(&entry.entry_id.to_be_bytes());
        bytes.extend_from_slice(
            &u32::try_from(entry.data.len())
                .unwrap_or(u32::MAX)
                .to_be_bytes(),
        );
        bytes.extend_from_slice(&crc32fast::hash(&entry.data).to_be_bytes());
        bytes.extend_from_slice(&entry.data);
    }
    let mut file = std::fs::File::create(&tmp).context(io(&tmp))?;
    file.write_all(&bytes).context(io(&tmp))?;
    file.sync_all().context(io(&tmp))?;
    drop(file);
    if publish_before.is_some_and(|deadline| std::time::Instant::now() >= deadline) {
        let _ = std::fs::remove_file(&tmp);
        return StorageLateSnafu {
            region_id,
            path: path.display().to_string(),
        }
        .fail();
    }
    std::fs::rename(&tmp, &path).context(io(&path))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .context(io(dir))?;
    Ok(())
}

fn read_region(dir: &Path, region_id: RegionId) -> Result<StoredRegion> {
    let mut out = StoredRegion::default();
    let listing = match std::fs::read_dir(dir) {
        Ok(listing) => listing,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => {
            return Err(e).context(StorageIoSnafu {
                region_id,
                path: dir.display().to_string(),
            });
        }
    };
    let mut segments = Vec::new();
    for item in listing {
        let item = item.context(StorageIoSnafu {
            region_id,
            path: dir.display().to_string(),
        })?;
        let name = item.file_name().to_string_lossy().into_owned();
        if let Some(last) = name
            .strip_suffix(".seg")
            .and_then(|n| n.parse::<u64>().ok())
        {
            segments.push((last, item.path()));
        }
    }
    segments.sort();
    let mut merged = std::collections::BTreeMap::new();
    for (last, path) in segments {
        let bytes = std::fs::read(&path).context(StorageIoSnafu {
            region_id,
            path: path.display().to_string(),
        })?;
        let corrupt = |reason: String| {
            StorageCorruptSnafu {
                region_id,
                path: path.display().to_string(),
                reason,
            }
            .build()
        };
        ensure!(
            bytes.starts_with(MAGIC),
            StorageCorruptSnafu {
                region_id,
                path: path.display().to_string(),
                reason: "it does not start with the segment magic".to_string(),
            }
        );
        let mut at = MAGIC.len();
        while at < bytes.len() {
            let head = bytes
                .get(at..at + ENTRY_HEADER)
                .ok_or_else(|| corrupt(format!("an entry header is cut short at byte {at}")))?;
            let entry_id = u64::from_be_bytes(head[0..8].try_into().unwrap_or_default());
            let len = u32::from_be_bytes(head[8..12].try_into().unwrap_or_default()) as usize;
            let crc = u32::from_be_bytes(head[12..16].try_into().unwrap_or_default());
            let data = bytes
                .get(at + ENTRY_HEADER..at + ENTRY_HEADER + len)
                .ok_or_else(|| corrupt(format!("entry {entry_id} is cut short")))?;
            if crc32fast::hash(data) != crc {
                return Err(corrupt(format!("entry {entry_id} fails its checksum")));
            }
            // Files may overlap (a flush that recorded a lower checkpoint, then one from a replay above it): an
            // entry id is one WAL record, so the copies are the same entry; the first read is kept.
            merged.entry(entry_id).or_insert_with(|| data.to_vec());
            at += ENTRY_HEADER + len;
        }
        out.flushed_entry_id = out.flushed_entry_id.max(last);
    }
    out.entries = merged
        .into_iter()
        .map(|(entry_id, data)| Entry {
            region_id,
            entry_id,
            data,
        })
        .collect();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u64, data: &[u8]) -> Entry {
        Entry {
            region_id: 5,
            entry_id: id,
            data: data.to_vec(),
        }
    }

    #[tokio::test]
    async fn flushes_read_back_in_order_and_a_torn_tmp_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let storage = RegionStorage::new(dir.path());
        assert_eq!(storage.read(5).await.unwrap(), StoredRegion::default());
        storage
            .flush(5, vec![entry(1, b"a"), entry(3, b"b")], 3, None)
            .await
            .unwrap();
        storage.flush(5, vec![], 9, None).await.unwrap();
        storage
            .flush(5, vec![entry(12, b"c")], 12, None)
            .await
            .unwrap();
        // A deadline already past: nothing is published.
        let late = storage
            .flush(
                5,
                vec![entry(20, b"late")],
                20,
                Some(std::time::Instant::now()),
            )
            .await
            .unwrap_err();
        assert!(late.to_string().contains("lease"), "{late}");
        std::fs::write(
            storage.region_dir(5).join("00000000000000000099.seg.tmp"),
            b"x",
        )
        .unwrap();
        let read = storage.read(5).await.unwrap();
        assert_eq!(read.flushed_entry_id, 12);
        let ids: Vec<u64> = read.entries.iter().map(|e| e.entry_id).collect();
        assert_eq!(ids, vec![1, 3, 12]);
    }

    #[tokio::test]
    async fn a_damaged_segment_names_region_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let storage = RegionStorage::new(dir.path());
        storage
            .flush(5, vec![entry(1, b"abc")], 1, None)
            .await
            .unwrap();
        let path = storage.region_dir(5).join("00000000000000000001.seg");
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let err = storage.read(5).await.unwrap_err().to_string();
        assert!(
            err.contains("region 5") && err.contains("00000000000000000001.seg"),
            "{err}"
        );
        assert!(err.contains("checksum"), "{err}");
    }
}
