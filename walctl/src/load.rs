//! `walctl load`: writes entries to a table's regions through their leader datanodes' write API and prints what
//! was acknowledged: entries/s, MB/s, request latency p50/p99 (`docs/walctl.md`).
//!
//! Each region is written by one worker at a time, so a region's acknowledged sequences are in the order of its
//! entry ids. An entry's first 8 bytes are its sequence number (big-endian): `run id << 32 | n`, n counting from 1
//! per region, the run id random per run, so two runs never share a sequence. A batch refused with `not_leader`
//! (nothing written) is sent again after the leaders are read anew; a batch whose outcome is unknown (an error
//! answer saying so, a broken connection) is never sent again — its sequences are given up, so none can be
//! acknowledged twice. A table dropped while the load runs (its name gone, or naming another table) stops every
//! worker with an error saying so. With `--ack-log FILE`, every acknowledged entry is a JSON line
//! `{"region_id":…,"sequence":…,"entry_id":…}`.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use serde_json::Value;

use crate::Failure;
use crate::output::Output;
use crate::route::Router;

/// `walctl load` arguments.
#[derive(Debug, Args)]
pub struct LoadArgs {
    /// `table`, `schema.table` or `catalog.schema.table`.
    #[arg(long, value_name = "NAME")]
    pub table: String,
    /// Entries to write in all.
    #[arg(
        long,
        value_name = "N",
        conflicts_with = "duration",
        required_unless_present = "duration"
    )]
    pub entries: Option<u64>,
    /// Write for this long.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// At most this many entries per second in all (default: as fast as acknowledged).
    #[arg(long, value_name = "R")]
    pub rate: Option<u64>,
    /// Bytes per entry (at least 8: the sequence number).
    #[arg(long, value_name = "BYTES", default_value_t = 1024,
          value_parser = clap::value_parser!(u64).range(8..=16 * 1024 * 1024))]
    pub entry_size: u64,
    /// Entries per write request.
    #[arg(long, value_name = "B", default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub batch: u64,
    /// Requests in flight (at most one per region).
    #[arg(long, value_name = "C", default_value_t = 4,
          value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub concurrency: u64,
    /// Record every acknowledged entry here, one JSON line each.
    #[arg(long, value_name = "FILE")]
    pub ack_log: Option<std::path::PathBuf>,
}

/// What a load did.
#[derive(Clone, Debug, Serialize)]
pub struct LoadReport {
    /// The table.
    pub table: String,
    /// Entries acknowledged.
    pub acknowledged: u64,
    /// Entries whose outcome is unknown (given up, never resent).
    pub unknown: u64,
    /// Batches refused as not leader and sent again.
    pub not_leader: u64,
    /// Seconds from the first request to the last answer.
    pub seconds: f64,
    /// Acknowledged entries per second.
    pub entries_per_sec: f64,
    /// Acknowledged megabytes (10^6 bytes) per second.
    pub mb_per_sec: f64,
    /// Median request latency, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile request latency, milliseconds.
    pub p99_ms: f64,
}

/// One acknowledged entry in the ack log.
#[derive(Serialize)]
struct Ack {
    region_id: u64,
    sequence: u64,
    entry_id: u64,
    /// When the acknowledgement arrived: milliseconds since the Unix epoch (what a bench lines up with a kill or
    /// a migration).
    at_ms: u64,
}

/// Milliseconds since the Unix epoch now.
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A random 32-bit run id (std's random hasher keys).
fn run_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    (h.finish() & 0x7fff_ffff).max(1)
}

/// The bytes of the entry with `sequence`: the sequence, then a pattern.
pub fn entry_bytes(sequence: u64, size: usize) -> Vec<u8> {
    let mut data: Vec<u8> = (0..size)
        .map(|i| (sequence.wrapping_add(i as u64) % 251) as u8)
        .collect();
    let n = size.min(8);
    data[..n].copy_from_slice(&sequence.to_be_bytes()[..n]);
    data
}

