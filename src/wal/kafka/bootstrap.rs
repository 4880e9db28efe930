//! [`TopicBootstrapProcedure`]: creates the Kafka topic pool exactly once and persists its names.
//!
//! Steps, in order (each but the first persisted before the next runs):
//! 1. **LoadTopics** — read the pool's persisted names (`__topic_name/kafka/{prefix}_{i}`); they are kept in memory
//!    only (read again after a restart), never in the record. Only a read, so nothing is recorded after it.
//! 2. **CreateMissing** — read which wanted topics exist, with their partition counts, in one metadata read
//!    naming them (a bounded few requests for huge pools); create those neither persisted nor existing in batches
//!    of the admin's `create_batch_size`, at most `max_concurrent_creates` batches at a time, with a side-effect
//!    point after each batch; Kafka's TOPIC_ALREADY_EXISTS counts as created (the admin checks the partition
//!    count). A creation the controller acknowledged is proof the topic exists in the cluster's metadata, so
//!    nothing waits for a broker to list it (a broker lists a topic only after applying the controller's records
//!    and creating its partitions' logs, which takes far longer than the acknowledgement). A persisted topic the
//!    read did not list is created again: one deleted out of band is recreated — it is in the pool's spec — and
//!    reported (the `recreated` count of the output); one the broker had not applied yet answers "already exists".
//!    A resume with every topic existing costs one metadata read plus the persists.
//! 3. **PersistNames** — persist the names that are not persisted yet, up to [`CHUNKS_PER_STEP`] chunks per
//!    execution: a chunk is the next indices from the watermark `persisted_below` (set by CreateMissing past the
//!    names persisted in a row from the first), as many as fit one transaction of the backend (a compare and a put
//!    per name: 64 names under etcd's 128 operations). Each chunk is put-if-absent and atomic, followed by a
//!    side-effect point; the chunks of one execution are in flight together, and the execution moves the watermark
//!    past them, which the engine persists with the state before the next execution. The execution that writes the
//!    last chunks finishes the procedure: its done record is the write after them.
//!
//! **The record is constant-size**: it holds the step, the spec and the watermark, never a topic name (names are
//! `{prefix}_{i}`, derived from the spec), so it is a few hundred bytes at any `num_topics`. Records written by
//! the format-1 release listed names (`persisted`, `created`); [`TopicBootstrapData::decode`] still reads them and
//! drops the lists, which the store and the spec give again.
//!
//! Why a crash anywhere is harmless: topic names are deterministic, so re-running CreateMissing after a crash
//! (even after m of n creations) re-creates nothing — the created ones answer "already exists". A name is
//! persisted only once its topic was listed or its creation acknowledged by the controller (committed to the
//! cluster's metadata log), so every persisted name is a real topic. PersistNames writes each
//! key only if it is absent: re-running it after its transaction committed writes nothing and never resets a
//! key's `pruned_entry_id`. Growing `num_topics` creates only the new topics; shrinking deletes nothing and only
//! logs a warning naming the persisted topics beyond the pool.
//!
//! A bootstrap recovered after a crash carries the spec it was started with; the loader of
//! [`TopicBootstrapProcedure::loader_for`] compares it with the configured pool: another topic count, partition
//! count or replication factor **supersedes** it (it restarts at LoadTopics with the configured spec, so the old
//! count is never created), and another prefix (another pool) fails it with an error naming both prefixes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use futures::StreamExt;
use procedures::{BoxedProcedureLoader, Context, LockKey, Procedure, ProcedureId, Status};
use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn};

use crate::key::topic_name::{
    TopicId, TopicNameValue, decode_topic_name_key, list_persisted_values, persist_topics_txn,
    topic_name_key,
};
use crate::kv::KvBackendRef;
use crate::wal::error::Result;
use crate::wal::error::{
    BootstrapPoolChangedSnafu, PersistTopicNamesConflictSnafu, PoolTopicPartitionsSnafu,
    PoolTopicsLostSnafu,
};
use crate::wal::kafka::admin::{CreateTopicOutcome, TopicAdminRef};
use crate::wal::kafka::topic_pool::TopicPoolSpec;

/// The procedure id of a pool's bootstrap: `topic_bootstrap/{prefix}` for attempt 0, then
/// `topic_bootstrap/{prefix}/attempt-{k}` (see [`crate::wal::kafka::KafkaTopicManager::start`]).
pub fn bootstrap_procedure_id(prefix: &str, attempt: u32) -> ProcedureId {
    let base = ProcedureId::new(format!("topic_bootstrap/{prefix}"));
    if attempt == 0 {
        base
    } else {
        base.child(format!("attempt-{attempt}"))
    }
}

