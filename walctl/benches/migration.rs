//! A manual migration's write stop under load: `walctl serve` and two `walctl datanode` on the Kafka WAL
//! (`KAFKA_ENDPOINTS` / `ETCD_ENDPOINTS`), a **1 s heartbeat**, a flush threshold of 16 MiB per region, a table of 4
//! regions under `walctl load` with an ack log; one region after another is moved to the other datanode with
//! `walctl migrate-region` (waiting for it to lead there). A migration's write stop is the longest gap between two
//! consecutive acknowledged writes of its region around it (the later one after the migration began, the earlier
//! one before it ended): what a writer of the region sees. Prints each migration (with its region's unflushed bytes
//! when it began), then p50, p99 and max, and the acknowledged entries lost (must be 0). Run with
//!
//! ```text
//! KAFKA_ENDPOINTS=… ETCD_ENDPOINTS=… cargo bench -p walctl --bench migration [--profile dev]
//! ```
//!
//! `BENCH_MIGRATIONS` (default 20) migrations; `BENCH_HEARTBEAT_MS` (default 1000) the datanodes' interval.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "../tests/datanode/cluster.rs"]
mod cluster;

mod common;

use common::{env_count, percentile, smoke};
use std::time::Duration;

use cluster::{Cluster, ack_times, get, unix_ms};

/// The unflushed bytes of `region` on its datanodes, per the leader's registry (the largest report).
fn unflushed(cluster: &Cluster, region: u64) -> u64 {
    let (_, body) = get(&format!("http://{}/v1/datanodes", cluster.serve_address));
    body["datanodes"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|n| n["regions"].as_array().cloned().unwrap_or_default())
        .filter(|r| r["region_id"].as_u64() == Some(region))
        .filter_map(|r| r["memtable_bytes"].as_u64())
        .max()
        .unwrap_or(0)
}

/// A migration: its region, when it began and ended (Unix ms), and the region's unflushed bytes then.
struct Migration {
    region: u64,
    began: u64,
    ended: u64,
    unflushed: u64,
}

fn main() {
    let migrations = env_count("BENCH_MIGRATIONS", if smoke() { 2 } else { 20 });
    let heartbeat_ms = env_count("BENCH_HEARTBEAT_MS", 1000);
    let pause = Duration::from_millis(1500);
    let mut cluster = Cluster::metasrv_only(&[1, 2], 2, "");
    cluster.heartbeat_ms = heartbeat_ms;
    cluster.datanode_extra = format!("flush_threshold = {}", 16u64 << 20);
    cluster.start_datanode(1);
    cluster.start_datanode(2);
    let regions = cluster.create_table("migrating", 4);
    let seconds = 6 + migrations * 4;
    let (mut load, acks) =
        cluster.start_load("migrating", &format!("{seconds}s"), &["--concurrency", "4"]);
    std::thread::sleep(Duration::from_secs(3));
    let mut done = Vec::new();
    for round in 0..migrations {
        let region = regions[round as usize % regions.len()];
        let from = cluster.placement("migrating")[&region];
        let to = if from == 1 { 2 } else { 1 };
        let unflushed = unflushed(&cluster, region);
        let began = unix_ms();
        cluster.walctl(&[
            "migrate-region",
            "--region",
            &region.to_string(),
            "--to",
            &to.to_string(),
        ]);
        let ended = unix_ms();
        done.push(Migration {
            region,
            began,
            ended,
            unflushed,
        });
        std::thread::sleep(pause);
    }
    let report = cluster.finish_load(&mut load);
    let acknowledged = report["acknowledged"].as_u64().unwrap_or(0);
    let at = ack_times(&acks);
    let mut stops = Vec::new();
    for (i, m) in done.iter().enumerate() {
        let times = at.get(&m.region).cloned().unwrap_or_default();
        let stop = times
            .windows(2)
            .filter(|w| w[1] >= m.began && w[0] <= m.ended)
            .map(|w| w[1].saturating_sub(w[0]))
            .max()
            .unwrap_or_else(|| {
                panic!(
                    "region {}: no write acknowledged around migration {i}",
                    m.region
                )
            });
        println!(
            "migration {i}: region {} ({} unflushed bytes), {} ms until it led on the target; write stop {stop} ms",
            m.region,
            m.unflushed,
            m.ended - m.began
        );
        stops.push(stop);
    }
    let checked = cluster.assert_nothing_acknowledged_lost(&[acks]) as u64;
    stops.sort_unstable();
    let most_unflushed = done.iter().map(|m| m.unflushed).max().unwrap_or(0);
    println!(
        "write stop over {} migrations (heartbeat {heartbeat_ms} ms, at most {most_unflushed} bytes unflushed in a \
         region): p50 {} ms, p99 {} ms, max {} ms; acknowledged {acknowledged}, lost {}",
        stops.len(),
        percentile(&stops, 0.5),
        percentile(&stops, 0.99),
        stops.last().copied().unwrap_or(0),
        acknowledged.saturating_sub(checked)
    );
}