/// The sequence number at the start of an entry written by `load` (`None` when shorter than 8 bytes).
pub fn sequence_of(data: &[u8]) -> Option<u64> {
    data.get(..8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
}

struct Shared {
    router: Mutex<Router>,
    table: String,
    /// The table's id when the load began: the name naming no table, or another one, means it was dropped.
    table_id: AtomicU64,
    /// Set once a refresh found the table dropped: every worker stops, saying so.
    dropped: AtomicBool,
    /// Region id → leader address, as last read.
    leaders: Mutex<std::collections::HashMap<u64, Option<String>>>,
    remaining: AtomicU64,
    stop_at: Option<Instant>,
    stopped: AtomicBool,
    acked: AtomicU64,
    unknown: AtomicU64,
    not_leader: AtomicU64,
    latencies: Mutex<Vec<Duration>>,
    acks: Option<Mutex<std::io::BufWriter<std::fs::File>>>,
    agent: ureq::Agent,
    access: crate::access::Access,
    rate_per_worker: Option<f64>,
    entry_size: usize,
    batch: u64,
    run_id: u64,
}

impl Shared {
    fn refresh(&self) -> Result<(), Failure> {
        let read = self
            .router
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .table(&self.table);
        let leaders = match read {
            Ok(leaders) => leaders,
            Err(e) => {
                if e.is_table_not_found() {
                    self.dropped.store(true, Ordering::Relaxed);
                }
                return Err(e);
            }
        };
        if u64::from(leaders.table_id) != self.table_id.load(Ordering::Relaxed) {
            self.dropped.store(true, Ordering::Relaxed);
            return Err(self.dropped_error());
        }
        let mut map = self
            .leaders
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for r in leaders.regions {
            map.insert(r.region_id, r.address);
        }
        Ok(())
    }

    /// What a worker stops with once the table is gone.
    fn dropped_error(&self) -> Failure {
        Failure::Refused(format!(
            "table {} was dropped while the load ran (its regions take no more writes)",
            self.table
        ))
    }

    /// Refreshes the leaders; `Err` only when the table was dropped (any other failure is retried later).
    fn refresh_or_dropped(&self) -> Result<(), Failure> {
        let _ = self.refresh();
        if self.dropped.load(Ordering::Relaxed) {
            self.stopped.store(true, Ordering::Relaxed);
            return Err(self.dropped_error());
        }
        Ok(())
    }

    fn leader(&self, region_id: u64) -> Option<String> {
        self.leaders
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&region_id)
            .cloned()
            .flatten()
    }

    /// Takes up to `batch` entries of the budget; 0 when the load is over.
    fn take(&self) -> u64 {
        if self.stopped.load(Ordering::Relaxed) {
            return 0;
        }
        if let Some(stop) = self.stop_at
            && Instant::now() >= stop
        {
            return 0;
        }
        let mut current = self.remaining.load(Ordering::Relaxed);
        loop {
            if current == 0 {
                return 0;
            }
            let n = current.min(self.batch);
            match self.remaining.compare_exchange(
                current,
                current - n,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return n,
                Err(actual) => current = actual,
            }
        }
    }
}

/// What one request came to.
enum Sent {
    Acked(Vec<u64>),
    NotLeader,
    /// The datanode says the region's table was dropped.
    Dropped,
    Unknown(String),
    Refused(String),
}

fn send(shared: &Shared, address: &str, region_id: u64, body: &[u8]) -> Sent {
    let url = format!(
        "{}/v1/regions/{region_id}/write",
        crate::datanode_server::link::base_url(address)
    );
    match shared
        .access
        .authorize(shared.agent.post(&url))
        .header("content-type", "application/octet-stream")
        .send(body)
    {
        Ok(mut response) => {
            let status = response.status().as_u16();
            let value: Value = response.body_mut().read_json().unwrap_or(Value::Null);
            if status == 200 {
                let ids = value["entry_ids"]
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_u64).collect())
                    .unwrap_or_default();
                return Sent::Acked(ids);
            }
            let kind = value["error"]["kind"].as_str().unwrap_or("");
            let message = value["error"]["message"]
                .as_str()
                .unwrap_or("no message")
                .to_string();
            match kind {
                "not_leader" => Sent::NotLeader,
                "region_dropped" => Sent::Dropped,
                "bad_request" | "unauthorized" | "forbidden" => Sent::Refused(message),
                _ => Sent::Unknown(format!("HTTP {status} {kind}: {message}")),
            }
        }
        // Connecting failed: nothing was sent. Anything later: the request may have been taken.
        Err(ureq::Error::ConnectionFailed) | Err(ureq::Error::HostNotFound) => Sent::NotLeader,
        Err(e) => Sent::Unknown(e.to_string()),
    }
}

