//! [`Metasrv`]: the façade an embedding metadata server and `walctl` both use.
//!
//! Built from a [`MetasrvConfig`], it opens the kv backend, creates the procedure manager on it with every
//! procedure loader registered (topic bootstrap, create table), the [`WalOptionsAllocator`] and the
//! [`DdlManager`]. [`Metasrv::start`] claims the procedure store (recovering and resuming every unfinished
//! procedure an earlier, killed process left behind) and readies the WAL pool; then tables can be created, the
//! open requests of a datanode built, procedures listed and the topic pool inspected.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use procedures::purge::PurgeOutcome;
use procedures::{LocalManager, ProcedureId, ProcedureInfo, ProcedureManagerRef};
use snafu::{ResultExt, ensure};

use crate::config::{MetadataBackend, MetasrvConfig};
use crate::datanode::{OpenRegions, RegionOpener, WalProviderKind};
use crate::ddl::error::{InvalidCreateTableSnafu, InvalidTableReferenceSnafu};
use crate::ddl::{
    CreateTableTask, DatanodeManagerRef, DatanodeTableValue, DdlContext, DdlManager,
    MemoryDatanodeManager, RoundRobinPeerSelector, TableMetadataAllocator, TableMetadataManager,
    TableMetadataManagerRef, TableName,
};
use crate::error::{
    CreateDataDirSnafu, MetasrvNotStartedSnafu, NoKafkaPoolSnafu, ProcedureNotFoundSnafu,
    ProcedurePurgeSnafu, Result,
};
use crate::key::topic_name::list_persisted_topics;
use crate::kv::redb::RedbOpenMode;
use crate::kv::state_store::LeaderFence;
use crate::kv::{CommitObserver, CountingKvBackend, KvBackendRef, RangeRequest, WatchedKvBackend};
use crate::wal::kafka::admin::TopicAdminRef;
use crate::wal::kafka::lazy_admin::LazyTopicAdmin;
use crate::wal::kafka::record_deleter::LazyRecordDeleter;
use crate::wal::kafka::timed_admin::{TimedTopicAdmin, TopicAdminObserver};
use crate::wal::kafka::{KafkaTopicManager, TopicConfigDrift};
use crate::wal::prune::round::WalPruneRound;
use crate::wal::prune::{RecordDeleterRef, WalPruneProcedure};
use crate::wal::{KafkaConfig, WalConfig, WalOptions, WalOptionsAllocator};

pub mod datanodes;
pub mod election;
pub mod failure_detector;
mod reports;
mod wal_prune;
pub mod wal_stats;

pub use reports::{
    BootstrapProgress, BootstrapReport, FailedDatanode, FailoverStatus, RegionPlacement,
    RegionSpread, TableRegions, TopicUsage, TopicsReport,
};

/// The namespacing kv wrapper, which lives in [`crate::kv`]; named here too for callers that found it here.
pub use crate::kv::NamespacedKvBackend;

/// The catalog of a table name given without one.
pub const DEFAULT_CATALOG: &str = "greptime";
/// The schema of a table name given without one.
pub const DEFAULT_SCHEMA: &str = "public";

/// How often [`Metasrv::bootstrap`] reports progress.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(200);

/// Pairs read per kv range request when scanning datanode table values.
const SCAN_PAGE: usize = 1024;

/// Parses `table`, `schema.table` or `catalog.schema.table` (defaults [`DEFAULT_CATALOG`] and
/// [`DEFAULT_SCHEMA`]) and validates every part; the error quotes the name as given.
pub fn parse_table_name(name: &str) -> Result<TableName> {
    let parts: Vec<&str> = name.split('.').collect();
    let full = match parts.as_slice() {
        [table] => TableName::new(DEFAULT_CATALOG, DEFAULT_SCHEMA, *table),
        [schema, table] => TableName::new(DEFAULT_CATALOG, *schema, *table),
        [catalog, schema, table] => TableName::new(*catalog, *schema, *table),
        _ => {
            return Err(InvalidTableReferenceSnafu {
                name,
                reason: format!(
                    "{} dot-separated parts; expected table, schema.table or catalog.schema.table",
                    parts.len()
                ),
            }
            .build()
            .into());
        }
    };
    if let Err(e) = full.validate() {
        // Quote the reference as typed once; name the part only when it is not the whole reference.
        let reason = match &e {
            crate::ddl::Error::InvalidName {
                what,
                name: part,
                reason,
            } if part == name => reason.clone(),
            crate::ddl::Error::InvalidName {
                what,
                name: part,
                reason,
            } => format!("{what} name '{part}': {reason}"),
            other => other.to_string(),
        };
        return Err(InvalidTableReferenceSnafu { name, reason }.build().into());
    }
    Ok(full)
}

/// The key whose presence pauses automatic failover (`walctl failover pause`).
pub const FAILOVER_PAUSE_KEY: &str = "__failover_pause";

/// The façade: kv backend, procedure manager, WAL options allocator, DDL manager.
pub struct Metasrv {
    config: MetasrvConfig,
    kv: KvBackendRef,
    /// Counts the commits every part of the metasrv makes on `kv` (which is this wrapper).
    commits: Arc<CountingKvBackend>,
    state_store: Arc<crate::kv::KvStateStore>,
    procedures: ProcedureManagerRef,
    local: Arc<LocalManager>,
    wal: Arc<WalOptionsAllocator>,
    topic_admin: Option<TopicAdminRef>,
    /// The same admin, timed for [`Metasrv::observe_topic_admin`] (Kafka only).
    timed_admin: Option<Arc<TimedTopicAdmin>>,
    /// What a WAL prune deletes records with (Kafka only).
    record_deleter: Option<RecordDeleterRef>,
    table_metadata: TableMetadataManagerRef,
    ddl: DdlManager,
    datanodes: DatanodeManagerRef,
    /// The datanodes that registered and heartbeat with this server while it leads.
    registry: Arc<datanodes::DatanodeRegistry>,
    /// What region migrations run against (the registry tells who leads a region).
    migration: crate::ddl::MigrationContext,
    started: AtomicBool,
    /// The procedures that were unfinished when the manager started (left by an earlier run).
    recovered: std::sync::Mutex<Vec<ProcedureId>>,
}

impl std::fmt::Debug for Metasrv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metasrv")
            .field("kv", &self.kv.name())
            .field("wal", &self.config.wal)
            .field("datanodes", &self.config.datanodes.ids)
            .finish_non_exhaustive()
    }
}

impl Metasrv {
    /// Validates `config`, opens its kv backend (creating the redb file and its directory when missing,
    /// connecting to etcd) and builds everything on it. Kafka brokers are contacted only when first needed.
    pub async fn new(config: MetasrvConfig) -> Result<Self> {
        Self::open(config, RedbOpenMode::CreateIfMissing).await
    }

    /// Like [`Metasrv::new`], choosing whether a missing redb file may be created: a caller that only reads
    /// metadata passes [`RedbOpenMode::MustExist`] and gets [`kv::Error::RedbMissing`](crate::kv::Error::RedbMissing) naming the path (and no file, no
    /// directory) when nothing was ever stored there. An empty or damaged redb file is an error in both modes. The
    /// mode matters only for the redb backend.
    pub async fn open(config: MetasrvConfig, mode: RedbOpenMode) -> Result<Self> {
        Self::open_fenced(config, mode, None).await
    }

    /// Like [`Metasrv::open`]; with a `fence`, the procedure manager takes its epoch from the election that fills
    /// it instead of claiming one, and every state write is conditional on that leadership
    /// ([`crate::kv::KvStateStore::with_leader_fence`]). `walctl serve` on etcd opens it so.
    pub async fn open_fenced(
        config: MetasrvConfig,
        mode: RedbOpenMode,
        fence: Option<Arc<LeaderFence>>,
    ) -> Result<Self> {
        config.validate()?;
        let kv = open_kv_backend(&config, mode).await?;
        let datanodes: DatanodeManagerRef = Arc::new(MemoryDatanodeManager::new());
        Self::build(config, kv, None, datanodes, fence)
    }

    /// Builds a metasrv on an already open kv backend, with an optional topic admin (by default one over the
    /// configured brokers) and the datanodes regions are created on. Registers every loader. The
    /// `[metadata_store]` settings are not used here: wrap `kv` in a [`NamespacedKvBackend`] for a key prefix.
    pub fn with_parts(
        config: MetasrvConfig,
        kv: KvBackendRef,
        topic_admin: Option<TopicAdminRef>,
        datanodes: DatanodeManagerRef,
    ) -> Result<Self> {
        Self::build(config, kv, topic_admin, datanodes, None)
    }

