//! The embedded commands on `[metadata_store] backend = "postgres"`, against the PostgreSQL the test command starts
//! (`POSTGRES_URL`, `POSTGRES_PASSWORD_FILE`; the test fails when they are unset): the main job (bootstrap, create
//! table, listing, drop) from separate processes sharing one table, a wrong password named by endpoint and never
//! shown. Each command that writes takes part in the election on PostgreSQL, as on etcd.

use crate::support::{Env, unique};

/// The election lease of each command (`[server] lease_ttl`): a command killed while it leads holds the store
/// this long at most.
const LEASE_TTL_SECS: u64 = 2;

fn postgres_config(env: &Env, table: &str, password_file: &str) -> std::path::PathBuf {
    postgres_config_with(env, table, password_file, None)
}

/// The config of [`postgres_config`]; with `tls` (the certificates' directory), as the user `walctl_tls`, whom the
/// test command's PostgreSQL admits only over TLS with a client certificate.
fn postgres_config_with(
    env: &Env,
    table: &str,
    password_file: &str,
    tls: Option<&str>,
) -> std::path::PathBuf {
    let mut url = std::env::var("POSTGRES_URL").unwrap_or_default();
    assert!(
        !url.is_empty(),
        "POSTGRES_URL is not set: this test needs a running PostgreSQL (run through scripts/test.sh)"
    );
    let mut tls_line = String::new();
    if let Some(certs) = tls {
        url = url.replacen("postgres://postgres@", "postgres://walctl_tls@", 1);
        tls_line = format!(
            "tls = {{ ca = \"{certs}/ca.pem\", cert = \"{certs}/client.pem\", key = \"{certs}/client.key\" }}\n"
        );
    }
    env.write(
        &format!("{table}.toml"),
        &format!(
            "[metadata_store]\nbackend = \"postgres\"\nurl = \"{url}\"\npassword_file = \"{password_file}\"\n\
             table = \"{table}\"\nconnect_timeout = \"5s\"\n{tls_line}\n[server]\nlease_ttl = \"{LEASE_TTL_SECS}s\"\n"
        ),
    )
}

fn password_file() -> String {
    std::env::var("POSTGRES_PASSWORD_FILE").unwrap_or_else(|_| {
        panic!("POSTGRES_PASSWORD_FILE is not set: this test needs the PostgreSQL password (run through scripts/test.sh)")
    })
}

#[test]
fn the_main_job_runs_on_postgres_from_separate_processes() {
    let env = Env::new();
    let table = unique("walctl_pg");
    let config = postgres_config(&env, &table, &password_file());
    env.ok(Some(&config), &["bootstrap"]);
    let created = env.json(Some(&config), &["create-table", "orders", "--regions", "4"]);
    assert_eq!(created.len(), 4, "{created:?}");
    let err = env.err(Some(&config), &["create-table", "orders", "--regions", "4"]);
    assert!(err.contains("orders") && err.contains("exists"), "{err}");
    // Another process reads what the first wrote.
    let listed = env.ok(Some(&config), &["procedures", "list"]);
    assert!(listed.contains("done"), "{listed}");
    let dropped = env.ok(Some(&config), &["--json", "drop-table", "orders"]);
    assert!(dropped.contains("\"dropped\":true"), "{dropped}");
    let again = env.json(Some(&config), &["create-table", "orders", "--regions", "2"]);
    assert_eq!(again.len(), 2, "{again:?}");
    assert_ne!(
        again[0]["table_id"], created[0]["table_id"],
        "a table created again gets a new id"
    );
}

/// `[metadata_store] tls` on PostgreSQL: as a user the server admits only over TLS with a client certificate, the
/// commands — the kv calls and the election each writer joins — work; without `tls` the same user is refused.
#[test]
fn the_main_job_runs_over_tls_as_a_user_admitted_only_with_a_client_certificate() {
    let certs = std::env::var("POSTGRES_TLS_CERTS").unwrap_or_else(|_| {
        panic!("POSTGRES_TLS_CERTS is not set: this test needs the PostgreSQL certificates (run through scripts/test.sh)")
    });
    let env = Env::new();
    let table = unique("walctl_pg_tls");
    let config = postgres_config_with(&env, &table, &password_file(), Some(&certs));
    let created = env.json(Some(&config), &["create-table", "orders", "--regions", "2"]);
    assert_eq!(created.len(), 2, "{created:?}");
    let listed = env.ok(Some(&config), &["procedures", "list"]);
    assert!(listed.contains("done"), "{listed}");
    // The same user and table without TLS.
    let plain = std::fs::read_to_string(&config).unwrap();
    let plain: String = plain
        .lines()
        .filter(|l| !l.starts_with("tls"))
        .map(|l| format!("{l}\n"))
        .collect();
    let plain = env.write("plain.toml", &plain);
    let err = env.err(Some(&plain), &["procedures", "list"]);
    assert!(err.contains("no encryption"), "{err}");
}

