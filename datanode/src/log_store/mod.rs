//! A region's write-ahead log on the datanode side: the [`LogStore`] trait and its two implementations,
//! [`KafkaLogStore`] (one Kafka topic, shared by the regions whose WAL options name it) and [`RaftEngineLogStore`]
//! (one raft-engine directory per datanode).
//!
//! **Entry ids.** Every entry gets a `u64` entry id when it is appended; a region's entry ids increase in the order
//! its entries were appended. **Entry id 0 means "nothing written"** and is never given to an entry, so a
//! checkpoint of 0 (nothing flushed) replays everything. On Kafka the entry id is `1 + the offset of the entry's
//! first record`, so the record at Kafka offset 0 is entry id 1 ([`record`] has the format); on raft-engine it is
//! the region's own index, from 1.
//!
//! **Reads** return a region's entries with an entry id at or above the one asked for, up to the end of the log
//! at the time of the call (entries appended while the read runs may or may not be included).

pub mod kafka;
#[cfg(any(test, feature = "testing"))]
pub mod memory_partition;
pub mod raft_engine;
pub mod record;

use std::collections::BTreeMap;

use async_trait::async_trait;

use remote_wal::wal::error::Result;

pub use kafka::{KafkaLogStore, KafkaLogStoreConfig, PartitionLog, RsKafkaPartition};
pub use raft_engine::RaftEngineLogStore;

/// A region id: `(table_id << 32) | region_number`.
pub type RegionId = u64;

/// An entry id: 0 = nothing written; a region's entries have increasing ids from 1 on.
pub type EntryId = u64;

/// One entry to append: a region and its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryToWrite {
    /// The region writing.
    pub region_id: RegionId,
    /// The entry's bytes (any size: the store splits what its log cannot take in one record).
    pub data: Vec<u8>,
}

/// An entry read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The region that wrote it.
    pub region_id: RegionId,
    /// Its entry id (never 0).
    pub entry_id: EntryId,
    /// Its bytes, exactly as appended.
    pub data: Vec<u8>,
}

/// Where an appended entry landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendedEntry {
    /// The region that wrote it.
    pub region_id: RegionId,
    /// Its entry id.
    pub entry_id: EntryId,
}

/// A region's write-ahead log.
#[async_trait]
pub trait LogStore: Send + Sync + std::fmt::Debug {
    /// Appends `entries` (of one or more regions, in this order per region) durably, and returns each entry's
    /// id in the same order as `entries`.
    async fn append(&self, entries: Vec<EntryToWrite>) -> Result<Vec<AppendedEntry>>;

    /// The entries of `region_id` whose entry id is at least `from`, in entry-id order, up to the end of the log
    /// at the time of the call.
    async fn read(&self, region_id: RegionId, from: EntryId) -> Result<Vec<Entry>> {
        let mut out = self
            .read_regions(&BTreeMap::from([(region_id, from)]))
            .await?;
        Ok(out.remove(&region_id).unwrap_or_default())
    }

    /// [`LogStore::read`] for several regions at once (region → first entry id wanted); every region asked for
    /// is in the answer. A store whose regions share one log (Kafka) reads it once for all of them.
    async fn read_regions(
        &self,
        from: &BTreeMap<RegionId, EntryId>,
    ) -> Result<BTreeMap<RegionId, Vec<Entry>>>;

    /// An entry id at or above the id of every entry of `region_id` appended so far, and below the id of any
    /// entry appended later: what a flush of everything written so far records as the region's checkpoint. On
    /// raft-engine it is the region's last entry id (0 when it has none); on Kafka the topic's end (entry ids
    /// are offsets there, shared by the topic's regions, so the last id the topic gave out bounds the region's).
    async fn last_entry_id(&self, region_id: RegionId) -> Result<EntryId>;
}
