//! The HTTP API's security (`docs/security.md`, "HTTP") on real `walctl serve` processes: bearer tokens and their
//! scopes (401, 403, SIGHUP reloads, the walctl client's `--token-file` / `WALCTL_TOKEN`), HTTPS with `--ca`, the
//! page escaping what clients wrote, no token in any output, and 2,000 slow connections that neither starve the
//! leader nor cost it its lease.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cluster::{PATIENCE, Server, Servers, get};
use crate::support::{endpoints, walctl_path};

const READ: &str = "read-token-0123456789abcdef";
const WRITE: &str = "write-token-0123456789abcdef";
/// Replaces [`WRITE`] on the reload.
const ROTATED: &str = "rotated-write-token-0123456789";
/// A token no file holds.
const WRONG: &str = "wrong-token-0123456789abcdef";

/// One server on a redb file of its own.
const REDB: &str = "[metadata_store]\nbackend = \"redb\"\npath = \"data/metadata.redb\"\n\n[datanodes]\nids = [1]\n";

/// An answer: status, `WWW-Authenticate`, and the body (JSON, or the text as a JSON string).
struct Answer {
    status: u16,
    challenge: Option<String>,
    /// Whether the answer says the server closes the connection after it (`Connection: close`).
    closes: bool,
    body: Value,
    text: String,
}

fn agent(ca: Option<&Path>) -> ureq::Agent {
    let mut tls = ureq::tls::TlsConfig::builder();
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).expect("read the authority");
        let certs: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&pem)
            .filter_map(|item| match item.expect("PEM") {
                ureq::tls::PemItem::Certificate(cert) => Some(cert),
                _ => None,
            })
            .collect();
        tls = tls.root_certs(ureq::tls::RootCerts::Specific(Arc::new(certs)));
    }
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .tls_config(tls.build())
        .build()
        .new_agent()
}

/// `method url` with `token` as a bearer token and `body` as JSON; panics when no answer arrives.
fn send(
    agent: &ureq::Agent,
    method: &str,
    url: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> Answer {
    let authorization = token.map(|t| format!("Bearer {t}"));
    let sent = match method {
        "GET" => {
            let mut request = agent.get(url);
            if let Some(a) = &authorization {
                request = request.header("Authorization", a);
            }
            request.call()
        }
        "POST" => {
            let mut request = agent.post(url);
            if let Some(a) = &authorization {
                request = request.header("Authorization", a);
            }
            match body {
                Some(body) => request.send_json(body),
                None => request.send_empty(),
            }
        }
        other => panic!("no method {other} here"),
    };
    let mut response = sent.unwrap_or_else(|e| panic!("{method} {url}: no answer: {e}"));
    let status = response.status().as_u16();
    let challenge = response
        .headers()
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let closes = response
        .headers()
        .get("connection")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("close"));
    let text = response.body_mut().read_to_string().unwrap_or_default();
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    Answer {
        status,
        challenge,
        closes,
        body,
        text,
    }
}

/// `walctl ARGS` with the environment's server and token removed and `env` added.
fn walctl(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(walctl_path());
    command
        .args(args)
        .env_remove("WALCTL_SERVER")
        .env_remove("WALCTL_TOKEN")
        .env_remove("RUST_LOG");
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().expect("run walctl")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Writes `text` to `name` in `dir`.
fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write a file");
    path
}

/// The `[server]` line naming the tokens file.
fn auth_toml(tokens: &Path) -> String {
    format!(
        "auth = {{ tokens_file = {:?} }}\n",
        tokens.display().to_string()
    )
}

