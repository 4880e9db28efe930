//! [`RegionMigrationProcedure`]: moves a region's leadership to another datanode, as a persisted, resumable
//! procedure (`docs/failover.md`).
//!
//! Steps, in order: `Prepare → UpdateRoute → WaitLeader → done` (output `{"region_id","from","to","epoch"}`).
//!
//! - **Prepare** reads the route: the region's datanode (`from`) and region epoch. A region already on the target
//!   finishes at once. Only a region on a Kafka WAL can move (a raft-engine WAL lives on its datanode's disk);
//!   an unknown region or target is refused before anything is written.
//! - **UpdateRoute** writes, in one transaction, the route naming `to` at epoch + 1 and the region moved from
//!   `from`'s `__dn_table` record to `to`'s, each on the condition that the keys still hold what was read and that
//!   the procedure store's epoch is the running manager's (a deposed manager writes nothing); another migration
//!   of the same table that moved first makes it read and try again. Its state is stored after the write, and a
//!   replay that finds the route moved already goes on. From that transaction on, the metasrv's registry stops leasing
//!   the region to `from` and tells it to close the region; it opens the region on `to` and leases it there only
//!   once every leader lease `from` held on it has run out (`DatanodeRegistry::heartbeat`), so `to`'s replay
//!   holds every entry `from` acknowledged: a datanode acknowledges an append only if the WAL took it before its
//!   lease's deadline.
//! - **WaitLeader** waits until `to` reports the region as leader at the new epoch with a live lease: it looks every
//!   100 ms for up to 10 s per attempt, then hands the engine a retryable error (the engine's retries give it more
//!   attempts). When `to` is declared failed meanwhile (its failover retired it), the migration fails for good
//!   (`MigrationTargetFailed`): `to` will never lead, and ending releases the region's lock for the failover's own
//!   migration of the region, which the route now lists under `to`.
//!
//! Nothing durable happens before UpdateRoute's transaction, and after it the only way is forward (the route names the
//! new datanode), so the procedure has no rollback: a cancel before it leaves everything as it was, one
//! after it leaves the region moving to `to`, which opens it when it can.
//!
//! Locks: the region exclusive (one migration of a region at a time) and its table id shared.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use procedures::{BoxedProcedureLoader, Context, LockKey, Procedure, Status, StringKey};
use serde::{Deserialize, Serialize};
use snafu::ResultExt;

use crate::ddl::error::{
    DecodeMetadataSnafu, InvalidRegionMigrationSnafu, MigrationTargetFailedSnafu,
    ProcedureFencedSnafu, RegionMigrationStateSnafu, RegionNotLeadingYetSnafu, Result,
};
use crate::ddl::metadata_manager::TableMetadataManagerRef;
use crate::ddl::region::{region_number, region_table_id};
use crate::key::datanode_table::{DatanodeTableValue, datanode_table_key};
use crate::key::table_route::{TableRouteValue, table_route_key};
use crate::kv::{Compare, Txn, TxnOp};
use crate::wal::WalOptions;

/// How many times UpdateRoute reads and tries its transaction again when another migration of the same table
/// changed the route first.
const UPDATE_ATTEMPTS: usize = 16;

/// How often WaitLeader looks whether the target leads.
const LEADER_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// How long one attempt of WaitLeader looks before it hands the engine a retryable error.
const LEADER_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The type name the procedure is registered and persisted under.
pub const REGION_MIGRATION_TYPE_NAME: &str = "remote_wal::RegionMigration";

/// What the metasrv leader knows of the datanodes from their heartbeats: who leads a region, who is alive.
#[async_trait]
pub trait RegionLeadership: Send + Sync + fmt::Debug {
    /// The datanode leading `region_id` now and the region epoch it leads at; `None` when none does.
    async fn region_leader(&self, region_id: u64) -> Option<(u64, u64)>;

    /// The datanodes that heartbeat to this leader and are not suspected of having failed, by id.
    async fn live_datanodes(&self) -> Vec<u64>;

    /// Whether `datanode_id`'s incarnation was declared failed (retired by a failover): it will never lead a region
    /// again. `false` by default (no failure detection).
    async fn has_failed(&self, datanode_id: u64) -> bool {
        let _ = datanode_id;
        false
    }
}

