//! `walctl topics` shows how regions spread over the pool (min/max/mean regions per topic, in text and on every
//! JSON line), and each `walctl create-table` — a new process every time — levels the pool: it hands the least
//! loaded topics to the new regions, counting what earlier processes recorded. On the shared Kafka broker, with
//! metadata in etcd (`KAFKA_ENDPOINTS`, `ETCD_ENDPOINTS`; the test fails saying so when they are unset).

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::support::{Env, kafka_etcd_config, unique};

/// `(min, max, mean)` of the `pool_spread` every JSON line of `walctl --json topics` carries (the same on each),
/// and the regions per topic.
fn spread(env: &Env, config: &PathBuf) -> ((u64, u64, f64), BTreeMap<String, u64>) {
    let lines = env.json(Some(config), &["topics"]);
    let first = &lines[0]["pool_spread"];
    let spread = (
        first["min"].as_u64().expect("min"),
        first["max"].as_u64().expect("max"),
        first["mean"].as_f64().expect("mean"),
    );
    let mut regions = BTreeMap::new();
    for line in &lines {
        assert_eq!(
            &line["pool_spread"], first,
            "one pool spread on every line: {lines:?}"
        );
        // The fields the JSON line always had are still there.
        assert_eq!(line["in_pool"], true, "{line}");
        assert_eq!(line["persisted"], true, "{line}");
        regions.insert(
            line["topic"].as_str().expect("topic").to_string(),
            line["regions"].as_u64().expect("regions"),
        );
    }
    (spread, regions)
}

#[test]
fn topics_shows_the_spread_and_each_create_table_levels_the_pool() {
    let env = Env::new();
    let prefix = unique("walctl_spread");
    let config = kafka_etcd_config(&env, &prefix, 3, &[1]);
    env.json(Some(&config), &["bootstrap"]);
    let ((min, max, mean), regions) = spread(&env, &config);
    assert_eq!((min, max, mean), (0, 0, 0.0));
    assert_eq!(regions.len(), 3);

    // 4 regions over 3 topics: 2, 1, 1.
    env.json(
        Some(&config),
        &["create-table", &unique("t"), "--regions", "4"],
    );
    let ((min, max, mean), regions) = spread(&env, &config);
    assert_eq!((min, max), (1, 2), "{regions:?}");
    assert!((mean - 4.0 / 3.0).abs() < 1e-9, "{mean}");
    let text = env.ok(Some(&config), &["topics"]);
    assert!(
        text.contains("Regions per pool topic: min 1, max 2, mean 1.33"),
        "{text}"
    );

    // A new process gives 2 more regions to the two topics with 1: level at 2 (a round-robin starting anywhere
    // would give one of them to the topic already holding 2 in two cases out of three).
    env.json(
        Some(&config),
        &["create-table", &unique("t"), "--regions", "2"],
    );
    let ((min, max, mean), regions) = spread(&env, &config);
    assert_eq!((min, max), (2, 2), "{regions:?}");
    assert!((mean - 2.0).abs() < 1e-9, "{mean}");
    assert!(regions.values().all(|r| *r == 2), "{regions:?}");
    let text = env.ok(Some(&config), &["topics"]);
    assert!(
        text.contains("6 regions assigned") && text.contains("min 2, max 2, mean 2.00"),
        "{text}"
    );
}
