//! [`DatanodeFailoverProcedure`]: moves every region of a failed datanode incarnation to live datanodes, one
//! [`RegionMigrationProcedure`] child per region (`docs/failover.md`).
//!
//! Steps: `Plan → Migrate → done`. Plan reads the regions the failed datanode's `__dn_table` records give it,
//! chooses for each region on a Kafka WAL the live datanode with the fewest regions (ties: the lowest id), and
//! persists that plan; a region on a raft-engine WAL cannot move (its WAL is on the failed machine) and is listed
//! as unavailable until its datanode returns. Migrate runs the children (deterministic ids, so a replay awaits
//! them instead of starting them again); each moves its region only if the route still names the failed datanode.
//! Output: `{"datanode","incarnation","moved":{region: to},"unavailable":[region]}`.
//!
//! One procedure per (datanode, incarnation) — its id is [`failover_procedure_id`] — so a datanode that fails,
//! comes back and fails again is failed over again, and a supervisor that submits twice starts it once.

use std::collections::BTreeMap;

use async_trait::async_trait;
use procedures::{
    BoxedProcedureLoader, Context, LockKey, Procedure, ProcedureId, ProcedureWithId, Status,
    StringKey,
};
use serde::{Deserialize, Serialize};
use snafu::ResultExt;

use crate::ddl::error::{
    DatanodeFailoverStateSnafu, DecodeMetadataSnafu, NoFailoverTargetSnafu, Result,
};
use crate::ddl::region::region_id;
use crate::ddl::region_migration::{
    MigrationContext, RegionMigrationProcedure, RegionMigrationTask,
};
use crate::key::datanode_table::{DatanodeTableValue, datanode_table_prefix};
use crate::kv::RangeRequest;
use crate::wal::WalOptions;

/// The type name the procedure is registered and persisted under.
pub const DATANODE_FAILOVER_TYPE_NAME: &str = "remote_wal::DatanodeFailover";

/// The id of the failover of incarnation `incarnation` of datanode `datanode_id`: `datanode_failover/{id}/{inc}`.
pub fn failover_procedure_id(datanode_id: u64, incarnation: u64) -> ProcedureId {
    ProcedureId::new(format!("datanode_failover/{datanode_id}/{incarnation}"))
}

/// Where a failover is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DatanodeFailoverState {
    /// Choose a target per region.
    Plan,
    /// Run one migration per region.
    Migrate,
    /// The migrations finished.
    Finish,
}

/// The persisted state of a failover.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatanodeFailoverData {
    /// The next step.
    pub state: DatanodeFailoverState,
    /// The failed datanode.
    pub datanode_id: u64,
    /// Its failed incarnation.
    pub incarnation: u64,
    /// Region id → the datanode it moves to (set by Plan).
    #[serde(default)]
    pub moves: BTreeMap<u64, u64>,
    /// Regions that cannot move (raft-engine WAL), set by Plan.
    #[serde(default)]
    pub unavailable: Vec<u64>,
}

/// Moves a failed datanode's regions. See the module documentation.
#[derive(Debug)]
pub struct DatanodeFailoverProcedure {
    context: MigrationContext,
    data: DatanodeFailoverData,
}

impl DatanodeFailoverProcedure {
    /// A failover of incarnation `incarnation` of datanode `datanode_id`.
    pub fn new(datanode_id: u64, incarnation: u64, context: MigrationContext) -> Self {
        DatanodeFailoverProcedure {
            context,
            data: DatanodeFailoverData {
                state: DatanodeFailoverState::Plan,
                datanode_id,
                incarnation,
                moves: BTreeMap::new(),
                unavailable: Vec::new(),
            },
        }
    }

    /// Rebuilds a procedure from its persisted state.
    pub fn from_json(value: serde_json::Value, context: MigrationContext) -> Result<Self> {
        let data = serde_json::from_value(value).context(DatanodeFailoverStateSnafu)?;
        Ok(DatanodeFailoverProcedure { context, data })
    }

    /// The loader to register with a procedure manager under [`DATANODE_FAILOVER_TYPE_NAME`].
    pub fn loader(context: MigrationContext) -> BoxedProcedureLoader {
        Box::new(move |value| {
            let procedure = DatanodeFailoverProcedure::from_json(value, context.clone())?;
            Ok(Box::new(procedure) as procedures::BoxedProcedure)
        })
    }

    /// The persisted state.
    pub fn data(&self) -> &DatanodeFailoverData {
        &self.data
    }

    /// The `__dn_table` records of `datanode_id`.
    async fn records(&self, datanode_id: u64) -> Result<Vec<DatanodeTableValue>> {
        let kv = self.context.metadata.kv();
        let found = crate::kv::range_all(
            kv.as_ref(),
            RangeRequest::prefix(datanode_table_prefix(datanode_id)),
            256,
        )
        .await?;
        found
            .into_iter()
            .map(|kv| {
                let key = String::from_utf8_lossy(&kv.key).into_owned();
                serde_json::from_slice(&kv.value).context(DecodeMetadataSnafu { key })
            })
            .collect()
    }

