//! Embedded `walctl create-table` on the etcd the servers use: the command joins the servers' election instead of
//! claiming an epoch of its own. Beside a leading server it is sent to that server (the leader keeps its term); with
//! no server it campaigns, runs once it leads, and resigns. Six at once, either way: all succeed, each table once.
//! `bench ddl` joins the election too, but beside a leading server it is refused (it measures a metasrv of its own).

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;

use crate::cluster::{Servers, get};
use crate::support::{endpoints, json_lines, walctl_path};

/// Runs `walctl --config CONFIG --json create-table NAME --regions 1` six times at once; returns each table id.
fn six_at_once(servers: &Servers, tag: &str) -> Vec<u64> {
    let config = servers.dir.path().join("embedded.toml");
    // The servers' file without [server]: an embedded command reads the same store and election.
    std::fs::write(&config, &servers.metasrv_toml).expect("write config");
    let children: Vec<_> = (0..6)
        .map(|i| {
            Command::new(walctl_path())
                .arg("--config")
                .arg(&config)
                .args(["--json", "create-table"])
                .arg(format!("{tag}_{i}"))
                .args(["--regions", "1"])
                .current_dir(servers.dir.path())
                .env_remove("RUST_LOG")
                .spawn_output()
        })
        .collect();
    children
        .into_iter()
        .map(|child| {
            let out = child.join().expect("a walctl thread");
            assert!(
                out.status.success(),
                "embedded create-table failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let lines = json_lines(&String::from_utf8_lossy(&out.stdout));
            lines[0]["table_id"].as_u64().expect("a table id")
        })
        .collect()
}

trait SpawnOutput {
    fn spawn_output(self) -> std::thread::JoinHandle<std::process::Output>;
}

impl SpawnOutput for &mut Command {
    fn spawn_output(self) -> std::thread::JoinHandle<std::process::Output> {
        let child = self
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn walctl");
        std::thread::spawn(move || child.wait_with_output().expect("walctl output"))
    }
}

/// Every procedure the store holds, as `walctl --json procedures list` on `embedded.toml` prints them (read
/// embedded: a read claims nothing).
fn procedures_listed(servers: &Servers) -> Vec<Value> {
    let out = Command::new(walctl_path())
        .arg("--config")
        .arg(servers.dir.path().join("embedded.toml"))
        .args(["--json", "procedures", "list"])
        .current_dir(servers.dir.path())
        .env_remove("RUST_LOG")
        .output()
        .expect("run walctl procedures list");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json_lines(&String::from_utf8_lossy(&out.stdout))
}

/// The create-table procedures the store holds, each done; their outputs.
fn tables_created(servers: &Servers) -> Vec<String> {
    procedures_listed(servers)
        .into_iter()
        .filter(|p| p["type"] == "remote_wal::CreateTable")
        .map(|p| {
            assert_eq!(p["state"], Value::from("done"), "{p}");
            p["output"].to_string()
        })
        .collect()
}

#[test]
fn six_embedded_writers_beside_a_server_and_six_alone_all_succeed_each_table_once() {
    let etcd = endpoints("ETCD_ENDPOINTS");
    let mut servers = Servers::on_etcd(&etcd, 2);
    let leader = servers.wait_for_leader(&[0, 1]);
    let (_, before) = get(&servers.servers[leader].url("/v1/leader"));

    let beside = six_at_once(&servers, "beside");
    // They went through the leader: it kept its term (an embedded writer of old would have fenced it).
    let (_, after) = get(&servers.servers[leader].url("/v1/leader"));
    assert_eq!(after["epoch"], before["epoch"], "{before} -> {after}");
    assert_eq!(after["self"], Value::from(true), "{after}");

    // No server now: SIGTERM resigns, so the commands campaign among themselves.
    for server in &mut servers.servers {
        server.signal("-TERM");
        assert_eq!(server.wait(), Some(0));
    }
    let alone = six_at_once(&servers, "alone");

    let ids: BTreeSet<u64> = beside.iter().chain(&alone).copied().collect();
    assert_eq!(ids.len(), 12, "distinct table ids: {beside:?} {alone:?}");
    // The store holds twelve create-table procedures, each done, none twice.
    let created = tables_created(&servers);
    let distinct: BTreeSet<&String> = created.iter().collect();
    assert_eq!(created.len(), 12, "{created:?}");
    assert_eq!(distinct.len(), 12, "{created:?}");
}

/// Runs `walctl --config … ARGS --wait 1s` on an etcd where another command leads (a candidate without an address)
/// and keeps leading; returns the exit code and stderr, and the epoch of that leader.
fn run_while_another_command_leads(args: &[&str]) -> (Option<i32>, String, i64) {
    let etcd = endpoints("ETCD_ENDPOINTS");
    let (metasrv_toml, prefix) = Servers::etcd_toml(&etcd, "");
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("embedded.toml");
    std::fs::write(&config, metasrv_toml).expect("write config");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut etcd = etcd_client::Client::connect(&etcd, None)
            .await
            .expect("connect to etcd");
        let lease = etcd.lease_grant(60, None).await.expect("a lease").id();
        let won = etcd
            .campaign(
                format!("{prefix}__metasrv/election"),
                r#"{"address":""}"#,
                lease,
            )
            .await
            .expect("campaign");
        let epoch = won.leader().expect("a leader key").rev();
        let out = Command::new(walctl_path())
            .arg("--config")
            .arg(&config)
            .args(args)
            .args(["--wait", "1s"])
            .current_dir(dir.path())
            .env_remove("RUST_LOG")
            .output()
            .expect("run walctl");
        etcd.lease_revoke(lease).await.expect("revoke the lease");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).trim_end().to_string(),
            epoch,
        )
    })
}

