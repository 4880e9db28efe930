//! Replay checkpoints: where a datanode records a region's flushed entry id so the metasrv (and the datanode's
//! next replay) can read it.
//!
//! Layout, as GreptimeDB's `common-meta` crate writes it (`key/topic_region.rs`, the version with
//! `ReplayCheckpoint { entry_id, metadata_entry_id }`): one key per region on a Kafka topic,
//! `__topic_region/{topic}/{region_id}`. Its value is empty when the region has no checkpoint yet, else
//! `{"checkpoint":{"entry_id":N}}` (with `"metadata_entry_id":M` when GreptimeDB's metric engine set one; kept as
//! read, and the lower of the two is where replay starts). Unknown fields are ignored.
//!
//! A checkpoint only moves forward: [`CheckpointStore::record_flushed`] is a compare-and-put loop that leaves a
//! higher stored checkpoint alone. A new region on a Kafka topic starts at the topic's current end
//! ([`start_kafka_region`]), so the entries other regions wrote before it are never its to replay, and pruning
//! below that end is safe for it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::datanode::log_store::kafka::{KafkaLogStore, PartitionLog};
use crate::datanode::log_store::{EntryId, RegionId};
use crate::error::{CheckpointContentionSnafu, InvalidTopicRegionKeySnafu, Result};
use crate::kv::{CompareAndPutRequest, KvBackendRef, RangeRequest, range_all};

/// The prefix of every topic-region key.
pub const TOPIC_REGION_PREFIX: &str = "__topic_region/";

/// Compare-and-put attempts before a checkpoint write gives up (another writer kept changing the key).
const MAX_CAS_ATTEMPTS: usize = 16;

/// `__topic_region/{topic}/{region_id}`.
pub fn topic_region_key(topic: &str, region_id: RegionId) -> Vec<u8> {
    format!("{TOPIC_REGION_PREFIX}{topic}/{region_id}").into_bytes()
}

/// `__topic_region/{topic}/`: the prefix of a topic's regions.
pub fn topic_region_prefix(topic: &str) -> Vec<u8> {
    format!("{TOPIC_REGION_PREFIX}{topic}/").into_bytes()
}

/// A region's replay checkpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ReplayCheckpoint {
    /// Entries up to this id are flushed: replay starts after it.
    #[serde(default)]
    pub entry_id: u64,
    /// GreptimeDB's metric engine's metadata region checkpoint; kept as read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_entry_id: Option<u64>,
}

/// The value of a topic-region key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicRegionValue {
    /// The checkpoint, once the region has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<ReplayCheckpoint>,
}

impl TopicRegionValue {
    /// A value holding checkpoint `entry_id`.
    pub fn at(entry_id: EntryId) -> Self {
        TopicRegionValue {
            checkpoint: Some(ReplayCheckpoint {
                entry_id,
                metadata_entry_id: None,
            }),
        }
    }

    /// The stored bytes: empty without a checkpoint (as GreptimeDB writes a new region's key), else the JSON.
    pub fn encode(&self) -> Vec<u8> {
        match self.checkpoint {
            None => Vec::new(),
            // A struct of integers: serialising it cannot fail.
            Some(_) => serde_json::to_vec(self).unwrap_or_default(),
        }
    }

    /// Decodes a stored value (empty = no checkpoint); `key` names it in the error.
    pub fn decode(key: &[u8], value: &[u8]) -> Result<Self> {
        if value.is_empty() {
            return Ok(TopicRegionValue::default());
        }
        serde_json::from_slice(value).map_err(|e| {
            InvalidTopicRegionKeySnafu {
                key: String::from_utf8_lossy(key).into_owned(),
                reason: format!(
                    "value '{}' is not a topic region value: {e}",
                    String::from_utf8_lossy(value)
                ),
            }
            .build()
        })
    }

    /// The entry id the region's entries are flushed up to: the checkpoint's entry id, or the metadata entry id
    /// when it is lower; `None` without a checkpoint.
    pub fn flushed_entry_id(&self) -> Option<EntryId> {
        self.checkpoint.map(|c| match c.metadata_entry_id {
            Some(m) => c.entry_id.min(m),
            None => c.entry_id,
        })
    }
}

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

    /// Every region recorded on `topic`, with its value. A key that does not end in a region id, or a value that
    /// does not decode, is an error naming the key.
    pub async fn regions(&self, topic: &str) -> Result<BTreeMap<RegionId, TopicRegionValue>> {
        let prefix = topic_region_prefix(topic);
        let kvs = range_all(self.kv.as_ref(), RangeRequest::prefix(prefix.clone()), 1024).await?;
        let mut out = BTreeMap::new();
        for kv in kvs {
            let region_id = kv
                .key
                .get(prefix.len()..)
                .and_then(|rest| std::str::from_utf8(rest).ok())
                .and_then(|rest| rest.parse::<u64>().ok())
                .ok_or_else(|| {
                    InvalidTopicRegionKeySnafu {
                        key: String::from_utf8_lossy(&kv.key).into_owned(),
                        reason: "it does not end in a region id",
                    }
                    .build()
                })?;
            out.insert(region_id, TopicRegionValue::decode(&kv.key, &kv.value)?);
        }
        Ok(out)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_encode_as_greptimedb_writes_them() {
        assert_eq!(TopicRegionValue::default().encode(), b"");
        assert_eq!(
            TopicRegionValue::at(42).encode(),
            br#"{"checkpoint":{"entry_id":42}}"#
        );
        let with_meta = TopicRegionValue::decode(
            b"k",
            br#"{"checkpoint":{"entry_id":42,"metadata_entry_id":7},"future":1}"#,
        )
        .unwrap();
        assert_eq!(with_meta.flushed_entry_id(), Some(7));
        assert_eq!(
            with_meta.encode(),
            br#"{"checkpoint":{"entry_id":42,"metadata_entry_id":7}}"#
        );
        assert_eq!(
            TopicRegionValue::decode(b"k", b"{}").unwrap(),
            TopicRegionValue::default()
        );
        let err = TopicRegionValue::decode(b"__topic_region/t/1", b"nope").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid topic region key '__topic_region/t/1': value 'nope' is not a topic region value: expected ident at line 1 column 2"
        );
    }

    #[test]
    fn keys_follow_greptimedb_layout() {
        assert_eq!(
            topic_region_key("greptimedb_wal_topic_3", 4398046511104),
            b"__topic_region/greptimedb_wal_topic_3/4398046511104".to_vec()
        );
    }
}
