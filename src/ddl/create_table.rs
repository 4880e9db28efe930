//! [`CreateTableProcedure`]: creates a table — its id, its regions on the datanodes with their WAL options, and
//! its metadata — as a persisted, resumable procedure.
//!
//! Steps, in order: `Prepare → Allocate → CreateRegions → PersistDatanodeTableValue → done` (output
//! `{"table_id":N}`). The allocation (table id, placement, WAL options) is persisted in the procedure's state before
//! anything uses it, so a replay after a crash reuses it and never allocates twice. Creating a region that already
//! exists with the same options, and writing metadata that is already there with the same values, both count as
//! success, which makes every step safe to run again.

use std::collections::BTreeMap;

use async_trait::async_trait;
use std::sync::Arc;

use procedures::{
    BoxedProcedureLoader, Context, LockKey, Procedure, Status, StepWrites, StringKey, WriteOp,
};
use serde::{Deserialize, Serialize};
use snafu::ResultExt;

use crate::ddl::allocator::{TableAllocation, allocation_key};
use crate::ddl::context::DdlContext;
use crate::ddl::datanode_manager::RegionCreateRequest;
use crate::ddl::error::{CreateTableStateSnafu, Result, TableAlreadyExistsSnafu};
use crate::ddl::metadata_manager::{EncodedMetadata, TableMetadata};
use crate::ddl::region::{region_dir, region_id, region_storage_path};
use crate::ddl::task::CreateTableTask;
use crate::kv::KvStepStore;
use crate::wal::WAL_OPTIONS_KEY;

/// The type name the procedure is registered and persisted under.
pub const CREATE_TABLE_TYPE_NAME: &str = "remote_wal::CreateTable";

/// Where a create-table procedure is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CreateTableState {
    /// Validate the request; finish early if the table exists.
    Prepare,
    /// Allocate table id, placement and WAL options.
    Allocate,
    /// Create every region on its datanode.
    CreateRegions,
    /// Write the table's metadata in one transaction.
    PersistDatanodeTableValue,
}

/// The persisted state of a create-table procedure.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateTableData {
    /// The next step.
    pub state: CreateTableState,
    /// The request.
    pub task: CreateTableTask,
    /// What was allocated; set (and persisted) by `Allocate`.
    #[serde(default)]
    pub allocation: Option<TableAllocation>,
}

/// Creates one table. See the module documentation.
#[derive(Debug)]
pub struct CreateTableProcedure {
    context: DdlContext,
    data: CreateTableData,
    /// Made by [`CreateTableProcedure::new`] in this process and never rebuilt from a stored record: no earlier
    /// run of it can have written anything, so its steps skip the reads that look for an earlier run's writes
    /// (a reservation of an older release, metadata written alone). The engine rebuilds a procedure from its
    /// record after a refused step write, and recovery always does, so every replay reads.
    first_run: bool,
    /// The metadata Allocate encoded and checked, kept for the last step of a first run (not persisted: it
    /// follows from the task and the allocation, which do not change after Allocate).
    encoded: Option<EncodedMetadata>,
}

/// The procedure's output: `{"table_id":N}`.
pub fn table_id_output(table_id: u32) -> procedures::Output {
    serde_json::json!({ "table_id": table_id })
}

/// One create request per region, with the datanode it goes to, in region-number order.
pub fn region_create_requests(
    task: &CreateTableTask,
    allocation: &TableAllocation,
) -> Vec<(u64, RegionCreateRequest)> {
    let storage_path = region_storage_path(&task.name.catalog, &task.name.schema);
    allocation
        .region_routes
        .iter()
        .map(|(&number, &datanode_id)| {
            let mut options: BTreeMap<String, String> = task.options.clone();
            if let Some(wal) = allocation.region_wal_options.get(&number) {
                options.insert(WAL_OPTIONS_KEY.to_string(), wal.clone());
            }
            let request = RegionCreateRequest {
                region_id: region_id(allocation.table_id, number),
                engine: task.engine.clone(),
                region_dir: region_dir(&storage_path, allocation.table_id, number),
                options,
            };
            (datanode_id, request)
        })
        .collect()
}

