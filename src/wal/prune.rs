//! [`WalPruneProcedure`]: drops the entries of one Kafka topic that no region needs any more, and advances the
//! topic's `pruned_entry_id` (`__topic_name/kafka/{topic}`).
//!
//! Steps, in order (each persisted before the next runs), under an exclusive lock on the topic
//! ([`prune_lock_key`]):
//! 1. **ComputePrunable** — read the topic's watermark and every `__topic_region/{topic}/{region_id}` key. The
//!    prunable entry id is the lowest flushed entry id among the regions; a region without a checkpoint pins the
//!    topic (nothing is pruned), and so does a topic without regions. The target is the higher of it and the
//!    current watermark (the watermark never moves backwards); it is persisted in the record, so a resumed prune
//!    deletes exactly what the first run decided.
//! 2. **DeleteRecords** — in `prune_mode = "delete_records"`, ask the brokers to delete the records below the
//!    target's successor (entry id `e` is Kafka offset `e - 1`, so the offset `target` is the first one kept).
//!    Kafka's DeleteRecords only ever raises a partition's low watermark: repeating it after a crash is harmless.
//!    In `"logical"` mode (brokers without DeleteRecords) nothing is asked of the brokers.
//! 3. **AdvanceWatermark** — compare-and-put `pruned_entry_id` to the target, leaving a higher stored value alone.
//!
//! Why a needed entry is never deleted: a region needs the entries after its checkpoint, and checkpoints only move
//! forward, so an entry at or below the lowest checkpoint read in step 1 stays unneeded by those regions forever.
//! A region that step 1 did not see recorded its checkpoint after step 1's read, at the topic's end at that
//! moment, which is at or above every checkpoint step 1 read (a checkpoint never exceeds the end of the topic it
//! was recorded on), and it writes its first entry only after recording it. The full argument: `docs/wal.md`.
//!
//! `__topic_region` values are read with the one codec of that key (`crate::key::topic_region`); the lower of the
//! checkpoint's `entry_id` and `metadata_entry_id` is the flushed id.
//!
//! The three steps are also free functions ([`decide`], [`delete_below`], [`advance_watermark`]): the periodic and
//! operator prunes run them for every topic of the pool in one [`round::WalPruneRound`] procedure, which records
//! each topic's result and never lets one topic's failure stop the others. This single-topic procedure stays for
//! records an earlier version left and for the tests that race one topic's steps.

pub mod round;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use procedures::{BoxedProcedureLoader, Context, LockKey, Procedure, ProcedureId, Status};
use serde::{Deserialize, Serialize};
use tracing::info;

use crate::key::topic_name::{TopicId, TopicNameValue, topic_name_key};
use crate::key::topic_region::read_topic_regions;
use crate::kv::{CompareAndPutRequest, KvBackend, KvBackendRef};
use crate::wal::error::Result;
use crate::wal::error::{PruneTopicUnknownSnafu, PruneWatermarkContentionSnafu};

/// Compare-and-put attempts before advancing the watermark gives up (another writer kept changing the key).
const MAX_CAS_ATTEMPTS: usize = 16;

/// How a prune drops entries, `[wal] prune_mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PruneMode {
    /// Delete the records from the brokers (Kafka's DeleteRecords), then advance the watermark.
    #[default]
    DeleteRecords,
    /// Only advance the watermark (for brokers without DeleteRecords); replay skips what it covers.
    Logical,
}

impl fmt::Display for PruneMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PruneMode::DeleteRecords => "delete_records",
            PruneMode::Logical => "logical",
        })
    }
}

/// Deletes a topic's old records on the brokers.
#[async_trait]
pub trait RecordDeleter: Send + Sync + fmt::Debug {
    /// Deletes the records of partition 0 of `topic` below Kafka offset `offset` (records at or above it stay).
    /// Idempotent: a low watermark already at or above `offset` is left as it is.
    async fn delete_records_before(&self, topic: &str, offset: i64) -> Result<()>;

    /// The topic's last entry id (its partition 0's high watermark: entry id `e` is offset `e - 1`), read so a
    /// topic no region writes to any more can be pruned to its end (see [`decide_free_topic`]). `None`, the default,
    /// when the deleter cannot read it: such a topic is then skipped (see [`decide_free_topic`]).
    async fn last_entry_id(&self, topic: &str) -> Result<Option<u64>> {
        let _ = topic;
        Ok(None)
    }

