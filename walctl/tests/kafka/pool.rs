//! `walctl` against the real services: Kafka for the topic pool and etcd for the metadata (`KAFKA_ENDPOINTS`,
//! `ETCD_ENDPOINTS`; the tests fail saying so when they are unset). Each test uses its own random topic prefix and
//! its own etcd key prefix, so runs never see each other.

use std::collections::{BTreeMap, BTreeSet};

use crate::support::{
    Env, endpoints, kafka_etcd_config, pool_topics_on_broker, unique, wanted_topics,
};
use remote_wal::wal::WalOptions;

fn kafka_topic(wal_options: &serde_json::Value) -> String {
    let encoded = wal_options.as_str().expect("wal_options is a string");
    match WalOptions::decode(encoded).expect("wal_options decode") {
        WalOptions::Kafka(k) => k.topic,
        other => panic!("expected Kafka WAL options, got {other:?}"),
    }
}

#[test]
fn bootstrap_create_table_open_regions_and_topics_on_kafka_and_etcd() {
    let brokers = endpoints("KAFKA_ENDPOINTS");
    let env = Env::new();
    let prefix = unique("walctl_it");
    let config = kafka_etcd_config(&env, &prefix, 4, &[1, 2]);
    let wanted = wanted_topics(&prefix, 4);

    // bootstrap: the pool exists on the broker, once each, one partition.
    let report = env.json(Some(&config), &["bootstrap"]);
    assert_eq!(report.len(), 1);
    assert_eq!(report[0]["provider"], "kafka");
    assert_eq!(report[0]["ready"], true);
    assert_eq!(report[0]["num_topics"], 4);
    assert_eq!(report[0]["topic_name_prefix"], prefix.as_str());
    let on_broker = pool_topics_on_broker(&brokers, &prefix);
    assert_eq!(on_broker.keys().cloned().collect::<BTreeSet<_>>(), wanted);
    assert!(on_broker.values().all(|p| *p == 1), "{on_broker:?}");

    // topics: every pool topic persisted, no region yet.
    let topics = env.json(Some(&config), &["topics"]);
    assert_eq!(topics.len(), 4);
    for t in &topics {
        assert!(wanted.contains(t["topic"].as_str().unwrap()), "{t}");
        assert_eq!(t["persisted"], true);
        assert_eq!(t["in_pool"], true);
        assert_eq!(t["regions"], 0);
    }

    // create-table: 8 regions over the 4 topics (round-robin: 2 each) and datanodes 1 and 2.
    let table = unique("t");
    let created = env.json(Some(&config), &["create-table", &table, "--regions", "8"]);
    assert_eq!(created.len(), 8);
    let mut per_topic: BTreeMap<String, usize> = BTreeMap::new();
    for r in &created {
        let topic = kafka_topic(&r["wal_options"]);
        assert!(wanted.contains(&topic), "{topic} is a pool topic");
        *per_topic.entry(topic).or_default() += 1;
    }
    assert!(per_topic.values().all(|n| *n == 2), "{per_topic:?}");

    // open-regions: the two datanodes together open exactly the 8 regions, with the same WAL options.
    let mut opened: BTreeMap<u64, String> = BTreeMap::new();
    for dn in ["1", "2"] {
        for r in env.json(Some(&config), &["open-regions", "--datanode", dn]) {
            assert_eq!(r["kind"], "request", "{r}");
            opened.insert(
                r["region_id"].as_u64().unwrap(),
                kafka_topic(&r["wal_options"]),
            );
        }
    }
    let expected: BTreeMap<u64, String> = created
        .iter()
        .map(|r| {
            (
                r["region_id"].as_u64().unwrap(),
                kafka_topic(&r["wal_options"]),
            )
        })
        .collect();
    assert_eq!(opened, expected);

    // topics: 2 regions on each topic now.
    let topics = env.json(Some(&config), &["topics"]);
    let counts: BTreeMap<String, u64> = topics
        .iter()
        .map(|t| {
            (
                t["topic"].as_str().unwrap().to_string(),
                t["regions"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(counts.len(), 4);
    assert!(counts.values().all(|n| *n == 2), "{counts:?}");
    let text = env.ok(Some(&config), &["topics"]);
    assert!(
        text.contains("ready") && text.contains("8 regions assigned"),
        "{text}"
    );

    // bootstrap again: nothing new on the broker.
    env.json(Some(&config), &["bootstrap"]);
    let again = pool_topics_on_broker(&brokers, &prefix);
    assert_eq!(again.keys().cloned().collect::<BTreeSet<_>>(), wanted);
}

#[test]
fn create_table_on_a_fresh_kafka_pool_bootstraps_it_first() {
    let brokers = endpoints("KAFKA_ENDPOINTS");
    let env = Env::new();
    let prefix = unique("walctl_fresh");
    let config = kafka_etcd_config(&env, &prefix, 3, &[1, 2]);

    let created = env.json(Some(&config), &["create-table", "fresh", "--regions", "3"]);
    let topics: BTreeSet<String> = created
        .iter()
        .map(|r| kafka_topic(&r["wal_options"]))
        .collect();
    assert_eq!(topics, wanted_topics(&prefix, 3));
    assert_eq!(
        pool_topics_on_broker(&brokers, &prefix)
            .keys()
            .cloned()
            .collect::<BTreeSet<_>>(),
        wanted_topics(&prefix, 3)
    );
    let procedures = env.json(Some(&config), &["procedures", "list"]);
    let types: Vec<&str> = procedures
        .iter()
        .map(|p| p["type"].as_str().unwrap())
        .collect();
    assert!(
        types.iter().any(|t| t.contains("TopicBootstrap")),
        "{types:?}"
    );
    assert!(types.iter().any(|t| t.contains("CreateTable")), "{types:?}");
    assert!(
        procedures.iter().all(|p| p["state"] == "done"),
        "{procedures:?}"
    );
}

#[test]
fn unreachable_brokers_fail_bootstrap_with_an_error_naming_them() {
    let env = Env::new();
    let config = env.write(
        "dead.toml",
        "[metadata_store]\nbackend = \"memory\"\n[wal]\nprovider = \"kafka\"\nbroker_endpoints = [\"127.0.0.1:1\"]\n\
         topic_name_prefix = \"walctl_dead\"\n[wal.backoff]\ninit = \"50ms\"\nmax = \"200ms\"\ndeadline = \"2s\"\n\
         [procedure]\nmax_retries = 0\n",
    );
    let err = env.err(Some(&config), &["bootstrap"]);
    assert!(err.contains("127.0.0.1:1"), "{err}");
}
