//! Persisted topic names: one key per topic of the pool, `__topic_name/kafka/{topic}` → `{"pruned_entry_id":0}`,
//! byte-compatible with GreptimeDB's metasrv.
//!
//! A name is persisted only after the topic was created in Kafka and shows up in its metadata, so every persisted
//! name is a topic that exists. Existing keys are never overwritten: GreptimeDB advances `pruned_entry_id` later.

use serde::{Deserialize, Serialize};

use crate::kv::{Compare, KvBackend, RangeRequest, Txn, TxnOp};
use crate::wal::error::{InvalidTopicNameKeySnafu, Result};

/// The prefix of every persisted topic name key.
pub const TOPIC_NAME_KEY_PREFIX: &str = "__topic_name/kafka/";

/// How many keys one page of a listing reads.
const LIST_PAGE_SIZE: usize = 1024;

/// The key persisting `topic`: `__topic_name/kafka/{topic}`.
pub fn topic_name_key(topic: &str) -> Vec<u8> {
    format!("{TOPIC_NAME_KEY_PREFIX}{topic}").into_bytes()
}

/// The topic named by a persisted key; an error quoting the key when it is not one.
pub fn decode_topic_name_key(key: &[u8]) -> Result<String> {
    let text = std::str::from_utf8(key).map_err(|_| {
        InvalidTopicNameKeySnafu {
            key: String::from_utf8_lossy(key).into_owned(),
            reason: "not UTF-8",
        }
        .build()
    })?;
    match text.strip_prefix(TOPIC_NAME_KEY_PREFIX) {
        Some(topic) if !topic.is_empty() => Ok(topic.to_string()),
        _ => InvalidTopicNameKeySnafu {
            key: text,
            reason: format!("expected '{TOPIC_NAME_KEY_PREFIX}<topic>'"),
        }
        .fail(),
    }
}

/// A Kafka topic id: the UUID the controller gives a topic when it creates it. A topic deleted and created again
/// under the same name gets another one, which is how a pool topic recreated out of band is told from the one its
/// regions wrote to. Written as the UUID's 32 hex digits in 8-4-4-4-12 groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicId(pub u128);

impl std::fmt::Display for TopicId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hex = format!("{:032x}", self.0);
        write!(
            f,
            "{}-{}-{}-{}-{}",
            &hex[..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..]
        )
    }
}

impl std::str::FromStr for TopicId {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, Self::Err> {
        let hex: String = text.chars().filter(|c| *c != '-').collect();
        if hex.len() != 32 {
            return Err(format!("'{text}' is not a topic id (32 hex digits)"));
        }
        u128::from_str_radix(&hex, 16)
            .map(TopicId)
            .map_err(|_| format!("'{text}' is not a topic id (32 hex digits)"))
    }
}

impl Serialize for TopicId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TopicId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The value stored under a topic name key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicNameValue {
    /// Entries of the topic up to this id were pruned (0 when the name is first persisted).
    pub pruned_entry_id: u64,
    /// The Kafka topic id of the topic the name was persisted for (`None` when the admin could not tell, or the
    /// key was written by a release that did not record it: such a topic is checked for existence only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_id: Option<TopicId>,
}

