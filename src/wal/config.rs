//! [`WalConfig`]: which WAL new regions get, and for Kafka the shape of the topic pool and how to talk to the
//! brokers. TOML-friendly: durations are humantime strings (`"30s"`, `"500ms"`), unknown keys are errors.
//!
//! ```toml
//! [wal]
//! provider = "kafka"
//! broker_endpoints = ["127.0.0.1:9092"]
//! num_topics = 64
//! topic_name_prefix = "greptimedb_wal_topic"
//! create_topic_timeout = "30s"
//! prune_interval = "10m"  # walctl serve prunes every topic this often; "0s" = off
//!
//! [wal.backoff]
//! init = "500ms"
//! deadline = "5m"
//!
//! [wal.security]  # optional; see `wal::kafka::security`
//! tls = { ca = "certs/ca.pem" }
//! sasl = { mechanism = "SCRAM-SHA-512", username = "walctl", password_file = "secrets/kafka-password" }
//! ```

use std::fmt;
use std::sync::OnceLock;
use std::time::Duration;

use serde::de::value::MapAccessDeserializer;
use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use snafu::{ResultExt, ensure};

use crate::wal::error::Result;
use crate::wal::error::{InvalidTopicNameSnafu, InvalidWalConfigSnafu, ParseWalConfigSnafu};
use crate::wal::kafka::security::KafkaSecurityConfig;

/// The longest topic name Kafka accepts.
pub const MAX_TOPIC_NAME_LEN: usize = 249;

/// The most topics a pool may have. Every topic is at least one Kafka partition, and Kafka clusters are sized for
/// partitions in the hundreds of thousands in total; the pool's names are also listed in memory by the bootstrap,
/// the allocator and `walctl topics`. A larger value is a typo, rejected instead of exhausting memory.
pub const MAX_NUM_TOPICS: usize = 100_000;

/// Which WAL new regions write to.
///
/// In TOML, a table with `provider = "raft_engine"` or `provider = "kafka"` and, for Kafka, the keys of
/// [`KafkaConfig`] next to it. Unknown keys, and Kafka keys under `raft_engine`, are errors naming the key.
///
/// Deserialized straight into [`KafkaConfig`]'s derived impl, with only the `provider` key taken out on the way:
/// a key added to [`KafkaConfig`] needs no edit here, and the TOML parser's errors keep pointing at the key and
/// line (a serde-tagged enum would buffer the table and lose both).
#[derive(Clone, Debug, Default, PartialEq)]
pub enum WalConfig {
    /// Each datanode's local raft-engine WAL.
    #[default]
    RaftEngine,
    /// A shared pool of Kafka topics.
    Kafka(KafkaConfig),
}

impl WalConfig {
    /// Parses a TOML document holding the WAL table's keys (`provider = "kafka"` …) at its top level.
    pub fn from_toml_str(toml: &str) -> Result<Self> {
        toml::from_str(toml).context(ParseWalConfigSnafu)
    }

    /// Checks every value; the error names the first bad field and its value.
    pub fn validate(&self) -> Result<()> {
        match self {
            WalConfig::RaftEngine => Ok(()),
            WalConfig::Kafka(kafka) => kafka.validate(),
        }
    }
}

/// The provider names of [`WalConfig`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Provider {
    RaftEngine,
    Kafka,
}

/// The key naming the provider in the WAL table.
const PROVIDER_KEY: &str = "provider";

/// Every key the WAL table accepts: `provider`, then [`KafkaConfig`]'s fields in declaration order.
fn wal_keys() -> &'static [&'static str] {
    static KEYS: OnceLock<Vec<&'static str>> = OnceLock::new();
    KEYS.get_or_init(|| {
        let mut keys = vec![PROVIDER_KEY];
        keys.extend_from_slice(field_names::<KafkaConfig>());
        keys
    })
}

/// The field names the derived `Deserialize` of `T` asks its deserializer for (what serde's `unknown field` error
/// lists), read by handing it a deserializer that records them and fails.
fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    struct Recorder<'a>(&'a mut &'static [&'static str]);

    impl<'de> de::Deserializer<'de> for Recorder<'_> {
        type Error = de::value::Error;

        fn deserialize_any<V: Visitor<'de>>(
            self,
            _: V,
        ) -> std::result::Result<V::Value, Self::Error> {
            Err(de::Error::custom("only a struct's field names are read"))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> std::result::Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("field names recorded"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
            unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }

    let mut fields: &'static [&'static str] = &[];
    // The recorder always fails, by design: only what it recorded is of use.
    let _ = T::deserialize(Recorder(&mut fields));
    fields
}

impl<'de> Deserialize<'de> for WalConfig {
    fn deserialize<D: de::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        deserializer.deserialize_struct("WalConfig", wal_keys(), WalVisitor)
    }
}

/// Reads the WAL table: the derived [`KafkaConfig`] impl reads every key but `provider`, which
/// [`WithoutProvider`] takes out.
struct WalVisitor;