/// The lock key every bootstrap of the pool holds exclusively: `wal/kafka/topic_pool/{prefix}`.
pub fn pool_lock_key(prefix: &str) -> LockKey {
    LockKey::exclusive(format!("wal/kafka/topic_pool/{prefix}"))
}

/// The step the procedure runs next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BootstrapStep {
    /// Read the persisted names.
    LoadTopics,
    /// Create the topics that are not persisted and wait until all are visible.
    CreateMissing,
    /// Persist the names that are not persisted.
    PersistNames,
}

/// The persisted state of a [`TopicBootstrapProcedure`]: constant-size, whatever the pool's size (no topic name;
/// names are derived from the spec).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TopicBootstrapData {
    /// The next step.
    pub step: BootstrapStep,
    /// What the pool should be.
    pub spec: TopicPoolSpec,
    /// PersistNames' watermark: every wanted name with an index below it is persisted.
    #[serde(default)]
    pub persisted_below: usize,
}

/// The state as the format-1 release persisted it: the same step and spec, with the name lists this release no
/// longer keeps.
#[derive(Deserialize)]
struct TopicBootstrapDataFormat1 {
    step: BootstrapStep,
    spec: TopicPoolSpec,
    #[allow(dead_code)]
    persisted: BTreeSet<String>,
    #[allow(dead_code)]
    created: BTreeSet<String>,
}

impl TopicBootstrapData {
    /// A fresh state at LoadTopics.
    pub fn new(spec: TopicPoolSpec) -> Self {
        TopicBootstrapData {
            step: BootstrapStep::LoadTopics,
            spec,
            persisted_below: 0,
        }
    }

    /// Decodes a persisted state, this release's or the format-1 release's (which listed the persisted and created
    /// names). A format-1 state keeps its step and spec; its lists are dropped: the steps read the persisted names
    /// from the store, and the created ones are the spec's (CreateMissing confirmed them before recording
    /// PersistNames). Its PersistNames restarts from the first name, skipping those the store holds.
    pub fn decode(value: serde_json::Value) -> serde_json::Result<Self> {
        let format1 = value.get("persisted").is_some() || value.get("created").is_some();
        if format1 {
            let old: TopicBootstrapDataFormat1 = serde_json::from_value(value)?;
            return Ok(TopicBootstrapData {
                step: old.step,
                spec: old.spec,
                persisted_below: 0,
            });
        }
        serde_json::from_value(value)
    }
}

/// Where a bootstrap reports the topics it recreated (shared with the pool's manager, which reports them).
pub type RecreatedTopics = Arc<Mutex<BTreeSet<String>>>;

/// Where a bootstrap reports the topics whose creation the controller acknowledged (created, or already existing
/// with the pool's partition count), shared with the pool's manager: its next load counts them as seen on the
/// brokers, whether or not a broker lists them yet.
pub type AcknowledgedTopics = Arc<Mutex<BTreeSet<String>>>;

/// Creates the pool's missing topics and persists their names; see the module documentation.
pub struct TopicBootstrapProcedure {
    data: TopicBootstrapData,
    kv: KvBackendRef,
    admin: TopicAdminRef,
    /// The pool's persisted names (`{prefix}_{i}`, any `i`) as last read from the store and written since; not part
    /// of the record (read again when needed after a restart).
    persisted: Option<BTreeSet<String>>,
    /// The values of those names as the last read found them (raw and decoded), for CreateMissing's check of
    /// topic ids; not part of the record.
    stored: Option<BTreeMap<String, (Vec<u8>, TopicNameValue)>>,
    /// Persisted topics this instance found missing on the brokers and recreated (reported in the output).
    recreated: BTreeSet<String>,
    /// Recreated topics are also added here.
    recreated_sink: Option<RecreatedTopics>,
    /// Topics whose creation this instance saw acknowledged (created, or already existing with the pool's
    /// partition count).
    acknowledged: BTreeSet<String>,
    /// Acknowledged topics are also added here.
    acknowledged_sink: Option<AcknowledgedTopics>,
    /// Set when recovered for a pool other than the configured one (that pool's prefix): execution fails.
    abandoned_for: Option<String>,
    /// The topic ids CreateMissing's metadata read gave (not part of the record: PersistNames records those it
    /// knows, and a later bootstrap fills in the others).
    ids: BTreeMap<String, TopicId>,
}

impl std::fmt::Debug for TopicBootstrapProcedure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopicBootstrapProcedure")
            .field("data", &self.data)
            .finish_non_exhaustive()
    }
}

