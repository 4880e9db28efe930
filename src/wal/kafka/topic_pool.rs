//! The Kafka topic pool: what it should be ([`TopicPoolSpec`]) and the ready pool in memory
//! ([`KafkaTopicManager`]), which runs the bootstrap procedure and hands out topics through a
//! [`TopicSelector`](crate::wal::kafka::TopicSelector).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use procedures::{ProcedureManager, ProcedureManagerRef, ProcedureWithId};
use serde::{Deserialize, Serialize};
use snafu::ResultExt;
use tracing::{debug, info, warn};

use crate::key::topic_name::{
    TopicId, TopicNameValue, list_persisted_topics, list_persisted_values, topic_name_key,
};
use crate::kv::KvBackendRef;
use crate::wal::config::{KafkaConfig, SelectorType, TopicConfig};
use crate::wal::error::Result;
use crate::wal::error::{InvalidTopicPoolSnafu, TopicBootstrapSnafu, TopicPoolNotReadySnafu};
use crate::wal::kafka::admin::TopicAdminRef;
use crate::wal::kafka::bootstrap::{
    AcknowledgedTopics, RecreatedTopics, TopicBootstrapProcedure, bootstrap_procedure_id,
};
use crate::wal::kafka::region_count::regions_per_topic;
use crate::wal::kafka::selector::{LeastLoadedTopicSelector, TopicSelectorRef};
use crate::wal::options::WalOptions;

/// How often and how long the bootstrap polled the broker's metadata for created topics to show up. The bootstrap
/// no longer polls (a creation the controller acknowledged is proof enough, see
/// [`TopicBootstrapProcedure`]); the setting stays in the spec so that records and specs that carry it still
/// decode.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReadyPoll {
    /// Delay before the second poll.
    #[serde(with = "humantime_serde")]
    pub init: Duration,
    /// Largest delay between two polls.
    #[serde(with = "humantime_serde")]
    pub max: Duration,
    /// Growth factor of the delay.
    pub factor: f32,
    /// Give up (with an error naming the missing topics) after polling this long.
    #[serde(with = "humantime_serde")]
    pub deadline: Duration,
}

/// The delay before the second visibility poll. A created topic is usually listed within tens of milliseconds on
/// one broker, so the poll starts fast instead of at the admin's retry backoff (500 ms by default), which made the
/// wait the largest part of a bootstrap.
pub const READY_POLL_INIT: Duration = Duration::from_millis(10);

/// The largest delay between two visibility polls: a slow cluster is asked once a second, not every 10 s.
pub const READY_POLL_MAX: Duration = Duration::from_secs(1);

impl Default for ReadyPoll {
    /// Polls after 10 ms, doubling up to 1 s, for at most 5 minutes.
    fn default() -> Self {
        ReadyPoll {
            init: READY_POLL_INIT,
            max: READY_POLL_MAX,
            factor: 2.0,
            deadline: Duration::from_secs(300),
        }
    }
}

/// What the pool should be: topics `{topic_name_prefix}_{i}` for `i` in `0..num_topics`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TopicPoolSpec {
    /// Prefix of every topic name.
    pub topic_name_prefix: String,
    /// How many topics the pool holds.
    pub num_topics: usize,
    /// Partitions of each topic.
    pub num_partitions: i32,
    /// Replication factor of each topic.
    pub replication_factor: i16,
    /// At most this many create requests in flight at once.
    pub max_concurrent_creates: usize,
    /// How the bootstrap waited for created topics to show up in metadata (no longer used; see [`ReadyPoll`]).
    pub ready_poll: ReadyPoll,
    /// Topic-level configs each topic is created with (`[wal] topic_config`); never applied to existing topics.
    #[serde(default, skip_serializing_if = "TopicConfig::is_empty")]
    pub topic_config: TopicConfig,
    /// Create again the pool's topics that are gone from the brokers, recording their new topic ids, instead of
    /// failing (`walctl bootstrap --recreate-missing`). Never from the config: an operator asks for it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recreate_missing: bool,
}

