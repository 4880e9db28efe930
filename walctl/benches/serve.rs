//! `walctl serve` failover and API latency (issue 14 item 7). Run with `ETCD_ENDPOINTS=host:port cargo bench -p
//! walctl --bench serve` (a missing etcd is an error).
//!
//! 1. Failover: three servers on etcd with `lease_ttl = 2s`; the leader is killed with SIGKILL `BENCH_KILLS`
//!    times (default 10), each time measuring kill → another server answers `GET /ready` 200, and a fresh server
//!    replaces the killed one. Reports p50 and max.
//! 2. Create-table latency: `BENCH_TABLES` (default 50) `POST /v1/tables` with `wait` on the leader, alternating
//!    with as many `Metasrv::create_table` calls (the `DdlManager` embedded in this process) on the same etcd under
//!    another key prefix. Reports both p50s and their ratio (the anchor is the embedded p50, measured in the same
//!    run), and the p50 of one read of a table name (the check the API makes before it submits).
//! 3. Bursts: `BENCH_BURST` (default 500) concurrent `POST /v1/tables` with `"wait": false` (each its own table and
//!    id), then as many with `"wait": true`, then as many creating one name under as many ids: each kind's p50 and
//!    max answer time, the answers by status, and whether the leader kept its epoch.
//! 4. etcd member faults, on a three-member cluster of the bench's own (`scripts/services.sh
//!    start-etcd-cluster`): a client creating tables one after another while a member that is not etcd's raft
//!    leader is killed with SIGKILL: the create p50 and max before and after the kill, answers that were not 200,
//!    and whether the leader kept its epoch. Then quorum is lost (the raft leader killed too): how long after it
//!    the first write is refused with 503, and how long `/`, `/metrics` and `/v1/procedures` take to answer.

mod common;

use common::{env_count, smoke};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use remote_wal::config::MetasrvConfig;
use remote_wal::metasrv::{Metasrv, parse_table_name};
use serde_json::{Value, json};

const LEASE_TTL_SECS: u64 = 2;
const PATIENCE: Duration = Duration::from_secs(60);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .new_agent()
}

