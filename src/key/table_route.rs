//! The `__table_route/{table_id}` key: which datanode serves each region of a table.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Prefix of table route keys.
pub const TABLE_ROUTE_KEY_PREFIX: &str = "__table_route";

/// The kv key of a table's route: `__table_route/{table_id}`.
pub fn table_route_key(table_id: u32) -> String {
    format!("{TABLE_ROUTE_KEY_PREFIX}/{table_id}")
}

/// The value of a table route key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableRouteValue {
    /// Region number → the datanode serving it (JSON keys are the region numbers as strings).
    pub region_routes: BTreeMap<u32, u64>,
    /// Version of the value, bumped by every change.
    #[serde(default)]
    pub version: u64,
    /// Region number → its region epoch, for the regions whose epoch moved past 0 (a leader change bumps it;
    /// absent = 0). Every lease carries its region's epoch, and so does every record written under it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub region_epochs: BTreeMap<u32, u64>,
}

impl TableRouteValue {
    /// The region epoch of region `number` (0 unless recorded).
    pub fn region_epoch(&self, number: u32) -> u64 {
        self.region_epochs.get(&number).copied().unwrap_or(0)
    }

    /// The regions each datanode serves, by datanode id.
    pub fn regions_by_datanode(&self) -> BTreeMap<u64, Vec<u32>> {
        let mut by_dn: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
        for (&region, &dn) in &self.region_routes {
            by_dn.entry(dn).or_default().push(region);
        }
        by_dn
    }
}
