//! `[wal] topic_config`: names and values checked at config load (errors naming the key), applied at creation
//! (CreateTopics `configs`), and an existing pool topic whose configs differ reported as drift, never changed —
//! with the fake admin, and on the real broker (`KAFKA_ENDPOINTS`; fails when unset) through DescribeConfigs.

use std::sync::Arc;
use std::time::Duration;

use procedures::{Context, Procedure, ProcedureId, Status};
use remote_wal::config::MetasrvConfig;
use remote_wal::kv::{KvBackendRef, MemoryKvBackend};
use remote_wal::wal::kafka::admin::{TopicAdmin, TopicAdminRef};
use remote_wal::wal::kafka::bootstrap::TopicBootstrapProcedure;
use remote_wal::wal::kafka::testing::FakeTopicAdmin;
use remote_wal::wal::kafka::{KafkaTopicManager, TopicConfigDrift, TopicPoolSpec};
use remote_wal::wal::{KafkaConfig, TopicConfig, WalConfig};

use crate::support;

const ORIGIN: &str = "metasrv.toml";

fn kafka_toml(extra: &str) -> String {
    format!("[wal]\nprovider = \"kafka\"\nbroker_endpoints = [\"127.0.0.1:9092\"]\n{extra}\n")
}

/// The error the config file `toml` is refused with.
fn refused(toml: &str) -> String {
    MetasrvConfig::from_toml_str(toml, ORIGIN)
        .unwrap_err()
        .to_string()
}