/// What a region migration runs against. Cheap to clone.
#[derive(Clone, Debug)]
pub struct MigrationContext {
    /// Table metadata in the kv backend.
    pub metadata: TableMetadataManagerRef,
    /// The datanodes a region may move to (`[datanodes] ids`).
    pub datanode_ids: Vec<u64>,
    /// Who leads each region.
    pub leadership: Arc<dyn RegionLeadership>,
    /// The procedure store's epoch key in the same kv (a metasrv's `__procedure__/epoch`), when the procedure
    /// state lives there: every route change is conditioned on it holding the running manager's epoch.
    pub epoch_key: Option<String>,
}

/// A request to move a region.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionMigrationTask {
    /// The region.
    pub region_id: u64,
    /// The datanode it is to lead on.
    pub to: u64,
    /// Move it only from this datanode: a region the route gives another datanode by the time Prepare runs is
    /// left where it is (a failover's child, whose region moved meanwhile). `None`: from wherever it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub only_from: Option<u64>,
}

/// Where a region migration is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RegionMigrationState {
    /// Read the route; validate.
    Prepare,
    /// Move the route and the `__dn_table` records in one transaction.
    UpdateRoute,
    /// Wait until the target leads the region at the new epoch.
    WaitLeader,
}

/// The persisted state of a region migration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionMigrationData {
    /// The next step.
    pub state: RegionMigrationState,
    /// The request.
    pub task: RegionMigrationTask,
    /// The datanode the route named when Prepare ran.
    #[serde(default)]
    pub from: Option<u64>,
    /// The region epoch then.
    #[serde(default)]
    pub old_epoch: u64,
    /// The region epoch on the target: `old_epoch + 1`.
    #[serde(default)]
    pub new_epoch: u64,
}

/// The procedure's output.
fn output(data: &RegionMigrationData, epoch: u64) -> procedures::Output {
    serde_json::json!({
        "region_id": data.task.region_id,
        "from": data.from,
        "to": data.task.to,
        "epoch": epoch,
    })
}

/// The output of a migration that left the region where it was (its route names `at`, not the source asked for).
fn left_output(data: &RegionMigrationData, at: u64, epoch: u64) -> procedures::Output {
    serde_json::json!({
        "region_id": data.task.region_id,
        "from": at,
        "to": data.task.to,
        "epoch": epoch,
        "left": format!("the route names datanode {at}, not {:?}", data.task.only_from),
    })
}

/// Moves one region. See the module documentation.
#[derive(Debug)]
pub struct RegionMigrationProcedure {
    context: MigrationContext,
    data: RegionMigrationData,
}

impl RegionMigrationProcedure {
    /// A new procedure for `task`.
    pub fn new(task: RegionMigrationTask, context: MigrationContext) -> Self {
        RegionMigrationProcedure {
            context,
            data: RegionMigrationData {
                state: RegionMigrationState::Prepare,
                task,
                from: None,
                old_epoch: 0,
                new_epoch: 0,
            },
        }
    }

    /// Rebuilds a procedure from its persisted state.
    pub fn from_json(value: serde_json::Value, context: MigrationContext) -> Result<Self> {
        let data = serde_json::from_value(value).context(RegionMigrationStateSnafu)?;
        Ok(RegionMigrationProcedure { context, data })
    }

    /// The loader to register with a procedure manager under [`REGION_MIGRATION_TYPE_NAME`].
    pub fn loader(context: MigrationContext) -> BoxedProcedureLoader {
        Box::new(move |value| {
            let procedure = RegionMigrationProcedure::from_json(value, context.clone())?;
            Ok(Box::new(procedure) as procedures::BoxedProcedure)
        })
    }

    /// The persisted state.
    pub fn data(&self) -> &RegionMigrationData {
        &self.data
    }

    fn refuse(&self, reason: impl Into<String>) -> crate::ddl::Error {
        InvalidRegionMigrationSnafu {
            region_id: self.data.task.region_id,
            to: self.data.task.to,
            reason: reason.into(),
        }
        .build()
    }

    /// The route of the region's table, with the bytes read (for the commit's condition).
    async fn route(&self) -> Result<(Vec<u8>, TableRouteValue)> {
        let table_id = region_table_id(self.data.task.region_id);
        let key = table_route_key(table_id);
        let Some(found) = self.context.metadata.kv().get(key.as_bytes()).await? else {
            return Err(self.refuse(format!("table {table_id} does not exist")));
        };
        let route = serde_json::from_slice(&found.value).context(DecodeMetadataSnafu { key })?;
        Ok((found.value, route))
    }

