//! [`region_ids_per_topic`]: the regions whose recorded WAL options (`__dn_table` values) name each Kafka topic —
//! what `wal stats` counts per topic, and what a prune checks before it treats a topic without `__topic_region`
//! keys as free.

use std::collections::{BTreeMap, BTreeSet};

use crate::key::datanode_table::{
    DATANODE_TABLE_KEY_PREFIX, DatanodeTableValue, parse_datanode_table_key,
};
use crate::key::topic_region::RegionId;
use crate::kv::{KvBackend, RangeRequest, range_all};
use crate::wal::WalOptions;
use crate::wal::error::Result;

/// Keys read per range request.
const PAGE: usize = 1024;

/// The region ids whose recorded WAL options name each Kafka topic, over every datanode table value. Values that
/// do not decode are skipped (`open-regions` reports them).
pub async fn region_ids_per_topic(
    kv: &dyn KvBackend,
) -> Result<BTreeMap<String, BTreeSet<RegionId>>> {
    let prefix = format!("{DATANODE_TABLE_KEY_PREFIX}/");
    let kvs = range_all(kv, RangeRequest::prefix(prefix), PAGE).await?;
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
                    // A region id is `(table_id << 32) | region_number` (the ddl layer's `region_id`).
                    .insert((u64::from(table_id) << 32) | u64::from(*number));
            }
        }
    }
    Ok(out)
}