#[test]
fn an_embedded_writer_that_cannot_lead_within_wait_fails_naming_the_leader() {
    let (code, stderr, epoch) =
        run_while_another_command_leads(&["create-table", "t", "--regions", "1"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "error: this command did not become the leader within 1s (--wait); the leader is another walctl \
             command (epoch {epoch})"
        )
    );
}

/// `bench ddl` starts the procedure manager to create its tables, so it joins the election like create-table: it
/// waits for its turn instead of claiming an epoch that would fence whoever leads.
#[test]
fn bench_ddl_joins_the_election_and_waits_for_its_turn_like_other_writers() {
    let (code, stderr, epoch) = run_while_another_command_leads(&["bench", "ddl", "--tables", "1"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "error: this command did not become the leader within 1s (--wait); the leader is another walctl \
             command (epoch {epoch})"
        )
    );
}

/// Beside a leading server, `bench ddl` (a load generator measuring a metasrv of its own) is refused naming the
/// server, before it opens the store: the server keeps its term.
#[test]
fn bench_ddl_beside_a_leading_server_is_refused_and_the_server_keeps_its_term() {
    let etcd = endpoints("ETCD_ENDPOINTS");
    let mut servers = Servers::on_etcd(&etcd, 1);
    let leader = servers.wait_for_leader(&[0]);
    let (_, before) = get(&servers.servers[leader].url("/v1/leader"));
    let config = servers.dir.path().join("embedded.toml");
    std::fs::write(&config, &servers.metasrv_toml).expect("write config");
    let out = Command::new(walctl_path())
        .arg("--config")
        .arg(&config)
        .args(["bench", "ddl", "--tables", "1"])
        .current_dir(servers.dir.path())
        .env_remove("RUST_LOG")
        .output()
        .expect("run walctl");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim_end(),
        format!(
            "error: bench ddl runs a procedure manager of its own, and the server at {} leads this store: it \
             cannot run beside a leading server (stop the servers, or run it on another store)",
            servers.servers[leader].address
        )
    );
    let (_, after) = get(&servers.servers[leader].url("/v1/leader"));
    assert_eq!(after["epoch"], before["epoch"], "{before} -> {after}");
    assert_eq!(after["self"], Value::from(true), "{after}");
    servers.servers[leader].signal("-TERM");
    assert_eq!(servers.servers[leader].wait(), Some(0));
}

