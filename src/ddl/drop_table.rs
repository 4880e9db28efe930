//! [`DropTableProcedure`]: drops a table — its metadata, and with it its regions on the datanodes and its hold on
//! the WAL — as a persisted, resumable procedure (`docs/drop-table.md`).
//!
//! Steps: `Prepare → DeleteMetadata → WaitClosed → DeleteTombstones → done` (output
//! `{"table_id","dropped","regions"}`).
//!
//! - **Prepare** finds the table (an absent one is done with `"dropped": false` under `if_exists`, refused
//!   otherwise) and records every key of its metadata with its value: the name, info and route, each datanode's
//!   `__dn_table` record, and the `__topic_region` key of each region on a Kafka topic.
//! - **DeleteMetadata** moves each of those keys to a tombstone (`__tombstone/{key}` holding the value) in one
//!   commit with the procedure's next state, each on the condition that the key still holds what Prepare read.
//!   From then on the table does not exist for anyone: the datanodes' next heartbeats close its regions (their
//!   routes are gone), a checkpoint can no longer be written (the registry writes one only by compare-and-put
//!   against an existing key), and the prune no longer waits for its regions.
//! - **WaitClosed** waits until no datanode leads a region of the table (a retryable error until then; a datanode
//!   that is down leads nothing once its lease ran out, and opens only what a route gives it when it returns).
//! - **DeleteTombstones** removes the tombstones in one commit with the `done` record, and writes a
//!   `__region_drop/{region_id}` key per region (`crate::key::region_drop`): the leader's datanode registry has a
//!   datanode delete each region's storage (and, on the raft-engine WAL, its entries), then deletes the key. The
//!   procedure does not wait for that: a datanode that is down may never come back, and the key outlives it.
//!
//! Rollback (a cancel, or a failure, before the tombstones are deleted) puts every key back from its tombstone,
//! on the condition that the key is still absent and (on a metasrv) that the procedure store's epoch is the running
//! manager's, so a deposed manager's late rollback writes nothing; the datanodes then reopen the regions as their heartbeats find
//! the route again. Locks: the table's name and id exclusive (a region migration takes the id shared: a drop waits
//! for a running migration and blocks new ones).

use std::sync::Arc;

use async_trait::async_trait;
use procedures::{
    BoxedProcedureLoader, Condition, Context, LockKey, Procedure, Status, StepWrites, StringKey,
    WriteOp,
};
use serde::{Deserialize, Serialize};
use snafu::ResultExt;

use crate::ddl::error::{
    DecodeMetadataSnafu, DropTableStateSnafu, RegionStillOpenSnafu, Result, TableChangedSnafu,
    TableNotFoundSnafu,
};
use crate::ddl::region::region_id;
use crate::ddl::region_migration::MigrationContext;
use crate::key::datanode_table::{DatanodeTableValue, datanode_table_key};
use crate::key::region_drop::{DroppedWal, RegionDropValue, region_drop_key};
use crate::key::table_info::table_info_key;
use crate::key::table_name::TableName;
use crate::key::table_route::{TableRouteValue, table_route_key};
use crate::key::topic_region::topic_region_key;
use crate::kv::KvStepStore;
use crate::wal::WalOptions;

/// The type name the procedure is registered and persisted under.
pub const DROP_TABLE_TYPE_NAME: &str = "remote_wal::DropTable";

/// Prefix of the tombstones a drop leaves while it runs: `__tombstone/{key}` holds `{key}`'s last value.
pub const TOMBSTONE_PREFIX: &str = "__tombstone/";

/// The tombstone of `key`.
pub fn tombstone_key(key: &str) -> String {
    format!("{TOMBSTONE_PREFIX}{key}")
}

/// A request to drop a table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropTableTask {
    /// The table.
    pub name: TableName,
    /// Succeed (with `"dropped": false`) when it does not exist.
    #[serde(default)]
    pub if_exists: bool,
    /// The table's id when the drop was submitted (read by the submitter, so that the drop holds the id's lock from
    /// its start): Prepare refuses a name that maps to another id by then. `None`: the table did not exist.
    #[serde(default)]
    pub table_id: Option<u32>,
}

/// Where a drop is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DropTableState {
    /// Find the table and record its keys.
    Prepare,
    /// Move the keys to tombstones.
    DeleteMetadata,
    /// Wait until no datanode leads a region of it.
    WaitClosed,
    /// Remove the tombstones.
    DeleteTombstones,
}

/// One metadata key of the table and the value Prepare read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedKey {
    /// The key.
    pub key: String,
    /// Its value, as JSON text when it is, else lossy UTF-8 (every metadata value is JSON or empty).
    pub value: String,
}

