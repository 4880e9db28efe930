//! [`TableMetadataManager`]: reads a table's metadata and writes all of it in one kv transaction.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;
use snafu::{ResultExt, ensure};

use crate::ddl::allocator::TableAllocation;
use crate::ddl::error::{
    DecodeMetadataSnafu, EncodeMetadataSnafu, InvalidCreateTableSnafu, MetadataTxnTooLargeSnafu,
    Result, TableAlreadyExistsSnafu, TableMetadataConflictSnafu,
};
use crate::ddl::region::region_storage_path;
use crate::ddl::task::CreateTableTask;
use crate::key::datanode_table::{DatanodeTableValue, datanode_table_key};
use crate::key::table_info::{TableInfoValue, table_info_key};
use crate::key::table_name::{TableName, TableNameValue};
use crate::key::table_route::{TableRouteValue, table_route_key};
use crate::key::topic_region::{TOPIC_REGION_PREFIX, TopicRegionValue, topic_region_key};
use crate::kv::{Compare, KvBackendRef, KvStepStore, Txn, TxnOp, TxnOpResponse};
use crate::wal::WalOptions;
use procedures::{Condition, StepWrites, WriteOp};

/// Operations the procedure engine adds to the metadata transaction of a create-table (see `check_fits`).
const COMMIT_OVERHEAD_OPS: usize = 4;

/// A table's metadata encoded ([`TableMetadata::encode`]) and checked to fit one transaction of the backend
/// ([`TableMetadataManager::encode_checked`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodedMetadata {
    table: String,
    table_id: u32,
    kvs: Vec<(String, Vec<u8>)>,
}

/// Every value a new table's metadata consists of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableMetadata {
    /// The table's name.
    pub name: TableName,
    /// `__table_name/...` → this.
    pub name_value: TableNameValue,
    /// `__table_info/{id}` → this.
    pub info: TableInfoValue,
    /// `__table_route/{id}` → this.
    pub route: TableRouteValue,
    /// `__dn_table/{datanode}/{id}` → this, per datanode id.
    pub datanode_tables: BTreeMap<u64, DatanodeTableValue>,
    /// `__topic_region/{topic}/{region_id}` → empty (no checkpoint yet), per region on a Kafka topic: the region
    /// pins its topic against a prune from the moment the table exists, before any datanode opened it.
    pub topic_regions: Vec<(String, u64)>,
}

impl TableMetadata {
    /// The metadata of the table `task` creates with `allocation`.
    pub fn new(task: &CreateTableTask, allocation: &TableAllocation) -> Self {
        let table_id = allocation.table_id;
        let route = TableRouteValue {
            region_routes: allocation.region_routes.clone(),
            version: 0,
            region_epochs: BTreeMap::new(),
        };
        let storage_path = region_storage_path(&task.name.catalog, &task.name.schema);
        let datanode_tables = route
            .regions_by_datanode()
            .into_iter()
            .map(|(dn, regions)| {
                let region_wal_options = regions
                    .iter()
                    .filter_map(|r| {
                        allocation
                            .region_wal_options
                            .get(r)
                            .map(|w| (*r, w.clone()))
                    })
                    .collect();
                let value = DatanodeTableValue {
                    table_id,
                    regions,
                    engine: task.engine.clone(),
                    region_storage_path: storage_path.clone(),
                    region_options: task.options.clone(),
                    region_wal_options,
                    version: 0,
                };
                (dn, value)
            })
            .collect();
        let mut topic_regions: Vec<(String, u64)> = allocation
            .region_wal_options
            .iter()
            .filter_map(|(number, encoded)| match WalOptions::decode(encoded) {
                Ok(WalOptions::Kafka(kafka)) => Some((
                    kafka.topic,
                    crate::ddl::region::region_id(table_id, *number),
                )),
                _ => None,
            })
            .collect();
        topic_regions.sort();
        TableMetadata {
            name: task.name.clone(),
            name_value: TableNameValue { table_id },
            info: TableInfoValue {
                table_id,
                name: task.name.table.clone(),
                catalog_name: task.name.catalog.clone(),
                schema_name: task.name.schema.clone(),
                engine: task.engine.clone(),
                num_regions: task.num_regions,
                options: task.options.clone(),
                version: 0,
            },
            route,
            datanode_tables,
            topic_regions,
        }
    }

