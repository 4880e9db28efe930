//! [`regions_per_topic`]: how many regions the metadata store records on each Kafka topic, the counts a
//! load-aware [`TopicSelector`](crate::wal::kafka::TopicSelector) starts from when the pool loads.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use tracing::warn;

use crate::key::datanode_table::DATANODE_TABLE_KEY_PREFIX;
use crate::key::table_allocation::ALLOCATION_KEY_PREFIX;
use crate::kv::{KvBackend, RangeRequest, display_key, range_all};
use crate::wal::error::Result;
use crate::wal::options::WalOptions;

/// Prefix of the procedure records in the metadata store: an unfinished create-table keeps its allocation in its
/// record's `data.allocation` until its metadata commits (with its `done` record).
fn procedure_record_prefix() -> String {
    format!(
        "{}{}",
        crate::kv::state_store::PROCEDURE_PREFIX,
        procedures::record::RECORD_PREFIX
    )
}

/// The part of a procedure record counting needs: its state, and the allocation in its data, if any.
#[derive(Deserialize)]
struct RecordAllocation {
    state: procedures::ProcedureState,
    #[serde(default)]
    data: RecordData,
}

#[derive(Default, Deserialize)]
struct RecordData {
    #[serde(default)]
    allocation: Option<RegionWalOptions>,
}

/// Pairs per page of the scans.
const SCAN_PAGE: usize = 512;

/// The two fields of a datanode table value or a reserved allocation that counting needs (both layouts name them
/// alike; other fields are ignored).
#[derive(Deserialize)]
struct RegionWalOptions {
    table_id: u32,
    #[serde(default)]
    region_wal_options: BTreeMap<u32, String>,
}

/// Regions per Kafka topic (topic name → regions) that the store records: every region of every
/// `__dn_table/…` value whose WAL options name a Kafka topic, plus the regions of reserved allocations
/// (`__table_allocation/…`) of tables no datanode table value holds yet — a create-table procedure that will
/// finish, after a restart too, with exactly that allocation. Both scans are paginated.
///
/// A value that does not decode is skipped with a warning naming its key (`walctl open-regions` reports it): a
/// count off by its regions only makes the balance slightly worse, while failing here would stop every
/// allocation.
pub async fn regions_per_topic(kv: &dyn KvBackend) -> Result<BTreeMap<String, u64>> {
    let mut counts = BTreeMap::new();
    let mut tables = BTreeSet::new();
    for (key, value) in
        scan::<RegionWalOptions>(kv, &format!("{DATANODE_TABLE_KEY_PREFIX}/")).await?
    {
        tables.insert(value.table_id);
        add(&mut counts, &key, &value);
    }
    for (key, value) in scan::<RegionWalOptions>(kv, &format!("{ALLOCATION_KEY_PREFIX}/")).await? {
        if tables.insert(value.table_id) {
            add(&mut counts, &key, &value);
        }
    }
    for (key, record) in scan::<RecordAllocation>(kv, &procedure_record_prefix()).await? {
        if record.state.is_finished() {
            continue;
        }
        if let Some(value) = record.data.allocation
            && tables.insert(value.table_id)
        {
            add(&mut counts, &key, &value);
        }
    }
    Ok(counts)
}

/// The decodable values under `prefix`, with their keys.
async fn scan<T: serde::de::DeserializeOwned>(
    kv: &dyn KvBackend,
    prefix: &str,
) -> Result<Vec<(String, T)>> {
    let kvs = range_all(kv, RangeRequest::prefix(prefix), SCAN_PAGE).await?;
    Ok(kvs
        .into_iter()
        .filter_map(|kv| {
            let key = display_key(&kv.key);
            match serde_json::from_slice::<T>(&kv.value) {
                Ok(value) => Some((key, value)),
                Err(error) => {
                    warn!(%key, %error, "not counting the regions of a value that does not decode");
                    None
                }
            }
        })
        .collect())
}