/// The persisted state of a drop.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropTableData {
    /// The next step.
    pub state: DropTableState,
    /// The request.
    pub task: DropTableTask,
    /// The table id (set by Prepare).
    #[serde(default)]
    pub table_id: Option<u32>,
    /// The table's regions (set by Prepare).
    #[serde(default)]
    pub regions: Vec<u64>,
    /// Every key of the table's metadata with its value (set by Prepare).
    #[serde(default)]
    pub keys: Vec<RecordedKey>,
    /// Per region, what its `__region_drop` key will say: the datanode that held it and its WAL (set by
    /// Prepare; written by DeleteTombstones).
    #[serde(default)]
    pub drops: Vec<(u64, RegionDropValue)>,
}

/// Drops one table. See the module documentation.
#[derive(Debug)]
pub struct DropTableProcedure {
    context: MigrationContext,
    data: DropTableData,
}

impl DropTableProcedure {
    /// A new procedure for `task`.
    pub fn new(task: DropTableTask, context: MigrationContext) -> Self {
        DropTableProcedure {
            context,
            data: DropTableData {
                state: DropTableState::Prepare,
                task,
                table_id: None,
                regions: Vec::new(),
                keys: Vec::new(),
                drops: Vec::new(),
            },
        }
    }

    /// Rebuilds a procedure from its persisted state.
    pub fn from_json(value: serde_json::Value, context: MigrationContext) -> Result<Self> {
        let data = serde_json::from_value(value).context(DropTableStateSnafu)?;
        Ok(DropTableProcedure { context, data })
    }

    /// The loader to register with a procedure manager under [`DROP_TABLE_TYPE_NAME`].
    pub fn loader(context: MigrationContext) -> BoxedProcedureLoader {
        Box::new(move |value| {
            let procedure = DropTableProcedure::from_json(value, context.clone())?;
            Ok(Box::new(procedure) as procedures::BoxedProcedure)
        })
    }

    /// The persisted state.
    pub fn data(&self) -> &DropTableData {
        &self.data
    }

    fn output(&self, dropped: bool) -> procedures::Output {
        serde_json::json!({
            "table_id": self.data.table_id,
            "dropped": dropped,
            "regions": self.data.regions.len(),
        })
    }

    fn step_store(&self) -> Arc<KvStepStore> {
        Arc::new(KvStepStore::new(self.context.metadata.kv().clone()))
    }

    /// Prepare: the table's id, regions and every metadata key with its value.
    async fn on_prepare(&mut self) -> Result<Status> {
        let name = self.data.task.name.clone();
        name.validate()?;
        let metadata = &self.context.metadata;
        let found = metadata.table_id(&name).await?;
        let Some(table_id) = found else {
            if self.data.task.if_exists {
                return Ok(Status::done_with_output(self.output(false)));
            }
            return TableNotFoundSnafu {
                table: name.to_string(),
            }
            .fail();
        };
        if let Some(expected) = self.data.task.table_id
            && expected != table_id
        {
            return TableChangedSnafu {
                table: name.to_string(),
                expected,
                found,
            }
            .fail();
        }
        let kv = metadata.kv();
        let mut keys = vec![name.key(), table_info_key(table_id)];
        let route_key = table_route_key(table_id);
        let mut regions = Vec::new();
        let mut drops = Vec::new();
        if let Some(found) = kv.get(route_key.as_bytes()).await? {
            let route: TableRouteValue =
                serde_json::from_slice(&found.value).context(DecodeMetadataSnafu {
                    key: route_key.clone(),
                })?;
            keys.push(route_key);
            for (datanode, numbers) in route.regions_by_datanode() {
                let dn_key = datanode_table_key(datanode, table_id);
                let Some(found) = kv.get(dn_key.as_bytes()).await? else {
                    continue;
                };
                let value: DatanodeTableValue =
                    serde_json::from_slice(&found.value).context(DecodeMetadataSnafu {
                        key: dn_key.clone(),
                    })?;
                keys.push(dn_key);
                for number in numbers {
                    let id = region_id(table_id, number);
                    regions.push(id);
                    let kafka = match value
                        .region_wal_options
                        .get(&number)
                        .map(|w| WalOptions::decode(w))
                    {
                        Some(Ok(WalOptions::Kafka(k))) => {
                            keys.push(
                                String::from_utf8_lossy(&topic_region_key(&k.topic, id))
                                    .into_owned(),
                            );
                            true
                        }
                        _ => false,
                    };
                    drops.push((
                        id,
                        RegionDropValue {
                            table_id,
                            datanode_id: datanode,
                            wal: if kafka {
                                DroppedWal::Kafka
                            } else {
                                DroppedWal::RaftEngine
                            },
                        },
                    ));
                }
            }
        }
        regions.sort_unstable();
        drops.sort_unstable_by_key(|(id, _)| *id);
        let mut recorded = Vec::new();
        for key in keys {
            if let Some(found) = kv.get(key.as_bytes()).await? {
                recorded.push(RecordedKey {
                    key,
                    value: String::from_utf8_lossy(&found.value).into_owned(),
                });
            }
        }
        self.data.table_id = Some(table_id);
        self.data.regions = regions;
        self.data.keys = recorded;
        self.data.drops = drops;
        self.data.state = DropTableState::DeleteMetadata;
        Ok(Status::executing(true))
    }

