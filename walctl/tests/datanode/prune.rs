//! Flush and the leader's periodic prune under load, with kill -9 of the metasrv (mid-prune, by chance) and of a
//! datanode: the topic is pruned, and no acknowledged entry was deleted before it was flushed.

use std::time::Duration;

use serde_json::Value;

use crate::cluster::{Cluster, LEASE};
use crate::support::json_lines;

#[test]
fn flush_and_prune_rounds_with_kill_9_delete_nothing_unflushed() {
    let mut cluster = Cluster::start(&[1, 2], 1, "prune_interval = \"1s\"");
    cluster.create_table("pruned", 4);
    let (mut load, acks) = cluster.start_load("pruned", "16s", &["--concurrency", "4"]);
    for round in 0..4 {
        std::thread::sleep(Duration::from_secs(2));
        cluster.walctl(&["wal", "flush", "--table", "pruned"]);
        match round {
            // The metasrv dies (a periodic prune may be mid-way) and comes back; its recovery finishes it.
            0 | 2 => {
                cluster.serve.as_mut().expect("serve runs").kill9();
                std::thread::sleep(Duration::from_millis(500));
                cluster.start_serve();
                cluster.wait_ready();
            }
            _ => {
                let victim = 1 + (round as u64 / 2) % 2;
                cluster.datanodes.get_mut(&victim).expect("runs").kill9();
                cluster.start_datanode(victim);
                std::thread::sleep(LEASE);
            }
        }
    }
    let report = cluster.finish_load(&mut load);
    let acknowledged = report["acknowledged"].as_u64().expect("acknowledged");
    assert!(acknowledged > 0, "{report}");
    // A last flush and prune round so the watermark has moved.
    cluster.walctl(&["wal", "flush", "--table", "pruned"]);
    let stats: Vec<Value> = {
        let mut last = Vec::new();
        cluster.wait_for("a prune to move the topic's watermark", || {
            let out = std::process::Command::new(crate::support::walctl_path())
                .current_dir(cluster.dir.path())
                .arg("--config")
                .arg(cluster.serve_config())
                .args(["--json", "wal", "stats"])
                .output()
                .expect("run wal stats");
            last = json_lines(&String::from_utf8_lossy(&out.stdout));
            last.first()
                .and_then(|t| t["pruned_entry_id"].as_u64())
                .is_some_and(|p| p > 0)
        });
        last
    };
    assert_eq!(stats.len(), 1, "{stats:?}");
    // The region holding the watermark back is named, with the entries the prune keeps for it.
    let topic = &stats[0];
    let pin = &topic["pinned_by"];
    let flushed = pin["flushed_entry_id"]
        .as_u64()
        .unwrap_or_else(|| panic!("a flushed region pins: {topic}"));
    let pruned = topic["pruned_entry_id"].as_u64().expect("pruned_entry_id");
    assert!(
        flushed >= pruned,
        "the watermark never passes the lowest checkpoint: {topic}"
    );
    let high = topic["high_watermark"].as_u64().expect("high_watermark");
    assert_eq!(pin["behind"].as_u64(), Some(high - flushed), "{topic}");
    assert!(pin["region_id"].as_u64().is_some(), "{topic}");
    let checked = cluster.assert_nothing_acknowledged_lost(&[acks]);
    assert_eq!(checked as u64, acknowledged, "{report}");
}