impl TopicPoolSpec {
    /// A spec with one partition per topic, replication factor 1, 8 concurrent creates and the default polling.
    pub fn new(topic_name_prefix: impl Into<String>, num_topics: usize) -> Self {
        TopicPoolSpec {
            topic_name_prefix: topic_name_prefix.into(),
            num_topics,
            num_partitions: 1,
            replication_factor: 1,
            max_concurrent_creates: 8,
            ready_poll: ReadyPoll::default(),
            topic_config: TopicConfig::new(),
            recreate_missing: false,
        }
    }

    /// The pool a Kafka WAL config asks for. Polling for created topics starts at [`READY_POLL_INIT`] and doubles up
    /// to [`READY_POLL_MAX`] (or the config's `backoff.max`, if smaller), until the config's `backoff.deadline`.
    pub fn from_config(config: &KafkaConfig) -> Self {
        TopicPoolSpec {
            topic_name_prefix: config.topic_name_prefix.clone(),
            num_topics: config.num_topics,
            num_partitions: config.num_partitions,
            replication_factor: config.replication_factor,
            max_concurrent_creates: config.max_concurrent_creates,
            ready_poll: ReadyPoll {
                init: READY_POLL_INIT.min(config.backoff.max),
                max: READY_POLL_MAX.min(config.backoff.max),
                factor: 2.0,
                deadline: config.backoff.deadline,
            },
            topic_config: config.topic_config.clone(),
            recreate_missing: false,
        }
    }

    /// The name of topic `i`: `{prefix}_{i}`.
    pub fn topic_name(&self, i: usize) -> String {
        format!("{}_{i}", self.topic_name_prefix)
    }

    /// Every wanted topic name, in index order.
    pub fn topic_names(&self) -> Vec<String> {
        (0..self.num_topics).map(|i| self.topic_name(i)).collect()
    }

    /// The index `i` when `topic` is exactly `{prefix}_{i}` (canonical decimal, no leading zeros), any `i`.
    pub fn pool_index(&self, topic: &str) -> Option<usize> {
        let digits = topic
            .strip_prefix(self.topic_name_prefix.as_str())?
            .strip_prefix('_')?;
        let canonical = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'));
        if canonical { digits.parse().ok() } else { None }
    }

    /// Rejects what the bootstrap cannot work with (the full name rules are checked by the WAL config).
    pub fn validate(&self) -> Result<()> {
        let fail = |reason: &str| {
            InvalidTopicPoolSnafu {
                prefix: self.topic_name_prefix.clone(),
                reason,
            }
            .fail()
        };
        if self.topic_name_prefix.is_empty() {
            return fail("the topic name prefix is empty");
        }
        if self.num_topics == 0 {
            return fail("num_topics is 0");
        }
        if self.num_partitions < 1 {
            return fail("num_partitions is below 1");
        }
        if self.replication_factor < 1 {
            return fail("replication_factor is below 1");
        }
        if self.max_concurrent_creates == 0 {
            return fail("max_concurrent_creates is 0");
        }
        Ok(())
    }
}

/// A pool topic whose config differs from `[wal] topic_config`: reported, never changed (the config applies at
/// creation only).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicConfigDrift {
    /// The topic.
    pub topic: String,
    /// The config's name.
    pub key: String,
    /// The value `[wal] topic_config` asks for.
    pub wanted: String,
    /// The topic's value (`None`: the broker reports none, e.g. a sensitive config).
    pub actual: Option<String>,
}

impl std::fmt::Display for TopicConfigDrift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let actual = self.actual.as_deref().unwrap_or("(no value)");
        write!(
            f,
            "topic '{}' has {} = {actual}, but [wal] topic_config asks for {}; existing topics are not changed \
             (alter it with Kafka's tools if intended)",
            self.topic, self.key, self.wanted
        )
    }
}

/// What the last load of the pool found.
#[derive(Debug)]
enum PoolState {
    /// Not loaded yet.
    NotLoaded,
    /// Every wanted topic persisted and seen on the brokers: these topics, in index order.
    Ready(Arc<Vec<String>>),
    /// Every wanted topic persisted, the brokers not asked (a load from the store only), or asked by a later load
    /// that could not reach them: these topics, in index order, handed out on the store's word.
    Persisted(Arc<Vec<String>>),
    /// Why the last load did not make the pool ready (repeated by allocation errors).
    NotReady(Arc<str>),
}

