//! The procedures page at `/`, loaded in headless Chromium (Debian's `chromium`, which `scripts/test.sh`
//! installs; the test fails when it is missing) from two running servers on the shared etcd and Kafka: the leader
//! line, one row per procedure with its state (stuck ones first), one SVG bar per pool topic, and values holding
//! markup shown as text, never run.

use std::collections::BTreeSet;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::cluster::{Servers, get, post, unique};
use crate::support::endpoints;

/// How long one Chromium run may take before the test fails (a bound against hanging, not a speed requirement).
const CHROMIUM_PATIENCE: Duration = Duration::from_secs(60);

/// A type name no loader knows, so the leader's manager shows the record as stalled, with the name in its error.
const SCRIPT_TYPE: &str = "<script>document.title='owned'</script>";
/// The error of a failed record.
const FAILED_ERROR: &str =
    "the datanode answered <img src=x onerror=\"document.title='owned'\"> & gave up";

/// The DOM of `url` after Chromium loaded it (`--dump-dom`), with a throwaway profile.
pub(crate) fn chromium_dom(url: &str) -> String {
    let profile = tempfile::tempdir().expect("a temp profile dir");
    let mut command = Command::new("chromium");
    command
        .arg("--headless")
        .arg("--disable-gpu")
        .arg("--no-first-run")
        .arg("--disable-extensions")
        .arg(format!("--user-data-dir={}", profile.path().display()));
    // Chromium refuses to start as root inside its sandbox.
    if std::fs::metadata("/proc/self").map(|m| m.uid()).ok() == Some(0) {
        command.arg("--no-sandbox");
    }
    let mut child = command
        .arg("--dump-dom")
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run chromium ({e}): this test needs Debian's chromium; scripts/test.sh installs it \
                 (apt-get install chromium)"
            )
        });
    let pid = child.id();
    let mut stdout = child.stdout.take().expect("chromium's stdout");
    let mut stderr = child.stderr.take().expect("chromium's stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut dom = String::new();
        let mut log = String::new();
        let read = stdout.read_to_string(&mut dom);
        let _ = stderr.read_to_string(&mut log);
        let status = child.wait();
        let _ = tx.send((read.map(|_| dom), log, status));
    });
    let Ok((dom, log, status)) = rx.recv_timeout(CHROMIUM_PATIENCE) else {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        panic!("chromium did not dump {url} within {CHROMIUM_PATIENCE:?}");
    };
    let dom = dom.expect("read chromium's output");
    assert!(
        status.as_ref().is_ok_and(|s| s.success()) && dom.contains("</html>"),
        "chromium --dump-dom {url} failed ({status:?}): {dom}\n{log}"
    );
    dom
}

/// An attribute value or text as Chromium serialized it, decoded.
fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&nbsp;", "\u{a0}")
        .replace("&amp;", "&")
}

/// The value of attribute `name` in `tag` (a start tag's text), decoded.
fn attribute(tag: &str, name: &str) -> Option<String> {
    let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    let end = tag[start..].find('"')? + start;
    Some(unescape(&tag[start..end]))
}

/// The part of `dom` from `start` to the next `end` after it.
fn section<'a>(dom: &'a str, start: &str, end: &str) -> &'a str {
    let from = dom
        .find(start)
        .unwrap_or_else(|| panic!("no {start} in the page:\n{dom}"));
    let to = dom[from..].find(end).map_or(dom.len(), |i| from + i);
    &dom[from..to]
}

/// Each procedure row of the page's table: (id, `data-state`, the state cell's text), in page order.
fn procedure_rows(dom: &str) -> Vec<(String, String, String)> {
    let table = section(dom, "<table id=\"procedures\">", "</table>");
    table
        .split("<tr class=\"")
        .skip(1)
        .map(|row| {
            let tag = &row[..row.find('>').unwrap_or(row.len())];
            let cell = section(row, "<td class=\"state\">", "</td>");
            (
                attribute(tag, "data-id").unwrap_or_default(),
                attribute(tag, "data-state").unwrap_or_default(),
                cell["<td class=\"state\">".len()..].to_string(),
            )
        })
        .collect()
}