impl CreateTableProcedure {
    /// A new procedure for `task`.
    pub fn new(task: CreateTableTask, context: DdlContext) -> Self {
        CreateTableProcedure {
            context,
            data: CreateTableData {
                state: CreateTableState::Prepare,
                task,
                allocation: None,
            },
            first_run: true,
            encoded: None,
        }
    }

    /// Rebuilds a procedure from its persisted state.
    pub fn from_json(value: serde_json::Value, context: DdlContext) -> Result<Self> {
        let data = serde_json::from_value(value).context(CreateTableStateSnafu)?;
        Ok(CreateTableProcedure {
            context,
            data,
            first_run: false,
            encoded: None,
        })
    }

    /// The loader to register with a procedure manager under [`CREATE_TABLE_TYPE_NAME`].
    pub fn loader(context: DdlContext) -> BoxedProcedureLoader {
        Box::new(move |value| {
            let procedure = CreateTableProcedure::from_json(value, context.clone())?;
            Ok(Box::new(procedure) as procedures::BoxedProcedure)
        })
    }

    /// The persisted state.
    pub fn data(&self) -> &CreateTableData {
        &self.data
    }

    /// Prepare: validate; if the table exists, finish with its id (`if_not_exists`) or fail.
    async fn on_prepare(&mut self, ctx: &Context) -> Result<Status> {
        let task = &self.data.task;
        task.validate()?;
        if let Some(table_id) = self.context.metadata.table_id(&task.name).await? {
            // A reservation of an earlier run of this procedure (if any) will not be used.
            if !self.first_run {
                self.context
                    .allocator
                    .release(ctx.procedure_id().as_str())
                    .await?;
            }
            if task.if_not_exists {
                return Ok(Status::done_with_output(table_id_output(table_id)));
            }
            return TableAlreadyExistsSnafu {
                table: task.name.to_string(),
                table_id: Some(table_id),
            }
            .fail();
        }
        self.data.state = CreateTableState::Allocate;
        Ok(Status::executing(false))
    }

    /// Allocate: table id, placement and WAL options, stored in the procedure's state by the engine's write of
    /// the next step (one commit; the id sequence commits only when its batch of ids runs out). An allocation already
    /// in the state is kept; one an older release reserved at `__table_allocation/{procedure_id}` is reused, and
    /// its key removed in the same commit as the state (only a procedure rebuilt from its record looks for one).
    ///
    /// A table whose metadata transaction the kv backend would refuse (too many datanodes, too large options), or
    /// whose id another table's metadata already holds (`__table_info/{id}`, after the id sequence was set back),
    /// fails here, before any region exists: the last step could never record them.
    async fn on_allocate(&mut self, ctx: &Context) -> Result<Status> {
        let procedure_id = ctx.procedure_id().as_str();
        let legacy = match &self.data.allocation {
            Some(_) => None,
            // A procedure made in this process has no reservation of an older release.
            None if self.first_run => None,
            None => {
                self.context
                    .allocator
                    .legacy_reservation(procedure_id, &self.data.task)
                    .await?
            }
        };
        let allocation = match (&self.data.allocation, &legacy) {
            (Some(allocation), _) | (None, Some(allocation)) => allocation.clone(),
            (None, None) => self.context.allocator.allocate(&self.data.task).await?,
        };
        let metadata = TableMetadata::new(&self.data.task, &allocation);
        let encoded = self.context.metadata.encode_checked(&metadata)?;
        self.context.metadata.check_table_id_free(&encoded).await?;
        if self.first_run {
            self.encoded = Some(encoded);
        }
        self.data.allocation = Some(allocation);
        self.data.state = CreateTableState::CreateRegions;
        if legacy.is_none() {
            return Ok(Status::executing(true));
        }
        Ok(Status::executing_with(StepWrites::new(
            Arc::new(KvStepStore::new(self.context.metadata.kv().clone())),
            Vec::new(),
            vec![WriteOp::Delete {
                key: allocation_key(procedure_id),
            }],
        )))
    }

