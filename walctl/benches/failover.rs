//! Automatic failover, measured over many kills: each round starts a cluster of its own (`walctl serve` and three
//! `walctl datanode` on the Kafka WAL, `KAFKA_ENDPOINTS` / `ETCD_ENDPOINTS`), creates a table of 6 regions, runs
//! `walctl load` with an ack log, kills (SIGKILL) the datanode leading most regions at a random point of its
//! heartbeat interval, and times the kill until every
//! one of its regions leads on a live datanode, and, per moved region, until the load's first acknowledged write of
//! it (the ack log's `at_ms`; an acknowledgement received within 50 ms of the kill is the dead leader's, sent before
//! it died). Then it checks the ack log against the regions' dumps: every acknowledged entry exactly once, in
//! order. Prints each round, then p50, p99 and max of both, and the acknowledged entries lost (must be 0). Run with
//!
//! ```text
//! KAFKA_ENDPOINTS=… ETCD_ENDPOINTS=… cargo bench -p walctl --bench failover [--profile dev]
//! ```
//!
//! `BENCH_KILLS` (default 20) rounds; `BENCH_HEARTBEAT_MS` (default 1000) the datanodes' heartbeat interval.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "../tests/datanode/cluster.rs"]
mod cluster;

mod common;

use common::{env_count, percentile, smoke};
use std::time::{Duration, Instant};

use cluster::{Cluster, ack_times, get, unix_ms};

/// Whether every region of `regions` leads on a datanode other than `victim`, per the leader's registry.
fn moved(cluster: &Cluster, regions: &[u64], victim: u64) -> bool {
    let (_, body) = get(&format!("http://{}/v1/datanodes", cluster.serve_address));
    let nodes = body["datanodes"].as_array().cloned().unwrap_or_default();
    regions.iter().all(|region| {
        nodes.iter().any(|node| {
            node["id"].as_u64() != Some(victim)
                && node["regions"].as_array().is_some_and(|rs| {
                    rs.iter()
                        .any(|r| r["region_id"].as_u64() == Some(*region) && r["role"] == "leader")
                })
        })
    })
}

/// A random number below `n` (std's randomly keyed hasher; no generator needed for a kill's timing).
fn random_below(n: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish() % n.max(1)
}

fn main() {
    let kills = env_count("BENCH_KILLS", if smoke() { 1 } else { 20 });
    let heartbeat_ms = env_count("BENCH_HEARTBEAT_MS", 1000);
    let mut times = Vec::new();
    let mut writable = Vec::new();
    let (mut acknowledged, mut checked) = (0u64, 0u64);
    for round in 0..kills {
        let mut cluster = Cluster::start_with_heartbeat(&[1, 2, 3], 2, "", heartbeat_ms);
        let table = format!("failover_{round}");
        let regions = cluster.create_table(&table, 6);
        let (mut load, acks) = cluster.start_load(&table, "14s", &["--concurrency", "6"]);
        // At a random point of the heartbeat interval: a datanode dies whenever it dies.
        std::thread::sleep(
            Duration::from_secs(3) + Duration::from_millis(random_below(heartbeat_ms)),
        );
        let victim = cluster.busiest_datanode(&table);
        let on_victim: Vec<u64> = cluster
            .placement(&table)
            .into_iter()
            .filter(|(_, dn)| *dn == victim)
            .map(|(region, _)| region)
            .collect();
        cluster
            .datanodes
            .get_mut(&victim)
            .expect("the victim runs")
            .kill9();
        let killed = Instant::now();
        let killed_ms = unix_ms();
        cluster.wait_for("every region to lead on a live datanode", || {
            moved(&cluster, &regions, victim)
        });
        let took = killed.elapsed();
        let report = cluster.finish_load(&mut load);
        let acked = report["acknowledged"].as_u64().unwrap_or(0);
        let acked_at = ack_times(&acks);
        let mut firsts = Vec::new();
        for region in &on_victim {
            let first = acked_at
                .get(region)
                .and_then(|at| at.iter().find(|t| **t >= killed_ms + 50))
                .unwrap_or_else(|| panic!("region {region}: no write acknowledged after the kill"));
            firsts.push(Duration::from_millis(first - killed_ms));
        }
        let seen = cluster.assert_nothing_acknowledged_lost(&[acks]) as u64;
        println!(
            "round {round}: datanode {victim} killed; every region leads elsewhere after {} ms; first \
             acknowledged write per moved region after {:?} ms; {acked} entries acknowledged, {seen} found once \
             each",
            took.as_millis(),
            firsts.iter().map(Duration::as_millis).collect::<Vec<_>>()
        );
        writable.extend(firsts);
        acknowledged += acked;
        checked += seen;
        times.push(took);
    }
    times.sort();
    writable.sort();
    println!(
        "failover over {kills} kills (heartbeat {heartbeat_ms} ms): every region leading elsewhere p50 {} ms, \
         p99 {} ms, max {} ms; first acknowledged write of each of {} moved regions p50 {} ms, p99 {} ms, max {} \
         ms; acknowledged {acknowledged}, lost {}",
        percentile(&times, 0.5).as_millis(),
        percentile(&times, 0.99).as_millis(),
        times.last().map(Duration::as_millis).unwrap_or(0),
        writable.len(),
        percentile(&writable, 0.5).as_millis(),
        percentile(&writable, 0.99).as_millis(),
        writable.last().map(Duration::as_millis).unwrap_or(0),
        acknowledged.saturating_sub(checked)
    );
}
