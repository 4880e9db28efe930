//! `walctl` with `[wal.security]` against the SASL_SSL broker (`KAFKA_SECURE_ENDPOINTS`, certificates and the
//! SCRAM user under `KAFKA_SECURE_DIR`; the tests fail saying so when either is unset): the main flow (bootstrap,
//! create-table, entries appended and replayed through the datanode's log store, a prune) over TLS with
//! SCRAM-SHA-256, with no walctl output (at the debug log level too) containing the password; and a wrong password
//! refused as one line naming the endpoint, without the password.

use std::path::{Path, PathBuf};
use std::process::Output;

use datanode::checkpoint::CheckpointStore;
use datanode::log_store::kafka::{PartitionLog, RsKafkaPartition, call_bound, connect_client};
use datanode::log_store::{EntryToWrite, KafkaLogStore, KafkaLogStoreConfig, LogStore};
use remote_wal::config::MetasrvConfig;
use remote_wal::kv::redb::RedbOpenMode;
use remote_wal::metasrv::Metasrv;
use remote_wal::wal::{KafkaConfig, WalConfig};

use crate::support::{Env, assert_one_line_error, endpoints, json_lines, toml_list, unique};

/// The secure broker's state directory (`certs/`, `username`, `password`).
fn secure_dir() -> PathBuf {
    match std::env::var_os("KAFKA_SECURE_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => panic!(
            "KAFKA_SECURE_DIR is not set: this test needs the SASL_SSL broker's certificates and credentials. Run \
             scripts/test.sh (it starts the broker), or set it to the directory `scripts/services.sh start \
             kafka-secure` filled."
        ),
    }
}

/// A redb + Kafka config (`name.toml`, absolute redb path) for a one-topic pool on the secure broker, SCRAM-SHA-256
/// with the password in `password_file`.
fn secure_config(env: &Env, name: &str, prefix: &str, password_file: &Path) -> PathBuf {
    let dir = secure_dir();
    let username = std::fs::read_to_string(dir.join("username")).expect("username");
    env.write(
        &format!("{name}.toml"),
        &format!(
            r#"
[metadata_store]
backend = "redb"
path = {redb:?}

[wal]
provider = "kafka"
broker_endpoints = {brokers}
num_topics = 1
topic_name_prefix = "{prefix}"
create_topic_timeout = "10s"

[wal.security]
tls = {{ ca = {ca:?} }}
sasl = {{ mechanism = "SCRAM-SHA-256", username = {username:?}, password_file = {password:?} }}

[wal.backoff]
deadline = "20s"
"#,
            redb = env
                .dir
                .path()
                .join(format!("{name}.redb"))
                .display()
                .to_string(),
            brokers = toml_list(&endpoints("KAFKA_SECURE_ENDPOINTS")),
            ca = dir.join("certs/ca.pem").display().to_string(),
            username = username.trim(),
            password = password_file.display().to_string(),
        ),
    )
}

/// Runs `walctl --config CONFIG ARGS` with `RUST_LOG` set to `log` (unset: the default level).
fn run(env: &Env, config: &Path, log: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = env.walctl_with(&config.to_path_buf());
    if let Some(filter) = log {
        cmd.env("RUST_LOG", filter);
    }
    cmd.args(args).output().expect("run walctl")
}

/// The run's stdout as JSON lines, failing the test with stderr when it failed; `seen` collects both streams.
fn ok_json(out: Output, seen: &mut String) -> Vec<serde_json::Value> {
    let stdout = String::from_utf8(out.stdout).expect("UTF-8");
    let stderr = String::from_utf8(out.stderr).expect("UTF-8");
    assert!(out.status.success(), "walctl failed: {stderr}");
    seen.push_str(&stdout);
    seen.push_str(&stderr);
    json_lines(&stdout)
}

async fn with_metasrv<T>(config: &Path, f: impl AsyncFnOnce(&Metasrv) -> T) -> T {
    let config = MetasrvConfig::from_file(config).expect("config");
    let metasrv = Metasrv::open(config, RedbOpenMode::MustExist)
        .await
        .expect("open");
    let out = f(&metasrv).await;
    metasrv.stop().await.expect("stop");
    out
}

fn kafka_of(metasrv: &Metasrv) -> KafkaConfig {
    match &metasrv.config().wal {
        WalConfig::Kafka(k) => k.clone(),
        WalConfig::RaftEngine => panic!("a Kafka config"),
    }
}

