//! The kv layer's own error: what a metadata store (memory, redb, etcd, PostgreSQL) call can fail with.
//!
//! Each variant names what it touched (key, path, endpoint) and carries what decides whether it is retryable,
//! set where it is built (the backend knows its client's errors); [`Error::is_retryable`] only reads fields.
//! Layers above convert it at their boundary: the crate's [`crate::Error`] holds it whole (`Error::Kv`), the
//! procedure engine receives it through that.

use snafu::Snafu;

/// Result alias of the kv layer.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a kv backend call can fail with.
#[derive(Debug, Snafu)]
#[snafu(visibility(pub))]
#[non_exhaustive]
pub enum Error {
    /// A kv request is malformed (an empty key, a key written twice in one transaction); nothing was applied.
    #[snafu(display("kv backend {backend}: invalid request on key '{key}': {reason}"))]
    KvInvalidRequest {
        /// The backend's name.
        backend: String,
        /// The offending key (escaped).
        key: String,
        /// What is wrong.
        reason: String,
    },

    /// A kv request exceeds the backend's limits (operations per transaction, bytes per request); nothing was
    /// applied.
    #[snafu(display("kv backend {backend}: request on key '{key}' refused: {reason}"))]
    KvLimit {
        /// The backend's name.
        backend: String,
        /// The first key of the refused request (escaped).
        key: String,
        /// The limit that was hit and by how much.
        reason: String,
    },

    /// The redb file could not be opened or created.
    #[snafu(display("cannot open redb metadata store '{}': {source}", path.display()))]
    RedbOpen {
        /// The database file.
        path: std::path::PathBuf,
        /// redb's error.
        #[snafu(source(from(redb::DatabaseError, Box::new)))]
        source: Box<redb::DatabaseError>,
    },

