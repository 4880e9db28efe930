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
    let table_id = body["table_id"].clone();
    // The id is the idempotency key: the same request again returns the same table.
    let (status, again) = post(
        &servers.servers[first].url("/v1/tables"),
        &json!({"name": "t", "regions": 1, "id": "t-1"}),
    );
    assert_eq!((status, &again["table_id"]), (200, &table_id), "{again}");
    // Another request for the same name is a conflict; a bad name or body names the culprit.
    let (status, conflict) = post(
        &servers.servers[first].url("/v1/tables"),
        &json!({"name": "t", "regions": 1}),
    );
    assert_eq!(status, 409, "{conflict}");
    assert_eq!(conflict["error"]["kind"], "already_exists");
    // Refused by the procedure's first step (no pre-check): the create-table's text, with the id it was given.
    let message = conflict["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("create table greptime.public.t: procedure ")
            && message.ends_with(&format!(
                " failed: table greptime.public.t already exists (table id {table_id})"
            )),
        "{message}"
    );
    let (status, bad) = post(
        &servers.servers[first].url("/v1/tables"),
        &json!({"name": "bad name", "regions": 1}),
    );
    assert_eq!(status, 400, "{bad}");
    assert_eq!(
        bad["error"]["message"],
        "invalid table name 'bad name': character ' ' is not allowed (only [a-zA-Z0-9_-])"
    );
    let (status, bad) = post(
        &servers.servers[first].url("/v1/tables"),
        &json!({"name": "u", "regions": 0}),
    );
    assert_eq!(
        (status, &bad["error"]["message"]),
        (
            400,
            &json!(
                "invalid create-table request for table greptime.public.u: num_regions = 0: a table has 1 to 1024 regions"
            )
        )
    );
    let (status, missing) = get(&servers.servers[first].url("/v1/procedures/nope"));
    assert_eq!(status, 404, "{missing}");
    assert_eq!(missing["error"]["kind"], "not_found");
    assert_eq!(
        missing["error"]["message"],
        "no procedure with id 'nope' (finished procedures are kept for the retention period only)"
    );
    // Control: an unknown action names itself; a finished procedure refuses a pause (409 conflict); purge deletes.
    let (status, bad) = post(
        &servers.servers[first].url("/v1/procedures/t-1/explode"),
        &json!({}),
    );
    assert_eq!(
        (status, &bad["error"]["message"]),
        (
            404,
            &json!("no procedure action 'explode' (cancel, pause or resume)")
        )
    );
    let (status, refused) = post(
        &servers.servers[first].url("/v1/procedures/t-1/pause"),
        &json!({}),
    );
    assert_eq!(
        (status, &refused["error"]["kind"]),
        (409, &json!("conflict")),
        "{refused}"
    );
    let (status, paused) = post(
        &servers.servers[first].url("/v1/procedures/pause"),
        &json!({}),
    );
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused, json!({"requested": "pause", "id": null}));
    let (status, resumed) = post(
        &servers.servers[first].url("/v1/procedures/resume"),
        &json!({}),
    );
    assert_eq!(status, 200, "{resumed}");
    let (status, open) = get(&servers.servers[first].url("/v1/datanodes/1/open-requests"));
    assert_eq!(status, 200, "{open}");
    assert_eq!(open["requests"].as_array().map(Vec::len), Some(1), "{open}");
    assert_eq!(open["errors"], json!([]));
    let (status, bad) = get(&servers.servers[first].url("/v1/datanodes/x/open-requests"));
    assert_eq!(
        (status, &bad["error"]["message"]),
        (400, &json!("datanode id: 'x' is not a number"))
    );
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
    assert_eq!(code, Some(1));
    let log = std::fs::read_to_string(&servers.servers[second].log).unwrap_or_default();
    assert!(
        log.contains(
            "error: redb metadata store 'data/metadata.redb' is already open in another process or handle; only one \
             may hold it"
        ),
        "{log}"
    );

    servers.servers[first].signal("-TERM");
    assert_eq!(
        servers.servers[first].wait(),
        Some(0),
        "{}",
        servers.servers[first].log_tail()
    );
}
