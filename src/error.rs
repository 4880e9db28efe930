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

    // ---- ddl (src/ddl) ----
    /// A catalog, schema, table or engine name is not acceptable.
    #[snafu(display("invalid {what} name '{name}': {reason}"))]
    InvalidName {
        /// `catalog`, `schema`, `table` or `engine`.
        what: &'static str,
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A create-table request is not acceptable for another reason than a name.
    #[snafu(display("invalid create-table request for table {table}: {reason}"))]
    InvalidCreateTable {
        /// The full table name.
        table: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A table of this name exists (or exists with other metadata than this request would write).
    #[snafu(display("table {table} already exists{}", table_id.map(|id| format!(" (table id {id})")).unwrap_or_default()))]
    TableAlreadyExists {
        /// The full table name.
        table: String,
        /// The existing table's id, when known.
        table_id: Option<u32>,
    },

    /// A table's metadata key holds another value than the one being written for it.
    #[snafu(display("table {table}: metadata key '{key}' already holds a different value"))]
    TableMetadataConflict {
        /// The full table name.
        table: String,
        /// The conflicting key.
        key: String,
    },

    /// Writing a table's metadata needs a bigger transaction than the kv backend accepts.
    #[snafu(display(
        "table {table}: writing its metadata needs a transaction of {ops} operations, backend {backend} allows {max}"
    ))]
    MetadataTxnTooLarge {
        /// The full table name.
        table: String,
        /// Operations the transaction would hold.
        ops: usize,
        /// The backend's limit.
        max: usize,
        /// The backend's name.
        backend: String,
    },

    /// A table metadata value could not be encoded.
    #[snafu(display("cannot encode the value of metadata key '{key}': {source}"))]
    EncodeMetadata {
        /// The key.
        key: String,
        /// The JSON error.
        source: serde_json::Error,
    },

    /// A table metadata value read from the kv backend could not be decoded.
    #[snafu(display("cannot decode the value of metadata key '{key}': {source}"))]
    DecodeMetadata {
        /// The key.
        key: String,
        /// The JSON error.
        source: serde_json::Error,
    },

    /// A sequence's stored value is not a number.
    #[snafu(display("sequence key '{key}' holds '{value}', which is not a number"))]
    CorruptSequence {
        /// The key.
        key: String,
        /// The value as found (lossy UTF-8).
        value: String,
    },

    /// A sequence has no ids left below its maximum.
    #[snafu(display(
        "sequence key '{key}' is exhausted: next id {next} is beyond the maximum {max}"
    ))]
    SequenceExhausted {
        /// The key.
        key: String,
        /// The next id it would hand out.
        next: u64,
        /// The largest id it may hand out.
        max: u64,
    },

    /// Reserving a batch of a sequence kept losing the compare-and-put race.
    #[snafu(display(
        "sequence key '{key}': could not reserve a batch after {attempts} attempts (contention)"
    ))]
    SequenceContention {
        /// The key.
        key: String,
        /// Attempts made.
        attempts: usize,
    },

    /// A step's outside effect was refused because another manager took over the procedure (the store's epoch is
    /// no longer the one of the manager running the step). Not retryable: the step is stale, its manager stops.
    #[snafu(display(
        "procedure {procedure_id}: '{key}' refused: the procedure store's epoch is {current}, this manager's is \
         {own}; a newer manager runs the procedure now"
    ))]
    ProcedureFenced {
        /// The procedure whose step was refused.
        procedure_id: String,
        /// The key the refused write was for.
        key: String,
        /// The epoch the manager running the step holds.
        own: u64,
        /// The epoch the store holds now (as read; `absent` or the raw text when it is not a number).
        current: String,
    },

    /// No datanode is configured to place regions on.
    #[snafu(display("cannot place {num_regions} regions: no datanode is configured"))]
    NoDatanodes {
        /// Regions to place.
        num_regions: usize,
    },

    /// A source of WAL options returned another number of options than asked.
    #[snafu(display("table {table}: asked for {wanted} WAL options, got {got}"))]
    WalOptionsCount {
        /// The full table name.
        table: String,
        /// Options asked for.
        wanted: usize,
        /// Options returned.
        got: usize,
    },

    /// A region exists on a datanode with other options than the ones it is being created with.
    #[snafu(display(
        "region {region_id} already exists on datanode {datanode_id} with different options (existing: {existing}, requested: {requested})"
    ))]
    RegionExistsWithDifferentOptions {
        /// The region id.
        region_id: u64,
        /// The datanode.
        datanode_id: u64,
        /// The existing region's request, as text.
        existing: String,
        /// The refused request, as text.
        requested: String,
    },

    /// A datanode could not be reached or refused to serve for now.
    #[snafu(display("datanode {datanode_id} unavailable while {action}: {reason}"))]
    DatanodeUnavailable {
        /// The datanode.
        datanode_id: u64,
        /// What was being done, e.g. `creating region 4398046511104`.
        action: String,
        /// What happened.
        reason: String,
    },

    /// The persisted state of a create-table procedure could not be decoded or encoded.
    #[snafu(display("create-table procedure state: {source}"))]
    CreateTableState {
        /// The JSON error.
        source: serde_json::Error,
    },

    /// Creating a table through the procedure manager failed.
    #[snafu(display("create table {table}: {source}"))]
    CreateTable {
        /// The full table name.
        table: String,
        /// The engine's error (the procedure's failure text when it failed).
        #[snafu(source(from(procedures::Error, Box::new)))]
        source: Box<procedures::Error>,
    },

    /// A finished create-table procedure gave no usable table id.
    #[snafu(display(
        "create table {table}: procedure {procedure_id} finished with output {output}, expected {{\"table_id\":N}}"
    ))]
    CreateTableOutput {
        /// The full table name.
        table: String,
        /// The procedure.
        procedure_id: String,
        /// The output as received.
        output: String,
    },
    /// A create-table with a caller-chosen procedure id found that id used by another create-table task: an id is
    /// the idempotency key of one task only.
    #[snafu(display(
        "procedure id {procedure_id} was already used for another create-table task ({existing}); a retry must send the same task, another task needs another id"
    ))]
    CreateTableIdInUse {
        /// The procedure id.
        procedure_id: String,
        /// The table of this request.
        table: String,
        /// What the task that has the id creates (its table and region count).
        existing: String,
    },

    /// A region migration request cannot be carried out (the region, the target or the region's WAL).
    #[snafu(display("cannot migrate region {region_id} to datanode {to}: {reason}"))]
    InvalidRegionMigration {
        /// The region.
        region_id: u64,
        /// The datanode asked for.
        to: u64,
        /// Why not.
        reason: String,
    },

    /// The persisted state of a region migration could not be decoded or encoded.
    #[snafu(display("region-migration procedure state: {source}"))]
    RegionMigrationState {
        /// The JSON error.
        source: serde_json::Error,
    },

    /// A table to drop does not exist.
    #[snafu(display("table {table} does not exist"))]
    TableNotFound {
        /// The full table name.
        table: String,
    },

    /// A table to drop is not the one its name named when the drop was submitted (dropped and created again).
    #[snafu(display(
        "table {table} changed since the drop was submitted: its id is {found:?}, the drop was for {expected}"
    ))]
    TableChanged {
        /// The full table name.
        table: String,
        /// The id the drop was submitted for.
        expected: u32,
        /// The id the name maps to now.
        found: Option<u32>,
    },

    /// The persisted state of a drop-table procedure could not be decoded or encoded.
    #[snafu(display("drop-table procedure state: {source}"))]
    DropTableState {
        /// The JSON error.
        source: serde_json::Error,
    },

    /// A dropped table's region is still led by a datanode (it closes it on its next heartbeat, or its lease runs
    /// out).
    #[snafu(display(
        "table {table} is dropped; datanode {datanode_id} still leads its region {region_id} (it closes it on its \
         next heartbeat)"
    ))]
    RegionStillOpen {
        /// The full table name.
        table: String,
        /// The region.
        region_id: u64,
        /// The datanode leading it.
        datanode_id: u64,
    },

    /// A failed datanode's regions have nowhere to go: no other datanode heartbeats and is unsuspected.
    #[snafu(display(
        "datanode {datanode_id} failed, and no other datanode is alive to take its {regions} region(s)"
    ))]
    NoFailoverTarget {
        /// The failed datanode.
        datanode_id: u64,
        /// How many regions wait to move.
        regions: usize,
    },

    /// The persisted state of a datanode failover could not be decoded or encoded.
    #[snafu(display("datanode-failover procedure state: {source}"))]
    DatanodeFailoverState {
        /// The JSON error.
        source: serde_json::Error,
    },

    /// A migrated region does not lead on its new datanode yet (it opens and gets its lease from the datanode's
    /// heartbeats once the old leader's lease has run out).
    #[snafu(display(
        "region {region_id} does not lead on datanode {to} at epoch {epoch} yet ({seen})"
    ))]
    RegionNotLeadingYet {
        /// The region.
        region_id: u64,
        /// The datanode it moves to.
        to: u64,
        /// The region epoch it must lead at.
        epoch: u64,
        /// What the registry sees now.
        seen: String,
    },
    /// A migration's target failed (the failure detector retired it) after the route moved to it and before it led
    /// the region: the migration ends, and the failover of that datanode moves the region to a live one.
    #[snafu(display(
        "region {region_id}: datanode {to} failed before it led the region at epoch {epoch}; the failover of \
         datanode {to} moves the region to a live datanode"
    ))]
    MigrationTargetFailed {
        /// The region.
        region_id: u64,
        /// The failed target.
        to: u64,
        /// The region epoch the route gave it.
        epoch: u64,
    },
    // ---- end ddl ----

    // ---- datanode (src/datanode) ----
    /// A key under `__dn_table/{datanode_id}/` is not `__dn_table/{datanode_id}/{table_id}`.
    #[snafu(display("datanode table key '{key}' is malformed: {reason}"))]
    InvalidDatanodeTableKey {
        /// The key (lossy UTF-8).
        key: String,
        /// What is wrong with it.
        reason: String,
    },

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
    /// A table reference given on the command line is malformed.
    #[snafu(display("invalid table name '{name}': {reason}"))]
    InvalidTableReference {
        /// The name as given.
        name: String,
        /// What is wrong.
        reason: String,
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
            // ---- retryable: ddl ----
            Error::DatanodeUnavailable { .. } => true,
            Error::SequenceContention { .. } => true,
            Error::RegionNotLeadingYet { .. }
            | Error::NoFailoverTarget { .. }
            | Error::RegionStillOpen { .. } => true,
            Error::CreateTable { source, .. } => source.is_retryable(),
            Error::WalRegion { source, .. } => source.is_retryable(),
            // ---- not retryable: the same call fails the same way (bad input, damaged data, a refusal) ----
            Error::InvalidName { .. }
            | Error::InvalidCreateTable { .. }
            | Error::TableAlreadyExists { .. }
            | Error::TableMetadataConflict { .. }
            | Error::MetadataTxnTooLarge { .. }
            | Error::EncodeMetadata { .. }
            | Error::DecodeMetadata { .. }
            | Error::CorruptSequence { .. }
            | Error::SequenceExhausted { .. }
            | Error::ProcedureFenced { .. }
            | Error::NoDatanodes { .. }
            | Error::WalOptionsCount { .. }
            | Error::RegionExistsWithDifferentOptions { .. }
            | Error::CreateTableState { .. }
            | Error::CreateTableOutput { .. }
            | Error::CreateTableIdInUse { .. }
            | Error::InvalidRegionMigration { .. }
            | Error::RegionMigrationState { .. }
            | Error::TableNotFound { .. }
            | Error::TableChanged { .. }
            | Error::DropTableState { .. }
            | Error::DatanodeFailoverState { .. }
            | Error::InvalidDatanodeTableKey { .. }
            | Error::DecodeDatanodeTableValue { .. }
            | Error::RegionWalOptions { .. }
            | Error::WalProviderMismatch { .. }
            | Error::MissingRegionWalOptions { .. }
            | Error::MigrationTargetFailed { .. }
            | Error::DatanodeUnknown { .. }
            | Error::DatanodeStaleIncarnation { .. }
            | Error::DatanodeRetired { .. }
            | Error::DatanodeNotRegistered { .. }
            | Error::ReadConfig { .. }
            | Error::ParseConfig { .. }
            | Error::InvalidConfig { .. }
            | Error::ValidateConfig { .. }
            | Error::InvalidTableReference { .. }
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

impl From<procedures::Error> for Error {
    fn from(source: procedures::Error) -> Self {
        Error::Procedure {
            source: Box::new(source),
        }
    }
}

impl From<Error> for procedures::Error {
    /// Hands a remote-wal error to the engine, keeping whether it is retryable.
    fn from(e: Error) -> Self {
        let retryable = e.is_retryable();
        procedures::Error::External {
            source: Box::new(e),
            retryable,
        }
    }
}