impl<'de> Visitor<'de> for WalVisitor {
    type Value = WalConfig;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a WAL table with provider = \"raft_engine\" or provider = \"kafka\"")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> std::result::Result<WalConfig, A::Error> {
        let mut table = WithoutProvider {
            map,
            provider: None,
            first_kafka_key: None,
        };
        let kafka = KafkaConfig::deserialize(MapAccessDeserializer::new(&mut table))?;
        match table.provider {
            None => Err(de::Error::missing_field(PROVIDER_KEY)),
            Some(Provider::Kafka) => Ok(WalConfig::Kafka(kafka)),
            Some(Provider::RaftEngine) => match table.first_kafka_key {
                None => Ok(WalConfig::RaftEngine),
                Some(key) => Err(de::Error::custom(format!(
                    "key `{key}` applies only to provider = \"kafka\", not \"raft_engine\""
                ))),
            },
        }
    }
}

/// The WAL table's entries without `provider`, whose value it keeps. Keys are checked against [`wal_keys`] as
/// they are read, so an unknown key fails at the key (its position and path) listing every accepted key.
struct WithoutProvider<A> {
    map: A,
    provider: Option<Provider>,
    first_kafka_key: Option<String>,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for WithoutProvider<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> std::result::Result<Option<K::Value>, A::Error> {
        loop {
            let Some(key) = self.map.next_key_seed(KnownWalKey)? else {
                return Ok(None);
            };
            if key == PROVIDER_KEY {
                self.provider = Some(self.map.next_value()?);
                continue;
            }
            self.first_kafka_key.get_or_insert_with(|| key.clone());
            let key: de::value::StringDeserializer<A::Error> = key.into_deserializer();
            return seed.deserialize(key).map(Some);
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> std::result::Result<V::Value, A::Error> {
        self.map.next_value_seed(seed)
    }
}

/// A WAL table key, refused unless it is one of [`wal_keys`].
struct KnownWalKey;

impl<'de> DeserializeSeed<'de> for KnownWalKey {
    type Value = String;

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> std::result::Result<String, D::Error> {
        let key = String::deserialize(deserializer)?;
        if wal_keys().contains(&key.as_str()) {
            Ok(key)
        } else {
            Err(de::Error::unknown_field(&key, wal_keys()))
        }
    }
}

impl Serialize for WalConfig {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        /// `provider` and, for Kafka, the Kafka keys next to it.
        #[derive(Serialize)]
        struct Table<'a> {
            provider: Provider,
            #[serde(flatten)]
            kafka: Option<&'a KafkaConfig>,
        }
        let table = match self {
            WalConfig::RaftEngine => Table {
                provider: Provider::RaftEngine,
                kafka: None,
            },
            WalConfig::Kafka(kafka) => Table {
                provider: Provider::Kafka,
                kafka: Some(kafka),
            },
        };
        table.serialize(serializer)
    }
}

/// How new topics are handed to regions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SelectorType {
    /// Round-robin over the pool.
    #[default]
    RoundRobin,
}

/// The Kafka topic pool and how to reach the brokers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaConfig {
    /// Bootstrap brokers, `host:port` each.
    pub broker_endpoints: Vec<String>,
    /// Topics in the pool.
    pub num_topics: usize,
    /// Topic `i` is named `{topic_name_prefix}_{i}`.
    pub topic_name_prefix: String,
    /// Partitions per topic.
    pub num_partitions: i32,
    /// Replicas per partition; at most the number of live brokers.
    pub replication_factor: i16,
    /// How long the broker may take to create one topic (sent to Kafka as the request's timeout).
    #[serde(with = "humantime_serde")]
    pub create_topic_timeout: Duration,
    /// How topics are handed to regions.
    pub selector_type: SelectorType,
    /// At most this many topic creations in flight at once.
    pub max_concurrent_creates: usize,
    /// At most this many topics in one CreateTopics request (1–10,000).
    pub create_batch_size: usize,
    /// Topic-level Kafka configs every pool topic is created with (`"retention.ms" = "604800000"`), names as Kafka
    /// spells them, values as strings. Applied only at creation: an existing topic whose configs differ is reported
    /// (`walctl bootstrap`, `walctl topics`), never changed.
    #[serde(skip_serializing_if = "TopicConfig::is_empty")]
    pub topic_config: TopicConfig,
    /// How a WAL prune drops a topic's old entries: `"delete_records"` (Kafka's DeleteRecords, then the stored
    /// watermark) or `"logical"` (only the stored watermark; for brokers without DeleteRecords).
    pub prune_mode: crate::wal::prune::PruneMode,
    /// How often `walctl serve`'s leader prunes every topic of the pool by itself (`"10m"` by default); `"0s"`
    /// turns the periodic prune off (`walctl wal prune` still prunes on demand). Otherwise between
    /// [`MIN_PRUNE_INTERVAL`] and [`MAX_PRUNE_INTERVAL`].
    #[serde(with = "humantime_serde")]
    pub prune_interval: Duration,
    /// TLS and SASL of every Kafka connection (`[wal.security]`); none by default. A sub-table, so after the plain
    /// keys (TOML writes plain keys before sub-tables). Boxed: a WAL config without security stays small.
    #[serde(skip_serializing_if = "no_security")]
    pub security: Box<KafkaSecurityConfig>,
    /// Retries of connection and controller errors. Last: TOML writes plain keys before sub-tables, and the
    /// order of the fields is the order an unknown-key error lists them in.
    pub backoff: BackoffConfig,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            broker_endpoints: vec!["127.0.0.1:9092".to_string()],
            num_topics: 64,
            topic_name_prefix: "greptimedb_wal_topic".to_string(),
            num_partitions: 1,
            replication_factor: 1,
            create_topic_timeout: Duration::from_secs(30),
            selector_type: SelectorType::RoundRobin,
            backoff: BackoffConfig::default(),
            max_concurrent_creates: 16,
            create_batch_size: DEFAULT_CREATE_BATCH_SIZE,
            topic_config: TopicConfig::new(),
            prune_mode: crate::wal::prune::PruneMode::default(),
            prune_interval: DEFAULT_PRUNE_INTERVAL,
            security: Box::default(),
        }
    }
}

