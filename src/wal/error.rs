//! The WAL layer's own error: what its config, the Kafka clients, the topic pool and its bootstrap, the log stores
//! (Kafka and raft-engine), replay and prune can fail with.
//!
//! Each variant names what it touched (topic, endpoint, region, directory) and, where retryability depends on the
//! source, carries a `retryable` field set where it is built (the Kafka layer knows rskafka's errors);
//! [`Error::is_retryable`] only reads fields. Layers above convert it at their boundary: the crate's
//! [`crate::Error`] holds it whole (`Error::Wal`), the procedure engine receives it with its retryability.

use snafu::Snafu;

/// Result alias of the WAL layer.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a WAL call can fail with.
#[derive(Debug, Snafu)]
#[snafu(visibility(pub))]
#[non_exhaustive]
pub enum Error {
    /// A metadata store call of the WAL layer failed (the pool's names, checkpoints, watermarks);
    /// [`crate::kv::Error`] says how.
    #[snafu(transparent)]
    Kv {
        /// The kv layer's error.
        source: crate::kv::Error,
    },
    /// A call of the procedure engine failed (the pool's bootstrap procedure, a prune round's).
    #[snafu(display("{source}"))]
    Procedure {
        /// The engine's error.
        #[snafu(source(from(procedures::Error, Box::new)))]
        source: Box<procedures::Error>,
    },
    /// The WAL config did not parse (bad TOML, an unknown key, a bad duration).
    #[snafu(display("invalid WAL config: {source}"))]
    ParseWalConfig {
        /// The TOML error; it names the key and position.
        #[snafu(source(from(toml::de::Error, Box::new)))]
        source: Box<toml::de::Error>,
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
        /// rskafka's error (boxed: it is large).
        #[snafu(source(from(rskafka::client::error::Error, Box::new)))]
        source: Box<rskafka::client::error::Error>,
        /// Whether connecting again may succeed; decided by the Kafka layer (an exhausted backoff deadline is
        /// final).
        retryable: bool,
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
        /// Whether the call may be tried again: a timed-out request may, a connect that used up the backoff
        /// deadline may not.
        retryable: bool,
    },
    /// A broker refused this client's security settings (`[wal.security]`): the TLS handshake failed (an untrusted
    /// or mismatched certificate, or a listener that does not speak TLS), or SASL authentication did (a wrong
    /// password, an unknown user, a mechanism the broker does not offer). Never retryable: the same settings get
    /// the same answer.
    #[snafu(display("Kafka broker {endpoint}: {stage} failed: {reason}"))]
    KafkaSecurity {
        /// The broker, `host:port`.
        endpoint: String,
        /// What was refused, e.g. `TLS handshake` or `SASL authentication (SCRAM-SHA-256 as user 'walctl')`.
        stage: String,
        /// Why, as the TLS library or the broker said it (never a secret).
        reason: String,
    },
    /// A request the batching admin sent to a broker failed as a whole (the connection broke, the answer could not
    /// be read, or it was refused): nothing is known of any topic it carried.
    #[snafu(display("Kafka broker {broker} (of {endpoints:?}): {operation} failed: {reason}"))]
    KafkaRequest {
        /// The broker the request went to, `host:port`.
        broker: String,
        /// The bootstrap endpoints.
        endpoints: Vec<String>,
        /// What was sent, e.g. `CreateTopics of 1000 topic(s) (wal_0 … wal_999)`.
        operation: String,
        /// What went wrong.
        reason: String,
        /// Whether the same request may succeed if sent again; decided by the Kafka layer.
        retryable: bool,
    },
    /// Listing the cluster's topics failed.
    #[snafu(display("cannot list topics on Kafka brokers {endpoints:?}: {source}"))]
    ListTopics {
        /// The bootstrap endpoints.
        endpoints: Vec<String>,
        /// rskafka's error (boxed: it is large).
        #[snafu(source(from(rskafka::client::error::Error, Box::new)))]
        source: Box<rskafka::client::error::Error>,
        /// Whether the same call may succeed if tried again; decided by the Kafka layer from rskafka's error.
        retryable: bool,
    },
    /// Creating a topic failed for a reason not covered by a more specific variant.
    #[snafu(display("cannot create topic '{topic}' on Kafka brokers {endpoints:?}: {source}"))]
    CreateTopic {
        /// The topic.
        topic: String,
        /// The bootstrap endpoints.
        endpoints: Vec<String>,
        /// rskafka's error (boxed: it is large).
        #[snafu(source(from(rskafka::client::error::Error, Box::new)))]
        source: Box<rskafka::client::error::Error>,
        /// Whether the same call may succeed if tried again; decided by the Kafka layer from rskafka's error.
        retryable: bool,
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
        /// rskafka's error (boxed: it is large).
        #[snafu(source(from(rskafka::client::error::Error, Box::new)))]
        source: Box<rskafka::client::error::Error>,
    },
    /// Kafka answered that no broker can take replicas now (BROKER_NOT_AVAILABLE, or a replica placement refused
    /// while every broker is fenced: shutting down, restarting, or not yet registered with the controller): a
    /// transient state the engine retries.
    #[snafu(display(
        "Kafka brokers {endpoints:?} cannot take topic '{topic}' now: every broker is fenced (shutting down or restarting): {message}"
    ))]
    KafkaBrokersFenced {
        /// The topic.
        topic: String,
        /// The brokers asked.
        endpoints: Vec<String>,
        /// The broker's message.
        message: String,
        /// rskafka's error (boxed: it is large).
        #[snafu(source(from(rskafka::client::error::Error, Box::new)))]
        source: Box<rskafka::client::error::Error>,
    },
    /// Kafka rejected the topic name (error 17).
    #[snafu(display("Kafka rejected topic name '{topic}' (INVALID_TOPIC_EXCEPTION): {message}"))]
    KafkaRejectedTopicName {
        /// The topic.
        topic: String,
        /// The broker's message.
        message: String,
        /// rskafka's error (boxed: it is large).
        #[snafu(source(from(rskafka::client::error::Error, Box::new)))]
        source: Box<rskafka::client::error::Error>,
    },
    /// Encoded WAL options did not decode.
    #[snafu(display("invalid encoded WAL options '{encoded}': {source}"))]
    DecodeWalOptions {
        /// The string as found.
        encoded: String,
        /// The JSON error.
        source: serde_json::Error,
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
    /// Persisting the pool's topic names kept conflicting with another writer.
    #[snafu(display("persisting the topic names of pool '{prefix}' conflicted: {reason}"))]
    PersistTopicNamesConflict {
        /// The pool's topic name prefix.
        prefix: String,
        /// What conflicted.
        reason: String,
    },
    /// Topics of the pool that regions wrote to are gone from the brokers, or were deleted and created again
    /// (another topic id): what the regions' WAL held there is lost, and the pool is not recreated silently.
    #[snafu(display(
        "Kafka topic pool '{prefix}' is not whole: {topics}. What these topics held of their regions' WAL is lost; \
         `walctl bootstrap --recreate-missing` creates the missing ones anew and records the new topic ids"
    ))]
    PoolTopicsLost {
        /// The pool's topic name prefix.
        prefix: String,
        /// Each lost topic: its name, its recorded and current ids, the regions on it.
        topics: String,
    },
    /// A prune found a pool topic listed under another topic id than the one recorded: it was deleted and created
    /// again, and the checkpoints of its regions count entries of the topic that is gone.
    #[snafu(display(
        "topic '{topic}' was deleted and created again (recorded id {recorded}, now {now}): not pruned; \
         `walctl bootstrap --recreate-missing` records the new incarnation"
    ))]
    WalTopicRecreated {
        /// The topic.
        topic: String,
        /// The id its `__topic_name` value records.
        recorded: String,
        /// The id the brokers list now.
        now: String,
    },
    /// The topic bootstrap procedure failed (or could not be run).
    #[snafu(display("bootstrap of Kafka topic pool '{prefix}' failed: {source}"))]
    TopicBootstrap {
        /// The pool's topic name prefix.
        prefix: String,
        /// The engine's error (the procedure's own error is inside).
        #[snafu(source(from(procedures::Error, Box::new)))]
        source: Box<procedures::Error>,
    },
    /// A bootstrap recovered after a crash belongs to a pool (prefix) that is no longer the configured one.
    #[snafu(display(
        "a recovered bootstrap of Kafka topic pool '{recovered}' is abandoned: the configured pool is now \
         '{configured}'; nothing more is created for '{recovered}'"
    ))]
    BootstrapPoolChanged {
        /// The recovered bootstrap's prefix.
        recovered: String,
        /// The configured pool's prefix.
        configured: String,
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
    /// A Kafka call of a region log store failed; retryability decided from rskafka's error where it is built.
    #[snafu(display("WAL topic '{topic}': {operation} failed: {source}"))]
    LogKafka {
        /// The topic.
        topic: String,
        /// The call and what it touched (`produce 3 records`, `fetch from offset 12`).
        operation: String,
        /// Whether the same call may succeed if made again.
        retryable: bool,
        /// rskafka's error.
        #[snafu(source(from(rskafka::client::error::Error, Box::new)))]
        source: Box<rskafka::client::error::Error>,
    },
    /// A Kafka call of a region log store did not finish within its bound (rskafka's retries until the backoff
    /// deadline, then one request); final, since rskafka already retried.
    #[snafu(display("WAL topic '{topic}': {operation} did not finish within {timeout:?}"))]
    LogKafkaTimeout {
        /// The topic.
        topic: String,
        /// The call.
        operation: String,
        /// The bound.
        timeout: std::time::Duration,
    },
    /// A record of a wanted region does not decode (a damaged header, a key naming another region, a failed
    /// checksum, fragments out of order). Not retryable: reading it again gives the same bytes.
    #[snafu(display(
        "WAL topic '{topic}', offset {offset}, region {region_id}: damaged record: {reason}"
    ))]
    LogRecordCorrupt {
        /// The topic.
        topic: String,
        /// The record's offset.
        offset: i64,
        /// The region its key names.
        region_id: u64,
        /// What is wrong.
        reason: String,
    },
    /// A region's entries from an entry id on were asked for, but the topic no longer holds them (deleted by a
    /// prune or Kafka's retention, or the topic was recreated).
    #[snafu(display(
        "WAL topic '{topic}', region {region_id}: entries from entry id {from} are gone: the topic's first entry id is now {earliest}"
    ))]
    LogEntriesPruned {
        /// The topic.
        topic: String,
        /// The region asking from the lowest entry id.
        region_id: u64,
        /// The first entry id asked for.
        from: u64,
        /// The first entry id the topic still holds.
        earliest: u64,
    },
    /// A region's replay checkpoint lies above the end of its topic: the topic lost entries it once held (it was
    /// deleted and recreated, for instance by a broker that auto-creates topics), so replaying nothing would
    /// silently drop the region's unflushed entries. Not retryable.
    #[snafu(display(
        "WAL topic '{topic}', region {region_id}: its replay checkpoint is entry id {checkpoint} but the topic ends at entry id {end}: the topic was recreated or truncated"
    ))]
    LogCheckpointAboveEnd {
        /// The topic.
        topic: String,
        /// The region.
        region_id: u64,
        /// The region's replay checkpoint (its flushed entry id or the topic's pruned entry id).
        checkpoint: u64,
        /// The topic's last entry id (0 when empty).
        end: u64,
    },
    /// Fetches below the topic's high watermark returned no record several times in a row. Retryable: the
    /// partition's leader may be moving.
    #[snafu(display(
        "WAL topic '{topic}': {attempts} fetches from offset {offset} returned no record although the high watermark is {end}"
    ))]
    LogFetchStalled {
        /// The topic.
        topic: String,
        /// The offset fetched from.
        offset: i64,
        /// The high watermark at the start of the read.
        end: i64,
        /// Empty fetches in a row.
        attempts: u32,
    },
    /// The raft-engine directory of a datanode could not be opened or recovered.
    #[snafu(display("cannot open raft-engine WAL directory '{dir}': {source}"))]
    RaftEngineOpen {
        /// The directory.
        dir: String,
        /// raft-engine's error.
        #[snafu(source(from(raft_engine::Error, Box::new)))]
        source: Box<raft_engine::Error>,
    },
    /// A raft-engine read or write failed.
    #[snafu(display("raft-engine WAL '{dir}', region {region_id}: {operation} failed: {source}"))]
    RaftEngineOp {
        /// The directory.
        dir: String,
        /// The call.
        operation: String,
        /// The region.
        region_id: u64,
        /// raft-engine's error.
        #[snafu(source(from(raft_engine::Error, Box::new)))]
        source: Box<raft_engine::Error>,
    },
    /// A raft-engine call's blocking task panicked or was cancelled.
    #[snafu(display("raft-engine WAL '{dir}': {operation} did not complete: {reason}"))]
    RaftEngineTask {
        /// The directory.
        dir: String,
        /// The call.
        operation: String,
        /// Why.
        reason: String,
    },
    /// A checkpoint's compare-and-put kept losing to other writers of the key. Retryable.
    #[snafu(display(
        "checkpoint key '{key}' changed under {attempts} compare-and-put attempts in a row"
    ))]
    CheckpointContention {
        /// The key.
        key: String,
        /// Attempts made.
        attempts: usize,
    },
    /// A WAL prune named a topic with no `__topic_name/kafka/{topic}` key: it is not a topic of the pool.
    #[snafu(display(
        "cannot prune topic '{topic}': it has no key '{key}' (not a topic of the Kafka pool)"
    ))]
    PruneTopicUnknown {
        /// The topic.
        topic: String,
        /// The missing key.
        key: String,
    },
    /// A WAL prune procedure failed or could not be submitted.
    #[snafu(display("WAL prune of topic '{topic}' failed: {source}"))]
    WalPrune {
        /// The topic.
        topic: String,
        /// The engine's error (the procedure's failure text when it failed).
        #[snafu(source(from(procedures::Error, Box::new)))]
        source: Box<procedures::Error>,
    },
    /// A WAL prune round finished, and some of its topics failed (each topic's error is in the round's output).
    #[snafu(display(
        "wal prune: {failed} of {total} topics failed ({topics}); the others were pruned or skipped as reported, \
         and the next round tries the failed ones again"
    ))]
    WalPruneTopicsFailed {
        /// Topics that failed.
        failed: usize,
        /// Topics in the round.
        total: usize,
        /// The failed topics, comma-separated.
        topics: String,
    },
    /// The compare-and-put advancing a topic's `pruned_entry_id` kept losing to other writers. Retryable.
    #[snafu(display(
        "pruned entry id of key '{key}' changed under {attempts} compare-and-put attempts in a row"
    ))]
    PruneWatermarkContention {
        /// The key.
        key: String,
        /// Attempts made.
        attempts: usize,
    },
    /// A region's WAL could not be replayed (its topic or engine directory failed); other regions are not
    /// affected. Carries the cause's text, since one cause is reported for every region it concerns.
    #[snafu(display("region {region_id}: WAL replay failed: {reason}"))]
    RegionReplay {
        /// The region.
        region_id: u64,
        /// The cause.
        reason: String,
    },
    /// A produce request was acknowledged with another number of offsets than records sent; no entry id can be
    /// given. Not retryable: the records may be written, and sending them again would duplicate them.
    #[snafu(display(
        "WAL topic '{topic}': {sent} records produced but {acknowledged} offsets acknowledged"
    ))]
    LogProduceMismatch {
        /// The topic.
        topic: String,
        /// Records sent.
        sent: usize,
        /// Offsets the broker answered with.
        acknowledged: usize,
    },
    /// An append for a region the log store was not told it may write: on a datanode, a region whose
    /// `__topic_region` key the metasrv has not shown (so a prune could not see its entries). Nothing was written.
    #[snafu(display(
        "WAL topic '{topic}': region {region_id} may not append here (it is not open on this store)"
    ))]
    LogRegionNotRegistered {
        /// The topic.
        topic: String,
        /// The region.
        region_id: u64,
    },
    /// A flush asked to record a checkpoint above the end of the region's WAL: the region's next entries would
    /// look flushed and never be replayed. Nothing is recorded.
    #[snafu(display(
        "cannot flush region {region_id} up to entry id {entry_id}: its WAL ({wal}) ends at entry id {end}"
    ))]
    WalFlushBeyondEnd {
        /// The region.
        region_id: u64,
        /// The WAL: `topic 'T'` or `raft-engine 'DIR'`.
        wal: String,
        /// The entry id asked for.
        entry_id: u64,
        /// The last entry id the WAL gave out.
        end: u64,
    },
    /// A key under `__topic_name/kafka/` (or its value) that does not decode.
    #[snafu(display("invalid persisted topic name key '{key}': {reason}"))]
    InvalidTopicNameKey {
        /// The key as found (lossy UTF-8).
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A `__topic_region/{topic}/{region_id}` key or its value does not decode.
    #[snafu(display("invalid topic region key '{key}': {reason}"))]
    InvalidTopicRegionKey {
        /// The key.
        key: String,
        /// What is wrong.
        reason: String,
    },
}