impl TopicBootstrapProcedure {
    /// The type name the loader is registered under.
    pub const TYPE_NAME: &'static str = "remote_wal::TopicBootstrap";

    /// A bootstrap of the pool `spec` (validated), starting at LoadTopics.
    pub fn new(spec: TopicPoolSpec, kv: KvBackendRef, admin: TopicAdminRef) -> Result<Self> {
        spec.validate()?;
        Ok(Self::from_data(TopicBootstrapData::new(spec), kv, admin))
    }

    /// A bootstrap resuming from `data`.
    pub fn from_data(data: TopicBootstrapData, kv: KvBackendRef, admin: TopicAdminRef) -> Self {
        TopicBootstrapProcedure {
            data,
            kv,
            admin,
            persisted: None,
            stored: None,
            recreated: BTreeSet::new(),
            recreated_sink: None,
            acknowledged: BTreeSet::new(),
            acknowledged_sink: None,
            abandoned_for: None,
            ids: BTreeMap::new(),
        }
    }

    /// Also adds every topic this bootstrap recreates to `sink`.
    pub fn with_recreated_sink(mut self, sink: RecreatedTopics) -> Self {
        self.recreated_sink = Some(sink);
        self
    }

    /// Also adds every topic whose creation this bootstrap sees acknowledged to `sink`.
    pub fn with_acknowledged_sink(mut self, sink: AcknowledgedTopics) -> Self {
        self.acknowledged_sink = Some(sink);
        self
    }

    /// The current state.
    pub fn data(&self) -> &TopicBootstrapData {
        &self.data
    }

    /// The pool's persisted names this instance knows of (read by a step, or written by PersistNames); `None`
    /// before a step read them.
    pub fn known_persisted(&self) -> Option<&BTreeSet<String>> {
        self.persisted.as_ref()
    }

    /// The loader to register with the procedure manager under [`Self::TYPE_NAME`].
    pub fn loader(kv: KvBackendRef, admin: TopicAdminRef) -> BoxedProcedureLoader {
        Box::new(move |value| {
            let data = TopicBootstrapData::decode(value).map_err(procedures::Error::external)?;
            Ok(Box::new(TopicBootstrapProcedure::from_data(
                data,
                kv.clone(),
                admin.clone(),
            )))
        })
    }

    /// The loader the pool's manager registers: like [`Self::loader`], but a recovered bootstrap is checked against
    /// the configured pool `current` — another `num_topics`, `num_partitions` or `replication_factor` is superseded
    /// by `current` (restarting at LoadTopics; every step is idempotent and topic names are deterministic), another
    /// prefix fails when executed, naming both prefixes. Recreated topics are added to `sink`, acknowledged ones
    /// to `acknowledged`.
    pub fn loader_for(
        current: TopicPoolSpec,
        kv: KvBackendRef,
        admin: TopicAdminRef,
        sink: RecreatedTopics,
        acknowledged: AcknowledgedTopics,
    ) -> BoxedProcedureLoader {
        Box::new(move |value| {
            let data = TopicBootstrapData::decode(value).map_err(procedures::Error::external)?;
            let mut procedure = TopicBootstrapProcedure::from_data(data, kv.clone(), admin.clone())
                .with_recreated_sink(sink.clone())
                .with_acknowledged_sink(acknowledged.clone());
            procedure.reconcile(&current);
            Ok(Box::new(procedure))
        })
    }

    /// Applies the configured pool `current` to a recovered bootstrap; see [`Self::loader_for`].
    fn reconcile(&mut self, current: &TopicPoolSpec) {
        let old = &self.data.spec;
        if old.topic_name_prefix != current.topic_name_prefix {
            warn!(
                recovered = %old.topic_name_prefix,
                configured = %current.topic_name_prefix,
                "a recovered bootstrap belongs to a pool that is no longer configured; it is abandoned"
            );
            self.abandoned_for = Some(current.topic_name_prefix.clone());
            return;
        }
        let same_pool = old.num_topics == current.num_topics
            && old.num_partitions == current.num_partitions
            && old.replication_factor == current.replication_factor;
        if same_pool {
            // Tuning (concurrency, polling) follows the config; progress is kept, and so is what the operator asked.
            let recreate_missing = self.data.spec.recreate_missing;
            self.data.spec = current.clone();
            self.data.spec.recreate_missing = recreate_missing;
            return;
        }
        warn!(
            pool = %current.topic_name_prefix,
            recovered_num_topics = old.num_topics,
            num_topics = current.num_topics,
            recovered_num_partitions = old.num_partitions,
            num_partitions = current.num_partitions,
            recovered_replication_factor = old.replication_factor,
            replication_factor = current.replication_factor,
            "a recovered bootstrap was started with another pool spec; the configured spec supersedes it and it \
             restarts from its first step"
        );
        self.data = TopicBootstrapData::new(current.clone());
    }