    /// Plan: a live target per region on a Kafka WAL, the least loaded first.
    async fn on_plan(&mut self) -> Result<Status> {
        let failed = self.data.datanode_id;
        let mut movable = Vec::new();
        let mut unavailable = Vec::new();
        for record in self.records(failed).await? {
            for number in &record.regions {
                let id = region_id(record.table_id, *number);
                let kafka = record
                    .region_wal_options
                    .get(number)
                    .and_then(|w| WalOptions::decode(w).ok())
                    .is_some_and(|w| matches!(w, WalOptions::Kafka(_)));
                if kafka {
                    movable.push(id);
                } else {
                    unavailable.push(id);
                }
            }
        }
        movable.sort_unstable();
        unavailable.sort_unstable();
        let mut load: BTreeMap<u64, usize> = BTreeMap::new();
        if !movable.is_empty() {
            let live: Vec<u64> = self
                .context
                .leadership
                .live_datanodes()
                .await
                .into_iter()
                .filter(|d| *d != failed && self.context.datanode_ids.contains(d))
                .collect();
            snafu::ensure!(
                !live.is_empty(),
                NoFailoverTargetSnafu {
                    datanode_id: failed,
                    regions: movable.len(),
                }
            );
            for d in live {
                let regions = self.records(d).await?.iter().map(|r| r.regions.len()).sum();
                load.insert(d, regions);
            }
        }
        let mut moves = BTreeMap::new();
        for region in movable {
            let Some((&target, _)) = load.iter().min_by_key(|(d, n)| (**n, **d)) else {
                break;
            };
            *load.entry(target).or_default() += 1;
            moves.insert(region, target);
        }
        self.data.moves = moves;
        self.data.unavailable = unavailable;
        self.data.state = DatanodeFailoverState::Migrate;
        Ok(Status::executing(true))
    }

    /// Migrate: one child per region, each moving it only from the failed datanode.
    fn on_migrate(&mut self, ctx: &Context) -> Status {
        self.data.state = DatanodeFailoverState::Finish;
        if self.data.moves.is_empty() {
            return Status::executing(true);
        }
        let children = self
            .data
            .moves
            .iter()
            .map(|(region, to)| {
                ProcedureWithId::new(
                    ctx.procedure_id().child(format!("region-{region}")),
                    Box::new(RegionMigrationProcedure::new(
                        RegionMigrationTask {
                            region_id: *region,
                            to: *to,
                            only_from: Some(self.data.datanode_id),
                        },
                        self.context.clone(),
                    )),
                )
            })
            .collect();
        Status::Suspended {
            subprocedures: children,
            persist: true,
        }
    }

    fn output(&self) -> procedures::Output {
        serde_json::json!({
            "datanode": self.data.datanode_id,
            "incarnation": self.data.incarnation,
            "moved": self.data.moves.iter().map(|(r, to)| (r.to_string(), *to)).collect::<BTreeMap<_, _>>(),
            "unavailable": self.data.unavailable,
        })
    }
}

#[async_trait]
impl Procedure for DatanodeFailoverProcedure {
    fn type_name(&self) -> &str {
        DATANODE_FAILOVER_TYPE_NAME
    }

    async fn execute(&mut self, ctx: &Context) -> procedures::Result<Status> {
        match self.data.state {
            DatanodeFailoverState::Plan => Ok(self.on_plan().await?),
            DatanodeFailoverState::Migrate => Ok(self.on_migrate(ctx)),
            DatanodeFailoverState::Finish => Ok(Status::done_with_output(self.output())),
        }
    }

    fn dump(&self) -> procedures::Result<serde_json::Value> {
        Ok(serde_json::to_value(&self.data).context(DatanodeFailoverStateSnafu)?)
    }

    /// The failed datanode exclusive: one failover of it at a time.
    fn lock_key(&self) -> LockKey {
        LockKey::new([StringKey::Exclusive(format!(
            "__datanode_failover_lock/{}",
            self.data.datanode_id
        ))])
    }

    /// Nothing to undo: Plan writes only the procedure's state, and each child goes forward once its route moved.
    fn rollback_supported(&self) -> bool {
        false
    }

    /// `Plan`, `Migrate`, `Finish`.
    fn step_name(&self) -> Option<String> {
        let name = match self.data.state {
            DatanodeFailoverState::Plan => "Plan",
            DatanodeFailoverState::Migrate => "Migrate",
            DatanodeFailoverState::Finish => "Finish",
        };
        Some(name.to_string())
    }
}
