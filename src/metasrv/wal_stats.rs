//! `Metasrv::wal_stats`: per topic of the Kafka pool, its low and high watermarks, its pruned entry id, the regions
//! writing to it, what a replay of those regions would read, and the region that pins the watermark with how far
//! behind the topic's end it is (`walctl wal stats`): a stale region pins its topic until it flushes or moves.
//!
//! A replay of a topic's regions reads the topic once, from the lowest replay checkpoint among them (each region's
//! the higher of its flushed entry id and the topic's pruned entry id) to the high watermark (the datanode
//! package's replay). The metasrv reads offsets and watermarks only, never a record: the records counted are the
//! offsets in that range; the replay's look-back of one produce request before the checkpoint is not included.

use serde::Serialize;

use super::Metasrv;
use crate::error::{NoKafkaPoolSnafu, Result};
use crate::key::topic_name::{get_topic_value, list_persisted_topics};
use crate::key::topic_region::{EntryId, RegionId, read_topic_regions};
use crate::wal::WalConfig;
use crate::wal::assigned::region_ids_per_topic;
use crate::wal::kafka::partition::{KafkaPartition, call_bound, connect_client};

/// The command's name in errors.
const OPERATION: &str = "wal stats";

/// One topic's WAL figures.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TopicWalStats {
    /// The topic.
    pub topic: String,
    /// The earliest Kafka offset the topic still holds.
    pub low_watermark: i64,
    /// The next Kafka offset to be written.
    pub high_watermark: i64,
    /// The topic's pruned entry id (`__topic_name/kafka/{topic}`).
    pub pruned_entry_id: EntryId,
    /// Regions whose recorded WAL options name the topic.
    pub regions: usize,
    /// The entry id a replay of them starts after (the lowest replay checkpoint), when there is a region.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay_from: Option<EntryId>,
    /// Records a replay of them would read (from the offsets alone: no record is read).
    pub replay_records: u64,
    /// The region that holds the topic's watermark back: the one with the lowest checkpoint among the topic's
    /// `__topic_region` keys (a region without a checkpoint first), when the topic has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinned_by: Option<WatermarkPin>,
}

/// The region a prune cannot pass on a topic, and how far behind the topic's end it is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WatermarkPin {
    /// The region.
    pub region_id: RegionId,
    /// Its flushed entry id; `None` when it has no checkpoint yet (nothing can be pruned).
    pub flushed_entry_id: Option<EntryId>,
    /// Entries on the topic after its checkpoint (the topic's last entry id minus the flushed one; every entry
    /// above the topic's pruned entry id when it has no checkpoint): what the prune must keep for it.
    pub behind: u64,
}

impl Metasrv {
    /// The figures of every persisted topic of the pool, by pool index. An error for a raft-engine metasrv; a
    /// topic that cannot be read is an error naming it.
    pub async fn wal_stats(&self) -> Result<Vec<TopicWalStats>> {
        let WalConfig::Kafka(kafka) = &self.config.wal else {
            return NoKafkaPoolSnafu {
                operation: OPERATION,
            }
            .fail();
        };
        let mut topics =
            list_persisted_topics(self.kv.as_ref(), &format!("{}_", kafka.topic_name_prefix))
                .await?;
        let index = |t: &str| {
            t.rsplit('_')
                .next()
                .and_then(|i| i.parse::<u64>().ok())
                .unwrap_or(u64::MAX)
        };
        topics.sort_by(|a, b| (index(a), a).cmp(&(index(b), b)));
        let regions = region_ids_per_topic(self.kv.as_ref()).await?;
        let mut client = None;
        let bound = call_bound(kafka);
        let mut out = Vec::with_capacity(topics.len());
        for topic in topics {
            let client = match &client {
                Some(client) => client,
                None => client.insert(connect_client(kafka).await?),
            };
            let partition = KafkaPartition::new(client, &topic, bound).await?;
            let low_watermark = partition.low_watermark().await?;
            let high_watermark = partition.high_watermark().await?;
            let pruned_entry_id = get_topic_value(self.kv.as_ref(), &topic)
                .await?
                .map_or(0, |v| v.pruned_entry_id);
            let on_topic = regions.get(&topic).cloned().unwrap_or_default();
            let stored = read_topic_regions(self.kv.as_ref(), &topic).await?;
            let replay_from = on_topic
                .iter()
                .map(|region| {
                    stored
                        .get(region)
                        .and_then(|v| v.flushed_entry_id())
                        .unwrap_or(0)
                        .max(pruned_entry_id)
                })
                .min();
            // Offsets of a pool topic are contiguous (no compaction, no transactions): the records a replay reads
            // are the offsets from its start to the high watermark.
            let replay_records = match replay_from {
                Some(from) => {
                    let start = i64::try_from(from).unwrap_or(i64::MAX).max(low_watermark);
                    u64::try_from(high_watermark.saturating_sub(start)).unwrap_or(0)
                }
                None => 0,
            };
            // Entry id e is offset e - 1: the topic's last entry id is its high watermark.
            let last_entry_id = u64::try_from(high_watermark).unwrap_or(0);
            let pinned_by = stored
                .iter()
                .map(|(region, value)| (*region, value.flushed_entry_id()))
                .min_by_key(|(region, flushed)| (flushed.is_some(), *flushed, *region))
                .map(|(region_id, flushed_entry_id)| WatermarkPin {
                    region_id,
                    flushed_entry_id,
                    behind: last_entry_id
                        .saturating_sub(flushed_entry_id.unwrap_or(0).max(pruned_entry_id)),
                });
            out.push(TopicWalStats {
                topic,
                low_watermark,
                high_watermark,
                pruned_entry_id,
                regions: on_topic.len(),
                replay_from,
                replay_records,
                pinned_by,
            });
        }
        Ok(out)
    }
}
