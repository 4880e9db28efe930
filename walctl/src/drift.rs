//! One voice: an embedded command that finds a server leading its store is sent to that server, which runs it with
//! *its* config. When the command's config differs from the server's in anything the command depends on (the
//! metadata namespace, the WAL provider, brokers and topic pool, the datanodes), the command is refused instead,
//! naming both values: sent on, it would silently act on another pool or other datanodes than its file names.
//!
//! The leader shows what it serves in `GET /v1/leader` (`served`, [`served`]); the command compares that with its
//! own ([`differences`]). Nothing secret is shown: endpoints, names and counts only.

use remote_wal::config::MetasrvConfig;
use remote_wal::wal::WalConfig;
use serde_json::{Map, Value, json};

/// The fields of `config` a forwarded command depends on, by their names in the config file.
pub fn served(config: &MetasrvConfig) -> Value {
    let mut out = Map::new();
    out.insert(
        "metadata_store.key_prefix".into(),
        json!(config.metadata_store.key_prefix),
    );
    match &config.wal {
        WalConfig::RaftEngine => {
            out.insert("wal.provider".into(), json!("raft_engine"));
        }
        WalConfig::Kafka(kafka) => {
            out.insert("wal.provider".into(), json!("kafka"));
            out.insert("wal.broker_endpoints".into(), json!(kafka.broker_endpoints));
            out.insert(
                "wal.topic_name_prefix".into(),
                json!(kafka.topic_name_prefix),
            );
            out.insert("wal.num_topics".into(), json!(kafka.num_topics));
            out.insert("wal.num_partitions".into(), json!(kafka.num_partitions));
            out.insert(
                "wal.replication_factor".into(),
                json!(kafka.replication_factor),
            );
        }
    }
    out.insert("datanodes.ids".into(), json!(config.datanodes.ids));
    Value::Object(out)
}

/// Each field where `ours` and `theirs` (both from [`served`]) differ, as `field: OURS here, THEIRS on the server`,
/// in field order. A field only one side has (another WAL provider) counts as a difference.
pub fn differences(ours: &Value, theirs: &Value) -> Vec<String> {
    let empty = Map::new();
    let ours = ours.as_object().unwrap_or(&empty);
    let theirs = theirs.as_object().unwrap_or(&empty);
    let mut fields: Vec<&String> = ours.keys().chain(theirs.keys()).collect();
    fields.sort();
    fields.dedup();
    fields
        .into_iter()
        .filter(|field| ours.get(*field) != theirs.get(*field))
        .map(|field| {
            let show =
                |v: Option<&Value>| v.map_or_else(|| "not set".to_string(), Value::to_string);
            format!(
                "{field}: {} here, {} on the server",
                show(ours.get(field)),
                show(theirs.get(field))
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use remote_wal::wal::KafkaConfig;

    fn kafka(prefix: &str, brokers: &[&str]) -> MetasrvConfig {
        let mut config = MetasrvConfig::embedded();
        config.wal = WalConfig::Kafka(KafkaConfig {
            broker_endpoints: brokers.iter().map(|b| b.to_string()).collect(),
            topic_name_prefix: prefix.to_string(),
            ..KafkaConfig::default()
        });
        config
    }

    #[test]
    fn the_same_config_has_no_difference() {
        let config = kafka("pool", &["127.0.0.1:9092"]);
        assert!(differences(&served(&config), &served(&config)).is_empty());
    }

    #[test]
    fn each_differing_field_is_named_with_both_values() {
        let ours = kafka("mine", &["10.0.0.1:9092"]);
        let mut theirs = kafka("theirs", &["10.0.0.2:9092"]);
        theirs.datanodes.ids = vec![1, 2, 3];
        assert_eq!(
            differences(&served(&ours), &served(&theirs)),
            vec![
                r#"datanodes.ids: [1] here, [1,2,3] on the server"#.to_string(),
                r#"wal.broker_endpoints: ["10.0.0.1:9092"] here, ["10.0.0.2:9092"] on the server"#
                    .to_string(),
                r#"wal.topic_name_prefix: "mine" here, "theirs" on the server"#.to_string(),
            ]
        );
    }

    #[test]
    fn another_provider_names_the_fields_only_one_side_has() {
        let ours = MetasrvConfig::embedded();
        let theirs = kafka("pool", &["127.0.0.1:9092"]);
        let found = differences(&served(&ours), &served(&theirs));
        assert!(
            found.contains(
                &r#"wal.provider: "raft_engine" here, "kafka" on the server"#.to_string()
            ),
            "{found:?}"
        );
        assert!(
            found.contains(
                &r#"wal.topic_name_prefix: not set here, "pool" on the server"#.to_string()
            ),
            "{found:?}"
        );
    }
}
