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
    /// Placeholder of the ddl section.
    #[snafu(display("ddl: {message}"))]
    DdlOther {
        /// What happened.
        message: String,
    },
    // ---- end ddl ----

    // ---- datanode (src/datanode) ----
    /// Placeholder of the datanode section.
    #[snafu(display("datanode: {message}"))]
    DatanodeOther {
        /// What happened.
        message: String,
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
