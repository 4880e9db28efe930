//! `walctl bench heartbeats --datanodes N --regions R`: N simulated datanodes heartbeat against one `walctl serve`
//! (`--server`), each reporting its R regions open, and the bench prints the heartbeats per second the server
//! sustained, their latency (p50, p99) and, with `--server-pid`, the server's CPU per heartbeat (`docs/walctl.md`).
//!
//! It first creates N tables of R regions (so that round-robin placement gives every datanode R regions; the
//! server's `[datanodes] ids` must be 1..=N), registers the N datanodes, and asks each for its regions with a first
//! heartbeat (its open instructions). Then `--concurrency` workers send heartbeats for their datanodes as fast as
//! they are answered for `--duration`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use remote_wal::datanode::protocol::{
    HeartbeatRequest, HeartbeatResponse, Instruction, RegionRole, RegionStat, RegisterRequest,
    RegisterResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::Failure;
use crate::datanode_server::link::base_url;
use crate::output::Output;

/// The arguments of `bench heartbeats`.
#[derive(Debug, Args)]
pub struct HeartbeatsArgs {
    /// Simulated datanodes (ids 1..=N; the server's `[datanodes] ids` must hold them).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub datanodes: u64,
    /// Regions per datanode.
    #[arg(long, value_name = "R", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub regions: u32,
    /// How long to heartbeat.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Heartbeats in flight.
    #[arg(long, value_name = "C", default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub concurrency: u64,
    /// The server's process id, to report its CPU time per heartbeat (read from /proc).
    #[arg(long, value_name = "PID")]
    pub server_pid: Option<u32>,
}

/// What `bench heartbeats` measured.
#[derive(Debug, Serialize)]
pub struct HeartbeatsReport {
    /// Simulated datanodes.
    pub datanodes: u64,
    /// Regions each reported.
    pub regions: u32,
    /// Heartbeats answered.
    pub heartbeats: u64,
    /// Seconds measured.
    pub seconds: f64,
    /// Heartbeats answered per second.
    pub heartbeats_per_sec: f64,
    /// Leases granted per heartbeat, on average (R when every region was leased).
    pub leases_per_heartbeat: f64,
    /// Median latency, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile latency, milliseconds.
    pub p99_ms: f64,
    /// The server's CPU time per heartbeat, microseconds (with `--server-pid`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_cpu_us_per_heartbeat: Option<f64>,
    /// The bench's own CPU time per heartbeat, microseconds (it shares the machine's cores with the server).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bench_cpu_us_per_heartbeat: Option<f64>,
}

/// The bench's HTTP client: an agent and the token (`--token-file`, `WALCTL_TOKEN`) and authority (`--ca`) it uses.
#[derive(Clone)]
struct Http {
    agent: ureq::Agent,
    access: crate::access::Access,
}

fn agent(access: &crate::access::Access) -> Http {
    Http {
        agent: access.agent(Duration::from_secs(60), Duration::from_secs(60)),
        access: access.clone(),
    }
}

fn post<T: DeserializeOwned>(http: &Http, url: &str, body: &impl Serialize) -> Result<T, Failure> {
    let mut response = http
        .access
        .authorize(http.agent.post(url))
        .send_json(body)
        .map_err(|e| Failure::Refused(format!("{url}: {e}")))?;
    let status = response.status().as_u16();
    let value: Value = response
        .body_mut()
        .read_json()
        .map_err(|e| Failure::Refused(format!("{url}: an answer that is not JSON: {e}")))?;
    if status != 200 {
        return Err(Failure::Refused(format!(
            "{url}: HTTP {status}: {}",
            value["error"]["message"].as_str().unwrap_or("no message")
        )));
    }
    serde_json::from_value(value).map_err(|e| Failure::Refused(format!("{url}: {e}")))
}