    /// `datanode_id`'s record of the region's table, with the bytes read.
    async fn datanode_table(
        &self,
        datanode_id: u64,
    ) -> Result<Option<(Vec<u8>, DatanodeTableValue)>> {
        let key = datanode_table_key(datanode_id, region_table_id(self.data.task.region_id));
        match self.context.metadata.kv().get(key.as_bytes()).await? {
            None => Ok(None),
            Some(found) => {
                let value =
                    serde_json::from_slice(&found.value).context(DecodeMetadataSnafu { key })?;
                Ok(Some((found.value, value)))
            }
        }
    }

    /// Whether `task` can be carried out now: the datanode the route names for its region and the region epoch,
    /// or the error refusing it (an unknown datanode, table or region, a region on a raft-engine WAL). What
    /// Prepare checks; a caller that answers before the procedure runs (`POST /v1/regions/{id}/migrate` with
    /// `"wait":false`) checks it first so that a refusal is never answered 202.
    pub async fn check(task: RegionMigrationTask, context: MigrationContext) -> Result<(u64, u64)> {
        let mut probe = RegionMigrationProcedure::new(task, context);
        probe.on_prepare().await?;
        Ok((
            probe.data.from.unwrap_or(probe.data.task.to),
            probe.data.old_epoch,
        ))
    }

    /// Prepare: the region's datanode and epoch; done at once when it is on the target already.
    async fn on_prepare(&mut self) -> Result<Status> {
        let task = self.data.task.clone();
        if !self.context.datanode_ids.contains(&task.to) {
            return Err(self.refuse(format!(
                "datanode {} is not one of the datanodes {:?}",
                task.to, self.context.datanode_ids
            )));
        }
        let number = region_number(task.region_id);
        let (_, route) = self.route().await?;
        let Some(&from) = route.region_routes.get(&number) else {
            return Err(self.refuse(format!(
                "table {} has no region number {number}",
                region_table_id(task.region_id)
            )));
        };
        let epoch = route.region_epoch(number);
        self.data.from = Some(from);
        self.data.old_epoch = epoch;
        self.data.new_epoch = epoch + 1;
        if from == task.to {
            return Ok(Status::done_with_output(output(&self.data, epoch)));
        }
        if task.only_from.is_some_and(|only| only != from) {
            return Ok(Status::done_with_output(left_output(
                &self.data, from, epoch,
            )));
        }
        let wal = self
            .datanode_table(from)
            .await?
            .and_then(|(_, value)| value.region_wal_options.get(&number).cloned());
        match wal.as_deref().map(WalOptions::decode) {
            Some(Ok(WalOptions::Kafka(_))) => {}
            Some(Ok(_)) | None => {
                return Err(self.refuse(format!(
                    "its WAL is raft-engine, on datanode {from}'s disk; only a region on a Kafka WAL can move"
                )));
            }
            Some(Err(e)) => return Err(e.into()),
        }
        self.data.state = RegionMigrationState::UpdateRoute;
        Ok(Status::executing(true))
    }

    /// UpdateRoute: the route and both `__dn_table` records in one transaction, each on the condition that it
    /// holds what was read, and — with an epoch fence ([`MigrationContext::epoch_key`]) — that the procedure
    /// store's epoch is still the one of the manager running the step, so a deposed manager's late run writes
    /// nothing. A transaction that loses to another migration of the same table (which moved another region of
    /// the route meanwhile) is read and tried again. A route already naming the target at the new epoch (an
    /// earlier run's write landed, its state did not) needs no write. The state is stored after the write.
    async fn on_update_route(&mut self, ctx: &Context) -> Result<Status> {
        for _ in 0..UPDATE_ATTEMPTS {
            let Some(txn) = self.route_txn(ctx).await? else {
                self.data.state = RegionMigrationState::WaitLeader;
                return Ok(Status::executing(true));
            };
            let fenced = txn.compare.len() == 4;
            let resp = self.context.metadata.kv().txn(txn).await?;
            if resp.succeeded {
                ctx.side_effect_point(&format!(
                    "moved region {} to datanode {} at epoch {}",
                    self.data.task.region_id, self.data.task.to, self.data.new_epoch
                ))?;
                self.data.state = RegionMigrationState::WaitLeader;
                return Ok(Status::executing(true));
            }
            if fenced {
                self.ensure_epoch(ctx).await?;
            }
        }
        Err(self.refuse(format!(
            "the route of its table kept changing under {UPDATE_ATTEMPTS} attempts to move it"
        )))
    }

