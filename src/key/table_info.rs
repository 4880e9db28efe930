//! The `__table_info/{table_id}` key: what a table is (name, engine, number of regions, options).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Prefix of table info keys.
pub const TABLE_INFO_KEY_PREFIX: &str = "__table_info";

/// The kv key of a table's info: `__table_info/{table_id}`.
pub fn table_info_key(table_id: u32) -> String {
    format!("{TABLE_INFO_KEY_PREFIX}/{table_id}")
}

/// The value of a table info key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableInfoValue {
    /// The table's id.
    pub table_id: u32,
    /// The table's name.
    pub name: String,
    /// Its catalog.
    pub catalog_name: String,
    /// Its schema.
    pub schema_name: String,
    /// The storage engine of its regions.
    pub engine: String,
    /// How many regions it has (numbered `0..num_regions`).
    pub num_regions: u32,
    /// The table options (they also go to every region's options).
    #[serde(default)]
    pub options: BTreeMap<String, String>,
    /// Version of the value, bumped by every change.
    #[serde(default)]
    pub version: u64,
}