    /// CreateRegions: each region on its datanode, one after the other, with a side-effect point after each. Its
    /// state is not stored on its own: the next step's commit stores the final state, and a replay from Allocate's
    /// state creates the regions again, which counts as success for regions that exist with the same options.
    async fn on_create_regions(&mut self, ctx: &Context) -> procedures::Result<Status> {
        let allocation = self.allocation()?;
        for (datanode_id, request) in region_create_requests(&self.data.task, &allocation) {
            let region_id = request.region_id;
            self.context
                .datanodes
                .create_region(datanode_id, request)
                .await?;
            ctx.side_effect_point(&format!(
                "created region {region_id} on datanode {datanode_id}"
            ))?;
        }
        self.data.state = CreateTableState::PersistDatanodeTableValue;
        Ok(Status::executing(false))
    }

    /// PersistDatanodeTableValue: every metadata key, each only if absent, handed to the engine to commit with the
    /// `done` record (one transaction when the procedure state lives in the metadata kv); done with the table id.
    /// The commit also removes a reservation an older release may have left at `__table_allocation/{id}`. Metadata
    /// already there with exactly these values (written alone by an earlier run) needs no write.
    ///
    /// On a first run (see `first_run`) nothing is read first and there is no reservation to remove: the commit's
    /// conditions alone keep another table's keys safe, and refuse the writes naming the first key present.
    async fn on_persist_metadata(&mut self, ctx: &Context) -> Result<Status> {
        let allocation = self.allocation()?;
        let output = Some(table_id_output(allocation.table_id));
        let metadata = || TableMetadata::new(&self.data.task, &allocation);
        if self.first_run {
            let encoded = match self.encoded.take() {
                Some(encoded) => encoded,
                None => self.context.metadata.encode_checked(&metadata())?,
            };
            let writes = self
                .context
                .metadata
                .first_create_table_writes(encoded, Vec::new());
            return Ok(Status::done_with(output, writes));
        }
        let metadata = metadata();
        let legacy = WriteOp::Delete {
            key: allocation_key(ctx.procedure_id().as_str()),
        };
        let writes = self
            .context
            .metadata
            .create_table_writes(&metadata, vec![legacy])
            .await?;
        Ok(Status::done_with(output, writes.unwrap_or_default()))
    }

    /// Rollback (after a failure, or a cancel): removes what this procedure made, in the reverse order of its
    /// steps, each part idempotent. Runs under the procedure's lock keys, so no other procedure creates the same
    /// table meanwhile.
    ///
    /// 1. The table's metadata, when the name maps to this procedure's table id (its last step ran; the `done`
    ///    record did not land): every key of its metadata transaction, deleted together.
    /// 2. Every region of the allocation, dropped on its datanode (absent ones count as dropped), with a
    ///    side-effect point after each.
    /// 3. The allocation's reservation (`__table_allocation/{procedure id}`).
    ///
    /// The table id stays consumed (ids are never reused). A datanode manager that cannot drop regions fails the
    /// rollback before anything is touched, naming the regions left on the datanodes.
    async fn roll_back(&mut self, ctx: &Context) -> procedures::Result<()> {
        let procedure_id = ctx.procedure_id().as_str();
        if let Some(allocation) = self.data.allocation.clone() {
            let requests = region_create_requests(&self.data.task, &allocation);
            if !requests.is_empty() && !self.context.datanodes.can_drop_regions() {
                let regions: Vec<String> = requests
                    .iter()
                    .map(|(dn, r)| format!("{} on datanode {dn}", r.region_id))
                    .collect();
                return Err(procedures::Error::external(format!(
                    "create-table {procedure_id} of {} cannot drop its regions ({}): the datanode manager does not drop regions",
                    self.data.task.name,
                    regions.join(", ")
                )));
            }
            let metadata = TableMetadata::new(&self.data.task, &allocation);
            self.delete_metadata(ctx, &metadata)
                .await
                .map_err(allocate_error)?;
            for (datanode_id, request) in requests {
                let region_id = request.region_id;
                self.context
                    .datanodes
                    .drop_region(datanode_id, region_id)
                    .await?;
                ctx.side_effect_point(&format!(
                    "dropped region {region_id} on datanode {datanode_id}"
                ))?;
            }
        }
        self.context.allocator.release(procedure_id).await?;
        Ok(())
    }

