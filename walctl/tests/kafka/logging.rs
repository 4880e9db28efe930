//! What walctl prints on stderr around Kafka: one line for a failed bootstrap, no rskafka line for a resumed one,
//! and "still waiting" lines naming the endpoint while it waits on a dead broker.

use crate::support::{
    Env, WAITING, kafka_redb_config, unique, wanted_topics, without_waiting_lines,
};

#[test]
fn a_failing_bootstrap_prints_exactly_one_line() {
    let env = Env::new();
    let prefix = unique("walctl_rf");
    // The shared test cluster has one broker: replication factor 3 cannot be met.
    let config = kafka_redb_config(&env, "rf3", &prefix, 2, "replication_factor = 3");
    let out = env
        .walctl_with(&config)
        .arg("bootstrap")
        .output()
        .expect("run walctl");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    let lines = without_waiting_lines(&stderr);
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(lines[0].starts_with("error: "), "ours: {stderr}");
    assert!(
        lines[0].contains("replication factor 3"),
        "names the cause: {stderr}"
    );
    assert!(!stderr.contains("rskafka"), "{stderr}");
}

#[test]
fn a_resumed_bootstrap_of_an_existing_pool_prints_no_rskafka_line() {
    let env = Env::new();
    let prefix = unique("walctl_exists");
    let first = kafka_redb_config(&env, "first", &prefix, 6, "");
    env.json(Some(&first), &["bootstrap"]);
    // A second metadata store with the same pool: every topic already exists on the broker, which rskafka reports
    // as TopicAlreadyExists for each create.
    let second = kafka_redb_config(&env, "second", &prefix, 6, "");
    let out = env
        .walctl_with(&second)
        .args(["--json", "bootstrap"])
        .output()
        .expect("run walctl");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{stderr}");
    // Nothing at all above debug: no rskafka line, no error, no warning about topics that already exist.
    assert_eq!(
        without_waiting_lines(&stderr),
        Vec::<&str>::new(),
        "an existing topic is success: {stderr}"
    );
    let topics = env.json(Some(&second), &["topics"]);
    let persisted: std::collections::BTreeSet<String> = topics
        .iter()
        .filter(|t| t["persisted"] == true)
        .map(|t| t["topic"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(persisted, wanted_topics(&prefix, 6));
}

#[test]
fn a_bootstrap_waiting_on_a_dead_broker_says_so_naming_the_endpoint() {
    // A loopback port nobody listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("pick a free port")
        .port();
    let endpoint = format!("127.0.0.1:{port}");
    let env = Env::new();
    // The deadline outlasts the first "still waiting" line (2 s), so the wait is long enough to be reported.
    let config = env.write(
        "dead.toml",
        &format!(
            "[metadata_store]\nbackend = \"memory\"\n[wal]\nprovider = \"kafka\"\nbroker_endpoints = [\"{endpoint}\"]\n\
             topic_name_prefix = \"walctl_dead\"\n[wal.backoff]\ninit = \"50ms\"\nmax = \"200ms\"\ndeadline = \"4s\"\n\
             [procedure]\nmax_retries = 0\n"
        ),
    );
    let out = env
        .walctl_with(&config)
        .arg("bootstrap")
        .output()
        .expect("run walctl");
    // The command ends, failing, with one error naming the endpoint ...
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    let errors = without_waiting_lines(&stderr);
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].starts_with("error: "), "{stderr}");
    assert!(errors[0].contains(&endpoint), "{stderr}");
    // ... after saying, while it waited, what it waited for.
    let waiting: Vec<&str> = stderr.lines().filter(|l| l.starts_with(WAITING)).collect();
    assert!(!waiting.is_empty(), "a waiting line: {stderr}");
    for line in waiting {
        assert!(line.contains(&format!("Kafka at {endpoint}")), "{line}");
    }
}
