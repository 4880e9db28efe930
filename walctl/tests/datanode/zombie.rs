//! A zombie: a datanode stopped (SIGSTOP) for two leases while a new incarnation of it starts elsewhere and takes
//! its regions. After SIGCONT the old process acknowledges nothing more: it is told its incarnation is stale and
//! exits; every acknowledged entry (of either) is in the dumps once, in order.

use std::time::{Duration, Instant};

use crate::cluster::{Cluster, LEASE, PATIENCE, free_port, write};

#[test]
fn a_stopped_datanode_replaced_by_a_new_incarnation_acknowledges_nothing_after_and_exits() {
    let mut cluster = Cluster::start(&[1, 2], 1, "");
    let regions = cluster.create_table("zombie", 2);
    let table = cluster.table("zombie");
    let on_one: Vec<u64> = table["regions"]
        .as_array()
        .expect("regions")
        .iter()
        .filter(|r| r["datanode_id"] == 1)
        .map(|r| r["region_id"].as_u64().expect("region"))
        .collect();
    assert_eq!(on_one.len(), 1, "{table}");
    let old_address = cluster.addresses[&1].clone();
    let (mut load, acks) = cluster.start_load("zombie", "10s", &["--concurrency", "2"]);
    std::thread::sleep(Duration::from_secs(2));

    let mut zombie = cluster.datanodes.remove(&1).expect("datanode 1");
    zombie.signal("-STOP");
    // Two leases: the stopped process's leases run out, and a new incarnation of datanode 1 starts elsewhere.
    std::thread::sleep(LEASE);
    let new_address = format!("127.0.0.1:{}", free_port());
    cluster.addresses.insert(1, new_address.clone());
    cluster.start_datanode_at(1, &new_address);
    std::thread::sleep(LEASE);
    zombie.signal("-CONT");

    // Right after waking, it takes no write: its lease ran out while it was stopped.
    let (status, body) = write(&old_address, on_one[0], &[b"zombie write"]);
    assert_ne!(
        status, 200,
        "the zombie acknowledged a write after its lease: {body}"
    );
    // Its next heartbeat is refused as stale: it stops serving and exits non-zero, saying why.
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(status) = zombie.try_exit() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the zombie never exited\n{}",
            zombie.log_tail()
        );
        let (status, body) = write(&old_address, on_one[0], &[b"zombie write"]);
        assert_ne!(status, 200, "the zombie acknowledged a write: {body}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success(), "the zombie exited 0");
    assert!(zombie.log_text().contains("stale"), "{}", zombie.log_tail());

    let report = cluster.finish_load(&mut load);
    let acknowledged = report["acknowledged"].as_u64().expect("acknowledged");
    assert!(acknowledged > 0, "{report}");
    let checked = cluster.assert_nothing_acknowledged_lost(&[acks]);
    assert_eq!(checked as u64, acknowledged);
    // The new incarnation leads the region and takes writes.
    assert_eq!(regions.len(), 2);
    let (status, body) = write(&new_address, on_one[0], &[b"after"]);
    assert_eq!(status, 200, "{body}");
}

#[test]
fn a_second_datanode_with_a_live_ones_id_is_refused_and_a_region_the_route_does_not_give_refuses_writes()
 {
    let mut cluster = Cluster::start(&[1, 2], 1, "");
    let regions = cluster.create_table("owned", 2);
    let table = cluster.table("owned");
    let mine = |id: u64| -> Vec<u64> {
        table["regions"]
            .as_array()
            .expect("regions")
            .iter()
            .filter(|r| r["datanode_id"] == id)
            .map(|r| r["region_id"].as_u64().expect("region"))
            .collect()
    };
    // Datanode 2 has datanode 1's region neither open nor leased: refused, naming the region.
    let (status, body) = write(&cluster.addresses[&2], mine(1)[0], &[b"x"]);
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["kind"], "not_leader", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains(&mine(1)[0].to_string()),
        "{body}"
    );
    // A second process started with id 1 while the first heartbeats is refused at registration.
    let first = cluster.datanodes.remove(&1).expect("datanode 1");
    let address = format!("127.0.0.1:{}", free_port());
    cluster.start_datanode_at(1, &address);
    let second = cluster.datanodes.get(&1).expect("the second");
    cluster.wait_for("the second datanode 1 to be refused", || {
        second.log_text().contains("still heartbeating")
    });
    // And the first keeps its regions meanwhile.
    let (status, body) = write(&cluster.addresses[&1], mine(1)[0], &[b"still mine"]);
    assert_eq!(status, 200, "{body}");
    drop(first);
    assert_eq!(regions.len(), 2);
}

#[test]
fn a_datanode_stopped_past_its_lease_refuses_writes_until_a_new_lease_and_loses_nothing() {
    let mut cluster = Cluster::start(&[1], 1, "");
    let regions = cluster.create_table("paused", 2);
    let address = cluster.addresses[&1].clone();
    let (mut load, acks) = cluster.start_load("paused", "8s", &["--concurrency", "2"]);
    std::thread::sleep(Duration::from_secs(2));
    // Stop the datanode, then the metasrv too, so nothing can renew its leases when it wakes.
    cluster.datanodes[&1].signal("-STOP");
    cluster.serve.as_ref().expect("serve").signal("-STOP");
    std::thread::sleep(LEASE * 2);
    cluster.datanodes[&1].signal("-CONT");
    std::thread::sleep(Duration::from_millis(200));
    // (A region whose write was in flight when it stopped answers that write "outcome unknown" and must reopen
    // first — it is reopening, or reopened and holds no lease yet; the other's lease ran out.)
    for region in &regions {
        let (status, body) = write(&address, *region, &[b"after the deadline"]);
        assert_eq!(status, 503, "region {region}: {body}");
        assert_eq!(body["error"]["kind"], "not_leader", "{body}");
        let message = body["error"]["message"].as_str().unwrap_or("");
        assert!(
            message.contains("lease ran out")
                || message.contains("holds no lease")
                || message.contains("reopening"),
            "{body}"
        );
    }
    // The metasrv answers again: a new lease, and writes are taken.
    cluster.serve.as_ref().expect("serve").signal("-CONT");
    cluster.wait_for("a new lease", || {
        write(&address, regions[0], &[b"renewed"]).0 == 200
    });
    let report = cluster.finish_load(&mut load);
    let acknowledged = report["acknowledged"].as_u64().expect("acknowledged");
    assert!(acknowledged > 0, "{report}");
    let checked = cluster.assert_nothing_acknowledged_lost(&[acks]);
    assert_eq!(checked as u64, acknowledged);
}
