//! Admission: past `[server] max_pending_writes` write requests at once, a write is answered 429 `overloaded` with
//! `Retry-After` and leaves nothing behind; reads and procedure control still answer; once the writes in progress
//! end, the refused one succeeds when sent again.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cluster::{PATIENCE, Servers, get, post};

const LIMIT: usize = 3;

#[test]
fn writes_past_max_pending_writes_get_429_with_retry_after_and_succeed_when_sent_again() {
    let mut servers = Servers::start(
        "[metadata_store]\nbackend = \"redb\"\npath = \"data/metadata.redb\"\n\n[datanodes]\nids = [1]\n"
            .to_string(),
        0,
    );
    servers.server_toml = format!("max_pending_writes = {LIMIT}");
    servers.spawn();
    let server = &servers.servers[servers.wait_for_leader(&[0])];

    // Every procedure paused: creates that wait for their table hold their permits.
    let (status, paused) = post(&server.url("/v1/procedures/pause"), &json!({}));
    assert_eq!(status, 200, "{paused}");
    let holders: Vec<_> = (0..LIMIT)
        .map(|i| {
            let url = server.url("/v1/tables");
            std::thread::spawn(move || {
                post(
                    &url,
                    &json!({"name": format!("held_{i}"), "regions": 1, "id": format!("held-{i}")}),
                )
            })
        })
        .collect();
    // Wait until the server holds all of them (their procedures are stored).
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (_, listed) = get(&server.url("/v1/procedures?type=remote_wal::CreateTable"));
        if listed["matched"].as_u64() == Some(LIMIT as u64) {
            break;
        }
        assert!(Instant::now() < deadline, "{listed}");
        std::thread::sleep(Duration::from_millis(20));
    }

    let refused = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent()
        .post(&server.url("/v1/tables"))
        .send_json(json!({"name": "one_too_many", "regions": 1, "id": "one-too-many"}))
        .expect("an answer");
    assert_eq!(refused.status().as_u16(), 429);
    assert_eq!(
        refused
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let body: Value = refused.into_body().read_json().expect("JSON");
    assert_eq!(body["error"]["kind"], json!("overloaded"), "{body}");
    assert_eq!(body["error"]["retryable"], json!(true), "{body}");
    // Nothing of the refused request was stored; reads answer.
    let (status, shown) = get(&server.url("/v1/procedures/one-too-many"));
    assert_eq!(status, 404, "{shown}");
    assert_eq!(get(&server.url("/ready")).0, 200);

    let (status, resumed) = post(&server.url("/v1/procedures/resume"), &json!({}));
    assert_eq!(status, 200, "{resumed}");
    for holder in holders {
        let (status, body) = holder.join().expect("a holder");
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = post(
        &server.url("/v1/tables"),
        &json!({"name": "one_too_many", "regions": 1, "id": "one-too-many"}),
    );
    assert_eq!(status, 200, "{body}");
}
