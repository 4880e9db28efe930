//! The one support module of the root test targets (`tests/kv`, `tests/wal`, `tests/ddl`, `tests/faults`); each
//! target includes it with `#[path = "../support/mod.rs"] mod support;`.
//!
//! Here: reading the endpoints the test command exported, starting/stopping dedicated, named Kafka and etcd
//! instances through `scripts/services.sh` (for tests that take a service down, so they never disturb the shared
//! ones), and a snapshot of a kv backend's whole contents. [`ddl`] holds the ddl tests' helpers. The fake Kafka
//! topic admin is the library's own `remote_wal::wal::kafka::testing::FakeTopicAdmin`.
#![allow(dead_code)]

pub mod ddl;
pub mod fault_proxy;

use std::path::PathBuf;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use remote_wal::kv::{KvBackend, RangeRequest, range_all};

/// The endpoints in `var`, or a failure that says what is missing (tests that need a service never pass without it).
pub fn require_endpoints(var: &str, what: &str) -> Vec<String> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => v.split(',').map(|s| s.trim().to_string()).collect(),
        _ => panic!(
            "{var} is not set: this test needs {what}. Run the tests through scripts/test.sh (it starts the \
             services), or set {var} to host:port[,host:port…] of a running one."
        ),
    }
}

/// A name no other test (or earlier run) uses.
pub fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}_{}_{nanos:x}", std::process::id())
}

fn script() -> PathBuf {
    std::env::var_os("REMOTE_WAL_SERVICES_SCRIPT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/services.sh"))
}

fn run(args: &[&str]) -> String {
    let out = Command::new("bash")
        .arg(script())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} {args:?}: {e}", script().display()));
    assert!(
        out.status.success(),
        "services.sh {args:?} failed ({}); stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A service instance of this test's own, stopped (and its state removed) when dropped.
pub struct Service {
    kind: &'static str,
    /// Instance names (one, or the nodes of a cluster).
    pub names: Vec<String>,
    /// host:port of each node, in node order.
    pub endpoints: Vec<String>,
}

impl Service {
    /// A single-node Kafka (KRaft) of this test's own.
    pub fn kafka(tag: &str) -> Service {
        let name = unique(tag).replace('_', "-");
        run(&["start", "kafka", &name]);
        let ep = run(&["endpoint", "kafka", &name]);
        Service {
            kind: "kafka",
            names: vec![name],
            endpoints: vec![ep],
        }
    }

    /// An `n`-node Kafka KRaft cluster (every node broker and controller).
    pub fn kafka_cluster(tag: &str, n: usize) -> Service {
        let name = unique(tag).replace('_', "-");
        let eps = run(&["start-cluster", &name, &n.to_string()]);
        let names = (1..=n).map(|i| format!("{name}-{i}")).collect();
        Service {
            kind: "kafka",
            names,
            endpoints: eps.split(',').map(str::to_string).collect(),
        }
    }

    /// An etcd of this test's own.
    pub fn etcd(tag: &str) -> Service {
        let name = unique(tag).replace('_', "-");
        run(&["start", "etcd", &name]);
        let ep = run(&["endpoint", "etcd", &name]);
        Service {
            kind: "etcd",
            names: vec![name],
            endpoints: vec![ep],
        }
    }

    /// An `n`-member etcd cluster of this test's own.
    pub fn etcd_cluster(tag: &str, n: usize) -> Service {
        let name = unique(tag).replace('_', "-");
        let eps = run(&["start-etcd-cluster", &name, &n.to_string()]);
        Service {
            kind: "etcd",
            names: (1..=n).map(|i| format!("{name}-{i}")).collect(),
            endpoints: eps.split(',').map(str::to_string).collect(),
        }
    }

    /// Stops node `i` (data kept).
    pub fn stop(&self, i: usize) {
        run(&["stop", self.kind, &self.names[i]]);
    }

    /// Starts node `i` again on the same port with its data, and waits until it is ready.
    pub fn start(&self, i: usize) {
        run(&["start", self.kind, &self.names[i]]);
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = Command::new("bash")
                .arg(script())
                .args(["stop", self.kind, name])
                .output();
            let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("target/services")
                .join(name);
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Every pair of a kv backend, as (key, value) in key order.
pub async fn kv_snapshot(kv: &dyn KvBackend) -> Vec<(Vec<u8>, Vec<u8>)> {
    range_all(kv, RangeRequest::prefix(Vec::<u8>::new()), 0)
        .await
        .expect("read the whole kv backend")
        .into_iter()
        .map(|kv| (kv.key, kv.value))
        .collect()
}

/// The keys under `prefix`, as text, in key order.
pub async fn kv_keys(kv: &dyn KvBackend, prefix: &str) -> Vec<String> {
    range_all(kv, RangeRequest::prefix(prefix), 0)
        .await
        .expect("range the kv backend")
        .into_iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .collect()
}

/// A Kafka config on the broker of `KAFKA_ENDPOINTS` (fails the test when unset) for a pool of `num_topics`
/// topics named `{prefix}_i`, created with `topic_config`.
pub fn real_kafka_config(
    prefix: &str,
    num_topics: usize,
    topic_config: remote_wal::wal::TopicConfig,
) -> remote_wal::wal::KafkaConfig {
    remote_wal::wal::KafkaConfig {
        broker_endpoints: require_endpoints("KAFKA_ENDPOINTS", "a running Kafka broker"),
        num_topics,
        topic_name_prefix: prefix.to_string(),
        create_topic_timeout: std::time::Duration::from_secs(30),
        topic_config,
        ..remote_wal::wal::KafkaConfig::default()
    }
}

/// The topic admin of `config`'s brokers; fails the test when they are unreachable.
pub async fn connect_admin(
    config: &remote_wal::wal::KafkaConfig,
) -> std::sync::Arc<remote_wal::wal::kafka::rskafka_admin::RsKafkaTopicAdmin> {
    match remote_wal::wal::kafka::rskafka_admin::RsKafkaTopicAdmin::connect(config).await {
        Ok(admin) => std::sync::Arc::new(admin),
        Err(e) => panic!("Kafka at {:?} is unreachable: {e}", config.broker_endpoints),
    }
}

/// DescribeConfigs of `names` once the broker that answers knows all of them: a creation the controller
/// acknowledged reaches the broker's metadata a moment later, and until then the topic is absent from the answer.
/// Asks up to 100 times, 100 ms apart.
pub async fn describe_when_known(
    admin: &remote_wal::wal::kafka::rskafka_admin::RsKafkaTopicAdmin,
    names: &[String],
    keys: &[String],
) -> std::collections::BTreeMap<String, remote_wal::wal::TopicConfig> {
    let mut read = std::collections::BTreeMap::new();
    for _ in 0..100 {
        read =
            remote_wal::wal::kafka::admin::TopicAdmin::describe_topic_configs(admin, names, keys)
                .await
                .unwrap();
        if names.iter().all(|n| read.contains_key(n)) {
            return read;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("the broker never described all of {names:?}: {read:?}")
}
