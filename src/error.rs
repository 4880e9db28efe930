//! The one error type of the `remote-wal` crate.
//!
//! Variants are grouped by the module that raises them. Each names what it touched (key, topic, endpoint, table).

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
    // ---- kv (src/kv) ----
    /// Placeholder of the kv section.
    #[snafu(display("kv backend {backend}: {message}"))]
    KvOther {
        /// The backend's name.
        backend: String,
        /// What happened.
        message: String,
    },
    // ---- end kv ----

    // ---- wal (src/wal) ----
    /// Encoded WAL options did not decode.
    #[snafu(display("invalid encoded WAL options '{encoded}': {source}"))]
    DecodeWalOptions {
        /// The string as found.
        encoded: String,
        /// The JSON error.
        source: serde_json::Error,
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
        source: procedures::Error,
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
        #[snafu(source(from(Error, Box::new)))]
        source: Box<Error>,
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
    // ---- end datanode ----

    // ---- metasrv and config (src/metasrv.rs, src/config.rs) ----
    /// Placeholder of the metasrv section.
    #[snafu(display("metasrv: {message}"))]
    MetasrvOther {
        /// What happened.
        message: String,
    },
    // ---- end metasrv ----

    // ---- procedures (the engine's errors, wrapped) ----
    /// The procedure engine failed.
    #[snafu(display("{source}"))]
    Procedure {
        /// The engine's error.
        source: procedures::Error,
    },
    // ---- end procedures ----
}

impl Error {
    /// Whether the same call may succeed if tried again (a service was unreachable, a timeout).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Procedure { source } => source.is_retryable(),
            // ---- retryable: kv ----
            // ---- retryable: wal ----
            // ---- retryable: ddl ----
            Error::DatanodeUnavailable { .. } => true,
            Error::SequenceContention { .. } => true,
            Error::CreateTable { source, .. } => source.is_retryable(),
            _ => false,
        }
    }
}

impl From<procedures::Error> for Error {
    fn from(source: procedures::Error) -> Self {
        Error::Procedure { source }
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
