//! SIGKILL `walctl bootstrap` while it creates a pool of 200 Kafka topics, rerun it, and check with Kafka's
//! metadata that every wanted topic exists exactly once (and no other topic of the prefix), and that every name is
//! persisted. The kill lands wherever the broker's speed puts it (or after the run finished); the checks hold for
//! every outcome. Needs `KAFKA_ENDPOINTS` (the test fails saying so when unset).

use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{
    Env, endpoints, pool_topics_on_broker, toml_list, unique, walctl_path, wanted_topics,
};

const NUM_TOPICS: usize = 200;

#[test]
fn killed_bootstrap_resumes_to_exactly_the_wanted_topics_all_persisted() {
    let brokers = endpoints("KAFKA_ENDPOINTS");
    let env = Env::new();
    let prefix = unique("walctl_kill");
    let wanted = wanted_topics(&prefix, NUM_TOPICS);
    // Four creations in flight at a time, so the pool takes long enough to be caught half-made.
    let config = env.write(
        "kill.toml",
        &format!(
            r#"
[metadata_store]
backend = "redb"
path = "walctl-data/kill.redb"

[wal]
provider = "kafka"
broker_endpoints = {brokers}
num_topics = {NUM_TOPICS}
topic_name_prefix = "{prefix}"
max_concurrent_creates = 4

[wal.backoff]
deadline = "60s"
"#,
            brokers = toml_list(&brokers),
        ),
    );

    let mut child = Command::new(walctl_path())
        .current_dir(env.dir.path())
        .arg("--config")
        .arg(&config)
        .arg("bootstrap")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn walctl bootstrap");

    // Kill it as soon as the broker shows a first topic of the pool. How far the run got by then depends on the
    // broker's speed, and so does whether the run finished first: every outcome is valid and leads to the same
    // checks below — a killed run (at any point, even after its last topic) or a finished one must both end, after
    // a rerun, in exactly the wanted topics, all persisted, under one bootstrap procedure.
    let deadline = Instant::now() + Duration::from_secs(120);
    let outcome = loop {
        if let Some(status) = child.try_wait().expect("poll child") {
            assert!(
                status.success(),
                "walctl bootstrap ended on its own, but not successfully: {status}"
            );
            break "finished before the kill".to_string();
        }
        let seen = pool_topics_on_broker(&brokers, &prefix).len();
        if seen >= 1 {
            match child.kill() {
                Ok(()) => {}
                // It exited between the poll and the kill: reaped below.
                Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {}
                Err(e) => panic!("SIGKILL walctl: {e}"),
            }
            let status = child.wait().expect("wait for the killed walctl");
            if status.success() {
                break "finished just before the kill".to_string();
            }
            assert_eq!(
                status.signal(),
                Some(9),
                "walctl was killed by SIGKILL: {status}"
            );
            break format!("killed with {seen} of {NUM_TOPICS} topics on the broker");
        }
        assert!(
            Instant::now() < deadline,
            "no topic of {prefix} appeared within 120 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!("first walctl bootstrap: {outcome}");

    // Rerun to completion: it resumes the unfinished procedure.
    let report = env.json(Some(&config), &["bootstrap"]);
    assert_eq!(report[0]["ready"], true, "{report:?}");

    // Kafka's metadata: exactly the wanted names (a map, so each once), one partition each, no other topic of the
    // prefix.
    let on_broker = pool_topics_on_broker(&brokers, &prefix);
    let names: BTreeSet<String> = on_broker.keys().cloned().collect();
    assert_eq!(names, wanted, "the broker holds exactly the wanted topics");
    assert!(on_broker.values().all(|p| *p == 1), "one partition each");

    // Every name persisted: through walctl ...
    let topics = env.json(Some(&config), &["topics"]);
    let persisted: BTreeSet<String> = topics
        .iter()
        .filter(|t| t["persisted"] == true)
        .map(|t| t["topic"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(persisted, wanted);
    assert_eq!(
        topics.len(),
        NUM_TOPICS,
        "no topic outside the pool: {topics:?}"
    );

    // ... and straight from the redb file through the library.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let from_file: BTreeSet<String> = runtime.block_on(async {
        let kv = remote_wal::kv::RedbKvBackend::open(env.dir.path().join("walctl-data/kill.redb"))
            .unwrap();
        remote_wal::key::topic_name::list_persisted_topics(&kv, &format!("{prefix}_"))
            .await
            .unwrap()
            .into_iter()
            .collect()
    });
    assert_eq!(from_file, wanted);

    // One bootstrap procedure, resumed and done: the rerun finished the killed run's procedure instead of
    // starting another.
    let procedures = env.json(Some(&config), &["procedures", "list"]);
    let bootstraps: Vec<_> = procedures
        .iter()
        .filter(|p| {
            p["type"]
                .as_str()
                .is_some_and(|t| t.contains("TopicBootstrap"))
        })
        .collect();
    assert_eq!(bootstraps.len(), 1, "{procedures:?}");
    assert_eq!(bootstraps[0]["state"], "done");
}