/// Whether `[wal.security]` is empty (then it is not written out).
fn no_security(security: &KafkaSecurityConfig) -> bool {
    security.is_empty()
}

/// The default `[wal] prune_interval`.
pub const DEFAULT_PRUNE_INTERVAL: Duration = Duration::from_secs(10 * 60);
/// The shortest `[wal] prune_interval` besides `0s` (off).
pub const MIN_PRUNE_INTERVAL: Duration = Duration::from_secs(1);
/// The longest `[wal] prune_interval`.
pub const MAX_PRUNE_INTERVAL: Duration = Duration::from_secs(7 * 24 * 3600);

/// Topic-level Kafka configs by name (`retention.ms` → `604800000`).
pub type TopicConfig = std::collections::BTreeMap<String, String>;

/// The longest topic config name accepted (Kafka's own are under 60 characters).
pub const MAX_TOPIC_CONFIG_NAME_LEN: usize = 255;
/// The longest topic config value accepted.
pub const MAX_TOPIC_CONFIG_VALUE_LEN: usize = 32 * 1024;

/// Checks one `[wal] topic_config` entry: the name is Kafka's shape of a config name — lowercase words of ASCII
/// letters and digits joined by single dots (`retention.ms`, `cleanup.policy`), at most
/// [`MAX_TOPIC_CONFIG_NAME_LEN`] characters; the value has no control character and at most
/// [`MAX_TOPIC_CONFIG_VALUE_LEN`] bytes. Whether the broker knows the name and accepts the value is the broker's
/// answer at creation (an error naming the topic and the broker's message).
pub fn validate_topic_config_entry(name: &str, value: &str) -> Result<()> {
    let field = format!("topic_config.\"{name}\"");
    let bad = |reason: String| {
        InvalidWalConfigSnafu {
            field: field.clone(),
            value: value.to_string(),
            reason,
        }
        .fail()
    };
    if name.is_empty() {
        return bad("the config name is empty".to_string());
    }
    if name.len() > MAX_TOPIC_CONFIG_NAME_LEN {
        return bad(format!(
            "the config name has {} characters; at most {MAX_TOPIC_CONFIG_NAME_LEN}",
            name.len()
        ));
    }
    let well_formed = name.split('.').all(|word| {
        !word.is_empty()
            && word
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    });
    if !well_formed {
        return bad(
            "not a Kafka topic config name: lowercase words of [a-z0-9] joined by single dots, like \
             'retention.ms'"
                .to_string(),
        );
    }
    if value.len() > MAX_TOPIC_CONFIG_VALUE_LEN {
        return bad(format!(
            "the value has {} bytes; at most {MAX_TOPIC_CONFIG_VALUE_LEN}",
            value.len()
        ));
    }
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        // Quoted and escaped, so the message stays on one line.
        return InvalidWalConfigSnafu {
            field,
            value: format!("{value:?}"),
            reason: format!("the value contains the control character {c:?}"),
        }
        .fail();
    }
    Ok(())
}

/// The topic config that bounds a record batch: the log store fragments entries below it.
pub const MAX_MESSAGE_BYTES: &str = "max.message.bytes";

/// The smallest `max.message.bytes` accepted in `[wal] topic_config`: every record of the WAL carries a 30-byte
/// header and its region id besides the entry's bytes, and the log store leaves 256 bytes of each batch to Kafka's
/// framing.
pub const MIN_MAX_MESSAGE_BYTES: usize = 1024;

/// Checks `[wal] topic_config."max.message.bytes"` when set: a whole number of bytes from
/// [`MIN_MAX_MESSAGE_BYTES`] to `i32::MAX` (Kafka's type for it). Returns the value, `None` when not set.
pub fn configured_max_message_bytes(topic_config: &TopicConfig) -> Result<Option<usize>> {
    let Some(value) = topic_config.get(MAX_MESSAGE_BYTES) else {
        return Ok(None);
    };
    let parsed = value
        .parse::<i32>()
        .ok()
        .and_then(|v| usize::try_from(v).ok())
        .filter(|v| *v >= MIN_MAX_MESSAGE_BYTES);
    match parsed {
        Some(bytes) => Ok(Some(bytes)),
        None => InvalidWalConfigSnafu {
            field: format!("topic_config.\"{MAX_MESSAGE_BYTES}\""),
            value: value.clone(),
            reason: format!(
                "must be a whole number of bytes from {MIN_MAX_MESSAGE_BYTES} to {} (the WAL fragments entries \
                 below it; each record needs room for its header, key and Kafka's framing)",
                i32::MAX
            ),
        }
        .fail(),
    }
}