    /// The manager's epoch is still the store's, or the error saying a newer manager runs the procedure.
    async fn ensure_epoch(&self, ctx: &Context) -> Result<()> {
        let (Some(key), Some(own)) = (&self.context.epoch_key, ctx.epoch()) else {
            return Ok(());
        };
        let current = self.context.metadata.kv().get(key.as_bytes()).await?;
        let current = current.map(|kv| String::from_utf8_lossy(&kv.value).into_owned());
        if current.as_deref() == Some(own.to_string().as_str()) {
            return Ok(());
        }
        ProcedureFencedSnafu {
            procedure_id: ctx.procedure_id().to_string(),
            key: table_route_key(region_table_id(self.data.task.region_id)),
            own,
            current: current.unwrap_or_else(|| "absent".to_string()),
        }
        .fail()
    }

    /// The transaction moving the region as the keys stand now; `None` when the route already names the target
    /// at the new epoch.
    async fn route_txn(&self, ctx: &Context) -> Result<Option<Txn>> {
        let task = self.data.task.clone();
        let number = region_number(task.region_id);
        let table_id = region_table_id(task.region_id);
        let from = self
            .data
            .from
            .ok_or_else(|| self.refuse("its state names no source"))?;
        let (route_bytes, route) = self.route().await?;
        let now_at = route.region_routes.get(&number).copied();
        let epoch = route.region_epoch(number);
        if now_at == Some(task.to) && epoch >= self.data.new_epoch {
            return Ok(None);
        }
        if now_at != Some(from) || epoch != self.data.old_epoch {
            return Err(self.refuse(format!(
                "the route changed since the migration started: it names datanode {now_at:?} at epoch {epoch}, \
                 not datanode {from} at epoch {}",
                self.data.old_epoch
            )));
        }
        let Some((from_bytes, mut from_value)) = self.datanode_table(from).await? else {
            return Err(self.refuse(format!("datanode {from} has no record of table {table_id}")));
        };
        let wal = from_value.region_wal_options.get(&number).cloned();
        let target = self.datanode_table(task.to).await?;

        let mut next_route = route.clone();
        next_route.region_routes.insert(number, task.to);
        next_route.region_epochs.insert(number, self.data.new_epoch);
        next_route.version += 1;

        let from_key = datanode_table_key(from, table_id).into_bytes();
        let to_key = datanode_table_key(task.to, table_id).into_bytes();
        let route_key = table_route_key(table_id).into_bytes();
        let mut compare = vec![
            Compare::ValueEquals(route_key.clone(), route_bytes),
            Compare::ValueEquals(from_key.clone(), from_bytes),
        ];
        let mut success = vec![TxnOp::Put(route_key, encode(&next_route)?)];

        let template = from_value.clone();
        from_value.regions.retain(|r| *r != number);
        from_value.region_wal_options.remove(&number);
        from_value.version += 1;
        if from_value.regions.is_empty() {
            success.push(TxnOp::Delete(from_key));
        } else {
            success.push(TxnOp::Put(from_key, encode(&from_value)?));
        }

        let mut to_value = match target {
            Some((bytes, value)) => {
                compare.push(Compare::ValueEquals(to_key.clone(), bytes));
                value
            }
            None => {
                compare.push(Compare::Absent(to_key.clone()));
                DatanodeTableValue {
                    regions: Vec::new(),
                    region_wal_options: BTreeMap::new(),
                    version: 0,
                    ..template
                }
            }
        };
        if !to_value.regions.contains(&number) {
            to_value.regions.push(number);
            to_value.regions.sort_unstable();
        }
        if let Some(wal) = wal {
            to_value.region_wal_options.insert(number, wal);
        }
        to_value.version += 1;
        success.push(TxnOp::Put(to_key, encode(&to_value)?));
        if let (Some(key), Some(epoch)) = (&self.context.epoch_key, ctx.epoch()) {
            compare.push(Compare::ValueEquals(
                key.clone().into_bytes(),
                epoch.to_string().into_bytes(),
            ));
        }
        Ok(Some(Txn {
            compare,
            success,
            failure: Vec::new(),
        }))
    }

