//! Region migration under load, on real processes: `walctl migrate-region` moves regions from one datanode to
//! another and back while `walctl load` writes; each moved region leads on its target at a higher epoch, and every
//! entry the load was told is durable is in its region's dump, once, in order.

use std::time::Duration;

use serde_json::Value;

use crate::cluster::{Cluster, get};

/// The datanode each region of `table` is routed to, by region id.
fn placement(cluster: &Cluster, table: &str) -> Vec<(u64, u64)> {
    cluster.placement(table).into_iter().collect()
}

/// The (datanode, epoch) leading `region` per the leader's registry, when one does.
fn leading(cluster: &Cluster, region: u64) -> Option<(u64, u64)> {
    let (_, body) = get(&format!("http://{}/v1/datanodes", cluster.serve_address));
    body["datanodes"].as_array()?.iter().find_map(|node| {
        node["regions"].as_array()?.iter().find_map(|r: &Value| {
            (r["region_id"].as_u64() == Some(region) && r["role"] == "leader").then(|| {
                (
                    node["id"].as_u64().unwrap_or(0),
                    r["epoch"].as_u64().unwrap_or(0),
                )
            })
        })
    })
}

#[test]
fn regions_migrated_under_load_lead_on_their_target_and_lose_no_acknowledged_entry() {
    let mut cluster = Cluster::start(&[1, 2], 2, "");
    let regions = cluster.create_table("moving", 4);
    assert_eq!(regions.len(), 4);
    let (mut load, acks) = cluster.start_load("moving", "14s", &["--concurrency", "4"]);
    std::thread::sleep(Duration::from_secs(2));
    // Some entries flushed to storage, the rest left to the target's replay.
    cluster.walctl(&["wal", "flush", "--table", "moving"]);
    std::thread::sleep(Duration::from_millis(500));

    let on_one: Vec<u64> = placement(&cluster, "moving")
        .into_iter()
        .filter(|(_, dn)| *dn == 1)
        .map(|(r, _)| r)
        .collect();
    assert!(!on_one.is_empty());
    for region in &on_one {
        let out = cluster.walctl(&[
            "migrate-region",
            "--region",
            &region.to_string(),
            "--to",
            "2",
        ]);
        assert!(
            out.contains(&format!(
                "region {region}: moved from datanode 1 to datanode 2, leading at epoch 1"
            )),
            "{out}"
        );
        assert_eq!(leading(&cluster, *region).map(|(dn, _)| dn), Some(2));
    }
    // A flush on the targets moves the checkpoints past what they replayed: an entry the old leader acknowledged
    // after the target's replay would be missing from storage and below the checkpoint, lost to the dump.
    std::thread::sleep(Duration::from_millis(500));
    cluster.walctl(&["wal", "flush", "--table", "moving"]);
    std::thread::sleep(Duration::from_millis(500));
    // And the first one back, at epoch 2, as JSON.
    let back = on_one[0];
    let out = cluster.walctl(&[
        "--json",
        "migrate-region",
        "--region",
        &back.to_string(),
        "--to",
        "1",
    ]);
    let answer: Value = serde_json::from_str(out.trim()).expect("one JSON line");
    assert_eq!(
        (&answer["from"], &answer["to"], &answer["epoch"]),
        (
            &serde_json::json!(2),
            &serde_json::json!(1),
            &serde_json::json!(2)
        ),
        "{answer}"
    );

    std::thread::sleep(Duration::from_millis(500));
    cluster.walctl(&["wal", "flush", "--table", "moving"]);
    let report = cluster.finish_load(&mut load);
    let acknowledged = report["acknowledged"].as_u64().expect("acknowledged");
    assert!(acknowledged > 0, "{report}");
    let routed = placement(&cluster, "moving");
    for (region, dn) in &routed {
        let expected = if *region == back {
            1
        } else if on_one.contains(region) {
            2
        } else {
            *dn
        };
        assert_eq!(*dn, expected, "region {region}: {routed:?}");
    }
    let checked = cluster.assert_nothing_acknowledged_lost(&[acks]);
    assert_eq!(checked as u64, acknowledged, "{report}");
}

