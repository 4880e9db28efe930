//! The error of the `remote-wal` crate above its kv and WAL layers (DDL, metadata keys, the datanode registry,
//! metasrv, config).
//!
//! Variants are grouped by the module that raises them. Each names what it touched (key, topic, endpoint, table).
//! The kv layer and the WAL layer have errors of their own ([`crate::kv::Error`], [`crate::wal::Error`]); each is
//! held here whole, as [`Error::Kv`] and [`Error::Wal`], converted by `?` at the layer's boundary. This module depends on no other module of the crate but that one: a variant
//! whose retryability depends on its source carries a `retryable` field that the layer building it sets (the kv
//! layer for etcd, the Kafka layer for rskafka), and [`Error::is_retryable`] only reads fields.

use snafu::Snafu;

/// A boxed error from a dependency.
pub type BoxedError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result alias of the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in remote-wal.
#[derive(Debug, Snafu)]
#[snafu(visibility(pub))]
#[non_exhaustive]
pub enum Error {
    // ---- kv (src/kv): the kv layer's own errors ----
    /// A metadata store (kv backend) call failed; [`crate::kv::Error`] says how.
    #[snafu(transparent)]
    Kv {
        /// The kv layer's error.
        source: crate::kv::Error,
    },
    // ---- end kv ----

    // ---- wal (src/wal): the WAL layer's own errors ----
    /// A WAL call failed (config, Kafka, the topic pool, log stores, prune); [`crate::wal::Error`] says how.
    #[snafu(transparent)]
    Wal {
        /// The WAL layer's error (boxed: its largest variants would make every `Result` of the crate larger).
        #[snafu(source(from(crate::wal::Error, Box::new)))]
        source: Box<crate::wal::Error>,
    },
    // ---- end wal ----

    // ---- ddl (src/ddl): the DDL layer's own errors ----
    /// A DDL call failed (table metadata, ids, create, drop, migration, failover); [`crate::ddl::Error`] says how.
    #[snafu(transparent)]
    Ddl {
        /// The DDL layer's error (boxed, like the WAL layer's).
        #[snafu(source(from(crate::ddl::Error, Box::new)))]
        source: Box<crate::ddl::Error>,
    },
    // ---- end ddl ----

    // ---- datanode (src/datanode) ----
    /// A datanode table value did not decode; none of that table's regions can be opened.
    #[snafu(display("datanode table key '{key}': value does not decode: {source}"))]
    DecodeDatanodeTableValue {
        /// The key.
        key: String,
        /// The JSON error.
        source: serde_json::Error,
    },

