//! etcd members failing under loaded servers, through a fault proxy (`tests/support/fault_proxy.rs`) in front of
//! each member for each server, so a test can blackhole one member for everyone or cut one server off:
//!
//! - a member blackholed (accepts, never answers), then another killed, under a client creating tables: the leader
//!   keeps its term (same epoch; no other server ever ready), no create-table gets a final error, no procedure ends
//!   failed;
//! - the member every server prefers answering 1.5 s late, then another member closing every connection, under the
//!   same client: the same checks, and tables are created during each phase;
//! - etcd's raft leader killed under the same client, with a lease that outlasts etcd's own election: the same
//!   checks;
//! - the leader cut off from every member: it steps down before any other server is ready, one that reaches etcd
//!   leads with a larger epoch, and once healed the old leader rejoins as a follower. A client creating tables with
//!   its ids throughout gets each table exactly once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cluster::{
    EtcdCluster, LEASE_TTL_SECS, PATIENCE, Servers, election_keys, get, metadata_keys, post,
    raft_leader, services, unique,
};
use crate::fault_proxy::{Fault, FaultProxy};

/// Three servers on a three-member etcd, server `s` reaching member `m` through `proxies[s][m]`.
struct Partitionable {
    etcd: EtcdCluster,
    proxies: Vec<Vec<FaultProxy>>,
    servers: Servers,
    prefix: String,
}

impl Partitionable {
    fn start(tag: &str) -> Self {
        Self::start_with_ttl(tag, LEASE_TTL_SECS)
    }

    /// [`Partitionable::start`] with servers of another `lease_ttl` (seconds).
    fn start_with_ttl(tag: &str, lease_ttl_secs: u64) -> Self {
        let etcd = EtcdCluster::start(tag);
        let prefix = format!("{}/", unique("part"));
        let proxies: Vec<Vec<FaultProxy>> = (0..3)
            .map(|_| {
                etcd.endpoints
                    .iter()
                    .map(|e| FaultProxy::start(e))
                    .collect()
            })
            .collect();
        let toml = |s: usize| {
            let eps: Vec<String> = proxies[s]
                .iter()
                .map(|p| format!("{:?}", p.address()))
                .collect();
            format!(
                "[metadata_store]\nbackend = \"etcd\"\nendpoints = [{}]\nkey_prefix = \"{prefix}\"\n\
                 connect_timeout = \"3s\"\nrequest_timeout = \"3s\"\nmember_timeout = \"1s\"\n\n\
                 [datanodes]\nids = [1, 2]\n\n[procedure]\nretry_delay = \"50ms\"\nmax_retry_delay = \"500ms\"\n",
                eps.join(", ")
            )
        };
        let mut servers = Servers::start(toml(0), 0);
        servers.lease_ttl_secs = lease_ttl_secs;
        for s in 0..3 {
            servers.spawn_with_toml(&toml(s));
        }
        Partitionable {
            etcd,
            proxies,
            servers,
            prefix,
        }
    }

    fn addresses(&self) -> Vec<String> {
        self.servers
            .servers
            .iter()
            .map(|s| s.address.clone())
            .collect()
    }

    /// `(address, epoch)` of the leader as server `s` reads it.
    fn leader_seen_by(&self, s: usize) -> (Option<String>, Option<u64>) {
        let (_, value) = get(&self.servers.servers[s].url("/v1/leader"));
        (
            value["leader"].as_str().map(str::to_string),
            value["epoch"].as_u64(),
        )
    }

    /// Procedures that ended failed or stall, as the leader `s` lists them.
    fn failed_or_stalled(&self, s: usize) -> Value {
        let (status, listed) =
            get(&self.servers.servers[s].url("/v1/procedures?state=failed,stalled"));
        assert_eq!(status, 200, "{listed}");
        listed
    }