/// kill -9 of the metasrv mid-migration (its route moved, the target not leading yet), under load: the restarted
/// metasrv (a new term, which knows no lease the old one granted) recovers the migration and finishes it; the
/// region leads on its target after the new term's wait of one lease, and nothing acknowledged is lost.
#[test]
fn a_migration_interrupted_by_kill_9_of_the_metasrv_is_finished_by_the_next_term() {
    let mut cluster = Cluster::start(&[1, 2], 2, "");
    cluster.create_table("interrupted", 2);
    let (mut load, acks) = cluster.start_load("interrupted", "12s", &["--concurrency", "2"]);
    std::thread::sleep(Duration::from_secs(2));
    let (region, from) = placement(&cluster, "interrupted")[0];
    let to = if from == 1 { 2 } else { 1 };
    // The old leader, stopped, can neither close the region nor report it closed: the target waits out its lease,
    // so the migration is still waiting for its leader when the metasrv dies.
    cluster.datanodes[&from].signal("-STOP");
    let out = cluster.walctl(&[
        "--json",
        "migrate-region",
        "--region",
        &region.to_string(),
        "--to",
        &to.to_string(),
        "--no-wait",
    ]);
    let submitted: Value = serde_json::from_str(out.trim()).expect("one JSON line");
    let id = submitted["procedure_id"]
        .as_str()
        .expect("procedure_id")
        .to_string();
    // Killed mid-migration: the route has moved, the target does not lead yet (it waits out the old lease).
    cluster.wait_for("the route to name the target", || {
        placement(&cluster, "interrupted")
            .iter()
            .any(|(r, dn)| *r == region && *dn == to)
    });
    let (_, shown) = get(&format!(
        "http://{}/v1/procedures/{id}",
        cluster.serve_address
    ));
    assert_ne!(
        shown["state"], "done",
        "the migration ended before the kill: {shown}"
    );
    cluster.serve.as_mut().expect("serve runs").kill9();
    // Woken well before the failure detector could suspect it (and no new term suspects anyone in its warm-up).
    cluster.datanodes[&from].signal("-CONT");
    std::thread::sleep(Duration::from_millis(300));
    cluster.start_serve();
    cluster.wait_ready();
    cluster.wait_for("the migrated region to lead on its target", || {
        leading(&cluster, region).is_some_and(|(dn, epoch)| dn == to && epoch >= 1)
    });
    // The procedure sees it at its next attempt.
    cluster.wait_for("the migration to be done", || {
        let (_, shown) = get(&format!(
            "http://{}/v1/procedures/{id}",
            cluster.serve_address
        ));
        shown["state"] == "done"
    });

    let report = cluster.finish_load(&mut load);
    let acknowledged = report["acknowledged"].as_u64().expect("acknowledged");
    assert!(acknowledged > 0, "{report}");
    let checked = cluster.assert_nothing_acknowledged_lost(&[acks]);
    assert_eq!(checked as u64, acknowledged, "{report}");
}

/// kill -9 of a migration's target right after the migration started, under load: the failure detector fails the
/// target over, and the region ends leading on a live datanode (the migration finished onto the dead target and the
/// failover moved it on, or the failover's own migration took it); nothing acknowledged is lost.
#[test]
fn kill_9_of_the_target_mid_migration_ends_with_the_region_on_a_live_datanode() {
    let mut cluster = Cluster::start(&[1, 2, 3], 2, "");
    cluster.create_table("target_dies", 3);
    let (mut load, acks) = cluster.start_load("target_dies", "14s", &["--concurrency", "3"]);
    std::thread::sleep(Duration::from_secs(2));
    cluster.walctl(&["wal", "flush", "--table", "target_dies"]);
    std::thread::sleep(Duration::from_millis(500));
    let (region, from) = placement(&cluster, "target_dies")[0];
    let target = [1, 2, 3]
        .into_iter()
        .find(|dn| *dn != from)
        .expect("a target");
    let out = cluster.walctl(&[
        "migrate-region",
        "--region",
        &region.to_string(),
        "--to",
        &target.to_string(),
        "--no-wait",
    ]);
    assert!(out.contains("migrat"), "{out}");
    // The route moves to the target (UpdateRoute), and the target dies before or just after it leads.
    cluster.wait_for("the route to name the target", || {
        placement(&cluster, "target_dies").contains(&(region, target))
    });
    cluster
        .datanodes
        .get_mut(&target)
        .expect("the target runs")
        .kill9();
    let killed = std::time::Instant::now();
    // The failover moves it on: routed to and leading on a live datanode at the epoch after the migration's.
    cluster.wait_for("the region to lead on a live datanode", || {
        leading(&cluster, region).is_some_and(|(dn, epoch)| {
            dn != target && epoch >= 2 && placement(&cluster, "target_dies").contains(&(region, dn))
        })
    });
    println!(
        "the region leads on a live datanode {:?} after its migration's target was killed",
        killed.elapsed()
    );
    let report = cluster.finish_load(&mut load);
    let acknowledged = report["acknowledged"].as_u64().expect("acknowledged");
    assert!(acknowledged > 0, "{report}");
    for (r, dn) in placement(&cluster, "target_dies") {
        assert_ne!(dn, target, "region {r} is routed to the dead target");
    }
    let checked = cluster.assert_nothing_acknowledged_lost(&[acks]);
    assert_eq!(checked as u64, acknowledged, "{report}");
}