    /// DeleteMetadata: every key to its tombstone, in one commit with the next state. Keys gone already with their
    /// tombstones in place (an earlier run's commit landed alone) need no write.
    async fn on_delete_metadata(&mut self) -> Result<Status> {
        self.data.state = DropTableState::WaitClosed;
        let kv = self.context.metadata.kv();
        let first = self.data.keys.first().map(|k| k.key.clone());
        if let Some(first) = first
            && kv.get(first.as_bytes()).await?.is_none()
            && kv.get(tombstone_key(&first).as_bytes()).await?.is_some()
        {
            return Ok(Status::executing(true));
        }
        let mut conditions = Vec::new();
        let mut ops = Vec::new();
        for recorded in &self.data.keys {
            conditions.push(Condition::Equals {
                key: recorded.key.clone(),
                value: recorded.value.clone().into_bytes(),
            });
            ops.push(WriteOp::Put {
                key: tombstone_key(&recorded.key),
                value: recorded.value.clone().into_bytes(),
            });
            ops.push(WriteOp::Delete {
                key: recorded.key.clone(),
            });
        }
        Ok(Status::executing_with(StepWrites::new(
            self.step_store(),
            conditions,
            ops,
        )))
    }

    /// WaitClosed: done waiting once no datanode leads a region of the table.
    async fn on_wait_closed(&mut self) -> Result<Status> {
        for region in &self.data.regions {
            if let Some((datanode_id, _)) = self.context.leadership.region_leader(*region).await {
                return RegionStillOpenSnafu {
                    table: self.data.task.name.to_string(),
                    region_id: *region,
                    datanode_id,
                }
                .fail();
            }
        }
        self.data.state = DropTableState::DeleteTombstones;
        Ok(Status::executing(true))
    }

    /// DeleteTombstones: removed with the `done` record, and a `__region_drop` key written per region for the
    /// datanodes to delete its storage (`crate::key::region_drop`).
    fn on_delete_tombstones(&mut self) -> Status {
        let mut ops: Vec<WriteOp> = self
            .data
            .keys
            .iter()
            .map(|k| WriteOp::Delete {
                key: tombstone_key(&k.key),
            })
            .collect();
        ops.extend(self.data.drops.iter().map(|(id, value)| WriteOp::Put {
            key: region_drop_key(*id),
            value: value.encode(),
        }));
        Status::done_with(
            Some(self.output(true)),
            StepWrites::new(self.step_store(), Vec::new(), ops),
        )
    }

    /// Rollback: every key back from its tombstone where the key is absent, the tombstones removed. Each write is
    /// conditioned on the procedure store's epoch still being the running manager's (with an epoch fence): a
    /// deposed manager's late rollback cannot put back a table the newer manager has dropped.
    async fn roll_back(&mut self, ctx: &Context) -> Result<()> {
        use crate::kv::{Compare, Txn, TxnOp};
        let kv = self.context.metadata.kv();
        let fence = match (&self.context.epoch_key, ctx.epoch()) {
            (Some(key), Some(epoch)) => Some((key.clone(), epoch)),
            _ => None,
        };
        let fenced = |compare: &mut Vec<Compare>| {
            if let Some((key, epoch)) = &fence {
                compare.push(Compare::ValueEquals(
                    key.clone().into_bytes(),
                    epoch.to_string().into_bytes(),
                ));
            }
        };
        for recorded in &self.data.keys {
            let tombstone = tombstone_key(&recorded.key);
            let Some(found) = kv.get(tombstone.as_bytes()).await? else {
                continue;
            };
            let mut compare = vec![Compare::Absent(recorded.key.clone().into_bytes())];
            fenced(&mut compare);
            let restored = kv
                .txn(Txn {
                    compare,
                    success: vec![
                        TxnOp::Put(recorded.key.clone().into_bytes(), found.value),
                        TxnOp::Delete(tombstone.clone().into_bytes()),
                    ],
                    failure: Vec::new(),
                })
                .await?;
            if restored.succeeded {
                continue;
            }
            self.ensure_epoch(ctx, &recorded.key).await?;
            // The key is back already (an earlier run of the rollback): only the tombstone goes.
            let mut compare = Vec::new();
            fenced(&mut compare);
            let removed = kv
                .txn(Txn {
                    compare,
                    success: vec![TxnOp::Delete(tombstone.into_bytes())],
                    failure: Vec::new(),
                })
                .await?;
            if !removed.succeeded {
                self.ensure_epoch(ctx, &recorded.key).await?;
            }
        }
        Ok(())
    }

