//! `RsKafkaTopicAdmin` against a real Kafka broker (`KAFKA_ENDPOINTS`, comma-separated `host:port`).
//!
//! Every test uses its own topic names, so the tests never collide with each other or with earlier runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::join_all;
use remote_wal::wal::Error;
use remote_wal::wal::KafkaConfig;
use remote_wal::wal::kafka::admin::{CreateTopicOutcome, TopicAdmin};
use remote_wal::wal::kafka::rskafka_admin::RsKafkaTopicAdmin;

/// The broker endpoints from `KAFKA_ENDPOINTS`; fails the test when unset.
fn endpoints() -> Vec<String> {
    let raw = std::env::var("KAFKA_ENDPOINTS").unwrap_or_default();
    let endpoints: Vec<String> = raw
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(String::from)
        .collect();
    assert!(
        !endpoints.is_empty(),
        "KAFKA_ENDPOINTS is not set: these tests need a running Kafka broker (comma-separated host:port)"
    );
    endpoints
}

fn config(endpoints: Vec<String>) -> KafkaConfig {
    let mut c = KafkaConfig {
        broker_endpoints: endpoints,
        create_topic_timeout: Duration::from_secs(10),
        ..KafkaConfig::default()
    };
    c.backoff.init = Duration::from_millis(50);
    c.backoff.max = Duration::from_millis(500);
    c.backoff.deadline = Duration::from_secs(10);
    c
}

/// An admin on the real broker; fails the test with the connect error when the broker is unreachable.
async fn admin() -> RsKafkaTopicAdmin {
    let endpoints = endpoints();
    match RsKafkaTopicAdmin::connect(&config(endpoints.clone())).await {
        Ok(admin) => admin,
        Err(e) => panic!("Kafka at KAFKA_ENDPOINTS={endpoints:?} is unreachable: {e}"),
    }
}

/// A topic name no other test or earlier run uses.
fn unique_topic(tag: &str) -> String {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "remote_wal_test_{tag}_{}_{nanos}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn create_then_create_again_is_created_then_already_existed() {
    let admin = admin().await;
    let topic = unique_topic("twice");
    assert_eq!(
        admin.create_topic(&topic, 1, 1).await.unwrap(),
        CreateTopicOutcome::Created
    );
    assert_eq!(
        admin.create_topic(&topic, 1, 1).await.unwrap(),
        CreateTopicOutcome::AlreadyExisted
    );
}

