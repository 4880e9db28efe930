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
    /// A key under `__topic_name/kafka/` (or its value) that does not decode.
    #[snafu(display("invalid persisted topic name key '{key}': {reason}"))]
    InvalidTopicNameKey {
        /// The key as found (lossy UTF-8).
        key: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A topic pool specification that cannot be bootstrapped.
    #[snafu(display("invalid Kafka topic pool '{prefix}': {reason}"))]
    InvalidTopicPool {
        /// The pool's topic name prefix.
        prefix: String,
        /// What is wrong.
        reason: String,
    },

    /// A topic of the pool exists with a partition count other than the pool's.
    #[snafu(display(
        "Kafka topic '{topic}' has {actual} partitions but the pool needs {expected}; delete or fix it, or change the pool's prefix"
    ))]
    PoolTopicPartitions {
        /// The topic.
        topic: String,
        /// The pool's partition count.
        expected: i32,
        /// What the broker reports.
        actual: usize,
    },

    /// Topics that were created did not show up in the broker's metadata before the deadline.
    #[snafu(display(
        "Kafka topics {topics:?} not visible in the metadata of {endpoints:?} after {waited:?}"
    ))]
    PoolTopicsNotVisible {
        /// The topics still missing.
        topics: Vec<String>,
        /// The brokers asked.
        endpoints: Vec<String>,
        /// How long the bootstrap waited.
        waited: std::time::Duration,
    },

    /// Persisting the pool's topic names kept conflicting with another writer.
    #[snafu(display("persisting the topic names of pool '{prefix}' conflicted: {reason}"))]
    PersistTopicNamesConflict {
        /// The pool's topic name prefix.
        prefix: String,
        /// What conflicted.
        reason: String,
    },

    /// The topic bootstrap procedure failed (or could not be run).
    #[snafu(display("bootstrap of Kafka topic pool '{prefix}' failed: {source}"))]
    TopicBootstrap {
        /// The pool's topic name prefix.
        prefix: String,
        /// The engine's error (the procedure's own error is inside).
        source: procedures::Error,
    },

    /// WAL options were asked of a Kafka topic pool that is not ready (not bootstrapped, or incomplete).
    #[snafu(display("Kafka topic pool '{prefix}' is not ready: {reason}"))]
    TopicPoolNotReady {
        /// The pool's topic name prefix.
        prefix: String,
        /// Why.
        reason: String,
    },

    /// A topic selector was given no topics to choose from.
    #[snafu(display("cannot select a topic from an empty topic list"))]
    EmptyTopicList,
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