    /// The pool's persisted names (`{prefix}_{i}`, any `i`), read from the store on first use.
    async fn persisted(&mut self) -> Result<&BTreeSet<String>> {
        if self.persisted.is_none() {
            self.persisted = Some(self.read_persisted().await?);
        }
        Ok(self.persisted.get_or_insert_default())
    }

    /// Reads the pool's persisted names from the store (keeping their values for the check of topic ids).
    async fn read_persisted(&mut self) -> Result<BTreeSet<String>> {
        let spec = &self.data.spec;
        let prefix = format!("{}_", spec.topic_name_prefix);
        let stored: BTreeMap<String, (Vec<u8>, TopicNameValue)> =
            list_persisted_values(self.kv.as_ref(), &prefix)
                .await?
                .into_iter()
                .filter(|(t, _, _)| spec.pool_index(t).is_some())
                .map(|(t, raw, value)| (t, (raw, value)))
                .collect();
        let names = stored.keys().cloned().collect();
        self.stored = Some(stored);
        Ok(names)
    }

    /// Step 1: read the pool's persisted names (kept in memory for the next steps).
    async fn load_topics(&mut self) -> Result<Status> {
        let persisted = self.read_persisted().await?;
        let spec = &self.data.spec;
        let beyond: Vec<&String> = persisted
            .iter()
            .filter(|t| spec.pool_index(t).is_some_and(|i| i >= spec.num_topics))
            .collect();
        if !beyond.is_empty() {
            warn!(
                pool = %spec.topic_name_prefix,
                num_topics = spec.num_topics,
                topics = ?beyond,
                "the pool shrank: these persisted topics are beyond num_topics; they are kept (never deleted) and \
                 regions already on them keep using them, but no new region gets them"
            );
        }
        info!(pool = %spec.topic_name_prefix, persisted = persisted.len(), wanted = spec.num_topics, "loaded persisted topic names");
        self.persisted = Some(persisted);
        self.data.step = BootstrapStep::CreateMissing;
        // Only a read: nothing to record. A crash before CreateMissing's record replays this read.
        Ok(Status::executing(false))
    }

    /// Step 2: read which wanted topics exist (one metadata read naming them), create those that are neither
    /// persisted nor existing in batches of the admin's batch size (at most `max_concurrent_creates` batches in
    /// flight), and create again the persisted ones the read did not list. A creation the controller acknowledged
    /// (created, or already existing with the pool's partition count) is proof the topic exists in the cluster's
    /// metadata: nothing waits for a broker to list it.
    async fn create_missing(&mut self, ctx: &Context) -> procedures::Result<Status> {
        let spec = self.data.spec.clone();
        let wanted = spec.topic_names();
        let started = Instant::now();
        let listed = self.admin.describe_topics_with_ids(&wanted).await?;
        let read_took = started.elapsed();
        let existing: BTreeMap<String, usize> = listed
            .iter()
            .map(|(name, (partitions, _))| (name.clone(), *partitions))
            .collect();
        self.ids = listed
            .iter()
            .filter_map(|(name, (_, id))| id.map(|id| (name.clone(), id)))
            .collect();
        // A topic made out of band with another partition count fails the bootstrap before anything is created.
        self.check_partitions(&existing)?;
        let persisted = self.persisted().await?;
        let missing: Vec<String> = wanted
            .iter()
            .filter(|t| !persisted.contains(*t) && !existing.contains_key(*t))
            .cloned()
            .collect();
        info!(
            pool = %spec.topic_name_prefix,
            existing = existing.len(),
            missing = missing.len(),
            batch_size = self.admin.create_batch_size(),
            ?read_took,
            "read the pool's topics; creating the missing ones"
        );
        let creating = Instant::now();
        let admin = self.admin.clone();
        let batches: Vec<Vec<String>> = missing
            .chunks(self.admin.create_batch_size().max(1))
            .map(<[String]>::to_vec)
            .collect();
        let settings = Arc::new(spec.clone());
        let mut creations = futures::stream::iter(batches)
            .map(|batch| {
                let admin = admin.clone();
                let settings = settings.clone();
                async move {
                    let answers = admin
                        .create_topics(
                            &batch,
                            settings.num_partitions,
                            settings.replication_factor,
                            &settings.topic_config,
                        )
                        .await;
                    (batch, answers)
                }
            })
            .buffer_unordered(spec.max_concurrent_creates);
        while let Some((batch, answers)) = creations.next().await {
            for (topic, outcome) in answers? {
                match outcome? {
                    CreateTopicOutcome::Created => debug!(%topic, "created topic"),
                    CreateTopicOutcome::AlreadyExisted => debug!(%topic, "topic already existed"),
                }
                self.acknowledge(topic);
            }
            ctx.side_effect_point(&created_label(&batch))?;
        }
        drop(creations);
        let create_took = creating.elapsed();

        // Persisted topics the read did not list: deleted out of band, or not applied yet by the broker that
        // answered (read again for a few seconds to tell). Persisted topics listed under another topic id were
        // deleted and created again. Either way the regions on them lost what they wrote: refused, unless the
        // operator asked to recreate them.
        let unlisted: Vec<String> = wanted
            .iter()
            .filter(|t| !existing.contains_key(*t) && !self.acknowledged.contains(*t))
            .cloned()
            .collect();
        let gone = self.still_unlisted(unlisted).await?;
        self.check_incarnations(ctx, &spec, gone).await?;
        info!(
            pool = %spec.topic_name_prefix,
            created = missing.len(),
            ?create_took,
            "every wanted topic is listed or its creation acknowledged"
        );
        // PersistNames starts after the names persisted in a row from the first (all of them on a pool that is
        // complete already: PersistNames then writes nothing).
        let persisted = self.persisted().await?;
        self.data.persisted_below = (0..spec.num_topics)
            .find(|&i| !persisted.contains(&spec.topic_name(i)))
            .unwrap_or(spec.num_topics);
        self.data.step = BootstrapStep::PersistNames;
        Ok(Status::executing(true))
    }

