//! On redb one server holds the file: it leads alone, and a second one refuses to start, naming the file.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::cluster::{PATIENCE, Servers, get, post};

#[test]
fn a_second_server_on_one_redb_file_refuses_and_the_first_serves_and_stops_on_sigterm() {
    let mut servers = Servers::on_redb(1);
    let first = servers.wait_for_leader(&[0]);
    let (status, body) = post(
        &servers.servers[first].url("/v1/tables"),
        &json!({"name": "t", "regions": 1, "id": "t-1"}),
    );
    assert_eq!(status, 200, "{body}");
    let (_, leader) = get(&servers.servers[first].url("/v1/leader"));
    assert_eq!(leader["self"], json!(true), "{leader}");

    let second = servers.spawn();
    let deadline = Instant::now() + PATIENCE;
    let code = loop {
        if let Some(code) = servers.servers[second].try_exit() {
            break code;
        }
        assert!(Instant::now() < deadline, "the second server did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_ne!(code, Some(0));
    let log = std::fs::read_to_string(&servers.servers[second].log).unwrap_or_default();
    assert!(log.contains("metadata.redb"), "{log}");
    assert!(log.contains("already open"), "{log}");

    servers.servers[first].signal("-TERM");
    assert_eq!(
        servers.servers[first].wait(),
        Some(0),
        "{}",
        servers.servers[first].log_tail()
    );
}
