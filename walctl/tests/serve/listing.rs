//! `GET /v1/procedures` answers a page: at most `limit` procedures (100 by default), newest first, with the cursor
//! of the next page, and counts of every match; filters by state and type; bad parameters are a 400 naming them.

use std::collections::HashSet;

use serde_json::{Value, json};

use crate::cluster::{Servers, get, post};

const TABLES: usize = 120;

#[test]
fn the_listing_is_a_page_newest_first_whose_cursors_visit_every_procedure_once() {
    let servers = Servers::on_redb(1);
    let leader = servers.wait_for_leader(&[0]);
    let server = &servers.servers[leader];
    for i in 0..TABLES {
        let (status, body) = post(
            &server.url("/v1/tables"),
            &json!({"name": format!("t{i}"), "regions": 1, "id": format!("t-{i:03}")}),
        );
        assert_eq!(status, 200, "table {i}: {body}");
    }

    let (status, first) = get(&server.url("/v1/procedures"));
    assert_eq!(status, 200, "{first}");
    let listed = first["procedures"].as_array().unwrap();
    assert_eq!(listed.len(), 100);
    assert_eq!(first["matched"], TABLES);
    assert_eq!(first["counts"], json!({"done": TABLES}));
    // The newest first: the last table created heads the list.
    assert_eq!(listed[0]["id"], format!("t-{:03}", TABLES - 1));
    assert!(first["next"].is_string(), "{first}");

    let mut seen = HashSet::new();
    let mut url = server.url("/v1/procedures?limit=50&state=done");
    loop {
        let (status, page) = get(&url);
        assert_eq!(status, 200, "{page}");
        for p in page["procedures"].as_array().unwrap() {
            assert!(
                seen.insert(p["id"].as_str().unwrap().to_string()),
                "{p} twice"
            );
        }
        match page["next"].as_str() {
            Some(next) => {
                let encoded: String = next
                    .bytes()
                    .map(|b| {
                        if b.is_ascii_alphanumeric() {
                            char::from(b).to_string()
                        } else {
                            format!("%{b:02X}")
                        }
                    })
                    .collect();
                url = server.url(&format!(
                    "/v1/procedures?limit=50&state=done&after={encoded}"
                ));
            }
            None => break,
        }
    }
    assert_eq!(seen.len(), TABLES);

    let (status, none) = get(&server.url("/v1/procedures?state=failed,stalled"));
    assert_eq!(status, 200, "{none}");
    assert_eq!(
        (&none["procedures"], &none["matched"], &none["next"]),
        (&json!([]), &json!(0), &Value::Null)
    );
    let (status, other) = get(&server.url("/v1/procedures?type=NoSuchType"));
    assert_eq!((status, &other["matched"]), (200, &json!(0)), "{other}");

    for (query, field) in [
        ("limit=0", "`limit`"),
        ("limit=many", "`limit`"),
        ("state=finished", "`state`"),
        ("after=yesterday", "`after`"),
        ("sort=asc", "'sort'"),
    ] {
        let (status, refused) = get(&server.url(&format!("/v1/procedures?{query}")));
        assert_eq!(
            (status, &refused["error"]["kind"]),
            (400, &json!("bad_request")),
            "{query}: {refused}"
        );
        let message = refused["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(field), "{query}: {message}");
    }
}
