//! `walctl --server`: every command sent to a running server prints exactly what the same command prints when it
//! runs embedded on the same store (stdout byte for byte, the error line, the exit code), in text and with --json.
//! The server runs on a redb file; the commands run through it first, then the server stops and the same commands
//! run embedded on its file. Ages (time since a procedure was created) are the only values masked.
//!
//! `procedures locks` is the one command that answers more through a server: the server's manager knows which keys
//! are held and awaited, the store only which are declared (see
//! `procedures_locks_through_a_server_lists_held_and_awaited_keys`).

use std::process::Command;

use serde_json::{Value, json};

use crate::cluster::{PATIENCE, Servers, free_port, get, post};
use crate::support::walctl_path;

/// The commands, in the order they run in both modes. Commands that would leave a different trace in each mode
/// (an embedded create-table that fails still records its failed procedure; the server refuses before submitting)
/// come after the ones that list procedures.
const COMMANDS: &[&[&str]] = &[
    &["create-table", "t", "--regions", "2", "--id", "t-1"],
    &["create-table", "t", "--regions", "2", "--id", "t-1"],
    &["create-table", "bad name", "--regions", "1"],
    &["create-table", "z", "--regions", "0"],
    &["create-table", "z", "--regions", "1", "--id", ""],
    &["create-table", "z", "--regions", "1", "--id", "a\u{202e}b"],
    // Already exists; an id sent again with another request; a drop of a table that does not exist (each a refusal:
    // no record is left to change the listings below).
    &["create-table", "t", "--regions", "2"],
    &["create-table", "t", "--regions", "3", "--id", "t-1"],
    &["drop-table", "nope"],
    &["procedures", "list"],
    &[
        "procedures",
        "list",
        "--state",
        "done,failed",
        "--limit",
        "1",
    ],
    &["procedures", "list", "--limit", "0"],
    &["procedures", "list", "--state", "finished"],
    &["procedures", "list", "--after", "yesterday"],
    &["failover", "status"],
    &["failover", "pause"],
    &["failover", "pause"],
    &["failover", "status"],
    &["failover", "resume"],
    &["failover", "resume"],
    &["procedures", "show", "t-1"],
    &["procedures", "show", "nope"],
    &["open-regions", "--datanode", "1"],
    &["topics"],
    &["bootstrap"],
    &["wal", "prune"],
    &["procedures", "cancel", "t-1"],
    &["procedures", "cancel", "nope"],
    &["procedures", "pause", "--all"],
    &["procedures", "resume", "--all"],
    &["procedures", "purge", "nope", "--yes"],
];

/// One run: exit code, stdout, and the `error:` lines of stderr.
#[derive(Debug, PartialEq)]
struct Run {
    code: Option<i32>,
    stdout: String,
    errors: Vec<String>,
}

fn run(dir: &std::path::Path, global: &[&str], args: &[&str]) -> Run {
    let out = Command::new(walctl_path())
        .args(global)
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .env_remove("WALCTL_SERVER")
        .output()
        .expect("run walctl");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let errors = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.starts_with("error:"))
        .map(str::to_string)
        .collect();
    Run {
        code: out.status.code(),
        stdout,
        errors,
    }
}

/// A duration as humantime prints it (`3s`, `1m 2s`, `12ms`).
fn is_duration(token: &str) -> bool {
    let digits = token.trim_start_matches(|c: char| c.is_ascii_digit());
    digits.len() < token.len() && ["ms", "s", "m", "h", "d", "us", "ns"].contains(&digits)
}

