//! [`WalOptions`]: which WAL one region writes to, and its encoding (byte-compatible with GreptimeDB's metasrv,
//! the layouts of GreptimeDB 1.2; see `docs/metadata-store.md`).

use serde::{Deserialize, Serialize};
use snafu::ResultExt;

use crate::wal::error::DecodeWalOptionsSnafu;
use crate::wal::error::Result;

/// The key under which the encoded options go into a region's options map (create and open requests).
pub const WAL_OPTIONS_KEY: &str = "wal_options";

/// The WAL of one region.
///
/// Encoded by `serde_json` as a JSON object tagged by `wal.provider`: `{"wal.provider":"raft_engine"}`,
/// `{"wal.provider":"kafka","wal.kafka.topic":"<topic>"}` (GreptimeDB may add
/// `"wal.kafka.initial_pruned_entry_id":N`) or `{"wal.provider":"noop"}`. Fields this crate does not know are
/// ignored when decoding.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "wal.provider", rename_all = "snake_case")]
pub enum WalOptions {
    /// The datanode's local raft-engine WAL.
    RaftEngine,
    /// A topic of the shared Kafka pool.
    Kafka(KafkaWalOptions),
    /// No WAL at all: the region's writes are durable only once flushed (GreptimeDB writes it for tables that skip
    /// the WAL). This crate never allocates it; it decodes it so such regions still open.
    Noop,
}

/// The Kafka part of [`WalOptions`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KafkaWalOptions {
    /// The topic the region writes to.
    #[serde(rename = "wal.kafka.topic")]
    pub topic: String,
    /// GreptimeDB's create-time hint: a new region's flushed entry id starts at this id of the topic. This crate
    /// never sets it; it is kept when read and written back only when present.
    #[serde(
        rename = "wal.kafka.initial_pruned_entry_id",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub initial_pruned_entry_id: Option<u64>,
}

impl WalOptions {
    /// Options pointing at a Kafka topic.
    pub fn kafka(topic: impl Into<String>) -> Self {
        WalOptions::Kafka(KafkaWalOptions {
            topic: topic.into(),
            initial_pruned_entry_id: None,
        })
    }

    /// The provider's name as encoded: `raft_engine`, `kafka` or `noop`.
    pub fn provider(&self) -> &'static str {
        match self {
            WalOptions::RaftEngine => "raft_engine",
            WalOptions::Kafka(_) => "kafka",
            WalOptions::Noop => "noop",
        }
    }

    /// The encoded string, as `serde_json` writes the derived [`Serialize`] (the bytes GreptimeDB writes).
    pub fn encode(&self) -> String {
        // A tagged enum of strings and integers has nothing serde_json can refuse (no non-string map keys, no
        // non-finite floats, no failing writer): serialising cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Decodes an encoded string; an unknown provider or malformed input is an error quoting it.
    pub fn decode(encoded: &str) -> Result<Self> {
        serde_json::from_str(encoded).context(DecodeWalOptionsSnafu {
            encoded: encoded.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raft_engine_encodes_byte_for_byte() {
        assert_eq!(
            WalOptions::RaftEngine.encode(),
            r#"{"wal.provider":"raft_engine"}"#
        );
    }

    #[test]
    fn kafka_encodes_byte_for_byte() {
        let o = WalOptions::kafka("greptimedb_wal_topic_7");
        assert_eq!(
            o.encode(),
            r#"{"wal.provider":"kafka","wal.kafka.topic":"greptimedb_wal_topic_7"}"#
        );
        // The hint, when present, follows the topic as GreptimeDB writes it.
        let hinted = WalOptions::Kafka(KafkaWalOptions {
            topic: "t_1".to_string(),
            initial_pruned_entry_id: Some(42),
        });
        assert_eq!(
            hinted.encode(),
            r#"{"wal.provider":"kafka","wal.kafka.topic":"t_1","wal.kafka.initial_pruned_entry_id":42}"#
        );
    }

    #[test]
    fn noop_encodes_byte_for_byte() {
        assert_eq!(WalOptions::Noop.encode(), r#"{"wal.provider":"noop"}"#);
        assert_eq!(WalOptions::Noop.provider(), "noop");
    }

    #[test]
    fn a_topic_needing_json_escapes_is_escaped() {
        let o = WalOptions::kafka("a\"b\\c");
        assert_eq!(
            o.encode(),
            r#"{"wal.provider":"kafka","wal.kafka.topic":"a\"b\\c"}"#
        );
        assert_eq!(WalOptions::decode(&o.encode()).unwrap(), o);
    }

    #[test]
    fn decode_round_trips() {
        for o in [
            WalOptions::RaftEngine,
            WalOptions::kafka("t_0"),
            WalOptions::Noop,
            WalOptions::Kafka(KafkaWalOptions {
                topic: "t_2".to_string(),
                initial_pruned_entry_id: Some(7),
            }),
        ] {
            assert_eq!(WalOptions::decode(&o.encode()).unwrap(), o);
        }
    }

    #[test]
    fn greptimedb_values_decode() {
        // Byte strings as GreptimeDB's serde_json writes its `WalOptions` (tag first, `wal.kafka.` prefixed fields).
        assert_eq!(
            WalOptions::decode(r#"{"wal.provider":"noop"}"#).unwrap(),
            WalOptions::Noop
        );
        let hinted = WalOptions::decode(
            r#"{"wal.provider":"kafka","wal.kafka.topic":"greptimedb_wal_topic_3","wal.kafka.initial_pruned_entry_id":120}"#,
        )
        .unwrap();
        assert_eq!(
            hinted,
            WalOptions::Kafka(KafkaWalOptions {
                topic: "greptimedb_wal_topic_3".to_string(),
                initial_pruned_entry_id: Some(120),
            })
        );
    }

    #[test]
    fn unknown_fields_are_ignored() {
        assert_eq!(
            WalOptions::decode(
                r#"{"wal.provider":"kafka","wal.kafka.topic":"t","wal.kafka.future":[1]}"#
            )
            .unwrap(),
            WalOptions::kafka("t")
        );
        assert_eq!(
            WalOptions::decode(r#"{"wal.provider":"raft_engine","extra":true}"#).unwrap(),
            WalOptions::RaftEngine
        );
    }

    #[test]
    fn unknown_provider_is_an_error_quoting_the_input() {
        let bad = r#"{"wal.provider":"pulsar"}"#;
        let err = WalOptions::decode(bad).unwrap_err().to_string();
        assert_eq!(
            err,
            "invalid encoded WAL options '{\"wal.provider\":\"pulsar\"}': unknown variant `pulsar`, expected \
             one of `raft_engine`, `kafka`, `noop` at line 1 column 24"
        );
    }

    #[test]
    fn malformed_input_is_an_error_quoting_it() {
        let err = WalOptions::decode("not json").unwrap_err().to_string();
        assert!(err.contains("not json"), "{err}");
        let err = WalOptions::decode(r#"{"wal.provider":"kafka"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("wal.kafka.topic"), "{err}");
    }
}
