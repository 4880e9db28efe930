//! Replay of the regions of a datanode that share one Kafka topic: the topic is read **once**, from the lowest
//! replay checkpoint among them, and its records are routed by key (region id), instead of once per region. The
//! cost of opening R regions on a topic grows with the topic's bytes, not with R × bytes.
//!
//! A region replays the entries after its replay checkpoint: the higher of its flushed entry id
//! (`__topic_region/{topic}/{region_id}`, see [`crate::checkpoint`]) and the topic's pruned entry id
//! (`__topic_name/kafka/{topic}`); a region with neither replays the whole topic still held.

use std::collections::BTreeMap;

use crate::checkpoint::CheckpointStore;
use crate::log_store::kafka::{KafkaLogStore, PartitionLog, ReadCounts};
use crate::log_store::record::{entry_id_of_offset, offset_of_entry_id};
use crate::log_store::{Entry, EntryId, RegionId};
use remote_wal::key::topic_name::{TopicNameValue, topic_name_key};
use remote_wal::kv::KvBackendRef;
use remote_wal::wal::error::Result;
use remote_wal::wal::error::{LogCheckpointAboveEndSnafu, LogEntriesPrunedSnafu};

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
#[derive(Debug)]
pub struct TopicReplay {
    /// The topic.
    pub topic: String,
    /// The topic's pruned entry id when the replay started.
    pub pruned_entry_id: EntryId,
    /// Per region replayed.
    pub regions: BTreeMap<RegionId, RegionReplay>,
    /// Per region that cannot be replayed because the topic no longer holds entries it needs (deleted by
    /// retention or by hand, or the topic recreated), or whose checkpoint lies above the topic's end (the topic
    /// recreated or truncated): the error names the topic, the region and both entry ids.
    /// The topic's other regions are replayed all the same.
    pub errors: BTreeMap<RegionId, remote_wal::wal::Error>,
    /// What the one read pass cost (fetches, records and bytes of every region on the topic).
    pub read: ReadCounts,
}

/// Replays `regions` (all on the topic of `store`) in one pass over the topic, each from its replay checkpoint
/// read from `kv`. Fails as a whole when the kv store or the topic fails (nothing replayed can be trusted then);
/// a region whose entries the topic no longer holds is reported in [`TopicReplay::errors`], the others replayed.
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
    // A region whose next entry lies below what the topic still holds lost entries: it gets its own error, the
    // others are read.
    let end = store.partition().high_watermark().await?;
    let earliest = store.partition().low_watermark().await?;
    let mut errors = BTreeMap::new();
    let mut from = BTreeMap::new();
    for (region_id, checkpoint) in &checkpoints {
        let next = checkpoint.saturating_add(1);
        let offset = offset_of_entry_id(next);
        if offset > end {
            // The topic ends below entries the region's checkpoint says were written: it was recreated or
            // truncated. Replaying nothing would pass for an empty WAL.
            let error = LogCheckpointAboveEndSnafu {
                topic: topic.clone(),
                region_id: *region_id,
                checkpoint: *checkpoint,
                end: u64::try_from(end).unwrap_or(0),
            }
            .build();
            errors.insert(*region_id, error);
        } else if offset < earliest && offset < end {
            let error = LogEntriesPrunedSnafu {
                topic: topic.clone(),
                region_id: *region_id,
                from: next,
                earliest: entry_id_of_offset(earliest),
            }
            .build();
            errors.insert(*region_id, error);
        } else {
            from.insert(*region_id, next);
        }
    }
    let (mut entries, read) = store.read_regions_counted(&from).await?;
    let checkpoints: BTreeMap<RegionId, EntryId> = checkpoints
        .into_iter()
        .filter(|(region_id, _)| from.contains_key(region_id))
        .collect();
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
        errors,
        read,
    })
}

/// What replaying one region of a datanode's open requests gave.
#[derive(Debug)]
pub struct RegionReplayOutcome {
    /// The region.
    pub region_id: RegionId,
    /// Entries replayed (0 on error).
    pub entries_replayed: u64,
    /// Their bytes (0 on error).
    pub bytes_replayed: u64,
    /// Why the region's WAL could not be replayed; the other regions' replays are not affected.
    pub error: Option<remote_wal::wal::Error>,
}

impl RegionReplayOutcome {
    fn replayed(region_id: RegionId, entries: &[Entry]) -> Self {
        RegionReplayOutcome {
            region_id,
            entries_replayed: entries.len() as u64,
            bytes_replayed: entries.iter().map(|e| e.data.len() as u64).sum(),
            error: None,
        }
    }

    fn failed(region_id: RegionId, error: remote_wal::wal::Error) -> Self {
        RegionReplayOutcome {
            region_id,
            entries_replayed: 0,
            bytes_replayed: 0,
            error: Some(error),
        }
    }
}

