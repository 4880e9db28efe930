//! `Metasrv::write_wal`: synthetic entries spread over a table's regions, each written through its own WAL (its
//! Kafka topic, or its datanode's raft-engine directory), with the throughput it reached (`walctl wal write`).
//!
//! Entry `i` (from 0) goes to the `i mod R`-th region that has a WAL (noop regions get none). The entries of one
//! WAL are appended in batches of about [`BATCH_BYTES`], one batch at a time per WAL, the WALs written
//! concurrently. A Kafka region is started first ([`start_kafka_region`]: its checkpoint becomes the topic's end
//! unless it has one), so it never replays entries other regions wrote before it and a prune never deletes what it
//! writes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::Metasrv;
use super::table_wal::{RegionWal, WalStores};
use crate::datanode::checkpoint::{CheckpointStore, start_kafka_region};
use crate::datanode::log_store::{EntryId, EntryToWrite, LogStore, RegionId};
use crate::ddl::TableName;
use crate::error::Result;

/// The command's name in errors.
const OPERATION: &str = "wal write";

/// About this many bytes of entries go into one `append` call.
pub const BATCH_BYTES: usize = 1024 * 1024;

/// What one region got.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RegionWrite {
    /// The region's number in its table.
    pub region_number: u32,
    /// The region.
    pub region_id: RegionId,
    /// Its WAL: `topic 'T'` or `raft-engine 'DIR'`.
    pub wal: String,
    /// Entries written to it.
    pub entries: u64,
    /// The entry id of the last one (0 when none).
    pub last_entry_id: EntryId,
}

/// What [`Metasrv::write_wal`] did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WalWriteReport {
    /// The table's full name.
    pub table: String,
    /// Entries written.
    pub entries: u64,
    /// Their bytes.
    pub bytes: u64,
    /// How long the appends took, in seconds (opening the WALs and starting regions excluded).
    pub seconds: f64,
    /// Entries per second.
    pub entries_per_sec: f64,
    /// Megabytes (10^6 bytes) per second.
    pub mb_per_sec: f64,
    /// Per region, by region number.
    pub regions: Vec<RegionWrite>,
}

/// The bytes of synthetic entry `index`: its index (u64 big-endian, as much of it as fits), then a pattern.
pub fn synthetic_entry(index: u64, size: usize) -> Vec<u8> {
    let mut data: Vec<u8> = (0..size)
        .map(|i| (index.wrapping_add(i as u64) % 251) as u8)
        .collect();
    let prefix = index.to_be_bytes();
    let n = size.min(prefix.len());
    data[..n].copy_from_slice(&prefix[..n]);
    data
}

/// One WAL's share of the entries: its store and, per entry in order, the region and the entry's index.
struct WalShare {
    wal: RegionWal,
    store: Arc<dyn LogStore>,
    entries: Vec<(RegionId, u64)>,
}

impl Metasrv {
    /// Writes `entries` synthetic entries of `entry_size` bytes spread over table `name`'s regions, each through
    /// its own WAL, and reports the throughput. Errors name the table, the region and its WAL (topic or
    /// directory); entries appended before an error stay written.
    pub async fn write_wal(
        &self,
        name: &TableName,
        entries: u64,
        entry_size: usize,
    ) -> Result<WalWriteReport> {
        let (table, regions) = self.table_wal(OPERATION, name).await?;
        let writers: Vec<_> = regions
            .iter()
            .filter(|r| r.wal != RegionWal::Noop)
            .collect();
        let mut stores = WalStores::default();
        let mut shares: BTreeMap<RegionWal, WalShare> = BTreeMap::new();
        let checkpoints = CheckpointStore::new(self.kv.clone());
        for region in &writers {
            let region_id = region.placement.region_id;
            let fail =
                |e| self.wal_region_error(OPERATION, &table.table, region_id, &region.wal, e);
            let store: Arc<dyn LogStore> = match &region.wal {
                RegionWal::Kafka { topic } => {
                    let store = self
                        .kafka_store(&mut stores, OPERATION, topic)
                        .await
                        .map_err(fail)?;
                    start_kafka_region(&store, &checkpoints, region_id)
                        .await
                        .map_err(fail)?;
                    store
                }
                RegionWal::RaftEngine { datanode_id } => Arc::new(
                    self.raft_engine_store(&mut stores, *datanode_id)
                        .await
                        .map_err(fail)?,
                ),
                RegionWal::Noop => continue,
            };
            shares
                .entry(region.wal.clone())
                .or_insert_with(|| WalShare {
                    wal: region.wal.clone(),
                    store,
                    entries: Vec::new(),
                });
        }
        if !writers.is_empty() {
            for index in 0..entries {
                let region = writers[(index % writers.len() as u64) as usize];
                if let Some(share) = shares.get_mut(&region.wal) {
                    share.entries.push((region.placement.region_id, index));
                }
            }
        }

        let per_batch = (BATCH_BYTES / entry_size.max(1)).max(1);
        let started = Instant::now();
        let results = futures::future::join_all(
            shares
                .values()
                .map(|share| write_share(share, entry_size, per_batch)),
        )
        .await;
        let elapsed = started.elapsed();
        let mut last: BTreeMap<RegionId, (u64, EntryId)> = BTreeMap::new();
        for (share, result) in shares.values().zip(results) {
            match result {
                Ok(appended) => {
                    for (region_id, entry_id) in appended {
                        let slot = last.entry(region_id).or_insert((0, 0));
                        slot.0 += 1;
                        slot.1 = slot.1.max(entry_id);
                    }
                }
                Err((region_id, e)) => {
                    return Err(self.wal_region_error(
                        OPERATION,
                        &table.table,
                        region_id,
                        &share.wal,
                        e,
                    ));
                }
            }
        }
        let written: u64 = last.values().map(|(n, _)| n).sum();
        let bytes = written * entry_size as u64;
        let seconds = elapsed.max(Duration::from_nanos(1)).as_secs_f64();
        Ok(WalWriteReport {
            table: table.table.clone(),
            entries: written,
            bytes,
            seconds,
            entries_per_sec: written as f64 / seconds,
            mb_per_sec: bytes as f64 / 1e6 / seconds,
            regions: regions
                .iter()
                .filter(|r| r.wal != RegionWal::Noop)
                .map(|r| {
                    let (n, id) = last.get(&r.placement.region_id).copied().unwrap_or((0, 0));
                    RegionWrite {
                        region_number: r.placement.region_number,
                        region_id: r.placement.region_id,
                        wal: self.describe_wal(&r.wal),
                        entries: n,
                        last_entry_id: id,
                    }
                })
                .collect(),
        })
    }
}

/// Appends one WAL's entries batch after batch; returns each entry's region and id, or the error and the region
/// of the batch's first entry.
async fn write_share(
    share: &WalShare,
    entry_size: usize,
    per_batch: usize,
) -> std::result::Result<Vec<(RegionId, EntryId)>, (RegionId, crate::Error)> {
    let mut out = Vec::with_capacity(share.entries.len());
    for chunk in share.entries.chunks(per_batch) {
        let batch = chunk
            .iter()
            .map(|(region_id, index)| EntryToWrite {
                region_id: *region_id,
                data: synthetic_entry(*index, entry_size),
            })
            .collect();
        let appended = share
            .store
            .append(batch)
            .await
            .map_err(|e| (chunk[0].0, e))?;
        out.extend(appended.into_iter().map(|a| (a.region_id, a.entry_id)));
    }
    Ok(out)
}