    /// [`Metasrv::with_parts`] with the epoch taken from a leader fence (see [`Metasrv::open_fenced`]).
    pub fn with_parts_fenced(
        config: MetasrvConfig,
        kv: KvBackendRef,
        topic_admin: Option<TopicAdminRef>,
        datanodes: DatanodeManagerRef,
        fence: Arc<LeaderFence>,
    ) -> Result<Self> {
        Self::build(config, kv, topic_admin, datanodes, Some(fence))
    }

    fn build(
        config: MetasrvConfig,
        kv: KvBackendRef,
        topic_admin: Option<TopicAdminRef>,
        datanodes: DatanodeManagerRef,
        fence: Option<Arc<LeaderFence>>,
    ) -> Result<Self> {
        config.validate()?;
        let commits = Arc::new(CountingKvBackend::new(kv));
        // What the datanode registry caches per term is decoded from these keys (assignments, routes, dropped regions): it trusts a cached copy only while
        // no write to them ended through this handle (`DatanodeRegistry`).
        let watched = Arc::new(WatchedKvBackend::new(
            commits.clone(),
            vec![
                format!("{}/", crate::key::datanode_table::DATANODE_TABLE_KEY_PREFIX).into_bytes(),
                format!("{}/", crate::key::table_route::TABLE_ROUTE_KEY_PREFIX).into_bytes(),
                crate::key::region_drop::REGION_DROP_PREFIX
                    .as_bytes()
                    .to_vec(),
            ],
        ));
        let kv: KvBackendRef = watched.clone();
        let mut state_store = crate::kv::KvStateStore::new(kv.clone())
            .with_group_commit(config.procedure.group_commit);
        if let Some(fence) = fence {
            state_store = state_store.with_leader_fence(fence);
        }
        let state_store = Arc::new(state_store);
        let local = Arc::new(LocalManager::new(
            state_store.clone(),
            config.procedure.manager_config(),
        ));
        let procedures: ProcedureManagerRef = local.clone();

        let (wal, topic_admin, timed_admin) = match &config.wal {
            WalConfig::RaftEngine => (WalOptionsAllocator::RaftEngine, None, None),
            WalConfig::Kafka(kafka) => {
                let admin: TopicAdminRef = match topic_admin {
                    Some(admin) => admin,
                    None => Arc::new(LazyTopicAdmin::new(kafka.clone())),
                };
                let timed = Arc::new(TimedTopicAdmin::new(admin));
                let admin: TopicAdminRef = timed.clone();
                let topics = KafkaTopicManager::from_config(kafka, kv.clone(), admin.clone())?;
                (WalOptionsAllocator::Kafka(topics), Some(admin), Some(timed))
            }
        };
        let wal = Arc::new(wal);
        wal.register_loaders(procedures.as_ref())?;

        let table_metadata: TableMetadataManagerRef =
            Arc::new(TableMetadataManager::new(kv.clone()));
        // The procedure store is in the same kv: reservations are fenced by the manager's epoch.
        let allocator = Arc::new(
            TableMetadataAllocator::new(
                kv.clone(),
                Arc::new(RoundRobinPeerSelector::new(config.datanodes.ids.clone())),
                wal.clone(),
            )
            .with_epoch_fence(format!(
                "{}{}",
                crate::kv::state_store::PROCEDURE_PREFIX,
                procedures::record::EPOCH_KEY
            )),
        );
        let ddl = DdlManager::new(
            procedures.clone(),
            DdlContext {
                metadata: table_metadata.clone(),
                allocator,
                datanodes: datanodes.clone(),
            },
        );
        ddl.register_loaders()?;
        let expected = match &config.wal {
            WalConfig::RaftEngine => WalProviderKind::RaftEngine,
            WalConfig::Kafka(_) => WalProviderKind::Kafka,
        };
        let registry = Arc::new(
            datanodes::DatanodeRegistry::new(kv.clone(), config.datanodes.ids.clone(), expected)
                .with_write_generation(watched.generation())
                .with_failover(config.failover.clone()),
        );
        let migration = crate::ddl::MigrationContext {
            metadata: table_metadata.clone(),
            datanode_ids: config.datanodes.ids.clone(),
            leadership: registry.clone(),
            epoch_key: Some(format!(
                "{}{}",
                crate::kv::state_store::PROCEDURE_PREFIX,
                procedures::record::EPOCH_KEY
            )),
        };
        procedures.register_loader(
            crate::ddl::REGION_MIGRATION_TYPE_NAME,
            crate::ddl::RegionMigrationProcedure::loader(migration.clone()),
        )?;
        procedures.register_loader(
            crate::ddl::DROP_TABLE_TYPE_NAME,
            crate::ddl::DropTableProcedure::loader(migration.clone()),
        )?;
        procedures.register_loader(
            crate::ddl::DATANODE_FAILOVER_TYPE_NAME,
            crate::ddl::DatanodeFailoverProcedure::loader(migration.clone()),
        )?;
        let record_deleter = match &config.wal {
            WalConfig::RaftEngine => None,
            WalConfig::Kafka(kafka) => {
                let deleter: RecordDeleterRef = Arc::new(LazyRecordDeleter::new(kafka.clone()));
                procedures.register_loader(
                    WalPruneProcedure::TYPE_NAME,
                    WalPruneProcedure::loader(kv.clone(), deleter.clone()),
                )?;
                procedures.register_loader(
                    WalPruneRound::TYPE_NAME,
                    WalPruneRound::loader(kv.clone(), deleter.clone()),
                )?;
                Some(deleter)
            }
        };

        Ok(Metasrv {
            registry,
            migration,
            config,
            kv,
            commits,
            state_store,
            procedures,
            local,
            wal,
            topic_admin,
            timed_admin,
            record_deleter,
            table_metadata,
            ddl,
            datanodes,
            started: AtomicBool::new(false),
            recovered: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// The config it was built from.
    pub fn config(&self) -> &MetasrvConfig {
        &self.config
    }

    /// The kv backend.
    pub fn kv(&self) -> &KvBackendRef {
        &self.kv
    }

    /// The DDL manager: what `walctl serve` submits a create-table through when it does not wait for it
    /// ([`DdlManager::submit_create_table`]).
    pub fn ddl(&self) -> &DdlManager {
        &self.ddl
    }

    /// The procedure manager.
    pub fn procedure_manager(&self) -> &ProcedureManagerRef {
        &self.procedures
    }

    /// The datanodes regions are created on.
    pub fn datanodes(&self) -> &DatanodeManagerRef {
        &self.datanodes
    }

    /// Whether the procedure manager runs (between [`Metasrv::start_procedures`] and [`Metasrv::stop`]).
    pub fn is_started(&self) -> bool {
        self.started.load(Ordering::SeqCst)
    }

    /// Whether new regions can get WAL options now (raft-engine: always; Kafka: once the pool is ready).
    pub fn is_wal_ready(&self) -> bool {
        self.wal.is_ready()
    }

    /// The lock keys every procedure of this process holds or waits for (empty when the manager is not started).
    pub fn locks(&self) -> Vec<procedures::manager::ProcedureLocks> {
        self.local.locks()
    }

    /// The commits made on the kv backend through this metasrv since it was built: procedure state, allocations,
    /// id sequences and table metadata alike (what counts as one: [`CountingKvBackend`]).
    pub fn kv_commits(&self) -> u64 {
        self.commits.commits()
    }

    /// Tells `observer` of every step the procedure manager's procedures finish and every retry they schedule.
    pub fn observe_procedures(&self, observer: procedures::ProcedureObserverRef) {
        self.local.set_observer(observer);
    }

    /// Tells `observer` of every commit made on the kv backend through this metasrv, with its latency.
    pub fn observe_commits(&self, observer: Arc<dyn CommitObserver>) {
        self.commits.set_observer(observer);
    }

    /// Tells `observer` of every call this metasrv makes to the Kafka brokers' topic administration, with its
    /// latency. Nothing is reported with the raft-engine WAL.
    pub fn observe_topic_admin(&self, observer: Arc<dyn TopicAdminObserver>) {
        if let Some(timed) = &self.timed_admin {
            timed.set_observer(observer);
        }
    }

    /// How many procedure-state writes a leader fence refused (0 without one).
    pub fn fenced_writes(&self) -> u64 {
        self.state_store
            .leader_fence()
            .map_or(0, |fence| fence.fenced_writes())
    }

    /// [`Metasrv::start_procedures`], then readies the WAL pool (for Kafka: runs or resumes the topic bootstrap
    /// and waits for it). Afterwards tables can be created.
    pub async fn start(&self) -> Result<()> {
        self.start_procedures().await?;
        Ok(self.wal.start(&self.procedures).await?)
    }

    /// Starts the procedure manager: it claims the store (fencing any older manager) and recovers and resumes
    /// every unfinished procedure. Enough for listing procedures, building open requests and reading the pool.
    ///
    /// What the recovered procedures need is loaded first: a Kafka pool whose names are all persisted is usable
    /// before any recovered create-table runs its Allocate step, from the store alone (the brokers are not asked
    /// here, so an unreachable Kafka does not hold the start back; [`Metasrv::start`] and [`Metasrv::bootstrap`]
    /// check them). A pool not bootstrapped yet is no error here (the step waits, retrying, and loads the pool
    /// again on each attempt).
    pub async fn start_procedures(&self) -> Result<()> {
        if self.started.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.load_persisted_pool().await;
        if let Err(e) = self.procedures.start().await {
            self.started.store(false, Ordering::SeqCst);
            return Err(e.into());
        }
        let recovered: Vec<ProcedureId> = self
            .procedures
            .list_procedures()
            .await?
            .into_iter()
            .filter(|p| !p.state.is_finished())
            .map(|p| p.id)
            .collect();
        *self.recovered.lock().unwrap_or_else(|e| e.into_inner()) = recovered;
        Ok(())
    }

    /// Loads the persisted Kafka pool, if it is complete, into the allocator from the store alone
    /// ([`KafkaTopicManager::load_persisted`]: usable, its brokers unchecked). Best effort: a pool not
    /// bootstrapped yet is logged at debug, any other error (the metadata store unreachable) as a warning, and the
    /// start goes on (the procedure manager's start reports an unreachable store itself; a create-table step
    /// retries the load).
    async fn load_persisted_pool(&self) {
        let WalOptionsAllocator::Kafka(topics) = self.wal.as_ref() else {
            return;
        };
        if topics.is_ready() {
            return;
        }
        match topics.load_persisted().await {
            Ok(true) => {
                tracing::info!(
                    pool = %topics.spec().topic_name_prefix,
                    "the Kafka topic pool is loaded from the metadata store; its brokers are not checked yet"
                );
            }
            Ok(false) => tracing::debug!("the Kafka topic pool is not bootstrapped yet"),
            Err(e) => {
                tracing::warn!(error = %e, "could not load the persisted Kafka topic pool before recovering procedures");
            }
        }
    }

    /// Whether the WAL's brokers were checked: `None` for raft-engine (no brokers); for Kafka, whether the pool is
    /// usable and the last load saw its topics on the brokers (false while it is used on the store's word alone,
    /// as after [`Metasrv::start_procedures`] until [`Metasrv::bootstrap`] reaches the brokers).
    pub fn wal_brokers_checked(&self) -> Option<bool> {
        match self.wal.as_ref() {
            WalOptionsAllocator::RaftEngine => None,
            WalOptionsAllocator::Kafka(topics) => Some(topics.brokers_checked()),
        }
    }

    /// Waits until every procedure that was unfinished when the manager started — what an earlier, killed run
    /// left behind, now resumed — has finished, and returns what became of each (a failed one is returned with its
    /// error, not as an `Err`). `walctl` calls this before commands whose output depends on those procedures.
    pub async fn finish_recovered(&self) -> Result<Vec<ProcedureInfo>> {
        self.ensure_started("finish recovered procedures")?;
        let ids = self
            .recovered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(mut watcher) = self.procedures.watch(&id).await? {
                // The outcome is read from the procedure's state below, failed or not.
                let _ = watcher.wait().await;
            }
            if let Some(info) = self.procedures.procedure_state(&id).await? {
                out.push(info);
            }
        }
        Ok(out)
    }

    /// Stops the procedure manager; unfinished procedures stay in the store and resume at the next start (which
    /// claims a new epoch). Returns once every task of the manager has ended, so the kv backend is then held only
    /// by this metasrv: dropping it releases the store (a redb file can be opened again at once).
    pub async fn stop(&self) -> Result<()> {
        if self.started.swap(false, Ordering::SeqCst) {
            self.procedures.stop().await?;
        }
        Ok(())
    }

    fn ensure_started(&self, operation: &str) -> Result<()> {
        ensure!(
            self.started.load(Ordering::SeqCst),
            MetasrvNotStartedSnafu { operation }
        );
        Ok(())
    }

    /// Readies the WAL pool like [`Metasrv::start`] does, calling `on_progress` every 200 ms while a Kafka pool's
    /// topics are being created (how many wanted topics the brokers show and how many names are persisted).
    /// Nothing to do for raft-engine. Starts the procedure manager first if needed.
    pub async fn bootstrap(
        &self,
        on_progress: impl Fn(BootstrapProgress) + Send + Sync,
    ) -> Result<BootstrapReport> {
        self.bootstrap_with(false, on_progress).await
    }

    /// [`Metasrv::bootstrap`]; with `recreate_missing`, pool topics gone from the brokers (or deleted and created
    /// again) are created anew and their new ids recorded, instead of failing with
    /// [`crate::wal::Error::PoolTopicsLost`].
    pub async fn bootstrap_with(
        &self,
        recreate_missing: bool,
        on_progress: impl Fn(BootstrapProgress) + Send + Sync,
    ) -> Result<BootstrapReport> {
        self.start_procedures().await?;
        let WalConfig::Kafka(kafka) = &self.config.wal else {
            self.wal.start(&self.procedures).await?;
            return Ok(BootstrapReport {
                provider: "raft_engine".to_string(),
                topic_name_prefix: None,
                num_topics: 0,
                ready: self.wal.is_ready(),
                recreated_topics: 0,
                config_drift: Vec::new(),
            });
        };
        let wanted: BTreeSet<String> = kafka.topic_names().into_iter().collect();
        let start = self.wal.start_with(&self.procedures, recreate_missing);
        tokio::pin!(start);
        let mut tick = tokio::time::interval(PROGRESS_INTERVAL);
        // The bootstrap's end preempts a progress poll in flight (which may be waiting on an unreachable broker).
        let result = loop {
            tokio::select! {
                result = &mut start => break result,
                _ = tick.tick() => {}
            }
            tokio::select! {
                result = &mut start => break result,
                progress = self.bootstrap_progress(kafka, &wanted) => {
                    // Progress is best effort: a failed poll only skips this report.
                    if let Ok(progress) = progress {
                        on_progress(progress);
                    }
                }
            }
        };
        result?;
        self.wait_until_listed(kafka, &wanted, &on_progress).await?;
        on_progress(BootstrapProgress {
            wanted: wanted.len(),
            on_broker: wanted.len(),
            persisted: wanted.len(),
        });
        Ok(BootstrapReport {
            provider: "kafka".to_string(),
            topic_name_prefix: Some(kafka.topic_name_prefix.clone()),
            num_topics: kafka.num_topics,
            ready: self.wal.is_ready(),
            recreated_topics: match self.wal.as_ref() {
                WalOptionsAllocator::Kafka(topics) => topics.recreated_topics().len(),
                WalOptionsAllocator::RaftEngine => 0,
            },
            config_drift: self.config_drift().await?,
        })
    }

    /// Ready means listed: after the bootstrap, polls each broker (its Metadata, from its own cache of the
    /// controller's records) until every one lists every topic of the pool, reporting progress (`on_broker`: the
    /// fewest any broker lists). A creation the controller acknowledged is in the cluster's metadata, but a client
    /// of a broker that has not applied it yet finds no such topic. Bounded by `create_topic_timeout`: past it, a
    /// retryable `TopicNotListed` naming a topic and the broker that does not list it.
    async fn wait_until_listed(
        &self,
        kafka: &KafkaConfig,
        wanted: &BTreeSet<String>,
        on_progress: &(impl Fn(BootstrapProgress) + Send + Sync),
    ) -> Result<()> {
        let Some(admin) = &self.topic_admin else {
            return Ok(());
        };
        let names: Vec<String> = wanted.iter().cloned().collect();
        let deadline = tokio::time::Instant::now() + kafka.create_topic_timeout;
        let mut pause = Duration::from_millis(10);
        loop {
            let listed = admin.describe_topics_on_each_broker(&names).await?;
            let missing = listed.iter().find_map(|(endpoint, topics)| {
                names
                    .iter()
                    .find(|n| !topics.contains_key(*n))
                    .map(|topic| (endpoint.clone(), topic.clone()))
            });
            let Some((endpoint, topic)) = missing else {
                return Ok(());
            };
            let fewest = listed.iter().map(|(_, t)| t.len()).min().unwrap_or(0);
            on_progress(BootstrapProgress {
                wanted: wanted.len(),
                on_broker: fewest,
                persisted: wanted.len(),
            });
            if tokio::time::Instant::now() >= deadline {
                return Err(crate::wal::error::TopicNotListedSnafu {
                    topic,
                    endpoints: vec![endpoint],
                    timeout: kafka.create_topic_timeout,
                }
                .build()
                .into());
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    async fn bootstrap_progress(
        &self,
        kafka: &KafkaConfig,
        wanted: &BTreeSet<String>,
    ) -> Result<BootstrapProgress> {
        let persisted = self.persisted_topics(kafka).await?;
        let on_broker = match &self.topic_admin {
            Some(admin) => admin
                .list_topics()
                .await?
                .keys()
                .filter(|t| wanted.contains(*t))
                .count(),
            None => 0,
        };
        Ok(BootstrapProgress {
            wanted: wanted.len(),
            on_broker,
            persisted: persisted.iter().filter(|t| wanted.contains(*t)).count(),
        })
    }

    async fn persisted_topics(&self, kafka: &KafkaConfig) -> Result<BTreeSet<String>> {
        Ok(
            list_persisted_topics(self.kv.as_ref(), &format!("{}_", kafka.topic_name_prefix))
                .await?
                .into_iter()
                .collect(),
        )
    }

    /// Creates a table of `regions` regions and returns its id, reading nothing back (the work `walctl bench ddl`
    /// measures). An existing table of that name is an error and is left as it is. Needs [`Metasrv::start`].
    pub async fn create_table_only(&self, name: TableName, regions: u32) -> Result<u32> {
        self.ensure_started("create table")?;
        Ok(self
            .ddl
            .create_table_with_id(CreateTableTask::new(name, regions), None)
            .await?)
    }

    /// Creates a table of `regions` regions (or, with `if_not_exists`, finds the existing one) and returns it
    /// with each region's datanode and WAL options as recorded. Needs [`Metasrv::start`].
    pub async fn create_table(
        &self,
        name: TableName,
        regions: u32,
        if_not_exists: bool,
    ) -> Result<TableRegions> {
        self.create_table_with_id(name, regions, if_not_exists, None)
            .await
    }

    /// [`Metasrv::create_table`] under a caller-chosen procedure id (`walctl create-table --id`): a retry with the
    /// same id and request returns the same table and regions, even after the first call succeeded; the id with
    /// another request is refused naming it (see [`DdlManager::create_table_with_id`]). An empty id is refused.
    pub async fn create_table_with_id(
        &self,
        name: TableName,
        regions: u32,
        if_not_exists: bool,
        procedure_id: Option<&str>,
    ) -> Result<TableRegions> {
        self.ensure_started("create table")?;
        ensure!(
            procedure_id.is_none_or(|id| !id.trim().is_empty()),
            InvalidCreateTableSnafu {
                table: name.to_string(),
                reason: "the procedure id is empty",
            }
        );
        let mut task = CreateTableTask::new(name.clone(), regions);
        task.if_not_exists = if_not_exists;
        let table_id = self
            .ddl
            .create_table_with_id(task, procedure_id.map(ProcedureId::new))
            .await?;
        self.table_regions(&name, table_id).await
    }

    /// The id of table `name`, if it exists.
    pub async fn table_id(&self, name: &TableName) -> Result<Option<u32>> {
        Ok(self.table_metadata.table_id(name).await?)
    }

    /// A table's regions with their datanodes and WAL options, read from its route and datanode table values.
    pub async fn table_regions(&self, name: &TableName, table_id: u32) -> Result<TableRegions> {
        let mut regions = Vec::new();
        if let Some(route) = self.table_metadata.table_route(table_id).await? {
            for (datanode_id, numbers) in route.regions_by_datanode() {
                let value = self
                    .table_metadata
                    .datanode_table(datanode_id, table_id)
                    .await?;
                for region_number in numbers {
                    let wal_options = value
                        .as_ref()
                        .and_then(|v| v.region_wal_options.get(&region_number).cloned())
                        .unwrap_or_default();
                    regions.push(RegionPlacement {
                        region_number,
                        region_id: crate::ddl::region::region_id(table_id, region_number),
                        datanode_id,
                        wal_options,
                    });
                }
            }
        }
        regions.sort_by_key(|r| r.region_number);
        Ok(TableRegions {
            table: name.to_string(),
            table_id,
            regions,
        })
    }

    /// Submits a [`crate::ddl::RegionMigrationProcedure`] moving region `region_id` to datanode `to`; returns its
    /// id and a watcher of it. A request refused (an unknown region or datanode, a region on a raft-engine WAL)
    /// leaves no record; its watcher gets [`procedures::Error::ProcedureRefused`]. The region leads on `to` once
    /// that datanode heartbeats to this leader after the old leader's lease ran out. Needs [`Metasrv::start`].
    pub async fn submit_region_migration(
        &self,
        region_id: u64,
        to: u64,
    ) -> Result<(ProcedureId, procedures::Watcher)> {
        self.ensure_started("migrate a region")?;
        let procedure = procedures::ProcedureWithId::with_random_id(Box::new(
            crate::ddl::RegionMigrationProcedure::new(
                crate::ddl::RegionMigrationTask {
                    region_id,
                    to,
                    only_from: None,
                },
                self.migration.clone(),
            ),
        ));
        let id = procedure.id.clone();
        let watcher = self.procedures.submit(procedure).await?;
        Ok((id, watcher))
    }

    /// Pauses automatic failover (maintenance: a datanode restarted on purpose must not have its regions moved):
    /// persisted at [`FAILOVER_PAUSE_KEY`], so it holds across restarts and leader changes until
    /// [`Metasrv::resume_failover`]. Failovers already running go on. Returns whether it was paused before.
    pub async fn pause_failover(&self) -> Result<bool> {
        let previous = self
            .kv
            .put(crate::kv::PutRequest {
                key: FAILOVER_PAUSE_KEY.as_bytes().to_vec(),
                value: serde_json::json!({ "paused_at_ms": procedures::record::now_ms() })
                    .to_string()
                    .into_bytes(),
                prev_kv: true,
            })
            .await?;
        Ok(previous.is_some())
    }

    /// Resumes automatic failover; returns whether it was paused.
    pub async fn resume_failover(&self) -> Result<bool> {
        let removed = self
            .kv
            .batch_delete(&[FAILOVER_PAUSE_KEY.as_bytes().to_vec()], true)
            .await?;
        Ok(!removed.is_empty())
    }

    /// Whether automatic failover is paused ([`Metasrv::pause_failover`]).
    pub async fn failover_paused(&self) -> Result<bool> {
        Ok(self.kv.get(FAILOVER_PAUSE_KEY.as_bytes()).await?.is_some())
    }

    /// What automatic failover stands at: enabled by the config, paused by an operator, and the datanode
    /// incarnations this leader finds failed now (empty off the leader).
    pub async fn failover_status(&self) -> Result<FailoverStatus> {
        let failed: Vec<FailedDatanode> = self
            .registry
            .failed()
            .await?
            .into_iter()
            .map(|(datanode, incarnation)| FailedDatanode {
                datanode,
                incarnation,
            })
            .collect();
        let mut unavailable_regions = Vec::new();
        if matches!(self.config.wal, WalConfig::RaftEngine) {
            for f in &failed {
                let prefix = crate::key::datanode_table::datanode_table_prefix(f.datanode);
                let records =
                    crate::kv::range_all(self.kv.as_ref(), RangeRequest::prefix(prefix), SCAN_PAGE)
                        .await?;
                for kv in records {
                    if let Ok(value) = serde_json::from_slice::<DatanodeTableValue>(&kv.value) {
                        unavailable_regions.extend(
                            value
                                .regions
                                .iter()
                                .map(|n| crate::ddl::region::region_id(value.table_id, *n)),
                        );
                    }
                }
            }
            unavailable_regions.sort_unstable();
        }
        Ok(FailoverStatus {
            enabled: self.config.failover.enabled,
            paused: self.failover_paused().await?,
            failed,
            unavailable_regions,
        })
    }

    /// Fails over every datanode incarnation the registry finds failed ([`datanodes::DatanodeRegistry::failed`]):
    /// submits a [`crate::ddl::DatanodeFailoverProcedure`] under [`crate::ddl::failover_procedure_id`] for each,
    /// which a failover already known under that id is not started again by. Returns the failovers submitted by
    /// this call. Does nothing when `[failover] enabled = false`, while paused, and on the raft-engine WAL (no
    /// region could move). Needs [`Metasrv::start`] and a term.
    pub async fn fail_over_failed_datanodes(&self) -> Result<Vec<ProcedureId>> {
        // On the raft-engine WAL no region can move (each WAL is on its datanode's disk): nothing to fail over,
        // and retiring a datanode that only paused would stop it for nothing.
        if !self.config.failover.enabled || matches!(self.config.wal, WalConfig::RaftEngine) {
            return Ok(Vec::new());
        }
        // The registry's suspicion is in memory: the pause is read from the store only when someone failed.
        let failed = self.registry.failed().await?;
        if failed.is_empty() || self.failover_paused().await? {
            return Ok(Vec::new());
        }
        self.ensure_started("fail over datanodes")?;
        let mut submitted = Vec::new();
        for (datanode_id, incarnation) in failed {
            // Retired first: the failed process, back, is stale; a later failure is another incarnation's.
            self.registry.retire(datanode_id, incarnation).await?;
            let id = crate::ddl::failover_procedure_id(datanode_id, incarnation);
            let procedure = procedures::ProcedureWithId::new(
                id.clone(),
                Box::new(crate::ddl::DatanodeFailoverProcedure::new(
                    datanode_id,
                    incarnation,
                    self.migration.clone(),
                )),
            );
            let watcher = self.procedures.submit(procedure).await?;
            if watcher.is_new_submission() {
                submitted.push(id);
            }
        }
        Ok(submitted)
    }

    /// Drops table `name` with a [`crate::ddl::DropTableProcedure`] and returns its output
    /// (`{"table_id","dropped","regions"}`): its metadata goes (through tombstones), its regions close on the
    /// datanodes as their heartbeats find no route for them, and its regions' `__topic_region` keys go with it, so
    /// the prune no longer waits for them. A table that does not exist is [`crate::ddl::Error::TableNotFound`] (no record
    /// left), or `"dropped": false` with `if_exists`. Needs [`Metasrv::start`].
    pub async fn drop_table(&self, name: TableName, if_exists: bool) -> Result<serde_json::Value> {
        self.ensure_started("drop table")?;
        let table_id = self.table_metadata.table_id(&name).await?;
        let procedure = procedures::ProcedureWithId::with_random_id(Box::new(
            crate::ddl::DropTableProcedure::new(
                crate::ddl::DropTableTask {
                    name,
                    if_exists,
                    table_id,
                },
                self.migration.clone(),
            ),
        ));
        let mut watcher = self.procedures.submit(procedure).await?;
        let output = watcher.wait().await?;
        Ok(output.unwrap_or(serde_json::Value::Null))
    }

    /// Checks a region migration without submitting it: the region's current datanode and epoch, or the error
    /// refusing it (see [`crate::ddl::RegionMigrationProcedure::check`]).
    pub async fn check_region_migration(&self, region_id: u64, to: u64) -> Result<(u64, u64)> {
        Ok(crate::ddl::RegionMigrationProcedure::check(
            crate::ddl::RegionMigrationTask {
                region_id,
                to,
                only_from: None,
            },
            self.migration.clone(),
        )
        .await?)
    }

    /// The datanode registry: registrations, heartbeats and region leases (used while this server leads; see
    /// [`datanodes::DatanodeRegistry::begin_term`]).
    pub fn datanode_registry(&self) -> &Arc<datanodes::DatanodeRegistry> {
        &self.registry
    }

    /// Table `name`'s regions with their leader datanodes, the datanodes' registered addresses and the regions'
    /// epochs: what a client routes writes by. An error naming the table when it does not exist.
    pub async fn table_leaders(&self, name: &TableName) -> Result<datanodes::TableLeaders> {
        let Some(table_id) = self.table_id(name).await? else {
            return crate::error::WalTableNotFoundSnafu {
                operation: "table route",
                table: name.to_string(),
            }
            .fail();
        };
        let placed = self.table_regions(name, table_id).await?;
        let route = self.table_metadata.table_route(table_id).await?;
        let ids: BTreeSet<u64> = placed.regions.iter().map(|r| r.datanode_id).collect();
        let addresses = datanodes::registered_addresses(&self.kv, &ids).await?;
        Ok(datanodes::TableLeaders {
            table: placed.table,
            table_id,
            regions: placed
                .regions
                .into_iter()
                .map(|r| datanodes::RegionLeader {
                    region_number: r.region_number,
                    region_id: r.region_id,
                    datanode_id: r.datanode_id,
                    address: addresses.get(&r.datanode_id).cloned(),
                    epoch: route
                        .as_ref()
                        .map_or(0, |route| route.region_epoch(r.region_number)),
                    wal_options: r.wal_options,
                })
                .collect(),
        })
    }

    /// The open requests datanode `datanode_id` would issue, and an error for each region it cannot open.
    pub async fn open_regions(&self, datanode_id: u64) -> Result<OpenRegions> {
        let expected = match self.config.wal {
            WalConfig::RaftEngine => WalProviderKind::RaftEngine,
            WalConfig::Kafka(_) => WalProviderKind::Kafka,
        };
        RegionOpener::new(self.kv.clone(), datanode_id, expected)
            .open_regions()
            .await
    }

    /// Every known procedure (running, and finished ones still retained), sorted by id.
    pub async fn list_procedures(&self) -> Result<Vec<ProcedureInfo>> {
        self.ensure_started("list procedures")?;
        Ok(self.procedures.list_procedures().await?)
    }

    /// One procedure; an error naming the id when it is unknown.
    pub async fn procedure(&self, id: &str) -> Result<ProcedureInfo> {
        self.ensure_started("show procedure")?;
        self.procedures
            .procedure_state(&ProcedureId::new(id))
            .await?
            .ok_or_else(|| ProcedureNotFoundSnafu { id }.build())
    }

    /// Every procedure record in the state store, sorted by id, read without the procedure manager: no epoch
    /// claimed, nothing resumed, nothing written. Unfinished procedures show the state their record holds; a record
    /// that cannot be recovered shows as failed with the reason. Works whether or not the metasrv is started.
    pub async fn stored_procedures(&self) -> Result<Vec<ProcedureInfo>> {
        Ok(procedures::snapshot::read_procedures(self.state_store.as_ref()).await?)
    }

    /// One procedure's record, read like [`Metasrv::stored_procedures`]; an error naming the id when no record has
    /// it.
    pub async fn stored_procedure(&self, id: &str) -> Result<ProcedureInfo> {
        procedures::snapshot::read_procedure(self.state_store.as_ref(), &ProcedureId::new(id))
            .await?
            .ok_or_else(|| ProcedureNotFoundSnafu { id }.build())
    }

    /// Deletes procedure `id`'s record from the state store: for a record that cannot be recovered (damaged), or a
    /// finished or failed procedure one does not want to wait out the retention period for. Starts the procedure
    /// manager first if needed, so the store is claimed by this process. Refuses a procedure that is still running
    /// here (unfinished records are resumed by the start), and deletes only if neither the record nor the store's
    /// epoch changed since they were read. An error naming the id when no record has that id.
    pub async fn purge_procedure(&self, id: &str) -> Result<()> {
        self.start_procedures().await?;
        let wanted = ProcedureId::new(id);
        // A stalled procedure has no runner here (nothing writes its record any more): it may be purged.
        if let Some(info) = self.procedures.procedure_state(&wanted).await?
            && !info.state.is_finished()
            && info.state != procedures::ProcedureState::Stalled
        {
            return ProcedurePurgeSnafu {
                id,
                reason: format!(
                    "it is {} (step {}) in this process; purge only finished, failed or damaged procedures",
                    info.state, info.step
                ),
            }
            .fail();
        }
        match procedures::purge::purge_records(self.state_store.as_ref(), id).await? {
            PurgeOutcome::Purged => Ok(()),
            PurgeOutcome::NotFound => ProcedureNotFoundSnafu { id }.fail(),
            PurgeOutcome::Changed { keys } => ProcedurePurgeSnafu {
                id,
                reason: format!(
                    "the state store changed while purging (keys {}); run the command again",
                    keys.join(", ")
                ),
            }
            .fail(),
        }
    }

    /// The Kafka pool as persisted, with the number of regions (of every datanode) writing to each topic. An error
    /// for a raft-engine metasrv, which has no pool.
    pub async fn topics(&self) -> Result<TopicsReport> {
        let WalConfig::Kafka(kafka) = &self.config.wal else {
            return NoKafkaPoolSnafu {
                operation: "topics",
            }
            .fail();
        };
        let persisted = self.persisted_topics(kafka).await?;
        let mut usage = self.regions_per_topic().await?;
        let wanted = kafka.topic_names();
        let wanted_set: BTreeSet<&String> = wanted.iter().collect();
        let mut topics: Vec<TopicUsage> = wanted
            .iter()
            .map(|t| TopicUsage {
                topic: t.clone(),
                regions: usage.remove(t).unwrap_or(0),
                persisted: persisted.contains(t),
                in_pool: true,
            })
            .collect();
        // Topics regions use that the configured pool does not contain, and persisted ones beyond it.
        let mut extra: BTreeMap<String, usize> = usage;
        for t in &persisted {
            if !wanted_set.contains(t) {
                extra.entry(t.clone()).or_insert(0);
            }
        }
        topics.extend(extra.into_iter().map(|(topic, regions)| TopicUsage {
            persisted: persisted.contains(&topic),
            topic,
            regions,
            in_pool: false,
        }));
        // Pool topics by index (`p_4` before `p_10`), then topics outside the configured pool: those of the pool's
        // shape by index, any other name after them by name.
        let spec_index = |topic: &str| -> Option<usize> {
            topic
                .strip_prefix(kafka.topic_name_prefix.as_str())?
                .strip_prefix('_')
                .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|d| d.parse().ok())
        };
        topics.sort_by(|a, b| {
            (
                !a.in_pool,
                spec_index(&a.topic).is_none(),
                spec_index(&a.topic),
                &a.topic,
            )
                .cmp(&(
                    !b.in_pool,
                    spec_index(&b.topic).is_none(),
                    spec_index(&b.topic),
                    &b.topic,
                ))
        });
        let spread = RegionSpread::of(topics.iter().filter(|t| t.in_pool).map(|t| t.regions));
        Ok(TopicsReport {
            topic_name_prefix: kafka.topic_name_prefix.clone(),
            num_topics: kafka.num_topics,
            persisted: wanted.iter().filter(|t| persisted.contains(*t)).count(),
            topics,
            spread,
            config_drift: self.config_drift().await?,
        })
    }

    /// The Kafka pool's topics whose configs differ from `[wal] topic_config` (none read when it is empty).
    async fn config_drift(&self) -> Result<Vec<TopicConfigDrift>> {
        match self.wal.as_ref() {
            WalOptionsAllocator::Kafka(topics) => Ok(topics.config_drift().await?),
            WalOptionsAllocator::RaftEngine => Ok(Vec::new()),
        }
    }

    /// Regions per Kafka topic, counted over every datanode table value. Values that do not decode are skipped
    /// (`open-regions` reports them).
    async fn regions_per_topic(&self) -> Result<BTreeMap<String, usize>> {
        let prefix = format!("{}/", crate::key::datanode_table::DATANODE_TABLE_KEY_PREFIX);
        let kvs =
            crate::kv::range_all(self.kv.as_ref(), RangeRequest::prefix(prefix), SCAN_PAGE).await?;
        let mut counts = BTreeMap::new();
        for kv in kvs {
            let Ok(value) = serde_json::from_slice::<DatanodeTableValue>(&kv.value) else {
                continue;
            };
            for encoded in value.region_wal_options.values() {
                if let Ok(WalOptions::Kafka(k)) = WalOptions::decode(encoded) {
                    *counts.entry(k.topic).or_insert(0) += 1;
                }
            }
        }
        Ok(counts)
    }

    // ---- procedure control (cancel, pause, resume) ----

    /// Cancels, pauses or resumes procedure `id` (`Some`), or pauses or resumes every procedure (`None`; a cancel
    /// of every procedure is refused). With the procedure manager of this process started, through it: a write
    /// fenced by its epoch, honoured at once. Without, the request is written to the state store without claiming
    /// an epoch (`procedures::control::request`), so a manager running in another process is not fenced: it reads
    /// the request within its `control_poll_interval` (interrupting the procedure's step in progress) or at the
    /// procedure's next step boundary; with no manager running, the next one to start honours it.
    pub async fn control_procedure(
        &self,
        id: Option<&str>,
        op: procedures::ControlOp,
    ) -> Result<()> {
        let here = self.started.load(Ordering::SeqCst);
        match (id, op) {
            (Some(id), op) => {
                let id = ProcedureId::new(id);
                // A procedure this manager does not know goes to the store like a request from outside: the
                // same answer (the record's state, or that there is none) as without a manager here.
                if here && self.procedures.procedure_state(&id).await?.is_some() {
                    match op {
                        procedures::ControlOp::Cancel => self.procedures.cancel(&id).await?,
                        procedures::ControlOp::Pause => self.procedures.pause(&id).await?,
                        procedures::ControlOp::Resume => self.procedures.resume(&id).await?,
                    }
                } else {
                    procedures::control::request(self.state_store.as_ref(), &id, op).await?;
                }
            }
            (None, procedures::ControlOp::Cancel) => {
                return Err(procedures::Error::ControlRefused {
                    action: "cancel",
                    id: ProcedureId::new("*"),
                    reason: "cancelling every procedure at once is not supported; cancel them one by one".to_string(),
                }
                .into());
            }
            (None, op) => {
                let pause = op == procedures::ControlOp::Pause;
                match (here, pause) {
                    (true, true) => self.procedures.pause_all().await?,
                    (true, false) => self.procedures.resume_all().await?,
                    (false, pause) => {
                        procedures::control::request_all(self.state_store.as_ref(), pause).await?
                    }
                }
            }
        }
        Ok(())
    }
}

/// Opens the configured kv backend; a redb file is opened in `mode` (its directory is created only when the file
/// may be).
async fn open_kv_backend(config: &MetasrvConfig, mode: RedbOpenMode) -> Result<KvBackendRef> {
    let store = &config.metadata_store;
    let kv: KvBackendRef = match store.backend {
        MetadataBackend::Memory => Arc::new(crate::kv::MemoryKvBackend::new()),
        MetadataBackend::Redb => {
            if mode == RedbOpenMode::CreateIfMissing
                && let Some(dir) = store.path.parent().filter(|d| !d.as_os_str().is_empty())
            {
                std::fs::create_dir_all(dir).context(CreateDataDirSnafu {
                    path: dir.display().to_string(),
                })?;
            }
            let path = store.path.clone();
            // redb blocks on file I/O (and checks the file's integrity on open).
            let redb = tokio::task::spawn_blocking(move || {
                crate::kv::RedbKvBackend::open_with(&path, mode)
            })
            .await
            .context(crate::kv::error::RedbTaskSnafu {
                path: store.path.clone(),
                action: "open",
                key: "",
            })??;
            Arc::new(redb)
        }
        MetadataBackend::Etcd => {
            let etcd = crate::kv::EtcdConfig {
                endpoints: store.endpoints.clone(),
                connect_timeout: store.connect_timeout,
                request_timeout: store.request_timeout,
                member_timeout: store.member_timeout,
                security: store.etcd_security(),
                ..Default::default()
            };
            Arc::new(crate::kv::EtcdKvBackend::connect(etcd).await?)
        }
        MetadataBackend::Postgres => {
            let pg = store.postgres()?;
            Arc::new(crate::kv::PostgresKvBackend::connect(pg).await?)
        }
    };
    Ok(NamespacedKvBackend::wrap(kv, &store.key_prefix))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use async_trait::async_trait;
    use procedures::record::RECORD_PREFIX;

    use super::*;
    use crate::config::MetadataStoreConfig;
    use crate::kv::{KvBackend, MemoryKvBackend};
    use crate::wal::kafka::admin::TopicAdmin;
    use crate::wal::kafka::testing::FakeTopicAdmin;

    /// The shared in-memory Kafka cluster.
    fn fake_broker() -> Arc<FakeTopicAdmin> {
        Arc::new(FakeTopicAdmin::new())
    }

    fn memory_config(wal: WalConfig, datanodes: Vec<u64>) -> MetasrvConfig {
        MetasrvConfig {
            metadata_store: MetadataStoreConfig {
                backend: MetadataBackend::Memory,
                ..Default::default()
            },
            wal,
            datanodes: crate::config::DatanodesConfig {
                ids: datanodes,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn kafka_metasrv(num_topics: usize) -> (Metasrv, Arc<FakeTopicAdmin>) {
        let broker = fake_broker();
        let kafka = KafkaConfig {
            num_topics,
            topic_name_prefix: "fake_pool".to_string(),
            max_concurrent_creates: 1,
            ..Default::default()
        };
        let metasrv = Metasrv::with_parts(
            memory_config(WalConfig::Kafka(kafka), vec![1, 2]),
            Arc::new(MemoryKvBackend::new()),
            Some(broker.clone()),
            Arc::new(MemoryDatanodeManager::new()),
        )
        .unwrap();
        (metasrv, broker)
    }

    #[tokio::test]
    async fn a_failed_bootstrap_retained_by_the_manager_is_followed_by_the_next_attempt() {
        let (metasrv, broker) = kafka_metasrv(2);
        broker.fail_all(Some(crate::wal::kafka::testing::FakeFault::Server(
            rskafka::client::error::ProtocolError::PolicyViolation,
        )));
        let err = metasrv.start().await.unwrap_err();
        assert!(
            err.to_string().contains("topic_bootstrap/fake_pool"),
            "{err}"
        );
        broker.fail_all(None);
        // The failed bootstrap is still known under the pool's id: submitting that id again would only watch it,
        // so the pool runs the next attempt's id.
        metasrv.start().await.unwrap();
        let ids: Vec<String> = metasrv
            .list_procedures()
            .await
            .unwrap()
            .into_iter()
            .map(|p| format!("{} {}", p.id, p.state))
            .collect();
        assert_eq!(
            ids,
            vec![
                "topic_bootstrap/fake_pool failed".to_string(),
                "topic_bootstrap/fake_pool/attempt-1 done".to_string(),
            ]
        );
        metasrv.stop().await.unwrap();
    }

    /// Ready means listed: a broker that has not yet applied the controller's records answers Metadata without
    /// the new topics. The bootstrap reports ready only once the brokers list every topic of the pool (before, it
    /// did as soon as the creations were acknowledged, and a read right after found none of them).
    #[tokio::test]
    async fn bootstrap_is_ready_only_once_the_brokers_list_every_topic() {
        let (metasrv, broker) = kafka_metasrv(8);
        // The first read (before creating) and the next four answer as a broker behind the controller does.
        broker.stale_metadata_reads(5);
        let seen = Arc::new(Mutex::new(Vec::<BootstrapProgress>::new()));
        let report = {
            let seen = seen.clone();
            metasrv
                .bootstrap(move |p| seen.lock().unwrap().push(p))
                .await
                .unwrap()
        };
        assert!(report.ready);
        let listed = broker.list_topics().await.unwrap();
        assert_eq!(
            listed.len(),
            8,
            "the next read after `ready` lists the whole pool: {listed:?}"
        );
        let seen = seen.lock().unwrap().clone();
        assert!(
            seen.iter().any(|p| p.on_broker == 0 && p.persisted == 8),
            "progress showed the pool persisted but not listed while it waited: {seen:?}"
        );
        assert_eq!(seen.last().map(|p| p.on_broker), Some(8));
        metasrv.stop().await.unwrap();
    }

    #[tokio::test]
    async fn bootstrap_reports_progress_until_every_topic_is_on_the_broker_and_persisted() {
        let (metasrv, broker) = kafka_metasrv(60);
        let seen = Arc::new(Mutex::new(Vec::<BootstrapProgress>::new()));
        // The 31st create waits until a progress report shows the pool part-way (some topics on the broker, not
        // all): progress must be reported while topics are still being created, not only at the end.
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        {
            let (seen, calls) = (seen.clone(), calls.clone());
            broker.on_create(Arc::new(move |_| {
                let call = calls.fetch_add(1, Ordering::SeqCst);
                let seen = seen.clone();
                Box::pin(async move {
                    if call != 30 {
                        return;
                    }
                    let part_way = |seen: &Mutex<Vec<BootstrapProgress>>| {
                        seen.lock()
                            .unwrap()
                            .iter()
                            .any(|p| p.on_broker > 0 && p.on_broker < 60)
                    };
                    while !part_way(&seen) {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                })
            }));
        }
        let report = tokio::time::timeout(
            Duration::from_secs(60),
            metasrv.bootstrap(|p| seen.lock().unwrap().push(p)),
        )
        .await
        .expect("no progress report showed the pool part-way while its topics were being created")
        .unwrap();
        assert_eq!(report.provider, "kafka");
        assert_eq!(report.num_topics, 60);
        assert!(report.ready);
        assert_eq!(broker.partitions().len(), 60);
        let seen = seen.lock().unwrap().clone();
        assert!(
            seen.iter().any(|p| p.on_broker > 0 && p.on_broker < 60),
            "{seen:?}"
        );
        assert!(
            seen.iter()
                .all(|p| p.wanted == 60 && p.on_broker <= 60 && p.persisted <= 60)
        );
        assert!(
            seen.windows(2).all(|w| w[0].on_broker <= w[1].on_broker),
            "{seen:?}"
        );
        assert_eq!(
            seen.last().copied(),
            Some(BootstrapProgress {
                wanted: 60,
                on_broker: 60,
                persisted: 60
            })
        );
        metasrv.stop().await.unwrap();
    }

    #[tokio::test]
    async fn topics_counts_regions_per_pool_topic() {
        let (metasrv, _broker) = kafka_metasrv(3);
        metasrv.start().await.unwrap();
        let table = metasrv
            .create_table(TableName::new("greptime", "public", "t"), 7, false)
            .await
            .unwrap();
        assert_eq!(table.regions.len(), 7);
        let report = metasrv.topics().await.unwrap();
        assert_eq!(report.persisted, 3);
        assert_eq!(report.topics.len(), 3);
        let mut counts: Vec<usize> = report.topics.iter().map(|t| t.regions).collect();
        counts.sort();
        assert_eq!(counts, vec![2, 2, 3], "round-robin over 3 topics");
        assert!(report.topics.iter().all(|t| t.persisted && t.in_pool));

        // What the table reports is what the datanodes open.
        let mut opened = BTreeMap::new();
        for dn in [1, 2] {
            let open = metasrv.open_regions(dn).await.unwrap();
            assert!(open.errors.is_empty(), "{:?}", open.errors);
            for r in open.requests {
                opened.insert(
                    r.region_id,
                    (dn, r.options[crate::wal::WAL_OPTIONS_KEY].clone()),
                );
            }
        }
        let expected: BTreeMap<u64, (u64, String)> = table
            .regions
            .iter()
            .map(|r| (r.region_id, (r.datanode_id, r.wal_options.clone())))
            .collect();
        assert_eq!(opened, expected);
        metasrv.stop().await.unwrap();
    }

    #[tokio::test]
    async fn raft_engine_has_no_pool_and_needs_start_for_procedures() {
        let metasrv = Metasrv::new(memory_config(WalConfig::RaftEngine, vec![1]))
            .await
            .unwrap();
        let err = metasrv.list_procedures().await.unwrap_err().to_string();
        assert!(err.contains("start"), "{err}");
        let err = metasrv.topics().await.unwrap_err().to_string();
        assert!(err.contains("no Kafka topic pool"), "{err}");
        let report = metasrv.bootstrap(|_| {}).await.unwrap();
        assert_eq!(report.provider, "raft_engine");
        assert!(report.ready);
        let table = metasrv
            .create_table(TableName::new("greptime", "public", "r"), 2, false)
            .await
            .unwrap();
        assert!(
            table
                .regions
                .iter()
                .all(|r| r.wal_options == WalOptions::RaftEngine.encode())
        );
        assert_eq!(metasrv.list_procedures().await.unwrap().len(), 1);
        metasrv.stop().await.unwrap();
    }

    #[tokio::test]
    async fn topics_sorts_by_pool_index_also_beyond_the_configured_pool() {
        let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
        let broker = fake_broker();
        let metasrv_with = |num_topics: usize| {
            let kafka = KafkaConfig {
                num_topics,
                topic_name_prefix: "p".to_string(),
                ..Default::default()
            };
            Metasrv::with_parts(
                memory_config(WalConfig::Kafka(kafka), vec![1]),
                kv.clone(),
                Some(broker.clone()),
                Arc::new(MemoryDatanodeManager::new()),
            )
            .unwrap()
        };
        let big = metasrv_with(12);
        big.bootstrap(|_| {}).await.unwrap();
        let report = big.topics().await.unwrap();
        let names: Vec<&str> = report.topics.iter().map(|t| t.topic.as_str()).collect();
        let expected: Vec<String> = (0..12).map(|i| format!("p_{i}")).collect();
        assert_eq!(names, expected);
        big.stop().await.unwrap();

        // A pool configured smaller: p_0..p_2 in it, then the persisted p_3..p_11 outside it, by index (a sort by
        // name would put p_10 and p_11 before p_3).
        let small = metasrv_with(3);
        let report = small.topics().await.unwrap();
        let listed: Vec<(&str, bool)> = report
            .topics
            .iter()
            .map(|t| (t.topic.as_str(), t.in_pool))
            .collect();
        let expected: Vec<(String, bool)> = (0..12).map(|i| (format!("p_{i}"), i < 3)).collect();
        let expected: Vec<(&str, bool)> = expected.iter().map(|(t, p)| (t.as_str(), *p)).collect();
        assert_eq!(listed, expected);
    }

    /// Datanodes that never answer: a create-table stays running in CreateRegions.
    #[derive(Debug)]
    struct Unresponsive;

    #[async_trait]
    impl crate::ddl::DatanodeManager for Unresponsive {
        async fn create_region(
            &self,
            _datanode_id: u64,
            _request: crate::ddl::RegionCreateRequest,
        ) -> crate::ddl::error::Result<()> {
            std::future::pending().await
        }
    }

    /// A kv that, once armed, rewrites a procedure record just before the transaction deleting it runs: another
    /// process writing the record between a purge's read and its delete.
    #[derive(Debug)]
    struct RacingKv {
        inner: MemoryKvBackend,
        armed: std::sync::atomic::AtomicBool,
    }

    #[async_trait::async_trait]
    impl KvBackend for RacingKv {
        fn name(&self) -> String {
            self.inner.name()
        }
        fn max_txn_ops(&self) -> usize {
            self.inner.max_txn_ops()
        }
        fn max_request_bytes(&self) -> usize {
            self.inner.max_request_bytes()
        }
        async fn get(&self, key: &[u8]) -> crate::kv::Result<Option<crate::kv::KeyValue>> {
            self.inner.get(key).await
        }
        async fn batch_get(&self, keys: &[Vec<u8>]) -> crate::kv::Result<Vec<crate::kv::KeyValue>> {
            self.inner.batch_get(keys).await
        }
        async fn range(&self, req: RangeRequest) -> crate::kv::Result<crate::kv::RangeResponse> {
            self.inner.range(req).await
        }
        async fn put(
            &self,
            req: crate::kv::PutRequest,
        ) -> crate::kv::Result<Option<crate::kv::KeyValue>> {
            self.inner.put(req).await
        }
        async fn batch_put(
            &self,
            kvs: Vec<crate::kv::KeyValue>,
            prev_kv: bool,
        ) -> crate::kv::Result<Vec<crate::kv::KeyValue>> {
            self.inner.batch_put(kvs, prev_kv).await
        }
        async fn compare_and_put(
            &self,
            req: crate::kv::CompareAndPutRequest,
        ) -> crate::kv::Result<crate::kv::CompareAndPutResponse> {
            self.inner.compare_and_put(req).await
        }
        async fn delete_range(
            &self,
            key: &[u8],
            range_end: &[u8],
            prev_kv: bool,
        ) -> crate::kv::Result<(u64, Vec<crate::kv::KeyValue>)> {
            self.inner.delete_range(key, range_end, prev_kv).await
        }
        async fn batch_delete(
            &self,
            keys: &[Vec<u8>],
            prev_kv: bool,
        ) -> crate::kv::Result<Vec<crate::kv::KeyValue>> {
            self.inner.batch_delete(keys, prev_kv).await
        }
        async fn txn(&self, txn: crate::kv::Txn) -> crate::kv::Result<crate::kv::TxnResponse> {
            let deleted_record = txn.success.iter().find_map(|op| match op {
                crate::kv::TxnOp::Delete(key) if key.starts_with(b"__procedure__/proc/") => {
                    Some(key.clone())
                }
                _ => None,
            });
            if let Some(key) = deleted_record
                && self.armed.swap(false, std::sync::atomic::Ordering::SeqCst)
                && let Some(record) = self.inner.get(&key).await?
            {
                let mut value = record.value;
                value.push(b' ');
                self.inner
                    .put(crate::kv::PutRequest {
                        key,
                        value,
                        prev_kv: false,
                    })
                    .await?;
            }
            self.inner.txn(txn).await
        }
    }

    #[tokio::test]
    async fn a_purge_racing_another_writer_deletes_nothing_and_names_the_changed_key() {
        let kv = Arc::new(RacingKv {
            inner: MemoryKvBackend::new(),
            armed: std::sync::atomic::AtomicBool::new(false),
        });
        let metasrv = Metasrv::with_parts(
            memory_config(WalConfig::RaftEngine, vec![1]),
            kv.clone(),
            None,
            Arc::new(MemoryDatanodeManager::new()),
        )
        .unwrap();
        metasrv.start().await.unwrap();
        metasrv
            .create_table(TableName::new("greptime", "public", "raced"), 1, false)
            .await
            .unwrap();
        let id = metasrv.list_procedures().await.unwrap()[0].id.to_string();
        let key = format!("__procedure__/{RECORD_PREFIX}{id}").into_bytes();
        let before = kv.get(&key).await.unwrap().expect("the record").value;

        kv.armed.store(true, std::sync::atomic::Ordering::SeqCst);
        let err = metasrv.purge_procedure(&id).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "cannot purge procedure '{id}': the state store changed while purging (keys {RECORD_PREFIX}{id}); run the command again"
            )
        );
        // Nothing deleted: the record stays as the other writer left it.
        let mut raced = before.clone();
        raced.push(b' ');
        assert_eq!(kv.get(&key).await.unwrap().expect("kept").value, raced);

        // Run again, it purges.
        metasrv.purge_procedure(&id).await.unwrap();
        assert!(kv.get(&key).await.unwrap().is_none());
        metasrv.stop().await.unwrap();
    }

    #[tokio::test]
    async fn purge_deletes_a_finished_record_and_refuses_a_running_one() {
        let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
        let record_key = |id: &str| format!("__procedure__/{RECORD_PREFIX}{id}").into_bytes();
        let done = Metasrv::with_parts(
            memory_config(WalConfig::RaftEngine, vec![1]),
            kv.clone(),
            None,
            Arc::new(MemoryDatanodeManager::new()),
        )
        .unwrap();
        done.start().await.unwrap();
        done.create_table(TableName::new("greptime", "public", "done"), 1, false)
            .await
            .unwrap();
        let finished = done.list_procedures().await.unwrap()[0].id.to_string();
        assert!(kv.get(&record_key(&finished)).await.unwrap().is_some());
        let err = done
            .purge_procedure("unknown")
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("'unknown'"), "{err}");
        done.purge_procedure(&finished).await.unwrap();
        assert!(kv.get(&record_key(&finished)).await.unwrap().is_none());
        done.stop().await.unwrap();

        let hung = Arc::new(
            Metasrv::with_parts(
                memory_config(WalConfig::RaftEngine, vec![1]),
                kv.clone(),
                None,
                Arc::new(Unresponsive),
            )
            .unwrap(),
        );
        hung.start().await.unwrap();
        let creating = {
            let hung = hung.clone();
            tokio::spawn(async move {
                hung.create_table(TableName::new("greptime", "public", "hung"), 1, false)
                    .await
            })
        };
        let running = loop {
            let list = hung.list_procedures().await.unwrap();
            if let Some(p) = list.iter().find(|p| !p.state.is_finished()) {
                break p.id.to_string();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let err = hung.purge_procedure(&running).await.unwrap_err();
        assert!(
            matches!(&err, crate::Error::ProcedurePurge { id, .. } if *id == running),
            "{err}"
        );
        assert!(kv.get(&record_key(&running)).await.unwrap().is_some());
        creating.abort();
        hung.stop().await.unwrap();
    }

    #[test]
    fn table_names_take_defaults() {
        assert_eq!(
            parse_table_name("demo").unwrap(),
            TableName::new("greptime", "public", "demo")
        );
        assert_eq!(
            parse_table_name("s.demo").unwrap(),
            TableName::new("greptime", "s", "demo")
        );
        assert_eq!(
            parse_table_name("c.s.demo").unwrap(),
            TableName::new("c", "s", "demo")
        );
    }

    #[test]
    fn bad_table_names_are_errors_quoting_them() {
        for bad in ["a.b.c.d", "", "a..b", ".t", "t.", "bad name", "x/y"] {
            let err = parse_table_name(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("'{bad}'")), "{bad}: {err}");
        }
    }
}
