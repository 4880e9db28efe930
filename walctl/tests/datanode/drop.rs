//! Drop table on real processes: under load the writers stop saying the table was dropped; a drop sent while a
//! region of the table migrates waits for the migration to finish; with kill -9 of the metasrv while drops run,
//! the next leader finishes each one. Either way nothing of the table is left: no key in
//! the store (only the id sequence moved), no region open on a datanode, no region storage.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::cluster::{Cluster, get, write};
use crate::support::walctl_path;

/// The keys of table `table_id` (regions `regions`) still in the store, with any tombstone or pending region drop.
fn leftovers(cluster: &Cluster, name: &str, table_id: u64, regions: &[u64]) -> Vec<String> {
    cluster
        .store_keys()
        .into_iter()
        .filter(|k| {
            k == &format!("__table_name/greptime/public/{name}")
                || k == &format!("__table_info/{table_id}")
                || k == &format!("__table_route/{table_id}")
                || (k.starts_with("__dn_table/") && k.ends_with(&format!("/{table_id}")))
                || (k.starts_with("__topic_region/")
                    && regions.iter().any(|r| k.ends_with(&format!("/{r}"))))
                || k.starts_with("__tombstone/")
                || k.starts_with("__region_drop/")
        })
        .collect()
}

/// Waits until the table is gone everywhere: no key, no region open on a datanode, no region storage.
fn assert_gone(cluster: &Cluster, name: &str, regions: &[u64]) {
    let table_id = regions[0] >> 32;
    cluster.wait_for("every key of the dropped table to be gone", || {
        leftovers(cluster, name, table_id, regions).is_empty()
    });
    cluster.wait_for("no datanode to hold a region of the dropped table", || {
        let (_, body) = get(&format!("http://{}/v1/datanodes", cluster.serve_address));
        body["datanodes"].as_array().is_some_and(|nodes| {
            nodes
                .iter()
                .flat_map(|n| n["regions"].as_array().cloned().unwrap_or_default())
                .filter_map(|r| r["region_id"].as_u64())
                .all(|r| !regions.contains(&r))
        })
    });
    for region in regions {
        let dir = cluster.region_storage().join(region.to_string());
        assert!(
            !dir.exists(),
            "region {region}'s storage is left: {}",
            dir.display()
        );
    }
    let (status, body) = get(&format!(
        "http://{}/v1/tables/{name}",
        cluster.serve_address
    ));
    assert_eq!(status, 404, "{body}");
}

