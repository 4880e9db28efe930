//! An embedded `walctl create-table` on the etcd the servers use: it claims an epoch the old way and supersedes
//! the leader's, so the leader's next write is refused; the leader steps down, wins a newer term and serves again.
//! (Issue 14 item 5 will make embedded writers join the election instead.)

use std::process::Command;

use serde_json::json;

use crate::cluster::{Servers, create_table_following_the_leader, get, get_text};
use crate::support::{endpoints, walctl_path};

#[test]
fn an_embedded_writer_supersedes_the_leader_which_steps_down_and_serves_again() {
    let etcd = endpoints("ETCD_ENDPOINTS");
    let servers = Servers::on_etcd(&etcd, 2);
    let leader = servers.wait_for_leader(&[0, 1]);
    let addresses: Vec<String> = servers.servers.iter().map(|s| s.address.clone()).collect();
    let (_, first) = get(&servers.servers[leader].url("/v1/leader"));
    let first_epoch = first["epoch"].as_u64().expect("an epoch");
    create_table_following_the_leader(&addresses, "served_1", "served-1", None);

    // The embedded command reads the same file (it ignores [server]).
    let out = Command::new(walctl_path())
        .arg("--config")
        .arg(&servers.servers[0].config)
        .args([
            "create-table",
            "embedded_1",
            "--regions",
            "1",
            "--id",
            "embedded-1",
        ])
        .current_dir(servers.dir.path())
        .output()
        .expect("run walctl create-table");
    assert!(
        out.status.success(),
        "embedded create-table failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The next write through the servers succeeds (after the leader noticed and was elected again, if need be).
    create_table_following_the_leader(&addresses, "served_2", "served-2", None);
    let now = servers.wait_for_leader(&[0, 1]);
    let (_, leader_now) = get(&servers.servers[now].url("/v1/leader"));
    let epoch = leader_now["epoch"].as_u64().expect("an epoch");
    assert!(epoch > first_epoch, "epoch {epoch} after {first_epoch}");
    let fenced: u64 = servers
        .servers
        .iter()
        .map(|s| {
            get_text(&s.url("/metrics"))
                .lines()
                .find_map(|l| l.strip_prefix("walctl_fenced_writes_total "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        })
        .sum();
    assert!(fenced >= 1, "no server counted a fenced write");
    for table in ["served_1", "embedded_1", "served_2"] {
        let (status, body) =
            get(&servers.servers[now].url(&format!("/v1/procedures/{}", table.replace('_', "-"))));
        assert_eq!(
            (status, &body["state"]),
            (200, &json!("done")),
            "{table}: {body}"
        );
    }
}