    /// The Kafka topic ids of those of `topics` the brokers list, in one metadata read, so a prune round can refuse
    /// a topic deleted and created again since its id was recorded (its regions' checkpoints count entries of the
    /// topic that is gone). Empty, the default, when the deleter cannot tell: nothing is checked.
    async fn topic_ids(&self, topics: &[String]) -> Result<BTreeMap<String, TopicId>> {
        let _ = topics;
        Ok(BTreeMap::new())
    }
}

/// A shared [`RecordDeleter`].
pub type RecordDeleterRef = Arc<dyn RecordDeleter>;

/// The procedure id of a prune of `topic`: `wal_prune/{topic}/{unique}`.
pub fn prune_procedure_id(topic: &str) -> ProcedureId {
    ProcedureId::new(format!("wal_prune/{topic}")).child(ProcedureId::random())
}

/// The lock key every prune of `topic` holds exclusively: `wal/kafka/topic/{topic}`.
pub fn prune_lock_key(topic: &str) -> LockKey {
    LockKey::exclusive(format!("wal/kafka/topic/{topic}"))
}

/// The step the procedure runs next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PruneStep {
    /// Read the watermark and the regions' checkpoints; decide the target.
    ComputePrunable,
    /// Delete the records up to the target on the brokers.
    DeleteRecords,
    /// Move the stored watermark up to the target.
    AdvanceWatermark,
}

/// The persisted state of a [`WalPruneProcedure`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalPruneData {
    /// The next step.
    pub step: PruneStep,
    /// The topic.
    pub topic: String,
    /// How entries are dropped.
    pub mode: PruneMode,
    /// The watermark ComputePrunable read.
    #[serde(default)]
    pub old_pruned_entry_id: u64,
    /// The watermark this prune moves to (set by ComputePrunable, never below `old_pruned_entry_id`).
    #[serde(default)]
    pub target: u64,
    /// Regions on the topic when ComputePrunable read them.
    #[serde(default)]
    pub regions: usize,
    /// A region without a checkpoint that pinned the topic, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_by: Option<u64>,
}

/// What a finished prune reports (its output).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneOutput {
    /// The topic.
    pub topic: String,
    /// How entries were dropped.
    pub mode: PruneMode,
    /// The watermark before.
    pub old_pruned_entry_id: u64,
    /// The watermark after.
    pub new_pruned_entry_id: u64,
    /// Regions on the topic.
    pub regions: usize,
    /// A region without a checkpoint that pinned the topic, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_by: Option<u64>,
}

/// Prunes one topic; see the module documentation.
pub struct WalPruneProcedure {
    data: WalPruneData,
    kv: KvBackendRef,
    deleter: RecordDeleterRef,
}

impl fmt::Debug for WalPruneProcedure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WalPruneProcedure")
            .field("data", &self.data)
            .finish_non_exhaustive()
    }
}

impl WalPruneProcedure {
    /// The type name the loader is registered under.
    pub const TYPE_NAME: &'static str = "remote_wal::WalPrune";

    /// A prune of `topic` in `mode`, starting at ComputePrunable.
    pub fn new(
        topic: impl Into<String>,
        mode: PruneMode,
        kv: KvBackendRef,
        deleter: RecordDeleterRef,
    ) -> Self {
        let data = WalPruneData {
            step: PruneStep::ComputePrunable,
            topic: topic.into(),
            mode,
            old_pruned_entry_id: 0,
            target: 0,
            regions: 0,
            pinned_by: None,
        };
        Self::from_data(data, kv, deleter)
    }

    /// A prune resuming from `data`.
    pub fn from_data(data: WalPruneData, kv: KvBackendRef, deleter: RecordDeleterRef) -> Self {
        WalPruneProcedure { data, kv, deleter }
    }

    /// The current state.
    pub fn data(&self) -> &WalPruneData {
        &self.data
    }

    /// The loader to register with the procedure manager under [`Self::TYPE_NAME`].
    pub fn loader(kv: KvBackendRef, deleter: RecordDeleterRef) -> BoxedProcedureLoader {
        Box::new(move |value| {
            let data: WalPruneData =
                serde_json::from_value(value).map_err(procedures::Error::external)?;
            Ok(Box::new(WalPruneProcedure::from_data(
                data,
                kv.clone(),
                deleter.clone(),
            )))
        })
    }

    /// Step 1: read the watermark and the regions' checkpoints, and persist the target.
    async fn compute_prunable(&mut self) -> Result<Status> {
        let decision = decide(self.kv.as_ref(), &self.data.topic).await?;
        self.data.old_pruned_entry_id = decision.old_pruned_entry_id;
        self.data.target = decision.target;
        self.data.regions = decision.regions;
        self.data.pinned_by = decision.pinned_by;
        self.data.step = PruneStep::DeleteRecords;
        Ok(Status::executing(true))
    }

