//! Replay of the regions of a datanode that share one Kafka topic: the topic is read **once**, from the lowest
//! replay checkpoint among them, and its records are routed by key (region id), instead of once per region. The
//! cost of opening R regions on a topic grows with the topic's bytes, not with R × bytes.
//!
//! A region replays the entries after its replay checkpoint: the higher of its flushed entry id
//! (`__topic_region/{topic}/{region_id}`, see [`crate::datanode::checkpoint`]) and the topic's pruned entry id
//! (`__topic_name/kafka/{topic}`); a region with neither replays the whole topic still held.

use std::collections::BTreeMap;

use crate::datanode::checkpoint::CheckpointStore;
use crate::datanode::log_store::kafka::{KafkaLogStore, PartitionLog, ReadCounts};
use crate::datanode::log_store::{Entry, EntryId, RegionId};
use crate::error::Result;
use crate::kv::KvBackendRef;
use crate::wal::kafka::topic_key::{TopicNameValue, topic_name_key};

/// What one region replayed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionReplay {
    /// The region.
    pub region_id: RegionId,
    /// Its replay checkpoint: entries above it were replayed.
    pub checkpoint: EntryId,
    /// The entries replayed, in order.
    pub entries: Vec<Entry>,
    /// How many.
    pub entries_replayed: u64,
    /// Their bytes.
    pub bytes_replayed: u64,
}

/// What replaying one topic's regions did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicReplay {
    /// The topic.
    pub topic: String,
    /// The topic's pruned entry id when the replay started.
    pub pruned_entry_id: EntryId,
    /// Per region asked for.
    pub regions: BTreeMap<RegionId, RegionReplay>,
    /// What the one read pass cost (fetches, records and bytes of every region on the topic).
    pub read: ReadCounts,
}

/// Replays `regions` (all on the topic of `store`) in one pass over the topic, each from its replay checkpoint
/// read from `kv`. Fails as a whole when the kv store or the topic fails (nothing replayed can be trusted then),
/// or when the topic no longer holds entries a region needs.
pub async fn replay_topic<P: PartitionLog>(
    store: &KafkaLogStore<P>,
    kv: &KvBackendRef,
    regions: &[RegionId],
) -> Result<TopicReplay> {
    let topic = store.topic().to_string();
    let pruned_entry_id = match kv.get(&topic_name_key(&topic)).await? {
        Some(found) => TopicNameValue::decode(&found.key, &found.value)?.pruned_entry_id,
        None => 0,
    };
    let stored = CheckpointStore::new(kv.clone()).regions(&topic).await?;
    let checkpoints: BTreeMap<RegionId, EntryId> = regions
        .iter()
        .map(|region_id| {
            let flushed = stored
                .get(region_id)
                .and_then(|v| v.flushed_entry_id())
                .unwrap_or(0);
            (*region_id, flushed.max(pruned_entry_id))
        })
        .collect();
    let from = checkpoints
        .iter()
        .map(|(region_id, checkpoint)| (*region_id, checkpoint.saturating_add(1)))
        .collect();
    let (mut entries, read) = store.read_regions_counted(&from).await?;
    let regions = checkpoints
        .into_iter()
        .map(|(region_id, checkpoint)| {
            let entries = entries.remove(&region_id).unwrap_or_default();
            let bytes_replayed = entries.iter().map(|e| e.data.len() as u64).sum();
            let replay = RegionReplay {
                region_id,
                checkpoint,
                entries_replayed: entries.len() as u64,
                bytes_replayed,
                entries,
            };
            (region_id, replay)
        })
        .collect();
    Ok(TopicReplay {
        topic,
        pruned_entry_id,
        regions,
        read,
    })
}