#[test]
fn the_main_flow_runs_over_sasl_ssl_and_no_output_holds_the_password() {
    let env = Env::new();
    let password_file = secure_dir().join("password");
    let password = std::fs::read_to_string(&password_file).expect("password");
    let password = password.trim_end();
    let prefix = unique("walctl_secure");
    let config = secure_config(&env, "secure", &prefix, &password_file);
    let mut seen = String::new();

    ok_json(
        run(&env, &config, Some("debug"), &["--json", "bootstrap"]),
        &mut seen,
    );
    let created = ok_json(
        run(
            &env,
            &config,
            None,
            &["--json", "create-table", "public.secured", "--regions", "2"],
        ),
        &mut seen,
    );
    let regions: Vec<u64> = created
        .iter()
        .map(|r| r["region_id"].as_u64().expect("region_id"))
        .collect();
    assert_eq!(regions.len(), 2, "{created:?}");
    let topic = format!("{prefix}_0");

    // Through the datanode's log store (rskafka over TLS + SCRAM): both regions start, write 5 entries each
    // (region 0 the odd entry ids, region 1 the even ones), and flush up to entries 6 and 4.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let kafka = rt.block_on(with_metasrv(&config, async |m: &Metasrv| {
        let kafka = kafka_of(m);
        let client = connect_client(&kafka).await.expect("connect");
        let partition = RsKafkaPartition::new(&client, &topic, call_bound(&kafka))
            .await
            .expect("partition");
        let store = KafkaLogStore::new(partition, KafkaLogStoreConfig::default());
        let checkpoints = CheckpointStore::new(m.kv().clone());
        for region in &regions {
            datanode::checkpoint::start_kafka_region(&store, &checkpoints, *region)
                .await
                .expect("start");
        }
        let entries = (0..10)
            .map(|i| EntryToWrite {
                region_id: regions[i % 2],
                data: vec![7; 100],
            })
            .collect();
        store.append(entries).await.expect("append");
        checkpoints
            .record_flushed(&topic, regions[0], 6)
            .await
            .expect("flush");
        checkpoints
            .record_flushed(&topic, regions[1], 4)
            .await
            .expect("flush");
        kafka
    }));

    let pruned = ok_json(
        run(&env, &config, Some("debug"), &["--json", "wal", "prune"]),
        &mut seen,
    );
    assert_eq!(pruned.len(), 1, "{pruned:?}");
    assert_eq!(pruned[0]["new_pruned_entry_id"], 4, "{pruned:?}");
    let low = rt.block_on(async {
        let client = connect_client(&kafka).await.expect("connect");
        RsKafkaPartition::new(&client, &topic, call_bound(&kafka))
            .await
            .expect("partition")
            .low_watermark()
            .await
            .expect("low")
    });
    assert_eq!(
        low, 4,
        "entries 1..=4 (offsets 0..=3) deleted over SASL_SSL"
    );

    let opened = ok_json(
        run(
            &env,
            &config,
            None,
            &["--json", "open-regions", "--datanode", "1", "--replay"],
        ),
        &mut seen,
    );
    assert_eq!(opened.len(), 2, "{opened:?}");
    for line in &opened {
        let region = line["region_id"].as_u64().expect("region_id");
        assert!(line.get("replay_error").is_none(), "{line}");
        // Region 0 keeps 7 and 9 above its checkpoint 6; region 1 keeps 6, 8 and 10 above 4.
        let wanted = if region == regions[0] { 2 } else { 3 };
        assert_eq!(line["entries_replayed"].as_u64(), Some(wanted), "{line}");
    }
    ok_json(
        run(&env, &config, Some("debug"), &["--json", "topics"]),
        &mut seen,
    );

    assert!(
        seen.contains("debug") || seen.contains("DEBUG"),
        "the debug runs logged"
    );
    assert!(
        !seen.contains(password),
        "walctl's output holds the password"
    );
    assert!(!seen.contains(" WARN "), "no warning on success: {seen}");
}

#[test]
fn a_wrong_password_is_one_line_naming_the_endpoint_without_the_password() {
    let env = Env::new();
    let wrong = env.write("wrong-password", "not-the-password-0815\n");
    let config = secure_config(&env, "wrong", &unique("walctl_wrong"), &wrong);
    let out = run(&env, &config, Some("debug"), &["bootstrap"]);
    assert!(!out.status.success(), "a wrong password is refused");
    let stderr = String::from_utf8(out.stderr).expect("UTF-8");
    let stdout = String::from_utf8(out.stdout).expect("UTF-8");
    for shown in [&stderr, &stdout] {
        assert!(!shown.contains("not-the-password-0815"), "{shown}");
    }
    // The last line is the error; debug lines come before it.
    let error = stderr.trim_end().lines().last().unwrap_or_default();
    assert_one_line_error(error);
    assert!(
        error.contains(&endpoints("KAFKA_SECURE_ENDPOINTS")[0]),
        "{error}"
    );
    assert!(error.contains("SaslAuthenticationFailed"), "{error}");
    assert!(error.contains("SCRAM-SHA-256"), "{error}");
}
