//! Every answer of the API is JSON of one shape, also the ones the router or an extractor gives by itself: an
//! unknown route (404), a method a route does not take (405), a body over the limit (413).

use std::time::Duration;

use serde_json::Value;

use crate::cluster::Servers;

/// The status, the content type and the body parsed as JSON (`Null` when it is not JSON) of `method url` with
/// `body`.
fn call(method: &str, url: &str, body: Vec<u8>) -> (u16, String, Value) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .new_agent();
    let answer = match method {
        "GET" => agent.get(url).call(),
        "PUT" => agent.put(url).send(&body[..]),
        "POST" => agent.post(url).send(&body[..]),
        "DELETE" => agent.delete(url).call(),
        other => panic!("no such method in this test: {other}"),
    };
    let mut answer = answer.unwrap_or_else(|e| panic!("{method} {url} got no answer: {e}"));
    let status = answer.status().as_u16();
    let content_type = answer
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let text = answer.body_mut().read_to_string().unwrap_or_default();
    (
        status,
        content_type,
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

/// Asserts an error answer of the API's shape with `status`, `kind` and `message`.
fn assert_error(answer: (u16, String, Value), status: u16, kind: &str, message: &str) {
    let (got, content_type, body) = answer;
    assert_eq!(got, status, "{body}");
    assert_eq!(content_type, "application/json", "{body}");
    assert_eq!(
        body,
        serde_json::json!({"error": {"kind": kind, "message": message, "retryable": false}})
    );
}

#[test]
fn unknown_routes_wrong_methods_and_oversized_bodies_are_answered_in_json() {
    let servers = Servers::on_redb(1);
    let leader = servers.wait_for_leader(&[0]);
    let server = &servers.servers[leader];

    assert_error(
        call("GET", &server.url("/v2/tables"), Vec::new()),
        404,
        "not_found",
        "no route GET /v2/tables",
    );
    // A long path is quoted cut, never whole.
    let long = format!("/{}", "x".repeat(5000));
    let (status, _, body) = call("GET", &server.url(&long), Vec::new());
    assert_eq!(status, 404, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.ends_with("… (5001 bytes in all)") && message.len() < 200,
        "{message}"
    );
    assert_error(
        call("PUT", &server.url("/v1/leader"), Vec::new()),
        405,
        "method_not_allowed",
        "method PUT is not allowed on /v1/leader (allowed: GET,HEAD)",
    );
    assert_error(
        call("DELETE", &server.url("/v1/tables"), Vec::new()),
        405,
        "method_not_allowed",
        "method DELETE is not allowed on /v1/tables (allowed: POST)",
    );
    // One byte over the limit, so the server has read every byte sent when it answers: a body it leaves unread
    // would make its close a reset, and the client could lose the answer to a broken pipe.
    let frame = r#"{"name":"t","regions":1,"id":""}"#;
    let huge = format!(
        r#"{{"name":"t","regions":1,"id":"{}"}}"#,
        "i".repeat(2 * 1024 * 1024 + 1 - frame.len())
    );
    assert_eq!(huge.len(), 2 * 1024 * 1024 + 1);
    assert_error(
        call("POST", &server.url("/v1/tables"), huge.into_bytes()),
        413,
        "payload_too_large",
        "the request body of POST /v1/tables is larger than 2097152 bytes, the most this server reads",
    );
    // The refused body created nothing.
    let (status, _, list) = call("GET", &server.url("/v1/procedures"), Vec::new());
    assert_eq!(status, 200, "{list}");
    assert!(
        list["procedures"].as_array().is_some_and(|p| p
            .iter()
            .all(|p| p["type_name"] != "remote_wal::CreateTable")),
        "{list}"
    );
    // Answers the handlers give keep their shape and content type.
    assert_error(
        call("GET", &server.url("/v1/procedures/nope"), Vec::new()),
        404,
        "not_found",
        "no procedure with id 'nope' (finished procedures are kept for the retention period only)",
    );
}

#[test]
fn a_procedure_id_in_a_path_that_is_too_long_or_not_printable_is_a_400_quoting_an_excerpt() {
    let servers = Servers::on_redb(1);
    let leader = servers.wait_for_leader(&[0]);
    let server = &servers.servers[leader];
    let long = "a".repeat(5_000);
    let excerpt = format!("{}… (5000 bytes in all)", "a".repeat(64));
    for (method, path) in [
        ("GET", format!("/v1/procedures/{long}")),
        ("POST", format!("/v1/procedures/{long}/cancel")),
        ("DELETE", format!("/v1/procedures/{long}")),
    ] {
        let answer = call(method, &server.url(&path), Vec::new());
        let text = answer.2.to_string();
        assert!(
            text.len() < 1_000,
            "{method} {path}: the id is echoed whole"
        );
        assert_error(
            answer,
            400,
            "bad_request",
            &format!(
                "procedure id '{excerpt}': not a procedure id (at most 1024 bytes of printable text)"
            ),
        );
    }
    // A newline and a right-to-left override are shown escaped, never as themselves.
    assert_error(
        call(
            "GET",
            &server.url("/v1/procedures/p%0Aq%E2%80%AEr"),
            Vec::new(),
        ),
        400,
        "bad_request",
        "procedure id 'p\\nq\\u{202e}r': not a procedure id (at most 1024 bytes of printable text)",
    );
    // An id of the right shape that names nothing is still a 404.
    let (status, _, body) = call(
        "GET",
        &server.url("/v1/procedures/nothing-here"),
        Vec::new(),
    );
    assert_eq!(status, 404, "{body}");
}
