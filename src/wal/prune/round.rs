//! [`WalPruneRound`]: one procedure prunes a list of topics (every topic of the pool, or the one an operator
//! named), records each topic's result, and never lets one topic stop the others.
//!
//! Why one procedure per round: a procedure per topic left one record per topic per round (1,024 records a round
//! for a pool of 1,024 topics, kept for the retention period), and the first failing topic ended the round, so
//! one undecodable key or one broker error stopped the pruning of every later topic, every round.
//!
//! The topics are taken in chunks of [`WalPruneRoundData::chunk`]; each chunk runs two steps, each persisted
//! before the next runs:
//! 1. **Decide** — ComputePrunable ([`super::decide`]) for each topic of the chunk. A topic without region keys
//!    that no datanode table names either is free (its tables were dropped): its target is its end
//!    ([`super::decide_free_topic`]). A topic whose regions include one without a checkpoint, or without region
//!    keys and not free, is *skipped* (the reason recorded); a topic whose keys cannot be read or decoded, or whose
//!    end cannot be read, is *failed* (the error and its retryability recorded); the others are pending with their
//!    decided target. The decisions are persisted, so a resumed round deletes exactly what was decided.
//! 2. **Apply** — for each pending topic, DeleteRecords ([`super::delete_below`], idempotent) and
//!    AdvanceWatermark ([`super::advance_watermark`], a compare-and-put that never lowers the stored value); a
//!    broker or store error fails that topic only. Then the next chunk's Decide, or Done with every topic's result
//!    as the output, in the order of the topic list.
//!
//! What stops a deposed leader: the round's state is written through the procedure store's fenced path, so a
//! deposed manager's next persist fails and it halts; a delete or watermark write it makes late is safe on its own
//! (the module documentation of [`super`]: a target is never above what any region needs, DeleteRecords only
//! raises the low watermark, the watermark's compare-and-put never lowers it). Crash or halt errors from the
//! engine (a side-effect point) end the step at once and are never recorded as a topic's failure.
//!
//! Lock: `wal/kafka/prune` exclusive, so rounds run one at a time.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use async_trait::async_trait;
use procedures::{BoxedProcedureLoader, Context, LockKey, Procedure, ProcedureId, Status};
use serde::{Deserialize, Serialize};
use tracing::info;

use super::{
    PruneDecision, PruneMode, RecordDeleterRef, advance_watermark, decide, decide_free_topic,
    delete_below,
};
use crate::kv::KvBackendRef;
use crate::wal::assigned::region_ids_per_topic;

/// Topics a round decides, then applies, between two persisted steps.
pub const DEFAULT_CHUNK: usize = 32;

/// The lock key every round holds exclusively.
pub const PRUNE_ROUND_LOCK: &str = "wal/kafka/prune";

/// The procedure id of a round: `wal_prune_round/{unique}`.
pub fn prune_round_id() -> ProcedureId {
    ProcedureId::new("wal_prune_round").child(ProcedureId::random())
}

/// The step a round runs next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoundStep {
    /// Decide the targets of the next chunk.
    Decide,
    /// Delete and advance the pending topics of the chunk.
    Apply,
}

/// A topic decided and not yet applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingTopic {
    /// The topic.
    pub topic: String,
    /// What Decide read and decided.
    pub decision: PruneDecision,
}

/// How one topic's prune ended in a round.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum TopicOutcome {
    /// The records below the target were deleted (in `delete_records` mode) and the watermark moved to it (it may
    /// equal the old one when no checkpoint moved).
    Pruned {
        /// The watermark before.
        old_pruned_entry_id: u64,
        /// The watermark after.
        new_pruned_entry_id: u64,
        /// Regions on the topic.
        regions: usize,
        /// The region with the lowest checkpoint, which the watermark stops at (absent without regions).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        held_by: Option<u64>,
        /// The topic's last entry id after the prune, when the brokers answered: `last_entry_id -
        /// new_pruned_entry_id` entries are kept for `held_by`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        last_entry_id: Option<u64>,
    },
    /// Nothing was pruned, and why.
    Skipped {
        /// The watermark, unchanged.
        pruned_entry_id: u64,
        /// Regions on the topic.
        regions: usize,
        /// The region without a checkpoint that pins the topic, if that is the reason.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pinned_by: Option<u64>,
        /// Why, in words.
        reason: String,
    },
    /// The topic's prune failed at `step`; the next round tries again.
    Failed {
        /// `Decide`, `DeleteRecords` or `AdvanceWatermark`.
        step: String,
        /// The error.
        error: String,
        /// Whether the error is transient (the next round may well succeed).
        retryable: bool,
    },
}

