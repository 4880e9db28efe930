//! Automatic failover on real processes: kill -9 of the datanode leading most regions of a table under load, never
//! restarted. The leader's failure detector suspects it, a `DatanodeFailover` moves each of its regions to a live
//! datanode (`RegionMigration` children), and the load follows them; every entry the load was told is durable is
//! in its region's dump exactly once, in order. The time from the kill until every region leads again is printed
//! (a figure, not a bound: `docs/failover.md`). The zombie variant stops the datanode (SIGSTOP) instead, past
//! its lease and the detector, and lets it go once its regions lead elsewhere: it acknowledges nothing it cannot
//! stand behind, and nothing acknowledged is lost.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cluster::{Cluster, PATIENCE, get};

/// The datanode leading each region of `regions` per the leader's registry (`None`: none leads it now).
fn leaders(cluster: &Cluster, regions: &[u64]) -> Vec<Option<u64>> {
    let (_, body) = get(&format!("http://{}/v1/datanodes", cluster.serve_address));
    let nodes = body["datanodes"].as_array().cloned().unwrap_or_default();
    regions
        .iter()
        .map(|region| {
            nodes.iter().find_map(|node| {
                node["regions"].as_array()?.iter().find_map(|r: &Value| {
                    (r["region_id"].as_u64() == Some(*region) && r["role"] == "leader")
                        .then(|| node["id"].as_u64())
                        .flatten()
                })
            })
        })
        .collect()
}

#[test]
fn kill_9_of_a_datanode_under_load_moves_its_regions_to_live_ones_and_loses_no_acknowledged_entry()
{
    let mut cluster = Cluster::start(&[1, 2, 3], 2, "");
    let regions = cluster.create_table("failing", 6);
    let (mut load, acks) = cluster.start_load("failing", "14s", &["--concurrency", "6"]);
    std::thread::sleep(Duration::from_secs(2));
    cluster.walctl(&["wal", "flush", "--table", "failing"]);
    std::thread::sleep(Duration::from_secs(1));
    let victim = cluster.busiest_datanode("failing");
    cluster
        .datanodes
        .get_mut(&victim)
        .expect("the victim runs")
        .kill9();
    let killed = Instant::now();
    cluster.wait_for("every region to lead on a live datanode", || {
        leaders(&cluster, &regions)
            .iter()
            .all(|l| l.is_some_and(|dn| dn != victim))
    });
    println!(
        "failover: every region of datanode {victim} leads elsewhere {:?} after kill -9",
        killed.elapsed()
    );

    let report = cluster.finish_load(&mut load);
    let acknowledged = report["acknowledged"].as_u64().expect("acknowledged");
    assert!(acknowledged > 0, "{report}");
    let table = cluster.table("failing");
    for r in table["regions"].as_array().expect("regions") {
        assert_ne!(r["datanode_id"].as_u64(), Some(victim), "{table}");
    }
    let failovers = cluster.walctl(&[
        "procedures",
        "list",
        "--type",
        "remote_wal::DatanodeFailover",
    ]);
    assert!(
        failovers.contains(&format!("datanode_failover/{victim}/")) && failovers.contains("done"),
        "{failovers}"
    );
    let checked = cluster.assert_nothing_acknowledged_lost(&[acks]);
    assert_eq!(checked as u64, acknowledged, "{report}");
}