/// One heartbeat of the encoded `body`: the number of leases in the answer (only they are decoded).
fn heartbeat(http: &Http, url: &str, body: &[u8]) -> Result<u64, Failure> {
    /// The part of the answer the bench counts.
    #[derive(serde::Deserialize)]
    struct Leases {
        leases: Vec<serde::de::IgnoredAny>,
    }
    let mut response = http
        .access
        .authorize(http.agent.post(url))
        .header("content-type", "application/json")
        .send(body)
        .map_err(|e| Failure::Refused(format!("{url}: {e}")))?;
    let status = response.status().as_u16();
    let bytes = response
        .body_mut()
        .read_to_vec()
        .map_err(|e| Failure::Refused(format!("{url}: {e}")))?;
    if status != 200 {
        let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        return Err(Failure::Refused(format!(
            "{url}: HTTP {status}: {}",
            value["error"]["message"].as_str().unwrap_or("no message")
        )));
    }
    let answer: Leases = serde_json::from_slice(&bytes).map_err(|e| {
        Failure::Refused(format!("{url}: an answer that is not a heartbeat's: {e}"))
    })?;
    Ok(answer.leases.len() as u64)
}

/// The server's user + system CPU seconds so far.
fn cpu_seconds(pid: u32) -> Option<f64> {
    cpu_seconds_of(&pid.to_string())
}

/// The user + system CPU seconds so far of `/proc/{process}` (`self`: this process).
fn cpu_seconds_of(process: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{process}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    // Clock ticks: 100 per second on Linux.
    Some((utime + stime) / 100.0)
}