/// Waits until `check` holds, for at most [`PATIENCE`].
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !check() {
        assert!(Instant::now() < deadline, "{what} within {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn tokens_scope_the_api_and_sighup_reloads_them() {
    let mut servers = Servers::start(REDB.to_string(), 0);
    let dir = servers.dir.path().to_path_buf();
    let tokens = write(
        &dir,
        "tokens",
        &format!("# the test's tokens\nread {READ}\n\nwrite   {WRITE}\n"),
    );
    servers.server_toml = auth_toml(&tokens);
    servers.spawn();
    // /ready answers without a token (the fixture's wait uses it).
    servers.wait_for_leader(&[0]);
    let server = &servers.servers[0];
    let agent = agent(None);
    let url = |path: &str| server.url(path);

    assert_eq!(send(&agent, "GET", &url("/health"), None, None).status, 200);
    for (token, invalid) in [(None, false), (Some(WRONG), true)] {
        let answer = send(&agent, "GET", &url("/v1/procedures"), token, None);
        assert_eq!(answer.status, 401, "{}", answer.text);
        assert!(!answer.closes, "a refused GET has no body left unread");
        assert_eq!(answer.body["error"]["kind"], json!("unauthorized"));
        assert_eq!(answer.body["error"]["retryable"], json!(false));
        let challenge = answer.challenge.expect("WWW-Authenticate");
        assert!(challenge.starts_with("Bearer"), "{challenge}");
        assert_eq!(challenge.contains("invalid_token"), invalid, "{challenge}");
    }
    // A read token reads and cannot write; nothing of the refused write is stored.
    assert_eq!(
        send(&agent, "GET", &url("/v1/procedures"), Some(READ), None).status,
        200
    );
    let create = json!({"name": "by_read", "regions": 1, "id": "by-read"});
    let refused = send(
        &agent,
        "POST",
        &url("/v1/tables"),
        Some(READ),
        Some(&create),
    );
    assert_eq!(refused.status, 403, "{}", refused.text);
    assert_eq!(refused.body["error"]["kind"], json!("forbidden"));
    // Its body was never read, so the server closes that connection and says so: the client's next request goes
    // on a new one instead of failing on a dropped connection.
    assert!(
        refused.closes,
        "a refusal of an unread body keeps the connection open"
    );
    let shown = send(
        &agent,
        "GET",
        &url("/v1/procedures/by-read"),
        Some(READ),
        None,
    );
    assert_eq!(shown.status, 404, "{}", shown.text);
    let paused = send(
        &agent,
        "POST",
        &url("/v1/procedures/pause"),
        Some(READ),
        None,
    );
    assert_eq!(paused.status, 403, "{}", paused.text);
    let created = send(
        &agent,
        "POST",
        &url("/v1/tables"),
        Some(WRITE),
        Some(&create),
    );
    assert_eq!(created.status, 200, "{}", created.text);
    // The metrics and the page need a read token (metrics_public is off).
    for path in ["/metrics", "/"] {
        assert_eq!(send(&agent, "GET", &url(path), None, None).status, 401);
        assert_eq!(
            send(&agent, "GET", &url(path), Some(READ), None).status,
            200
        );
    }

    // The walctl client: --token-file, WALCTL_TOKEN, and none.
    let write_file = write(&dir, "write.token", &format!("{WRITE}\n"));
    let out = walctl(
        &[
            "--server",
            &server.address,
            "--token-file",
            &write_file.display().to_string(),
            "--json",
            "create-table",
            "by_client",
            "--regions",
            "1",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let table: Value =
        serde_json::from_str(text.lines().next().unwrap_or_default()).expect("JSON lines");
    assert!(table["table_id"].is_u64(), "{text}");
    let out = walctl(
        &[
            "--server",
            &server.address,
            "create-table",
            "by_env",
            "--regions",
            "1",
        ],
        &[("WALCTL_TOKEN", READ)],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("needs a write token") && stderr(&out).contains(&server.address),
        "{}",
        stderr(&out)
    );
    let out = walctl(&["--server", &server.address, "topics"], &[]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("bearer token"), "{}", stderr(&out));

    // SIGHUP: the rotated file replaces the old tokens.
    write(&dir, "tokens", &format!("read {READ}\nwrite {ROTATED}\n"));
    server.signal("-HUP");
    eventually("the rotated token is taken", || {
        send(&agent, "GET", &url("/v1/procedures"), Some(ROTATED), None).status == 200
    });
    assert_eq!(
        send(&agent, "GET", &url("/v1/procedures"), Some(WRITE), None).status,
        401
    );
    // A bad file on SIGHUP keeps the tokens in force and names the file and the line, never a token.
    write(&dir, "tokens", &format!("read {READ}\nadmin {WRONG}\n"));
    server.signal("-HUP");
    eventually("the bad file is reported", || {
        std::fs::read_to_string(&server.log)
            .unwrap_or_default()
            .contains("line 2")
    });
    let log = std::fs::read_to_string(&server.log).unwrap_or_default();
    assert!(
        log.contains(&tokens.display().to_string()),
        "the error names the file: {log}"
    );
    for token in [READ, WRITE, ROTATED, WRONG] {
        assert!(!log.contains(token), "the log holds a token: {log}");
    }
    let again = send(
        &agent,
        "POST",
        &url("/v1/tables"),
        Some(ROTATED),
        Some(&json!({"name": "after_bad_reload", "regions": 1})),
    );
    assert_eq!(again.status, 200, "{}", again.text);
}

#[test]
fn https_with_a_token_untrusted_authorities_and_plain_http_are_told_apart() {
    let mut servers = Servers::start(REDB.to_string(), 0);
    let dir = servers.dir.path().to_path_buf();
    let certs = make_certs(&dir);
    let tokens = write(&dir, "tokens", &format!("write {WRITE}\n"));
    let token_file = write(&dir, "client.token", &format!("write {WRITE}\n"));
    servers.server_toml = format!(
        "{}tls = {{ cert = {:?}, key = {:?} }}\n",
        auth_toml(&tokens),
        certs.join("server.pem").display().to_string(),
        certs.join("server.key").display().to_string()
    );
    servers.spawn();
    let server: &Server = &servers.servers[0];
    let ca = certs.join("ca.pem");
    let https = agent(Some(&ca));
    let base = format!("https://{}", server.address);
    eventually("the server is ready over HTTPS", || {
        https
            .get(&format!("{base}/ready"))
            .call()
            .is_ok_and(|r| r.status().as_u16() == 200)
    });

    // A create over HTTPS with a token, through the walctl client.
    let out = walctl(
        &[
            "--server",
            &base,
            "--ca",
            &ca.display().to_string(),
            "--token-file",
            &token_file.display().to_string(),
            "--json",
            "create-table",
            "over_tls",
            "--regions",
            "2",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let table: Value =
        serde_json::from_str(text.lines().next().unwrap_or_default()).expect("JSON lines");
    assert!(table["table_id"].is_u64(), "{text}");

    // An authority that did not sign the certificate: refused at once, naming the server.
    let out = walctl(
        &[
            "--server",
            &base,
            "--ca",
            &certs.join("other-ca.pem").display().to_string(),
            "--token-file",
            &token_file.display().to_string(),
            "topics",
        ],
        &[],
    );
    assert!(!out.status.success());
    let error = stderr(&out);
    assert!(
        error.contains(&server.address) && error.contains("TLS") && error.contains("--ca"),
        "{error}"
    );

    // Plain HTTP on the TLS port: a 400 saying so, to ureq and to the walctl client.
    let plain = send(
        &agent(None),
        "GET",
        &format!("http://{}/health", server.address),
        None,
        None,
    );
    assert_eq!(plain.status, 400, "{}", plain.text);
    assert_eq!(plain.body["error"]["kind"], json!("bad_request"));
    assert!(
        plain.body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("speaks HTTPS only")),
        "{}",
        plain.text
    );
    let out = walctl(
        &[
            "--server",
            &format!("http://{}", server.address),
            "--token-file",
            &token_file.display().to_string(),
            "topics",
        ],
        &[],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(&format!("call https://{}", server.address)),
        "{}",
        stderr(&out)
    );
}

#[test]
fn the_page_escapes_ids_and_names_clients_wrote() {
    let mut servers = Servers::start(REDB.to_string(), 0);
    let dir = servers.dir.path().to_path_buf();
    let tokens = write(&dir, "tokens", &format!("write {WRITE}\n"));
    // The page is public here, the API not: Chromium loads it without a token.
    servers.server_toml = format!("{}metrics_public = true\n", auth_toml(&tokens));
    servers.spawn();
    servers.wait_for_leader(&[0]);
    let server = &servers.servers[0];
    let agent = agent(None);
    assert_eq!(
        send(&agent, "GET", &server.url("/v1/procedures"), None, None).status,
        401
    );
    assert_eq!(
        send(&agent, "GET", &server.url("/metrics"), None, None).status,
        200
    );

    // Table names are validated: markup in one is refused (400) and stored nowhere.
    for name in [
        "<img src=x onerror=alert(1)>",
        "\"><script>alert(1)</script>",
    ] {
        let refused = send(
            &agent,
            "POST",
            &server.url("/v1/tables"),
            Some(WRITE),
            Some(&json!({"name": name, "regions": 1})),
        );
        assert_eq!(refused.status, 400, "{name}: {}", refused.text);
    }
    // Procedure ids are free text: they carry the markup to the page instead.
    let ids = [
        "<img src=x onerror=alert(1)>",
        "\"><script>document.title='owned'</script>",
    ];
    for (i, id) in ids.iter().enumerate() {
        let created = send(
            &agent,
            "POST",
            &server.url("/v1/tables"),
            Some(WRITE),
            Some(&json!({"name": format!("escaped_{i}"), "regions": 1, "id": id})),
        );
        assert_eq!(created.status, 200, "{}", created.text);
    }
    let dom = crate::page::chromium_dom(&server.url("/"));
    let lower = dom.to_lowercase();
    assert!(!lower.contains("<script"), "an injected script: {dom}");
    assert!(!lower.contains("<img"), "an injected image: {dom}");
    assert!(
        section_has_title(&dom, &server.address),
        "the page's own title: {dom}"
    );
    assert!(
        dom.contains("&lt;img src=x onerror=alert(1)&gt;"),
        "the first id as text: {dom}"
    );
    assert!(
        dom.contains("\"&gt;&lt;script&gt;document.title='owned'&lt;/script&gt;")
            || dom.contains("&quot;&gt;&lt;script&gt;"),
        "the second id as text: {dom}"
    );
}

/// Whether the page's title is its own (an injected script would have set another).
fn section_has_title(dom: &str, address: &str) -> bool {
    dom.contains(&format!(
        "<title>walctl serve {address}: procedures &amp; locks</title>"
    ))
}

#[test]
fn no_token_appears_in_logs_answers_metrics_the_page_or_json_output() {
    let mut servers = Servers::start(REDB.to_string(), 0);
    let dir = servers.dir.path().to_path_buf();
    let tokens = write(&dir, "tokens", &format!("read {READ}\nwrite {WRITE}\n"));
    servers.server_toml = auth_toml(&tokens);
    servers.rust_log = "debug".to_string();
    servers.spawn();
    servers.wait_for_leader(&[0]);
    let server = &servers.servers[0];
    let agent = agent(None);
    let mut seen = Vec::new();
    let body = json!({"name": "secrets", "regions": 1, "id": "secrets-1"});
    for (method, path, token, body) in [
        ("GET", "/v1/procedures", Some(WRONG), None),
        ("POST", "/v1/tables", Some(READ), Some(&body)),
        ("POST", "/v1/tables", Some(WRITE), Some(&body)),
        ("POST", "/v1/tables", Some(WRITE), Some(&body)),
        ("GET", "/v1/procedures/secrets-1", Some(READ), None),
        ("GET", "/v1/procedures", Some(READ), None),
        ("GET", "/metrics", Some(READ), None),
        ("GET", "/", Some(READ), None),
        ("GET", "/v1/nowhere", Some(WRITE), None),
    ] {
        let answer = send(&agent, method, &server.url(path), token, body);
        seen.push(format!(
            "{method} {path}: {} {}",
            answer.status, answer.text
        ));
    }
    let token_file = write(&dir, "client.token", &format!("{WRITE}\n"));
    for (args, env) in [
        (
            vec!["--json", "procedures", "list"],
            vec![("WALCTL_TOKEN", READ)],
        ),
        (vec!["--json", "topics"], vec![("WALCTL_TOKEN", WRONG)]),
        (
            vec![
                "--json",
                "--token-file",
                token_file.to_str().expect("a UTF-8 path"),
                "create-table",
                "secrets_cli",
                "--regions",
                "1",
            ],
            vec![("RUST_LOG", "debug")],
        ),
    ] {
        let mut all = vec!["--server", server.address.as_str()];
        all.extend(args);
        let out = walctl(&all, &env);
        seen.push(format!("{all:?}: {}{}", stdout(&out), stderr(&out)));
    }
    // A server refusing to start on a bad tokens file names the file, never the line's words.
    let bad = write(
        &dir,
        "bad-tokens",
        &format!("write {WRITE}\nadmin {READ}\n"),
    );
    let config = write(
        &dir,
        "bad.toml",
        &format!(
            "{}\n[server]\nlisten = \"127.0.0.1:0\"\n{}",
            REDB.replace(
                "data/metadata.redb",
                &dir.join("bad.redb").display().to_string()
            ),
            auth_toml(&bad)
        ),
    );
    let out = walctl(
        &["--config", &config.display().to_string(), "serve"],
        &[("RUST_LOG", "debug")],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("bad-tokens line 2"),
        "{}",
        stderr(&out)
    );
    assert!(
        !dir.join("bad.redb").exists(),
        "the tokens are read before the store is opened"
    );
    seen.push(format!("{}{}", stdout(&out), stderr(&out)));
    seen.push(std::fs::read_to_string(&server.log).expect("the server's log"));

    assert!(seen.len() > 10);
    for text in &seen {
        for token in [READ, WRITE, WRONG] {
            assert!(!text.contains(token), "{token} appears in: {text}");
        }
    }
    // The calls above did reach the server and did what they should (not a grep over empty output).
    assert!(seen[2].starts_with("POST /v1/tables: 200"), "{}", seen[2]);
    assert!(seen[6].contains("walctl_"), "{}", seen[6]);
}

/// Raises this test process's soft descriptor limit to its hard limit; returns the limit in force.
fn raise_descriptor_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: both calls only read and write the struct on this stack frame.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
    }
    limit.rlim_cur
}

/// How many slow connections the test holds.
const SLOW: usize = 2000;

/// Opens [`SLOW`] connections to `address`, each sending the start of a request head, then sends one more byte on
/// each every 200 ms until `stop`, counting in `closed` those the server closed.
fn drip(
    address: String,
    stop: Arc<AtomicBool>,
    closed: Arc<AtomicUsize>,
) -> std::thread::JoinHandle<()> {
    let (opened_tx, opened_rx) = std::sync::mpsc::channel();
    let dripper = std::thread::spawn(move || {
        let mut conns: Vec<(TcpStream, bool)> = Vec::with_capacity(SLOW);
        for _ in 0..SLOW {
            let mut stream = TcpStream::connect(&address).expect("connect");
            stream
                .write_all(b"GET /ready HTTP/1.1\r\nHost: slow\r\nX-Slow: ")
                .expect("the start of a head");
            stream.set_nonblocking(true).expect("non-blocking");
            conns.push((stream, false));
        }
        let _ = opened_tx.send(());
        while !stop.load(Ordering::Relaxed) {
            for (stream, gone) in conns.iter_mut().filter(|(_, gone)| !*gone) {
                let mut buf = [0u8; 256];
                let eof = match stream.read(&mut buf) {
                    Ok(0) => true,
                    Ok(_) => false,
                    Err(e) => e.kind() != ErrorKind::WouldBlock,
                };
                *gone = eof
                    || matches!(stream.write(b"x"), Err(e) if e.kind() != ErrorKind::WouldBlock);
            }
            closed.store(
                conns.iter().filter(|(_, gone)| *gone).count(),
                Ordering::SeqCst,
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    opened_rx
        .recv_timeout(PATIENCE)
        .expect("2,000 connections opened");
    dripper
}

#[test]
fn two_thousand_slow_connections_leave_the_leader_answering_and_leading() {
    let etcd = endpoints("ETCD_ENDPOINTS");
    assert!(
        raise_descriptor_limit() >= (SLOW + 200) as u64,
        "this test needs {} open descriptors",
        SLOW + 200
    );
    let (toml, _) = Servers::etcd_toml(&etcd, "");
    let mut servers = Servers::start(toml, 0);
    // Room for all of them, so the leader holds every one; the header timeout is what ends them.
    servers.server_toml = "header_timeout = \"30s\"\nmax_connections = 3000\n".to_string();
    servers.spawn();
    servers.wait_for_leader(&[0]);
    let server = &servers.servers[0];
    let (status, before) = get(&server.url("/ready"));
    assert_eq!(status, 200, "{before}");
    let epoch = before["epoch"].as_u64().expect("an epoch");

    let stop = Arc::new(AtomicBool::new(false));
    let closed = Arc::new(AtomicUsize::new(0));
    let dripper = drip(server.address.clone(), stop.clone(), closed.clone());

    // While all of them are held, the leader answers /ready and a create-table in the same term.
    let agent = agent(None);
    let mut ready = agent
        .get(&server.url("/ready"))
        .call()
        .expect("/ready answered during the attack");
    assert_eq!(ready.status().as_u16(), 200);
    let ready: Value = ready.body_mut().read_json().expect("JSON");
    assert_eq!(ready["epoch"].as_u64(), Some(epoch), "{ready}");
    let created = send(
        &agent,
        "POST",
        &server.url("/v1/tables"),
        None,
        Some(&json!({"name": "under_attack", "regions": 1, "id": "under-attack"})),
    );
    assert_eq!(created.status, 200, "{}", created.text);
    assert!(created.body["table_id"].is_u64(), "{}", created.text);
    assert_eq!(
        closed.load(Ordering::SeqCst),
        0,
        "the answers came while every slow connection was held"
    );

    // Each keeps sending, and the header timeout closes every one all the same.
    eventually("every slow connection closed by the header timeout", || {
        closed.load(Ordering::SeqCst) == SLOW
    });
    stop.store(true, Ordering::Relaxed);
    dripper.join().expect("the dripper");
    let (status, after) = get(&server.url("/ready"));
    assert_eq!(status, 200, "{after}");
    assert_eq!(
        after["epoch"].as_u64(),
        Some(epoch),
        "the lease was kept: {after}"
    );
}

/// Sends `GET /health` on `stream` (kept alive) and reads the answer; false when the server closed it.
fn health_on(stream: &mut TcpStream) -> bool {
    stream
        .set_read_timeout(Some(PATIENCE))
        .expect("a read timeout");
    if stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = Vec::new();
    let mut buf = [0u8; 512];
    while !String::from_utf8_lossy(&answer).contains("\"ok\"}") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return false,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200")
}

#[test]
fn a_connection_past_max_connections_is_closed_at_once() {
    const CAP: usize = 8;
    let mut servers = Servers::start(REDB.to_string(), 0);
    // A header timeout far longer than the test waits: an end of stream can only be the refusal.
    servers.server_toml = format!("header_timeout = \"1h\"\nmax_connections = {CAP}\n");
    servers.spawn();
    servers.wait_for_leader(&[0]);
    let server = &servers.servers[0];
    // CAP connections, each served once and kept alive, so each holds its place (one refused while an earlier
    // client's connection was still closing is replaced).
    let mut held = Vec::new();
    let deadline = Instant::now() + PATIENCE;
    while held.len() < CAP {
        assert!(Instant::now() < deadline, "{CAP} connections served");
        let mut stream = TcpStream::connect(&server.address).expect("connect");
        if health_on(&mut stream) {
            held.push(stream);
        }
    }
    let mut past = TcpStream::connect(&server.address).expect("the kernel accepts it");
    assert!(
        !health_on(&mut past),
        "the connection past the cap was closed without an answer"
    );
    // The held ones are still served, and the refusal is counted.
    for stream in &mut held {
        assert!(health_on(stream), "a held connection still answers");
    }
    // Asked on a held connection: the cap leaves no room for another.
    let mut asking = held.pop().expect("a held connection");
    asking
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .expect("a request");
    let mut metrics = String::new();
    asking
        .read_to_string(&mut metrics)
        .expect("the metrics, then the end of the connection");
    let refused = metrics
        .lines()
        .find(|l| l.starts_with("walctl_http_connections_refused_total"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok());
    assert!(refused.is_some_and(|n| n >= 1), "{metrics}");
    drop(held);
    // Once they are gone, a new connection is served.
    eventually("a connection served once the others closed", || {
        TcpStream::connect(&server.address).is_ok_and(|mut s| health_on(&mut s))
    });
}

/// Generates the test certificates in `dir/certs` (`scripts/certs.sh`).
fn make_certs(dir: &Path) -> PathBuf {
    let certs = dir.join("certs");
    let script = crate::cluster::services_script()
        .parent()
        .expect("scripts/")
        .join("certs.sh");
    let made = Command::new("bash")
        .arg(&script)
        .arg(&certs)
        .output()
        .expect("run scripts/certs.sh");
    assert!(made.status.success(), "{}", stderr(&made));
    certs
}

#[test]
fn a_datanode_heartbeats_over_https_with_its_token_not_without_and_its_api_asks_for_tokens() {
    let mut servers = Servers::start(REDB.to_string(), 0);
    let dir = servers.dir.path().to_path_buf();
    let certs = make_certs(&dir);
    let tokens = write(&dir, "tokens", &format!("read {READ}\nwrite {WRITE}\n"));
    servers.server_toml = format!(
        "{}tls = {{ cert = {:?}, key = {:?} }}\n",
        auth_toml(&tokens),
        certs.join("server.pem").display().to_string(),
        certs.join("server.key").display().to_string()
    );
    servers.spawn();
    let server = &servers.servers[0];
    let ca = certs.join("ca.pem");
    let https = agent(Some(&ca));
    let base = format!("https://{}", server.address);
    eventually("the server is ready over HTTPS", || {
        https
            .get(&format!("{base}/ready"))
            .call()
            .is_ok_and(|r| r.status().as_u16() == 200)
    });

    let datanode_port = crate::cluster::free_port();
    let datanode = |name: &str, token_file: Option<&Path>| -> std::process::Child {
        // With a token it also asks for the server's tokens on its own API.
        let token = token_file.map_or(String::new(), |f| {
            format!(
                "token_file = {:?}\n{}",
                f.display().to_string(),
                auth_toml(&tokens)
            )
        });
        let config = write(
            &dir,
            &format!("{name}.toml"),
            &format!(
                "[metadata_store]\nbackend = \"memory\"\n\n[datanodes]\nids = [1]\nwal_dir = {:?}\n\n\
                 [datanode]\nid = 1\nlisten = \"127.0.0.1:{}\"\nmetasrv = [{base:?}]\nregion_storage = {:?}\n\
                 heartbeat_interval = \"200ms\"\nca = {:?}\n{token}",
                dir.join(format!("{name}-wal/{{datanode}}"))
                    .display()
                    .to_string(),
                datanode_port,
                dir.join("regions").display().to_string(),
                ca.display().to_string(),
            ),
        );
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).expect("a log");
        Command::new(walctl_path())
            .arg("--config")
            .arg(&config)
            .arg("datanode")
            .current_dir(&dir)
            .env("RUST_LOG", "info")
            .stdout(log.try_clone().expect("the log"))
            .stderr(log)
            .spawn()
            .expect("spawn walctl datanode")
    };

    // Without a token: the registration is refused, and the datanode exits naming why.
    let mut refused = datanode("no-token", None);
    let status = refused.wait().expect("the datanode exits");
    assert!(!status.success());
    let log = std::fs::read_to_string(dir.join("no-token.log")).unwrap_or_default();
    assert!(
        log.contains("bearer token") && log.contains(&server.address),
        "{log}"
    );

    // With its token: it registers and heartbeats (the leader's registry lists it, heartbeat after heartbeat).
    let token_file = write(&dir, "datanode.token", &format!("{WRITE}\n"));
    let mut child = datanode("with-token", Some(&token_file));
    let heartbeats = || -> Option<u64> {
        let answer = send(&https, "GET", &format!("{base}/metrics"), Some(READ), None);
        answer
            .text
            .lines()
            .find(|l| l.starts_with("walctl_datanode_heartbeats_total"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    };
    eventually("the datanode registered and heartbeats", || {
        let listed = send(
            &https,
            "GET",
            &format!("{base}/v1/datanodes"),
            Some(READ),
            None,
        );
        listed.body["datanodes"]
            .as_array()
            .is_some_and(|d| d.len() == 1)
            && heartbeats().is_some_and(|n| n >= 3)
    });

    // Its own API asks for a token too: reads a read one, flushes a write one.
    let plain = agent(None);
    let datanode_url = |path: &str| format!("http://127.0.0.1:{datanode_port}{path}");
    assert_eq!(
        send(&plain, "GET", &datanode_url("/health"), None, None).status,
        200
    );
    let refused = send(&plain, "GET", &datanode_url("/v1/regions"), None, None);
    assert_eq!(refused.status, 401, "{}", refused.text);
    assert_eq!(refused.body["error"]["kind"], json!("unauthorized"));
    assert_eq!(
        send(
            &plain,
            "GET",
            &datanode_url("/v1/regions"),
            Some(READ),
            None
        )
        .status,
        200
    );
    let forbidden = send(
        &plain,
        "POST",
        &datanode_url("/v1/regions/1/flush"),
        Some(READ),
        None,
    );
    assert_eq!(forbidden.status, 403, "{}", forbidden.text);
    // walctl wal flush sends --token-file's token to the server and to the datanode alike.
    let operator = write(&dir, "operator.token", &format!("write {WRITE}\n"));
    let client = |args: &[&str]| {
        let mut all = vec![
            "--server",
            base.as_str(),
            "--ca",
            ca.to_str().expect("a UTF-8 path"),
            "--token-file",
            operator.to_str().expect("a UTF-8 path"),
        ];
        all.extend_from_slice(args);
        walctl(&all, &[])
    };
    let out = client(&["create-table", "flushed", "--regions", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = client(&["--json", "wal", "flush", "--table", "flushed"]);
    assert!(
        out.status.success(),
        "{}{}",
        stderr(&out),
        std::fs::read_to_string(dir.join("with-token.log")).unwrap_or_default()
    );
    assert_eq!(stdout(&out).lines().count(), 2, "{}", stdout(&out));
    // SIGHUP: the datanode re-reads its tokens file.
    write(&dir, "tokens", &format!("read {ROTATED}\n"));
    let hup = Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(hup.success());
    eventually("the datanode takes the rotated token", || {
        send(
            &plain,
            "GET",
            &datanode_url("/v1/regions"),
            Some(ROTATED),
            None,
        )
        .status
            == 200
    });
    assert_eq!(
        send(
            &plain,
            "GET",
            &datanode_url("/v1/regions"),
            Some(READ),
            None
        )
        .status,
        401
    );
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_body_slower_than_body_timeout_is_answered_408_and_the_connection_closed() {
    let mut servers = Servers::start(REDB.to_string(), 0);
    servers.server_toml = "body_timeout = \"1s\"\n".to_string();
    servers.spawn();
    servers.wait_for_leader(&[0]);
    let server = &servers.servers[0];
    let mut stream = TcpStream::connect(&server.address).expect("connect");
    // A head announcing 100 bytes, then 10 of them and nothing more.
    stream
        .write_all(
            b"POST /v1/tables HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
              Content-Length: 100\r\n\r\n{\"name\": ",
        )
        .expect("a partial request");
    stream
        .set_read_timeout(Some(PATIENCE))
        .expect("a read timeout");
    let mut answer = String::new();
    let read = stream.read_to_string(&mut answer);
    assert!(read.is_ok(), "the server closed the connection: {read:?}");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"kind\":\"request_timeout\""), "{answer}");
    assert!(answer.contains("body_timeout"), "{answer}");
    // Nothing was created.
    let (status, listed) = get(&server.url("/v1/procedures"));
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["matched"], json!(0), "{listed}");
}

/// A datanode with `[datanode] tls` serves its own API over TLS only and registers an `https://` address; `walctl
/// wal flush` reaches it there, checking its certificate against `--ca`, and plain HTTP to it is refused saying so.
#[test]
fn a_datanode_with_tls_registers_an_https_address_and_is_reached_over_tls_only() {
    let mut servers = Servers::start(REDB.to_string(), 0);
    servers.spawn();
    let dir = servers.dir.path().to_path_buf();
    let certs = make_certs(&dir);
    let ca = certs.join("ca.pem");
    let base = format!("http://{}", servers.servers[0].address);
    let plain = agent(None);
    eventually("the server is ready", || {
        send(&plain, "GET", &format!("{base}/ready"), None, None).status == 200
    });
    let port = crate::cluster::free_port();
    let config = write(
        &dir,
        "tls-datanode.toml",
        &format!(
            "[metadata_store]\nbackend = \"memory\"\n\n[datanodes]\nids = [1]\nwal_dir = {:?}\n\n\
             [datanode]\nid = 1\nlisten = \"127.0.0.1:{port}\"\nmetasrv = [{base:?}]\nregion_storage = {:?}\n\
             heartbeat_interval = \"200ms\"\ntls = {{ cert = {:?}, key = {:?} }}\n",
            dir.join("tls-wal/{datanode}").display().to_string(),
            dir.join("regions").display().to_string(),
            certs.join("server.pem").display().to_string(),
            certs.join("server.key").display().to_string(),
        ),
    );
    let log = std::fs::File::create(dir.join("tls-datanode.log")).expect("a log");
    let mut child = Command::new(walctl_path())
        .arg("--config")
        .arg(&config)
        .arg("datanode")
        .current_dir(&dir)
        .env("RUST_LOG", "info")
        .stdout(log.try_clone().expect("the log"))
        .stderr(log)
        .spawn()
        .expect("spawn walctl datanode");
    let https_address = format!("https://127.0.0.1:{port}");
    eventually("the datanode registered its https:// address", || {
        send(&plain, "GET", &format!("{base}/v1/datanodes"), None, None).body["datanodes"]
            .as_array()
            .is_some_and(|d| d.iter().any(|n| n["address"] == json!(https_address)))
    });
    // Over TLS with the authority: answered. In plain HTTP: refused, saying to call https://.
    let trusted = agent(Some(&ca));
    assert_eq!(
        send(
            &trusted,
            "GET",
            &format!("{https_address}/health"),
            None,
            None
        )
        .status,
        200
    );
    let refused = send(
        &plain,
        "GET",
        &format!("http://127.0.0.1:{port}/health"),
        None,
        None,
    );
    assert_eq!(refused.status, 400, "{}", refused.text);
    assert!(
        refused.text.contains("speaks HTTPS only"),
        "{}",
        refused.text
    );
    // walctl wal flush reaches each region's leader at its https:// address, trusting --ca.
    let run = |args: &[&str]| {
        let mut all = vec![
            "--server",
            base.as_str(),
            "--ca",
            ca.to_str().expect("a UTF-8 path"),
        ];
        all.extend_from_slice(args);
        walctl(&all, &[])
    };
    let out = run(&["create-table", "over_tls", "--regions", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run(&["--json", "wal", "flush", "--table", "over_tls"]);
    assert!(
        out.status.success(),
        "{}{}",
        stderr(&out),
        std::fs::read_to_string(dir.join("tls-datanode.log")).unwrap_or_default()
    );
    assert_eq!(stdout(&out).lines().count(), 2, "{}", stdout(&out));
    let _ = child.kill();
    let _ = child.wait();
}