fn configs(pairs: &[(&str, &str)]) -> TopicConfig {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn topic_configs_parse_into_the_pool_spec() {
    let config = MetasrvConfig::from_toml_str(
        &kafka_toml(
            "topic_config = { \"retention.ms\" = \"604800000\", \"segment.bytes\" = \"268435456\" }",
        ),
        ORIGIN,
    )
    .unwrap();
    let WalConfig::Kafka(kafka) = &config.wal else {
        panic!("a Kafka WAL")
    };
    let wanted = configs(&[
        ("retention.ms", "604800000"),
        ("segment.bytes", "268435456"),
    ]);
    assert_eq!(kafka.topic_config, wanted);
    assert_eq!(TopicPoolSpec::from_config(kafka).topic_config, wanted);
    // A `[wal.topic_config]` table is the same.
    let table = MetasrvConfig::from_toml_str(
        &kafka_toml("[wal.topic_config]\n\"retention.ms\" = \"604800000\"\n\"segment.bytes\" = \"268435456\""),
        ORIGIN,
    )
    .unwrap();
    assert_eq!(table.wal, config.wal);
}

#[test]
fn a_bad_topic_config_name_is_refused_naming_the_key() {
    for (name, shown) in [
        ("Retention.ms", "\"Retention.ms\""),
        ("retention..ms", "\"retention..ms\""),
        ("retention ms", "\"retention ms\""),
        (".retention", "\".retention\""),
        ("", "\"\""),
    ] {
        let err = refused(&kafka_toml(&format!(
            "topic_config = {{ {shown} = \"1\" }}"
        )));
        assert_eq!(
            err,
            format!(
                "config file 'metasrv.toml': invalid WAL config: topic_config.\"{name}\" = 1: {}",
                if name.is_empty() {
                    "the config name is empty"
                } else {
                    "not a Kafka topic config name: lowercase words of [a-z0-9] joined by single dots, like \
                     'retention.ms'"
                }
            )
        );
    }
}

#[test]
fn a_topic_config_value_must_be_a_string_without_control_characters() {
    assert_eq!(
        refused(&kafka_toml(
            "topic_config = { \"retention.ms\" = 604800000 }"
        )),
        "invalid config file 'metasrv.toml', line 4, column 35, key `wal.topic_config.retention.ms`: invalid \
         type: integer `604800000`, expected a string"
    );
    assert_eq!(
        refused(&kafka_toml(
            "topic_config = { \"cleanup.policy\" = \"delete\\ncompact\" }"
        )),
        "config file 'metasrv.toml': invalid WAL config: topic_config.\"cleanup.policy\" = \"delete\\ncompact\": \
         the value contains the control character '\\n'"
    );
}

#[tokio::test]
async fn a_bad_topic_config_is_refused_by_the_pool_before_anything_is_sent() {
    let config = KafkaConfig {
        topic_config: configs(&[("Retention.ms", "1")]),
        ..KafkaConfig::default()
    };
    let admin = Arc::new(FakeTopicAdmin::new());
    let err =
        KafkaTopicManager::from_config(&config, Arc::new(MemoryKvBackend::new()), admin.clone())
            .unwrap_err()
            .to_string();
    assert!(err.contains("topic_config.\"Retention.ms\" = 1"), "{err}");
    assert_eq!(admin.total_create_calls(), 0);
}

fn spec(prefix: &str, n: usize, topic_config: TopicConfig) -> TopicPoolSpec {
    let mut spec = TopicPoolSpec::new(prefix, n);
    spec.ready_poll.init = Duration::from_millis(1);
    spec.ready_poll.deadline = Duration::from_secs(30);
    spec.topic_config = topic_config;
    spec
}

async fn bootstrap(spec: &TopicPoolSpec, kv: KvBackendRef, admin: TopicAdminRef) {
    let ctx = Context::new(ProcedureId::new("topic_config"));
    let mut p = TopicBootstrapProcedure::new(spec.clone(), kv, admin).unwrap();
    loop {
        match p.execute(&ctx).await {
            Ok(Status::Executing { .. }) => {}
            Ok(Status::Done { .. }) => return,
            Ok(other) => panic!("unexpected status {other:?}"),
            Err(e) => panic!("bootstrap failed: {e}"),
        }
    }
}

#[tokio::test]
async fn the_fake_creates_with_the_configs_and_reports_drift_without_changing_a_topic() {
    let wanted = configs(&[
        ("retention.ms", "604800000"),
        ("segment.bytes", "268435456"),
    ]);
    let admin = Arc::new(FakeTopicAdmin::new());
    admin.set_create_batch_size(2);
    // An operator made topic 1 beforehand, with another retention.
    admin.create_out_of_band("cfg_1", 1);
    admin.set_config_out_of_band("cfg_1", "retention.ms", "1000");
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let spec = spec("cfg", 3, wanted.clone());
    bootstrap(&spec, kv.clone(), admin.clone()).await;
    let topics = admin.topics();
    assert_eq!(topics["cfg_0"].configs, wanted);
    assert_eq!(topics["cfg_2"].configs, wanted);
    assert_eq!(
        topics["cfg_1"].configs,
        configs(&[("retention.ms", "1000")]),
        "an existing topic is never changed"
    );

    let manager = KafkaTopicManager::new(
        spec,
        kv,
        admin.clone(),
        Arc::new(remote_wal::wal::kafka::LeastLoadedTopicSelector::new()),
    )
    .unwrap();
    let drift = manager.config_drift().await.unwrap();
    assert_eq!(
        drift,
        vec![
            TopicConfigDrift {
                topic: "cfg_1".to_string(),
                key: "retention.ms".to_string(),
                wanted: "604800000".to_string(),
                actual: Some("1000".to_string()),
            },
            TopicConfigDrift {
                topic: "cfg_1".to_string(),
                key: "segment.bytes".to_string(),
                wanted: "268435456".to_string(),
                actual: None,
            },
        ]
    );
    assert_eq!(
        drift[0].to_string(),
        "topic 'cfg_1' has retention.ms = 1000, but [wal] topic_config asks for 604800000; existing topics are \
         not changed (alter it with Kafka's tools if intended)"
    );
    assert_eq!(admin.topics()["cfg_1"].configs["retention.ms"], "1000");
}

#[tokio::test]
async fn no_topic_config_reads_nothing() {
    let admin = Arc::new(FakeTopicAdmin::new());
    let manager = KafkaTopicManager::new(
        spec("none", 2, TopicConfig::new()),
        Arc::new(MemoryKvBackend::new()),
        admin.clone(),
        Arc::new(remote_wal::wal::kafka::LeastLoadedTopicSelector::new()),
    )
    .unwrap();
    assert!(manager.config_drift().await.unwrap().is_empty());
    assert_eq!(admin.metadata_reads(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_real_broker_topics_get_the_configs_and_an_existing_one_is_reported_not_changed() {
    let prefix = support::unique("rw_topic_config");
    // Not the broker's defaults (7 days, 1 GiB), so a topic made without them differs.
    let wanted = configs(&[("retention.ms", "86400000"), ("segment.bytes", "268435456")]);
    let config = support::real_kafka_config(&prefix, 3, wanted.clone());
    let admin = support::connect_admin(&config).await;
    // Topic 2 exists beforehand, made without configs (the broker's defaults).
    let existing = format!("{prefix}_2");
    admin.create_topic(&existing, 1, 1).await.unwrap();

    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let spec = TopicPoolSpec::from_config(&config);
    bootstrap(&spec, kv.clone(), admin.clone()).await;

    let keys: Vec<String> = wanted.keys().cloned().collect();
    let names = spec.topic_names();
    let read = support::describe_when_known(&admin, &names, &keys).await;
    assert_eq!(read[&names[0]], wanted);
    assert_eq!(read[&names[1]], wanted);
    assert_ne!(read[&existing]["retention.ms"], "86400000");

    let manager = KafkaTopicManager::from_config(&config, kv, admin.clone()).unwrap();
    let drift = manager.config_drift().await.unwrap();
    assert!(!drift.is_empty());
    assert!(drift.iter().all(|d| d.topic == existing), "{drift:?}");
    assert!(
        drift
            .iter()
            .any(|d| d.key == "retention.ms" && d.wanted == "86400000"),
        "{drift:?}"
    );
    // Reporting changed nothing.
    let again = admin.describe_topic_configs(&names, &keys).await.unwrap();
    assert_eq!(again, read);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_real_broker_a_refused_config_value_names_the_topic_and_the_brokers_reason() {
    let prefix = support::unique("rw_topic_config_bad");
    let config = support::real_kafka_config(&prefix, 1, configs(&[("retention.ms", "forever")]));
    let admin = support::connect_admin(&config).await;
    let answers = admin
        .create_topics(&[format!("{prefix}_0")], 1, 1, &config.topic_config)
        .await
        .unwrap();
    let err = answers[0].1.as_ref().unwrap_err();
    assert!(!err.is_retryable(), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&format!("'{prefix}_0'"))
            && text.contains("InvalidConfig")
            && text.contains("Invalid value forever for configuration retention.ms"),
        "{text}"
    );
    assert!(
        !admin
            .list_topics()
            .await
            .unwrap()
            .contains_key(&format!("{prefix}_0")),
        "nothing created"
    );
}