    /// One region's WAL options in a datanode table value are unusable.
    #[snafu(display(
        "datanode table key '{key}', region {region_number} (region id {region_id}): {source}"
    ))]
    RegionWalOptions {
        /// The key.
        key: String,
        /// The region number.
        region_number: u32,
        /// The region id.
        region_id: u64,
        /// Why: the options do not decode.
        #[snafu(source(from(crate::wal::Error, Box::new)))]
        source: Box<crate::wal::Error>,
    },

    /// A region's WAL provider is not the one this datanode is configured for.
    #[snafu(display(
        "datanode table key '{key}', region {region_number} (region id {region_id}): WAL provider is '{found}' but this datanode is configured for '{expected}'"
    ))]
    WalProviderMismatch {
        /// The key.
        key: String,
        /// The region number.
        region_number: u32,
        /// The region id.
        region_id: u64,
        /// The datanode's provider.
        expected: String,
        /// The region's provider.
        found: String,
    },

    /// A region of a datanode table value has no WAL options while the datanode needs them (Kafka).
    #[snafu(display(
        "datanode table key '{key}', region {region_number} (region id {region_id}): no WAL options recorded, but this datanode is configured for '{expected}'"
    ))]
    MissingRegionWalOptions {
        /// The key.
        key: String,
        /// The region number.
        region_number: u32,
        /// The region id.
        region_id: u64,
        /// The datanode's provider.
        expected: String,
    },
    /// A datanode registered or heartbeated with an id the metasrv does not place regions on.
    #[snafu(display("datanode {datanode_id} is not one of [datanodes] ids {ids:?}"))]
    DatanodeUnknown {
        /// The id it gave.
        datanode_id: u64,
        /// The configured ids.
        ids: Vec<u64>,
    },
    /// A datanode registered while its current incarnation still heartbeats: two processes with one id.
    #[snafu(display(
        "datanode {datanode_id}: incarnation {incarnation} at {address} is still heartbeating (its last heartbeat \
         {age_ms} ms ago); stop it first, or give this one another id"
    ))]
    DatanodeStillHeartbeating {
        /// The datanode.
        datanode_id: u64,
        /// The live incarnation.
        incarnation: u64,
        /// Where it runs.
        address: String,
        /// How long ago it last heartbeated.
        age_ms: u64,
    },
    /// A heartbeat from an incarnation that a later registration replaced: that process must stop serving.
    #[snafu(display(
        "datanode {datanode_id}: incarnation {incarnation} is stale (incarnation {current} registered since); \
         it must stop serving"
    ))]
    DatanodeStaleIncarnation {
        /// The datanode.
        datanode_id: u64,
        /// The incarnation the heartbeat gave.
        incarnation: u64,
        /// The current one.
        current: u64,
    },
    /// A heartbeat from an incarnation the leader found failed and whose regions it failed over.
    #[snafu(display(
        "datanode {datanode_id}: incarnation {incarnation} was found failed and its regions moved to other \
         datanodes; it must stop serving (a restart registers a new incarnation)"
    ))]
    DatanodeRetired {
        /// The datanode.
        datanode_id: u64,
        /// The retired incarnation.
        incarnation: u64,
    },
    /// A heartbeat from a datanode incarnation this metadata store never registered.
    #[snafu(display(
        "datanode {datanode_id}: incarnation {incarnation} was never registered (register first)"
    ))]
    DatanodeNotRegistered {
        /// The datanode.
        datanode_id: u64,
        /// The incarnation the heartbeat gave.
        incarnation: u64,
    },
    /// The datanode's registration record kept changing under a compare-and-put.
    #[snafu(display(
        "datanode {datanode_id}: registration record '{key}' changed concurrently; retry"
    ))]
    DatanodeRegistrationContention {
        /// The datanode.
        datanode_id: u64,
        /// The key.
        key: String,
    },
    // ---- end datanode ----

    // ---- metasrv and config (src/metasrv.rs, src/config.rs) ----
    /// The config file could not be read.
    #[snafu(display("cannot read config file '{path}': {source}"))]
    ReadConfig {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The config file is not valid TOML, has an unknown key, or a value of the wrong type.
    #[snafu(display(
        "invalid config file '{origin}'{}{}: {message}",
        if location.is_empty() { String::new() } else { format!(", {location}") },
        if key.is_empty() { String::new() } else { format!(", key `{key}`") }
    ))]
    ParseConfig {
        /// The file.
        origin: String,
        /// `line L, column C`, or empty when unknown.
        location: String,
        /// The dotted key concerned (`metadata_store.backend`), or empty when unknown.
        key: String,
        /// TOML's message (it names an unknown key or the expected type).
        message: String,
        /// The TOML error.
        #[snafu(source(from(toml::de::Error, Box::new)))]
        source: Box<toml::de::Error>,
    },
    /// A config value is out of range.
    #[snafu(display("invalid config: {key} = {value}: {reason}"))]
    InvalidConfig {
        /// The dotted key, e.g. `datanodes.ids`.
        key: String,
        /// The value as configured.
        value: String,
        /// Why it is rejected.
        reason: String,
    },
    /// A config file parsed but a value in it is invalid.
    #[snafu(display("config file '{origin}': {source}"))]
    ValidateConfig {
        /// The file.
        origin: String,
        /// The validation error (it names the key).
        #[snafu(source(from(Error, Box::new)))]
        source: Box<Error>,
    },
    /// No procedure with this id is known.
    #[snafu(display(
        "no procedure with id '{id}' (finished procedures are kept for the retention period only)"
    ))]
    ProcedureNotFound {
        /// The id asked for.
        id: String,
    },
    /// A procedure record cannot be purged from the state store: it is still running here, or it changed (or
    /// another process claimed the store) between reading and deleting it.
    #[snafu(display("cannot purge procedure '{id}': {reason}"))]
    ProcedurePurge {
        /// The procedure id.
        id: String,
        /// Why not.
        reason: String,
    },
    /// An operation that needs the Kafka topic pool, on a metasrv configured for raft-engine.
    #[snafu(display(
        "{operation}: the WAL provider is raft_engine, so there is no Kafka topic pool (set [wal] provider = \"kafka\")"
    ))]
    NoKafkaPool {
        /// What was asked.
        operation: String,
    },
    /// A WAL command named a table that does not exist.
    #[snafu(display("{operation}: table {table} does not exist"))]
    WalTableNotFound {
        /// What was asked (`wal write`).
        operation: String,
        /// The table's full name.
        table: String,
    },
    /// A WAL command named a region number the table does not have.
    #[snafu(display(
        "{operation}: table {table} has no region {region_number} (its regions: {regions})"
    ))]
    WalRegionNotFound {
        /// What was asked (`wal flush`).
        operation: String,
        /// The table's full name.
        table: String,
        /// The region number given.
        region_number: u32,
        /// The table's region numbers.
        regions: String,
    },
    /// A WAL command failed on one region's WAL; the source says why, this names the table, region and WAL.
    #[snafu(display("{operation}: table {table}, region {region_id} ({wal}): {source}"))]
    WalRegion {
        /// What was asked (`wal write`).
        operation: String,
        /// The table's full name.
        table: String,
        /// The region.
        region_id: u64,
        /// The WAL: `topic 'T'` or `raft-engine 'DIR'`.
        wal: String,
        /// The cause.
        #[snafu(source(from(Error, Box::new)))]
        source: Box<Error>,
    },
    /// The directory of the redb metadata file could not be created.
    #[snafu(display("cannot create directory '{path}' for the metadata store: {source}"))]
    CreateDataDir {
        /// The directory.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The metasrv was used before `start()` or after `stop()`.
    #[snafu(display("metasrv is not running: {operation} needs start() first"))]
    MetasrvNotStarted {
        /// What was asked.
        operation: String,
    },
    /// A call of the leader election failed (granting or keeping the lease alive, campaigning, reading the
    /// leader, resigning).
    #[snafu(display(
        "leader election '{election}' on {store} {endpoints}: {action} failed: {detail}"
    ))]
    Election {
        /// The election's key (etcd) or lease row (PostgreSQL).
        election: String,
        /// The store holding it: `etcd` or `PostgreSQL`.
        store: &'static str,
        /// The etcd endpoints, comma-separated, or the PostgreSQL server's `host:port/database`.
        endpoints: String,
        /// What was attempted (`grant the lease`, `campaign`, `read the leader`, `resign`).
        action: &'static str,
        /// What etcd or the client said.
        detail: String,
        /// Whether trying again may help (decided from the gRPC status where the error is built).
        retryable: bool,
    },
    /// A write was asked of a server that is not the leader (or lost its leadership meanwhile); `leader` is the
    /// current leader's advertised address when one is known.
    #[snafu(display(
        "this server is not the leader{}; send writes to the leader",
        match leader { Some(l) => format!(" (the leader is {l})"), None => " (no leader is elected right now)".to_string() }
    ))]
    NotLeader {
        /// The leader's advertised address, if any.
        leader: Option<String>,
    },
    // ---- end metasrv ----

    // ---- procedures (the engine's errors, wrapped) ----
    /// The procedure engine failed.
    #[snafu(display("{source}"))]
    Procedure {
        /// The engine's error.
        #[snafu(source(from(procedures::Error, Box::new)))]
        source: Box<procedures::Error>,
    },
    // ---- end procedures ----
}