/// An embedded writer started right after the leading server was killed with kill -9: the election names the dead
/// server until its lease expires. The command does not knock at the dead address (it did, until `--wait` ran out,
/// 18 times of 18); it reads the election again until the next server leads, and is sent there.
#[test]
fn an_embedded_writer_started_just_after_a_leader_crash_reaches_the_next_leader() {
    let etcd = endpoints("ETCD_ENDPOINTS");
    let mut servers = Servers::on_etcd(&etcd, 2);
    let leader = servers.wait_for_leader(&[0, 1]);
    let other = 1 - leader;
    let config = servers.dir.path().join("embedded.toml");
    std::fs::write(&config, &servers.metasrv_toml).expect("write config");
    servers.servers[leader].signal("-KILL");
    let _ = servers.servers[leader].wait();
    let out = Command::new(walctl_path())
        .arg("--config")
        .arg(&config)
        .args(["--json", "create-table", "after_crash", "--regions", "1"])
        .args(["--wait", "30s"])
        .current_dir(servers.dir.path())
        .env_remove("RUST_LOG")
        .output()
        .expect("run walctl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines = json_lines(&String::from_utf8_lossy(&out.stdout));
    assert!(lines[0]["table_id"].as_u64().is_some(), "{lines:?}");
    assert_eq!(servers.wait_for_leader(&[other]), other);
    let (_, leader_now) = get(&servers.servers[other].url("/v1/leader"));
    assert_eq!(leader_now["self"], Value::from(true), "{leader_now}");
}

/// Successful embedded commands on etcd print no WARN or ERROR line: each joins the election, leads, runs and
/// resigns (its lease upkeep stopped before its fence is cleared, so the resignation is not taken for a lost
/// term), and reads claim nothing.
#[test]
fn successful_embedded_commands_on_etcd_print_no_warning() {
    let etcd = endpoints("ETCD_ENDPOINTS");
    let (toml, _) = Servers::etcd_toml(&etcd, "");
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("embedded.toml");
    std::fs::write(&config, toml).expect("write config");
    for args in [
        vec!["create-table", "quiet", "--regions", "2"],
        vec!["procedures", "list"],
        vec!["drop-table", "quiet"],
        vec![
            "create-table",
            "quiet_again",
            "--regions",
            "1",
            "--id",
            "quiet-1",
        ],
    ] {
        let out = Command::new(walctl_path())
            .arg("--config")
            .arg(&config)
            .args(&args)
            .current_dir(dir.path())
            .env_remove("RUST_LOG")
            .output()
            .expect("run walctl");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {stderr}");
        let noisy: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .collect();
        assert!(noisy.is_empty(), "{args:?} printed: {noisy:#?}");
    }
}

/// An embedded command whose config names another pool and other datanodes than the leading server's: sent on, the
/// server would run it with its own config (a bootstrap once made the server's pool and printed it as ready). It is
/// refused, naming the server, the file and each difference with both values, and nothing is created.
#[test]
fn an_embedded_command_whose_config_differs_from_the_leading_servers_is_refused_naming_both() {
    let etcd = endpoints("ETCD_ENDPOINTS");
    let servers = Servers::on_etcd(&etcd, 1);
    let leader = servers.wait_for_leader(&[0]);
    let address = servers.servers[leader].address.clone();
    let config = servers.dir.path().join("drifted.toml");
    let drifted = servers.metasrv_toml.replace("ids = [1, 2]", "ids = [7]")
        + "\n[wal]\nprovider = \"kafka\"\nbroker_endpoints = [\"127.0.0.1:1\"]\ntopic_name_prefix = \"other_pool\"\n";
    assert_ne!(drifted, servers.metasrv_toml);
    std::fs::write(&config, &drifted).expect("write config");
    for args in [
        &["create-table", "drifted", "--regions", "1"][..],
        &["bootstrap"][..],
    ] {
        let out = Command::new(walctl_path())
            .arg("--config")
            .arg(&config)
            .args(args)
            .current_dir(servers.dir.path())
            .env_remove("RUST_LOG")
            .output()
            .expect("run walctl");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(
            stderr.trim_end(),
            format!(
                "error: the server at {address} leads this store and would run this command with its own config, \
                 which differs from {}: datanodes.ids: [7] here, [1,2] on the server; wal.broker_endpoints: \
                 [\"127.0.0.1:1\"] here, not set on the server; wal.num_partitions: 1 here, not set on the server; \
                 wal.num_topics: 64 here, not set on the server; wal.provider: \"kafka\" here, \"raft_engine\" on \
                 the server; wal.replication_factor: 1 here, not set on the server; wal.topic_name_prefix: \
                 \"other_pool\" here, not set on the server; run the command with that server's config, or with \
                 --server {address} to use it knowingly",
                config.display()
            ),
            "{args:?}"
        );
    }
    // No procedure of any kind ran: the server's store holds none.
    std::fs::write(
        servers.dir.path().join("embedded.toml"),
        &servers.metasrv_toml,
    )
    .expect("write config");
    let listed = procedures_listed(&servers);
    assert!(listed.is_empty(), "{listed:?}");
}
