//! [`TableMetadataAllocator`]: a new table's id, the placement of its regions and their WAL options.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use snafu::{ResultExt, ensure};

use crate::ddl::error::{
    DecodeMetadataSnafu, EncodeMetadataSnafu, InvalidCreateTableSnafu, ProcedureFencedSnafu,
    Result, WalOptionsCountSnafu,
};
use crate::ddl::peer::PeerSelectorRef;
use crate::ddl::sequence::Sequence;
use crate::ddl::task::CreateTableTask;
use crate::ddl::wal_source::WalOptionsSourceRef;
use crate::kv::{Compare, CompareAndPutRequest, KvBackendRef, Txn, TxnOp, TxnOpResponse};

/// Key of the table id sequence.
pub const TABLE_ID_SEQ_KEY: &str = "__table_id_seq";

/// The first table id handed out (ids below are left for system tables, as in GreptimeDB).
pub const MIN_USER_TABLE_ID: u32 = 1024;

/// How many table ids one sequence reservation takes at least (more when more callers wait at once, see
/// [`Sequence`]).
pub const TABLE_ID_STEP: u64 = 10;

pub use crate::key::table_allocation::{ALLOCATION_KEY_PREFIX, allocation_key};

/// What was allocated for one new table. The create-table procedure persists it before using any of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableAllocation {
    /// The table's id.
    pub table_id: u32,
    /// Region number → datanode id.
    pub region_routes: BTreeMap<u32, u64>,
    /// Region number → encoded WAL options.
    pub region_wal_options: BTreeMap<u32, String>,
}

/// Allocates table ids (from a kv-backed sequence), region placement and WAL options.
#[derive(Debug)]
pub struct TableMetadataAllocator {
    kv: KvBackendRef,
    table_ids: Sequence,
    peers: PeerSelectorRef,
    wal: WalOptionsSourceRef,
    /// The kv key of the procedure manager's epoch, when the procedure store lives in the same kv: reservations
    /// are then written only while it holds the running manager's epoch.
    epoch_key: Option<String>,
}

/// A shared [`TableMetadataAllocator`].
pub type TableMetadataAllocatorRef = Arc<TableMetadataAllocator>;

impl TableMetadataAllocator {
    /// An allocator whose table ids come from `__table_id_seq` in `kv`, starting at [`MIN_USER_TABLE_ID`].
    pub fn new(kv: KvBackendRef, peers: PeerSelectorRef, wal: WalOptionsSourceRef) -> Self {
        Self::with_sequence(
            kv.clone(),
            Sequence::new(
                kv,
                TABLE_ID_SEQ_KEY,
                u64::from(MIN_USER_TABLE_ID),
                TABLE_ID_STEP,
                u64::from(u32::MAX),
            ),
            peers,
            wal,
        )
    }

    /// An allocator with its own table id sequence; reservations go to `kv`.
    pub fn with_sequence(
        kv: KvBackendRef,
        table_ids: Sequence,
        peers: PeerSelectorRef,
        wal: WalOptionsSourceRef,
    ) -> Self {
        TableMetadataAllocator {
            kv,
            table_ids,
            peers,
            wal,
            epoch_key: None,
        }
    }

    /// Fences reservations by the procedure manager's epoch, stored in the same kv at `epoch_key` (for a metasrv:
    /// `__procedure__/epoch`). A reservation is then written only while that key holds the epoch of the manager
    /// running the step ([`procedures::Context::epoch`]): a stale run of Allocate by a manager another one has
    /// fenced cannot leave a reservation behind (a reservation written before the newer manager claimed the epoch
    /// is found and reused by its replay of Allocate).
    pub fn with_epoch_fence(mut self, epoch_key: impl Into<String>) -> Self {
        self.epoch_key = Some(epoch_key.into());
        self
    }

    /// The kv key holding the procedure manager's epoch, when reservations are fenced by it
    /// ([`TableMetadataAllocator::with_epoch_fence`]); other writes of a create-table fence themselves with it too.
    pub fn epoch_key(&self) -> Option<&str> {
        self.epoch_key.as_deref()
    }

    /// A fresh table id (never handed out before, by any allocator on the same kv).
    pub async fn next_table_id(&self) -> Result<u32> {
        let id = self.table_ids.next().await?;
        // The sequence's maximum is u32::MAX, so this conversion cannot fail; keep the error path anyway.
        u32::try_from(id).map_err(|_| {
            crate::ddl::error::SequenceExhaustedSnafu {
                key: self.table_ids.key().to_string(),
                next: id,
                max: u64::from(u32::MAX),
            }
            .build()
        })
    }