    /// Those of `unlisted` that stay unlisted over [`UNLISTED_READS`] more metadata reads [`UNLISTED_PAUSE`] apart
    /// (a broker lists a topic a little after the controller created it); those listed meanwhile get their ids.
    async fn still_unlisted(&mut self, mut unlisted: Vec<String>) -> Result<Vec<String>> {
        for _ in 0..UNLISTED_READS {
            if unlisted.is_empty() {
                break;
            }
            tokio::time::sleep(UNLISTED_PAUSE).await;
            let listed = self.admin.describe_topics_with_ids(&unlisted).await?;
            self.check_partitions(
                &listed
                    .iter()
                    .map(|(name, (partitions, _))| (name.clone(), *partitions))
                    .collect(),
            )?;
            for (name, (_, id)) in &listed {
                if let Some(id) = id {
                    self.ids.insert(name.clone(), *id);
                }
            }
            unlisted.retain(|t| !listed.contains_key(t));
        }
        Ok(unlisted)
    }

    /// Compares the persisted topics with what the brokers hold: a persisted topic `missing` on the brokers, or
    /// listed under another id than the one recorded, is lost. Lost topics fail the bootstrap (an error naming
    /// each, its ids and the regions on it) unless the spec says to recreate them: then the missing ones are
    /// created again and each lost topic's value is replaced by `{"pruned_entry_id":0,"topic_id":NEW}` (its old
    /// watermark counted entries of a topic that is gone). Persisted topics without an id get the listed one.
    /// Every write is a compare-and-put against the value read, followed by a side-effect point.
    async fn check_incarnations(
        &mut self,
        ctx: &Context,
        spec: &TopicPoolSpec,
        missing: Vec<String>,
    ) -> procedures::Result<()> {
        if self.stored.is_none() {
            self.read_persisted().await?;
        }
        let stored: BTreeMap<String, (Vec<u8>, TopicNameValue)> = self
            .stored
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter(|(t, _)| spec.pool_index(t).is_some_and(|i| i < spec.num_topics))
            .collect();
        let mut lost: Vec<(String, Option<TopicId>, Option<TopicId>)> = Vec::new();
        for (topic, (_, value)) in &stored {
            let listed = self.ids.get(topic).copied();
            if missing.contains(topic) {
                lost.push((topic.clone(), value.topic_id, None));
            } else if let (Some(recorded), Some(now)) = (value.topic_id, listed)
                && recorded != now
            {
                lost.push((topic.clone(), Some(recorded), Some(now)));
            }
        }
        if !lost.is_empty() && !spec.recreate_missing {
            let regions = crate::wal::assigned::region_ids_per_topic(self.kv.as_ref()).await?;
            let described: Vec<String> = lost
                .iter()
                .map(|(topic, old, now)| describe_lost(topic, *old, *now, regions.get(topic)))
                .collect();
            return Err(PoolTopicsLostSnafu {
                prefix: spec.topic_name_prefix.clone(),
                topics: described.join("; "),
            }
            .build()
            .into());
        }
        if !lost.is_empty() {
            let gone: Vec<String> = lost
                .iter()
                .filter(|(_, _, now)| now.is_none())
                .map(|(t, _, _)| t.clone())
                .collect();
            if !gone.is_empty() {
                self.recreate(gone.clone()).await?;
                let listed = self.admin.describe_topics_with_ids(&gone).await?;
                for (name, (_, id)) in listed {
                    if let Some(id) = id {
                        self.ids.insert(name, id);
                    }
                }
            }
        }
        for (topic, (raw, value)) in &stored {
            let now = self.ids.get(topic).copied();
            let is_lost = lost.iter().any(|(t, _, _)| t == topic);
            let next = if is_lost {
                TopicNameValue {
                    pruned_entry_id: 0,
                    topic_id: now,
                }
            } else if value.topic_id.is_none() && now.is_some() {
                TopicNameValue {
                    topic_id: now,
                    ..*value
                }
            } else {
                continue;
            };
            if next == *value {
                continue;
            }
            let written = self
                .kv
                .compare_and_put(crate::kv::CompareAndPutRequest {
                    key: topic_name_key(topic),
                    expect: Some(raw.clone()),
                    value: next.encode(),
                })
                .await?;
            if written.success {
                if is_lost {
                    warn!(%topic, id = ?now, "recorded a recreated pool topic: its regions' earlier WAL there is lost");
                }
                ctx.side_effect_point(&format!("recorded the topic id of {topic}"))?;
            }
        }
        Ok(())
    }