/// One topic's result in a round.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicPruneResult {
    /// The topic.
    pub topic: String,
    /// How it ended.
    #[serde(flatten)]
    pub outcome: TopicOutcome,
}

impl TopicPruneResult {
    /// Whether the topic's prune failed.
    pub fn failed(&self) -> bool {
        matches!(self.outcome, TopicOutcome::Failed { .. })
    }
}

/// What a finished round reports (its output).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneRoundOutput {
    /// How entries were dropped.
    pub mode: PruneMode,
    /// Every topic's result, in the order of the round's topic list.
    pub topics: Vec<TopicPruneResult>,
}

impl PruneRoundOutput {
    /// Topics pruned, skipped and failed.
    pub fn counts(&self) -> (usize, usize, usize) {
        let mut counts = (0, 0, 0);
        for t in &self.topics {
            match t.outcome {
                TopicOutcome::Pruned { .. } => counts.0 += 1,
                TopicOutcome::Skipped { .. } => counts.1 += 1,
                TopicOutcome::Failed { .. } => counts.2 += 1,
            }
        }
        counts
    }

    /// Pruned topics whose watermark a region holds back, with that region and the entries kept for it (the
    /// topic's last entry id minus its pruned entry id), most behind first, at most `limit`.
    pub fn most_behind(&self, limit: usize) -> Vec<(&str, u64, u64)> {
        let mut behind: Vec<(&str, u64, u64)> = self
            .topics
            .iter()
            .filter_map(|t| match t.outcome {
                TopicOutcome::Pruned {
                    new_pruned_entry_id,
                    held_by: Some(region),
                    last_entry_id: Some(last),
                    ..
                } => Some((
                    t.topic.as_str(),
                    region,
                    last.saturating_sub(new_pruned_entry_id),
                )),
                _ => None,
            })
            .collect();
        behind.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(b.0)));
        behind.truncate(limit);
        behind
    }

    /// The topics whose prune failed.
    pub fn failed_topics(&self) -> Vec<&str> {
        self.topics
            .iter()
            .filter(|t| t.failed())
            .map(|t| t.topic.as_str())
            .collect()
    }
}

/// The persisted state of a [`WalPruneRound`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalPruneRoundData {
    /// The next step.
    pub step: RoundStep,
    /// How entries are dropped.
    pub mode: PruneMode,
    /// The topics of the round, in order.
    pub topics: Vec<String>,
    /// Topics per chunk (at least 1).
    pub chunk: usize,
    /// The index in `topics` of the current chunk's first topic.
    pub next: usize,
    /// The current chunk's topics Decide left for Apply.
    #[serde(default)]
    pub pending: Vec<PendingTopic>,
    /// The results so far.
    #[serde(default)]
    pub results: Vec<TopicPruneResult>,
}

/// Prunes a list of topics; see the module documentation.
pub struct WalPruneRound {
    data: WalPruneRoundData,
    kv: KvBackendRef,
    deleter: RecordDeleterRef,
}

impl fmt::Debug for WalPruneRound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WalPruneRound")
            .field("step", &self.data.step)
            .field("topics", &self.data.topics.len())
            .field("next", &self.data.next)
            .finish_non_exhaustive()
    }
}

impl WalPruneRound {
    /// The type name the loader is registered under.
    pub const TYPE_NAME: &'static str = "remote_wal::WalPruneRound";

    /// A round over `topics` in `mode`, [`DEFAULT_CHUNK`] topics per chunk.
    pub fn new(
        topics: Vec<String>,
        mode: PruneMode,
        kv: KvBackendRef,
        deleter: RecordDeleterRef,
    ) -> Self {
        Self::with_chunk(topics, mode, DEFAULT_CHUNK, kv, deleter)
    }

    /// A round over `topics` in `mode`, `chunk` topics (at least 1) per chunk.
    pub fn with_chunk(
        topics: Vec<String>,
        mode: PruneMode,
        chunk: usize,
        kv: KvBackendRef,
        deleter: RecordDeleterRef,
    ) -> Self {
        let data = WalPruneRoundData {
            step: RoundStep::Decide,
            mode,
            topics,
            chunk: chunk.max(1),
            next: 0,
            pending: Vec::new(),
            results: Vec::new(),
        };
        WalPruneRound { data, kv, deleter }
    }

