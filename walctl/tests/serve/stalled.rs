//! A leader stalled past its lease (SIGSTOP, as a long GC pause would): a follower takes over, and when the old one
//! runs again it writes nothing and reports itself a follower — idle when stopped, and stopped with clients' creates
//! in flight (their procedures' next writes are refused, and the new leader finishes each accepted create once).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::cluster::{
    EtcdCluster, LEASE_TTL_SECS, PATIENCE, Servers, get, get_text, metadata_keys, post,
};

/// Waits until server `old` says it follows the leader at `new_address`.
fn wait_until_it_follows(servers: &Servers, old: usize, new_address: &str) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (status, body) = get(&servers.servers[old].url("/v1/leader"));
        if status == 200 && body["self"] == json!(false) && body["leader"] == json!(new_address) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the old leader still says {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

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
    wait_until_it_follows(&servers, old, &new_address);
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

/// The value of the counter `name` in a `/metrics` text (0 when absent).
fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_leader_stopped_with_creates_in_flight_writes_nothing_of_them_when_it_resumes() {
    let etcd = EtcdCluster::start("srvsw");
    let servers = Servers::on_etcd(&etcd.endpoints, 3);
    let old = servers.wait_for_leader(&[0, 1, 2]);
    let url = servers.servers[old].url("/v1/tables");

    // Clients create tables with `"wait": false` as fast as the leader answers: its procedures run on after each
    // 202, so when it stops some are between two of their writes.
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..6)
        .map(|c| {
            let (stop, url) = (stop.clone(), url.clone());
            std::thread::spawn(move || {
                let mut sent = Vec::new();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let (name, id) = (format!("w{c}_{n}"), format!("w{c}-{n}"));
                    let (status, _) = post(
                        &url,
                        &json!({"name": name, "regions": 2, "id": id, "wait": false}),
                    );
                    sent.push((name, id, status));
                    n += 1;
                    if status == 0 {
                        break;
                    }
                }
                sent
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    servers.servers[old].signal("-STOP");
    let stopped_at = Instant::now();
    stop.store(true, Ordering::Relaxed);
    let others: Vec<usize> = (0..3).filter(|&i| i != old).collect();
    let new = servers.wait_for_leader(&others);
    let sent: Vec<(String, String, u16)> = clients
        .into_iter()
        .flat_map(|c| c.join().expect("a client thread"))
        .collect();
    let accepted = sent.iter().filter(|(_, _, s)| *s == 202).count();
    assert!(accepted > 0, "no create was accepted before the pause");

    // While the old leader is stopped, the new one finishes every create: the accepted ones it recovered, and the
    // ones whose answer was lost at the pause, sent again with their id as a client does. Each exists once.
    let new_url = servers.servers[new].url("/v1/tables");
    let mut table_ids: BTreeMap<String, u64> = BTreeMap::new();
    for (name, id, status) in &sent {
        if *status != 202 {
            let (status, body) = post(
                &new_url,
                &json!({"name": name, "regions": 2, "id": id, "wait": true}),
            );
            assert_eq!(status, 200, "{name} sent again: {body}");
        }
        let deadline = Instant::now() + PATIENCE;
        let table_id = loop {
            let (status, body) = get(&servers.servers[new].url(&format!("/v1/tables/{name}")));
            if status == 200 {
                break body["table_id"].as_u64().expect("table_id");
            }
            assert!(
                Instant::now() < deadline,
                "{name} (id {id}, first answer {status}) never appeared"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        table_ids.insert(name.clone(), table_id);
    }
    let distinct: BTreeSet<u64> = table_ids.values().copied().collect();
    assert_eq!(
        distinct.len(),
        table_ids.len(),
        "two names share a table id"
    );
    let pause = Duration::from_secs(3 * LEASE_TTL_SECS);
    if let Some(rest) = pause.checked_sub(stopped_at.elapsed()) {
        std::thread::sleep(rest);
    }

    let prefix = servers.metasrv_config().metadata_store.key_prefix.clone();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let before = runtime.block_on(metadata_keys(&etcd.endpoints, &prefix));
    servers.servers[old].signal("-CONT");
    let new_address = servers.servers[new].address.clone();
    wait_until_it_follows(&servers, old, &new_address);
    // Its procedures were mid-way when it stopped: on resuming it stepped down and its manager stopped them.
    let log = servers.servers[old].log_text();
    let interrupted = log
        .lines()
        .filter(|l| l.contains("the manager stopped before procedure"))
        .count();
    assert!(
        interrupted > 0,
        "no procedure was in flight at the pause:\n{}",
        servers.servers[old].log_tail()
    );
    // Two more lease periods for anything it would still write.
    std::thread::sleep(Duration::from_secs(2 * LEASE_TTL_SECS));
    let after = runtime.block_on(metadata_keys(&etcd.endpoints, &prefix));
    assert_eq!(
        before, after,
        "the metadata changed after the old leader resumed with procedures in flight"
    );
    let fenced = counter(
        &get_text(&servers.servers[old].url("/metrics")),
        "walctl_fenced_writes_total",
    );
    println!(
        "{} creates sent, {accepted} accepted before the pause, {interrupted} procedures in flight stopped on \
         resuming, {fenced} writes refused by the fence",
        sent.len()
    );
}