    /// Records that the controller acknowledged `topic`'s creation (here and in the shared sink, where the pool's
    /// manager counts it as seen on the brokers).
    fn acknowledge(&mut self, topic: String) {
        if let Some(sink) = &self.acknowledged_sink {
            sink.lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(topic.clone());
        }
        self.acknowledged.insert(topic);
    }

    /// Fails, naming the topic and both counts, when a listed topic has another partition count than the pool's.
    fn check_partitions(&self, listed: &BTreeMap<String, usize>) -> Result<()> {
        let expected = self.data.spec.num_partitions;
        for (topic, &actual) in listed {
            if i64::try_from(actual).ok() != Some(i64::from(expected)) {
                return PoolTopicPartitionsSnafu {
                    topic: topic.clone(),
                    expected,
                    actual,
                }
                .fail();
            }
        }
        Ok(())
    }

    /// Creates again persisted topics the brokers did not list, with the pool's topic configs, in batches of the
    /// admin's batch size (at most `max_concurrent_creates` in flight). A topic this creates was deleted out of band
    /// (it is in the pool's spec): it is recorded as recreated. One that already exists was only not applied yet by
    /// the broker that answered the read. Either way its creation is acknowledged.
    async fn recreate(&mut self, unlisted: Vec<String>) -> Result<()> {
        let spec = self.data.spec.clone();
        info!(
            pool = %spec.topic_name_prefix,
            topics = unlisted.len(),
            first = ?unlisted.first(),
            "persisted pool topics are not listed by the brokers; creating them again"
        );
        let admin = self.admin.clone();
        let settings = Arc::new(spec.clone());
        let batches: Vec<Vec<String>> = unlisted
            .chunks(self.admin.create_batch_size().max(1))
            .map(<[String]>::to_vec)
            .collect();
        let mut creations = futures::stream::iter(batches)
            .map(|batch| {
                let admin = admin.clone();
                let settings = settings.clone();
                async move {
                    admin
                        .create_topics(
                            &batch,
                            settings.num_partitions,
                            settings.replication_factor,
                            &settings.topic_config,
                        )
                        .await
                }
            })
            .buffer_unordered(spec.max_concurrent_creates);
        while let Some(answers) = creations.next().await {
            for (topic, outcome) in answers? {
                if outcome? == CreateTopicOutcome::Created {
                    warn!(
                        %topic,
                        endpoints = ?self.admin.endpoints(),
                        "recreated a persisted pool topic missing on the brokers (deleted out of band; regions on it \
                         lost what their WAL held)"
                    );
                    if let Some(sink) = &self.recreated_sink {
                        sink.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(topic.clone());
                    }
                    self.recreated.insert(topic.clone());
                }
                self.acknowledge(topic);
            }
        }
        Ok(())
    }

