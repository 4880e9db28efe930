//! Servers with the Kafka WAL (shared `ETCD_ENDPOINTS` and `KAFKA_ENDPOINTS`): the leader is ready only once the
//! topic pool is, tables get pool topics, and a follower reads the pool from the store.

use serde_json::json;

use crate::cluster::{Servers, get, post, unique};
use crate::support::endpoints;

#[test]
fn the_leader_is_ready_with_the_pool_and_tables_get_its_topics() {
    let etcd = endpoints("ETCD_ENDPOINTS");
    let kafka = endpoints("KAFKA_ENDPOINTS");
    let prefix = unique("srvwal");
    let brokers: Vec<String> = kafka.iter().map(|e| format!("{e:?}")).collect();
    let wal = format!(
        "\n[wal]\nprovider = \"kafka\"\nbroker_endpoints = [{}]\nnum_topics = 3\ntopic_name_prefix = \"{prefix}\"\n\
         replication_factor = 1\n",
        brokers.join(", ")
    );
    let servers = Servers::on_etcd_with(&etcd, &wal, 2);
    let leader = servers.wait_for_leader(&[0, 1]);
    let follower = 1 - leader;

    // Ready means the pool is: every topic is persisted, as a follower reads it from the store.
    let (status, topics) = get(&servers.servers[follower].url("/v1/topics"));
    assert_eq!(status, 200, "{topics}");
    assert_eq!(topics["persisted"], json!(3), "{topics}");

    let (status, table) = post(
        &servers.servers[leader].url("/v1/tables"),
        &json!({"name": "logs", "regions": 3, "id": "logs-1"}),
    );
    assert_eq!(status, 200, "{table}");
    let regions = table["regions"].as_array().cloned().unwrap_or_default();
    assert_eq!(regions.len(), 3, "{table}");
    for region in &regions {
        let wal_options = region["wal_options"].as_str().unwrap_or_default();
        assert!(
            wal_options.contains("\"wal.provider\":\"kafka\"") && wal_options.contains(&prefix),
            "{region}"
        );
    }
    let metrics = crate::cluster::get_text(&servers.servers[leader].url("/metrics"));
    let per_topic: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("walctl_topic_regions{") && l.contains(&prefix))
        .collect();
    assert_eq!(per_topic.len(), 3, "{metrics}");
    assert!(
        per_topic.iter().all(|l| l.ends_with(" 1")),
        "3 regions over 3 topics: {per_topic:?}"
    );
    assert!(
        metrics.contains("walctl_procedures{type=\"remote_wal::CreateTable\",state=\"done\"} 1"),
        "{metrics}"
    );
    let (status, bootstrap) = post(&servers.servers[leader].url("/v1/bootstrap"), &json!({}));
    assert_eq!(status, 200, "{bootstrap}");
    assert_eq!(bootstrap["ready"], json!(true), "{bootstrap}");
    let (status, refused) = post(&servers.servers[follower].url("/v1/bootstrap"), &json!({}));
    assert_eq!(status, 503, "{refused}");
}
