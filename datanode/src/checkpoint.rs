//! Replay checkpoints: where a datanode records a region's flushed entry id so the metasrv (and the datanode's
//! next replay) can read it, in the region's `__topic_region/{topic}/{region_id}` key (its codec is the library's
//! `remote_wal::key::topic_region`; create table writes the key, empty, with the table's metadata).
//!
//! A checkpoint only moves forward: [`CheckpointStore::record_flushed`] is a compare-and-put loop that leaves a
//! higher stored checkpoint alone. A new region on a Kafka topic starts at the topic's current end
//! ([`start_kafka_region`]), so the entries other regions wrote before it are never its to replay, and pruning
//! below that end is safe for it.

use std::collections::BTreeMap;

pub use remote_wal::key::topic_region::{
    ReplayCheckpoint, TOPIC_REGION_PREFIX, TopicRegionValue, topic_region_key, topic_region_prefix,
};
use remote_wal::kv::{CompareAndPutRequest, KvBackendRef};
use remote_wal::wal::error::CheckpointContentionSnafu;
use remote_wal::wal::error::Result;

use crate::log_store::kafka::{KafkaLogStore, PartitionLog};
use crate::log_store::{EntryId, RegionId};

/// Compare-and-put attempts before a checkpoint write gives up (another writer kept changing the key).
const MAX_CAS_ATTEMPTS: usize = 16;

/// Reads and writes replay checkpoints in the kv backend.
#[derive(Clone, Debug)]
pub struct CheckpointStore {
    kv: KvBackendRef,
}

impl CheckpointStore {
    /// Checkpoints in `kv`.
    pub fn new(kv: KvBackendRef) -> Self {
        CheckpointStore { kv }
    }

    /// The region's value; `None` when the key is absent.
    pub async fn get(&self, topic: &str, region_id: RegionId) -> Result<Option<TopicRegionValue>> {
        let key = topic_region_key(topic, region_id);
        match self.kv.get(&key).await? {
            Some(kv) => Ok(Some(TopicRegionValue::decode(&kv.key, &kv.value)?)),
            None => Ok(None),
        }
    }

    /// Every region recorded on `topic`, with its value (an error names a key that does not decode).
    pub async fn regions(&self, topic: &str) -> Result<BTreeMap<RegionId, TopicRegionValue>> {
        remote_wal::key::topic_region::read_topic_regions(self.kv.as_ref(), topic).await
    }

    /// Records that the region's entries up to `entry_id` are flushed. The checkpoint only moves forward: a
    /// stored checkpoint at or above `entry_id` is kept. Returns the checkpoint stored afterwards.
    pub async fn record_flushed(
        &self,
        topic: &str,
        region_id: RegionId,
        entry_id: EntryId,
    ) -> Result<EntryId> {
        self.update(topic, region_id, |current| match current.checkpoint {
            Some(c) if c.entry_id >= entry_id => None,
            Some(c) => Some(TopicRegionValue {
                checkpoint: Some(ReplayCheckpoint { entry_id, ..c }),
                ..*current
            }),
            None => Some(TopicRegionValue::at(entry_id)),
        })
        .await
    }

    /// Gives a region that has no checkpoint yet the checkpoint `entry_id` (where a new region starts); a
    /// region that has one keeps it, so a retried creation never skips entries the region wrote meanwhile.
    /// Returns the checkpoint stored afterwards.
    pub async fn start_region(
        &self,
        topic: &str,
        region_id: RegionId,
        entry_id: EntryId,
    ) -> Result<EntryId> {
        self.update(topic, region_id, |current| match current.checkpoint {
            Some(_) => None,
            None => Some(TopicRegionValue::at(entry_id)),
        })
        .await
    }

    /// A compare-and-put loop: `change` gives the new value from the current one, or `None` to keep it.
    async fn update(
        &self,
        topic: &str,
        region_id: RegionId,
        change: impl Fn(&TopicRegionValue) -> Option<TopicRegionValue>,
    ) -> Result<EntryId> {
        let key = topic_region_key(topic, region_id);
        for _ in 0..MAX_CAS_ATTEMPTS {
            let stored = self.kv.get(&key).await?;
            let current = match &stored {
                Some(kv) => TopicRegionValue::decode(&kv.key, &kv.value)?,
                None => TopicRegionValue::default(),
            };
            let Some(next) = change(&current) else {
                return Ok(current.checkpoint.map_or(0, |c| c.entry_id));
            };
            let response = self
                .kv
                .compare_and_put(CompareAndPutRequest {
                    key: key.clone(),
                    expect: stored.map(|kv| kv.value),
                    value: next.encode(),
                })
                .await?;
            if response.success {
                return Ok(next.checkpoint.map_or(0, |c| c.entry_id));
            }
        }
        CheckpointContentionSnafu {
            key: String::from_utf8_lossy(&key).into_owned(),
            attempts: MAX_CAS_ATTEMPTS,
        }
        .fail()
    }
}

/// Starts a new region on the Kafka topic of `store`: its checkpoint becomes the topic's current end, so the
/// entries written before it (by other regions) are never replayed for it. Call it when the region is created,
/// before its first append; a region that already has a checkpoint keeps it. Returns the region's checkpoint.
pub async fn start_kafka_region<P: PartitionLog>(
    store: &KafkaLogStore<P>,
    checkpoints: &CheckpointStore,
    region_id: RegionId,
) -> Result<EntryId> {
    let end = store.end_entry_id().await?;
    checkpoints
        .start_region(store.topic(), region_id, end)
        .await
}