#[test]
fn a_datanode_stopped_until_its_regions_failed_over_then_let_go_loses_no_acknowledged_entry() {
    let mut cluster = Cluster::start(&[1, 2, 3], 2, "");
    let regions = cluster.create_table("zombie", 6);
    let (mut load, acks) = cluster.start_load("zombie", "14s", &["--concurrency", "6"]);
    std::thread::sleep(Duration::from_secs(3));
    let victim = cluster.busiest_datanode("zombie");
    let zombie = cluster.datanodes.get(&victim).expect("the victim runs");
    zombie.signal("-STOP");
    cluster.wait_for("every region to lead on a live datanode", || {
        leaders(&cluster, &regions)
            .iter()
            .all(|l| l.is_some_and(|dn| dn != victim))
    });
    // Let the zombie go while the load still writes: its leases are long over, its regions moved.
    cluster
        .datanodes
        .get(&victim)
        .expect("the victim runs")
        .signal("-CONT");
    // Its incarnation was retired with the failover: its next heartbeat is refused as stale, and it exits.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let zombie = cluster.datanodes.get_mut(&victim).expect("the victim");
        if zombie.try_exit().is_some() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the let-go datanode still runs\n{}",
            zombie.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let report = cluster.finish_load(&mut load);
    let acknowledged = report["acknowledged"].as_u64().expect("acknowledged");
    assert!(acknowledged > 0, "{report}");
    let table = cluster.table("zombie");
    for r in table["regions"].as_array().expect("regions") {
        assert_ne!(r["datanode_id"].as_u64(), Some(victim), "{table}");
    }
    let checked = cluster.assert_nothing_acknowledged_lost(&[acks]);
    assert_eq!(checked as u64, acknowledged, "{report}");
}

/// The failover above with the leader pruning the WAL every second throughout: prune rounds run before, during and
/// after the regions move (their targets replay from the checkpoints the prunes read), and still nothing
/// acknowledged is lost; the rounds moved the watermark.
#[test]
fn prune_rounds_running_through_a_failover_delete_nothing_a_moved_region_needs() {
    let mut cluster = Cluster::start(&[1, 2, 3], 2, "prune_interval = \"1s\"");
    let regions = cluster.create_table("pruned_over", 6);
    let (mut load, acks) = cluster.start_load("pruned_over", "14s", &["--concurrency", "6"]);
    std::thread::sleep(Duration::from_secs(2));
    cluster.walctl(&["wal", "flush", "--table", "pruned_over"]);
    std::thread::sleep(Duration::from_secs(2));
    let rounds_before = finished_prune_rounds(&cluster);
    let victim = cluster.busiest_datanode("pruned_over");
    cluster
        .datanodes
        .get_mut(&victim)
        .expect("the victim runs")
        .kill9();
    cluster.wait_for("every region to lead on a live datanode", || {
        leaders(&cluster, &regions)
            .iter()
            .all(|l| l.is_some_and(|dn| dn != victim))
    });
    // The moved regions flush on their new datanodes, and the next rounds prune up to their checkpoints.
    cluster.walctl(&["wal", "flush", "--table", "pruned_over"]);
    std::thread::sleep(Duration::from_secs(2));
    let report = cluster.finish_load(&mut load);
    let acknowledged = report["acknowledged"].as_u64().expect("acknowledged");
    assert!(acknowledged > 0, "{report}");
    let rounds_after = finished_prune_rounds(&cluster);
    assert!(
        rounds_after > rounds_before && rounds_before > 0,
        "prune rounds ran before and after the kill: {rounds_before}, then {rounds_after}"
    );
    // wal stats reads the brokers where walctl runs: embedded, on the server's config.
    let out = std::process::Command::new(crate::support::walctl_path())
        .current_dir(cluster.dir.path())
        .arg("--config")
        .arg(cluster.serve_config())
        .args(["--json", "wal", "stats"])
        .output()
        .expect("run wal stats");
    let stats = crate::support::json_lines(&String::from_utf8_lossy(&out.stdout));
    assert!(
        stats
            .iter()
            .any(|t| t["pruned_entry_id"].as_u64().is_some_and(|p| p > 0)),
        "a round moved a watermark: {stats:?}"
    );
    let checked = cluster.assert_nothing_acknowledged_lost(&[acks]);
    assert_eq!(checked as u64, acknowledged, "{report}");
}

/// Prune rounds the leader has finished (`procedures list --state done --type remote_wal::WalPruneRound`).
fn finished_prune_rounds(cluster: &Cluster) -> usize {
    cluster
        .walctl(&[
            "--json",
            "procedures",
            "list",
            "--state",
            "done",
            "--type",
            "remote_wal::WalPruneRound",
            "--limit",
            "1000",
        ])
        .lines()
        .filter(|l| l.contains("wal_prune_round/"))
        .count()
}
