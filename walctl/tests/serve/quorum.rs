//! etcd failures under the servers: one member down changes nothing; with quorum lost the leader steps down within
//! its lease and every write gets 503; when quorum returns a leader is elected again without anyone's help.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::cluster::{
    EtcdCluster, LEASE_TTL_SECS, PATIENCE, Servers, create_table_following_the_leader, get, post,
    raft_leader, services,
};

/// How long a deposed leader may spend reading who leads for its 503 (`NOT_LEADER_LOOKUP` in the server).
const NOT_LEADER_LOOKUP: Duration = Duration::from_secs(1);
/// The servers' `request_timeout` (`Servers::etcd_toml`).
const STORE_REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// How often a write is sent to the leader while quorum is lost.
const PROBE_EVERY: Duration = Duration::from_millis(100);

/// One write sent while quorum was lost: when it was sent and answered (from the loss), and the status.
#[derive(Debug)]
struct Probe {
    id: String,
    sent: Duration,
    answered: Duration,
    status: u16,
}

#[test]
fn one_member_down_is_harmless_and_a_lost_quorum_stops_writes_within_the_lease_until_it_returns() {
    let etcd = EtcdCluster::start("srvq");
    let servers = Servers::on_etcd(&etcd.endpoints, 2);
    servers.wait_for_leader(&[0, 1]);
    let addresses: Vec<String> = servers.servers.iter().map(|s| s.address.clone()).collect();
    let member = |i: usize| format!("{}-{}", etcd.name, i + 1);
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");

    // One member down (not etcd's raft leader, which the second step takes): the service goes on.
    let raft = runtime.block_on(raft_leader(&etcd.endpoints, &[0, 1, 2]));
    let first = (raft + 1) % 3;
    services(&["stop", "etcd", &member(first)]);
    create_table_following_the_leader(&addresses, "one_down", "one-down", None);

    // Quorum lost: kill -9 the raft leader, leaving one follower. The follower acknowledges no keep-alive after
    // the kill, so by its own clock the leading server stops within two thirds of lease_ttl of it, and answers
    // every write 503 from then on (after at most NOT_LEADER_LOOKUP spent asking etcd who leads). A write it took
    // before stepping down waits for the store and fails retryably. Writes are sent every PROBE_EVERY, each on its
    // own, so one that waits does not hold back the next.
    let alive: Vec<usize> = (0..3).filter(|&i| i != first).collect();
    let second = runtime.block_on(raft_leader(&etcd.endpoints, &alive));
    let leader = servers.wait_for_leader(&[0, 1]);
    let pid = services(&["pid", "etcd", &member(second)]);
    let leader_url = servers.servers[leader].url("/v1/tables");
    let lost_at = Instant::now();
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid])
        .status()
        .expect("run kill");
    assert!(killed.success(), "kill -KILL {pid}");
    let probes: Arc<Mutex<Vec<Probe>>> = Arc::default();
    let mut senders = Vec::new();
    let mut first_503: Option<Duration> = None;
    for n in 0.. {
        let record = probes.clone();
        let url = leader_url.clone();
        senders.push(std::thread::spawn(move || {
            let id = format!("probe-{n}");
            let sent = lost_at.elapsed();
            let (status, body) = post(
                &url,
                &json!({"name": format!("probe_{n}"), "regions": 1, "id": id}),
            );
            assert_ne!(status, 200, "a write succeeded without a quorum: {body}");
            if let Ok(mut p) = record.lock() {
                p.push(Probe {
                    id,
                    sent,
                    answered: lost_at.elapsed(),
                    status,
                });
            }
        }));
        std::thread::sleep(PROBE_EVERY);
        let answered_503 = probes.lock().ok().and_then(|p| {
            p.iter()
                .filter(|p| p.status == 503)
                .map(|p| p.answered)
                .min()
        });
        first_503 = first_503.or(answered_503);
        // Keep sending for a second after the first 503: every later write must be refused the same way.
        if first_503.is_some_and(|t| lost_at.elapsed() > t + Duration::from_secs(1)) {
            break;
        }
        assert!(
            lost_at.elapsed() < PATIENCE,
            "no write got 503 within {PATIENCE:?} of losing quorum: {probes:?}"
        );
    }
    for sender in senders {
        sender.join().expect("a probe");
    }
    let probes = std::mem::take(&mut *probes.lock().expect("the probes"));
    let first_503 = first_503.expect("a 503");
    let earliest = probes
        .iter()
        .filter(|p| p.status == 503)
        .min_by_key(|p| p.sent)
        .expect("a 503");
    println!(
        "quorum lost -> writes refused with 503 from {} ms on (the first such write answered after {} ms; bound: \
         lease_ttl {LEASE_TTL_SECS}s + {} ms between writes); {} writes sent, {} answered 503",
        earliest.sent.as_millis(),
        first_503.as_millis(),
        PROBE_EVERY.as_millis(),
        probes.len(),
        probes.iter().filter(|p| p.status == 503).count()
    );
    // The design stops writing two thirds of lease_ttl after the loss. The bound is lease_ttl itself, the point
    // past which a leader still writing could be writing after etcd gave the leadership to another server (the
    // lease's final third is the design's own margin), plus the time a write may wait to be sent.
    let bound = Duration::from_secs(LEASE_TTL_SECS) + PROBE_EVERY;
    assert!(
        earliest.sent <= bound,
        "writes were still taken {:?} after quorum was lost, past lease_ttl + one interval between writes = \
         {bound:?}: {probes:?}",
        earliest.sent
    );
    for probe in &probes {
        if probe.sent >= earliest.sent {
            assert_eq!(
                probe.status, 503,
                "a write after the first refused one: {probe:?}"
            );
            // The answer waits at most NOT_LEADER_LOOKUP for etcd (which cannot answer); the rest is room for a
            // loaded machine. Without that bound it would wait for the election's 3 s call timeout.
            assert!(
                probe.answered - probe.sent < NOT_LEADER_LOOKUP + Duration::from_millis(1500),
                "a 503 took {:?}: {probe:?}",
                probe.answered - probe.sent
            );
        }
    }
    // No server leads, so no server says it is ready, and each refuses a write.
    for server in &servers.servers {
        assert_ne!(get(&server.url("/ready")).0, 200);
        let (status, body) = post(
            &server.url("/v1/tables"),
            &json!({"name": "no_quorum", "regions": 1, "id": "no-quorum"}),
        );
        assert_eq!(status, 503, "{body}");
    }

    // Reads answer at once without a quorum: from the server's memory, or 503 saying the store (or the leader)
    // cannot be read; never after waiting out the store's timeouts (3 s here), which they did before.
    for server in &servers.servers {
        for path in ["/", "/metrics", "/v1/procedures", "/v1/leader", "/ready"] {
            let sent = Instant::now();
            let (status, body) = get(&server.url(path));
            let took = sent.elapsed();
            println!(
                "without a quorum: GET {path} at {} -> {status} in {} ms",
                server.address,
                took.as_millis()
            );
            let kind = body["error"]["kind"].as_str().unwrap_or_default();
            assert!(
                status == 200
                    || (status == 503 && ["store_unavailable", "not_leader"].contains(&kind)),
                "GET {path}: {status} {body}"
            );
            assert!(
                took < STORE_REQUEST_TIMEOUT,
                "GET {path} took {took:?}: it waited for the store"
            );
        }
    }

    services(&["start", "etcd", &member(first)]);
    services(&["start", "etcd", &member(second)]);
    servers.wait_for_leader(&[0, 1]);
    create_table_following_the_leader(&addresses, "back", "back", None);
    // No refused write left a procedure behind. A server may still be reconnecting to a restarted member: a
    // retryable error is retried.
    for id in probes
        .iter()
        .map(|p| p.id.as_str())
        .chain(std::iter::once("no-quorum"))
    {
        let deadline = Instant::now() + PATIENCE;
        let (status, body) = loop {
            let (status, body) = get(&servers.servers[0].url(&format!("/v1/procedures/{id}")));
            if ![500, 503].contains(&status)
                || body["error"]["retryable"] != json!(true)
                || Instant::now() > deadline
            {
                break (status, body);
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(
            status, 404,
            "a write without a quorum left procedure {id}: {body}"
        );
    }
}