/// How many bootstrap procedure ids [`KafkaTopicManager::start`] tries after finding earlier bootstraps finished
/// (a failed one, or a smaller pool's) under the same pool.
const MAX_BOOTSTRAP_ATTEMPTS: u32 = 1000;

/// How many times a topic the brokers did not list is asked for again before it counts as absent.
const METADATA_SETTLE_READS: u32 = 5;

/// The pause before the first of those reads; it doubles after each (0.1 + 0.2 + ... + 1.6 s = 3.1 s in all).
const METADATA_SETTLE_FIRST_PAUSE: Duration = Duration::from_millis(100);

/// The Kafka topic pool of one metasrv: runs the bootstrap procedure, then keeps the ready pool in memory and hands
/// out its topics. Before the pool is ready every allocation is an error.
///
/// A load ([`KafkaTopicManager::start`], [`KafkaTopicManager::load_ready`]) makes the pool ready only when every
/// wanted topic is persisted **and** was seen on the brokers (with the pool's partition count) by the same load —
/// listed by them, or its creation acknowledged by the controller to a bootstrap of this process just before. The
/// one exception is asked for by name: [`KafkaTopicManager::load_persisted`] makes a pool the store holds whole
/// usable without the brokers (a new leader serving DDL while Kafka is down), until a load that reaches the
/// brokers says otherwise; [`KafkaTopicManager::brokers_checked`] tells the two apart.
#[derive(Debug)]
pub struct KafkaTopicManager {
    spec: Arc<TopicPoolSpec>,
    kv: KvBackendRef,
    admin: TopicAdminRef,
    selector: TopicSelectorRef,
    state: RwLock<PoolState>,
    /// Topics bootstraps run by this manager's process recreated.
    recreated: RecreatedTopics,
    /// Topics whose creation bootstraps run by this manager's process saw acknowledged since the last load; the
    /// next load counts them as seen on the brokers and empties the set.
    acknowledged: AcknowledgedTopics,
}

impl KafkaTopicManager {
    /// A manager of the pool `spec` (validated), persisting names in `kv` and creating topics through `admin`.
    pub fn new(
        spec: TopicPoolSpec,
        kv: KvBackendRef,
        admin: TopicAdminRef,
        selector: TopicSelectorRef,
    ) -> Result<Self> {
        spec.validate()?;
        Ok(KafkaTopicManager {
            spec: Arc::new(spec),
            kv,
            admin,
            selector,
            state: RwLock::new(PoolState::NotLoaded),
            recreated: Arc::new(Mutex::new(BTreeSet::new())),
            acknowledged: Arc::new(Mutex::new(BTreeSet::new())),
        })
    }

    /// The manager of the pool `config` describes (validated), with the config's selector.
    ///
    /// `selector_type = "round_robin"` (GreptimeDB's name, the only one) selects load-aware: each new region gets
    /// the topic with the fewest regions, ties in turn ([`LeastLoadedTopicSelector`]), from the counts the store
    /// records when the pool loads. On a fresh pool that is exactly round-robin; after restarts it keeps the
    /// topics level where a plain round-robin from a new start each time would not.
    pub fn from_config(
        config: &KafkaConfig,
        kv: KvBackendRef,
        admin: TopicAdminRef,
    ) -> Result<Self> {
        config.validate()?;
        let selector: TopicSelectorRef = match config.selector_type {
            SelectorType::RoundRobin => Arc::new(LeastLoadedTopicSelector::new()),
        };
        Self::new(TopicPoolSpec::from_config(config), kv, admin, selector)
    }

    /// The pool's spec.
    pub fn spec(&self) -> &TopicPoolSpec {
        &self.spec
    }

    /// Registers the bootstrap procedure's loader; call before the procedure manager starts. A bootstrap
    /// recovered with another spec than this pool's is superseded by this pool's spec (or, for another prefix,
    /// fails); see [`TopicBootstrapProcedure::loader_for`].
    pub fn register_loader(&self, manager: &dyn ProcedureManager) -> Result<()> {
        manager.register_loader(
            TopicBootstrapProcedure::TYPE_NAME,
            TopicBootstrapProcedure::loader_for(
                TopicPoolSpec::clone(&self.spec),
                self.kv.clone(),
                self.admin.clone(),
                self.recreated.clone(),
                self.acknowledged.clone(),
            ),
        )?;
        Ok(())
    }

