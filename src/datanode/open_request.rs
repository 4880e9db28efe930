//! [`RegionOpenRequest`]: what a datanode needs to open one region.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Opens one region on a datanode.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RegionOpenRequest {
    /// `(table_id << 32) | region_number`.
    pub region_id: u64,
    /// The storage engine.
    pub engine: String,
    /// The region's directory.
    pub region_dir: String,
    /// The region's options: the table's options plus `wal_options` (the encoded WAL options, as recorded).
    pub options: BTreeMap<String, String>,
}
