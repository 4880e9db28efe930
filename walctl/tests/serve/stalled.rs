//! A leader stalled past its lease (SIGSTOP, as a long GC pause would): a follower takes over, and when the old one
//! runs again it writes nothing and reports itself a follower.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::cluster::{
    EtcdCluster, LEASE_TTL_SECS, PATIENCE, Servers, get, get_text, metadata_keys, post,
};

#[test]
fn a_leader_stopped_past_its_lease_is_replaced_and_writes_nothing_when_it_resumes() {
    let etcd = EtcdCluster::start("srvst");
    let servers = Servers::on_etcd(&etcd.endpoints, 3);
    let old = servers.wait_for_leader(&[0, 1, 2]);
    let (status, body) = post(
        &servers.servers[old].url("/v1/tables"),
        &json!({"name": "before", "regions": 2, "id": "before"}),
    );
    assert_eq!(status, 200, "{body}");

    servers.servers[old].signal("-STOP");
    let stopped_at = Instant::now();
    let others: Vec<usize> = (0..3).filter(|&i| i != old).collect();
    let new = servers.wait_for_leader(&others);
    let new_address = servers.servers[new].address.clone();
    let (status, body) = post(
        &servers.servers[new].url("/v1/tables"),
        &json!({"name": "after", "regions": 2, "id": "after"}),
    );
    assert_eq!(status, 200, "{body}");
    // Stay stopped for three lease periods in all.
    let pause = Duration::from_secs(3 * LEASE_TTL_SECS);
    if let Some(rest) = pause.checked_sub(stopped_at.elapsed()) {
        std::thread::sleep(rest);
    }

    let prefix = servers.metasrv_config().metadata_store.key_prefix.clone();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let before = runtime.block_on(metadata_keys(&etcd.endpoints, &prefix));
    servers.servers[old].signal("-CONT");

    // The old leader notices and says it follows.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (status, body) = get(&servers.servers[old].url("/v1/leader"));
        if status == 200 && body["self"] == json!(false) && body["leader"] == json!(new_address) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the old leader still says {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(get(&servers.servers[old].url("/ready")).0, 503);
    let (status, body) = post(
        &servers.servers[old].url("/v1/tables"),
        &json!({"name": "late", "regions": 1}),
    );
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["leader"], json!(new_address), "{body}");
    // Give it two more lease periods to write anything it still would.
    std::thread::sleep(Duration::from_secs(2 * LEASE_TTL_SECS));

    // Nothing outside the election's keys changed since it resumed (same keys, values and mod revisions).
    let after = runtime.block_on(metadata_keys(&etcd.endpoints, &prefix));
    assert_eq!(
        before, after,
        "the metadata changed after the old leader resumed"
    );
    let metrics = get_text(&servers.servers[old].url("/metrics"));
    assert!(
        metrics.contains("walctl_elections_lost_total 1"),
        "{metrics}"
    );
    assert!(metrics.contains("walctl_leader 0"), "{metrics}");
    assert_eq!(get(&servers.servers[new].url("/ready")).0, 200);
}