/// Runs the bench against the leader among `servers`.
pub fn run(
    args: &HeartbeatsArgs,
    servers: &[String],
    access: &crate::access::Access,
    out: &mut Output,
) -> Result<(), Failure> {
    let Some(server) = servers.first() else {
        return Err(Failure::Refused(
            "bench heartbeats runs against a walctl serve: give it --server".to_string(),
        ));
    };
    let base = base_url(server);
    let agent = agent(access);
    let run = format!("{:x}", std::process::id());
    // N tables of R regions: round-robin placement gives each of the N datanodes R regions.
    let created = Arc::new(AtomicU64::new(0));
    let workers = args.concurrency.min(args.datanodes).max(1);
    std::thread::scope(|scope| -> Result<(), Failure> {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let agent = agent.clone();
                let base = base.clone();
                let run = run.clone();
                let created = created.clone();
                scope.spawn(move || -> Result<(), Failure> {
                    let mut i = w;
                    while i < args.datanodes {
                        let body = json!({
                            "name": format!("bench_hb_{run}_{i}"),
                            "regions": args.regions,
                            "if_not_exists": true,
                        });
                        let _: Value = post(&agent, &format!("{base}/v1/tables"), &body)?;
                        created.fetch_add(1, Ordering::Relaxed);
                        i += workers;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| Failure::Refused("a table-creating worker panicked".to_string()))??;
        }
        Ok(())
    })?;
    // Register every datanode and learn its regions from its open instructions.
    let mut nodes: Vec<HeartbeatRequest> = Vec::new();
    for id in 1..=args.datanodes {
        let registered: RegisterResponse = post(
            &agent,
            &format!("{base}/v1/datanodes/register"),
            &RegisterRequest {
                datanode_id: id,
                address: format!("127.0.0.1:{}", 40000 + id % 20000),
                heartbeat_interval_ms: 1000,
            },
        )?;
        let mut request = HeartbeatRequest {
            datanode_id: id,
            incarnation: registered.incarnation,
            address: format!("127.0.0.1:{}", 40000 + id % 20000),
            heartbeat_interval_ms: 1000,
            regions: Vec::new(),
            dropped: Vec::new(),
            wal_lost: Vec::new(),
            seq: 0,
            early: false,
            closed: Vec::new(),
        };
        let first: HeartbeatResponse = post(&agent, &format!("{base}/v1/heartbeat"), &request)?;
        request.regions = first
            .instructions
            .iter()
            .filter_map(|i| match i {
                Instruction::Open(open) => Some(RegionStat {
                    region_id: open.request.region_id,
                    role: RegionRole::Follower,
                    epoch: open.epoch,
                    last_entry_id: 0,
                    flushed_entry_id: 0,
                    memtable_bytes: 0,
                    topic_id: None,
                }),
                _ => None,
            })
            .collect();
        nodes.push(request);
    }
    // Each datanode's heartbeat is the same every time: encoded once, so the generator's own CPU (which shares the
    // machine with the server) goes to sending.
    let bodies: Vec<Vec<u8>> = nodes
        .iter()
        .map(|n| serde_json::to_vec(n).map_err(|e| Failure::Refused(format!("a heartbeat: {e}"))))
        .collect::<Result<_, _>>()?;
    let bodies = Arc::new(bodies);
    let url = format!("{base}/v1/heartbeat");
    let cpu_before = args.server_pid.and_then(cpu_seconds);
    let own_before = cpu_seconds_of("self");
    let started = Instant::now();
    let stop_at = started + args.duration;
    let answered = Arc::new(AtomicU64::new(0));
    let leases = Arc::new(AtomicU64::new(0));
    let mut latencies: Vec<Duration> =
        std::thread::scope(|scope| -> Result<Vec<Duration>, Failure> {
            let handles: Vec<_> = (0..args.concurrency)
                .map(|w| {
                    let agent = agent.clone();
                    let url = url.clone();
                    let bodies = bodies.clone();
                    let answered = answered.clone();
                    let leases = leases.clone();
                    scope.spawn(move || -> Result<Vec<Duration>, Failure> {
                        let mut mine = Vec::new();
                        let mut i = w as usize;
                        while Instant::now() < stop_at {
                            let body = &bodies[i % bodies.len()];
                            i += args.concurrency as usize;
                            let began = Instant::now();
                            let granted = heartbeat(&agent, &url, body)?;
                            mine.push(began.elapsed());
                            answered.fetch_add(1, Ordering::Relaxed);
                            leases.fetch_add(granted, Ordering::Relaxed);
                        }
                        Ok(mine)
                    })
                })
                .collect();
            let mut all = Vec::new();
            for h in handles {
                all.extend(
                    h.join().map_err(|_| {
                        Failure::Refused("a heartbeat worker panicked".to_string())
                    })??,
                );
            }
            Ok(all)
        })?;
    let seconds = started.elapsed().as_secs_f64();
    let cpu_after = args.server_pid.and_then(cpu_seconds);
    let own_after = cpu_seconds_of("self");
    latencies.sort();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len().max(1) - 1) as f64 * p).round() as usize)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    let heartbeats = answered.load(Ordering::Relaxed);
    let report = HeartbeatsReport {
        datanodes: args.datanodes,
        regions: args.regions,
        heartbeats,
        seconds,
        heartbeats_per_sec: heartbeats as f64 / seconds.max(1e-9),
        leases_per_heartbeat: leases.load(Ordering::Relaxed) as f64 / heartbeats.max(1) as f64,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        server_cpu_us_per_heartbeat: match (cpu_before, cpu_after) {
            (Some(a), Some(b)) => Some((b - a) * 1e6 / heartbeats.max(1) as f64),
            _ => None,
        },
        bench_cpu_us_per_heartbeat: match (own_before, own_after) {
            (Some(a), Some(b)) => Some((b - a) * 1e6 / heartbeats.max(1) as f64),
            _ => None,
        },
    };
    if out.is_json() {
        out.json_line(&report);
    } else {
        out.line(&format!(
            "{} datanodes x {} regions: {} heartbeats in {:.2} s ({:.0}/s), {:.1} leases each, latency p50 {:.2} ms \
             p99 {:.2} ms{}",
            report.datanodes,
            report.regions,
            report.heartbeats,
            report.seconds,
            report.heartbeats_per_sec,
            report.leases_per_heartbeat,
            report.p50_ms,
            report.p99_ms,
            report
                .server_cpu_us_per_heartbeat
                .map_or(String::new(), |us| format!(", server CPU {us:.0} µs per heartbeat"))
                + &report
                    .bench_cpu_us_per_heartbeat
                    .map_or(String::new(), |us| format!(", bench CPU {us:.0} µs"))
        ));
    }
    Ok(())
}