/// Writes a procedure record into the store under `prefix`, as a manager of an earlier run would have left it.
async fn plant_record(
    etcd: &[String],
    prefix: &str,
    id: &str,
    type_name: &str,
    state: &str,
    error: Option<&str>,
) {
    let now = procedures::record::now_ms();
    let record = json!({
        "format_version": 1, "type_name": type_name, "id": id, "parent_id": null, "step": 1, "state": state,
        "data": {}, "output": null, "error": error, "created_at_ms": now - 60_000, "updated_at_ms": now - 30_000,
        "step_name": "allocate",
    });
    // The shape the engine reads.
    let _: procedures::ProcedureRecord =
        serde_json::from_value(record.clone()).expect("a well-formed procedure record");
    let mut client = etcd_client::Client::connect(etcd, None)
        .await
        .expect("connect to etcd");
    client
        .put(
            format!("{prefix}__procedure__/proc/{id}"),
            record.to_string(),
            None,
        )
        .await
        .expect("write the record");
}

#[test]
fn the_page_shows_leader_procedures_stuck_first_topics_and_escapes_markup() {
    let etcd = endpoints("ETCD_ENDPOINTS");
    let kafka = endpoints("KAFKA_ENDPOINTS");
    let topic_prefix = unique("srvpage");
    let brokers: Vec<String> = kafka.iter().map(|e| format!("{e:?}")).collect();
    let wal = format!(
        "\n[wal]\nprovider = \"kafka\"\nbroker_endpoints = [{}]\nnum_topics = 3\ntopic_name_prefix = \
         \"{topic_prefix}\"\nreplication_factor = 1\n",
        brokers.join(", ")
    );
    let (toml, prefix) = Servers::etcd_toml(&etcd, &wal);
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(plant_record(
        &etcd,
        &prefix,
        "legacy-1",
        SCRIPT_TYPE,
        "running",
        None,
    ));
    runtime.block_on(plant_record(
        &etcd,
        &prefix,
        "failed-<b>1</b>",
        "remote_wal::CreateTable",
        "failed",
        Some(FAILED_ERROR),
    ));

    let servers = Servers::start(toml, 2);
    let leader = servers.wait_for_leader(&[0, 1]);
    let follower = 1 - leader;
    let leader_server = &servers.servers[leader];
    for (name, regions, id) in [
        ("page_a", 3, "page-a"),
        ("page_b", 2, "page-b-<script>alert(1)</script>"),
    ] {
        let (status, body) = post(
            &leader_server.url("/v1/tables"),
            &json!({"name": name, "regions": regions, "id": id}),
        );
        assert_eq!(status, 200, "{body}");
    }
    let (status, elected) = get(&leader_server.url("/v1/leader"));
    assert_eq!(status, 200, "{elected}");
    let epoch = elected["epoch"].as_u64().expect("an epoch");
    assert_eq!(elected["leader"], json!(leader_server.address));

    // What the page must show, as the API says it.
    let (_, listed) = get(&leader_server.url("/v1/procedures"));
    let expected: BTreeSet<(String, String)> = listed["procedures"]
        .as_array()
        .expect("a procedure list")
        .iter()
        .map(|p| (as_string(&p["id"]), as_string(&p["state"])))
        .collect();
    assert!(
        expected.contains(&("legacy-1".to_string(), "stalled".to_string()))
            && expected.contains(&("failed-<b>1</b>".to_string(), "failed".to_string())),
        "{listed}"
    );
    let (_, topics) = get(&leader_server.url("/v1/topics"));
    let topics = topics["topics"].as_array().cloned().unwrap_or_default();
    assert_eq!(topics.len(), 3, "{topics:?}");

    let dom = chromium_dom(&leader_server.url("/"));
    // No markup from a value made it into the DOM: the page has no script at all, and the title is its own.
    assert!(!dom.to_lowercase().contains("<script"), "{dom}");
    assert!(!dom.contains("<img"), "{dom}");
    assert!(!dom.contains("<b>"), "{dom}");
    assert!(
        dom.contains(&format!(
            "<title>walctl serve {}: procedures &amp; locks</title>",
            leader_server.address
        )),
        "{dom}"
    );
    assert!(
        dom.contains(
            "no loader is registered for type '&lt;script&gt;document.title='owned'&lt;/script&gt;'"
        ),
        "the stalled procedure's error, as text: {dom}"
    );
    assert!(
        dom.contains(
            "the datanode answered &lt;img src=x onerror=\"document.title='owned'\"&gt; &amp; gave up"
        ),
        "the failed procedure's error, as text: {dom}"
    );

    // The leader line and this server's role.
    assert!(
        dom.contains(&format!(
            "<p id=\"leader\">Leader: <a href=\"http://{a}/\"><code>{a}</code></a>, epoch {epoch}</p>",
            a = leader_server.address
        )),
        "{dom}"
    );
    assert!(
        dom.contains(&format!(
            "<strong id=\"role\">leader</strong> (epoch {epoch})"
        )),
        "{dom}"
    );

    // One row per procedure with its state, the stuck ones (stalled, then failed) first.
    let rows = procedure_rows(&dom);
    let shown: BTreeSet<(String, String)> = rows
        .iter()
        .map(|(id, state, cell)| {
            assert_eq!(state, cell, "row {id}");
            (id.clone(), state.clone())
        })
        .collect();
    assert_eq!(rows.len(), expected.len(), "{rows:?}");
    assert_eq!(shown, expected);
    assert_eq!(
        rows[..2]
            .iter()
            .map(|(id, state, _)| (id.as_str(), state.as_str()))
            .collect::<Vec<_>>(),
        [("legacy-1", "stalled"), ("failed-<b>1</b>", "failed")]
    );

    // One bar per pool topic, with its regions (5 regions over 3 topics).
    let svg = section(&dom, "<svg id=\"topic-regions\"", "</svg>");
    let bars: Vec<(String, String)> = svg
        .split("<rect ")
        .skip(1)
        .map(|tag| {
            (
                attribute(tag, "data-topic").unwrap_or_default(),
                attribute(tag, "data-regions").unwrap_or_default(),
            )
        })
        .collect();
    let wanted: Vec<(String, String)> = topics
        .iter()
        .map(|t| (as_string(&t["topic"]), t["regions"].to_string()))
        .collect();
    assert_eq!(bars, wanted, "{svg}");
    let total: u64 = topics.iter().filter_map(|t| t["regions"].as_u64()).sum();
    assert_eq!(total, 5, "{topics:?}");

    // A follower renders the page too, naming the leader, with the records as the store holds them.
    let dom = chromium_dom(&servers.servers[follower].url("/"));
    assert!(
        dom.contains("<strong id=\"role\">follower</strong>"),
        "{dom}"
    );
    assert!(
        dom.contains(&format!(
            "<p id=\"leader\">Leader: <a href=\"http://{a}/\"><code>{a}</code></a>, epoch {epoch}</p>",
            a = leader_server.address
        )),
        "{dom}"
    );
    assert!(dom.contains("<p id=\"locks-elsewhere\">"), "{dom}");
    assert_eq!(procedure_rows(&dom).len(), expected.len(), "{dom}");
    assert_eq!(
        section(&dom, "<svg id=\"topic-regions\"", "</svg>")
            .matches("<rect ")
            .count(),
        3
    );
}

fn as_string(v: &Value) -> String {
    v.as_str()
        .map(str::to_string)
        .unwrap_or_else(|| v.to_string())
}
