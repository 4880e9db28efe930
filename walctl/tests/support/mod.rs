//! Helpers shared by the `walctl` CLI test targets: a temp working directory per test, the binary, JSON-lines parsing,
//! and the Kafka / etcd endpoints from the environment.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use assert_cmd::Command;
use serde_json::Value;
use tempfile::TempDir;

/// The path of the built `walctl` binary.
pub fn walctl_path() -> &'static str {
    env!("CARGO_BIN_EXE_walctl")
}

/// A test's own working directory; `walctl` runs inside it, so the embedded default's `./walctl-data` is private.
pub struct Env {
    pub dir: TempDir,
}

impl Env {
    pub fn new() -> Self {
        Env {
            dir: tempfile::tempdir().expect("create a temp dir"),
        }
    }

    /// `walctl` in this directory, logs at the default level.
    pub fn walctl(&self) -> Command {
        let mut cmd = Command::new(walctl_path());
        cmd.current_dir(self.dir.path()).env_remove("RUST_LOG");
        cmd
    }

    /// `walctl --config FILE` in this directory.
    pub fn walctl_with(&self, config: &PathBuf) -> Command {
        let mut cmd = self.walctl();
        cmd.arg("--config").arg(config);
        cmd
    }

    /// Writes `text` to `name` in this directory.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).expect("write config");
        path
    }

    /// Runs `walctl ARGS` and returns stdout, failing the test with stderr when it exits non-zero.
    pub fn ok(&self, config: Option<&PathBuf>, args: &[&str]) -> String {
        let mut cmd = match config {
            Some(c) => self.walctl_with(c),
            None => self.walctl(),
        };
        let out = cmd.args(args).output().expect("run walctl");
        assert!(
            out.status.success(),
            "walctl {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("stdout is UTF-8")
    }

    /// Runs `walctl --json ARGS` and parses every stdout line as one JSON object.
    pub fn json(&self, config: Option<&PathBuf>, args: &[&str]) -> Vec<Value> {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        json_lines(&self.ok(config, &all))
    }

    /// Runs `walctl ARGS` expecting failure; returns its stderr after checking it is one line, without panic or
    /// backtrace.
    pub fn err(&self, config: Option<&PathBuf>, args: &[&str]) -> String {
        let mut cmd = match config {
            Some(c) => self.walctl_with(c),
            None => self.walctl(),
        };
        let out = cmd.args(args).output().expect("run walctl");
        assert!(
            !out.status.success(),
            "walctl {args:?} should fail but succeeded: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let stderr = String::from_utf8(out.stderr).expect("stderr is UTF-8");
        assert_one_line_error(&stderr);
        stderr
    }
}

/// How walctl starts the line it prints on stderr (no terminal) while a command keeps waiting.
pub const WAITING: &str = "walctl: waiting for ";

/// The stderr lines that are not "still waiting" lines.
pub fn without_waiting_lines(stderr: &str) -> Vec<&str> {
    stderr
        .trim_end()
        .lines()
        .filter(|l| !l.starts_with(WAITING))
        .collect()
}

/// The error output is exactly one line (besides any "still waiting" lines of a long wait), with no panic message
/// and no backtrace.
pub fn assert_one_line_error(stderr: &str) {
    assert_eq!(
        without_waiting_lines(stderr).len(),
        1,
        "the error is one line: {stderr:?}"
    );
    assert!(!stderr.contains("panicked"), "no panic: {stderr}");
    assert!(!stderr.contains("backtrace"), "no backtrace: {stderr}");
    assert!(
        !stderr.contains("internal error"),
        "no internal error: {stderr}"
    );
}

/// Parses each line of `stdout` as a JSON object.
pub fn json_lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|l| {
            let v: Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}"));
            assert!(v.is_object(), "each line is an object: {l}");
            v
        })
        .collect()
}