    /// Step 3: persist the next chunks of names not persisted yet (see [`Self::persist_next_chunks`]); once the
    /// watermark reaches `num_topics`, finish.
    async fn persist_names(&mut self, ctx: &Context) -> procedures::Result<Status> {
        if self.data.persisted_below < self.data.spec.num_topics {
            self.persist_next_chunks(ctx).await?;
            if self.data.persisted_below < self.data.spec.num_topics {
                return Ok(Status::executing(true));
            }
            // The last chunks are in: finish in the same execution, so the done record is the only write after
            // them. A crash before it replays the chunks, which find their names present and write nothing.
        }
        info!(pool = %self.data.spec.topic_name_prefix, topics = self.data.spec.num_topics, "every name of the pool is persisted");
        let mut output = serde_json::json!({
            "topics": self.data.spec.num_topics,
            "num_partitions": self.data.spec.num_partitions,
        });
        if !self.recreated.is_empty() {
            output["recreated"] = serde_json::json!(self.recreated.len());
        }
        Ok(Status::done_with_output(output))
    }

    /// Persists up to [`CHUNKS_PER_STEP`] chunks from the watermark on, their transactions in flight together, with a
    /// side-effect point after each chunk (in index order); then moves the watermark past the last one, so the
    /// engine writes the record once per group of chunks rather than once per chunk.
    ///
    /// A chunk is a fixed index range (as many indices as fit one transaction, from the watermark CreateMissing
    /// left), so a replay runs the same chunks as the first run; its names not persisted yet are written in one
    /// transaction of "absent? then put" per name (see [`persist_chunk`]). A crash in the middle of a group leaves
    /// the watermark before the group: the replay finds the committed chunks' names present and writes only the
    /// others, never resetting a `pruned_entry_id`.
    async fn persist_next_chunks(&mut self, ctx: &Context) -> procedures::Result<()> {
        let spec = self.data.spec.clone();
        let chunk_len = self.txn_chunk_len(&spec);
        let persisted = self.persisted().await?.clone();
        let mut chunks = Vec::new();
        let mut from = self.data.persisted_below;
        while from < spec.num_topics && chunks.len() < CHUNKS_PER_STEP {
            let to = from.saturating_add(chunk_len).min(spec.num_topics);
            let names: Vec<(String, Option<TopicId>)> = (from..to)
                .map(|i| spec.topic_name(i))
                .filter(|name| !persisted.contains(name))
                .map(|name| {
                    let id = self.ids.get(&name).copied();
                    (name, id)
                })
                .collect();
            chunks.push((from, to, names));
            from = to;
        }
        let kv = self.kv.clone();
        let prefix = spec.topic_name_prefix.clone();
        let started = Instant::now();
        let first = self.data.persisted_below;
        let mut writes = futures::stream::iter(chunks)
            .map(|(from, to, names)| {
                let kv = kv.clone();
                let prefix = prefix.clone();
                async move { (from, to, persist_chunk(&kv, &prefix, names).await) }
            })
            .buffered(CHUNKS_PER_STEP);
        while let Some((from, to, written)) = writes.next().await {
            let written = written?;
            debug!(pool = %prefix, from, to, written = written.len(), "persisted a chunk of topic names");
            self.persisted.get_or_insert_default().extend(written);
            ctx.side_effect_point(&format!("persisted names {from}..{to}"))?;
            self.data.persisted_below = to;
        }
        info!(
            pool = %prefix,
            from = first,
            to = self.data.persisted_below,
            took = ?started.elapsed(),
            "persisted chunks of topic names"
        );
        Ok(())
    }

    /// How many names fit one transaction of the backend (each name costs a compare and a put).
    fn txn_chunk_len(&self, spec: &TopicPoolSpec) -> usize {
        let by_ops = self.kv.max_txn_ops() / 2;
        let value_len = TopicNameValue::default().encode().len();
        // The longest name is the one of the largest index.
        let longest = topic_name_key(&spec.topic_name(spec.num_topics.saturating_sub(1))).len();
        let largest = 2 * longest + value_len;
        let by_bytes = self.kv.max_request_bytes() / largest;
        by_ops.min(by_bytes).max(1)
    }
}

/// How many chunks of names one PersistNames execution writes (their transactions in flight together) before the
/// engine persists the watermark: 16 chunks of 64 names on etcd, so 1,024 names per record write.
pub const CHUNKS_PER_STEP: usize = 16;

