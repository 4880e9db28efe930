//! The DDL layer's own error: what table metadata, id sequences, placement, and the create, drop, migration and
//! failover procedures can fail with (and the codecs of the DDL's metadata keys: table names, datanode tables).
//!
//! Each variant names what it touched (table, key, region, datanode, procedure id) and, where retryability depends
//! on a source, reads it from the source; [`Error::is_retryable`] decides by a match naming every variant. Layers
//! above convert it at their boundary: the crate's [`crate::Error`] holds it whole (`Error::Ddl`), the procedure
//! engine receives it with its retryability. It holds the kv and WAL layers' errors whole, as those layers sit below.

use snafu::Snafu;

/// Result alias of the DDL layer.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a DDL call can fail with.
#[derive(Debug, Snafu)]
#[snafu(visibility(pub))]
#[non_exhaustive]
pub enum Error {
    /// A metadata store call failed; [`crate::kv::Error`] says how.
    #[snafu(transparent)]
    Kv {
        /// The kv layer's error.
        source: crate::kv::Error,
    },
    /// A WAL call failed (allocating WAL options, the pool not ready); [`crate::wal::Error`] says how.
    #[snafu(transparent)]
    Wal {
        /// The WAL layer's error (boxed: its largest variants would make every `Result` of the layer larger).
        #[snafu(source(from(crate::wal::Error, Box::new)))]
        source: Box<crate::wal::Error>,
    },
    /// A call of the procedure engine failed (submitting or watching a DDL procedure).
    #[snafu(display("{source}"))]
    Procedure {
        /// The engine's error.
        #[snafu(source(from(procedures::Error, Box::new)))]
        source: Box<procedures::Error>,
    },
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
    /// A key under `__dn_table/{datanode_id}/` is not `__dn_table/{datanode_id}/{table_id}`.
    #[snafu(display("datanode table key '{key}' is malformed: {reason}"))]
    InvalidDatanodeTableKey {
        /// The key (lossy UTF-8).
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A table reference given on the command line is malformed.
    #[snafu(display("invalid table name '{name}': {reason}"))]
    InvalidTableReference {
        /// The name as given.
        name: String,
        /// What is wrong.
        reason: String,
    },
}

impl Error {
    /// Whether the same call may succeed if tried again (a datanode unreachable, a lost race, a region not led yet).
    ///
    /// The match names every variant (no catch-all), so a new variant does not compile until it is classified.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Kv { source } => source.is_retryable(),
            Error::Wal { source } => source.is_retryable(),
            Error::Procedure { source } => source.is_retryable(),
            Error::CreateTable { source, .. } => source.is_retryable(),
            // ---- retryable: a datanode or a region not there yet, a lost compare-and-put race ----
            Error::DatanodeUnavailable { .. }
            | Error::SequenceContention { .. }
            | Error::RegionNotLeadingYet { .. }
            | Error::NoFailoverTarget { .. }
            | Error::RegionStillOpen { .. } => true,
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
            | Error::MigrationTargetFailed { .. }
            | Error::InvalidTableReference { .. }
            | Error::InvalidDatanodeTableKey { .. } => false,
        }
    }
}

crate::error::engine_conversions!(Error);