    /// Everything a new table needs: id, one datanode per region, one WAL option per region. A WAL source that is
    /// not ready yet is first given the chance to load what is persisted (a pool bootstrapped meanwhile).
    pub async fn allocate(&self, task: &CreateTableTask) -> Result<TableAllocation> {
        let n = task.num_regions as usize;
        self.wal.load_if_needed().await?;
        let peers = self.peers.select(n)?;
        ensure!(
            peers.len() == n,
            InvalidCreateTableSnafu {
                table: task.name.to_string(),
                reason: format!("the peer selector placed {} of {n} regions", peers.len()),
            }
        );
        let wal = self.wal.alloc_batch(n)?;
        ensure!(
            wal.len() == n,
            WalOptionsCountSnafu {
                table: task.name.to_string(),
                wanted: n,
                got: wal.len(),
            }
        );
        let table_id = self.next_table_id().await?;
        Ok(TableAllocation {
            table_id,
            region_routes: (0..task.num_regions).zip(peers).collect(),
            region_wal_options: (0..task.num_regions)
                .zip(wal.iter().map(|w| w.encode()))
                .collect(),
        })
    }

    /// The allocation of procedure `procedure_id` for `task`, made at most once: the first call allocates and
    /// reserves it in the kv (`__table_allocation/{procedure_id}`, put-if-absent); every later call — a replay
    /// after a crash, by any process — returns the reserved one. [`TableMetadataAllocator::release`] removes the
    /// reservation once the table's metadata holds it.
    pub async fn allocate_once(
        &self,
        procedure_id: &str,
        task: &CreateTableTask,
    ) -> Result<TableAllocation> {
        self.allocate_once_fenced(procedure_id, task, None).await
    }

    /// [`TableMetadataAllocator::allocate_once`] for a step run by the manager of epoch `epoch`: with an epoch
    /// fence ([`TableMetadataAllocator::with_epoch_fence`]) the reservation is written only while the store's
    /// epoch is `epoch`, else the error is [`crate::ddl::Error::ProcedureFenced`] and nothing is written.
    pub async fn allocate_once_fenced(
        &self,
        procedure_id: &str,
        task: &CreateTableTask,
        epoch: Option<u64>,
    ) -> Result<TableAllocation> {
        let key = allocation_key(procedure_id);
        if let Some(kv) = self.kv.get(key.as_bytes()).await? {
            return self.reserved(&key, &kv.value, task);
        }
        let allocation = self.allocate(task).await?;
        let value =
            serde_json::to_vec(&allocation).context(EncodeMetadataSnafu { key: key.clone() })?;
        if let (Some(epoch_key), Some(epoch)) = (&self.epoch_key, epoch) {
            return self
                .reserve_fenced(
                    procedure_id,
                    &key,
                    value,
                    allocation,
                    task,
                    epoch_key,
                    epoch,
                )
                .await;
        }
        let resp = self
            .kv
            .compare_and_put(CompareAndPutRequest {
                key: key.clone().into_bytes(),
                expect: None,
                value,
            })
            .await?;
        match resp.prev_kv {
            Some(prev) if !resp.success => self.reserved(&key, &prev.value, task),
            _ => Ok(allocation),
        }
    }

    /// Writes the reservation if it is absent and `epoch_key` holds `epoch`, in one transaction.
    #[allow(clippy::too_many_arguments)]
    async fn reserve_fenced(
        &self,
        procedure_id: &str,
        key: &str,
        value: Vec<u8>,
        allocation: TableAllocation,
        task: &CreateTableTask,
        epoch_key: &str,
        epoch: u64,
    ) -> Result<TableAllocation> {
        let resp = self
            .kv
            .txn(Txn {
                compare: vec![
                    Compare::ValueEquals(
                        epoch_key.as_bytes().to_vec(),
                        epoch.to_string().into_bytes(),
                    ),
                    Compare::Absent(key.as_bytes().to_vec()),
                ],
                success: vec![TxnOp::Put(key.as_bytes().to_vec(), value)],
                failure: vec![
                    TxnOp::Get(epoch_key.as_bytes().to_vec()),
                    TxnOp::Get(key.as_bytes().to_vec()),
                ],
            })
            .await?;
        if resp.succeeded {
            return Ok(allocation);
        }
        let read = |i: usize| match resp.responses.get(i) {
            Some(TxnOpResponse::Get(kv)) => kv.as_ref().map(|kv| kv.value.clone()),
            _ => None,
        };
        let current = read(0);
        if current.as_deref() != Some(epoch.to_string().as_bytes()) {
            return ProcedureFencedSnafu {
                procedure_id,
                key,
                own: epoch,
                current: current
                    .map(|v| String::from_utf8_lossy(&v).to_string())
                    .unwrap_or_else(|| "absent".to_string()),
            }
            .fail();
        }
        match read(1) {
            // Reserved meanwhile by a run of the same procedure under this epoch: use that one.
            Some(existing) => self.reserved(key, &existing, task),
            None => InvalidCreateTableSnafu {
                table: task.name.to_string(),
                reason: format!(
                    "the reservation transaction on '{key}' was refused, yet the epoch and the key look unchanged"
                ),
            }
            .fail(),
        }
    }