/// The default of `[wal] create_batch_size`: topics in one CreateTopics request. As many as a pool may be asked
/// for in one request: the broker lists what one request created far sooner than the same topics created by
/// several requests (4,096 topics: listed 1.4–1.5 s after the call in one request, 4–12 s in five of 1,000;
/// `docs/remote-wal.md`, "Against the AdminClient").
pub const DEFAULT_CREATE_BATCH_SIZE: usize = MAX_CREATE_BATCH_SIZE;
/// The largest accepted `[wal] create_batch_size`.
pub const MAX_CREATE_BATCH_SIZE: usize = 10_000;

/// Exponential backoff between retries of a failing Kafka call, bounded by a deadline.
///
/// The deadline is what stops a client from retrying forever against a broker that is down.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BackoffConfig {
    /// The first wait.
    #[serde(with = "humantime_serde")]
    pub init: Duration,
    /// The longest wait.
    #[serde(with = "humantime_serde")]
    pub max: Duration,
    /// Each wait is about this many times the previous one (> 1).
    #[serde(alias = "multiplier")]
    pub base: f64,
    /// Give up once retries have taken this long.
    #[serde(with = "humantime_serde")]
    pub deadline: Duration,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            init: Duration::from_millis(500),
            max: Duration::from_secs(10),
            base: 2.0,
            deadline: Duration::from_secs(5 * 60),
        }
    }
}

impl KafkaConfig {
    /// The name of topic `i` of the pool: `{topic_name_prefix}_{i}`.
    pub fn topic_name(&self, i: usize) -> String {
        format!("{}_{}", self.topic_name_prefix, i)
    }

    /// The names of the whole pool, topic 0 first.
    pub fn topic_names(&self) -> Vec<String> {
        (0..self.num_topics).map(|i| self.topic_name(i)).collect()
    }

    /// Checks every value; the error names the first bad field and its value.
    pub fn validate(&self) -> Result<()> {
        ensure!(
            !self.broker_endpoints.is_empty(),
            InvalidWalConfigSnafu {
                field: "broker_endpoints",
                value: "[]",
                reason: "at least one broker endpoint is needed",
            }
        );
        for endpoint in &self.broker_endpoints {
            ensure!(
                !endpoint.trim().is_empty(),
                InvalidWalConfigSnafu {
                    field: "broker_endpoints",
                    value: format!("{:?}", self.broker_endpoints),
                    reason: "an endpoint is empty",
                }
            );
            // What the brokers are dialled with (`host:port`, `[v6]:port`); anything else fails on every retry.
            let well_formed = endpoint
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            ensure!(
                well_formed,
                InvalidWalConfigSnafu {
                    field: "broker_endpoints",
                    value: format!("{:?}", self.broker_endpoints),
                    reason: format!("endpoint '{endpoint}' is not host:port"),
                }
            );
        }
        ensure!(
            self.num_topics > 0,
            InvalidWalConfigSnafu {
                field: "num_topics",
                value: "0",
                reason: "the pool needs at least one topic",
            }
        );
        ensure!(
            self.num_topics <= MAX_NUM_TOPICS,
            InvalidWalConfigSnafu {
                field: "num_topics",
                value: self.num_topics.to_string(),
                reason: format!("a pool has at most {MAX_NUM_TOPICS} topics"),
            }
        );
        ensure!(
            self.prune_interval.is_zero()
                || (MIN_PRUNE_INTERVAL..=MAX_PRUNE_INTERVAL).contains(&self.prune_interval),
            InvalidWalConfigSnafu {
                field: "prune_interval",
                value: format!("{:?}", self.prune_interval),
                reason: "must be 0s (off) or within 1s and 7days",
            }
        );
        self.validate_prefix()?;
        let longest = self.topic_name(self.num_topics - 1);
        ensure!(
            longest.len() <= MAX_TOPIC_NAME_LEN,
            InvalidWalConfigSnafu {
                field: "topic_name_prefix",
                value: self.topic_name_prefix.clone(),
                reason: format!(
                    "the generated name '{longest}' has {} characters; Kafka allows at most {MAX_TOPIC_NAME_LEN}",
                    longest.len()
                ),
            }
        );
        ensure!(
            self.num_partitions >= 1,
            InvalidWalConfigSnafu {
                field: "num_partitions",
                value: self.num_partitions.to_string(),
                reason: "must be at least 1",
            }
        );
        ensure!(
            self.replication_factor >= 1,
            InvalidWalConfigSnafu {
                field: "replication_factor",
                value: self.replication_factor.to_string(),
                reason: "must be at least 1",
            }
        );
        ensure!(
            !self.create_topic_timeout.is_zero(),
            InvalidWalConfigSnafu {
                field: "create_topic_timeout",
                value: "0s",
                reason: "must be positive",
            }
        );
        ensure!(
            i32::try_from(self.create_topic_timeout.as_millis()).is_ok(),
            InvalidWalConfigSnafu {
                field: "create_topic_timeout",
                value: humantime_serde::re::humantime::format_duration(self.create_topic_timeout)
                    .to_string(),
                reason: "Kafka takes the timeout as i32 milliseconds (at most about 24 days)",
            }
        );
        ensure!(
            self.max_concurrent_creates > 0,
            InvalidWalConfigSnafu {
                field: "max_concurrent_creates",
                value: "0",
                reason: "must be at least 1",
            }
        );
        ensure!(
            (1..=MAX_CREATE_BATCH_SIZE).contains(&self.create_batch_size),
            InvalidWalConfigSnafu {
                field: "create_batch_size",
                value: self.create_batch_size.to_string(),
                reason: format!("must be between 1 and {MAX_CREATE_BATCH_SIZE}"),
            }
        );
        for (name, value) in &self.topic_config {
            validate_topic_config_entry(name, value)?;
        }
        configured_max_message_bytes(&self.topic_config)?;
        self.security.validate()?;
        self.backoff.validate()
    }