    /// The table's id.
    pub fn table_id(&self) -> u32 {
        self.name_value.table_id
    }

    /// Every key with its encoded value: name, info, route, one per datanode, then one per region on a Kafka topic.
    pub fn encode(&self) -> Result<Vec<(String, Vec<u8>)>> {
        let id = self.table_id();
        let mut kvs = vec![
            encode_kv(self.name.key(), &self.name_value)?,
            encode_kv(table_info_key(id), &self.info)?,
            encode_kv(table_route_key(id), &self.route)?,
        ];
        for (dn, value) in &self.datanode_tables {
            kvs.push(encode_kv(datanode_table_key(*dn, id), value)?);
        }
        for (topic, region_id) in &self.topic_regions {
            let key = String::from_utf8_lossy(&topic_region_key(topic, *region_id)).into_owned();
            kvs.push((key, TopicRegionValue::default().encode()));
        }
        Ok(kvs)
    }
}

fn encode_kv<T: Serialize>(key: String, value: &T) -> Result<(String, Vec<u8>)> {
    let bytes = serde_json::to_vec(value).context(EncodeMetadataSnafu { key: key.clone() })?;
    Ok((key, bytes))
}

fn decode<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).context(DecodeMetadataSnafu { key })
}

/// Whether two encoded JSON values mean the same (field order and whitespace aside).
fn same_json(a: &[u8], b: &[u8]) -> bool {
    match (
        serde_json::from_slice::<serde_json::Value>(a),
        serde_json::from_slice::<serde_json::Value>(b),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Reads and writes table metadata in a kv backend.
#[derive(Clone, Debug)]
pub struct TableMetadataManager {
    kv: KvBackendRef,
}

/// A shared [`TableMetadataManager`].
pub type TableMetadataManagerRef = Arc<TableMetadataManager>;

impl TableMetadataManager {
    /// A manager over `kv`.
    pub fn new(kv: KvBackendRef) -> Self {
        TableMetadataManager { kv }
    }

    /// The kv backend.
    pub fn kv(&self) -> &KvBackendRef {
        &self.kv
    }

    /// The id of the table `name`, if it exists.
    pub async fn table_id(&self, name: &TableName) -> Result<Option<u32>> {
        let key = name.key();
        match self.kv.get(key.as_bytes()).await? {
            Some(kv) => Ok(Some(decode::<TableNameValue>(&key, &kv.value)?.table_id)),
            None => Ok(None),
        }
    }

    /// The info of table `table_id`, if it exists.
    pub async fn table_info(&self, table_id: u32) -> Result<Option<TableInfoValue>> {
        self.get_decoded(table_info_key(table_id)).await
    }

    /// The route of table `table_id`, if it exists.
    pub async fn table_route(&self, table_id: u32) -> Result<Option<TableRouteValue>> {
        self.get_decoded(table_route_key(table_id)).await
    }

    /// What datanode `datanode_id` serves of table `table_id`, if anything.
    pub async fn datanode_table(
        &self,
        datanode_id: u64,
        table_id: u32,
    ) -> Result<Option<DatanodeTableValue>> {
        self.get_decoded(datanode_table_key(datanode_id, table_id))
            .await
    }

    async fn get_decoded<T: DeserializeOwned>(&self, key: String) -> Result<Option<T>> {
        match self.kv.get(key.as_bytes()).await? {
            Some(kv) => Ok(Some(decode(&key, &kv.value)?)),
            None => Ok(None),
        }
    }

    /// Writes every key of `metadata` in one transaction, each only if absent.
    ///
    /// If the keys already hold exactly these values (a replay), this succeeds without writing. If the table name
    /// holds another id, the error is "table already exists"; if another key holds another value, the error names
    /// that key. A transaction larger than the backend's `max_txn_ops` is refused before anything is sent.
    pub async fn create_table_metadata(&self, metadata: &TableMetadata) -> Result<()> {
        let table = metadata.name.to_string();
        let kvs = metadata.encode()?;
        self.check_fits(&table, &kvs)?;
        let txn = Txn {
            compare: kvs
                .iter()
                .map(|(k, _)| Compare::Absent(k.as_bytes().to_vec()))
                .collect(),
            success: kvs
                .iter()
                .map(|(k, v)| TxnOp::Put(k.as_bytes().to_vec(), v.clone()))
                .collect(),
            failure: kvs
                .iter()
                .map(|(k, _)| TxnOp::Get(k.as_bytes().to_vec()))
                .collect(),
        };
        let resp = self.kv.txn(txn).await?;
        if resp.succeeded {
            return Ok(());
        }
        let current: Vec<Option<Vec<u8>>> = if resp.responses.len() == kvs.len() {
            resp.responses
                .into_iter()
                .map(|r| match r {
                    TxnOpResponse::Get(kv) => kv.map(|kv| kv.value),
                    _ => None,
                })
                .collect()
        } else {
            let keys: Vec<Vec<u8>> = kvs.iter().map(|(k, _)| k.as_bytes().to_vec()).collect();
            let found = self.kv.batch_get(&keys).await?;
            keys.iter()
                .map(|k| {
                    found
                        .iter()
                        .find(|kv| &kv.key == k)
                        .map(|kv| kv.value.clone())
                })
                .collect()
        };
        self.check_replay(metadata, &table, &kvs, &current)
    }

    /// The writes that create `metadata`, for a create-table step to hand the procedure engine (committed with the
    /// procedure's `done` record when the state store lives in this kv): every key put, each only if absent, plus
    /// `extra` ops. `None` when every key already holds exactly these values (the writes of an earlier run of the
    /// step landed). Some keys present with other values: the error of [`TableMetadataManager::create_table_metadata`]
    /// ("table already exists" for the name, else the key that clashed).
    pub async fn create_table_writes(
        &self,
        metadata: &TableMetadata,
        extra: Vec<WriteOp>,
    ) -> Result<Option<StepWrites>> {
        let table = metadata.name.to_string();
        let kvs = metadata.encode()?;
        self.check_fits(&table, &kvs)?;
        let keys: Vec<Vec<u8>> = kvs.iter().map(|(k, _)| k.as_bytes().to_vec()).collect();
        let found = self.kv.batch_get(&keys).await?;
        let current: Vec<Option<Vec<u8>>> = keys
            .iter()
            .map(|k| {
                found
                    .iter()
                    .find(|kv| &kv.key == k)
                    .map(|kv| kv.value.clone())
            })
            .collect();
        if current.iter().any(Option::is_some) {
            self.check_replay(metadata, &table, &kvs, &current)?;
            return Ok(None);
        }
        Ok(Some(self.absent_keys_writes(kvs, extra)))
    }

    /// The writes that create the `encoded` metadata without reading first, for a step that knows no earlier run
    /// of it wrote anything (a create-table procedure made in this process, on its first run of the step): every
    /// key put, each only if absent, plus `extra` ops. Keys already present make the commit refuse the writes,
    /// naming the first such key ([`procedures::Error::StepConditionFailed`]); nothing is written then.
    pub fn first_create_table_writes(
        &self,
        encoded: EncodedMetadata,
        extra: Vec<WriteOp>,
    ) -> StepWrites {
        self.absent_keys_writes(encoded.kvs, extra)
    }

    fn absent_keys_writes(&self, kvs: Vec<(String, Vec<u8>)>, extra: Vec<WriteOp>) -> StepWrites {
        let conditions = kvs
            .iter()
            .map(|(k, _)| Condition::Absent { key: k.clone() })
            .collect();
        let mut ops: Vec<WriteOp> = kvs
            .into_iter()
            .map(|(key, value)| WriteOp::Put { key, value })
            .collect();
        ops.extend(extra);
        StepWrites::new(Arc::new(KvStepStore::new(self.kv.clone())), conditions, ops)
    }

    /// Refuses a table id already used by another table's metadata: an error naming the key that holds it
    /// (`__table_info/{id}` or `__table_route/{id}`). The create-table procedure checks this at Allocate, before
    /// any region exists (the id sequence may have been set back to ids in use).
    ///
    /// Keys that already hold exactly this table's values (its own metadata, written by an earlier run of the same
    /// procedure) are not a clash.
    pub async fn check_table_id_free(&self, encoded: &EncodedMetadata) -> Result<()> {
        let id_keys = [
            table_info_key(encoded.table_id),
            table_route_key(encoded.table_id),
        ];
        let mine: Vec<&(String, Vec<u8>)> = encoded
            .kvs
            .iter()
            .filter(|(key, _)| id_keys.contains(key))
            .collect();
        // One read for both keys: on etcd each read waits for the writes before it to apply.
        let keys: Vec<Vec<u8>> = mine
            .iter()
            .map(|(key, _)| key.as_bytes().to_vec())
            .collect();
        let found = self.kv.batch_get(&keys).await?;
        for (key, want) in mine {
            if let Some(have) = found.iter().find(|kv| kv.key == key.as_bytes()) {
                ensure!(
                    same_json(&have.value, want),
                    TableMetadataConflictSnafu {
                        table: &encoded.table,
                        key: key.clone(),
                    }
                );
            }
        }
        Ok(())
    }

    /// `metadata` encoded, once it is known to fit one transaction: refuses, before anything is written anywhere, a
    /// table whose metadata transaction the backend would refuse (over `max_txn_ops` or `max_request_bytes`). The
    /// create-table procedure checks this before it creates any region, so such a table fails without leaving
    /// regions nobody records, and keeps what it encoded for its last step.
    pub fn encode_checked(&self, metadata: &TableMetadata) -> Result<EncodedMetadata> {
        let table = metadata.name.to_string();
        let kvs = metadata.encode()?;
        self.check_fits(&table, &kvs)?;
        Ok(EncodedMetadata {
            table,
            table_id: metadata.table_id(),
            kvs,
        })
    }

    fn check_fits(&self, table: &str, kvs: &[(String, Vec<u8>)]) -> Result<()> {
        // Compares and the failure branch's reads both hold one entry per key, plus what the procedure engine adds
        // when the writes commit with its record: the epoch compares (two under a leader fence), the record's put
        // and the removal of a reservation an older release may have left.
        let ops = kvs.len() * 2 + COMMIT_OVERHEAD_OPS;
        let max = self.kv.max_txn_ops();
        ensure!(
            ops <= max,
            MetadataTxnTooLargeSnafu {
                table,
                ops,
                max,
                backend: self.kv.name(),
            }
        );
        // Each key is compared, put with its value and read back in the failure branch.
        let bytes: usize = kvs.iter().map(|(k, v)| 3 * k.len() + v.len()).sum();
        let max_bytes = self.kv.max_request_bytes();
        ensure!(
            bytes <= max_bytes,
            InvalidCreateTableSnafu {
                table,
                reason: format!(
                    "writing its metadata needs a transaction of {bytes} bytes of keys and values, backend {} \
                     allows {max_bytes}",
                    self.kv.name()
                ),
            }
        );
        Ok(())
    }

    /// After a refused transaction: success when every key holds what would have been written.
    fn check_replay(
        &self,
        metadata: &TableMetadata,
        table: &str,
        kvs: &[(String, Vec<u8>)],
        current: &[Option<Vec<u8>>],
    ) -> Result<()> {
        // The table name key comes first: another id there means another table owns the name.
        if let Some(Some(bytes)) = current.first() {
            let existing: TableNameValue = decode(&kvs[0].0, bytes)?;
            ensure!(
                existing == metadata.name_value,
                TableAlreadyExistsSnafu {
                    table,
                    table_id: Some(existing.table_id),
                }
            );
        }
        // Name the key that clashed: one holding another value (e.g. `__table_info/{id}` of another table when the
        // id sequence was set back), before any key merely absent.
        // A region's topic-region key holds its checkpoint once a datanode opened it: any value there is this
        // table's own.
        let pairs = || kvs.iter().zip(current);
        let clash = pairs()
            .find(|((key, want), have)| {
                !key.starts_with(TOPIC_REGION_PREFIX)
                    && have.as_deref().is_some_and(|have| !same_json(have, want))
            })
            .or_else(|| pairs().find(|(_, have)| have.is_none()));
        if let Some(((key, _), _)) = clash {
            return TableMetadataConflictSnafu { table, key }.fail();
        }
        Ok(())
    }
}