    /// The current state.
    pub fn data(&self) -> &WalPruneRoundData {
        &self.data
    }

    /// The loader to register with the procedure manager under [`Self::TYPE_NAME`].
    pub fn loader(kv: KvBackendRef, deleter: RecordDeleterRef) -> BoxedProcedureLoader {
        Box::new(move |value| {
            let mut data: WalPruneRoundData =
                serde_json::from_value(value).map_err(procedures::Error::external)?;
            data.chunk = data.chunk.max(1);
            Ok(Box::new(WalPruneRound {
                data,
                kv: kv.clone(),
                deleter: deleter.clone(),
            }))
        })
    }

    /// The current chunk's topics.
    fn chunk(&self) -> &[String] {
        let start = self.data.next.min(self.data.topics.len());
        let end = start
            .saturating_add(self.data.chunk)
            .min(self.data.topics.len());
        &self.data.topics[start..end]
    }

    /// Decide: the chunk's targets, skips and failures; Done when no topic is left.
    async fn decide_chunk(&mut self) -> procedures::Result<Status> {
        if self.data.next >= self.data.topics.len() {
            return self.finish();
        }
        let mut pending = Vec::new();
        let mut results = Vec::new();
        // The topics datanode tables name, read once per chunk and only when a topic without region keys needs it.
        let mut assigned: Option<BTreeMap<String, BTreeSet<u64>>> = None;
        // The chunk's topic ids on the brokers, in one read: a topic listed under another id than the recorded one
        // was deleted and created again, and is not pruned. A failed read fails the chunk's topics (retryable).
        let chunk: Vec<String> = self.chunk().to_vec();
        let ids = match self.deleter.topic_ids(&chunk).await {
            Ok(ids) => ids,
            Err(e) => {
                self.data
                    .results
                    .extend(chunk.iter().map(|topic| failed(topic, "Decide", &e)));
                self.data.pending = Vec::new();
                self.data.step = RoundStep::Apply;
                return Ok(Status::executing(true));
            }
        };
        for topic in self.chunk() {
            let decided = match decide(self.kv.as_ref(), topic).await {
                Ok(first) if first.regions == 0 => {
                    let named = match &assigned {
                        Some(assigned) => assigned.contains_key(topic),
                        None => match region_ids_per_topic(self.kv.as_ref()).await {
                            Ok(read) => assigned.insert(read).contains_key(topic),
                            Err(e) => {
                                results.push(failed(topic, "Decide", &e));
                                continue;
                            }
                        },
                    };
                    if named {
                        Ok(first)
                    } else {
                        decide_free_topic(self.kv.as_ref(), self.deleter.as_ref(), topic, first)
                            .await
                    }
                }
                other => other,
            };
            let decided = decided.and_then(|decision| match (decision.topic_id, ids.get(topic)) {
                (Some(recorded), Some(now)) if recorded != *now => {
                    crate::wal::error::WalTopicRecreatedSnafu {
                        topic: topic.clone(),
                        recorded: recorded.to_string(),
                        now: now.to_string(),
                    }
                    .fail()
                }
                _ => Ok(decision),
            });
            match decided {
                Ok(decision) => match skip_reason(&decision) {
                    Some(reason) => results.push(TopicPruneResult {
                        topic: topic.clone(),
                        outcome: TopicOutcome::Skipped {
                            pruned_entry_id: decision.old_pruned_entry_id,
                            regions: decision.regions,
                            pinned_by: decision.pinned_by,
                            reason,
                        },
                    }),
                    None => pending.push(PendingTopic {
                        topic: topic.clone(),
                        decision,
                    }),
                },
                Err(e) => results.push(failed(topic, "Decide", &e)),
            }
        }
        self.data.pending = pending;
        self.data.results.extend(results);
        self.data.step = RoundStep::Apply;
        Ok(Status::executing(true))
    }