    fn validate_prefix(&self) -> Result<()> {
        let prefix = &self.topic_name_prefix;
        let bad = |reason: &str| {
            InvalidWalConfigSnafu {
                field: "topic_name_prefix",
                value: prefix.clone(),
                reason: reason.to_string(),
            }
            .fail()
        };
        if prefix.is_empty() {
            return bad("must not be empty");
        }
        if prefix.starts_with("__") {
            return bad("names starting with '__' are Kafka's internal namespace");
        }
        if prefix.contains('.') {
            return bad(
                "must not contain '.': generated names join with '_', and Kafka treats '.' and '_' as the same \
                 character in metric names, so names mixing them collide",
            );
        }
        if let Some(c) = prefix.chars().find(|c| !is_legal_topic_char(*c)) {
            return bad(&format!(
                "character {c:?} is not allowed; use only [a-zA-Z0-9._-]"
            ));
        }
        Ok(())
    }
}

impl BackoffConfig {
    /// Checks every value; the error names the first bad field and its value.
    pub fn validate(&self) -> Result<()> {
        for (field, value) in [
            ("backoff.init", self.init),
            ("backoff.max", self.max),
            ("backoff.deadline", self.deadline),
        ] {
            ensure!(
                !value.is_zero(),
                InvalidWalConfigSnafu {
                    field,
                    value: "0s",
                    reason: "must be positive",
                }
            );
            // rskafka keeps these as f64 seconds and converts back, which panics beyond Duration's range.
            ensure!(
                Duration::try_from_secs_f64(value.as_secs_f64()).is_ok(),
                InvalidWalConfigSnafu {
                    field,
                    value: humantime_serde::re::humantime::format_duration(value).to_string(),
                    reason: "too large",
                }
            );
        }
        ensure!(
            self.max >= self.init,
            InvalidWalConfigSnafu {
                field: "backoff.max",
                value: humantime_serde::re::humantime::format_duration(self.max).to_string(),
                reason: format!(
                    "must be at least backoff.init ({})",
                    humantime_serde::re::humantime::format_duration(self.init)
                ),
            }
        );
        // rskafka draws each wait from `init..previous * base` (in f64 seconds, `previous` at most `max`), a range
        // that must be neither empty nor unbounded.
        let init = self.init.as_secs_f64();
        ensure!(
            self.base.is_finite()
                && init * self.base > init
                && (self.max.as_secs_f64() * self.base).is_finite(),
            InvalidWalConfigSnafu {
                field: "backoff.base",
                value: self.base.to_string(),
                reason: "must be a finite number above 1 (and backoff.max × base finite)",
            }
        );
        Ok(())
    }
}

fn is_legal_topic_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-'
}