/// Replays the WAL of every region in `requests` (a datanode's open requests), by each region's recorded WAL
/// options: the regions sharing a Kafka topic in one pass over it ([`replay_topic`], through brokers of `kafka`),
/// the raft-engine regions from the datanode's engine directory `raft_engine_dir` (all their entries: raft-engine
/// regions have no checkpoint key yet; a directory that does not exist holds none and is not created), noop regions
/// with nothing. Returns one outcome per request, in request
/// order; an error (a topic deleted, brokers unreachable, an engine directory that cannot be opened) is reported
/// for the regions it concerns only.
pub async fn replay_open_requests(
    requests: &[remote_wal::datanode::RegionOpenRequest],
    kv: &KvBackendRef,
    kafka: Option<&remote_wal::wal::KafkaConfig>,
    raft_engine_dir: &std::path::Path,
) -> Vec<RegionReplayOutcome> {
    use crate::log_store::kafka::{RsKafkaPartition, call_bound, connect_client};
    use crate::log_store::{KafkaLogStoreConfig, LogStore, RaftEngineLogStore};
    use remote_wal::wal::{WAL_OPTIONS_KEY, WalOptions};

    let mut by_topic: BTreeMap<String, Vec<RegionId>> = BTreeMap::new();
    let mut raft_engine: Vec<RegionId> = Vec::new();
    let mut outcomes: BTreeMap<RegionId, RegionReplayOutcome> = BTreeMap::new();
    for request in requests {
        let options = match request.options.get(WAL_OPTIONS_KEY) {
            Some(encoded) => WalOptions::decode(encoded),
            None => Ok(WalOptions::RaftEngine),
        };
        match options {
            Ok(WalOptions::Kafka(k)) => {
                by_topic.entry(k.topic).or_default().push(request.region_id)
            }
            Ok(WalOptions::RaftEngine) => raft_engine.push(request.region_id),
            Ok(WalOptions::Noop) => {
                outcomes.insert(
                    request.region_id,
                    RegionReplayOutcome::replayed(request.region_id, &[]),
                );
            }
            Err(e) => {
                outcomes.insert(
                    request.region_id,
                    RegionReplayOutcome::failed(request.region_id, e),
                );
            }
        }
    }

    if !raft_engine.is_empty() {
        let from = raft_engine.iter().map(|r| (*r, 1)).collect();
        let read = if !raft_engine_dir.exists() {
            // Nothing was ever written on this datanode: nothing to replay, and nothing to create.
            Ok(BTreeMap::new())
        } else {
            match RaftEngineLogStore::open(raft_engine_dir).await {
                Ok(store) => store.read_regions(&from).await,
                Err(e) => Err(e),
            }
        };
        match read {
            Ok(entries) => {
                for region_id in &raft_engine {
                    let list = entries.get(region_id).map(Vec::as_slice).unwrap_or(&[]);
                    outcomes.insert(*region_id, RegionReplayOutcome::replayed(*region_id, list));
                }
            }
            Err(e) => {
                let text = e.to_string();
                for region_id in &raft_engine {
                    let error = remote_wal::wal::error::RegionReplaySnafu {
                        region_id: *region_id,
                        reason: text.clone(),
                    }
                    .build();
                    outcomes.insert(*region_id, RegionReplayOutcome::failed(*region_id, error));
                }
            }
        }
    }

    if !by_topic.is_empty() {
        let client = match kafka {
            // The look-back over one produce request needs the writers' request size.
            Some(config) => match KafkaLogStoreConfig::for_kafka(config) {
                Ok(sizes) => connect_client(config)
                    .await
                    .map(|client| (client, call_bound(config), sizes))
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            },
            None => {
                Err("the metasrv is not configured for Kafka, so no broker is known".to_string())
            }
        };
        for (topic, regions) in by_topic {
            let result = match &client {
                Ok((client, bound, sizes)) => {
                    match RsKafkaPartition::new(client, &topic, *bound).await {
                        Ok(partition) => {
                            let store = KafkaLogStore::new(partition, *sizes);
                            replay_topic(&store, kv, &regions)
                                .await
                                .map_err(|e| e.to_string())
                        }
                        Err(e) => Err(e.to_string()),
                    }
                }
                Err(e) => Err(e.clone()),
            };
            match result {
                Ok(replay) => {
                    for (region_id, error) in replay.errors {
                        outcomes.insert(region_id, RegionReplayOutcome::failed(region_id, error));
                    }
                    for (region_id, region) in replay.regions {
                        outcomes.insert(
                            region_id,
                            RegionReplayOutcome::replayed(region_id, &region.entries),
                        );
                    }
                }
                Err(reason) => {
                    for region_id in regions {
                        let error = remote_wal::wal::error::RegionReplaySnafu {
                            region_id,
                            reason: reason.clone(),
                        }
                        .build();
                        outcomes.insert(region_id, RegionReplayOutcome::failed(region_id, error));
                    }
                }
            }
        }
    }

    requests
        .iter()
        .filter_map(|r| outcomes.remove(&r.region_id))
        .collect()
}
