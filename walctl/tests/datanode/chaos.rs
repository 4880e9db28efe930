//! The chaos test: real processes on a 3-member etcd cluster of the test's own and the shared Kafka broker — two
//! `walctl serve` campaigning for the lead, three `walctl datanode`, two tables of 4 regions over 2 topics, each
//! under `walctl load` with an ack log. kill -9 of the datanode leading most regions: every region leads on a live
//! datanode again. Then a migration is interrupted by kill -9 of the leading server, and the other server, the
//! next leader, finishes it. The one number: acknowledged entries lost = 0 (every acknowledged sequence in its
//! region's dump exactly once, in order).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cluster::{Cluster, get};
use crate::serve_cluster::EtcdCluster;

/// Per region: the datanodes that reported it as leader in their last heartbeat, per the leading server's registry
/// (a dead datanode's last report stays listed).
fn leaders(cluster: &Cluster) -> BTreeMap<u64, Vec<u64>> {
    let (_, body) = get(&format!("http://{}/v1/datanodes", cluster.serve_address));
    let mut leading = BTreeMap::new();
    for node in body["datanodes"].as_array().cloned().unwrap_or_default() {
        let id = node["id"].as_u64().unwrap_or(0);
        for r in node["regions"].as_array().cloned().unwrap_or_default() {
            if r["role"] == "leader"
                && let Some(region) = r["region_id"].as_u64()
            {
                leading.entry(region).or_insert_with(Vec::new).push(id);
            }
        }
    }
    leading
}

#[test]
fn on_a_three_member_etcd_with_two_servers_kill_9_of_the_busiest_datanode_and_of_the_leader_lose_nothing()
 {
    let etcd = EtcdCluster::start("chaos");
    let mut cluster = Cluster::metasrv_on(&etcd.endpoints, &[1, 2, 3], 2, "");
    cluster.start_standby(1);
    for id in [1, 2, 3] {
        cluster.start_datanode(id);
    }
    let mut regions = cluster.create_table("chaos_a", 4);
    regions.extend(cluster.create_table("chaos_b", 4));
    let (mut load_a, acks_a) = cluster.start_load("chaos_a", "16s", &["--concurrency", "4"]);
    let (mut load_b, acks_b) = cluster.start_load("chaos_b", "16s", &["--concurrency", "4"]);
    std::thread::sleep(Duration::from_secs(2));

    // kill -9 of the datanode leading most regions of both tables.
    let mut count: BTreeMap<u64, usize> = BTreeMap::new();
    for table in ["chaos_a", "chaos_b"] {
        for dn in cluster.placement(table).values() {
            *count.entry(*dn).or_default() += 1;
        }
    }
    let victim = count
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(dn, _)| *dn)
        .expect("a datanode");
    cluster.datanodes.get_mut(&victim).expect("it runs").kill9();
    let killed = Instant::now();
    cluster.wait_for("every region to lead on a live datanode", || {
        let leading = leaders(&cluster);
        regions.iter().all(|r| {
            leading
                .get(r)
                .is_some_and(|dns| dns.iter().any(|dn| *dn != victim))
        })
    });
    println!(
        "chaos: {} regions of datanode {victim} lead elsewhere {:?} after kill -9",
        count[&victim],
        killed.elapsed()
    );
    for table in ["chaos_a", "chaos_b"] {
        assert!(
            cluster.placement(table).values().all(|dn| *dn != victim),
            "the route of {table} still names the dead datanode"
        );
    }

    // A migration between the two live datanodes, its old leader stopped so it cannot hand over early: the
    // leading server dies mid-way and the other one, the next leader, finishes it.
    let (&region, &from) = cluster
        .placement("chaos_a")
        .iter()
        .next()
        .expect("a region");
    let to = [1, 2, 3]
        .into_iter()
        .find(|dn| *dn != from && *dn != victim)
        .expect("a live target");
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
    cluster.wait_for("the route to name the target", || {
        cluster.placement("chaos_a").get(&region) == Some(&to)
    });
    let (_, shown) = get(&format!(
        "http://{}/v1/procedures/{id}",
        cluster.serve_address
    ));
    assert_ne!(
        shown["state"], "done",
        "the migration ended before the kill: {shown}"
    );
    cluster.kill_leading_serve();
    cluster.datanodes[&from].signal("-CONT");
    cluster.wait_for("the migration to be done on the next leader", || {
        let (_, shown) = get(&format!(
            "http://{}/v1/procedures/{id}",
            cluster.serve_address
        ));
        shown["state"] == "done"
    });
    cluster.wait_for("the region to lead on its target", || {
        leaders(&cluster)
            .get(&region)
            .is_some_and(|dns| dns.contains(&to))
    });

    let mut acknowledged = 0;
    for load in [&mut load_a, &mut load_b] {
        let report = cluster.finish_load(load);
        acknowledged += report["acknowledged"].as_u64().expect("acknowledged");
    }
    assert!(acknowledged > 0);
    let checked = cluster.assert_nothing_acknowledged_lost(&[acks_a, acks_b]);
    assert_eq!(checked as u64, acknowledged);
    drop(cluster);
    drop(etcd);
}