    /// WaitLeader: done once the target leads the region at the new epoch. Looks every [`LEADER_POLL`] for up to
    /// [`LEADER_WAIT`] (the target opens the region only once the old leader's lease ran out, and replays it), then
    /// hands a retryable error to the engine, whose retries give it more such rounds; a halted manager stops at
    /// once.
    async fn on_wait_leader(&mut self, ctx: &Context) -> Result<Status> {
        let task = self.data.task.clone();
        let deadline = tokio::time::Instant::now() + LEADER_WAIT;
        let leader = loop {
            let leader = self.context.leadership.region_leader(task.region_id).await;
            let done = leader.is_some_and(|(datanode, epoch)| {
                datanode == task.to && epoch >= self.data.new_epoch
            });
            if done || ctx.is_halted() || tokio::time::Instant::now() >= deadline {
                break leader;
            }
            if self.context.leadership.has_failed(task.to).await {
                // It will never lead: end here, releasing the region's lock for the failover's own migration of
                // the region (its target's failover lists it, the route naming the failed datanode).
                return MigrationTargetFailedSnafu {
                    region_id: task.region_id,
                    to: task.to,
                    epoch: self.data.new_epoch,
                }
                .fail();
            }
            tokio::time::sleep(LEADER_POLL).await;
        };
        match leader {
            Some((datanode, epoch)) if datanode == task.to && epoch >= self.data.new_epoch => {
                Ok(Status::done_with_output(output(&self.data, epoch)))
            }
            _ => RegionNotLeadingYetSnafu {
                region_id: task.region_id,
                to: task.to,
                epoch: self.data.new_epoch,
                seen: match leader {
                    None => "no datanode leads it".to_string(),
                    Some((d, e)) => format!("datanode {d} leads it at epoch {e}"),
                },
            }
            .fail(),
        }
    }
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(value).context(RegionMigrationStateSnafu)
}

/// A request refused in Prepare leaves no record (see `procedures::Error::refused`).
fn prepare_error(e: crate::ddl::Error) -> procedures::Error {
    match e {
        e @ crate::ddl::Error::InvalidRegionMigration { .. } => {
            procedures::Error::refused(procedures::Refusal::InvalidRequest, e)
        }
        e => e.into(),
    }
}

/// A route change refused by the epoch fence halts the manager (a newer one runs the procedure now).
fn update_route_error(e: crate::ddl::Error) -> procedures::Error {
    match e {
        crate::ddl::Error::ProcedureFenced { own, current, .. } => procedures::Error::Fenced {
            epoch: current.parse().unwrap_or(0),
            own,
        },
        e => e.into(),
    }
}

#[async_trait]
impl Procedure for RegionMigrationProcedure {
    fn type_name(&self) -> &str {
        REGION_MIGRATION_TYPE_NAME
    }

    async fn execute(&mut self, ctx: &Context) -> procedures::Result<Status> {
        match self.data.state {
            RegionMigrationState::Prepare => self.on_prepare().await.map_err(prepare_error),
            RegionMigrationState::UpdateRoute => {
                self.on_update_route(ctx).await.map_err(update_route_error)
            }
            RegionMigrationState::WaitLeader => Ok(self.on_wait_leader(ctx).await?),
        }
    }

    fn dump(&self) -> procedures::Result<serde_json::Value> {
        Ok(serde_json::to_value(&self.data).context(RegionMigrationStateSnafu)?)
    }

    /// The region exclusive, its table id shared.
    fn lock_key(&self) -> LockKey {
        let region_id = self.data.task.region_id;
        LockKey::new([
            StringKey::Shared(format!("__table_id_lock/{}", region_table_id(region_id))),
            StringKey::Exclusive(format!("__region_lock/{region_id}")),
        ])
    }

    /// Nothing to undo: nothing durable happens before UpdateRoute's commit, and after it only forward.
    fn rollback_supported(&self) -> bool {
        false
    }

    /// `Prepare`, `UpdateRoute`, `WaitLeader`.
    fn step_name(&self) -> Option<String> {
        let name = match self.data.state {
            RegionMigrationState::Prepare => "Prepare",
            RegionMigrationState::UpdateRoute => "UpdateRoute",
            RegionMigrationState::WaitLeader => "WaitLeader",
        };
        Some(name.to_string())
    }
}