    /// Step 2: delete the records up to the target (nothing in logical mode, or when the target is 0).
    async fn delete_records(&mut self, ctx: &Context) -> procedures::Result<Status> {
        delete_below(
            self.deleter.as_ref(),
            self.data.mode,
            &self.data.topic,
            self.data.target,
            ctx,
        )
        .await?;
        self.data.step = PruneStep::AdvanceWatermark;
        Ok(Status::executing(true))
    }

    /// Step 3: compare-and-put the watermark up to the target; a stored value at or above it is kept.
    async fn advance_watermark(&mut self, ctx: &Context) -> procedures::Result<Status> {
        let new =
            advance_watermark(self.kv.as_ref(), &self.data.topic, self.data.target, ctx).await?;
        let output = PruneOutput {
            topic: self.data.topic.clone(),
            mode: self.data.mode,
            old_pruned_entry_id: self.data.old_pruned_entry_id,
            new_pruned_entry_id: new,
            regions: self.data.regions,
            pinned_by: self.data.pinned_by,
        };
        info!(topic = %output.topic, old = output.old_pruned_entry_id, new, "pruned the topic");
        let output = serde_json::to_value(&output).map_err(procedures::Error::external)?;
        Ok(Status::done_with_output(output))
    }
}

/// What ComputePrunable decided for one topic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneDecision {
    /// The watermark read.
    pub old_pruned_entry_id: u64,
    /// The watermark to move to: the lowest flushed entry id among the regions, never below the old one.
    pub target: u64,
    /// Regions on the topic.
    pub regions: usize,
    /// A region without a checkpoint that pinned the topic, if any (the target is then the old watermark).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_by: Option<u64>,
    /// The region with the lowest checkpoint, which the target stops at (none when a region without a checkpoint
    /// pins the topic, or without regions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by: Option<u64>,
    /// No region key and no datanode table names the topic: the target is its end ([`decide_free_topic`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub free: bool,
    /// The topic id its `__topic_name` value records (`None`: not recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_id: Option<TopicId>,
}

/// Reads `topic`'s stored watermark: the raw value (for a compare-and-put) and its decoding. An error when the
/// topic has no key (not a topic of the pool) or its value does not decode.
async fn read_watermark(kv: &dyn KvBackend, topic: &str) -> Result<(Vec<u8>, TopicNameValue)> {
    let key = topic_name_key(topic);
    match kv.get(&key).await? {
        Some(found) => Ok((
            found.value.clone(),
            TopicNameValue::decode(&key, &found.value)?,
        )),
        None => PruneTopicUnknownSnafu {
            topic: topic.to_string(),
            key: String::from_utf8_lossy(&key).into_owned(),
        }
        .fail(),
    }
}

/// ComputePrunable of `topic`: reads its watermark and every region's checkpoint (see the module documentation).
pub async fn decide(kv: &dyn KvBackend, topic: &str) -> Result<PruneDecision> {
    let (_, watermark) = read_watermark(kv, topic).await?;
    let regions = read_topic_regions(kv, topic).await?;
    let mut lowest: Option<u64> = None;
    let mut held_by = None;
    let mut pinned_by = None;
    for (region_id, value) in &regions {
        match value.flushed_entry_id() {
            Some(flushed) => {
                if lowest.is_none_or(|l| flushed < l) {
                    lowest = Some(flushed);
                    held_by = Some(*region_id);
                }
            }
            None => {
                pinned_by = Some(*region_id);
                break;
            }
        }
    }
    let prunable = if pinned_by.is_some() {
        0
    } else {
        lowest.unwrap_or(0)
    };
    let decision = PruneDecision {
        old_pruned_entry_id: watermark.pruned_entry_id,
        target: prunable.max(watermark.pruned_entry_id),
        regions: regions.len(),
        pinned_by,
        held_by: if pinned_by.is_some() { None } else { held_by },
        free: false,
        topic_id: watermark.topic_id,
    };
    info!(
        topic,
        regions = decision.regions,
        pinned_by = ?decision.pinned_by,
        old = decision.old_pruned_entry_id,
        target = decision.target,
        "computed the prunable entry id"
    );
    Ok(decision)
}

