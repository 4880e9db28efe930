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
        source: redb::DatabaseError,
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
        source: redb::DatabaseError,
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
        /// redb's error.
        source: redb::Error,
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

    /// The etcd configuration is unusable (no endpoints).
    #[snafu(display("invalid etcd configuration: {reason}"))]
    EtcdConfig {
        /// What is wrong.
        reason: String,
    },

    /// No etcd endpoint answered the connection attempt.
    #[snafu(display("cannot connect to etcd at {endpoints}: {source}"))]
    EtcdConnect {
        /// The endpoints tried, comma-separated.
        endpoints: String,
        /// The client's error.
        source: etcd_client::Error,
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
    #[snafu(display("etcd at {endpoints}: {action} on key '{key}' failed: {source}"))]
    EtcdOp {
        /// The endpoints, comma-separated.
        endpoints: String,
        /// The kv call.
        action: &'static str,
        /// The (first) key touched, escaped.
        key: String,
        /// The client's error.
        source: etcd_client::Error,
    },
    // ---- end kv ----

    // ---- wal (src/wal) ----
    /// The WAL config did not parse (bad TOML, an unknown key, a bad duration).
    #[snafu(display("invalid WAL config: {source}"))]
    ParseWalConfig {
        /// The TOML error; it names the key and position.
        source: toml::de::Error,
    },
    /// A WAL config value is out of range.
    #[snafu(display("invalid WAL config: {field} = {value}: {reason}"))]
    InvalidWalConfig {
        /// The field, e.g. `topic_name_prefix` or `backoff.deadline`.
        field: String,
        /// The value as configured.
        value: String,
        /// Why it is rejected.
        reason: String,
    },
    /// A topic name Kafka would reject; caught before anything is sent.
    #[snafu(display("invalid Kafka topic name '{topic}': {reason}"))]
    InvalidTopicName {
        /// The name.
        topic: String,
        /// Why it is rejected.
        reason: String,
    },
    /// No broker answered within the backoff deadline (or rskafka gave up earlier).
    #[snafu(display("cannot connect to Kafka brokers {endpoints:?}: {source}"))]
    KafkaConnect {
        /// The bootstrap endpoints.
        endpoints: Vec<String>,
        /// rskafka's error.
        source: rskafka::client::error::Error,
    },
    /// A Kafka call did not finish in time.
    #[snafu(display("Kafka brokers {endpoints:?}: {operation} did not finish within {timeout:?}"))]
    KafkaTimeout {
        /// The bootstrap endpoints.
        endpoints: Vec<String>,
        /// What was being done, e.g. `connect` or `create topic 'wal_3'`.
        operation: String,
        /// How long was waited.
        timeout: std::time::Duration,
    },
    /// Listing the cluster's topics failed.
    #[snafu(display("cannot list topics on Kafka brokers {endpoints:?}: {source}"))]
    ListTopics {
        /// The bootstrap endpoints.
        endpoints: Vec<String>,
        /// rskafka's error.
        source: rskafka::client::error::Error,
    },
    /// Creating a topic failed for a reason not covered by a more specific variant.
    #[snafu(display("cannot create topic '{topic}' on Kafka brokers {endpoints:?}: {source}"))]
    CreateTopic {
        /// The topic.
        topic: String,
        /// The bootstrap endpoints.
        endpoints: Vec<String>,
        /// rskafka's error.
        source: rskafka::client::error::Error,
    },
    /// The topic exists with a different partition count than wanted.
    #[snafu(display(
        "topic '{topic}' already exists with {found} partition(s), but {wanted} partition(s) are wanted"
    ))]
    TopicPartitionMismatch {
        /// The topic.
        topic: String,
        /// The partition count asked for.
        wanted: i32,
        /// The partition count Kafka reports.
        found: usize,
    },
    /// A topic Kafka created or reported as existing did not show up in fresh metadata in time (deleted in
    /// between, or the brokers' metadata lagging).
    #[snafu(display(
        "topic '{topic}' was created or reported as existing by Kafka brokers {endpoints:?}, but was not in their metadata within {timeout:?}"
    ))]
    TopicNotListed {
        /// The topic.
        topic: String,
        /// The bootstrap endpoints.
        endpoints: Vec<String>,
        /// How long metadata was polled.
        timeout: std::time::Duration,
    },
    /// Kafka rejected the replication factor (error 38), typically more replicas than live brokers.
    #[snafu(display(
        "Kafka rejected replication factor {replication_factor} for topic '{topic}' (INVALID_REPLICATION_FACTOR): {message}"
    ))]
    InvalidReplicationFactor {
        /// The topic.
        topic: String,
        /// The replication factor asked for.
        replication_factor: i16,
        /// The broker's message.
        message: String,
        /// rskafka's error.
        source: rskafka::client::error::Error,
    },
    /// Kafka rejected the topic name (error 17).
    #[snafu(display("Kafka rejected topic name '{topic}' (INVALID_TOPIC_EXCEPTION): {message}"))]
    KafkaRejectedTopicName {
        /// The topic.
        topic: String,
        /// The broker's message.
        message: String,
        /// rskafka's error.
        source: rskafka::client::error::Error,
    },
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
            Error::EtcdConnect { .. }
            | Error::EtcdConnectTimeout { .. }
            | Error::EtcdTimeout { .. } => true,
            Error::EtcdOp { source, .. } => crate::kv::etcd::is_retryable(source),
            // ---- retryable: wal ----
            Error::KafkaTimeout { .. } | Error::TopicNotListed { .. } => true,
            Error::KafkaConnect { source, .. }
            | Error::ListTopics { source, .. }
            | Error::CreateTopic { source, .. } => {
                crate::wal::kafka::rskafka_admin::is_retryable_rskafka_error(source)
            }
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
