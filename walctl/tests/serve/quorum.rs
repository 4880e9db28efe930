//! etcd failures under the servers: one member down changes nothing; with quorum lost no server leads and writes
//! get 503; when quorum returns a leader is elected again without anyone's help.

use std::time::Instant;

use serde_json::json;

use crate::cluster::{
    EtcdCluster, PATIENCE, Servers, create_table_following_the_leader, get, post, services,
};

#[test]
fn one_member_down_is_harmless_and_a_lost_quorum_stops_writes_until_it_returns() {
    let etcd = EtcdCluster::start("srvq");
    let servers = Servers::on_etcd(&etcd.endpoints, 2);
    servers.wait_for_leader(&[0, 1]);
    let addresses: Vec<String> = servers.servers.iter().map(|s| s.address.clone()).collect();
    let member = |i: usize| format!("{}-{i}", etcd.name);

    services(&["stop", "etcd", &member(1)]);
    create_table_following_the_leader(&addresses, "one_down", "one-down", None);

    services(&["stop", "etcd", &member(2)]);
    // Quorum lost: the leader cannot prove its lease and steps down; no one can win.
    let deadline = Instant::now() + PATIENCE;
    while servers
        .servers
        .iter()
        .any(|s| get(&s.url("/ready")).0 == 200)
    {
        assert!(
            Instant::now() < deadline,
            "a server still says it is ready without a quorum"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    for server in &servers.servers {
        let (status, body) = post(
            &server.url("/v1/tables"),
            &json!({"name": "no_quorum", "regions": 1, "id": "no-quorum"}),
        );
        assert_eq!(status, 503, "{body}");
    }

    services(&["start", "etcd", &member(1)]);
    services(&["start", "etcd", &member(2)]);
    servers.wait_for_leader(&[0, 1]);
    create_table_following_the_leader(&addresses, "back", "back", None);
    // A server may still be reconnecting to a restarted member: a retryable error is retried.
    let deadline = Instant::now() + PATIENCE;
    let (status, body) = loop {
        let (status, body) = get(&servers.servers[0].url("/v1/procedures/no-quorum"));
        if status != 500 || body["error"]["retryable"] != json!(true) || Instant::now() > deadline {
            break (status, body);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(status, 404, "a refused write left a procedure: {body}");
}