/// ComputePrunable again for a topic `first` (a [`decide`] of it) found without region keys, and that no datanode
/// table names either (the caller checked: its tables were dropped): with the topic's end as the target, since
/// every entry on a free topic is unneeded.
///
/// Why that is safe: the end *E* is read after the first read of the region keys found none, and the keys are read
/// again after it. A region whose key is written after that second read opens after it, and its first checkpoint
/// is the topic's end at its opening, at or above *E*, so nothing it needs is at or below *E*; a key written
/// before the second read is seen by it, and the topic is then decided as usual. The caller's check that no
/// datanode table names the topic keeps regions of tables created before `__topic_region` keys existed (which
/// have none) from losing their entries. `None` from the deleter: `first` as it is.
pub async fn decide_free_topic(
    kv: &dyn KvBackend,
    deleter: &dyn RecordDeleter,
    topic: &str,
    first: PruneDecision,
) -> Result<PruneDecision> {
    if first.regions > 0 {
        return Ok(first);
    }
    let Some(end) = deleter.last_entry_id(topic).await? else {
        return Ok(first);
    };
    let again = decide(kv, topic).await?;
    if again.regions > 0 {
        return Ok(again);
    }
    Ok(PruneDecision {
        target: again.old_pruned_entry_id.max(end),
        free: true,
        ..again
    })
}

/// DeleteRecords of `topic` up to `target` in `mode` (nothing in logical mode, or when the target is 0), then a
/// side-effect point. Idempotent.
pub async fn delete_below(
    deleter: &dyn RecordDeleter,
    mode: PruneMode,
    topic: &str,
    target: u64,
    ctx: &Context,
) -> procedures::Result<()> {
    if mode == PruneMode::DeleteRecords && target > 0 {
        // Entry id e is offset e - 1: the first offset kept is `target`.
        let offset = i64::try_from(target).unwrap_or(i64::MAX);
        deleter.delete_records_before(topic, offset).await?;
        ctx.side_effect_point(&format!("deleted records of {topic} below offset {offset}"))?;
    }
    Ok(())
}

/// AdvanceWatermark of `topic`: compare-and-puts its `pruned_entry_id` up to `target`, leaving a stored value at
/// or above it alone; returns the stored value after. A side-effect point follows a write.
pub async fn advance_watermark(
    kv: &dyn KvBackend,
    topic: &str,
    target: u64,
    ctx: &Context,
) -> procedures::Result<u64> {
    let key = topic_name_key(topic);
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (raw, current) = read_watermark(kv, topic).await?;
        if current.pruned_entry_id >= target {
            return Ok(current.pruned_entry_id);
        }
        let next = TopicNameValue {
            pruned_entry_id: target,
            ..current
        };
        let response = kv
            .compare_and_put(CompareAndPutRequest {
                key: key.clone(),
                expect: Some(raw),
                value: next.encode(),
            })
            .await
            .map_err(procedures::Error::from)?;
        if response.success {
            ctx.side_effect_point(&format!(
                "advanced the pruned entry id of {topic} to {target}"
            ))?;
            return Ok(target);
        }
    }
    Err(PruneWatermarkContentionSnafu {
        key: String::from_utf8_lossy(&key).into_owned(),
        attempts: MAX_CAS_ATTEMPTS,
    }
    .build()
    .into())
}

#[async_trait]
impl Procedure for WalPruneProcedure {
    fn type_name(&self) -> &str {
        Self::TYPE_NAME
    }

    async fn execute(&mut self, ctx: &Context) -> procedures::Result<Status> {
        match self.data.step {
            PruneStep::ComputePrunable => Ok(self.compute_prunable().await?),
            PruneStep::DeleteRecords => self.delete_records(ctx).await,
            PruneStep::AdvanceWatermark => self.advance_watermark(ctx).await,
        }
    }

    fn dump(&self) -> procedures::Result<serde_json::Value> {
        serde_json::to_value(&self.data).map_err(procedures::Error::external)
    }

    fn lock_key(&self) -> LockKey {
        prune_lock_key(&self.data.topic)
    }

    /// The step `execute` runs next: `ComputePrunable`, `DeleteRecords`, `AdvanceWatermark`.
    fn step_name(&self) -> Option<String> {
        let name = match self.data.step {
            PruneStep::ComputePrunable => "ComputePrunable",
            PruneStep::DeleteRecords => "DeleteRecords",
            PruneStep::AdvanceWatermark => "AdvanceWatermark",
        };
        Some(name.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_snake_case() {
        assert_eq!(
            serde_json::to_string(&PruneMode::DeleteRecords).unwrap(),
            r#""delete_records""#
        );
        assert_eq!(PruneMode::Logical.to_string(), "logical");
    }
}