#[test]
fn a_drop_under_load_stops_the_writers_saying_so_and_leaves_nothing_of_the_table() {
    let mut cluster = Cluster::start(&[1, 2], 2, "");
    let regions = cluster.create_table("dropped", 4);
    let kept = cluster.create_table("kept", 1);
    let (mut load, _acks) = cluster.start_load("dropped", "120s", &["--concurrency", "4"]);
    std::thread::sleep(Duration::from_secs(2));
    cluster.walctl(&["wal", "flush", "--table", "dropped"]);
    std::thread::sleep(Duration::from_secs(1));
    let flushed = regions
        .iter()
        .filter(|r| cluster.region_storage().join(r.to_string()).exists())
        .count();
    assert!(flushed > 0, "the flush wrote no region storage");
    let (_, before) = get(&format!(
        "http://{}/v1/tables/dropped",
        cluster.serve_address
    ));
    let leaders: Vec<(u64, String)> = before["regions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|r| Some((r["region_id"].as_u64()?, r["address"].as_str()?.to_string())))
        .collect();
    assert_eq!(leaders.len(), regions.len(), "{before}");

    let out = cluster.walctl(&["--json", "drop-table", "dropped"]);
    assert!(out.contains("\"dropped\":true"), "{out}");
    cluster.wait_for("the load to stop", || load.try_exit().is_some());
    let status = load.try_exit().expect("exited");
    let errors = std::fs::read_to_string(load.log.with_extension("err")).unwrap_or_default();
    assert!(
        !status.success(),
        "the load went on after the drop: {errors}"
    );
    assert!(
        errors.contains("table dropped was dropped while the load ran"),
        "the writers are told why they stopped: {errors}"
    );
    assert_gone(&cluster, "dropped", &regions);
    // A client writing to a region's last leader directly is told the table was dropped, not to look elsewhere.
    for (region, address) in &leaders {
        let (status, body) = write(address, *region, &[b"late"]);
        assert_eq!(status, 410, "region {region} at {address}: {body}");
        assert_eq!(body["error"]["kind"], "region_dropped", "{body}");
        assert_eq!(body["error"]["retryable"], false, "{body}");
    }
    // The other table is untouched: its region still leads and takes writes.
    let (_, body) = get(&format!("http://{}/v1/tables/kept", cluster.serve_address));
    assert_eq!(
        body["regions"][0]["region_id"].as_u64(),
        Some(kept[0]),
        "{body}"
    );
    let (mut load, acks) = cluster.start_load("kept", "2s", &[]);
    let report = cluster.finish_load(&mut load);
    assert!(report["acknowledged"].as_u64().unwrap_or(0) > 0, "{report}");
    cluster.assert_nothing_acknowledged_lost(&[acks]);
}

#[test]
fn kill_9_of_the_metasrv_while_drops_run_ends_with_every_table_dropped() {
    let mut cluster = Cluster::start(&[1, 2], 2, "");
    // The metasrv dies at a different moment of each drop: before it is submitted, mid-way, or after.
    for (round, delay_ms) in [0u64, 150, 400].into_iter().enumerate() {
        let name = format!("gone_{round}");
        let regions = cluster.create_table(&name, 3);
        cluster.walctl(&["wal", "flush", "--table", &name]);
        let mut drop = Command::new(walctl_path())
            .current_dir(cluster.dir.path())
            .args(["--server", &cluster.serve_address, "--wait", "60s"])
            .args(["drop-table", &name, "--if-exists"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn drop-table");
        std::thread::sleep(Duration::from_millis(delay_ms));
        cluster.serve.as_mut().expect("serve runs").kill9();
        cluster.start_serve();
        cluster.wait_ready();
        // The command either finished its drop or, cut off, is sent again: either way the table goes.
        let _ = drop.wait();
        cluster.walctl(&["drop-table", &name, "--if-exists"]);
        assert_gone(&cluster, &name, &regions);
    }
}

#[test]
fn a_drop_sent_while_a_region_migrates_waits_for_the_migration_then_drops_everything() {
    let cluster = Cluster::start(&[1, 2], 2, "");
    let regions = cluster.create_table("moving", 2);
    cluster.walctl(&["wal", "flush", "--table", "moving"]);
    let table = cluster.table("moving");
    let region = &table["regions"][0];
    let region_id = region["region_id"].as_u64().expect("region_id");
    let to = if region["datanode_id"].as_u64() == Some(1) {
        2
    } else {
        1
    };
    let out = cluster.walctl(&[
        "--json",
        "migrate-region",
        "--region",
        &region_id.to_string(),
        "--to",
        &to.to_string(),
        "--no-wait",
    ]);
    let submitted: Value = serde_json::from_str(out.trim()).expect("one JSON line");
    let id = submitted["procedure_id"].as_str().expect("procedure_id");
    // The migration holds the table's id shared until its target leads (a lease later): the drop waits for it.
    let out = cluster.walctl(&["--json", "drop-table", "moving"]);
    assert!(out.contains("\"dropped\":true"), "{out}");
    let (_, shown) = get(&format!(
        "http://{}/v1/procedures/{id}",
        cluster.serve_address
    ));
    assert_eq!(
        shown["state"], "done",
        "the migration finished first: {shown}"
    );
    assert_gone(&cluster, "moving", &regions);
}