/// Checks a topic name as Kafka would: 1 to 249 characters of `[a-zA-Z0-9._-]`, not `.` or `..`.
///
/// The error names the topic. Called before anything is sent to a broker.
pub fn validate_topic_name(name: &str) -> Result<()> {
    let bad = |reason: String| {
        InvalidTopicNameSnafu {
            topic: name.to_string(),
            reason,
        }
        .fail()
    };
    if name.is_empty() {
        return bad("must not be empty".to_string());
    }
    if name == "." || name == ".." {
        return bad("'.' and '..' are not allowed".to_string());
    }
    if name.len() > MAX_TOPIC_NAME_LEN {
        return bad(format!(
            "{} characters; Kafka allows at most {MAX_TOPIC_NAME_LEN}",
            name.len()
        ));
    }
    if let Some(c) = name.chars().find(|c| !is_legal_topic_char(*c)) {
        return bad(format!(
            "character {c:?} is not allowed; use only [a-zA-Z0-9._-]"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kafka() -> KafkaConfig {
        KafkaConfig::default()
    }

    /// Asserts `config` fails validation with an error naming `field` and `value`.
    fn assert_rejected(config: &KafkaConfig, field: &str, value: &str) -> String {
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains(field), "error should name {field}: {err}");
        assert!(err.contains(value), "error should name {value:?}: {err}");
        err
    }

    #[test]
    fn defaults_match_the_reference() {
        let c = kafka();
        assert_eq!(c.num_topics, 64);
        assert_eq!(c.topic_name_prefix, "greptimedb_wal_topic");
        assert_eq!(c.num_partitions, 1);
        assert_eq!(c.replication_factor, 1);
        assert_eq!(c.create_topic_timeout, Duration::from_secs(30));
        assert_eq!(c.selector_type, SelectorType::RoundRobin);
        assert_eq!(c.max_concurrent_creates, 16);
        assert_eq!(c.backoff.init, Duration::from_millis(500));
        assert_eq!(c.backoff.max, Duration::from_secs(10));
        assert_eq!(c.backoff.base, 2.0);
        assert_eq!(c.backoff.deadline, Duration::from_secs(300));
        c.validate().unwrap();
        assert_eq!(WalConfig::default(), WalConfig::RaftEngine);
    }

    #[test]
    fn topic_names_are_prefix_underscore_index() {
        let c = KafkaConfig {
            num_topics: 3,
            topic_name_prefix: "wal".to_string(),
            ..kafka()
        };
        assert_eq!(c.topic_name(7), "wal_7");
        assert_eq!(c.topic_names(), vec!["wal_0", "wal_1", "wal_2"]);
    }

    #[test]
    fn kafka_toml_with_only_the_provider_gets_every_default() {
        let parsed = WalConfig::from_toml_str(r#"provider = "kafka""#).unwrap();
        assert_eq!(parsed, WalConfig::Kafka(kafka()));
        let parsed = WalConfig::from_toml_str(r#"provider = "raft_engine""#).unwrap();
        assert_eq!(parsed, WalConfig::RaftEngine);
    }

    #[test]
    fn toml_round_trips() {
        let defaults = WalConfig::Kafka(kafka());
        let text = toml::to_string(&defaults).unwrap();
        assert!(text.contains(r#"create_topic_timeout = "30s""#), "{text}");
        assert!(text.contains(r#"selector_type = "round_robin""#), "{text}");
        assert_eq!(WalConfig::from_toml_str(&text).unwrap(), defaults);

        let custom = WalConfig::Kafka(KafkaConfig {
            broker_endpoints: vec!["a:9092".to_string(), "b:9093".to_string()],
            num_topics: 5,
            topic_name_prefix: "p-x".to_string(),
            num_partitions: 2,
            replication_factor: 3,
            create_topic_timeout: Duration::from_millis(1500),
            selector_type: SelectorType::RoundRobin,
            backoff: BackoffConfig {
                init: Duration::from_millis(10),
                max: Duration::from_secs(1),
                base: 1.5,
                deadline: Duration::from_secs(7),
            },
            max_concurrent_creates: 4,
            create_batch_size: 7,
            prune_mode: crate::wal::prune::PruneMode::Logical,
            prune_interval: Duration::from_secs(30),
            topic_config: [
                ("retention.ms", "604800000"),
                ("segment.bytes", "268435456"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            security: Box::new(KafkaSecurityConfig {
                tls: Some(crate::wal::kafka::security::TlsFiles {
                    ca: "ca.pem".into(),
                    cert: Some("client.pem".into()),
                    key: Some("client.key".into()),
                }),
                sasl: Some(crate::wal::kafka::security::SaslSettings {
                    mechanism: crate::wal::kafka::security::SaslMechanism::ScramSha256,
                    username: "walctl".to_string(),
                    password_file: "kafka-password".into(),
                }),
            }),
        });
        let text = toml::to_string(&custom).unwrap();
        assert!(text.contains("SCRAM-SHA-256"), "{text}");
        assert_eq!(WalConfig::from_toml_str(&text).unwrap(), custom);
        let text = toml::to_string(&WalConfig::RaftEngine).unwrap();
        assert_eq!(
            WalConfig::from_toml_str(&text).unwrap(),
            WalConfig::RaftEngine
        );
    }

    #[test]
    fn hand_written_toml_parses_durations_and_the_multiplier_alias() {
        let parsed = WalConfig::from_toml_str(
            r#"
            provider = "kafka"
            broker_endpoints = ["k1:9092"]
            create_topic_timeout = "2s"
            [backoff]
            init = "100ms"
            multiplier = 3
            deadline = "1m"
            "#,
        )
        .unwrap();
        let WalConfig::Kafka(k) = parsed else {
            panic!("expected kafka: {parsed:?}")
        };
        assert_eq!(k.broker_endpoints, vec!["k1:9092"]);
        assert_eq!(k.create_topic_timeout, Duration::from_secs(2));
        assert_eq!(k.backoff.init, Duration::from_millis(100));
        assert_eq!(k.backoff.base, 3.0);
        assert_eq!(k.backoff.deadline, Duration::from_secs(60));
        assert_eq!(k.backoff.max, Duration::from_secs(10));
    }

    #[test]
    fn unknown_keys_are_errors_naming_the_key() {
        for (toml, key) in [
            ("provider = \"kafka\"\nnum_topicz = 3", "num_topicz"),
            ("provider = \"kafka\"\n[backoff]\nfoo = \"1s\"", "foo"),
            ("provider = \"raft_engine\"\nbar = 1", "bar"),
            ("provider = \"raft_engine\"\nnum_topics = 1", "num_topics"),
        ] {
            let err = WalConfig::from_toml_str(toml).unwrap_err().to_string();
            assert!(err.contains(key), "error should name {key}: {err}");
        }
    }

    #[test]
    fn wal_keys_are_provider_then_every_kafka_field_in_order() {
        // Read from KafkaConfig's derived impl: a field added there is accepted with no other edit.
        // An empty `topic_config` or `security` is not written: set them.
        let config = KafkaConfig {
            topic_config: [("retention.ms".to_string(), "1".to_string())].into(),
            security: Box::new(KafkaSecurityConfig {
                tls: Some(crate::wal::kafka::security::TlsFiles {
                    ca: "ca.pem".into(),
                    cert: None,
                    key: None,
                }),
                sasl: None,
            }),
            ..KafkaConfig::default()
        };
        let written: Vec<String> = toml::Table::try_from(config)
            .unwrap()
            .keys()
            .cloned()
            .collect();
        let mut expected = vec!["provider".to_string()];
        expected.extend(written.iter().cloned());
        let mut keys: Vec<String> = wal_keys().iter().map(|k| k.to_string()).collect();
        assert_eq!(keys.len(), expected.len());
        keys[1..].sort();
        expected[1..].sort();
        assert_eq!(keys, expected);
        assert_eq!(wal_keys().last(), Some(&"backoff"));
    }

    #[test]
    fn unknown_provider_is_an_error_naming_it() {
        let err = WalConfig::from_toml_str(r#"provider = "noop""#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("noop"), "{err}");
    }

    #[test]
    fn bad_duration_is_an_error() {
        let err = WalConfig::from_toml_str("provider = \"kafka\"\ncreate_topic_timeout = \"soon\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("create_topic_timeout"), "{err}");
    }

    #[test]
    fn rejects_zero_topics() {
        let c = KafkaConfig {
            num_topics: 0,
            ..kafka()
        };
        assert_rejected(&c, "num_topics", "0");
    }

    #[test]
    fn rejects_a_pool_too_large_to_hold_in_memory() {
        // Every layer lists the pool's names in memory: a typo such as 10^12 topics must be a config error, not an
        // allocation failure that aborts the process.
        let c = KafkaConfig {
            num_topics: 1_000_000_000_000,
            ..kafka()
        };
        assert_rejected(&c, "num_topics", "1000000000000");
    }

    #[test]
    fn rejects_empty_prefix() {
        let c = KafkaConfig {
            topic_name_prefix: String::new(),
            ..kafka()
        };
        assert_rejected(&c, "topic_name_prefix", "empty");
    }

    #[test]
    fn rejects_illegal_prefix_characters() {
        for prefix in ["wal topic", "wal/topic", "wal:1", "wäl"] {
            let c = KafkaConfig {
                topic_name_prefix: prefix.to_string(),
                ..kafka()
            };
            assert_rejected(&c, "topic_name_prefix", prefix);
        }
    }

    #[test]
    fn rejects_internal_namespace_prefix() {
        let c = KafkaConfig {
            topic_name_prefix: "__wal".to_string(),
            ..kafka()
        };
        let err = assert_rejected(&c, "topic_name_prefix", "__wal");
        assert!(err.contains("internal"), "{err}");
    }

    #[test]
    fn rejects_dot_in_prefix_because_it_collides_with_underscore() {
        let c = KafkaConfig {
            topic_name_prefix: "greptimedb.wal".to_string(),
            ..kafka()
        };
        let err = assert_rejected(&c, "topic_name_prefix", "greptimedb.wal");
        assert!(err.contains("collide"), "{err}");
    }

    #[test]
    fn rejects_generated_names_over_249_characters() {
        // 246 + "_" + "99" = 249: the longest name fits exactly.
        let c = KafkaConfig {
            topic_name_prefix: "a".repeat(246),
            num_topics: 100,
            ..kafka()
        };
        c.validate().unwrap();
        // One more topic makes the last name "_100": 250 characters.
        let c = KafkaConfig {
            num_topics: 101,
            ..c
        };
        let err = assert_rejected(&c, "topic_name_prefix", "_100");
        assert!(err.contains("250"), "{err}");
    }

    #[test]
    fn rejects_replication_factor_below_one() {
        for rf in [0, -1] {
            let c = KafkaConfig {
                replication_factor: rf,
                ..kafka()
            };
            assert_rejected(&c, "replication_factor", &rf.to_string());
        }
    }

    #[test]
    fn rejects_partitions_below_one() {
        let c = KafkaConfig {
            num_partitions: 0,
            ..kafka()
        };
        assert_rejected(&c, "num_partitions", "0");
    }

    #[test]
    fn rejects_empty_broker_list_and_empty_endpoint() {
        let c = KafkaConfig {
            broker_endpoints: vec![],
            ..kafka()
        };
        assert_rejected(&c, "broker_endpoints", "[]");
        let c = KafkaConfig {
            broker_endpoints: vec!["k:9092".to_string(), " ".to_string()],
            ..kafka()
        };
        assert_rejected(&c, "broker_endpoints", "k:9092");
    }

    #[test]
    fn rejects_endpoints_that_are_not_host_colon_port() {
        // Without a port, connecting fails the same way on every retry: it must be a config error now, not an error
        // after every backoff deadline and step retry have run out.
        for bad in ["localhost", "localhost:", "localhost:x", ":9092", "k:99999"] {
            let c = KafkaConfig {
                broker_endpoints: vec!["k:9092".to_string(), bad.to_string()],
                ..kafka()
            };
            let err = assert_rejected(&c, "broker_endpoints", bad);
            assert!(err.contains("host:port"), "{err}");
        }
        let c = KafkaConfig {
            broker_endpoints: vec![
                "127.0.0.1:9092".to_string(),
                "[::1]:9092".to_string(),
                "kafka-0.kafka.svc:19092".to_string(),
            ],
            ..kafka()
        };
        c.validate().unwrap();
    }

    #[test]
    fn rejects_zero_durations() {
        let c = KafkaConfig {
            create_topic_timeout: Duration::ZERO,
            ..kafka()
        };
        assert_rejected(&c, "create_topic_timeout", "0s");
        for field in ["init", "max", "deadline"] {
            let mut c = kafka();
            match field {
                "init" => c.backoff.init = Duration::ZERO,
                "max" => c.backoff.max = Duration::ZERO,
                _ => c.backoff.deadline = Duration::ZERO,
            }
            assert_rejected(&c, &format!("backoff.{field}"), "0s");
        }
    }

    #[test]
    fn rejects_create_timeout_beyond_i32_millis() {
        let c = KafkaConfig {
            create_topic_timeout: Duration::from_secs(30 * 24 * 3600),
            ..kafka()
        };
        assert_rejected(&c, "create_topic_timeout", "30days");
    }

    #[test]
    fn rejects_backoff_max_below_init_and_bad_base() {
        let mut c = kafka();
        c.backoff.max = Duration::from_millis(100);
        assert_rejected(&c, "backoff.max", "100ms");
        let mut c = kafka();
        c.backoff.base = 0.5;
        assert_rejected(&c, "backoff.base", "0.5");
        c.backoff.base = f64::NAN;
        assert_rejected(&c, "backoff.base", "NaN");
    }

    #[test]
    fn rejects_a_base_that_leaves_rskafka_no_backoff_range() {
        // rskafka draws each wait from `init..previous * base`: with base 1 that range is empty and it panics on
        // the first retry.
        let mut c = kafka();
        c.backoff.base = 1.0;
        assert_rejected(&c, "backoff.base", "1");
        c.backoff.base = 1.0 + f64::EPSILON / 4.0;
        assert_rejected(&c, "backoff.base", "backoff.base");
        // ...and panics too when the upper end overflows to infinity (max × base, in f64 seconds).
        c.backoff.base = 1e308;
        c.backoff.max = Duration::from_secs(100);
        assert_rejected(&c, "backoff.base", "1000");
        c.backoff.base = 1.5;
        c.validate().unwrap();
    }

    #[test]
    fn rejects_backoff_durations_rskafka_cannot_hold() {
        // rskafka keeps them as f64 seconds and turns them back into a Duration, which panics near Duration::MAX;
        // the admin also adds a margin to the deadline.
        let huge = Duration::new(u64::MAX, 0);
        let mut c = kafka();
        c.backoff.deadline = huge;
        assert_rejected(&c, "backoff.deadline", "backoff.deadline");
        let mut c = kafka();
        c.backoff.max = huge;
        assert_rejected(&c, "backoff.max", "backoff.max");
        let mut c = kafka();
        c.backoff.max = Duration::from_secs(3600);
        c.backoff.deadline = Duration::from_secs(365 * 24 * 3600);
        c.validate().unwrap();
    }

    #[test]
    fn rejects_zero_concurrent_creates() {
        let c = KafkaConfig {
            max_concurrent_creates: 0,
            ..kafka()
        };
        assert_rejected(&c, "max_concurrent_creates", "0");
    }

    #[test]
    fn wal_config_validate_delegates_to_kafka() {
        WalConfig::RaftEngine.validate().unwrap();
        let bad = WalConfig::Kafka(KafkaConfig {
            num_topics: 0,
            ..kafka()
        });
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("num_topics")
        );
    }

    #[test]
    fn topic_name_validation_names_the_topic() {
        for ok in ["a", "wal_0", "A.b-c_9", &"x".repeat(249)] {
            validate_topic_name(ok).unwrap();
        }
        for bad in ["", ".", "..", "has space", "slash/", "ü", &"x".repeat(250)] {
            let err = validate_topic_name(bad).unwrap_err();
            assert!(
                matches!(err, crate::wal::Error::InvalidTopicName { .. }),
                "{err}"
            );
            if !bad.is_empty() && bad.len() < 50 {
                assert!(err.to_string().contains(bad), "{err}");
            }
        }
    }
}