fn status(agent: &ureq::Agent, url: &str) -> u16 {
    agent
        .get(url)
        .call()
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

struct Server {
    address: String,
    child: Child,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(dir: &std::path::Path, toml: &str) -> Server {
    let address = format!("127.0.0.1:{}", free_port());
    let config = dir.join(format!("server-{}.toml", address.replace([':', '.'], "_")));
    std::fs::write(
        &config,
        format!("{toml}\n[server]\nlisten = \"{address}\"\nlease_ttl = \"{LEASE_TTL_SECS}s\"\n"),
    )
    .expect("write config");
    let child = Command::new(env!("CARGO_BIN_EXE_walctl"))
        .arg("--config")
        .arg(&config)
        .arg("serve")
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn walctl serve");
    Server { address, child }
}

/// The index of the one server answering `/ready` 200.
fn leader(agent: &ureq::Agent, servers: &[Server]) -> usize {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let ready: Vec<usize> = (0..servers.len())
            .filter(|&i| status(agent, &format!("http://{}/ready", servers[i].address)) == 200)
            .collect();
        if ready.len() == 1 {
            return ready[0];
        }
        assert!(Instant::now() < deadline, "no leader within {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn toml(endpoints: &str, prefix: &str) -> String {
    let eps: Vec<String> = endpoints
        .split(',')
        .map(|e| format!("{:?}", e.trim()))
        .collect();
    format!(
        "[metadata_store]\nbackend = \"etcd\"\nendpoints = [{}]\nkey_prefix = \"{prefix}\"\n\n[datanodes]\nids = [1, 2]\n",
        eps.join(", ")
    )
}

fn main() {
    let endpoints = std::env::var("ETCD_ENDPOINTS")
        .expect("ETCD_ENDPOINTS is not set: the bench needs an etcd (e.g. 127.0.0.1:2379)");
    let kills = env_count("BENCH_KILLS", if smoke() { 1 } else { 10 });
    let tables = env_count("BENCH_TABLES", if smoke() { 2 } else { 50 });
    let run = format!(
        "bench_serve_{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0)
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let served = toml(&endpoints, &format!("{run}/served/"));
    let agent = agent();

    let mut servers: Vec<Server> = (0..3).map(|_| spawn(dir.path(), &served)).collect();
    let mut failovers = Vec::new();
    for _ in 0..kills {
        let current = leader(&agent, &servers);
        let mut killed = servers.remove(current);
        let _ = killed.child.kill();
        let killed_at = Instant::now();
        let _ = killed.child.wait();
        leader(&agent, &servers);
        failovers.push(killed_at.elapsed());
        servers.push(spawn(dir.path(), &served));
    }
    let max = failovers.iter().max().copied().unwrap_or_default();
    println!(
        "failover (SIGKILL -> another server answers /ready 200) over {kills} kills, lease_ttl = {LEASE_TTL_SECS}s: \
         p50 {}, max {}",
        ms(p50(failovers.clone())),
        ms(max)
    );

    // The two paths alternate, one call each in turn, so that a change of the machine's load during the run
    // weighs on both alike.
    let current = leader(&agent, &servers);
    let url = format!("http://{}/v1/tables", servers[current].address);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let config =
        MetasrvConfig::from_toml_str(&toml(&endpoints, &format!("{run}/embedded/")), "bench")
            .expect("the bench config");
    let metasrv = runtime.block_on(async {
        let metasrv = Metasrv::new(config).await.expect("open the metasrv");
        metasrv.start().await.expect("start the metasrv");
        metasrv
    });
    let (mut api, mut embedded, mut name_reads) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..tables {
        let body = json!({"name": format!("api_{i}"), "regions": 2, "id": format!("api-{i}"), "wait": true});
        let started = Instant::now();
        let mut response = agent.post(&url).send_json(&body).expect("POST /v1/tables");
        let took = started.elapsed();
        let status = response.status().as_u16();
        let value: Value = response.body_mut().read_json().unwrap_or(Value::Null);
        assert_eq!(status, 200, "{value}");
        api.push(took);

        let name = parse_table_name(&format!("embedded_{i}")).expect("a table name");
        runtime.block_on(async {
            // What the API does before it submits (to answer 409 for an existing table): one read of the name.
            let started = Instant::now();
            let existing = metasrv.table_id(&name).await.expect("read the table name");
            name_reads.push(started.elapsed());
            assert_eq!(existing, None);
            let started = Instant::now();
            metasrv
                .create_table(name, 2, false)
                .await
                .expect("create table");
            embedded.push(started.elapsed());
        });
    }
    runtime.block_on(metasrv.stop()).expect("stop the metasrv");
    let (api_p50, embedded_p50) = (p50(api), p50(embedded));
    println!(
        "create-table latency over {tables} tables of 2 regions, alternating: API (POST /v1/tables, wait) p50 {}, \
         embedded DdlManager p50 {}, ratio {:.2}x (one read of a table name, which the API makes before it \
         submits: p50 {})",
        ms(api_p50),
        ms(embedded_p50),
        api_p50.as_secs_f64() / embedded_p50.as_secs_f64(),
        ms(p50(name_reads))
    );
    bursts(
        &agent,
        &servers,
        env_count("BENCH_BURST", if smoke() { 10 } else { 500 }),
    );
    drop(servers);
    member_faults(&agent, dir.path(), &run);
}

/// The `/v1/leader` epoch as server `i` reads it.
fn epoch(agent: &ureq::Agent, server: &Server) -> Option<u64> {
    agent
        .get(format!("http://{}/v1/leader", server.address))
        .call()
        .ok()
        .and_then(|mut r| r.body_mut().read_json::<Value>().ok())
        .and_then(|v| v["epoch"].as_u64())
}

fn max(v: &[Duration]) -> Duration {
    v.iter().max().copied().unwrap_or_default()
}

/// Sends `bodies` to `url` all at once, one thread each; returns each answer's status and time.
fn all_at_once(url: &str, bodies: Vec<Value>) -> Vec<(u16, Duration)> {
    let barrier = Arc::new(std::sync::Barrier::new(bodies.len()));
    let threads: Vec<_> = bodies
        .into_iter()
        .map(|body| {
            let (url, barrier) = (url.to_string(), barrier.clone());
            std::thread::spawn(move || {
                let agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(Some(PATIENCE))
                    .build()
                    .new_agent();
                barrier.wait();
                let started = Instant::now();
                let status = agent
                    .post(&url)
                    .send_json(&body)
                    .map(|r| r.status().as_u16())
                    .unwrap_or(0);
                (status, started.elapsed())
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().expect("a client thread"))
        .collect()
}

fn by_status(answers: &[(u16, Duration)]) -> String {
    let mut counts = std::collections::BTreeMap::new();
    for (status, _) in answers {
        *counts.entry(*status).or_insert(0usize) += 1;
    }
    counts
        .iter()
        .map(|(s, n)| format!("{n}x{s}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn bursts(agent: &ureq::Agent, servers: &[Server], n: usize) {
    let current = leader(agent, servers);
    let before = epoch(agent, &servers[current]);
    let url = format!("http://{}/v1/tables", servers[current].address);
    for (kind, bodies) in [
        (
            "wait: false",
            (0..n)
                .map(|i| json!({"name": format!("burst_nowait_{i}"), "regions": 1, "id": format!("burst-nowait-{i}"), "wait": false}))
                .collect::<Vec<_>>(),
        ),
        (
            "wait: true",
            (0..n)
                .map(|i| json!({"name": format!("burst_wait_{i}"), "regions": 1, "id": format!("burst-wait-{i}"), "wait": true}))
                .collect(),
        ),
        (
            "one name, many ids",
            (0..n)
                .map(|i| json!({"name": "burst_same", "regions": 1, "id": format!("burst-same-{i}"), "wait": true}))
                .collect(),
        ),
    ] {
        let answers = all_at_once(&url, bodies);
        let times: Vec<Duration> = answers.iter().map(|(_, t)| *t).collect();
        println!(
            "burst of {n} creates ({kind}): p50 {}, max {}; answers {}",
            ms(p50(times.clone())),
            ms(max(&times)),
            by_status(&answers)
        );
    }
    let after = epoch(agent, &servers[current]);
    println!(
        "after the bursts the leader {} its epoch ({before:?} -> {after:?})",
        if before == after && before.is_some() {
            "kept"
        } else {
            "did not keep"
        }
    );
}

fn services(args: &[&str]) -> String {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/services.sh");
    let out = Command::new(script)
        .args(args)
        .output()
        .expect("run scripts/services.sh");
    assert!(
        out.status.success(),
        "services.sh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The index of etcd's raft leader among `endpoints` (asking each member's status over HTTP).
fn raft_leader(agent: &ureq::Agent, endpoints: &[String]) -> usize {
    let deadline = Instant::now() + PATIENCE;
    loop {
        for (i, e) in endpoints.iter().enumerate() {
            // etcd's /metrics says whether this member is the leader.
            let text = agent
                .get(format!("http://{e}/metrics"))
                .call()
                .ok()
                .and_then(|mut r| r.body_mut().read_to_string().ok())
                .unwrap_or_default();
            if text.lines().any(|l| l.trim() == "etcd_server_is_leader 1") {
                return i;
            }
        }
        assert!(Instant::now() < deadline, "no raft leader");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn member_faults(agent: &ureq::Agent, dir: &std::path::Path, run: &str) {
    let name = format!("bsf{}", std::process::id());
    let endpoints: Vec<String> = services(&["start-etcd-cluster", &name, "3"])
        .split(',')
        .map(str::to_string)
        .collect();
    let served = toml(&endpoints.join(","), &format!("{run}/faults/"));
    let servers: Vec<Server> = (0..3).map(|_| spawn(dir, &served)).collect();
    let current = leader(agent, &servers);
    let before = epoch(agent, &servers[current]);
    let url = format!("http://{}/v1/tables", servers[current].address);
    let stop = Arc::new(AtomicBool::new(false));
    let killed_at: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
    let client = {
        let (url, stop, killed_at) = (url.clone(), stop.clone(), killed_at.clone());
        std::thread::spawn(move || {
            let agent = agent_for_client();
            let (mut before, mut after, mut not_ok) = (Vec::new(), Vec::new(), 0usize);
            for i in 0.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let body = json!({"name": format!("member_{i}"), "regions": 2, "id": format!("member-{i}"), "wait": true});
                let started = Instant::now();
                let status = agent
                    .post(&url)
                    .send_json(&body)
                    .map(|r| r.status().as_u16())
                    .unwrap_or(0);
                let took = started.elapsed();
                if status != 200 {
                    not_ok += 1;
                }
                if killed_at.lock().map(|k| k.is_some()).unwrap_or(false) {
                    after.push(took);
                } else {
                    before.push(took);
                }
            }
            (before, after, not_ok)
        })
    };
    std::thread::sleep(Duration::from_secs(3));
    let raft = raft_leader(agent, &endpoints);
    let victim = (raft + 1) % 3;
    let member = format!("{name}-{}", victim + 1);
    let pid = services(&["pid", "etcd", &member]);
    let _ = Command::new("kill").args(["-KILL", &pid]).status();
    if let Ok(mut k) = killed_at.lock() {
        *k = Some(Instant::now());
    }
    std::thread::sleep(Duration::from_secs(5));
    stop.store(true, Ordering::Relaxed);
    let (pre, post, not_ok) = client.join().expect("the client");
    let after_epoch = epoch(agent, &servers[current]);
    println!(
        "etcd member killed under load (not the raft leader): create p50 {} / max {} before ({} tables), p50 {} / \
         max {} after ({} tables); {not_ok} answers not 200; the leader {} its epoch",
        ms(p50(pre.clone())),
        ms(max(&pre)),
        pre.len(),
        ms(p50(post.clone())),
        ms(max(&post)),
        post.len(),
        if before == after_epoch {
            "kept"
        } else {
            "did not keep"
        }
    );

    // Quorum lost: kill the raft leader too; writes every 100 ms until the first 503.
    let alive: Vec<String> = (0..3)
        .filter(|&i| i != victim)
        .map(|i| endpoints[i].clone())
        .collect();
    let raft = raft_leader(agent, &alive);
    let raft_index = endpoints
        .iter()
        .position(|e| *e == alive[raft])
        .unwrap_or(0);
    let pid = services(&["pid", "etcd", &format!("{name}-{}", raft_index + 1)]);
    let _ = Command::new("kill").args(["-KILL", &pid]).status();
    let lost = Instant::now();
    let mut refused_after = None;
    for i in 0..200 {
        let sent = lost.elapsed();
        let status = agent
            .post(&url)
            .send_json(json!({"name": format!("noquorum_{i}"), "regions": 1, "id": format!("noquorum-{i}")}))
            .map(|r| r.status().as_u16())
            .unwrap_or(0);
        if status == 503 {
            refused_after = Some(sent);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let address = &servers[current].address;
    let reads: Vec<String> = ["/", "/metrics", "/v1/procedures", "/v1/leader"]
        .iter()
        .map(|path| {
            let started = Instant::now();
            let status = status(agent, &format!("http://{address}{path}"));
            format!("{path} {status} in {}", ms(started.elapsed()))
        })
        .collect();
    println!(
        "quorum lost: the first write refused with 503 was sent {} after the loss (lease_ttl {LEASE_TTL_SECS}s); \
         reads then: {}",
        refused_after.map(ms).unwrap_or_else(|| "never".to_string()),
        reads.join(", ")
    );
    drop(servers);
    services(&["remove-etcd-cluster", &name, "3"]);
}

fn agent_for_client() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(PATIENCE))
        .build()
        .new_agent()
}