#[test]
fn a_wrong_password_is_named_by_endpoint_and_never_shown() {
    let env = Env::new();
    let wrong = env.write("wrong.password", "not-the-password-8812\n");
    let config = postgres_config(
        &env,
        &unique("walctl_pg_wrong"),
        &wrong.display().to_string(),
    );
    let err = env.err(Some(&config), &["procedures", "list"]);
    assert!(err.contains("PostgreSQL at 127.0.0.1:"), "{err}");
    assert!(err.contains("password authentication failed"), "{err}");
    assert!(!err.contains("not-the-password-8812"), "{err}");
}

/// Create-tables on PostgreSQL killed with kill -9 at moments spread over the end of the time one takes, each then
/// sent again with its id: every table exists once, with the id its procedure reports and all its regions, and no
/// procedure failed or is left unfinished. Where the kills fell is printed: before the submission or after the end
/// in most runs, since the procedure itself takes a few milliseconds of a run; a kill between its durable writes
/// is what the crash matrix on PostgreSQL (`kv::crash_matrix`, every transition) covers exactly.
#[test]
fn create_tables_killed_at_any_moment_are_finished_once_when_sent_again() {
    use std::process::Stdio;

    let env = Env::new();
    let config = postgres_config(&env, &unique("walctl_pg_kill"), &password_file());
    env.ok(Some(&config), &["bootstrap"]);
    // How long one create-table process takes here, start to exit: the kills are spread over that span.
    let started = std::time::Instant::now();
    env.ok(Some(&config), &["create-table", "probe", "--regions", "8"]);
    let span = started.elapsed();
    const TABLES: usize = 24;
    for i in 0..TABLES {
        let id = format!("kill-{i}");
        let name = format!("killed_{i}");
        let mut child = std::process::Command::new(crate::support::walctl_path())
            .current_dir(env.dir.path())
            .env_remove("RUST_LOG")
            .arg("--config")
            .arg(&config)
            .args(["create-table", &name, "--regions", "8", "--id", &id])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn walctl");
        // Most of a run is starting up and opening the store; the procedure runs in its last tenth or so.
        std::thread::sleep(span.mul_f64(0.8 + 0.25 * i as f64 / TABLES as f64));
        let _ = child.kill();
        let _ = child.wait();
        // A command killed while it led holds the election until its lease expires: the next one would spend its
        // run waiting for it, so it starts after that.
        std::thread::sleep(std::time::Duration::from_secs(LEASE_TTL_SECS));
    }
    // Where the kills fell, as the store shows it (printed, not asserted: timing decides).
    let mut states = std::collections::BTreeMap::new();
    for i in 0..TABLES {
        let out = std::process::Command::new(crate::support::walctl_path())
            .current_dir(env.dir.path())
            .arg("--config")
            .arg(&config)
            .args(["--json", "procedures", "show", &format!("kill-{i}")])
            .output()
            .expect("run walctl");
        let state = serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .ok()
            .and_then(|v| v["state"].as_str().map(str::to_string))
            .unwrap_or_else(|| "never submitted".to_string());
        *states.entry(state).or_insert(0) += 1;
    }
    println!("create-tables after kill -9: {states:?}");
    let mut ids = std::collections::BTreeSet::new();
    for i in 0..TABLES {
        let id = format!("kill-{i}");
        let name = format!("killed_{i}");
        let out = env.json(
            Some(&config),
            &["create-table", &name, "--regions", "8", "--id", &id],
        );
        assert_eq!(out.len(), 8, "{name}: {out:?}");
        let table_id = out[0]["table_id"].as_u64().expect("a table id");
        assert!(
            out.iter().all(|r| r["table_id"].as_u64() == Some(table_id)),
            "{out:?}"
        );
        assert!(ids.insert(table_id), "two tables share id {table_id}");
        let shown = env.json(Some(&config), &["procedures", "show", &id]);
        assert_eq!(shown[0]["state"], "done", "{shown:?}");
        assert_eq!(
            shown[0]["output"]["table_id"].as_u64(),
            Some(table_id),
            "{shown:?}"
        );
    }
    let regions = env.json(Some(&config), &["open-regions", "--datanode", "1"]);
    assert_eq!(
        regions.len(),
        (TABLES + 1) * 8,
        "every table's regions, once each"
    );
    let failed = env.ok(Some(&config), &["procedures", "list", "--state", "failed"]);
    assert!(!failed.contains("kill-"), "{failed}");
}
