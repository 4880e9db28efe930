//! The `__dn_table/{datanode_id}/{table_id}` key and [`DatanodeTableValue`]: what one datanode serves of one table,
//! with each region's encoded WAL options. The JSON layout is GreptimeDB 1.2's, so either side reads the other's
//! values (see `docs/metadata-store.md`).

use std::collections::BTreeMap;

use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize, Serializer};

use crate::ddl::error::{InvalidDatanodeTableKeySnafu, Result};

/// Prefix of datanode table keys.
pub const DATANODE_TABLE_KEY_PREFIX: &str = "__dn_table";

/// The kv key of what datanode `datanode_id` serves of table `table_id`: `__dn_table/{datanode_id}/{table_id}`.
pub fn datanode_table_key(datanode_id: u64, table_id: u32) -> String {
    format!("{DATANODE_TABLE_KEY_PREFIX}/{datanode_id}/{table_id}")
}

/// The prefix of every key of one datanode: `__dn_table/{datanode_id}/`.
pub fn datanode_table_prefix(datanode_id: u64) -> String {
    format!("{DATANODE_TABLE_KEY_PREFIX}/{datanode_id}/")
}

/// Parses `__dn_table/{datanode_id}/{table_id}` into `(datanode_id, table_id)`; the error quotes the key.
pub fn parse_datanode_table_key(key: &[u8]) -> Result<(u64, u32)> {
    let text = String::from_utf8_lossy(key);
    let bad = |reason: &str| {
        InvalidDatanodeTableKeySnafu {
            key: text.to_string(),
            reason: reason.to_string(),
        }
        .build()
    };
    let rest = text
        .strip_prefix(DATANODE_TABLE_KEY_PREFIX)
        .and_then(|r| r.strip_prefix('/'))
        .ok_or_else(|| bad("it does not start with '__dn_table/'"))?;
    let (dn, table) = rest
        .split_once('/')
        .ok_or_else(|| bad("expected __dn_table/{datanode_id}/{table_id}"))?;
    let dn = dn
        .parse::<u64>()
        .map_err(|_| bad("the datanode id is not a number"))?;
    let table = table
        .parse::<u32>()
        .map_err(|_| bad("the table id is not a 32-bit number"))?;
    Ok((dn, table))
}

/// What one datanode serves of one table.
///
/// JSON, fields in GreptimeDB's order (it flattens its `RegionInfo` between `follower_regions` and `version`):
/// `{"table_id":1024,"regions":[0,2],"follower_regions":[],"engine":"mito","region_storage_path":"greptime/public",
/// "region_options":{},"region_wal_options":{"0":"{\"wal.provider\":\"raft_engine\"}"},"version":0}`.
/// `region_wal_options` maps the region number, written as a string, to the encoded WAL options string.
///
/// `follower_regions` is always written, empty, as GreptimeDB does for a table without follower replicas (this crate
/// places none); when reading, it is ignored like every unknown field, and may be missing (values written before
/// GreptimeDB added it). Missing optional fields take their defaults.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct DatanodeTableValue {
    /// The table.
    pub table_id: u32,
    /// The region numbers this datanode serves.
    pub regions: Vec<u32>,
    /// The regions' storage engine.
    #[serde(default)]
    pub engine: String,
    /// Where the regions' files live (`{catalog}/{schema}`).
    #[serde(default)]
    pub region_storage_path: String,
    /// Options of every region (the table options), without the WAL options.
    #[serde(default)]
    pub region_options: BTreeMap<String, String>,
    /// Region number → encoded WAL options of that region.
    #[serde(default)]
    pub region_wal_options: BTreeMap<u32, String>,
    /// Version of the value, bumped by every change.
    #[serde(default)]
    pub version: u64,
}

impl Serialize for DatanodeTableValue {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        // Written field by field only to place GreptimeDB's `follower_regions` (always empty here) after `regions`.
        let mut value = serializer.serialize_struct("DatanodeTableValue", 8)?;
        value.serialize_field("table_id", &self.table_id)?;
        value.serialize_field("regions", &self.regions)?;
        value.serialize_field("follower_regions", &[] as &[u32])?;
        value.serialize_field("engine", &self.engine)?;
        value.serialize_field("region_storage_path", &self.region_storage_path)?;
        value.serialize_field("region_options", &self.region_options)?;
        value.serialize_field("region_wal_options", &self.region_wal_options)?;
        value.serialize_field("version", &self.version)?;
        value.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GreptimeDB 1.2's serde_json output for `DatanodeTableValue { table_id: 42, regions: vec![1, 2, 3],
    /// follower_regions: vec![], region_info: RegionInfo::default(), version: 1 }`.
    const GREPTIME_DEFAULT_INFO: &str = r#"{"table_id":42,"regions":[1,2,3],"follower_regions":[],"engine":"","region_storage_path":"","region_options":{},"region_wal_options":{},"version":1}"#;

    fn value_42() -> DatanodeTableValue {
        DatanodeTableValue {
            table_id: 42,
            regions: vec![1, 2, 3],
            engine: String::new(),
            region_storage_path: String::new(),
            region_options: BTreeMap::new(),
            region_wal_options: BTreeMap::new(),
            version: 1,
        }
    }

    #[test]
    fn writes_follower_regions_after_regions_as_greptimedb_does() {
        assert_eq!(
            serde_json::to_string(&value_42()).unwrap(),
            GREPTIME_DEFAULT_INFO
        );
        assert_eq!(
            serde_json::to_vec(&value_42()).unwrap(),
            GREPTIME_DEFAULT_INFO.as_bytes()
        );
    }

    #[test]
    fn reads_values_with_and_without_follower_regions() {
        let with: DatanodeTableValue = serde_json::from_str(GREPTIME_DEFAULT_INFO).unwrap();
        assert_eq!(with, value_42());
        // The layout before GreptimeDB added follower regions.
        let without: DatanodeTableValue = serde_json::from_str(
            r#"{"table_id":42,"regions":[1,2,3],"engine":"","region_storage_path":"","region_options":{},"region_wal_options":{},"version":1}"#,
        )
        .unwrap();
        assert_eq!(without, value_42());
        // Followers placed by GreptimeDB do not stop the value from decoding.
        let followers: DatanodeTableValue = serde_json::from_str(
            r#"{"table_id":42,"regions":[1,2,3],"follower_regions":[4,5],"version":1}"#,
        )
        .unwrap();
        assert_eq!(followers, value_42());
    }

    #[test]
    fn key_layout_and_parse() {
        assert_eq!(datanode_table_key(3, 1024), "__dn_table/3/1024");
        assert_eq!(datanode_table_prefix(3), "__dn_table/3/");
        assert_eq!(
            parse_datanode_table_key(b"__dn_table/3/1024").unwrap(),
            (3, 1024)
        );
        for bad in [
            "__dn_table/3",
            "__dn_table/x/1",
            "__dn_table/3/1/2",
            "__table_name/3/1",
        ] {
            let err = parse_datanode_table_key(bad.as_bytes())
                .unwrap_err()
                .to_string();
            assert!(err.contains(bad), "{err}");
        }
    }
}