    fn allocation(&self) -> Result<TableAllocation> {
        self.data.allocation.clone().ok_or_else(|| {
            crate::ddl::error::InvalidCreateTableSnafu {
                table: self.data.task.name.to_string(),
                reason: format!(
                    "procedure state {:?} has no allocation (corrupt state)",
                    self.data.state
                ),
            }
            .build()
        })
    }
}

/// Hands a Prepare error to the engine. A request refused there — its table exists, or the request is invalid —
/// is a refusal ([`procedures::Error::refused`], typed where the error is built): nothing was done, so the engine
/// leaves no record of it, and the caller gets [`procedures::Error::ProcedureRefused`] with the kind (an HTTP API
/// answers 409 or 400 by it). Anything else (a store read failing) is an ordinary step error.
fn prepare_error(e: crate::ddl::Error) -> procedures::Error {
    use crate::ddl::Error as E;
    let refusal = match &e {
        E::TableAlreadyExists { .. } => procedures::Refusal::AlreadyExists,
        E::InvalidCreateTable { .. } | E::InvalidName { .. } | E::InvalidTableReference { .. } => {
            procedures::Refusal::InvalidRequest
        }
        _ => return e.into(),
    };
    procedures::Error::refused(refusal, e)
}

/// Hands an Allocate error to the engine. A reservation refused because another manager took the procedure over
/// halts this manager (fenced). A Kafka pool that is not ready yet is a start-up order (the pool's
/// bootstrap, or the load of its persisted names, has not happened yet in this process), never a reason to fail a
/// table for good: inside the step it is retryable, so the engine retries it with backoff (the procedure shows
/// `retrying` with the error) and each attempt loads the pool again. Outside a procedure it stays an ordinary error.
fn allocate_error(e: crate::ddl::Error) -> procedures::Error {
    match e {
        crate::ddl::Error::Wal { source }
            if matches!(*source, crate::wal::Error::TopicPoolNotReady { .. }) =>
        {
            procedures::Error::External {
                source: Box::new(crate::ddl::Error::Wal { source }),
                retryable: true,
            }
        }
        // A stale run: another manager runs the procedure now. Fatal for this manager, which halts.
        crate::ddl::Error::ProcedureFenced { own, current, .. } => procedures::Error::Fenced {
            epoch: current.parse().unwrap_or(0),
            own,
        },
        e => e.into(),
    }
}

