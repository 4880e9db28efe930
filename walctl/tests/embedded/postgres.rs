//! The embedded commands on `[metadata_store] backend = "postgres"`, against the PostgreSQL the test command starts
//! (`POSTGRES_URL`, `POSTGRES_PASSWORD_FILE`; the test fails when they are unset): the main job (bootstrap, create
//! table, listing, drop) from separate processes sharing one table, a wrong password named by endpoint and never
//! shown, and `walctl serve` refused until leader election on PostgreSQL exists.

use crate::support::{Env, unique};

fn postgres_config(env: &Env, table: &str, password_file: &str) -> std::path::PathBuf {
    let url = std::env::var("POSTGRES_URL").unwrap_or_default();
    assert!(
        !url.is_empty(),
        "POSTGRES_URL is not set: this test needs a running PostgreSQL (run through scripts/test.sh)"
    );
    env.write(
        &format!("{table}.toml"),
        &format!(
            "[metadata_store]\nbackend = \"postgres\"\nurl = \"{url}\"\npassword_file = \"{password_file}\"\n\
             table = \"{table}\"\nconnect_timeout = \"5s\"\n"
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

#[test]
fn serve_is_refused_on_postgres_until_it_can_elect_a_leader() {
    let env = Env::new();
    let config = postgres_config(&env, &unique("walctl_pg_serve"), &password_file());
    let err = env.err(Some(&config), &["serve", "--listen", "127.0.0.1:0"]);
    assert!(
        err.contains("leader election on PostgreSQL")
            && err.contains("two servers would both lead"),
        "{err}"
    );
}
