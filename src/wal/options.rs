//! [`WalOptions`]: which WAL one region writes to, and its encoding (byte-compatible with GreptimeDB's metasrv).

use serde::{Deserialize, Serialize};
use snafu::ResultExt;

use crate::error::{DecodeWalOptionsSnafu, Result};

/// The key under which the encoded options go into a region's options map (create and open requests).
pub const WAL_OPTIONS_KEY: &str = "wal_options";

/// The WAL of one region.
///
/// Encoded as a JSON object: `{"wal.provider":"raft_engine"}` or
/// `{"wal.provider":"kafka","wal.kafka.topic":"<topic>"}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "wal.provider", rename_all = "snake_case")]
pub enum WalOptions {
    /// The datanode's local raft-engine WAL.
    RaftEngine,
    /// A topic of the shared Kafka pool.
    Kafka(KafkaWalOptions),
}

/// The Kafka part of [`WalOptions`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KafkaWalOptions {
    /// The topic the region writes to.
    #[serde(rename = "wal.kafka.topic")]
    pub topic: String,
}

impl WalOptions {
    /// Options pointing at a Kafka topic.
    pub fn kafka(topic: impl Into<String>) -> Self {
        WalOptions::Kafka(KafkaWalOptions {
            topic: topic.into(),
        })
    }

    /// The provider's name as encoded: `raft_engine` or `kafka`.
    pub fn provider(&self) -> &'static str {
        match self {
            WalOptions::RaftEngine => "raft_engine",
            WalOptions::Kafka(_) => "kafka",
        }
    }

    /// The encoded string.
    pub fn encode(&self) -> String {
        match self {
            WalOptions::RaftEngine => r#"{"wal.provider":"raft_engine"}"#.to_string(),
            WalOptions::Kafka(k) => {
                // serde_json escapes the topic exactly as a JSON string requires; a String always serialises.
                let topic = serde_json::Value::String(k.topic.clone());
                format!(r#"{{"wal.provider":"kafka","wal.kafka.topic":{topic}}}"#)
            }
        }
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
        assert_eq!(
            serde_json::to_string(&WalOptions::RaftEngine).unwrap(),
            WalOptions::RaftEngine.encode()
        );
    }

    #[test]
    fn kafka_encodes_byte_for_byte() {
        let o = WalOptions::kafka("greptimedb_wal_topic_7");
        assert_eq!(
            o.encode(),
            r#"{"wal.provider":"kafka","wal.kafka.topic":"greptimedb_wal_topic_7"}"#
        );
        assert_eq!(serde_json::to_string(&o).unwrap(), o.encode());
    }

    #[test]
    fn decode_round_trips() {
        for o in [WalOptions::RaftEngine, WalOptions::kafka("t_0")] {
            assert_eq!(WalOptions::decode(&o.encode()).unwrap(), o);
        }
    }

    #[test]
    fn unknown_provider_is_an_error_quoting_the_input() {
        let bad = r#"{"wal.provider":"noop"}"#;
        let err = WalOptions::decode(bad).unwrap_err().to_string();
        assert!(err.contains(bad), "{err}");
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