impl CreateTableProcedure {
    /// Rollback's first part: when the name maps to this procedure's table, deletes every key of its metadata in
    /// one transaction conditioned on the name key still holding what was read and, with the allocator's epoch
    /// fence, on the procedure store's epoch being this manager's. A deposed manager's late rollback thus deletes
    /// nothing: neither the table a newer manager finished under this procedure, nor the name key of a later
    /// table of the same name. A refusal is looked at again: the epoch moved is [`crate::ddl::Error::ProcedureFenced`]
    /// (the manager halts); the name moved (deleted, or now another table's) leaves nothing of this table to
    /// delete.
    async fn delete_metadata(&self, ctx: &Context, metadata: &TableMetadata) -> Result<()> {
        use crate::kv::{Compare, Txn, TxnOp};
        let kv = self.context.metadata.kv();
        let name_key = metadata.name.key();
        let fence = match (self.context.allocator.epoch_key(), ctx.epoch()) {
            (Some(key), Some(epoch)) => Some((key.to_string(), epoch)),
            _ => None,
        };
        let Some(stored) = kv.get(name_key.as_bytes()).await? else {
            return Ok(());
        };
        let maps_here =
            serde_json::from_slice::<crate::key::table_name::TableNameValue>(&stored.value)
                .is_ok_and(|v| v.table_id == metadata.table_id());
        if !maps_here {
            return Ok(());
        }
        let mut compare = vec![Compare::ValueEquals(
            name_key.clone().into_bytes(),
            stored.value,
        )];
        if let Some((key, epoch)) = &fence {
            compare.push(Compare::ValueEquals(
                key.clone().into_bytes(),
                epoch.to_string().into_bytes(),
            ));
        }
        let success = metadata
            .encode()?
            .into_iter()
            .map(|(key, _)| TxnOp::Delete(key.into_bytes()))
            .collect();
        let deleted = kv
            .txn(Txn {
                compare,
                success,
                failure: Vec::new(),
            })
            .await?;
        if deleted.succeeded {
            ctx.side_effect_point(&format!(
                "deleted the metadata of table {}",
                metadata.table_id()
            ))?;
            return Ok(());
        }
        if let Some((key, own)) = fence {
            let current = kv
                .get(key.as_bytes())
                .await?
                .map(|kv| String::from_utf8_lossy(&kv.value).into_owned());
            if current.as_deref() != Some(own.to_string().as_str()) {
                return crate::ddl::error::ProcedureFencedSnafu {
                    procedure_id: ctx.procedure_id().to_string(),
                    key,
                    own,
                    current: current.unwrap_or_else(|| "absent".to_string()),
                }
                .fail();
            }
        }
        // The name key changed between the read and the transaction: it no longer holds this table.
        Ok(())
    }
}

#[async_trait]
impl Procedure for CreateTableProcedure {
    fn type_name(&self) -> &str {
        CREATE_TABLE_TYPE_NAME
    }

    async fn execute(&mut self, ctx: &Context) -> procedures::Result<Status> {
        match self.data.state {
            CreateTableState::Prepare => self.on_prepare(ctx).await.map_err(prepare_error),
            CreateTableState::Allocate => self.on_allocate(ctx).await.map_err(allocate_error),
            CreateTableState::CreateRegions => self.on_create_regions(ctx).await,
            CreateTableState::PersistDatanodeTableValue => {
                Ok(self.on_persist_metadata(ctx).await?)
            }
        }
    }

    fn dump(&self) -> procedures::Result<serde_json::Value> {
        Ok(serde_json::to_value(&self.data).context(CreateTableStateSnafu)?)
    }

    /// Catalog and schema shared, the table name exclusive.
    fn lock_key(&self) -> LockKey {
        let name = &self.data.task.name;
        LockKey::new([
            StringKey::Shared(format!("__catalog_lock/{}", name.catalog)),
            StringKey::Shared(format!("__schema_lock/{}/{}", name.catalog, name.schema)),
            StringKey::Exclusive(format!(
                "__table_name_lock/{}/{}/{}",
                name.catalog, name.schema, name.table
            )),
        ])
    }

    /// Create-table rolls back from Allocate on (its metadata, regions and reservation; see `docs/procedures.md`,
    /// "Cancel, pause and resume"). In Prepare nothing exists to undo (Prepare itself removes a reservation an
    /// earlier run may have left), so a request refused there fails with its own text, without a rollback.
    fn rollback_supported(&self) -> bool {
        self.data.state != CreateTableState::Prepare
    }

    async fn rollback(&mut self, ctx: &Context) -> procedures::Result<()> {
        self.roll_back(ctx).await
    }

    /// The step `execute` runs next, named after its state: `Prepare`, `Allocate`, `CreateRegions`,
    /// `PersistDatanodeTableValue`.
    fn step_name(&self) -> Option<String> {
        let name = match self.data.state {
            CreateTableState::Prepare => "Prepare",
            CreateTableState::Allocate => "Allocate",
            CreateTableState::CreateRegions => "CreateRegions",
            CreateTableState::PersistDatanodeTableValue => "PersistDatanodeTableValue",
        };
        Some(name.to_string())
    }
}
