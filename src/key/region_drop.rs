//! The `__region_drop/{region_id}` key: a dropped table's region whose storage a datanode still has to delete.
//!
//! `DropTable` writes one per region in the commit that ends it (after no datanode leads a region of the table, so
//! no lease holder can write the region's storage any more). The leader's datanode registry hands each key out as
//! a `Drop` instruction: a region on a Kafka topic to any live datanode (region storage is shared), a region on the
//! raft-engine WAL to the datanode that held it (its WAL lives there). The datanode deletes what it holds of the
//! region, reports the region in its next heartbeat, and the registry deletes the key. Region ids are never reused
//! (table ids come from a sequence), so a key left behind by a crash only makes a datanode delete, again, what is
//! already gone.
//!
//! The value is JSON: `{"table_id":T,"datanode_id":D,"wal":"kafka"|"raft_engine"}`.

use serde::{Deserialize, Serialize};
use snafu::ResultExt;

use crate::ddl::error::DecodeMetadataSnafu;
use crate::ddl::error::Result;

/// The prefix of every region-drop key.
pub const REGION_DROP_PREFIX: &str = "__region_drop/";

/// `__region_drop/{region_id}`.
pub fn region_drop_key(region_id: u64) -> String {
    format!("{REGION_DROP_PREFIX}{region_id}")
}

/// Which WAL the dropped region wrote to: it decides which datanode may delete it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DroppedWal {
    /// A Kafka topic: nothing of the region is local to a datanode; any live one deletes its storage.
    Kafka,
    /// The raft-engine WAL of the datanode that held it: only that datanode deletes it (its WAL entries too).
    RaftEngine,
}

/// The value of a region-drop key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionDropValue {
    /// The dropped table.
    pub table_id: u32,
    /// The datanode whose `__dn_table` record held the region when the table was dropped.
    pub datanode_id: u64,
    /// Its WAL.
    pub wal: DroppedWal,
}

impl RegionDropValue {
    /// Whether `datanode_id` is the one to delete the region: any datanode for a Kafka region, its holder for a
    /// raft-engine one.
    pub fn for_datanode(&self, datanode_id: u64) -> bool {
        match self.wal {
            DroppedWal::Kafka => true,
            DroppedWal::RaftEngine => self.datanode_id == datanode_id,
        }
    }

    /// The value's bytes.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads the value of `key`, naming the key when it is not one.
    pub fn decode(key: &str, bytes: &[u8]) -> Result<Self> {
        serde_json::from_slice(bytes).context(DecodeMetadataSnafu { key })
    }
}

/// The region id of a region-drop key (`None` when `key` is not one).
pub fn parse_region_drop_key(key: &[u8]) -> Option<u64> {
    std::str::from_utf8(key)
        .ok()?
        .strip_prefix(REGION_DROP_PREFIX)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_parses_back_and_a_value_round_trips() {
        let key = region_drop_key((7 << 32) | 3);
        assert_eq!(key, "__region_drop/30064771075");
        assert_eq!(parse_region_drop_key(key.as_bytes()), Some((7 << 32) | 3));
        assert_eq!(parse_region_drop_key(b"__region_drop/x"), None);
        assert_eq!(parse_region_drop_key(b"__topic_region/t/1"), None);
        let value = RegionDropValue {
            table_id: 7,
            datanode_id: 2,
            wal: DroppedWal::RaftEngine,
        };
        assert_eq!(
            String::from_utf8(value.encode()).unwrap(),
            r#"{"table_id":7,"datanode_id":2,"wal":"raft_engine"}"#
        );
        assert_eq!(
            RegionDropValue::decode(&key, &value.encode()).unwrap(),
            value
        );
        let bad = RegionDropValue::decode(&key, b"{").unwrap_err().to_string();
        assert!(bad.contains(&key), "{bad}");
        assert!(value.for_datanode(2) && !value.for_datanode(3));
        let kafka = RegionDropValue {
            wal: DroppedWal::Kafka,
            ..value
        };
        assert!(kafka.for_datanode(3));
    }
}
