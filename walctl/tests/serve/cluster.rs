//! The fixture: an etcd cluster, `walctl serve` processes, and an HTTP client that follows the API's rules.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

use crate::support::walctl_path;

/// The lease every test server takes: the shortest allowed, so failovers are quick.
pub const LEASE_TTL_SECS: u64 = 2;

/// How long a test waits for a state it expects (a leader ready, a table listed) before failing: a bound against
/// hanging, not a speed requirement.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// The services script (`scripts/services.sh`, or `REMOTE_WAL_SERVICES_SCRIPT`).
pub fn services_script() -> PathBuf {
    std::env::var_os("REMOTE_WAL_SERVICES_SCRIPT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/services.sh"))
}

/// Runs the services script; panics with its stderr when it fails (a missing etcd fails the test, never skips it).
pub fn services(args: &[&str]) -> String {
    let out = Command::new(services_script())
        .args(args)
        .output()
        .expect("run scripts/services.sh");
    assert!(
        out.status.success(),
        "services.sh {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A free loopback port (bound, then released for the server to take).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A unique name for a test's cluster and key prefix.
pub fn unique(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{tag}{}x{}", std::process::id(), nanos % 1_000_000_000)
}

/// An etcd cluster of three members, stopped on drop.
pub struct EtcdCluster {
    pub name: String,
    pub endpoints: Vec<String>,
}

impl EtcdCluster {
    pub fn start(tag: &str) -> Self {
        let name = unique(tag);
        let eps = services(&["start-etcd-cluster", &name, "3"]);
        EtcdCluster {
            endpoints: eps.split(',').map(str::to_string).collect(),
            name,
        }
    }
}

impl Drop for EtcdCluster {
    /// Stops the members and deletes their data (each test starts a fresh cluster).
    fn drop(&mut self) {
        let _ = Command::new(services_script())
            .args(["remove-etcd-cluster", &self.name, "3"])
            .output();
    }
}

/// One `walctl serve` process, killed on drop.
pub struct Server {
    pub address: String,
    pub config: PathBuf,
    pub log: PathBuf,
    child: Child,
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    /// Sends `signal` (`-KILL`, `-STOP`, `-CONT`, `-TERM`) to the process.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {} failed", self.pid());
    }

    /// Waits for the process to exit and returns its exit code.
    pub fn wait(&mut self) -> Option<i32> {
        self.child.wait().ok().and_then(|s| s.code())
    }

    /// The exit code if the process has exited (`Some(None)`: killed by a signal), else `None`.
    pub fn try_exit(&mut self) -> Option<Option<i32>> {
        self.child.try_wait().ok().flatten().map(|s| s.code())
    }

    /// Its whole log.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The end of its log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // A stopped process must run again to die; one already gone makes `kill` complain, which is fine.
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Servers sharing one config but for the address.
pub struct Servers {
    pub dir: TempDir,
    pub servers: Vec<Server>,
    pub metasrv_toml: String,
    /// More lines for the `[server]` section of servers spawned from now on.
    pub server_toml: String,
    /// The `RUST_LOG` of servers spawned from now on (`info` unless changed).
    pub rust_log: String,
    /// The `lease_ttl` of servers spawned from now on, in seconds ([`LEASE_TTL_SECS`] unless changed).
    pub lease_ttl_secs: u64,
}

impl Servers {
    /// `n` servers on etcd `endpoints` under a fresh key prefix, raft-engine WAL, datanodes 1 and 2.
    pub fn on_etcd(endpoints: &[String], n: usize) -> Self {
        Self::on_etcd_with(endpoints, "", n)
    }

    /// [`Servers::on_etcd`] with more sections (a `[wal]`) appended to the config.
    pub fn on_etcd_with(endpoints: &[String], extra_toml: &str, n: usize) -> Self {
        let (metasrv_toml, _) = Self::etcd_toml(endpoints, extra_toml);
        Self::start(metasrv_toml, n)
    }

    /// The config [`Servers::on_etcd_with`] starts servers with, and its fresh key prefix (for a test that writes
    /// into the store before any server starts).
    pub fn etcd_toml(endpoints: &[String], extra_toml: &str) -> (String, String) {
        let prefix = format!("{}/", unique("serve"));
        let eps: Vec<String> = endpoints.iter().map(|e| format!("{e:?}")).collect();
        let metasrv_toml = format!(
            "[metadata_store]\nbackend = \"etcd\"\nendpoints = [{}]\nkey_prefix = \"{prefix}\"\n\
             connect_timeout = \"3s\"\nrequest_timeout = \"3s\"\n\n[datanodes]\nids = [1, 2]\n\n\
             [procedure]\nretry_delay = \"50ms\"\nmax_retry_delay = \"500ms\"\n{extra_toml}",
            eps.join(", ")
        );
        (metasrv_toml, prefix)
    }

    /// `n` servers on one redb file.
    pub fn on_redb(n: usize) -> Self {
        let metasrv_toml = "[metadata_store]\nbackend = \"redb\"\npath = \"data/metadata.redb\"\n\n[datanodes]\nids = [1]\n".to_string();
        Self::start(metasrv_toml, n)
    }

    /// `n` servers on `metasrv_toml` (each gets its own `[server]` section).
    pub fn start(metasrv_toml: String, n: usize) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut servers = Servers {
            dir,
            servers: Vec::new(),
            metasrv_toml,
            server_toml: String::new(),
            rust_log: "info".to_string(),
            lease_ttl_secs: LEASE_TTL_SECS,
        };
        for _ in 0..n {
            servers.spawn();
        }
        servers
    }

    /// Starts one more server.
    pub fn spawn(&mut self) -> usize {
        let toml = self.metasrv_toml.clone();
        self.spawn_with_toml(&toml)
    }

    /// Starts one more server on a config of its own (e.g. other endpoints to the same store).
    pub fn spawn_with_toml(&mut self, metasrv_toml: &str) -> usize {
        let i = self.servers.len();
        let address = format!("127.0.0.1:{}", free_port());
        let config = self.dir.path().join(format!("server-{i}.toml"));
        let text = format!(
            "{metasrv_toml}\n[server]\nlisten = \"{address}\"\nlease_ttl = \"{}s\"\n{}\n",
            self.lease_ttl_secs, self.server_toml
        );
        std::fs::write(&config, text).expect("write config");
        let log = self.dir.path().join(format!("server-{i}.log"));
        let file = std::fs::File::create(&log).expect("create log");
        let err = file.try_clone().expect("clone log");
        let child = Command::new(walctl_path())
            .arg("--config")
            .arg(&config)
            .arg("serve")
            .current_dir(self.dir.path())
            .env("RUST_LOG", &self.rust_log)
            .stdout(Stdio::from(file))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("spawn walctl serve");
        self.servers.push(Server {
            address,
            config,
            log,
            child,
        });
        i
    }

    /// The config file the servers share, for a reader in the test (`[server]` left out).
    pub fn metasrv_config(&self) -> remote_wal::config::MetasrvConfig {
        remote_wal::config::MetasrvConfig::from_toml_str(&self.metasrv_toml, "test")
            .expect("test config parses")
    }

    /// Waits until exactly one server of `among` answers `/ready` 200, and returns its index.
    pub fn wait_for_leader(&self, among: &[usize]) -> usize {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let ready: Vec<usize> = among
                .iter()
                .copied()
                .filter(|&i| get(&self.servers[i].url("/ready")).0 == 200)
                .collect();
            if ready.len() == 1 {
                return ready[0];
            }
            assert!(
                ready.len() <= 1,
                "more than one server is ready at once: {ready:?}"
            );
            if Instant::now() > deadline {
                let logs: Vec<String> = among.iter().map(|&i| self.servers[i].log_tail()).collect();
                panic!(
                    "no server became ready within {PATIENCE:?}; logs:\n{}",
                    logs.join("\n----\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .new_agent()
}

/// `GET url`: the status (0 when the server does not answer) and the JSON body (`Null` if none).
pub fn get(url: &str) -> (u16, Value) {
    match agent().get(url).call() {
        Ok(mut resp) => {
            let status = resp.status().as_u16();
            (status, resp.body_mut().read_json().unwrap_or(Value::Null))
        }
        Err(_) => (0, Value::Null),
    }
}

/// `GET url` as text.
pub fn get_text(url: &str) -> String {
    match agent().get(url).call() {
        Ok(mut resp) => resp.body_mut().read_to_string().unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// `POST url` with a JSON body.
pub fn post(url: &str, body: &Value) -> (u16, Value) {
    match agent().post(url).send_json(body) {
        Ok(mut resp) => {
            let status = resp.status().as_u16();
            (status, resp.body_mut().read_json().unwrap_or(Value::Null))
        }
        Err(_) => (0, Value::Null),
    }
}

/// Creates a table through whichever server leads, the way a client should: try a server, follow a 503's leader
/// address, move on when one does not answer, and retry with the same id until a 200. Starts with `start` (the
/// leader that answered last) when given. Returns the table id and the address that answered.
pub fn create_table_following_the_leader(
    addresses: &[String],
    name: &str,
    id: &str,
    start: Option<String>,
) -> (u64, String) {
    let body = serde_json::json!({"name": name, "regions": 2, "id": id, "wait": true});
    let deadline = Instant::now() + PATIENCE;
    let mut next = 0usize;
    let mut hint: Option<String> = start;
    let mut attempts: Vec<String> = Vec::new();
    loop {
        let address = hint.take().unwrap_or_else(|| {
            next += 1;
            addresses[next % addresses.len()].clone()
        });
        let (status, value) = post(&format!("http://{address}/v1/tables"), &body);
        attempts.push(format!("{address}: {status} {value}"));
        match status {
            200 => {
                if attempts.len() > 1 {
                    let refused = attempts.iter().filter(|a| a.contains(": 503 ")).count();
                    println!(
                        "create table {name} (id {id}): 200 after {} attempts ({refused} answered 503, {} did not \
                         answer or failed retryably)",
                        attempts.len(),
                        attempts.len() - 1 - refused
                    );
                }
                let table_id = value["table_id"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("200 without a table id: {value}"));
                return (table_id, address);
            }
            503 => hint = value["error"]["leader"].as_str().map(str::to_string),
            // Not answering (killed), or an error a retry may clear: try the next server.
            0 | 500 if value["error"]["retryable"].as_bool() != Some(false) => {}
            _ => panic!(
                "create table {name} (id {id}) answered {status}: {value}; attempts:\n{}",
                attempts.join("\n")
            ),
        }
        assert!(
            Instant::now() < deadline,
            "create table {name} (id {id}) did not succeed within {PATIENCE:?}; attempts:\n{}",
            attempts.join("\n")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every key under `prefix` in etcd with its value and mod revision, the election's keys left out.
pub async fn metadata_keys(endpoints: &[String], prefix: &str) -> Vec<(String, Vec<u8>, i64)> {
    let mut client = etcd_client::Client::connect(endpoints, None)
        .await
        .expect("connect to etcd");
    let resp = client
        .get(prefix, Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .expect("read keys");
    resp.kvs()
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                kv.value().to_vec(),
                kv.mod_revision(),
            )
        })
        .filter(|(k, _, _)| !k.contains("__metasrv/election"))
        .collect()
}

/// The candidate keys of the election under `prefix` (one per server campaigning or leading).
pub async fn election_keys(endpoints: &[String], prefix: &str) -> usize {
    let mut client = etcd_client::Client::connect(endpoints, None)
        .await
        .expect("connect to etcd");
    let resp = client
        .get(
            format!("{prefix}__metasrv/election/"),
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_count_only(),
            ),
        )
        .await
        .expect("count the election keys");
    usize::try_from(resp.count()).unwrap_or(0)
}

/// The index in `endpoints` of the member that is etcd's raft leader, asking only the members in `alive`; waits
/// (up to [`PATIENCE`]) while they elect one.
pub async fn raft_leader(endpoints: &[String], alive: &[usize]) -> usize {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let mut leader = None;
        let mut members = Vec::new();
        for &i in alive {
            let Ok(mut client) = etcd_client::Client::connect([endpoints[i].as_str()], None).await
            else {
                continue;
            };
            if let Ok(status) = client.status().await {
                let member = status.header().map(|h| h.member_id()).unwrap_or(0);
                members.push((i, member));
                if status.leader() != 0 {
                    leader = Some(status.leader());
                }
            }
        }
        if let Some(found) = members
            .iter()
            .find(|(_, member)| Some(*member) == leader)
            .map(|(i, _)| *i)
        {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "no raft leader among members {alive:?} of {endpoints:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