/// A name unique to this process and call: `{prefix}_{time}_{pid}_{n}`, `[a-z0-9_]` only.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}_{:x}_{}_{}",
        nanos % (1 << 40),
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A comma-separated endpoint list from the environment; fails the test, saying what is missing, when unset.
pub fn endpoints(var: &str) -> Vec<String> {
    let value = std::env::var(var).unwrap_or_default();
    let endpoints: Vec<String> = value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    assert!(
        !endpoints.is_empty(),
        "{var} is not set: these tests need a real service. Run scripts/test.sh (it starts Kafka and etcd), \
         or export {var}=host:port (scripts/test.sh does)."
    );
    endpoints
}

/// `["a", "b"]` as a TOML array.
pub fn toml_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", quoted.join(", "))
}

/// Every topic on the brokers with its partition count, read through the library's rskafka admin.
pub fn broker_topics(brokers: &[String]) -> std::collections::BTreeMap<String, usize> {
    use remote_wal::wal::KafkaConfig;
    use remote_wal::wal::kafka::admin::TopicAdmin;
    use remote_wal::wal::kafka::rskafka_admin::RsKafkaTopicAdmin;
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(async {
        let mut config = KafkaConfig {
            broker_endpoints: brokers.to_vec(),
            ..Default::default()
        };
        config.backoff.deadline = std::time::Duration::from_secs(20);
        let admin = RsKafkaTopicAdmin::connect(&config)
            .await
            .unwrap_or_else(|e| panic!("cannot reach Kafka at {brokers:?} (KAFKA_ENDPOINTS): {e}"));
        admin.list_topics().await.expect("list topics")
    })
}

/// The topics on the brokers whose name starts with `{prefix}_`, with partition counts.
pub fn pool_topics_on_broker(
    brokers: &[String],
    prefix: &str,
) -> std::collections::BTreeMap<String, usize> {
    let p = format!("{prefix}_");
    broker_topics(brokers)
        .into_iter()
        .filter(|(t, _)| t.starts_with(&p))
        .collect()
}

/// `{prefix}_0 .. {prefix}_{n-1}`.
pub fn wanted_topics(prefix: &str, n: usize) -> std::collections::BTreeSet<String> {
    (0..n).map(|i| format!("{prefix}_{i}")).collect()
}

/// A redb + Kafka config in `env` (file `name.toml`, metadata `walctl-data/name.redb`) for a pool of `num_topics` topics.
pub fn kafka_redb_config(
    env: &Env,
    name: &str,
    prefix: &str,
    num_topics: usize,
    extra_wal: &str,
) -> PathBuf {
    let brokers = endpoints("KAFKA_ENDPOINTS");
    env.write(
        &format!("{name}.toml"),
        &format!(
            r#"
[metadata_store]
backend = "redb"
path = "walctl-data/{name}.redb"

[wal]
provider = "kafka"
broker_endpoints = {brokers}
num_topics = {num_topics}
topic_name_prefix = "{prefix}"
{extra_wal}

[wal.backoff]
deadline = "60s"
"#,
            brokers = toml_list(&brokers),
        ),
    )
}

/// A Kafka + etcd config in `env` (file `kafka-etcd.toml`, metadata under a fresh etcd key prefix) with `num_topics`
/// topics named `{prefix}_i` and the given datanodes.
pub fn kafka_etcd_config(env: &Env, prefix: &str, num_topics: usize, datanodes: &[u64]) -> PathBuf {
    let kafka = endpoints("KAFKA_ENDPOINTS");
    let etcd = endpoints("ETCD_ENDPOINTS");
    let ids: Vec<String> = datanodes.iter().map(u64::to_string).collect();
    env.write(
        "kafka-etcd.toml",
        &format!(
            r#"
[metadata_store]
backend = "etcd"
endpoints = {etcd}
key_prefix = "walctl-test/{ns}/"

[wal]
provider = "kafka"
broker_endpoints = {kafka}
num_topics = {num_topics}
topic_name_prefix = "{prefix}"
create_topic_timeout = "30s"

[wal.backoff]
deadline = "60s"

[datanodes]
ids = [{ids}]
"#,
            etcd = toml_list(&etcd),
            kafka = toml_list(&kafka),
            ns = unique("ns"),
            ids = ids.join(", "),
        ),
    )
}