/// Writes `names` (of the pool `prefix`) put-if-absent in one transaction; the names now known persisted.
///
/// When the transaction is refused (a name was persisted meanwhile — the chunk ran before a crash, or another
/// writer), nothing was written; the names are read again and only the still-missing ones are written. Refused twice
/// in a row, it is an error naming the pool.
async fn persist_chunk(
    kv: &KvBackendRef,
    prefix: &str,
    names: Vec<(String, Option<TopicId>)>,
) -> Result<Vec<String>> {
    let mut known = Vec::new();
    let mut names = names;
    let mut refused_in_a_row = 0;
    loop {
        if names.is_empty() || kv.txn(persist_topics_txn(&names)).await?.succeeded {
            known.extend(names.into_iter().map(|(name, _)| name));
            return Ok(known);
        }
        refused_in_a_row += 1;
        if refused_in_a_row > 1 {
            return PersistTopicNamesConflictSnafu {
                prefix: prefix.to_string(),
                reason: "another writer keeps persisting the pool's names (is a second metasrv running?)",
            }
            .fail();
        }
        let keys: Vec<Vec<u8>> = names.iter().map(|(t, _)| topic_name_key(t)).collect();
        let mut found = BTreeSet::new();
        for pair in kv.batch_get(&keys).await? {
            found.insert(decode_topic_name_key(&pair.key)?);
        }
        names.retain(|(name, _)| !found.contains(name));
        known.extend(found);
    }
}

/// How many more metadata reads tell a persisted topic a broker has not listed yet from one that is gone.
pub const UNLISTED_READS: usize = 10;

/// The pause before each of those reads (about three seconds in all).
pub const UNLISTED_PAUSE: std::time::Duration = std::time::Duration::from_millis(300);

/// How many regions a lost topic's description names before it says how many more.
const LOST_REGIONS_NAMED: usize = 8;

/// One lost topic in words: `'t' (id A) is gone from the brokers` or `'t' was created again (id A, now B)`, and the
/// regions on it.
fn describe_lost(
    topic: &str,
    recorded: Option<TopicId>,
    now: Option<TopicId>,
    regions: Option<&BTreeSet<u64>>,
) -> String {
    let recorded = recorded.map_or_else(|| "not recorded".to_string(), |id| id.to_string());
    let what = match now {
        None => format!("topic '{topic}' (id {recorded}) is gone from the brokers"),
        Some(now) => {
            format!("topic '{topic}' was deleted and created again (id {recorded}, now {now})")
        }
    };
    let regions: Vec<u64> = regions
        .map(|r| r.iter().copied().collect())
        .unwrap_or_default();
    match regions.len() {
        0 => format!("{what}, no region on it"),
        n => {
            let named: Vec<String> = regions
                .iter()
                .take(LOST_REGIONS_NAMED)
                .map(u64::to_string)
                .collect();
            let more = n.saturating_sub(LOST_REGIONS_NAMED);
            let tail = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            format!("{what}, regions on it: {}{tail}", named.join(", "))
        }
    }
}

/// The side-effect point after a batch of creates: `created {topic}` for one topic, `created {n} topics ({first} …
/// {last})` for more.
fn created_label(batch: &[String]) -> String {
    match batch {
        [first, .., last] => format!("created {} topics ({first} … {last})", batch.len()),
        [one] => format!("created {one}"),
        [] => "created no topic".to_string(),
    }
}

#[async_trait]
impl Procedure for TopicBootstrapProcedure {
    fn type_name(&self) -> &str {
        Self::TYPE_NAME
    }

    async fn execute(&mut self, ctx: &Context) -> procedures::Result<Status> {
        if let Some(configured) = &self.abandoned_for {
            return Err(BootstrapPoolChangedSnafu {
                recovered: self.data.spec.topic_name_prefix.clone(),
                configured: configured.clone(),
            }
            .build()
            .into());
        }
        match self.data.step {
            BootstrapStep::LoadTopics => Ok(self.load_topics().await?),
            BootstrapStep::CreateMissing => self.create_missing(ctx).await,
            BootstrapStep::PersistNames => self.persist_names(ctx).await,
        }
    }

    fn dump(&self) -> procedures::Result<serde_json::Value> {
        serde_json::to_value(&self.data).map_err(procedures::Error::external)
    }

    fn lock_key(&self) -> LockKey {
        pool_lock_key(&self.data.spec.topic_name_prefix)
    }

    /// The step `execute` runs next: `LoadTopics`, `CreateMissing`, `PersistNames`.
    fn step_name(&self) -> Option<String> {
        let name = match self.data.step {
            BootstrapStep::LoadTopics => "LoadTopics",
            BootstrapStep::CreateMissing => "CreateMissing",
            BootstrapStep::PersistNames => "PersistNames",
        };
        Some(name.to_string())
    }
}
