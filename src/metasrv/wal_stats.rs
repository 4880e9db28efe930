//! `Metasrv::wal_stats`: per topic of the Kafka pool, its low and high watermarks, its pruned entry id, the regions
//! writing to it, and what a replay of those regions would read (`walctl wal stats`).
//!
//! A replay of a topic's regions reads the topic once, from the lowest replay checkpoint among them (each region's
//! the higher of its flushed entry id and the topic's pruned entry id) to the high watermark
//! ([`crate::datanode::replay`]). The bytes reported are the key and value bytes of the records in that range,
//! counted by reading it; the replay's look-back of one produce request before the checkpoint is not included.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::table_wal::WalStores;
use super::{Metasrv, SCAN_PAGE};
use crate::datanode::checkpoint::CheckpointStore;
use crate::datanode::log_store::kafka::PartitionLog;
use crate::datanode::log_store::record::offset_of_entry_id;
use crate::datanode::log_store::{EntryId, RegionId};
use crate::ddl::DatanodeTableValue;
use crate::ddl::datanode_table::parse_datanode_table_key;
use crate::error::{LogFetchStalledSnafu, NoKafkaPoolSnafu, Result};
use crate::kv::RangeRequest;
use crate::wal::kafka::topic_key::{get_topic_value, list_persisted_topics};
use crate::wal::{WalConfig, WalOptions};

/// The command's name in errors.
const OPERATION: &str = "wal stats";

/// Bytes asked for per fetch while counting.
const FETCH_BYTES: i32 = 4 * 1024 * 1024;

/// Consecutive empty fetches below the high watermark tolerated while counting.
const MAX_EMPTY_FETCHES: u32 = 3;

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
    /// Records a replay of them would read.
    pub replay_records: u64,
    /// Key and value bytes of those records.
    pub replay_bytes: u64,
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
        let regions = self.region_ids_per_topic().await?;
        let checkpoints = CheckpointStore::new(self.kv.clone());
        let mut stores = WalStores::default();
        let mut out = Vec::with_capacity(topics.len());
        for topic in topics {
            let store = self.kafka_store(&mut stores, OPERATION, &topic).await?;
            let partition = store.partition();
            let low_watermark = partition.low_watermark().await?;
            let high_watermark = partition.high_watermark().await?;
            let pruned_entry_id = get_topic_value(self.kv.as_ref(), &topic)
                .await?
                .map_or(0, |v| v.pruned_entry_id);
            let on_topic = regions.get(&topic).cloned().unwrap_or_default();
            let stored = checkpoints.regions(&topic).await?;
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
            let (replay_records, replay_bytes) = match replay_from {
                Some(from) => {
                    let start = offset_of_entry_id(from.saturating_add(1)).max(low_watermark);
                    count_records(partition, start, high_watermark).await?
                }
                None => (0, 0),
            };
            out.push(TopicWalStats {
                topic,
                low_watermark,
                high_watermark,
                pruned_entry_id,
                regions: on_topic.len(),
                replay_from,
                replay_records,
                replay_bytes,
            });
        }
        Ok(out)
    }

    /// The region ids whose recorded WAL options name each Kafka topic, over every datanode table value (values
    /// that do not decode are skipped: `open-regions` reports them).
    async fn region_ids_per_topic(&self) -> Result<BTreeMap<String, BTreeSet<RegionId>>> {
        let prefix = format!("{}/", crate::ddl::datanode_table::DATANODE_TABLE_KEY_PREFIX);
        let kvs =
            crate::kv::range_all(self.kv.as_ref(), RangeRequest::prefix(prefix), SCAN_PAGE).await?;
        let mut out: BTreeMap<String, BTreeSet<RegionId>> = BTreeMap::new();
        for kv in kvs {
            let (Ok((_, table_id)), Ok(value)) = (
                parse_datanode_table_key(&kv.key),
                serde_json::from_slice::<DatanodeTableValue>(&kv.value),
            ) else {
                continue;
            };
            for (number, encoded) in &value.region_wal_options {
                if let Ok(WalOptions::Kafka(k)) = WalOptions::decode(encoded) {
                    out.entry(k.topic)
                        .or_default()
                        .insert(crate::ddl::region::region_id(table_id, *number));
                }
            }
        }
        Ok(out)
    }
}

/// The records and their key and value bytes from offset `start` up to `end`.
async fn count_records<P: PartitionLog>(partition: &P, start: i64, end: i64) -> Result<(u64, u64)> {
    let (mut records, mut bytes) = (0u64, 0u64);
    let mut offset = start;
    let mut empty = 0;
    while offset < end {
        let (fetched, _) = partition.fetch(offset, FETCH_BYTES).await?;
        let mut advanced = false;
        for record in fetched {
            if record.offset >= end {
                return Ok((records, bytes));
            }
            if record.offset < offset {
                continue;
            }
            records += 1;
            bytes += (record.key.as_ref().map_or(0, Vec::len)
                + record.value.as_ref().map_or(0, Vec::len)) as u64;
            offset = record.offset + 1;
            advanced = true;
        }
        if advanced {
            empty = 0;
        } else {
            empty += 1;
            if empty >= MAX_EMPTY_FETCHES {
                return LogFetchStalledSnafu {
                    topic: partition.topic(),
                    offset,
                    end,
                    attempts: empty,
                }
                .fail();
            }
        }
    }
    Ok((records, bytes))
}