/// One worker: writes its regions in turn until the budget or the time runs out.
fn worker(shared: Arc<Shared>, regions: Vec<u64>) -> Result<(), Failure> {
    let mut counters: Vec<u64> = vec![0; regions.len()];
    let started = Instant::now();
    let mut sent_entries = 0u64;
    let mut turn = 0usize;
    loop {
        let n = shared.take();
        if n == 0 {
            return Ok(());
        }
        let slot = turn % regions.len();
        turn += 1;
        let region_id = regions[slot];
        let first = counters[slot] + 1;
        counters[slot] += n;
        let sequences: Vec<u64> = (first..first + n)
            .map(|c| (shared.run_id << 32) | c)
            .collect();
        let mut body = Vec::with_capacity((shared.entry_size + 4) * n as usize);
        for s in &sequences {
            body.extend_from_slice(&(shared.entry_size as u32).to_be_bytes());
            body.extend_from_slice(&entry_bytes(*s, shared.entry_size));
        }
        if let Some(rate) = shared.rate_per_worker {
            let due = started + Duration::from_secs_f64(sent_entries as f64 / rate);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        sent_entries += n;
        let mut attempts = 0u32;
        loop {
            let Some(address) = shared.leader(region_id) else {
                attempts += 1;
                if attempts > 600 {
                    return Err(Failure::Refused(format!(
                        "region {region_id} of {} has no registered leader",
                        shared.table
                    )));
                }
                std::thread::sleep(Duration::from_millis(100));
                shared.refresh_or_dropped()?;
                continue;
            };
            let began = Instant::now();
            match send(&shared, &address, region_id, &body) {
                Sent::Acked(ids) => {
                    shared
                        .latencies
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(began.elapsed());
                    shared.acked.fetch_add(ids.len() as u64, Ordering::Relaxed);
                    if let Some(log) = &shared.acks {
                        let at_ms = unix_ms();
                        let mut log = log
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        for (sequence, entry_id) in sequences.iter().zip(ids) {
                            let line = serde_json::to_string(&Ack {
                                region_id,
                                sequence: *sequence,
                                entry_id,
                                at_ms,
                            })
                            .unwrap_or_default();
                            let _ = writeln!(log, "{line}");
                        }
                    }
                    break;
                }
                Sent::Dropped => {
                    shared.stopped.store(true, Ordering::Relaxed);
                    return Err(shared.dropped_error());
                }
                Sent::NotLeader => {
                    shared.not_leader.fetch_add(1, Ordering::Relaxed);
                    attempts += 1;
                    // A lease being renewed, a datanode restarting, a leader moving: read the route again and
                    // send the same batch (nothing of it was written).
                    if attempts > 600 {
                        return Err(Failure::Refused(format!(
                            "region {region_id} of {}: no leader took writes for a minute",
                            shared.table
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(100));
                    shared.refresh_or_dropped()?;
                }
                Sent::Unknown(reason) => {
                    shared.unknown.fetch_add(n, Ordering::Relaxed);
                    tracing::info!(region_id, %reason, "a batch's outcome is unknown; its sequences are given up");
                    shared.refresh_or_dropped()?;
                    break;
                }
                Sent::Refused(reason) => {
                    shared.stopped.store(true, Ordering::Relaxed);
                    return Err(Failure::Refused(format!(
                        "region {region_id} refused a write: {reason}"
                    )));
                }
            }
        }
    }
}

/// Runs the load.
pub fn run(
    args: &LoadArgs,
    router: Router,
    access: &crate::access::Access,
    out: &mut Output,
) -> Result<Router, Failure> {
    let acks = match &args.ack_log {
        Some(path) => Some(Mutex::new(std::io::BufWriter::new(
            std::fs::File::create(path).map_err(|e| {
                Failure::Refused(format!("cannot create --ack-log '{}': {e}", path.display()))
            })?,
        ))),
        None => None,
    };
    let agent = access.agent(Duration::from_secs(2), Duration::from_secs(30));
    let workers_wanted = args.concurrency;
    let shared = Arc::new(Shared {
        router: Mutex::new(router),
        table: args.table.clone(),
        table_id: AtomicU64::new(0),
        dropped: AtomicBool::new(false),
        leaders: Mutex::new(Default::default()),
        remaining: AtomicU64::new(args.entries.unwrap_or(u64::MAX)),
        stop_at: args.duration.map(|d| Instant::now() + d),
        stopped: AtomicBool::new(false),
        acked: AtomicU64::new(0),
        unknown: AtomicU64::new(0),
        not_leader: AtomicU64::new(0),
        latencies: Mutex::new(Vec::new()),
        acks,
        agent,
        access: access.clone(),
        rate_per_worker: None,
        entry_size: usize::try_from(args.entry_size).unwrap_or(8),
        batch: args.batch,
        run_id: run_id(),
    });
    let table = shared
        .router
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .table(&args.table)?;
    shared
        .table_id
        .store(u64::from(table.table_id), Ordering::Relaxed);
    let mut regions: Vec<u64> = table.regions.iter().map(|r| r.region_id).collect();
    regions.sort();
    let workers = usize::try_from(workers_wanted)
        .unwrap_or(1)
        .min(regions.len())
        .max(1);
    let shared = {
        let mut s =
            Arc::try_unwrap(shared).map_err(|_| Failure::Refused("load state shared".into()))?;
        s.rate_per_worker = args.rate.map(|r| r.max(1) as f64 / workers as f64);
        Arc::new(s)
    };
    shared.refresh()?;
    let started = Instant::now();
    let handles: Vec<_> = (0..workers)
        .map(|w| {
            let mine: Vec<u64> = regions
                .iter()
                .enumerate()
                .filter(|(i, _)| i % workers == w)
                .map(|(_, r)| *r)
                .collect();
            let shared = shared.clone();
            std::thread::spawn(move || worker(shared, mine))
        })
        .collect();
    let mut failure = None;
    for h in handles {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failure = Some(e),
            Err(_) => failure = Some(Failure::Refused("a load worker panicked".to_string())),
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    if let Some(log) = &shared.acks {
        let mut log = log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        log.flush()
            .map_err(|e| Failure::Refused(format!("cannot write --ack-log: {e}")))?;
    }
    let mut latencies = std::mem::take(
        &mut *shared
            .latencies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    latencies.sort();
    let pct = |p: f64| {
        if latencies.is_empty() {
            0.0
        } else {
            let i = ((latencies.len() as f64 - 1.0) * p).round() as usize;
            latencies[i].as_secs_f64() * 1000.0
        }
    };
    let acknowledged = shared.acked.load(Ordering::Relaxed);
    let report = LoadReport {
        table: table.table.clone(),
        acknowledged,
        unknown: shared.unknown.load(Ordering::Relaxed),
        not_leader: shared.not_leader.load(Ordering::Relaxed),
        seconds,
        entries_per_sec: acknowledged as f64 / seconds.max(1e-9),
        mb_per_sec: acknowledged as f64 * args.entry_size as f64 / 1e6 / seconds.max(1e-9),
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
    };
    if out.is_json() {
        out.json_line(&report);
    } else {
        out.line(&format!(
            "{}: {} entries acknowledged in {:.2} s ({:.0} entries/s, {:.2} MB/s), latency p50 {:.2} ms p99 {:.2} \
             ms; {} of unknown outcome, {} batches sent again after not-leader",
            report.table,
            report.acknowledged,
            report.seconds,
            report.entries_per_sec,
            report.mb_per_sec,
            report.p50_ms,
            report.p99_ms,
            report.unknown,
            report.not_leader
        ));
    }
    if let Some(e) = failure {
        return Err(e);
    }
    Arc::try_unwrap(shared)
        .map(|s| {
            s.router
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        })
        .map_err(|_| Failure::Refused("a load worker outlived the load".to_string()))
}
