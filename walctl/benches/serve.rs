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

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use remote_wal::config::MetasrvConfig;
use remote_wal::metasrv::{Metasrv, parse_table_name};
use serde_json::{Value, json};

const LEASE_TTL_SECS: u64 = 2;
const PATIENCE: Duration = Duration::from_secs(60);

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

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
    let kills = env_count("BENCH_KILLS", 10);
    let tables = env_count("BENCH_TABLES", 50);
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
    drop(servers);
}
