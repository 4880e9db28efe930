//! Client mistakes are 4xx answers of their own kind, found by typed errors, and leave no procedure record: a table
//! that exists (409 `already_exists`, also for the losers of a race), an idempotency key sent with another request
//! (409 `conflict` naming the difference, with `"wait":true` and `"wait":false` alike, never a 202), a control of
//! an unknown procedure (404). The same key with the same request returns that procedure's answer.

use serde_json::{Value, json};

use crate::cluster::{Servers, get, post};

/// The procedures the server lists.
fn procedures(server: &str) -> Vec<Value> {
    let (status, list) = get(&format!("http://{server}/v1/procedures"));
    assert_eq!(status, 200, "{list}");
    list["procedures"].as_array().cloned().unwrap_or_default()
}

#[test]
fn an_id_sent_with_another_request_is_a_conflict_naming_the_difference_in_both_wait_modes() {
    let servers = Servers::on_redb(1);
    let leader = servers.wait_for_leader(&[0]);
    let server = &servers.servers[leader];
    let tables = server.url("/v1/tables");
    let (status, first) = post(&tables, &json!({"name": "t", "regions": 1, "id": "t-1"}));
    assert_eq!(status, 200, "{first}");

    for wait in [true, false] {
        let (status, other) = post(
            &tables,
            &json!({"name": "u", "regions": 1, "id": "t-1", "wait": wait}),
        );
        assert_eq!(
            (status, &other["error"]["kind"]),
            (409, &json!("conflict")),
            "wait {wait}: {other}"
        );
        assert_eq!(
            other["error"]["message"],
            "procedure id t-1 was already used for another create-table task (table greptime.public.t, 1 \
             region(s); this request differs: table greptime.public.u, not greptime.public.t); a retry must send \
             the same task, another task needs another id",
            "wait {wait}"
        );
        let (status, more) = post(
            &tables,
            &json!({"name": "t", "regions": 3, "id": "t-1", "wait": wait}),
        );
        assert_eq!(status, 409, "wait {wait}: {more}");
        let message = more["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("this request differs: 3 region(s), not 1)"),
            "wait {wait}: {message}"
        );
    }
    // The refused requests created nothing: no table u, one procedure (t-1's).
    let (status, missing) = get(&server.url("/v1/tables/u"));
    assert_eq!(status, 404, "{missing}");
    let listed = procedures(&server.address);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["id"], "t-1");

    // The same id with the same request: that procedure's answer, in both modes.
    let (status, again) = post(&tables, &json!({"name": "t", "regions": 1, "id": "t-1"}));
    assert_eq!(
        (status, &again["table_id"]),
        (200, &first["table_id"]),
        "{again}"
    );
    let (status, accepted) = post(
        &tables,
        &json!({"name": "t", "regions": 1, "id": "t-1", "wait": false}),
    );
    assert_eq!((status, accepted), (202, json!({"procedure_id": "t-1"})));
}

#[test]
fn an_existing_table_is_a_conflict_that_leaves_no_record_also_for_the_losers_of_a_race() {
    let servers = Servers::on_redb(1);
    let leader = servers.wait_for_leader(&[0]);
    let address = servers.servers[leader].address.clone();
    let tables = format!("http://{address}/v1/tables");
    let (status, created) = post(&tables, &json!({"name": "t", "regions": 1, "id": "t-1"}));
    assert_eq!(status, 200, "{created}");
    let (status, exists) = post(&tables, &json!({"name": "t", "regions": 1, "id": "t-2"}));
    assert_eq!(
        (status, &exists["error"]["kind"]),
        (409, &json!("already_exists")),
        "{exists}"
    );
    assert_eq!(
        exists["error"]["message"],
        json!(format!(
            "create table greptime.public.t: procedure t-2 failed: table greptime.public.t already exists (table \
             id {})",
            created["table_id"]
        ))
    );
    let (status, gone) = get(&format!("http://{address}/v1/procedures/t-2"));
    assert_eq!(status, 404, "{gone}");

    // Twenty creates of one new name at once: one creates it, every other is refused by the procedure itself.
    let racers: Vec<_> = (0..20)
        .map(|i| {
            let tables = tables.clone();
            std::thread::spawn(move || {
                post(
                    &tables,
                    &json!({"name": "race", "regions": 1, "id": format!("race-{i}")}),
                )
            })
        })
        .collect();
    let answers: Vec<(u16, Value)> = racers
        .into_iter()
        .map(|r| r.join().expect("a racer panicked"))
        .collect();
    let created = answers.iter().filter(|(s, _)| *s == 200).count();
    let refused = answers
        .iter()
        .filter(|(s, v)| *s == 409 && v["error"]["kind"] == "already_exists")
        .count();
    assert_eq!((created, refused), (1, 19), "{answers:?}");
    // No refused request left a record: the listing holds t-1 and the one winner, both done.
    let listed = procedures(&address);
    let states: Vec<(&str, &str)> = listed
        .iter()
        .map(|p| {
            (
                p["id"].as_str().unwrap_or(""),
                p["state"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(listed.len(), 2, "{states:?}");
    assert!(
        states.iter().all(|(_, state)| *state == "done"),
        "{states:?}"
    );
}

#[test]
fn a_control_of_an_unknown_procedure_is_not_found() {
    let servers = Servers::on_redb(1);
    let leader = servers.wait_for_leader(&[0]);
    let server = &servers.servers[leader];
    for action in ["cancel", "pause", "resume"] {
        let (status, answer) = post(
            &server.url(&format!("/v1/procedures/nope/{action}")),
            &json!({}),
        );
        assert_eq!(
            (status, &answer["error"]["kind"]),
            (404, &json!("not_found")),
            "{answer}"
        );
        assert_eq!(
            answer["error"]["message"],
            json!(format!(
                "cannot {action} procedure nope: the store holds no record at 'proc/nope'"
            ))
        );
    }
}