impl TopicNameValue {
    /// The encoded value, as `serde_json` writes the derived [`Serialize`]: `{"pruned_entry_id":N}`, with
    /// `"topic_id":"…"` after it when known (GreptimeDB ignores fields it does not know).
    pub fn encode(&self) -> Vec<u8> {
        // A struct of one integer: serialising it cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes a stored value; `key` names it in the error. Fields GreptimeDB may add later are ignored; a value
    /// that is not a JSON object with an unsigned `pruned_entry_id` is an error.
    pub fn decode(key: &[u8], value: &[u8]) -> Result<Self> {
        serde_json::from_slice(value)
            .map_err(|e| e.to_string())
            .map_err(|reason| {
                InvalidTopicNameKeySnafu {
                    key: String::from_utf8_lossy(key).into_owned(),
                    reason: format!(
                        "value '{}' is not a topic name value: {reason}",
                        String::from_utf8_lossy(value)
                    ),
                }
                .build()
            })
    }
}

/// Every persisted topic whose name starts with `topic_prefix` (all of them for `""`), in key order, read page by
/// page. Each value is decoded too: a damaged key or value is an error naming the key, never a name taken on
/// trust.
pub async fn list_persisted_topics(kv: &dyn KvBackend, topic_prefix: &str) -> Result<Vec<String>> {
    Ok(list_persisted_values(kv, topic_prefix)
        .await?
        .into_iter()
        .map(|(topic, _, _)| topic)
        .collect())
}

/// A transaction persisting `topics` (each with its Kafka topic id when known) only if none of them is persisted
/// yet: one `Absent` compare and one put per topic, applied atomically. When it fails (some name appeared meanwhile)
/// nothing is written, so no `pruned_entry_id` is ever reset.
pub fn persist_topics_txn(topics: &[(String, Option<TopicId>)]) -> Txn {
    Txn {
        compare: topics
            .iter()
            .map(|(t, _)| Compare::Absent(topic_name_key(t)))
            .collect(),
        success: topics
            .iter()
            .map(|(t, id)| {
                let value = TopicNameValue {
                    pruned_entry_id: 0,
                    topic_id: *id,
                };
                TxnOp::Put(topic_name_key(t), value.encode())
            })
            .collect(),
        failure: Vec::new(),
    }
}

/// Every persisted topic whose name starts with `topic_prefix`, with its value as stored and decoded, in key order
/// (see [`list_persisted_topics`]).
pub async fn list_persisted_values(
    kv: &dyn KvBackend,
    topic_prefix: &str,
) -> Result<Vec<(String, Vec<u8>, TopicNameValue)>> {
    let prefix = topic_name_key(topic_prefix);
    let end = crate::kv::prefix_end(&prefix);
    let mut start = prefix;
    let mut topics = Vec::new();
    loop {
        let resp = kv
            .range(RangeRequest::range(start.clone(), end.clone()).with_limit(LIST_PAGE_SIZE))
            .await?;
        for kv in &resp.kvs {
            let topic = decode_topic_name_key(&kv.key)?;
            let value = TopicNameValue::decode(&kv.key, &kv.value)?;
            topics.push((topic, kv.value.clone(), value));
        }
        match (resp.more, resp.kvs.last()) {
            (true, Some(last)) => {
                start = last.key.clone();
                start.push(0);
            }
            _ => return Ok(topics),
        }
    }
}

/// Reads a persisted key's value, checking it decodes; `None` when absent.
pub async fn get_topic_value(kv: &dyn KvBackend, topic: &str) -> Result<Option<TopicNameValue>> {
    let key = topic_name_key(topic);
    match kv.get(&key).await? {
        Some(pair) => TopicNameValue::decode(&key, &pair.value).map(Some),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{MemoryKvBackend, PutRequest};

    async fn put(kv: &MemoryKvBackend, key: &[u8], value: &[u8]) {
        kv.put(PutRequest {
            key: key.to_vec(),
            value: value.to_vec(),
            prev_kv: false,
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn listing_refuses_a_garbage_value_naming_its_key() {
        let kv = MemoryKvBackend::new();
        put(&kv, b"__topic_name/kafka/p_0", br#"{"pruned_entry_id":0}"#).await;
        put(&kv, b"__topic_name/kafka/p_1", br#"{"pruned_entry_id":12}"#).await;
        assert_eq!(
            list_persisted_topics(&kv, "p_").await.unwrap(),
            vec!["p_0", "p_1"]
        );
        for garbage in [
            &b"garbage"[..],
            b"",
            b"{}",
            br#"{"pruned_entry_id":-1}"#,
            br#"{"pruned_entry_id":"0"}"#,
        ] {
            put(&kv, b"__topic_name/kafka/p_1", garbage).await;
            let err = list_persisted_topics(&kv, "p_").await.unwrap_err();
            assert!(
                matches!(err, crate::wal::Error::InvalidTopicNameKey { .. }),
                "{err}"
            );
            let text = err.to_string();
            assert!(
                text.starts_with(
                    "invalid persisted topic name key '__topic_name/kafka/p_1': value '"
                ),
                "{text}"
            );
            assert!(text.contains(&*String::from_utf8_lossy(garbage)), "{text}");
            // Another prefix does not read the damaged key.
            put(&kv, b"__topic_name/kafka/q_0", br#"{"pruned_entry_id":0}"#).await;
            assert_eq!(list_persisted_topics(&kv, "q_").await.unwrap(), vec!["q_0"]);
        }
    }

    #[test]
    fn values_greptimedb_may_extend_still_decode() {
        let v = TopicNameValue::decode(
            b"__topic_name/kafka/t_0",
            br#"{"pruned_entry_id":5,"added_later":[1]}"#,
        )
        .unwrap();
        assert_eq!(v.pruned_entry_id, 5);
        assert_eq!(
            TopicNameValue {
                pruned_entry_id: 5,
                topic_id: None
            }
            .encode(),
            br#"{"pruned_entry_id":5}"#
        );
        let id: TopicId = "0a1b2c3d-0000-4000-8000-00000000002a".parse().unwrap();
        assert_eq!(id.to_string(), "0a1b2c3d-0000-4000-8000-00000000002a");
        let with_id = TopicNameValue {
            pruned_entry_id: 5,
            topic_id: Some(id),
        };
        assert_eq!(
            with_id.encode(),
            br#"{"pruned_entry_id":5,"topic_id":"0a1b2c3d-0000-4000-8000-00000000002a"}"#
        );
        assert_eq!(
            TopicNameValue::decode(b"k", &with_id.encode()).unwrap(),
            with_id
        );
        assert!(TopicNameValue::decode(b"k", br#"{"pruned_entry_id":5,"topic_id":"x"}"#).is_err());
    }

    #[test]
    fn key_and_value_are_byte_for_byte() {
        assert_eq!(
            topic_name_key("greptimedb_wal_topic_3"),
            b"__topic_name/kafka/greptimedb_wal_topic_3"
        );
        assert_eq!(
            TopicNameValue::default().encode(),
            br#"{"pruned_entry_id":0}"#
        );
        assert_eq!(
            serde_json::to_vec(&TopicNameValue::default()).unwrap(),
            TopicNameValue::default().encode()
        );
    }

    #[test]
    fn keys_and_values_decode() {
        assert_eq!(
            decode_topic_name_key(b"__topic_name/kafka/t_1").unwrap(),
            "t_1"
        );
        let v = TopicNameValue::decode(b"k", br#"{"pruned_entry_id":42}"#).unwrap();
        assert_eq!(v.pruned_entry_id, 42);
    }

    #[test]
    fn bad_keys_and_values_are_errors_quoting_them() {
        for bad in [&b"__topic_name/kafka/"[..], b"__table_name/x", b"\xff\xfe"] {
            let err = decode_topic_name_key(bad).unwrap_err().to_string();
            assert!(err.contains(&*String::from_utf8_lossy(bad)), "{err}");
        }
        let err = TopicNameValue::decode(b"__topic_name/kafka/t_0", b"nope")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("__topic_name/kafka/t_0") && err.contains("nope"),
            "{err}"
        );
    }

    #[test]
    fn persist_txn_puts_each_name_only_if_absent() {
        let names = vec![("a_0".to_string(), None), ("a_1".to_string(), None)];
        let txn = persist_topics_txn(&names);
        assert_eq!(
            txn.compare,
            vec![
                Compare::Absent(b"__topic_name/kafka/a_0".to_vec()),
                Compare::Absent(b"__topic_name/kafka/a_1".to_vec()),
            ]
        );
        assert_eq!(
            txn.success,
            vec![
                TxnOp::Put(
                    b"__topic_name/kafka/a_0".to_vec(),
                    br#"{"pruned_entry_id":0}"#.to_vec()
                ),
                TxnOp::Put(
                    b"__topic_name/kafka/a_1".to_vec(),
                    br#"{"pruned_entry_id":0}"#.to_vec()
                ),
            ]
        );
        assert!(txn.failure.is_empty());
    }
}
