//! `Metasrv::flush_wal`: records replay checkpoints for a table's regions, as a datanode does after flushing them
//! (`walctl wal flush`).
//!
//! A Kafka region's checkpoint is its `__topic_region/{topic}/{region_id}` key (only forward, see
//! [`CheckpointStore::record_flushed`]); a raft-engine region's is kept in its datanode's engine directory, whose
//! flushed entries are deleted with it ([`RaftEngineLogStore::flush`](crate::datanode::log_store::RaftEngineLogStore::flush)).
//! The default entry id is the region's [`LogStore::last_entry_id`]: everything written so far. An entry id above
//! it is refused naming the region, since the region's next entries would then look flushed.

use serde::Serialize;

use super::Metasrv;
use super::table_wal::{RegionWal, WalStores, select_regions};
use crate::datanode::checkpoint::CheckpointStore;
use crate::datanode::log_store::{EntryId, LogStore, RegionId};
use crate::ddl::TableName;
use crate::error::{Result, WalFlushBeyondEndSnafu};

/// The command's name in errors.
const OPERATION: &str = "wal flush";

/// One region's checkpoint before and after a flush.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RegionFlush {
    /// The region's number in its table.
    pub region_number: u32,
    /// The region.
    pub region_id: RegionId,
    /// Its WAL: `topic 'T'` or `raft-engine 'DIR'`.
    pub wal: String,
    /// The flushed entry id before (0 when none).
    pub old_checkpoint: EntryId,
    /// The flushed entry id stored afterwards: the one asked for, or a higher one already stored.
    pub checkpoint: EntryId,
}

impl Metasrv {
    /// Records the checkpoint of table `name`'s region numbered `region_number` (every region with a WAL when
    /// `None`) at `entry_id`, by default each region's last entry id. Errors name the table, the region and its
    /// WAL; regions before the failing one keep their new checkpoints (each is a correct checkpoint on its own).
    pub async fn flush_wal(
        &self,
        name: &TableName,
        region_number: Option<u32>,
        entry_id: Option<EntryId>,
    ) -> Result<Vec<RegionFlush>> {
        let (table, regions) = self.table_wal(OPERATION, name).await?;
        let regions = select_regions(OPERATION, &table.table, regions, region_number)?;
        let checkpoints = CheckpointStore::new(self.kv.clone());
        let mut stores = WalStores::default();
        let mut out = Vec::with_capacity(regions.len());
        for region in regions {
            let region_id = region.placement.region_id;
            let fail =
                |e| self.wal_region_error(OPERATION, &table.table, region_id, &region.wal, e);
            let (old_checkpoint, checkpoint) = match &region.wal {
                RegionWal::Kafka { topic } => {
                    let store = self
                        .kafka_store(&mut stores, OPERATION, topic)
                        .await
                        .map_err(fail)?;
                    let old = checkpoints
                        .get(topic, region_id)
                        .await
                        .map_err(fail)?
                        .and_then(|v| v.flushed_entry_id())
                        .unwrap_or(0);
                    let end = store.last_entry_id(region_id).await.map_err(fail)?;
                    let target = entry_id.unwrap_or(end);
                    if target > end {
                        return Err(fail(
                            WalFlushBeyondEndSnafu {
                                region_id,
                                wal: self.describe_wal(&region.wal),
                                entry_id: target,
                                end,
                            }
                            .build(),
                        ));
                    }
                    let stored = checkpoints
                        .record_flushed(topic, region_id, target)
                        .await
                        .map_err(fail)?;
                    (old, stored)
                }
                RegionWal::RaftEngine { datanode_id } => {
                    let store = self
                        .raft_engine_store(&mut stores, *datanode_id)
                        .await
                        .map_err(fail)?;
                    let old = store.flushed_entry_id(region_id).await.map_err(fail)?;
                    let target = match entry_id {
                        Some(id) => id,
                        None => store.last_entry_id(region_id).await.map_err(fail)?,
                    };
                    let stored = store.flush(region_id, target).await.map_err(fail)?;
                    (old, stored)
                }
                RegionWal::Noop => continue,
            };
            out.push(RegionFlush {
                region_number: region.placement.region_number,
                region_id,
                wal: self.describe_wal(&region.wal),
                old_checkpoint,
                checkpoint,
            });
        }
        Ok(out)
    }
}