impl Error {
    /// Whether the same call may succeed if tried again (a broker unreachable, a timeout, a lost race).
    ///
    /// The match names every variant (no catch-all), so a new variant does not compile until it is classified.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Kv { source } => source.is_retryable(),
            Error::Procedure { source } => source.is_retryable(),
            // ---- decided where built (src/wal/kafka, the log stores) ----
            Error::KafkaConnect { retryable, .. }
            | Error::KafkaTimeout { retryable, .. }
            | Error::ListTopics { retryable, .. }
            | Error::CreateTopic { retryable, .. }
            | Error::KafkaRequest { retryable, .. }
            | Error::LogKafka { retryable, .. } => *retryable,
            // ---- retryable: transient broker states and lost compare-and-put races ----
            Error::TopicNotListed { .. }
            | Error::KafkaBrokersFenced { .. }
            | Error::LogFetchStalled { .. }
            | Error::CheckpointContention { .. }
            | Error::PruneWatermarkContention { .. } => true,
            // ---- not retryable: the same call fails the same way (bad input, damaged data, a refusal) ----
            Error::KafkaSecurity { .. }
            | Error::ParseWalConfig { .. }
            | Error::InvalidWalConfig { .. }
            | Error::InvalidTopicName { .. }
            | Error::TopicPartitionMismatch { .. }
            | Error::InvalidReplicationFactor { .. }
            | Error::KafkaRejectedTopicName { .. }
            | Error::DecodeWalOptions { .. }
            | Error::InvalidTopicPool { .. }
            | Error::PoolTopicPartitions { .. }
            | Error::PersistTopicNamesConflict { .. }
            | Error::PoolTopicsLost { .. }
            | Error::WalTopicRecreated { .. }
            | Error::TopicBootstrap { .. }
            | Error::BootstrapPoolChanged { .. }
            | Error::TopicPoolNotReady { .. }
            | Error::EmptyTopicList
            | Error::LogKafkaTimeout { .. }
            | Error::LogRecordCorrupt { .. }
            | Error::LogEntriesPruned { .. }
            | Error::LogCheckpointAboveEnd { .. }
            | Error::RaftEngineOpen { .. }
            | Error::RaftEngineOp { .. }
            | Error::RaftEngineTask { .. }
            | Error::PruneTopicUnknown { .. }
            | Error::WalPrune { .. }
            | Error::WalPruneTopicsFailed { .. }
            | Error::RegionReplay { .. }
            | Error::LogProduceMismatch { .. }
            | Error::LogRegionNotRegistered { .. }
            | Error::WalFlushBeyondEnd { .. }
            | Error::InvalidTopicNameKey { .. }
            | Error::InvalidTopicRegionKey { .. } => false,
        }
    }
}

crate::error::engine_conversions!(Error);