impl Error {
    /// Whether the same call may succeed if tried again (a service was unreachable, a timeout).
    ///
    /// The match names every variant (no catch-all), so a new variant does not compile until it is classified.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Procedure { source } => source.is_retryable(),
            Error::Kv { source } => source.is_retryable(),
            Error::Election { retryable, .. } => *retryable,
            Error::NotLeader { .. } => true,
            // ---- retryable: datanodes (src/metasrv/datanodes.rs) ----
            Error::DatanodeStillHeartbeating { .. }
            | Error::DatanodeRegistrationContention { .. } => true,
            // ---- wal: decided by the WAL layer's own error ----
            Error::Wal { source } => source.is_retryable(),
            // ---- ddl: decided by the DDL layer's own error ----
            Error::Ddl { source } => source.is_retryable(),
            Error::WalRegion { source, .. } => source.is_retryable(),
            // ---- not retryable: the same call fails the same way (bad input, damaged data, a refusal) ----
            Error::DecodeDatanodeTableValue { .. }
            | Error::RegionWalOptions { .. }
            | Error::WalProviderMismatch { .. }
            | Error::MissingRegionWalOptions { .. }
            | Error::DatanodeUnknown { .. }
            | Error::DatanodeStaleIncarnation { .. }
            | Error::DatanodeRetired { .. }
            | Error::DatanodeNotRegistered { .. }
            | Error::ReadConfig { .. }
            | Error::ParseConfig { .. }
            | Error::InvalidConfig { .. }
            | Error::ValidateConfig { .. }
            | Error::ProcedureNotFound { .. }
            | Error::ProcedurePurge { .. }
            | Error::NoKafkaPool { .. }
            | Error::WalTableNotFound { .. }
            | Error::WalRegionNotFound { .. }
            | Error::CreateDataDir { .. }
            | Error::MetasrvNotStarted { .. } => false,
        }
    }
}

/// The conversions between a layer's `Error` (with a `Procedure` variant and an `is_retryable`) and the engine's
/// error: an engine error is held whole; a layer's error goes to the engine as `External`, keeping whether it is
/// retryable. Every layer that runs procedures or is run by them has both.
macro_rules! engine_conversions {
    ($error:ty) => {
        impl From<procedures::Error> for $error {
            fn from(source: procedures::Error) -> Self {
                Self::Procedure {
                    source: Box::new(source),
                }
            }
        }

        impl From<$error> for procedures::Error {
            /// Hands the error to the engine, keeping whether it is retryable.
            fn from(e: $error) -> Self {
                let retryable = e.is_retryable();
                procedures::Error::External {
                    source: Box::new(e),
                    retryable,
                }
            }
        }
    };
}
pub(crate) use engine_conversions;

engine_conversions!(Error);
