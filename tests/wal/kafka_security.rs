//! `[wal.security]` on the real SASL_SSL broker (`KAFKA_SECURE_ENDPOINTS`, its certificates and SCRAM user under
//! `KAFKA_SECURE_DIR`; the tests fail saying so when either is unset): batched creates and metadata reads, rskafka's
//! list and a DeleteRecords over TLS with SCRAM-SHA-256 and SCRAM-SHA-512; and each refusal (a wrong password, an
//! untrusted authority, a mechanism the broker does not offer, TLS to a plaintext listener, plaintext to the TLS
//! listener) as one final error naming the endpoint and the cause.

use std::path::{Path, PathBuf};
use std::time::Duration;

use remote_wal::wal::KafkaConfig;
use remote_wal::wal::kafka::admin::{CreateTopicOutcome, TopicAdmin};
use remote_wal::wal::kafka::batch_admin::BatchAdmin;
use remote_wal::wal::kafka::partition::{KafkaPartition, call_bound, connect_client};
use remote_wal::wal::kafka::rskafka_admin::RsKafkaTopicAdmin;
use remote_wal::wal::kafka::security::{
    KafkaSecurityConfig, SaslMechanism, SaslSettings, TlsFiles,
};

use crate::support;

/// Far above any bound of these tests: only a hang reaches it.
const HANG: Duration = Duration::from_secs(120);

/// The secure broker's state directory (`certs/`, `username`, `password`).
fn secure_dir() -> PathBuf {
    match std::env::var_os("KAFKA_SECURE_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => panic!(
            "KAFKA_SECURE_DIR is not set: this test needs the SASL_SSL broker's certificates and credentials. Run \
             the tests through scripts/test.sh (it starts the broker), or set it to the directory \
             `scripts/services.sh start kafka-secure` filled."
        ),
    }
}

fn secure_endpoints() -> Vec<String> {
    support::require_endpoints(
        "KAFKA_SECURE_ENDPOINTS",
        "a Kafka broker with a SASL_SSL listener",
    )
}

/// TLS trusting `ca`, SASL with `mechanism` as the broker's user and the password in `password_file`.
fn security(ca: &Path, mechanism: SaslMechanism, password_file: PathBuf) -> KafkaSecurityConfig {
    let dir = secure_dir();
    let username = std::fs::read_to_string(dir.join("username")).expect("username");
    KafkaSecurityConfig {
        tls: Some(TlsFiles {
            ca: ca.to_path_buf(),
            cert: None,
            key: None,
        }),
        sasl: Some(SaslSettings {
            mechanism,
            username: username.trim().to_string(),
            password_file,
        }),
    }
}

fn good_security(mechanism: SaslMechanism) -> KafkaSecurityConfig {
    let dir = secure_dir();
    security(&dir.join("certs/ca.pem"), mechanism, dir.join("password"))
}