    /// The redb file is held by another process (or another open handle in this one).
    #[snafu(display(
        "redb metadata store '{}' is already open in another process or handle; only one may hold it",
        path.display()
    ))]
    RedbLocked {
        /// The database file.
        path: std::path::PathBuf,
        /// redb's error.
        #[snafu(source(from(redb::DatabaseError, Box::new)))]
        source: Box<redb::DatabaseError>,
    },

    /// A redb read or write transaction failed.
    #[snafu(display("redb metadata store '{}': {action} on key '{key}' failed: {source}", path.display()))]
    RedbOp {
        /// The database file.
        path: std::path::PathBuf,
        /// The kv call (`get`, `put`, `txn`, ...).
        action: &'static str,
        /// The (first) key touched, escaped.
        key: String,
        /// redb's error (boxed: it is large).
        source: Box<redb::Error>,
    },

    /// The blocking task that ran a redb call died before answering.
    #[snafu(display("redb metadata store '{}': {action} on key '{key}' did not complete: {source}", path.display()))]
    RedbTask {
        /// The database file.
        path: std::path::PathBuf,
        /// The kv call.
        action: &'static str,
        /// The (first) key touched, escaped.
        key: String,
        /// The join error.
        source: tokio::task::JoinError,
    },

    /// A must-exist open found no redb file: nothing creates metadata on a read-only path.
    #[snafu(display(
        "redb metadata store '{}' does not exist; only a command that writes metadata creates it (is the path right?)",
        path.display()
    ))]
    RedbMissing {
        /// The database file.
        path: std::path::PathBuf,
    },

    /// The redb file exists but is empty (truncated to 0 bytes): it is never re-initialised, since that would
    /// silently lose every table.
    #[snafu(display(
        "redb metadata store '{}' is an empty file (0 bytes): it was truncated or damaged; it is not re-initialised \
         (that would lose every table): restore it from a backup, or move it away to start with an empty store",
        path.display()
    ))]
    RedbEmptyFile {
        /// The database file.
        path: std::path::PathBuf,
    },

    /// The redb file (or its directory) could not be read, or a new file could not be created in place.
    #[snafu(display("redb metadata store '{}': cannot {action}: {source}", path.display()))]
    RedbFile {
        /// The database file.
        path: std::path::PathBuf,
        /// What was being done (`read the file's metadata`, `create the file`, ...).
        action: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },

    /// redb panicked inside a call (it does on some damaged bytes): the file is damaged. The handle refuses every
    /// later call, since redb's state in memory can no longer be trusted.
    #[snafu(display(
        "redb metadata store '{}' is damaged: {operation} hit an internal error in redb ({message}); restore the \
         file from a backup or move it away",
        path.display()
    ))]
    RedbDamaged {
        /// The database file.
        path: std::path::PathBuf,
        /// The kv call and its (first) key, e.g. `open` or `get on key '__table_name/…'`.
        operation: String,
        /// redb's panic message and where it was raised.
        message: String,
    },

    /// The etcd configuration is unusable (no endpoints).
    #[snafu(display("invalid etcd configuration: {reason}"))]
    EtcdConfig {
        /// What is wrong.
        reason: String,
    },

    /// An etcd security setting (`[metadata_store] tls`, `username`, `password_file`) is unusable.
    #[snafu(display("invalid etcd configuration: {key}: {reason}"))]
    EtcdSecurityConfig {
        /// The key, e.g. `metadata_store.tls.cert`.
        key: &'static str,
        /// What is wrong (never a secret's value).
        reason: String,
    },

    /// A file an etcd security setting names (a certificate, a key, the password file) could not be read.
    #[snafu(display("cannot read {key} file {}: {source}", path.display()))]
    EtcdCredentialFile {
        /// The key naming the file, e.g. `metadata_store.password_file`.
        key: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },

    /// No etcd endpoint answered the connection attempt.
    #[snafu(display("cannot connect to etcd at {endpoints}: {detail}"))]
    EtcdConnect {
        /// The endpoints tried, comma-separated.
        endpoints: String,
        /// A one-line account of the client's error, written where the error is built.
        detail: String,
        /// The client's error.
        #[snafu(source(from(etcd_client::Error, Box::new)))]
        source: Box<etcd_client::Error>,
        /// Whether connecting again may succeed; decided by the kv layer from the client's error.
        retryable: bool,
    },

    /// The etcd connection attempt did not finish within the connect timeout.
    #[snafu(display("cannot connect to etcd at {endpoints}: no answer within {timeout:?}"))]
    EtcdConnectTimeout {
        /// The endpoints tried, comma-separated.
        endpoints: String,
        /// The connect timeout.
        timeout: std::time::Duration,
    },

    /// An etcd call did not answer within the request timeout (its effect is unknown).
    #[snafu(display("etcd at {endpoints}: {action} on key '{key}' timed out after {timeout:?}"))]
    EtcdTimeout {
        /// The endpoints, comma-separated.
        endpoints: String,
        /// The kv call.
        action: &'static str,
        /// The (first) key touched, escaped.
        key: String,
        /// The request timeout.
        timeout: std::time::Duration,
    },

    /// An etcd call failed.
    #[snafu(display("etcd at {endpoints}: {action} on key '{key}' failed: {detail}"))]
    EtcdOp {
        /// The endpoints, comma-separated.
        endpoints: String,
        /// The kv call.
        action: &'static str,
        /// The (first) key touched, escaped.
        key: String,
        /// A one-line account of the client's error, written where the error is built.
        detail: String,
        /// The client's error.
        #[snafu(source(from(etcd_client::Error, Box::new)))]
        source: Box<etcd_client::Error>,
        /// Whether the same call may succeed if tried again; decided by the kv layer from the client's error.
        retryable: bool,
    },

    /// The PostgreSQL metadata store's configuration is unusable, or its table's recorded schema version is not
    /// this release's.
    #[snafu(display("PostgreSQL metadata store: {key}: {reason}"))]
    PostgresConfig {
        /// The setting or object at fault, e.g. `metadata_store.url` or the table's name.
        key: String,
        /// What is wrong (never the password).
        reason: String,
    },

    /// A PostgreSQL call failed (connecting included). The endpoint is `host:port/database`, never the password.
    #[snafu(display("PostgreSQL at {endpoint}: {action}{} failed: {detail}", on_key(key)))]
    PostgresOp {
        /// `host:port/database`.
        endpoint: String,
        /// The kv call (or `connect`).
        action: &'static str,
        /// The (first) key touched, escaped (empty when none).
        key: String,
        /// A one-line account of the client's error (its SQLSTATE when the server sent one).
        detail: String,
        /// Whether the same call may succeed if tried again (a lost connection, a server starting or shutting
        /// down, a serialization failure that outlasted the retries); decided by the kv layer.
        retryable: bool,
    },
}

/// ` on key 'K'` for a message, or nothing when no key was touched.
fn on_key(key: &str) -> String {
    if key.is_empty() {
        String::new()
    } else {
        format!(" on key '{key}'")
    }
}

impl Error {
    /// Whether the same call may succeed if tried again (a member unreachable, a timeout, a lost connection).
    ///
    /// The match names every variant (no catch-all), so a new variant does not compile until it is classified.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::EtcdConnect { retryable, .. } | Error::EtcdOp { retryable, .. } => *retryable,
            Error::EtcdConnectTimeout { .. } | Error::EtcdTimeout { .. } => true,
            Error::PostgresOp { retryable, .. } => *retryable,
            Error::KvInvalidRequest { .. }
            | Error::KvLimit { .. }
            | Error::RedbOpen { .. }
            | Error::RedbLocked { .. }
            | Error::RedbOp { .. }
            | Error::RedbTask { .. }
            | Error::RedbMissing { .. }
            | Error::RedbEmptyFile { .. }
            | Error::RedbFile { .. }
            | Error::RedbDamaged { .. }
            | Error::EtcdConfig { .. }
            | Error::PostgresConfig { .. }
            | Error::EtcdSecurityConfig { .. }
            | Error::EtcdCredentialFile { .. } => false,
        }
    }
}

impl From<Error> for procedures::Error {
    /// Hands a kv error to the engine, keeping whether it is retryable.
    fn from(e: Error) -> Self {
        procedures::Error::from(crate::Error::from(e))
    }
}
