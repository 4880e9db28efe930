//! The `__topic_region/{topic}/{region_id}` key and its value, a region's replay checkpoint: the one codec of that
//! key, used by the metasrv side (create table writes it, the prune and `wal stats` read it) and by the datanode
//! side (which moves its checkpoint forward).
//!
//! Layout, as GreptimeDB's `common-meta` crate writes it (`key/topic_region.rs`, the version with
//! `ReplayCheckpoint { entry_id, metadata_entry_id }`): one key per region on a Kafka topic. Its value is empty when
//! the region has no checkpoint yet (how create table writes it), else `{"checkpoint":{"entry_id":N}}` (with
//! `"metadata_entry_id":M` when GreptimeDB's metric engine set one; kept as read, and the lower of the two is where
//! replay starts). Unknown fields are ignored.
//!
//! Our own field, after GreptimeDB's: `"topic_id":"…"`, the Kafka id of the topic incarnation whose positions the
//! checkpoint counts (entry ids are positions in the topic, so a checkpoint means nothing on a topic deleted and
//! created again). A datanode opening the region compares it with the id the brokers give the topic now and
//! refuses to replay another incarnation as if it were the one the region wrote to (`docs/remote-wal.md`, "Topic
//! incarnations"). GreptimeDB ignores the field.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::key::topic_name::TopicId;
use crate::kv::{KvBackend, RangeRequest, range_all};
use crate::wal::error::{InvalidTopicRegionKeySnafu, Result};

/// A region id: `(table_id << 32) | region_number`.
pub type RegionId = u64;

/// An entry id: 0 = nothing written; a region's entries have increasing ids from 1 on.
pub type EntryId = u64;

/// The prefix of every topic-region key.
pub const TOPIC_REGION_PREFIX: &str = "__topic_region/";

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
    /// The Kafka id of the topic incarnation the checkpoint counts positions of (`None`: written by GreptimeDB or
    /// an earlier release, or before the datanode could read the id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_id: Option<TopicId>,
}

impl TopicRegionValue {
    /// A value holding checkpoint `entry_id`.
    pub fn at(entry_id: EntryId) -> Self {
        TopicRegionValue {
            checkpoint: Some(ReplayCheckpoint {
                entry_id,
                metadata_entry_id: None,
            }),
            topic_id: None,
        }
    }

    /// The stored bytes: empty without a checkpoint (as GreptimeDB writes a new region's key), else the JSON.
    pub fn encode(&self) -> Vec<u8> {
        match self.checkpoint {
            None => Vec::new(),
            // Integers and a string: serialising it cannot fail.
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

/// Every region recorded on `topic`, with its value, read from `kv`. A key that does not end in a region id, or a
/// value that does not decode, is an error naming the key.
pub async fn read_topic_regions(
    kv: &dyn KvBackend,
    topic: &str,
) -> Result<BTreeMap<RegionId, TopicRegionValue>> {
    let prefix = topic_region_prefix(topic);
    let kvs = range_all(kv, RangeRequest::prefix(prefix.clone()), 1024).await?;
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
        let id: TopicId = "0b9e4ab6-3f1c-4c52-9d36-7a1f0e2d4c8b".parse().unwrap();
        let with_id = TopicRegionValue {
            topic_id: Some(id),
            ..TopicRegionValue::at(42)
        };
        assert_eq!(
            with_id.encode(),
            br#"{"checkpoint":{"entry_id":42},"topic_id":"0b9e4ab6-3f1c-4c52-9d36-7a1f0e2d4c8b"}"#
        );
        assert_eq!(
            TopicRegionValue::decode(b"k", &with_id.encode()).unwrap(),
            with_id
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