/// A config for `endpoints` with short bounds, so a refusal that were retried would show as a timeout.
fn config(endpoints: Vec<String>, security: KafkaSecurityConfig) -> KafkaConfig {
    let mut config = KafkaConfig {
        broker_endpoints: endpoints,
        num_topics: 2,
        topic_name_prefix: support::unique("secure"),
        create_topic_timeout: Duration::from_secs(10),
        security: Box::new(security),
        ..KafkaConfig::default()
    };
    config.backoff.init = Duration::from_millis(100);
    config.backoff.deadline = Duration::from_secs(5);
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_scram_mechanisms_create_list_and_prune_over_tls() {
    for mechanism in [SaslMechanism::ScramSha256, SaslMechanism::ScramSha512] {
        let config = config(secure_endpoints(), good_security(mechanism));
        let names = config.topic_names();
        let work = async {
            let admin = RsKafkaTopicAdmin::connect(&config).await.expect("connect");
            // The batch admin's own connections: CreateTopics, then Metadata.
            let created = admin
                .create_topics(&names, 1, 1, &Default::default())
                .await
                .expect("create");
            for (name, outcome) in &created {
                assert_eq!(
                    outcome.as_ref().ok(),
                    Some(&CreateTopicOutcome::Created),
                    "{mechanism}: {name}"
                );
            }
            let described = admin.describe_topics(&names).await.expect("describe");
            assert_eq!(described.len(), 2, "{mechanism}: {described:?}");
            // rskafka's connections: a fresh metadata list, and DeleteRecords on partition 0.
            let listed = admin.list_topics().await.expect("list");
            assert!(listed.contains_key(&names[0]), "{mechanism}: {listed:?}");
            let client = connect_client(&config).await.expect("client");
            let partition = KafkaPartition::new(&client, &names[0], call_bound(&config))
                .await
                .expect("partition");
            partition.delete_records_before(0).await.expect("prune");
            assert_eq!(partition.low_watermark().await.expect("low"), 0);
        };
        tokio::time::timeout(HANG, work).await.expect("no hang");
    }
}

/// Asserts both clients (rskafka's connect, the batch admin's request) fail on `config` with a final error
/// naming `endpoint` and containing each of `causes`.
async fn assert_refused(config: &KafkaConfig, endpoint: &str, causes: &[&str]) {
    let rskafka = tokio::time::timeout(HANG, RsKafkaTopicAdmin::connect(config))
        .await
        .expect("the connect returns instead of hanging")
        .expect_err("the connect is refused");
    let batch = tokio::time::timeout(
        HANG,
        BatchAdmin::new(config)
            .expect("admin")
            .describe_topics(&["any".to_string()]),
    )
    .await
    .expect("the request returns instead of hanging")
    .expect_err("the request is refused");
    for err in [rskafka, batch] {
        let text = err.to_string();
        assert!(text.contains(endpoint), "names the endpoint: {text}");
        for cause in causes {
            assert!(text.contains(cause), "says {cause:?}: {text}");
        }
        assert!(!err.is_retryable(), "final: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_one_final_error_without_the_password() {
    let dir = secure_dir();
    let scratch = tempfile::tempdir().expect("tempdir");
    let wrong = scratch.path().join("wrong-password");
    std::fs::write(&wrong, "not-the-password-4711\n").expect("write");
    let endpoint = secure_endpoints()[0].clone();
    let config = config(
        vec![endpoint.clone()],
        security(&dir.join("certs/ca.pem"), SaslMechanism::ScramSha512, wrong),
    );
    assert_refused(
        &config,
        &endpoint,
        &[
            "SASL authentication (SCRAM-SHA-512",
            "SaslAuthenticationFailed",
        ],
    )
    .await;
    let err = RsKafkaTopicAdmin::connect(&config)
        .await
        .expect_err("refused");
    for shown in [err.to_string(), format!("{err:?}"), format!("{config:?}")] {
        assert!(!shown.contains("not-the-password-4711"), "{shown}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_authority_fails_the_tls_handshake() {
    let dir = secure_dir();
    let endpoint = secure_endpoints()[0].clone();
    let config = config(
        vec![endpoint.clone()],
        security(
            &dir.join("certs/other-ca.pem"),
            SaslMechanism::ScramSha256,
            dir.join("password"),
        ),
    );
    assert_refused(
        &config,
        &endpoint,
        &["TLS handshake failed", "not signed by security.tls.ca"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mechanism_the_broker_does_not_offer_is_named_with_the_offered_ones() {
    let endpoint = secure_endpoints()[0].clone();
    let config = config(vec![endpoint.clone()], good_security(SaslMechanism::Plain));
    assert_refused(
        &config,
        &endpoint,
        &["does not offer PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_a_plaintext_listener_fails_the_handshake() {
    let endpoint =
        support::require_endpoints("KAFKA_ENDPOINTS", "a running Kafka broker")[0].clone();
    let config = config(
        vec![endpoint.clone()],
        good_security(SaslMechanism::ScramSha256),
    );
    assert_refused(
        &config,
        &endpoint,
        &["TLS handshake failed", "is this a TLS listener"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_to_the_tls_listener_fails_within_the_deadline() {
    let endpoint = secure_endpoints()[0].clone();
    let config = config(vec![endpoint.clone()], KafkaSecurityConfig::default());
    // Without `[wal.security]` nothing tells a closed TLS listener from a broker restarting: the clients retry
    // until `backoff.deadline`, then fail for good, naming the endpoint (the broker either closes the connection,
    // or waits for the rest of what it takes for a TLS record: then the call's bound ends it).
    let err = tokio::time::timeout(HANG, RsKafkaTopicAdmin::connect(&config))
        .await
        .expect("the connect returns instead of hanging")
        .expect_err("refused");
    let text = err.to_string();
    assert!(text.contains(&endpoint), "{text}");
    assert!(
        text.contains("[wal.security]"),
        "points at the setting: {text}"
    );
    assert!(!err.is_retryable(), "{text}");
}
