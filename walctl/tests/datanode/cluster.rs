//! The fixture: one `walctl serve` and `walctl datanode` processes on a fresh etcd key prefix and a fresh Kafka
//! topic pool, a 300 ms heartbeat (leases of 1.9 s), and the checks on an ack log against region dumps.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

use crate::support::{endpoints, json_lines, toml_list, unique, walctl_path};

/// How long a test waits for a state it expects before failing: a bound against hanging, not a speed goal.
pub const PATIENCE: Duration = Duration::from_secs(90);

/// The datanodes' heartbeat interval.
pub const HEARTBEAT_MS: u64 = 300;

/// Their lease: 3 intervals + 1 s.
pub const LEASE: Duration = Duration::from_millis(3 * HEARTBEAT_MS + 1000);

/// Milliseconds since the Unix epoch now (the clock of the ack log's `at_ms`).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// When each acknowledgement of an ack log arrived (`at_ms`), per region, in the log's order.
pub fn ack_times(ack_log: &Path) -> BTreeMap<u64, Vec<u64>> {
    let text = std::fs::read_to_string(ack_log).expect("read the ack log");
    let mut times: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for line in json_lines(&text) {
        times
            .entry(line["region_id"].as_u64().expect("region_id"))
            .or_default()
            .push(line["at_ms"].as_u64().expect("at_ms"));
    }
    times
}

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A child process, killed on drop.
pub struct Process {
    pub name: String,
    pub log: PathBuf,
    child: Child,
}

