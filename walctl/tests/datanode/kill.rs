//! kill -9 of datanodes under load: the load follows the regions to their restarted datanode, and every entry it
//! was told is durable is in its region's dump, once, in order.

use std::time::Duration;

use crate::cluster::{Cluster, LEASE};

#[test]
fn kill_9_of_a_datanode_under_load_loses_no_acknowledged_entry() {
    let mut cluster = Cluster::start(&[1, 2, 3], 2, "");
    let regions = cluster.create_table("killed", 6);
    assert_eq!(regions.len(), 6);
    let (mut load, acks) = cluster.start_load("killed", "12s", &["--concurrency", "6"]);
    std::thread::sleep(Duration::from_secs(2));
    // Some entries flushed to storage, the rest left to replay.
    cluster.walctl(&["wal", "flush", "--table", "killed"]);
    std::thread::sleep(Duration::from_secs(1));
    let victim = cluster.busiest_datanode("killed");
    for round in 0..2 {
        cluster
            .datanodes
            .get_mut(&victim)
            .expect("the victim runs")
            .kill9();
        std::thread::sleep(Duration::from_millis(300 + 400 * round));
        cluster.start_datanode(victim);
        std::thread::sleep(LEASE * 2);
    }
    let report = cluster.finish_load(&mut load);
    let acknowledged = report["acknowledged"].as_u64().expect("acknowledged");
    assert!(acknowledged > 0, "{report}");
    // The restarted datanode leads its regions again.
    cluster.create_table("after", 1);
    let checked = cluster.assert_nothing_acknowledged_lost(&[acks]);
    assert_eq!(checked as u64, acknowledged, "{report}");
}