    /// The allocation an earlier release reserved for procedure `procedure_id` at `__table_allocation/{id}`, if
    /// any. Create-table now keeps its allocation in its procedure state only; a procedure an older release started
    /// (and crashed in Allocate, after its reservation) resumes with the reserved allocation instead of a new one.
    pub async fn legacy_reservation(
        &self,
        procedure_id: &str,
        task: &CreateTableTask,
    ) -> Result<Option<TableAllocation>> {
        let key = allocation_key(procedure_id);
        match self.kv.get(key.as_bytes()).await? {
            Some(kv) => self.reserved(&key, &kv.value, task).map(Some),
            None => Ok(None),
        }
    }

    /// Removes the reservation of procedure `procedure_id` (absent is fine).
    pub async fn release(&self, procedure_id: &str) -> Result<()> {
        self.kv
            .batch_delete(&[allocation_key(procedure_id).into_bytes()], false)
            .await?;
        Ok(())
    }

    fn reserved(&self, key: &str, value: &[u8], task: &CreateTableTask) -> Result<TableAllocation> {
        let allocation: TableAllocation =
            serde_json::from_slice(value).context(DecodeMetadataSnafu { key })?;
        ensure!(
            allocation.region_routes.len() == task.num_regions as usize
                && allocation.region_wal_options.len() == task.num_regions as usize,
            InvalidCreateTableSnafu {
                table: task.name.to_string(),
                reason: format!(
                    "the allocation reserved at '{key}' has {} regions, the task asks for {}",
                    allocation.region_routes.len(),
                    task.num_regions
                ),
            }
        );
        Ok(allocation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ddl::peer::RoundRobinPeerSelector;
    use crate::ddl::wal_source::RaftEngineWalSource;
    use crate::key::table_name::TableName;
    use crate::kv::MemoryKvBackend;

    fn allocator(kv: &KvBackendRef) -> TableMetadataAllocator {
        TableMetadataAllocator::new(
            kv.clone(),
            Arc::new(RoundRobinPeerSelector::new(vec![1, 2, 3])),
            Arc::new(RaftEngineWalSource),
        )
    }

    #[tokio::test]
    async fn ids_survive_a_restart_and_placement_is_round_robin() {
        let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
        let task = CreateTableTask::new(TableName::new("greptime", "public", "cpu"), 4);
        let first = allocator(&kv);
        let a = first.allocate(&task).await.unwrap();
        assert_eq!(a.table_id, MIN_USER_TABLE_ID);
        assert_eq!(
            a.region_routes,
            BTreeMap::from([(0, 1), (1, 2), (2, 3), (3, 1)])
        );
        assert!(
            a.region_wal_options
                .values()
                .all(|w| w == r#"{"wal.provider":"raft_engine"}"#)
        );
        // A restarted process never hands out an id of the first process's batch.
        let restarted = allocator(&kv);
        assert_eq!(
            restarted.next_table_id().await.unwrap(),
            MIN_USER_TABLE_ID + TABLE_ID_STEP as u32
        );
        assert_eq!(first.next_table_id().await.unwrap(), MIN_USER_TABLE_ID + 1);
    }

    #[tokio::test]
    async fn allocate_once_returns_the_reservation_and_release_removes_it() {
        let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
        let task = CreateTableTask::new(TableName::new("greptime", "public", "cpu"), 2);
        let a = allocator(&kv).allocate_once("p1", &task).await.unwrap();
        let again = allocator(&kv).allocate_once("p1", &task).await.unwrap();
        assert_eq!(a, again);
        let other = allocator(&kv).allocate_once("p2", &task).await.unwrap();
        assert_ne!(a.table_id, other.table_id);
        // A reservation that does not fit the task is an error naming the key.
        let bigger = CreateTableTask::new(TableName::new("greptime", "public", "cpu"), 3);
        let err = allocator(&kv)
            .allocate_once("p1", &bigger)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("__table_allocation/p1"), "{err}");
        allocator(&kv).release("p1").await.unwrap();
        assert!(kv.get(b"__table_allocation/p1").await.unwrap().is_none());
        allocator(&kv).release("p1").await.unwrap();
    }
}