/// `run` with what depends on the moment masked: `age_ms` in JSON lines, durations (the AGE column, the age line)
/// in text, whose columns are then compared as words.
fn masked(args: &[&str], json: bool, mut run: Run) -> Run {
    // A procedure id the command picked at random (a UUID) is masked in errors: each run picks its own.
    run.errors = run
        .errors
        .iter()
        .map(|line| {
            line.split(' ')
                .map(|w| if is_uuid(w) { "<random id>" } else { w })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    if args[0] != "procedures" || run.code != Some(0) {
        return run;
    }
    run.stdout = run
        .stdout
        .lines()
        .map(|line| {
            if json {
                let mut value: Value = serde_json::from_str(line).expect("a JSON line");
                if let Some(object) = value.as_object_mut() {
                    object.remove("age_ms");
                }
                value.to_string()
            } else {
                line.split_whitespace()
                    .map(|w| if is_duration(w) { "<duration>" } else { w })
                    .collect::<Vec<_>>()
                    .join(" ")
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    run
}

/// Whether `w` is a UUID in its 8-4-4-4-12 hex form.
fn is_uuid(w: &str) -> bool {
    let groups: Vec<&str> = w.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|g| g.chars().all(|c| c.is_ascii_hexdigit()))
}

#[test]
fn every_command_through_a_server_prints_what_it_prints_embedded() {
    let mut servers = Servers::on_redb(1);
    servers.wait_for_leader(&[0]);
    // A server that does not answer comes first: the client moves on to the next.
    let list = format!(
        "http://127.0.0.1:{},{}",
        free_port(),
        servers.servers[0].address
    );
    let config = servers.servers[0].config.to_string_lossy().to_string();
    let dir = servers.dir.path().to_path_buf();

    let mut through_server = Vec::new();
    for args in COMMANDS {
        for json in [false, true] {
            let mut global = vec!["--server", list.as_str()];
            if json {
                global.push("--json");
            }
            through_server.push(masked(args, json, run(&dir, &global, args)));
        }
    }
    servers.servers[0].signal("-TERM");
    assert_eq!(servers.servers[0].wait(), Some(0));

    let mut embedded = Vec::new();
    for args in COMMANDS {
        for json in [false, true] {
            let mut global = vec!["--config", config.as_str()];
            if json {
                global.push("--json");
            }
            embedded.push(masked(args, json, run(&dir, &global, args)));
        }
    }
    let mut differences = Vec::new();
    let mut i = 0;
    for args in COMMANDS {
        for json in [false, true] {
            let (s, e) = (&through_server[i], &embedded[i]);
            if s != e {
                differences.push(format!(
                    "walctl {}{}:\n  --server: {s:?}\n  embedded: {e:?}",
                    if json { "--json " } else { "" },
                    args.join(" ")
                ));
            }
            i += 1;
        }
    }
    assert!(differences.is_empty(), "{}", differences.join("\n"));
    // The commands did run: a table was printed, and errors were errors in both modes.
    assert!(
        through_server[0].stdout.contains("greptime.public.t"),
        "{:?}",
        through_server[0]
    );
    assert_eq!(through_server[4].code, Some(1), "{:?}", through_server[4]);
}

#[test]
fn a_client_with_no_server_answering_gives_up_after_wait_naming_the_servers() {
    let dir = tempfile::tempdir().expect("temp dir");
    let dead = format!("127.0.0.1:{}", free_port());
    let out = run(
        dir.path(),
        &["--server", &dead, "--wait", "1s"],
        &["procedures", "list"],
    );
    assert_eq!(out.code, Some(1), "{out:?}");
    assert_eq!(out.errors.len(), 1, "{out:?}");
    assert!(
        out.errors[0].starts_with(&format!(
            "error: no server took '/v1/procedures' within 1s (--wait): http://{dead}: "
        )),
        "{out:?}"
    );
}

/// Commands that act on the WAL or the metasrv where walctl runs refuse `--server` with a line naming the command,
/// before any request (the server address here answers nothing, and the refusal comes at once, not after `--wait`).
#[test]
fn commands_that_run_where_walctl_runs_refuse_server_naming_themselves() {
    let dir = tempfile::tempdir().expect("temp dir");
    let dead = format!("127.0.0.1:{}", free_port());
    let cases: [(&[&str], &str); 3] = [
        (
            &["open-regions", "--datanode", "1", "--replay"],
            "error: open-regions --replay reads the WAL where walctl runs; it cannot run with --server (run it \
             without --server on the datanode's host)",
        ),
        (
            &["wal", "stats"],
            "error: wal stats reads the topics' offsets where walctl runs; it cannot run with --server (run it \
             without --server)",
        ),
        (
            &["bench", "ddl", "--tables", "1"],
            "error: bench ddl measures the metasrv where walctl runs; it cannot run with --server (run it without \
             --server)",
        ),
    ];
    for (args, want) in cases {
        let out = run(dir.path(), &["--server", &dead, "--wait", "30s"], args);
        assert_eq!(out.code, Some(1), "{args:?}: {out:?}");
        assert_eq!(out.errors, vec![want.to_string()], "{args:?}: {out:?}");
    }
}

/// Polls `url` until `ready` holds for its JSON body; returns that body.
fn wait_for(url: &str, what: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let (status, body) = get(url);
        if status == 200 && ready(&body) {
            return body;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what} did not happen within {PATIENCE:?}: {body}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Through a server, `procedures locks` lists the keys its manager's procedures hold and the key a waiting one
/// awaits, with the procedure in its way. Procedure `a` is held at its first step boundary by a pause of every
/// procedure (a paused procedure keeps its keys); `b`, a create-table of the same name, then waits for the table
/// name key `a` holds.
#[test]
fn procedures_locks_through_a_server_lists_held_and_awaited_keys() {
    let mut servers = Servers::on_redb(1);
    servers.wait_for_leader(&[0]);
    let server = &servers.servers[0];
    let dir = servers.dir.path().to_path_buf();
    let global = ["--server", server.address.as_str()];

    let empty = run(&dir, &global, &["procedures", "locks"]);
    assert_eq!(empty.code, Some(0), "{empty:?}");
    assert_eq!(
        empty.stdout,
        "# lock keys held and awaited now, as the procedure manager of the leading server sees them\n\
         no procedure holds or awaits a lock key\n"
    );

    let (status, body) = post(&server.url("/v1/procedures/pause"), &json!({}));
    assert_eq!(status, 200, "{body}");
    let (status, body) = post(
        &server.url("/v1/tables"),
        &json!({"name": "t", "regions": 1, "id": "a", "wait": false}),
    );
    assert_eq!(status, 202, "{body}");
    wait_for(&server.url("/v1/procedures/a"), "a paused", |p| {
        p["state"] == "paused"
    });
    let (status, body) = post(
        &server.url("/v1/tables"),
        &json!({"name": "t", "regions": 1, "id": "b", "wait": false}),
    );
    assert_eq!(status, 202, "{body}");
    wait_for(&server.url("/v1/locks"), "b waiting", |l| {
        l["locks"].as_array().is_some_and(|all| {
            all.iter()
                .any(|e| e["procedure_id"] == "b" && !e["waiting"].is_null())
        })
    });

    let table_key = "__table_name_lock/greptime/public/t";
    let lines: Vec<Value> = {
        let out = run(
            &dir,
            &["--server", &server.address, "--json"],
            &["procedures", "locks"],
        );
        assert_eq!(out.code, Some(0), "{out:?}");
        out.stdout
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    };
    let held: Vec<&Value> = lines.iter().filter(|l| l["status"] == "held").collect();
    assert!(
        held.iter()
            .all(|l| l["id"] == "a" && l["blocked_by"].is_null()),
        "{lines:?}"
    );
    assert!(
        held.iter()
            .any(|l| l["key"] == table_key && l["exclusive"] == true),
        "{lines:?}"
    );
    let awaited: Vec<&Value> = lines.iter().filter(|l| l["status"] == "awaited").collect();
    assert_eq!(
        awaited,
        vec![&json!({
            "id": "b",
            "key": table_key,
            "exclusive": true,
            "status": "awaited",
            "blocked_by": "a",
            "blocker_holds": true,
        })],
        "{lines:?}"
    );
    assert_eq!(lines.len(), held.len() + 1, "{lines:?}");

    let text = run(&dir, &global, &["procedures", "locks"]);
    assert_eq!(text.code, Some(0), "{text:?}");
    let rows: Vec<Vec<&str>> = text
        .stdout
        .lines()
        .skip(2)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(
        text.stdout
            .lines()
            .nth(1)
            .is_some_and(|h| h.split_whitespace().collect::<Vec<_>>()
                == ["KEY", "MODE", "PROCEDURE", "STATUS", "BLOCKED", "BY"]),
        "{text:?}"
    );
    assert!(
        rows.contains(&vec![table_key, "exclusive", "a", "held"]),
        "{text:?}"
    );
    assert!(
        rows.contains(&vec![
            table_key,
            "exclusive",
            "b",
            "awaited",
            "a",
            "(holds",
            "it)"
        ]),
        "{text:?}"
    );

    // Resumed, `a` creates the table and releases its keys; `b` then takes them and refuses its request: the
    // table exists. A refusal leaves no record, so `b` is gone.
    let (status, body) = post(&server.url("/v1/procedures/resume"), &json!({}));
    assert_eq!(status, 200, "{body}");
    wait_for(&server.url("/v1/procedures/a"), "a done", |p| {
        p["state"] == "done"
    });
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let (status, body) = get(&server.url("/v1/procedures/b"));
        if status == 404 {
            assert_eq!(body["error"]["kind"], "not_found", "{body}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "b did not refuse within {PATIENCE:?}: {status} {body}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let after = run(&dir, &global, &["procedures", "locks"]);
    assert_eq!(after.stdout, empty.stdout, "{after:?}");

    servers.servers[0].signal("-TERM");
    assert_eq!(servers.servers[0].wait(), Some(0));
}

/// A procedure id that is blank, over 128 bytes or not printable is refused with the same line embedded and
/// through a server, quoting the id escaped and cut, and leaves no procedure record in either mode.
#[test]
fn a_bad_procedure_id_is_refused_alike_embedded_and_through_a_server() {
    let mut servers = Servers::on_redb(1);
    servers.wait_for_leader(&[0]);
    let server = servers.servers[0].address.clone();
    let config = servers.servers[0].config.to_string_lossy().to_string();
    let dir = servers.dir.path().to_path_buf();
    let long = "y".repeat(100_000);
    let prefix = "error: invalid create-table request for table greptime.public.u: ";
    let cases: Vec<(&str, String)> = vec![
        ("", format!("{prefix}the procedure id is empty")),
        (
            "a\nb",
            format!(
                "{prefix}the procedure id 'a\\nb' contains the control character U+000A at byte 1; an id must be \
                 printable text"
            ),
        ),
        (
            "ab\u{202E}cd",
            format!(
                "{prefix}the procedure id 'ab\\u{{202e}}cd' contains the bidirectional control character U+202E at \
                 byte 2; an id must be printable text"
            ),
        ),
        (
            &long,
            format!(
                "{prefix}the procedure id '{}… (100000 bytes in all)' is 100000 bytes long; at most 128 are allowed",
                "y".repeat(32)
            ),
        ),
    ];
    let mut through_server = Vec::new();
    for (id, _) in &cases {
        let a = ["create-table", "u", "--regions", "1", "--id", id];
        through_server.push(run(&dir, &["--server", server.as_str()], &a));
    }
    let listed = run(
        &dir,
        &["--server", server.as_str(), "--json"],
        &["procedures", "list"],
    );
    assert_eq!(
        (listed.code, listed.stdout.as_str()),
        (Some(0), ""),
        "{listed:?}"
    );
    servers.servers[0].signal("-TERM");
    assert_eq!(servers.servers[0].wait(), Some(0));
    for ((id, expected), server_run) in cases.iter().zip(&through_server) {
        let a = ["create-table", "u", "--regions", "1", "--id", id];
        let embedded = run(&dir, &["--config", config.as_str()], &a);
        let want = Run {
            code: Some(1),
            stdout: String::new(),
            errors: vec![expected.clone()],
        };
        assert_eq!(server_run, &want, "--server, id of {} bytes", id.len());
        assert_eq!(embedded, want, "embedded, id of {} bytes", id.len());
    }
    let listed = run(
        &dir,
        &["--config", config.as_str(), "--json"],
        &["procedures", "list"],
    );
    assert_eq!(
        (listed.code, listed.stdout.as_str()),
        (Some(0), ""),
        "{listed:?}"
    );
}