/// Adds the Kafka regions of `value` (at `key`) to `counts`.
fn add(counts: &mut BTreeMap<String, u64>, key: &str, value: &RegionWalOptions) {
    for (region, encoded) in &value.region_wal_options {
        match WalOptions::decode(encoded) {
            Ok(WalOptions::Kafka(kafka)) => *counts.entry(kafka.topic).or_insert(0) += 1,
            Ok(_) => {}
            Err(error) => {
                warn!(%key, region, %error, "not counting a region whose WAL options do not decode")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::kv::{KvBackendRef, MemoryKvBackend, PutRequest};

    async fn put(kv: &KvBackendRef, key: &str, value: &str) {
        kv.put(PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            prev_kv: false,
        })
        .await
        .unwrap();
    }

    fn wal(topic: &str) -> String {
        serde_json::to_string(&WalOptions::kafka(topic).encode()).unwrap()
    }

    #[tokio::test]
    async fn counts_datanode_tables_and_unreleased_allocations_once() {
        let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
        let (a, b) = (wal("p_0"), wal("p_1"));
        let raft = serde_json::to_string(&WalOptions::RaftEngine.encode()).unwrap();
        // Table 1 spread over two datanodes; table 2 on raft-engine.
        put(
            &kv,
            "__dn_table/1/1",
            &format!(
                r#"{{"table_id":1,"regions":[0,1],"region_wal_options":{{"0":{a},"1":{b}}}}}"#
            ),
        )
        .await;
        put(
            &kv,
            "__dn_table/2/1",
            &format!(r#"{{"table_id":1,"regions":[2],"region_wal_options":{{"2":{a}}}}}"#),
        )
        .await;
        put(
            &kv,
            "__dn_table/1/2",
            &format!(r#"{{"table_id":2,"regions":[0],"region_wal_options":{{"0":{raft}}}}}"#),
        )
        .await;
        // Table 1's reservation, not released yet: already counted through its datanode tables.
        put(&kv, "__table_allocation/p1", &format!(r#"{{"table_id":1,"region_routes":{{}},"region_wal_options":{{"0":{a},"1":{b},"2":{a}}}}}"#)).await;
        // Table 3's reservation, its metadata not written yet: counted.
        put(
            &kv,
            "__table_allocation/p3",
            &format!(r#"{{"table_id":3,"region_routes":{{}},"region_wal_options":{{"0":{b}}}}}"#),
        )
        .await;
        // Table 4's allocation, in the record of its unfinished create-table procedure: counted once, though an
        // older release's reservation of the same table is there too.
        let record = |state: &str, table_id: u32, wal: &str| {
            format!(
                r#"{{"state":"{state}","data":{{"allocation":{{"table_id":{table_id},"region_routes":{{}},"region_wal_options":{{"0":{wal},"1":{wal}}}}}}}}}"#
            )
        };
        put(&kv, "__procedure__/proc/p4", &record("running", 4, &a)).await;
        put(
            &kv,
            "__table_allocation/p4",
            &format!(
                r#"{{"table_id":4,"region_routes":{{}},"region_wal_options":{{"0":{a},"1":{a}}}}}"#
            ),
        )
        .await;
        // A finished procedure's allocation is counted through its datanode tables only (here: none left).
        put(&kv, "__procedure__/proc/p5", &record("done", 5, &b)).await;
        // Table 1's allocation in a record: already counted through its datanode tables.
        put(&kv, "__procedure__/proc/p1", &record("running", 1, &b)).await;
        put(
            &kv,
            "__procedure__/proc/other",
            r#"{"state":"running","data":{"topic":"x"}}"#,
        )
        .await;
        // Garbage is skipped.
        put(&kv, "__dn_table/9/9", "not json").await;
        put(
            &kv,
            "__dn_table/9/8",
            r#"{"table_id":8,"region_wal_options":{"0":"bad"}}"#,
        )
        .await;
        let counts = regions_per_topic(kv.as_ref()).await.unwrap();
        assert_eq!(
            counts,
            BTreeMap::from([("p_0".to_string(), 4), ("p_1".to_string(), 2)])
        );
    }
}
