//! etcd failures under the servers: one member down changes nothing; with quorum lost the leader steps down and
//! every write gets 503; when quorum returns a leader is elected again without anyone's help.
//!
//! How soon the leader steps down and how fast each answer comes are figures, not assertions here: `cargo bench -p
//! walctl --bench serve` measures them (its quorum-loss case). This test asserts what does not depend on the
//! machine's speed: no write is applied without a quorum, every write after the first refusal is refused as "not
//! the leader" (an answer bounded by construction: the lookup of the leader it names runs under a timeout), reads
//! answer without waiting for the store (whose timeout is set far above any scheduling delay, so a read that
//! waited for it would be seen), and no refused write leaves a procedure behind.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::cluster::{
    EtcdCluster, LEASE_TTL_SECS, PATIENCE, Servers, create_table_following_the_leader, get, post,
    raft_leader, services,
};

/// The servers' `request_timeout` here: a read or refusal that waited for the store would take this long.
const STORE_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a write is sent to the leader while quorum is lost.
const PROBE_EVERY: Duration = Duration::from_millis(100);

/// One write sent while quorum was lost: when it was sent and answered (from the loss), and the status.
#[derive(Debug)]
struct Probe {
    id: String,
    sent: Duration,
    answered: Duration,
    status: u16,
    /// The error's kind, from the answer's body.
    kind: String,
}

#[test]
fn one_member_down_is_harmless_and_a_lost_quorum_refuses_every_write_until_it_returns() {
    let etcd = EtcdCluster::start("srvq");
    let (toml, _) = Servers::etcd_toml(&etcd.endpoints, "");
    let slow_store = format!("request_timeout = \"{}s\"", STORE_REQUEST_TIMEOUT.as_secs());
    let toml = toml.replace("request_timeout = \"3s\"", &slow_store);
    assert!(toml.contains(&slow_store), "{toml}");
    let servers = Servers::start(toml, 2);
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
    // the kill, so the leading server's fence holds nothing two thirds of lease_ttl after the last acknowledged one,
    // and it answers every write 503 once it has stepped down. A write it took before that waits for the store and
    // fails. Writes are sent every PROBE_EVERY, each on its own, so one that waits does not hold back the next.
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
                    kind: body["error"]["kind"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
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
        "quorum lost -> writes refused with 503 from {} ms on (the first such write answered after {} ms; \
         lease_ttl {LEASE_TTL_SECS}s, a write every {} ms); {} writes sent, {} answered 503",
        earliest.sent.as_millis(),
        first_503.as_millis(),
        PROBE_EVERY.as_millis(),
        probes.len(),
        probes.iter().filter(|p| p.status == 503).count()
    );
    // From the first refusal on, every write is refused: by the manager the term's loss stopped ("not_ready", a
    // write taken just before), or as "not the leader" once the server stepped down, as the last one was (sent a
    // second after the first refusal was answered).
    for probe in &probes {
        if probe.sent >= earliest.sent {
            assert!(
                probe.status == 503 && ["not_leader", "not_ready"].contains(&probe.kind.as_str()),
                "a write after the first refused one: {probe:?}"
            );
        }
    }
    let last = probes.iter().max_by_key(|p| p.sent).expect("a probe");
    assert_eq!(
        (last.status, last.kind.as_str()),
        (503, "not_leader"),
        "the leader did not step down: {last:?}"
    );
    // No server leads, so no server says it is ready, and each refuses a write.
    for server in &servers.servers {
        assert_ne!(get(&server.url("/ready")).0, 200);
        let (status, body) = post(
            &server.url("/v1/tables"),
            &json!({"name": "no_quorum", "regions": 1, "id": "no-quorum"}),
        );
        assert_eq!(status, 503, "{body}");
    }

    // Reads answer without a quorum: from the server's memory, or 503 saying the store (or the leader) cannot be
    // read; never after waiting out the store's timeout (30 s here), which they did before.
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