impl Process {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (`-KILL`, `-STOP`, `-CONT`).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {} failed", self.name);
    }

    /// kill -9 and reap.
    pub fn kill9(&mut self) {
        self.signal("-KILL");
        let _ = self.child.wait();
    }

    /// The exit status once it has exited.
    pub fn try_exit(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_tail(&self) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        format!(
            "---- {} ----\n{}",
            self.name,
            lines[lines.len().saturating_sub(25)..].join("\n")
        )
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One metasrv and its datanodes.
pub struct Cluster {
    pub dir: TempDir,
    pub metasrv_toml: String,
    pub serve_address: String,
    pub serve: Option<Process>,
    /// More `walctl serve` processes on the same store, each at its address, campaigning for the lead: the
    /// datanodes know them all.
    pub standby: Vec<(String, Process)>,
    pub datanodes: BTreeMap<u64, Process>,
    /// The listen address of each datanode id (kept across restarts unless a test moves it).
    pub addresses: HashMap<u64, String>,
    /// The heartbeat interval datanodes started from now on are given.
    pub heartbeat_ms: u64,
    /// Lines appended to every datanode's `[datanode]` section (set before starting them).
    pub datanode_extra: String,
    /// Processes killed and replaced, kept for their logs.
    pub dead: Vec<Process>,
    spawned: usize,
}

impl Cluster {
    /// A cluster with datanodes `ids` (each started), a pool of `topics` Kafka topics and `extra_wal` appended to
    /// the `[wal]` section.
    pub fn start(ids: &[u64], topics: usize, extra_wal: &str) -> Self {
        Self::start_with_heartbeat(ids, topics, extra_wal, HEARTBEAT_MS)
    }

    /// [`Cluster::start`] with datanodes heartbeating every `heartbeat_ms`.
    pub fn start_with_heartbeat(
        ids: &[u64],
        topics: usize,
        extra_wal: &str,
        heartbeat_ms: u64,
    ) -> Self {
        let mut cluster = Self::metasrv_only(ids, topics, extra_wal);
        cluster.heartbeat_ms = heartbeat_ms;
        for id in ids {
            cluster.start_datanode(*id);
        }
        cluster
    }

    /// The same cluster's metasrv (ready), with no datanode started: `[datanodes] ids` still names `ids`.
    pub fn metasrv_only(ids: &[u64], topics: usize, extra_wal: &str) -> Self {
        Self::metasrv_on(&endpoints("ETCD_ENDPOINTS"), ids, topics, extra_wal)
    }

    /// [`Cluster::metasrv_only`] with its metadata in the etcd of `etcd`.
    pub fn metasrv_on(etcd: &[String], ids: &[u64], topics: usize, extra_wal: &str) -> Self {
        let kafka = endpoints("KAFKA_ENDPOINTS");
        let prefix = unique("dnwal");
        let ids_text: Vec<String> = ids.iter().map(u64::to_string).collect();
        let metasrv_toml = format!(
            r#"[metadata_store]
backend = "etcd"
endpoints = {etcd}
key_prefix = "{ns}/"
connect_timeout = "3s"
request_timeout = "3s"

[wal]
provider = "kafka"
broker_endpoints = {kafka}
num_topics = {topics}
topic_name_prefix = "{prefix}"
create_topic_timeout = "30s"
{extra_wal}

[wal.backoff]
deadline = "20s"

[datanodes]
ids = [{ids}]

[procedure]
retry_delay = "50ms"
max_retry_delay = "500ms"
"#,
            etcd = toml_list(etcd),
            kafka = toml_list(&kafka),
            ns = unique("dn"),
            ids = ids_text.join(", "),
        );
        let mut cluster = Cluster {
            dir: tempfile::tempdir().expect("temp dir"),
            metasrv_toml,
            serve_address: format!("127.0.0.1:{}", free_port()),
            serve: None,
            standby: Vec::new(),
            datanodes: BTreeMap::new(),
            addresses: HashMap::new(),
            heartbeat_ms: HEARTBEAT_MS,
            datanode_extra: String::new(),
            dead: Vec::new(),
            spawned: 0,
        };
        cluster.start_serve();
        cluster.wait_ready();
        cluster
    }

    fn spawn(&mut self, name: &str, config: &Path, command: &str) -> Process {
        self.spawned += 1;
        let log = self.dir.path().join(format!("{name}-{}.log", self.spawned));
        let file = std::fs::File::create(&log).expect("create log");
        let err = file.try_clone().expect("clone log");
        let child = Command::new(walctl_path())
            .arg("--config")
            .arg(config)
            .arg(command)
            .current_dir(self.dir.path())
            .env("RUST_LOG", "info")
            .stdout(Stdio::from(file))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("spawn walctl");
        Process {
            name: name.to_string(),
            log,
            child,
        }
    }

    /// The config of `walctl serve` (also what the CLI commands of the test use).
    pub fn serve_config(&self) -> PathBuf {
        self.serve_config_at(&self.serve_address)
    }

    /// The config of a `walctl serve` listening at `address`.
    pub fn serve_config_at(&self, address: &str) -> PathBuf {
        let path = self
            .dir
            .path()
            .join(format!("serve-{}.toml", address.replace(':', "_")));
        if !path.exists() {
            let text = format!(
                "{}\n[server]\nlisten = \"{address}\"\nlease_ttl = \"2s\"\n",
                self.metasrv_toml
            );
            std::fs::write(&path, text).expect("write serve config");
        }
        path
    }

    /// Every server's address, the one the tests talk to first.
    pub fn serve_addresses(&self) -> Vec<String> {
        std::iter::once(self.serve_address.clone())
            .chain(self.standby.iter().map(|(address, _)| address.clone()))
            .collect()
    }

    /// Starts `n` more servers on the same store (before the datanodes start, so they know them).
    pub fn start_standby(&mut self, n: usize) {
        for _ in 0..n {
            let address = format!("127.0.0.1:{}", free_port());
            let config = self.serve_config_at(&address);
            let process = self.spawn("standby", &config, "serve");
            self.standby.push((address, process));
        }
    }

    /// kill -9 of the server the tests talk to; the tests then talk to the standby that leads next (ready).
    pub fn kill_leading_serve(&mut self) {
        self.serve.as_mut().expect("serve runs").kill9();
        let mut successor = None;
        self.wait_for("a standby server to lead", || {
            successor = self
                .standby
                .iter()
                .position(|(address, _)| get(&format!("http://{address}/ready")).0 == 200);
            successor.is_some()
        });
        let (address, process) = self.standby.remove(successor.expect("a successor"));
        let killed = self.serve.replace(process).expect("the killed server");
        self.dead.push(killed);
        self.serve_address = address;
    }

    /// The config of datanode `id` (its `[datanode]` section at `address`).
    pub fn datanode_config(&self, id: u64, address: &str) -> PathBuf {
        let path = self
            .dir
            .path()
            .join(format!("datanode-{id}-{}.toml", address.replace(':', "_")));
        let text = format!(
            "{}\n[datanode]\nid = {id}\nlisten = \"{address}\"\nmetasrv = {}\nregion_storage = \"{}\"\n\
             heartbeat_interval = \"{}ms\"\n{}\n",
            self.metasrv_toml,
            toml_list(&self.serve_addresses()),
            self.region_storage().display(),
            self.heartbeat_ms,
            self.datanode_extra
        );
        std::fs::write(&path, text).expect("write datanode config");
        path
    }

    pub fn start_serve(&mut self) {
        let config = self.serve_config();
        let process = self.spawn("serve", &config, "serve");
        self.serve = Some(process);
    }

    /// Waits until the server answers `/ready` 200.
    pub fn wait_ready(&self) {
        self.wait_for("the metasrv to be ready", || {
            get(&format!("http://{}/ready", self.serve_address)).0 == 200
        });
    }

    /// Starts datanode `id` at its address (a new one the first time).
    pub fn start_datanode(&mut self, id: u64) {
        let address = self
            .addresses
            .entry(id)
            .or_insert_with(|| format!("127.0.0.1:{}", free_port()))
            .clone();
        self.start_datanode_at(id, &address);
    }

    /// Starts datanode `id` listening at `address`.
    pub fn start_datanode_at(&mut self, id: u64, address: &str) {
        let config = self.datanode_config(id, address);
        let process = self.spawn(&format!("datanode-{id}"), &config, "datanode");
        self.datanodes.insert(id, process);
    }

    /// Every log's tail, for failure messages.
    pub fn logs(&self) -> String {
        let mut out: Vec<String> = self.serve.iter().map(Process::log_tail).collect();
        out.extend(self.standby.iter().map(|(_, p)| p.log_tail()));
        out.extend(self.dead.iter().map(Process::log_tail));
        out.extend(self.datanodes.values().map(Process::log_tail));
        out.join("\n")
    }

    /// Polls `ready` every 50 ms until it holds; fails with every log after [`PATIENCE`].
    pub fn wait_for(&self, what: &str, mut ready: impl FnMut() -> bool) {
        let deadline = Instant::now() + PATIENCE;
        while !ready() {
            assert!(
                Instant::now() < deadline,
                "waited {PATIENCE:?} for {what}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `walctl --server … ARGS` (or with the serve config for `region dump`), stdout; fails the test on an error.
    pub fn walctl(&self, args: &[&str]) -> String {
        let out = Command::new(walctl_path())
            .current_dir(self.dir.path())
            .arg("--server")
            .arg(self.serve_addresses().join(","))
            .arg("--wait")
            .arg("60s")
            .args(args)
            .output()
            .expect("run walctl");
        assert!(
            out.status.success(),
            "walctl {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Creates table `name` of `regions` regions and waits until each region holds a lease.
    pub fn create_table(&self, name: &str, regions: u32) -> Vec<u64> {
        self.walctl(&["create-table", name, "--regions", &regions.to_string()]);
        let table = self.table(name);
        let ids: Vec<u64> = table["regions"]
            .as_array()
            .expect("regions")
            .iter()
            .map(|r| r["region_id"].as_u64().expect("region_id"))
            .collect();
        self.wait_for("every region of the table to hold a lease", || {
            let (_, body) = get(&format!("http://{}/v1/datanodes", self.serve_address));
            let leaders: Vec<u64> = body["datanodes"]
                .as_array()
                .map(|d| {
                    d.iter()
                        .flat_map(|n| n["regions"].as_array().cloned().unwrap_or_default())
                        .filter(|r| r["role"] == "leader")
                        .filter_map(|r| r["region_id"].as_u64())
                        .collect()
                })
                .unwrap_or_default();
            ids.iter().all(|id| leaders.contains(id))
        });
        ids
    }

    /// Every key in the cluster's etcd namespace (the namespace cut off), read from etcd directly.
    pub fn store_keys(&self) -> Vec<String> {
        let namespace = self
            .metasrv_toml
            .split("key_prefix = \"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .expect("the config names a key prefix")
            .to_string();
        let etcd = endpoints("ETCD_ENDPOINTS");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let mut client = etcd_client::Client::connect(etcd, None)
                .await
                .expect("connect to etcd");
            let found = client
                .get(
                    namespace.as_str(),
                    Some(
                        etcd_client::GetOptions::new()
                            .with_prefix()
                            .with_keys_only(),
                    ),
                )
                .await
                .expect("read etcd");
            found
                .kvs()
                .iter()
                .map(|kv| {
                    String::from_utf8_lossy(kv.key())
                        .trim_start_matches(namespace.as_str())
                        .to_string()
                })
                .collect()
        })
    }

    /// The region storage directory every datanode shares.
    pub fn region_storage(&self) -> PathBuf {
        self.dir.path().join("regions")
    }

    /// `GET /v1/tables/{name}`.
    pub fn table(&self, name: &str) -> Value {
        let (status, body) = get(&format!("http://{}/v1/tables/{name}", self.serve_address));
        assert_eq!(status, 200, "{body}");
        body
    }

    /// Starts `walctl load` on `table` for `duration` with an ack log; returns the process and the log's path.
    pub fn start_load(
        &mut self,
        table: &str,
        duration: &str,
        extra: &[&str],
    ) -> (Process, PathBuf) {
        self.spawned += 1;
        let acks = self.dir.path().join(format!("acks-{}.jsonl", self.spawned));
        let log = self.dir.path().join(format!("load-{}.log", self.spawned));
        let file = std::fs::File::create(&log).expect("create log");
        let err = std::fs::File::create(self.dir.path().join(format!("load-{}.err", self.spawned)))
            .expect("create log");
        let child = Command::new(walctl_path())
            .current_dir(self.dir.path())
            .args([
                "--server",
                &self.serve_addresses().join(","),
                "--json",
                "load",
                "--table",
                table,
            ])
            .args(["--duration", duration, "--entry-size", "64", "--batch", "8"])
            .arg("--ack-log")
            .arg(&acks)
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::from(file))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("spawn walctl load");
        (
            Process {
                name: "load".to_string(),
                log,
                child,
            },
            acks,
        )
    }

    /// Waits for a load to exit 0 and returns its report.
    pub fn finish_load(&self, load: &mut Process) -> Value {
        self.wait_for("the load to end", || load.try_exit().is_some());
        let status = load.try_exit().expect("exited");
        let text = load.log_text();
        let errors = std::fs::read_to_string(load.log.with_extension("err")).unwrap_or_default();
        assert!(
            status.success(),
            "the load failed: {text}{errors}\n{}",
            self.logs()
        );
        json_lines(&text)
            .into_iter()
            .find(|v| v.get("acknowledged").is_some())
            .unwrap_or_else(|| panic!("no load report in: {text}"))
    }

    /// `region dump --region R --json`: (entry id, sequence) of every entry.
    pub fn dump(&self, region: u64) -> Vec<(u64, u64)> {
        let out = Command::new(walctl_path())
            .current_dir(self.dir.path())
            .arg("--config")
            .arg(self.serve_config())
            .args(["--json", "region", "dump", "--region", &region.to_string()])
            .arg("--region-storage")
            .arg(self.dir.path().join("regions"))
            .output()
            .expect("run walctl region dump");
        assert!(
            out.status.success(),
            "region dump {region}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        json_lines(&String::from_utf8_lossy(&out.stdout))
            .iter()
            .map(|e| {
                (
                    e["entry_id"].as_u64().expect("entry_id"),
                    e["sequence"].as_u64().unwrap_or(0),
                )
            })
            .collect()
    }

    /// The check that matters: every acknowledged sequence of the ack log is in its region's dump exactly once,
    /// at the entry id it was acknowledged with, and a region's acknowledged sequences come in increasing order.
    /// Returns how many acknowledged entries were checked.
    pub fn assert_nothing_acknowledged_lost(&self, ack_logs: &[PathBuf]) -> usize {
        let mut acked: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
        for path in ack_logs {
            let text = std::fs::read_to_string(path).expect("read the ack log");
            for line in json_lines(&text) {
                acked
                    .entry(line["region_id"].as_u64().expect("region_id"))
                    .or_default()
                    .push((
                        line["sequence"].as_u64().expect("sequence"),
                        line["entry_id"].as_u64().expect("entry_id"),
                    ));
            }
        }
        let mut checked = 0;
        for (region, acks) in &acked {
            let dump = self.dump(*region);
            let mut positions: HashMap<u64, Vec<(usize, u64)>> = HashMap::new();
            for (i, (entry_id, sequence)) in dump.iter().enumerate() {
                positions.entry(*sequence).or_default().push((i, *entry_id));
            }
            let mut last = None;
            for (sequence, entry_id) in acks {
                let found = positions.get(sequence).cloned().unwrap_or_default();
                assert_eq!(
                    found.len(),
                    1,
                    "region {region}: acknowledged sequence {sequence} (entry id {entry_id}) is in the dump {} \
                     times\n{}",
                    found.len(),
                    self.logs()
                );
                let (position, dumped_id) = found[0];
                assert_eq!(dumped_id, *entry_id, "region {region}: sequence {sequence}");
                if let Some(previous) = last {
                    assert!(
                        position > previous,
                        "region {region}: sequence {sequence} is out of order in the dump"
                    );
                }
                last = Some(position);
                checked += 1;
            }
        }
        checked
    }

    /// The datanode each region of `table` is routed to, by region id.
    pub fn placement(&self, table: &str) -> BTreeMap<u64, u64> {
        self.table(table)["regions"]
            .as_array()
            .expect("regions")
            .iter()
            .map(|r| {
                (
                    r["region_id"].as_u64().expect("region_id"),
                    r["datanode_id"].as_u64().expect("datanode_id"),
                )
            })
            .collect()
    }

    /// The datanode that leads the most regions of `table`.
    pub fn busiest_datanode(&self, table: &str) -> u64 {
        let table = self.table(table);
        let mut count: BTreeMap<u64, usize> = BTreeMap::new();
        for r in table["regions"].as_array().expect("regions") {
            *count
                .entry(r["datanode_id"].as_u64().expect("datanode"))
                .or_default() += 1;
        }
        count
            .into_iter()
            .max_by_key(|(_, n)| *n)
            .map(|(id, _)| id)
            .expect("a datanode")
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .new_agent()
}

/// `GET url`: status and JSON body (0 when it did not answer).
pub fn get(url: &str) -> (u16, Value) {
    match agent().get(url).call() {
        Ok(mut resp) => {
            let status = resp.status().as_u16();
            (status, resp.body_mut().read_json().unwrap_or(Value::Null))
        }
        Err(_) => (0, Value::Null),
    }
}

/// `POST url` with a binary write batch of `entries`: status and JSON body.
pub fn write(address: &str, region: u64, entries: &[&[u8]]) -> (u16, Value) {
    let mut body = Vec::new();
    for e in entries {
        body.extend_from_slice(&(e.len() as u32).to_be_bytes());
        body.extend_from_slice(e);
    }
    match agent()
        .post(&format!("http://{address}/v1/regions/{region}/write"))
        .send(&body[..])
    {
        Ok(mut resp) => {
            let status = resp.status().as_u16();
            (status, resp.body_mut().read_json().unwrap_or(Value::Null))
        }
        Err(_) => (0, Value::Null),
    }
}