    /// The manager's epoch is still the store's, or the error saying a newer manager runs the procedure.
    async fn ensure_epoch(&self, ctx: &Context, key: &str) -> Result<()> {
        let (Some(epoch_key), Some(own)) = (&self.context.epoch_key, ctx.epoch()) else {
            return Ok(());
        };
        let current = self.context.metadata.kv().get(epoch_key.as_bytes()).await?;
        let current = current.map(|kv| String::from_utf8_lossy(&kv.value).into_owned());
        if current.as_deref() == Some(own.to_string().as_str()) {
            return Ok(());
        }
        crate::ddl::error::ProcedureFencedSnafu {
            procedure_id: ctx.procedure_id().to_string(),
            key: key.to_string(),
            own,
            current: current.unwrap_or_else(|| "absent".to_string()),
        }
        .fail()
    }
}

/// A table that does not exist (without `if_exists`), or a bad name, is refused in Prepare: no record is left.
fn prepare_error(e: crate::ddl::Error) -> procedures::Error {
    use crate::ddl::Error as E;
    let refusal = match &e {
        E::TableNotFound { .. } => procedures::Refusal::NotFound,
        E::TableChanged { .. } => procedures::Refusal::Conflict,
        E::InvalidName { .. } => procedures::Refusal::InvalidRequest,
        _ => return e.into(),
    };
    procedures::Error::refused(refusal, e)
}

#[async_trait]
impl Procedure for DropTableProcedure {
    fn type_name(&self) -> &str {
        DROP_TABLE_TYPE_NAME
    }

    async fn execute(&mut self, _ctx: &Context) -> procedures::Result<Status> {
        match self.data.state {
            DropTableState::Prepare => self.on_prepare().await.map_err(prepare_error),
            DropTableState::DeleteMetadata => Ok(self.on_delete_metadata().await?),
            DropTableState::WaitClosed => Ok(self.on_wait_closed().await?),
            DropTableState::DeleteTombstones => Ok(self.on_delete_tombstones()),
        }
    }

    fn dump(&self) -> procedures::Result<serde_json::Value> {
        Ok(serde_json::to_value(&self.data).context(DropTableStateSnafu)?)
    }

    /// The table's name exclusive (as create-table takes it) and its id exclusive (region migrations take it
    /// shared).
    fn lock_key(&self) -> LockKey {
        let name = &self.data.task.name;
        let mut keys = vec![
            StringKey::Shared(format!("__catalog_lock/{}", name.catalog)),
            StringKey::Shared(format!("__schema_lock/{}/{}", name.catalog, name.schema)),
            StringKey::Exclusive(format!(
                "__table_name_lock/{}/{}/{}",
                name.catalog, name.schema, name.table
            )),
        ];
        if let Some(id) = self.data.task.table_id {
            keys.push(StringKey::Exclusive(format!("__table_id_lock/{id}")));
        }
        LockKey::new(keys)
    }

    /// From DeleteMetadata until the tombstones go: the keys can come back from them.
    fn rollback_supported(&self) -> bool {
        matches!(
            self.data.state,
            DropTableState::DeleteMetadata | DropTableState::WaitClosed
        )
    }

    async fn rollback(&mut self, ctx: &Context) -> procedures::Result<()> {
        self.roll_back(ctx).await.map_err(|e| match e {
            crate::ddl::Error::ProcedureFenced { own, current, .. } => procedures::Error::Fenced {
                epoch: current.parse().unwrap_or(0),
                own,
            },
            e => e.into(),
        })
    }

    /// `Prepare`, `DeleteMetadata`, `WaitClosed`, `DeleteTombstones`.
    fn step_name(&self) -> Option<String> {
        let name = match self.data.state {
            DropTableState::Prepare => "Prepare",
            DropTableState::DeleteMetadata => "DeleteMetadata",
            DropTableState::WaitClosed => "WaitClosed",
            DropTableState::DeleteTombstones => "DeleteTombstones",
        };
        Some(name.to_string())
    }
}