    /// Persisted topics that bootstraps run in this process found missing on the brokers and recreated.
    pub fn recreated_topics(&self) -> Vec<String> {
        self.recreated
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    /// Runs (or joins, or resumes) the bootstrap procedure of this pool and waits for it, then loads the ready pool.
    ///
    /// The procedure id is fixed per pool (`topic_bootstrap/{prefix}`), so concurrent or repeated starts are one
    /// procedure. When the manager still retains a finished bootstrap under that id (a failed one, or one that
    /// made a smaller pool or topics of another partition count), the next id
    /// `topic_bootstrap/{prefix}/attempt-{k}` is used; the pool's exclusive lock key serialises them and each one is
    /// idempotent.
    pub async fn start(&self, manager: &ProcedureManagerRef) -> Result<()> {
        self.start_with(manager, false).await
    }

    /// [`Self::start`]; with `recreate_missing`, a pool topic gone from the brokers (or deleted and created again)
    /// is created anew and its new id recorded instead of failing the bootstrap (`walctl bootstrap
    /// --recreate-missing`).
    pub async fn start_with(
        &self,
        manager: &ProcedureManagerRef,
        recreate_missing: bool,
    ) -> Result<()> {
        let prefix = &self.spec.topic_name_prefix;
        let mut spec = TopicPoolSpec::clone(&self.spec);
        spec.recreate_missing = recreate_missing;
        for attempt in 0..MAX_BOOTSTRAP_ATTEMPTS {
            let id = bootstrap_procedure_id(prefix, attempt);
            let procedure =
                TopicBootstrapProcedure::new(spec.clone(), self.kv.clone(), self.admin.clone())?
                    .with_recreated_sink(self.recreated.clone())
                    .with_acknowledged_sink(self.acknowledged.clone());
            // A submission of a known id watches the procedure under it: a bootstrap this manager already knows
            // (finished, failed, or running) is judged here instead, and the next attempt's id is tried if it did
            // not make this pool.
            let known = manager
                .watch(&id)
                .await
                .context(TopicBootstrapSnafu { prefix })?;
            let submitted = match known {
                Some(_) => Err(procedures::Error::DuplicateProcedure { id: id.clone() }),
                None => {
                    manager
                        .submit(ProcedureWithId::new(id.clone(), Box::new(procedure)))
                        .await
                }
            };
            match submitted {
                Ok(mut watcher) => {
                    if let Err(source) = watcher.wait().await {
                        self.recheck_if_unchecked().await;
                        return Err(source).context(TopicBootstrapSnafu { prefix });
                    }
                    return self.load_ready().await;
                }
                Err(procedures::Error::DuplicateProcedure { .. }) => {
                    let Some(mut watcher) = manager
                        .watch(&id)
                        .await
                        .context(TopicBootstrapSnafu { prefix })?
                    else {
                        continue;
                    };
                    match watcher.wait().await {
                        Ok(output) => {
                            // It checked the topics' partition count: only its own (in its output) is vouched for.
                            let same_partitions = output
                                .as_ref()
                                .and_then(|o| o.get("num_partitions"))
                                .and_then(|p| p.as_i64())
                                == Some(i64::from(self.spec.num_partitions));
                            if same_partitions && self.load().await?.is_ok() {
                                return Ok(());
                            }
                            info!(%id, "an earlier bootstrap of the pool finished but the pool is incomplete, has another partition count or lost topics on the brokers; running the next one");
                        }
                        // A cancelled bootstrap made some topics and names and stopped (it deletes no topic): the
                        // next one resumes the pool from them.
                        Err(procedures::Error::ProcedureFailed { message, .. })
                        | Err(procedures::Error::ProcedureCancelled { message, .. }) => {
                            warn!(%id, %message, "an earlier bootstrap of the pool failed or was cancelled; running the next one");
                        }
                        Err(source) => {
                            return Err(source).context(TopicBootstrapSnafu { prefix });
                        }
                    }
                }
                Err(source) => return Err(source).context(TopicBootstrapSnafu { prefix }),
            }
        }
        TopicPoolNotReadySnafu {
            prefix: prefix.clone(),
            reason: format!("{MAX_BOOTSTRAP_ATTEMPTS} bootstrap procedures are retained for the pool; none completed it"),
        }
        .fail()
    }

    /// Loads the persisted names, reads the brokers' topic list (and, for topics it lacks whose creation this
    /// process did not see acknowledged since the last load, asks for them again a few times over about three
    /// seconds, as a broker learns of new topics after the controller), and makes the pool ready when every wanted
    /// topic is persisted and seen on the brokers with the pool's partition count; otherwise an
    /// error naming the topics that are not (the pool is then not ready: nothing is handed out). An unreachable
    /// broker is an error; it leaves a pool that was usable before usable, as unchecked
    /// ([`Self::brokers_checked`] false), and any other not ready.
    pub async fn load_ready(&self) -> Result<()> {
        match self.load().await? {
            Ok(()) => Ok(()),
            Err(reason) => TopicPoolNotReadySnafu {
                prefix: self.spec.topic_name_prefix.clone(),
                reason,
            }
            .fail(),
        }
    }

    /// Ok(()) and the pool made ready when complete and on the brokers, else why not (and the pool made not ready).
    ///
    /// The first load that finds the pool ready also counts the regions the store records per topic and seeds the
    /// selector with them, before any allocation can happen; later loads leave the selector's counts alone (they
    /// include this process's allocations, which the store may not show yet).
    async fn load(&self) -> Result<std::result::Result<(), String>> {
        let result = match self.check().await {
            Ok(Ok(topics)) => self.seed_selector().await.map(|()| Ok(topics)),
            other => other,
        };
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        let usable = match &*state {
            PoolState::Ready(topics) | PoolState::Persisted(topics) => Some(topics.clone()),
            PoolState::NotLoaded | PoolState::NotReady(_) => None,
        };
        *state = match (&result, usable) {
            (Ok(Ok(topics)), _) => PoolState::Ready(topics.clone()),
            (Ok(Err(reason)), _) => PoolState::NotReady(reason.as_str().into()),
            // A check that could not be made (brokers unreachable) teaches nothing about the pool: one the store
            // holds whole stays usable, as persisted and unchecked.
            (Err(_), Some(topics)) => PoolState::Persisted(topics),
            (Err(e), None) => {
                PoolState::NotReady(format!("the last check of the pool failed: {e}").into())
            }
        };
        drop(state);
        Ok(result?.map(|_| ()))
    }

    /// Makes the pool usable from the metadata store alone, without asking the brokers, when the store holds
    /// every wanted topic (`__topic_name/kafka/{prefix}_{i}` for each `i` in `0..num_topics`: the names the
    /// config's pool asks for, whatever else is persisted). Returns whether the pool is usable now.
    ///
    /// A pool already usable is left as it is. A complete one is seeded into the selector like a checked one
    /// and hands out its topics on the store's word: every persisted name was a topic the controller
    /// acknowledged or the brokers listed when the bootstrap persisted it. The brokers are checked by the next
    /// [`KafkaTopicManager::start`] or [`KafkaTopicManager::load_ready`]: a check that reaches them and misses a
    /// topic makes the pool not ready, one that cannot reach them leaves it usable ([`Self::brokers_checked`]
    /// tells which). An incomplete pool is not ready, naming the missing names, as a first start's is.
    pub async fn load_persisted(&self) -> Result<bool> {
        if self.is_ready() {
            return Ok(true);
        }
        let missing = self.not_persisted().await?;
        if !missing.is_empty() {
            *self.state.write().unwrap_or_else(|p| p.into_inner()) =
                PoolState::NotReady(self.not_persisted_reason(&missing).into());
            return Ok(false);
        }
        self.seed_selector().await?;
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        // A load that raced ahead and checked the brokers keeps its verdict.
        if matches!(*state, PoolState::NotLoaded | PoolState::NotReady(_)) {
            *state = PoolState::Persisted(Arc::new(self.spec.topic_names()));
        }
        Ok(matches!(
            *state,
            PoolState::Ready(_) | PoolState::Persisted(_)
        ))
    }

    /// After a bootstrap failed: a pool used on the store's word alone is loaded once more, so that brokers that
    /// answered the bootstrap with a refusal (a topic with another partition count than the config's) make it not
    /// ready, as they would have at a load; brokers that cannot be reached leave it as it is. Nothing is written.
    async fn recheck_if_unchecked(&self) {
        let unchecked = matches!(
            *self.state.read().unwrap_or_else(|p| p.into_inner()),
            PoolState::Persisted(_)
        );
        if unchecked && let Err(e) = self.load().await {
            debug!(pool = %self.spec.topic_name_prefix, error = %e, "the pool could not be checked after a failed bootstrap");
        }
    }

    /// Whether the pool is usable and its topics were seen on the brokers by the last load (false while it is
    /// usable on the store's word only, see [`Self::load_persisted`], and while it is not usable).
    pub fn brokers_checked(&self) -> bool {
        matches!(
            *self.state.read().unwrap_or_else(|p| p.into_inner()),
            PoolState::Ready(_)
        )
    }

    /// The wanted topics the store does not hold, in index order.
    async fn not_persisted(&self) -> Result<Vec<String>> {
        let persisted: BTreeSet<String> = list_persisted_topics(
            self.kv.as_ref(),
            &format!("{}_", self.spec.topic_name_prefix),
        )
        .await?
        .into_iter()
        .collect();
        Ok(self
            .spec
            .topic_names()
            .into_iter()
            .filter(|t| !persisted.contains(t))
            .collect())
    }

    /// Why a pool missing the names `missing` is not ready.
    fn not_persisted_reason(&self, missing: &[String]) -> String {
        format!(
            "{} of {} topics are not persisted (first: {:?})",
            missing.len(),
            self.spec.num_topics,
            missing.iter().take(5).collect::<Vec<_>>()
        )
    }

    /// Seeds the selector with the regions per topic the store records, while it still wants them (once for a
    /// load-aware selector, never for a blind one).
    async fn seed_selector(&self) -> Result<()> {
        if !self.selector.wants_counts() {
            return Ok(());
        }
        let counts = regions_per_topic(self.kv.as_ref()).await?;
        if self.selector.seed_counts(&counts) {
            info!(
                pool = %self.spec.topic_name_prefix,
                regions = counts.values().sum::<u64>(),
                topics = counts.len(),
                "counted the regions recorded per topic for load-aware selection"
            );
        }
        Ok(())
    }

    /// The wanted topics when every one is persisted and seen on the brokers with the pool's partition count, else
    /// why not. A topic is seen when the brokers list it with that count, or, when they do not list it, when a
    /// bootstrap of this process saw its creation acknowledged by the controller since the last load (a broker
    /// lists a topic only once it applied the controller's records and created the partitions' logs, well after
    /// the acknowledgement). The acknowledgements are used up by this load: a later load sees topics on the
    /// brokers again.
    async fn check(&self) -> Result<std::result::Result<Arc<Vec<String>>, String>> {
        let stored: BTreeMap<String, (Vec<u8>, TopicNameValue)> = list_persisted_values(
            self.kv.as_ref(),
            &format!("{}_", self.spec.topic_name_prefix),
        )
        .await?
        .into_iter()
        .map(|(topic, raw, value)| (topic, (raw, value)))
        .collect();
        let persisted: BTreeSet<String> = stored.keys().cloned().collect();
        let wanted = self.spec.topic_names();
        let missing: Vec<String> = wanted
            .iter()
            .filter(|t| !persisted.contains(*t))
            .cloned()
            .collect();
        if !missing.is_empty() {
            return Ok(Err(self.not_persisted_reason(&missing)));
        }
        let acknowledged =
            std::mem::take(&mut *self.acknowledged.lock().unwrap_or_else(|p| p.into_inner()));
        let listed_ids = self.admin.describe_topics_with_ids(&wanted).await?;
        let listed: BTreeMap<String, usize> = listed_ids
            .iter()
            .map(|(topic, (partitions, _))| (topic.clone(), *partitions))
            .collect();
        let expected = usize::try_from(self.spec.num_partitions).unwrap_or(0);
        let mut absent: Vec<&String> = wanted
            .iter()
            .filter(|t| match listed.get(*t) {
                Some(&count) => count != expected,
                None => !acknowledged.contains(*t),
            })
            .collect();
        // A broker learns of a topic from the controller's metadata log, after the controller acknowledged its
        // creation: right after a bootstrap, the broker that answers may not list it yet. Absence is confirmed by
        // asking for those topics again a few times over about three seconds before it is reported.
        let mut pause = METADATA_SETTLE_FIRST_PAUSE;
        for _ in 0..METADATA_SETTLE_READS {
            if absent.is_empty() {
                break;
            }
            tokio::time::sleep(pause).await;
            pause = pause.saturating_mul(2);
            let names: Vec<String> = absent.iter().map(|t| (*t).clone()).collect();
            let described = self.admin.describe_topics(&names).await?;
            absent.retain(|t| described.get(*t) != Some(&expected));
        }
        if !absent.is_empty() {
            return Ok(Err(format!(
                "{} of {} persisted topics are not on the brokers {:?} with {} partition(s) (first: {:?}); `walctl \
                 bootstrap` names what was lost, and `--recreate-missing` creates it anew",
                absent.len(),
                self.spec.num_topics,
                self.admin.endpoints(),
                self.spec.num_partitions,
                absent.iter().take(5).collect::<Vec<_>>()
            )));
        }
        if let Some(recreated) = self.check_ids(&stored, &listed_ids).await? {
            return Ok(Err(recreated));
        }
        // Also when no bootstrap runs (a retained one made a larger pool), shrinking is said out loud.
        let beyond: Vec<&String> = persisted
            .iter()
            .filter(|t| {
                self.spec
                    .pool_index(t)
                    .is_some_and(|i| i >= self.spec.num_topics)
            })
            .collect();
        if !beyond.is_empty() {
            warn!(
                pool = %self.spec.topic_name_prefix,
                num_topics = self.spec.num_topics,
                topics = ?beyond,
                "the pool shrank: these persisted topics are beyond num_topics; they are kept (never deleted) and \
                 regions already on them keep using them, but no new region gets them"
            );
        }
        Ok(Ok(Arc::new(wanted)))
    }

    /// Compares each persisted topic's recorded Kafka topic id with the one the brokers listed: a topic listed under
    /// another id was deleted and created again out of band, and the pool is not ready (why, naming it, is
    /// returned). A persisted topic without a recorded id gets the listed one, by a compare-and-put against the
    /// value read (a topic the bootstrap created was not listed yet when its name was persisted): the first load
    /// after the brokers list it records it. A late repeat by a deposed leader writes the same id or nothing.
    async fn check_ids(
        &self,
        stored: &BTreeMap<String, (Vec<u8>, TopicNameValue)>,
        listed: &BTreeMap<String, (usize, Option<TopicId>)>,
    ) -> Result<Option<String>> {
        let mut recreated = Vec::new();
        for topic in self.spec.topic_names() {
            let (Some((raw, value)), Some((_, Some(now)))) =
                (stored.get(&topic), listed.get(&topic))
            else {
                continue;
            };
            match value.topic_id {
                Some(recorded) if recorded != *now => {
                    recreated.push(format!("'{topic}' (id {recorded}, now {now})"));
                }
                Some(_) => {}
                None => {
                    let next = TopicNameValue {
                        topic_id: Some(*now),
                        ..*value
                    };
                    self.kv
                        .compare_and_put(crate::kv::CompareAndPutRequest {
                            key: topic_name_key(&topic),
                            expect: Some(raw.clone()),
                            value: next.encode(),
                        })
                        .await?;
                }
            }
        }
        if recreated.is_empty() {
            return Ok(None);
        }
        Ok(Some(format!(
            "{} of {} persisted topics were deleted and created again on the brokers {:?} (first: {}): what their \
             regions wrote there is lost; `walctl bootstrap` names them and their regions, and `--recreate-missing` \
             records the new incarnations",
            recreated.len(),
            self.spec.num_topics,
            self.admin.endpoints(),
            recreated
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )))
    }

    /// The pool's existing topics whose configs differ from the spec's `topic_config`, in index order then by
    /// config name: one DescribeConfigs read (a bounded few for huge pools) naming only the configured keys; the
    /// caller reports them (walctl prints one warning each). Nothing is read when no topic config is configured. Topics missing on the brokers are
    /// skipped (the pool's check reports them).
    pub async fn config_drift(&self) -> Result<Vec<TopicConfigDrift>> {
        let wanted = &self.spec.topic_config;
        if wanted.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<String> = wanted.keys().cloned().collect();
        let names = self.spec.topic_names();
        let actual = self.admin.describe_topic_configs(&names, &keys).await?;
        let mut drift = Vec::new();
        for topic in &names {
            let Some(configs) = actual.get(topic) else {
                continue;
            };
            for (key, value) in wanted {
                if configs.get(key) != Some(value) {
                    drift.push(TopicConfigDrift {
                        topic: topic.clone(),
                        key: key.clone(),
                        wanted: value.clone(),
                        actual: configs.get(key).cloned(),
                    });
                }
            }
        }
        Ok(drift)
    }

    /// The ready pool's topics, in index order; an error before the pool is ready.
    pub fn topics(&self) -> Result<Arc<Vec<String>>> {
        let reason = match &*self.state.read().unwrap_or_else(|p| p.into_inner()) {
            PoolState::Ready(topics) | PoolState::Persisted(topics) => return Ok(topics.clone()),
            PoolState::NotReady(reason) => reason.to_string(),
            PoolState::NotLoaded => {
                "the topic bootstrap has not completed (call start first)".to_string()
            }
        };
        TopicPoolNotReadySnafu {
            prefix: self.spec.topic_name_prefix.clone(),
            reason,
        }
        .fail()
    }

    /// Whether the pool is ready to allocate.
    pub fn is_ready(&self) -> bool {
        self.topics().is_ok()
    }

    /// WAL options for one new region, its topic chosen by the selector.
    pub fn alloc(&self) -> Result<WalOptions> {
        let topics = self.topics()?;
        Ok(WalOptions::kafka(self.selector.select(&topics)?.as_str()))
    }

    /// WAL options for `n` new regions, topics chosen by the selector.
    pub fn alloc_batch(&self, n: usize) -> Result<Vec<WalOptions>> {
        let topics = self.topics()?;
        Ok(self
            .selector
            .select_many(&topics, n)?
            .into_iter()
            .map(|t| WalOptions::kafka(t.as_str()))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_indices_round_trip() {
        let spec = TopicPoolSpec::new("wal_t", 3);
        assert_eq!(spec.topic_names(), ["wal_t_0", "wal_t_1", "wal_t_2"]);
        assert_eq!(spec.pool_index("wal_t_12"), Some(12));
        assert_eq!(spec.pool_index("wal_t_0"), Some(0));
        for not_ours in [
            "wal_t_",
            "wal_t_01",
            "wal_t_1a",
            "wal_t_x_1",
            "wal_t1",
            "other_1",
            "wal_t_-1",
        ] {
            assert_eq!(spec.pool_index(not_ours), None, "{not_ours}");
        }
    }

    #[test]
    fn validate_names_the_pool_and_the_problem() {
        let mut spec = TopicPoolSpec::new("p", 0);
        let err = spec.validate().unwrap_err().to_string();
        assert!(
            err.contains("'p'") && err.contains("num_topics is 0"),
            "{err}"
        );
        spec.num_topics = 1;
        spec.max_concurrent_creates = 0;
        let err = spec.validate().unwrap_err().to_string();
        assert!(err.contains("max_concurrent_creates"), "{err}");
        spec.max_concurrent_creates = 1;
        spec.validate().unwrap();
    }

    #[test]
    fn spec_follows_the_kafka_config() {
        let config = KafkaConfig {
            num_topics: 96,
            max_concurrent_creates: 5,
            ..Default::default()
        };
        let spec = TopicPoolSpec::from_config(&config);
        assert_eq!(spec.topic_names(), config.topic_names());
        assert_eq!(spec.num_partitions, config.num_partitions);
        assert_eq!(spec.replication_factor, config.replication_factor);
        assert_eq!(spec.max_concurrent_creates, 5);
        assert_eq!(spec.ready_poll.deadline, config.backoff.deadline);
        // Visibility polls start fast, whatever the admin's retry backoff.
        assert_eq!(spec.ready_poll.init, READY_POLL_INIT);
        assert_eq!(spec.ready_poll.max, READY_POLL_MAX);
    }

    #[test]
    fn spec_serialises_durations_readably() {
        let spec = TopicPoolSpec::new("p", 2);
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(json["ready_poll"]["deadline"], "5m");
        let back: TopicPoolSpec = serde_json::from_value(json).unwrap();
        assert_eq!(back, spec);
    }
}