/// Lists topics until `topic` shows up or `attempts` lists have missed it; returns its partition count.
///
/// A topic Kafka has just created can be missing from the next metadata response for a moment.
async fn listed_partitions(admin: &RsKafkaTopicAdmin, topic: &str) -> Option<usize> {
    for _ in 0..100 {
        if let Some(&n) = admin.list_topics().await.unwrap().get(topic) {
            return Some(n);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread")]
async fn list_topics_shows_a_created_topic_with_its_partition_count() {
    let admin = admin().await;
    let one = unique_topic("list1");
    let three = unique_topic("list3");
    assert!(!admin.list_topics().await.unwrap().contains_key(&one));
    admin.create_topic(&one, 1, 1).await.unwrap();
    admin.create_topic(&three, 3, 1).await.unwrap();
    assert_eq!(listed_partitions(&admin, &one).await, Some(1), "{one}");
    assert_eq!(listed_partitions(&admin, &three).await, Some(3), "{three}");
}

#[tokio::test(flavor = "multi_thread")]
async fn existing_topic_with_other_partition_count_is_an_error_naming_it() {
    let admin = admin().await;
    let topic = unique_topic("mismatch");
    assert_eq!(
        admin.create_topic(&topic, 3, 1).await.unwrap(),
        CreateTopicOutcome::Created
    );
    let err = admin.create_topic(&topic, 1, 1).await.unwrap_err();
    match &err {
        Error::TopicPartitionMismatch {
            topic: t,
            wanted,
            found,
        } => {
            assert_eq!(t, &topic);
            assert_eq!((*wanted, *found), (1, 3));
        }
        other => panic!("expected a partition mismatch, got {other}"),
    }
    // The topic name is full of digits: the counts are checked in their place in the message.
    assert_eq!(
        err.to_string(),
        format!(
            "topic '{topic}' already exists with 3 partition(s), but 1 partition(s) are wanted"
        )
    );
    assert!(!err.is_retryable());
}

#[tokio::test(flavor = "multi_thread")]
async fn replication_factor_above_live_brokers_surfaces_kafkas_error() {
    let admin = admin().await;
    let topic = unique_topic("rf3");
    let err = admin.create_topic(&topic, 1, 3).await.unwrap_err();
    assert!(
        matches!(
            &err,
            Error::InvalidReplicationFactor { topic: t, replication_factor: 3, .. } if t == &topic
        ),
        "expected INVALID_REPLICATION_FACTOR for {topic}, got {err}"
    );
    let msg = err.to_string();
    eprintln!("{msg}");
    assert!(
        msg.contains(&topic) && msg.contains("replication factor 3"),
        "{msg}"
    );
    assert!(!err.is_retryable());
    assert!(!admin.list_topics().await.unwrap().contains_key(&topic));
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_names_are_rejected_in_the_client() {
    let admin = admin().await;
    let long = "x".repeat(250);
    for bad in ["has space", ".", "..", "", "slash/name", long.as_str()] {
        let err = admin.create_topic(bad, 1, 1).await.unwrap_err();
        // InvalidTopicName is only raised client-side; Kafka's own rejection is KafkaRejectedTopicName.
        assert!(
            matches!(&err, Error::InvalidTopicName { topic, .. } if topic == bad),
            "{bad:?}: {err}"
        );
        assert!(err.to_string().contains(&format!("'{bad}'")), "{err}");
        assert!(!err.is_retryable());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn unreachable_broker_fails_with_an_error_naming_the_endpoint() {
    let endpoint = dead_endpoint();
    let mut config = config(vec![endpoint.clone()]);
    config.backoff.deadline = Duration::from_secs(2);
    // The guard only turns a hang into a failure; it is far above the configured deadline.
    let result = tokio::time::timeout(Duration::from_secs(60), RsKafkaTopicAdmin::connect(&config))
        .await
        .expect("connect to a closed port hung instead of failing at the backoff deadline");
    let err = result.unwrap_err();
    eprintln!("{err}");
    assert!(
        matches!(err, Error::KafkaConnect { .. } | Error::KafkaTimeout { .. }),
        "{err}"
    );
    assert!(err.to_string().contains(&endpoint), "{err}");
    // rskafka already retried until the deadline: the engine must not run it again.
    assert!(!err.is_retryable(), "{err}");
}

/// A loopback port nobody listens on: bound, then closed.
fn dead_endpoint() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("127.0.0.1:{port}")
}

/// A TCP listener that answers every connection with bytes that are not Kafka's protocol (an HTTP error), then
/// keeps the connection open. Returns its endpoint; the listener lives as long as the test's runtime.
async fn wrong_protocol_endpoint() -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = socket.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let reply = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
                    if socket.write_all(reply).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    endpoint
}

/// Runs `walctl bootstrap`'s path (the metasrv's bootstrap through the procedure engine, over the default lazily
/// connecting admin) against `endpoint` with `backoff.deadline = 3s` and `create_topic_timeout = 2s`, and checks it
/// fails within the deadline plus one request timeout (with a 3x allowance for a loaded machine; the old nested
/// retries took 85-93 s) with an error naming the endpoint.
async fn bootstrap_fails_within_the_deadline(endpoint: String) {
    use remote_wal::config::MetasrvConfig;
    use remote_wal::ddl::MemoryDatanodeManager;
    use remote_wal::kv::MemoryKvBackend;
    use remote_wal::metasrv::Metasrv;
    use remote_wal::wal::WalConfig;

    let mut kafka = config(vec![endpoint.clone()]);
    kafka.topic_name_prefix = "dead_pool".to_string();
    kafka.num_topics = 4;
    kafka.backoff.deadline = Duration::from_secs(3);
    kafka.create_topic_timeout = Duration::from_secs(2);
    let bound = kafka.backoff.deadline + kafka.create_topic_timeout;
    let config = MetasrvConfig {
        wal: WalConfig::Kafka(kafka),
        ..MetasrvConfig::default()
    };
    let metasrv = Metasrv::with_parts(
        config,
        Arc::new(MemoryKvBackend::new()),
        None,
        Arc::new(MemoryDatanodeManager::new()),
    )
    .expect("metasrv");
    let started = std::time::Instant::now();
    // Only turns a hang into a failure; far above the bound asserted below.
    let result = tokio::time::timeout(Duration::from_secs(300), metasrv.bootstrap(|_| {}))
        .await
        .expect("the bootstrap hung instead of failing");
    let took = started.elapsed();
    let err = result.expect_err("no Kafka broker answers there");
    eprintln!("bootstrap against {endpoint} failed after {took:?}: {err}");
    assert!(err.to_string().contains(&endpoint), "{err}");
    // One retry authority: rskafka spent the deadline, so the engine ran the step once (its default policy would
    // retry a retryable error 10 times, each spending the deadline again, and say so in the error).
    assert!(
        !err.to_string().contains("retries ran out"),
        "the engine retried a step rskafka had already retried until the deadline: {err}"
    );
    assert!(
        took < 3 * bound,
        "the bootstrap took {took:?} to fail, more than 3 x (deadline + request timeout) = {:?}",
        3 * bound
    );
    let _ = metasrv.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_endpoint_fails_the_bootstrap_within_the_deadline_naming_it() {
    bootstrap_fails_within_the_deadline(dead_endpoint()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_protocol_endpoint_fails_the_bootstrap_within_the_deadline_naming_it() {
    bootstrap_fails_within_the_deadline(wrong_protocol_endpoint().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_creates_of_one_name_create_it_exactly_once() {
    // Four clients (four connections), eight creates each, all in flight together.
    let mut admins = Vec::new();
    for _ in 0..4 {
        admins.push(Arc::new(admin().await));
    }
    let topic = unique_topic("race");
    let creates = (0..32).map(|i| {
        let admin = Arc::clone(&admins[i % admins.len()]);
        let topic = topic.clone();
        tokio::spawn(async move { admin.create_topic(&topic, 1, 1).await })
    });
    let outcomes: Vec<CreateTopicOutcome> = join_all(creates)
        .await
        .into_iter()
        .map(|joined| joined.unwrap().unwrap())
        .collect();
    let created = outcomes
        .iter()
        .filter(|o| **o == CreateTopicOutcome::Created)
        .count();
    let existed = outcomes
        .iter()
        .filter(|o| **o == CreateTopicOutcome::AlreadyExisted)
        .count();
    assert_eq!((created, existed), (1, 31), "{outcomes:?}");
    assert_eq!(listed_partitions(&admins[0], &topic).await, Some(1));
}