    /// The tables in the store, read through the members in `alive`.
    fn tables_in_store(&self, alive: &[usize]) -> usize {
        let endpoints: Vec<String> = alive
            .iter()
            .map(|&m| self.etcd.endpoints[m].clone())
            .collect();
        let runtime = tokio::runtime::Runtime::new().expect("a runtime");
        runtime
            .block_on(metadata_keys(&endpoints, &self.prefix))
            .iter()
            .filter(|(k, _, _)| k.contains("__table_name/"))
            .count()
    }
}

/// What the client saw.
#[derive(Debug, Default)]
pub struct Load {
    /// Tables created: (name, table id).
    pub created: Vec<(String, u64)>,
    /// Answers a client may not retry (a final error for work that may still finish), with the request.
    pub final_errors: Vec<String>,
    /// Answers retried (no answer, 503, retryable 500).
    pub retried: usize,
}

/// A client creating tables one after another through whichever server leads, each with an id of its own, retrying
/// an id until it gets 200, and recording every answer it could not retry.
pub fn load(addresses: Vec<String>, tag: &'static str, stop: Arc<AtomicBool>) -> JoinHandle<Load> {
    std::thread::spawn(move || {
        let mut seen = Load::default();
        let mut leader = 0usize;
        let mut hint: Option<String> = None;
        for n in 0.. {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let name = format!("{tag}_{n}");
            let body =
                json!({"name": name, "regions": 2, "id": format!("{tag}-{n}"), "wait": true});
            let deadline = Instant::now() + PATIENCE;
            loop {
                let address = hint.take().unwrap_or_else(|| addresses[leader].clone());
                let (status, value) = post(&format!("http://{address}/v1/tables"), &body);
                match status {
                    200 => {
                        let id = value["table_id"].as_u64().unwrap_or(u64::MAX);
                        seen.created.push((name.clone(), id));
                        hint = Some(address);
                        break;
                    }
                    503 => {
                        seen.retried += 1;
                        hint = value["error"]["leader"].as_str().map(str::to_string);
                        if hint.is_none() {
                            leader = (leader + 1) % addresses.len();
                        }
                    }
                    0 => {
                        seen.retried += 1;
                        leader = (leader + 1) % addresses.len();
                    }
                    500 if value["error"]["retryable"].as_bool() == Some(true) => {
                        seen.retried += 1;
                        hint = Some(address);
                    }
                    _ => {
                        seen.final_errors
                            .push(format!("{name} at {address}: {status} {value}"));
                        break;
                    }
                }
                if Instant::now() > deadline {
                    seen.final_errors
                        .push(format!("{name}: no 200 within {PATIENCE:?}"));
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        seen
    })
}

/// Watches `/ready` of the servers in `others` until stopped; returns those that ever answered 200.
fn watch_ready(
    servers: &Servers,
    others: Vec<usize>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Vec<usize>> {
    let urls: Vec<(usize, String)> = others
        .iter()
        .map(|&i| (i, servers.servers[i].url("/ready")))
        .collect();
    std::thread::spawn(move || {
        let mut ready = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            for (i, url) in &urls {
                if get(url).0 == 200 && !ready.contains(i) {
                    ready.push(*i);
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        ready
    })
}

/// Keeps the client creating tables for `phase`, then returns (the client keeps going).
fn under_load_for(phase: Duration) {
    std::thread::sleep(phase);
}

#[test]
fn a_blackholed_then_a_killed_member_under_load_changes_no_leader_and_fails_no_work() {
    let cluster = Partitionable::start("prtm");
    let leader = cluster.servers.wait_for_leader(&[0, 1, 2]);
    let (address, epoch) = cluster.leader_seen_by(leader);
    assert_eq!(
        address.as_deref(),
        Some(cluster.servers.servers[leader].address.as_str())
    );
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();

    let stop = Arc::new(AtomicBool::new(false));
    let client = load(cluster.addresses(), "member_faults", stop.clone());
    let watching = watch_ready(&cluster.servers, others.clone(), stop.clone());
    under_load_for(Duration::from_secs(2));

    // Every server prefers the first member (first in its list): blackhole it for all of them.
    for s in 0..3 {
        cluster.proxies[s][0].set(Fault::Blackhole);
    }
    under_load_for(Duration::from_secs(3 * LEASE_TTL_SECS));

    // Kill -9 a member the servers may use now, not etcd's raft leader (whose loss stops lease renewals for an
    // election round, which a 2 s lease does not outlast; etcd's own behaviour, not ours).
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let raft = runtime.block_on(raft_leader(&cluster.etcd.endpoints, &[0, 1, 2]));
    let victim = [1, 2].into_iter().find(|&m| m != raft).unwrap_or(1);
    cluster.kill_member(victim);
    under_load_for(Duration::from_secs(3 * LEASE_TTL_SECS));

    stop.store(true, Ordering::Relaxed);
    let seen = client.join().expect("the client");
    let ever_ready = watching.join().expect("the watcher");
    println!(
        "member blackholed, then member {victim} killed, under load: {} tables created, {} answers retried, {} final \
         errors",
        seen.created.len(),
        seen.retried,
        seen.final_errors.len()
    );
    let alive: Vec<usize> = (0..3).filter(|&m| m != victim).collect();
    cluster.assert_nothing_changed(leader, (address, epoch), &seen, &ever_ready, &alive);
}

/// The `lease_ttl` of [`etcds_raft_leader_killed_under_load_changes_no_leader_when_the_lease_outlasts_an_etcd_election`].
const RAFT_LEADER_LEASE_TTL_SECS: u64 = 6;

/// etcd's raft leader killed with kill -9 under the same client. etcd stops renewing leases until its members elect
/// another raft leader (an election timeout, 1 s by default, and a round or two), so a term survives it only when
/// two thirds of `lease_ttl` outlast that: these servers run with `lease_ttl = "6s"` (`docs/ha.md` says which TTL
/// survives what; a run at 5 s lost its term once in CI). The leader keeps its epoch, no other server is ever ready, no create-table gets a final error
/// and no procedure ends failed: the writes caught by the election fail retryably inside the engine and are retried.
#[test]
fn etcds_raft_leader_killed_under_load_changes_no_leader_when_the_lease_outlasts_an_etcd_election()
{
    let cluster = Partitionable::start_with_ttl("prtr", RAFT_LEADER_LEASE_TTL_SECS);
    let leader = cluster.servers.wait_for_leader(&[0, 1, 2]);
    let seen_before = cluster.leader_seen_by(leader);
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();

    let stop = Arc::new(AtomicBool::new(false));
    let client = load(cluster.addresses(), "raft_leader", stop.clone());
    let watching = watch_ready(&cluster.servers, others, stop.clone());
    under_load_for(Duration::from_secs(2));

    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let victim = runtime.block_on(raft_leader(&cluster.etcd.endpoints, &[0, 1, 2]));
    cluster.kill_member(victim);
    let alive: Vec<usize> = (0..3).filter(|&m| m != victim).collect();
    // A raft leader among the members left, then two whole TTLs of load under it.
    let elected = runtime.block_on(raft_leader(&cluster.etcd.endpoints, &alive));
    assert_ne!(elected, victim);
    under_load_for(Duration::from_secs(2 * RAFT_LEADER_LEASE_TTL_SECS));

    stop.store(true, Ordering::Relaxed);
    let seen = client.join().expect("the client");
    let ever_ready = watching.join().expect("the watcher");
    println!(
        "etcd's raft leader (member {victim}) killed under load: {} tables created, {} answers retried, {} final \
         errors",
        seen.created.len(),
        seen.retried,
        seen.final_errors.len()
    );
    cluster.assert_nothing_changed(leader, seen_before, &seen, &ever_ready, &alive);
}

impl Partitionable {
    /// kill -9 of etcd member `member` (its index among the endpoints).
    fn kill_member(&self, member: usize) {
        let pid = services(&["pid", "etcd", &format!("{}-{}", self.etcd.name, member + 1)]);
        let killed = std::process::Command::new("kill")
            .args(["-KILL", &pid])
            .status()
            .expect("run kill");
        assert!(killed.success(), "kill -KILL {pid}");
    }

    /// What a single member's fault must leave as it was: no final error for the client, no other server ever
    /// ready, the leader `leader` seen with the same address and epoch as `before`, no failed or stalled procedure,
    /// some progress, and every table the client was told of in the store once (read through the members in
    /// `alive`).
    fn assert_nothing_changed(
        &self,
        leader: usize,
        before: (Option<String>, Option<u64>),
        seen: &Load,
        ever_ready: &[usize],
        alive: &[usize],
    ) {
        assert!(
            seen.final_errors.is_empty(),
            "final errors: {:?}",
            seen.final_errors
        );
        assert!(
            ever_ready.is_empty(),
            "servers {ever_ready:?} became ready: the leader changed"
        );
        assert_eq!(
            self.leader_seen_by(leader),
            before,
            "the leader changed; its log:\n{}",
            self.servers.servers[leader].log_tail()
        );
        let failed = self.failed_or_stalled(leader);
        assert_eq!(failed["matched"], json!(0), "{failed}");
        assert!(
            seen.created.len() >= 10,
            "the client made too little progress to tell: {:?}",
            seen
        );
        assert_eq!(self.tables_in_store(alive), seen.created.len());
    }
}

#[test]
fn a_leader_cut_off_from_etcd_steps_down_and_rejoins_as_a_follower_with_every_table_once() {
    let cluster = Partitionable::start("prtl");
    let old = cluster.servers.wait_for_leader(&[0, 1, 2]);
    let (_, old_epoch) = cluster.leader_seen_by(old);
    let old_epoch = old_epoch.expect("the leader's epoch");
    let others: Vec<usize> = (0..3).filter(|&i| i != old).collect();

    let stop = Arc::new(AtomicBool::new(false));
    let client = load(cluster.addresses(), "cut_off", stop.clone());
    std::thread::sleep(Duration::from_secs(2));

    let cut = Instant::now();
    for proxy in &cluster.proxies[old] {
        proxy.set(Fault::Blackhole);
    }
    // The old leader's /ready, polled on its own from the cut on (a follower's answer reads etcd for up to 1 s):
    // when was the first request sent that it answered as not ready.
    let stepped_down: Arc<Mutex<Option<Duration>>> = Arc::default();
    let polling = {
        let (url, at) = (
            cluster.servers.servers[old].url("/ready"),
            stepped_down.clone(),
        );
        std::thread::spawn(move || {
            while cut.elapsed() < PATIENCE {
                let sent = cut.elapsed();
                if get(&url).0 != 200 {
                    *at.lock().expect("the step-down time") = Some(sent);
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let (new, led_after) = loop {
        if let Some(&i) = others
            .iter()
            .find(|&&i| get(&cluster.servers.servers[i].url("/ready")).0 == 200)
        {
            break (i, cut.elapsed());
        }
        assert!(
            cut.elapsed() < PATIENCE,
            "no other server led within {PATIENCE:?}; logs:\n{}",
            others
                .iter()
                .map(|&i| cluster.servers.servers[i].log_tail())
                .collect::<Vec<_>>()
                .join("\n----\n")
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    polling.join().expect("the poller");
    let stepped_down = stepped_down
        .lock()
        .expect("the step-down time")
        .expect("the old leader stepped down");
    assert!(
        stepped_down < led_after,
        "another server was ready {led_after:?} after the cut, before the old leader stepped down ({stepped_down:?})"
    );
    let (_, new_epoch) = cluster.leader_seen_by(new);
    assert!(
        new_epoch.is_some_and(|e| e > old_epoch),
        "{new_epoch:?} after {old_epoch}"
    );
    println!(
        "leader cut off from etcd: not ready {} ms after the cut, another server ready after {} ms (lease_ttl \
         {LEASE_TTL_SECS}s)",
        stepped_down.as_millis(),
        led_after.as_millis()
    );
    std::thread::sleep(Duration::from_secs(2));

    // Healed: the old leader reads the new leader and campaigns again as a follower.
    for proxy in &cluster.proxies[old] {
        proxy.set(Fault::None);
    }
    let healed = Instant::now();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    loop {
        let (leader, epoch) = cluster.leader_seen_by(old);
        let candidates = runtime.block_on(election_keys(&cluster.etcd.endpoints, &cluster.prefix));
        if leader.as_deref() == Some(cluster.servers.servers[new].address.as_str())
            && epoch == new_epoch
            && candidates == 3
        {
            break;
        }
        assert!(
            healed.elapsed() < PATIENCE,
            "the old leader did not rejoin within {PATIENCE:?} (it reads {leader:?} at {epoch:?}; {candidates} \
             candidates); its log:\n{}",
            cluster.servers.servers[old].log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_ne!(get(&cluster.servers.servers[old].url("/ready")).0, 200);
    std::thread::sleep(Duration::from_secs(1));

    stop.store(true, Ordering::Relaxed);
    let seen = client.join().expect("the client");
    println!(
        "{} tables created across the cut and the heal, {} answers retried",
        seen.created.len(),
        seen.retried
    );
    assert!(
        seen.final_errors.is_empty(),
        "final errors: {:?}",
        seen.final_errors
    );
    let mut ids: Vec<u64> = seen.created.iter().map(|(_, id)| *id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), seen.created.len(), "a table id was given twice");
    assert_eq!(
        cluster.tables_in_store(&[0, 1, 2]),
        seen.created.len(),
        "every table the client created exists once, and no other"
    );
    let failed = cluster.failed_or_stalled(new);
    assert_eq!(failed["matched"], json!(0), "{failed}");
}

/// The member every server prefers answers late (each chunk forwarded 1.5 s late, past `member_timeout`), then,
/// healed, another member closes every connection: under a client creating tables the leader keeps its term, no
/// create-table gets a final error, no procedure ends failed, and every table is in the store once.
#[test]
fn a_slow_member_then_one_dropping_every_connection_under_load_changes_no_leader_and_fails_no_work()
{
    let cluster = Partitionable::start("prtd");
    let leader = cluster.servers.wait_for_leader(&[0, 1, 2]);
    let (address, epoch) = cluster.leader_seen_by(leader);
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();

    let stop = Arc::new(AtomicBool::new(false));
    let client = load(cluster.addresses(), "slow_member", stop.clone());
    let watching = watch_ready(&cluster.servers, others, stop.clone());
    under_load_for(Duration::from_secs(2));
    let before_faults = cluster.tables_in_store(&[0, 1, 2]);

    for s in 0..3 {
        cluster.proxies[s][0].set(Fault::Delay(Duration::from_millis(1500)));
    }
    under_load_for(Duration::from_secs(3 * LEASE_TTL_SECS));
    let while_slow = cluster.tables_in_store(&[0, 1, 2]);
    for s in 0..3 {
        cluster.proxies[s][0].set(Fault::None);
        cluster.proxies[s][1].set(Fault::Drop);
    }
    under_load_for(Duration::from_secs(3 * LEASE_TTL_SECS));
    let while_dropping = cluster.tables_in_store(&[0, 1, 2]);
    for s in 0..3 {
        cluster.proxies[s][1].set(Fault::None);
    }

    stop.store(true, Ordering::Relaxed);
    let seen = client.join().expect("the client");
    let ever_ready = watching.join().expect("the watcher");
    println!(
        "member 0 slow, then member 1 dropping connections, under load: {} tables created ({before_faults} before \
         the faults, {while_slow} after the slow phase, {while_dropping} after the dropping one), {} answers \
         retried, {} final errors",
        seen.created.len(),
        seen.retried,
        seen.final_errors.len()
    );
    cluster.assert_nothing_changed(leader, (address, epoch), &seen, &ever_ready, &[0, 1, 2]);
    // Work went on in each phase, not only around them.
    assert!(
        while_slow > before_faults,
        "no table was created while the member was slow"
    );
    assert!(
        while_dropping > while_slow,
        "no table was created while the member dropped connections"
    );
}