    /// Apply: delete and advance each pending topic; a topic's error is its result, an engine error (a crash or a
    /// halt at a side-effect point) ends the step.
    async fn apply_chunk(&mut self, ctx: &Context) -> procedures::Result<Status> {
        let mut results = Vec::with_capacity(self.data.pending.len());
        for pending in &self.data.pending {
            let (topic, decision) = (&pending.topic, &pending.decision);
            let deleted = delete_below(
                self.deleter.as_ref(),
                self.data.mode,
                topic,
                decision.target,
                ctx,
            )
            .await;
            if let Err(e) = deleted {
                results.push(topic_error(topic, "DeleteRecords", e)?);
                continue;
            }
            match advance_watermark(self.kv.as_ref(), topic, decision.target, ctx).await {
                Ok(new) => {
                    info!(topic = %topic, old = decision.old_pruned_entry_id, new, "pruned the topic");
                    // How far behind the end the holding region is, for the report only: a failure to read
                    // the end leaves it out.
                    let last_entry_id = self.deleter.last_entry_id(topic).await.ok().flatten();
                    results.push(TopicPruneResult {
                        topic: topic.clone(),
                        outcome: TopicOutcome::Pruned {
                            old_pruned_entry_id: decision.old_pruned_entry_id,
                            new_pruned_entry_id: new,
                            regions: decision.regions,
                            held_by: decision.held_by,
                            last_entry_id,
                        },
                    });
                }
                Err(e) => results.push(topic_error(topic, "AdvanceWatermark", e)?),
            }
        }
        self.data.results.extend(results);
        self.data.pending.clear();
        self.data.next = self.data.next.saturating_add(self.data.chunk);
        self.data.step = RoundStep::Decide;
        if self.data.next >= self.data.topics.len() {
            return self.finish();
        }
        Ok(Status::executing(true))
    }

    /// Done: every topic's result, in the topic list's order.
    fn finish(&mut self) -> procedures::Result<Status> {
        let order: HashMap<&str, usize> = self
            .data
            .topics
            .iter()
            .enumerate()
            .map(|(i, t)| (t.as_str(), i))
            .collect();
        let mut topics = self.data.results.clone();
        topics.sort_by_key(|r| order.get(r.topic.as_str()).copied().unwrap_or(usize::MAX));
        let output = PruneRoundOutput {
            mode: self.data.mode,
            topics,
        };
        let (pruned, skipped, failed) = output.counts();
        info!(pruned, skipped, failed, "WAL prune round finished");
        let output = serde_json::to_value(&output).map_err(procedures::Error::external)?;
        Ok(Status::done_with_output(output))
    }
}

/// Why a decided topic is skipped, if it is: a region without a checkpoint pins it, or it has no region key and its
/// end could not be taken as the target (a datanode table still names it, or the deleter cannot read the end).
fn skip_reason(decision: &PruneDecision) -> Option<String> {
    if let Some(region) = decision.pinned_by {
        return Some(format!(
            "region {region} has no checkpoint yet: it pins the topic"
        ));
    }
    if decision.regions == 0 && !decision.free {
        return Some(
            "no region key on the topic, and it was not freed to its end (a datanode table still names it, or \
             its end could not be read)"
                .to_string(),
        );
    }
    None
}

/// A failed result for `topic` at `step`.
fn failed(topic: &str, step: &str, error: &crate::wal::Error) -> TopicPruneResult {
    TopicPruneResult {
        topic: topic.to_string(),
        outcome: TopicOutcome::Failed {
            step: step.to_string(),
            error: error.to_string(),
            retryable: error.is_retryable(),
        },
    }
}

/// A topic's failed result for an error from `step`, or the error itself when it is the engine's own (the manager
/// was fenced or halted, or a crash was injected at a side-effect point), which must end the step.
fn topic_error(
    topic: &str,
    step: &str,
    error: procedures::Error,
) -> procedures::Result<TopicPruneResult> {
    if error.is_fatal() || matches!(error, procedures::Error::ManagerNotRunning { .. }) {
        return Err(error);
    }
    Ok(TopicPruneResult {
        topic: topic.to_string(),
        outcome: TopicOutcome::Failed {
            step: step.to_string(),
            retryable: error.is_retryable(),
            error: error.to_string(),
        },
    })
}

#[async_trait]
impl Procedure for WalPruneRound {
    fn type_name(&self) -> &str {
        Self::TYPE_NAME
    }

    async fn execute(&mut self, ctx: &Context) -> procedures::Result<Status> {
        match self.data.step {
            RoundStep::Decide => self.decide_chunk().await,
            RoundStep::Apply => self.apply_chunk(ctx).await,
        }
    }

    fn dump(&self) -> procedures::Result<serde_json::Value> {
        serde_json::to_value(&self.data).map_err(procedures::Error::external)
    }

    fn lock_key(&self) -> LockKey {
        LockKey::exclusive(PRUNE_ROUND_LOCK)
    }

    /// `Decide` or `Apply`.
    fn step_name(&self) -> Option<String> {
        let name = match self.data.step {
            RoundStep::Decide => "Decide",
            RoundStep::Apply => "Apply",
        };
        Some(name.to_string())
    }
}
