//! `walctl serve` on `[metadata_store] backend = "postgres"` as real processes: three servers elect one leader
//! through the lease row; kill -9 of the leader three times under a client creating tables, then a leader stopped
//! (SIGSTOP) with creates in flight, fail over with no table lost or doubled, and the stopped leader writes nothing
//! when it resumes; and a restart of the database under load loses and doubles no table either. The shared
//! cluster the test command starts (`POSTGRES_URL`) serves the first; the restart test starts a cluster of its own
//! (`scripts/services.sh start postgres NAME`) so that stopping it disturbs no other test.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use remote_wal::kv::redb::RedbOpenMode;
use remote_wal::kv::{PostgresKvBackend, RangeRequest, range_all};
use remote_wal::metasrv::{Metasrv, parse_table_name};
use serde_json::json;

use crate::cluster::{
    LEASE_TTL_SECS, PATIENCE, Servers, create_table_following_the_leader, get, get_text, post,
    services, unique,
};

/// Tables the client creates with its own ids while leaders are killed under it.
const CLIENT_TABLES: usize = 120;
/// Leader kills while the client runs.
const KILLS: usize = 3;

/// The metadata config of servers on a PostgreSQL at `url` (password in `password_file`), in a table of their own.
fn postgres_toml(url: &str, password_file: &str, table: &str) -> String {
    format!(
        "[metadata_store]\nbackend = \"postgres\"\nurl = \"{url}\"\npassword_file = \"{password_file}\"\n\
         table = \"{table}\"\nconnect_timeout = \"3s\"\nrequest_timeout = \"3s\"\n\n[datanodes]\nids = [1, 2]\n\n\
         [procedure]\nretry_delay = \"50ms\"\nmax_retry_delay = \"500ms\"\n"
    )
}

fn shared_postgres() -> (String, String) {
    let url = std::env::var("POSTGRES_URL").unwrap_or_default();
    let password = std::env::var("POSTGRES_PASSWORD_FILE").unwrap_or_default();
    assert!(
        !url.is_empty() && !password.is_empty(),
        "POSTGRES_URL and POSTGRES_PASSWORD_FILE are not set: this test needs a running PostgreSQL (run through \
         scripts/test.sh)"
    );
    (url, password)
}

/// Every pair of the servers' metadata table but the leader key (which changes with each term), read through the
/// backend.
fn metadata(servers: &Servers, runtime: &tokio::runtime::Runtime) -> Vec<(Vec<u8>, Vec<u8>)> {
    let config = servers.metasrv_config();
    let pg = config
        .metadata_store
        .postgres()
        .expect("the PostgreSQL config");
    runtime.block_on(async {
        let kv = PostgresKvBackend::connect(pg).await.expect("connect");
        let pairs = range_all(&kv, RangeRequest::prefix(Vec::new()), 1024)
            .await
            .expect("read the table");
        pairs
            .into_iter()
            .filter(|kv| !kv.key.ends_with(b"__metasrv/election"))
            .map(|kv| (kv.key, kv.value))
            .collect()
    })
}

/// Waits until server `old` says it follows the leader at `new_address`.
fn wait_until_it_follows(servers: &Servers, old: usize, new_address: &str) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (status, body) = get(&servers.servers[old].url("/v1/leader"));
        if status == 200 && body["self"] == json!(false) && body["leader"] == json!(new_address) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the old leader still says {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The tables `names` exist once each, complete (two regions), with distinct ids; and the store holds no other
/// table.
fn assert_each_table_once(servers: &Servers, runtime: &tokio::runtime::Runtime, names: &[String]) {
    let reader = runtime
        .block_on(Metasrv::open(
            servers.metasrv_config(),
            RedbOpenMode::MustExist,
        ))
        .expect("open a reader");
    let mut ids = BTreeSet::new();
    for name in names {
        let table = parse_table_name(name).expect("a table name");
        let id = runtime
            .block_on(reader.table_id(&table))
            .expect("read the table id")
            .unwrap_or_else(|| panic!("table {name} is missing"));
        let regions = runtime
            .block_on(reader.table_regions(&table, id))
            .expect("read the regions");
        assert_eq!(regions.regions.len(), 2, "{name}: {regions:?}");
        assert!(ids.insert(id), "table id {id} used twice");
    }
    let named = metadata(servers, runtime)
        .into_iter()
        .filter(|(k, _)| String::from_utf8_lossy(k).contains("__table_name/"))
        .count();
    assert_eq!(named, names.len(), "the store holds tables nobody created");
}

#[test]
fn servers_on_postgres_fail_over_on_kill_9_and_sigstop_without_losing_or_doubling_a_table() {
    let (url, password) = shared_postgres();
    let mut servers = Servers::start(postgres_toml(&url, &password, &unique("srvpg")), 3);
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let leader = servers.wait_for_leader(&[0, 1, 2]);
    let leader_address = servers.servers[leader].address.clone();

    // Everyone agrees on who leads and on its epoch; a follower refuses writes naming the leader.
    let mut epochs = BTreeSet::new();
    for (i, server) in servers.servers.iter().enumerate() {
        let (status, body) = get(&server.url("/v1/leader"));
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["leader"], json!(leader_address), "server {i}: {body}");
        assert_eq!(body["self"], json!(i == leader), "server {i}: {body}");
        epochs.insert(body["epoch"].as_u64().expect("an epoch"));
    }
    assert_eq!(epochs.len(), 1, "servers disagree on the epoch: {epochs:?}");
    let mut last_epoch = epochs.into_iter().next().unwrap_or_default();
    let follower = (leader + 1) % 3;
    let (status, body) = post(
        &servers.servers[follower].url("/v1/tables"),
        &json!({"name": "refused", "regions": 2}),
    );
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["leader"], json!(leader_address), "{body}");

    // A client creates tables with its own ids while the leader is killed under it, each killed server replaced.
    let mut alive: Vec<usize> = vec![0, 1, 2];
    let addresses = Arc::new(Mutex::new(
        servers
            .servers
            .iter()
            .map(|s| s.address.clone())
            .collect::<Vec<_>>(),
    ));
    let created = Arc::new(AtomicUsize::new(0));
    let client = {
        let (created, addresses) = (created.clone(), addresses.clone());
        std::thread::spawn(move || {
            let mut last_leader = None;
            for i in 0..CLIENT_TABLES {
                let known = addresses.lock().map(|a| a.clone()).unwrap_or_default();
                let (_, leader) = create_table_following_the_leader(
                    &known,
                    &format!("client_{i}"),
                    &format!("client-{i}"),
                    last_leader.take(),
                );
                last_leader = Some(leader);
                created.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    let mut failovers = Vec::new();
    for kill in 1..=KILLS {
        let deadline = Instant::now() + PATIENCE;
        while created.load(Ordering::SeqCst) < kill * CLIENT_TABLES / (KILLS + 1) {
            assert!(Instant::now() < deadline, "the client made no progress");
            std::thread::sleep(Duration::from_millis(10));
        }
        let current = servers.wait_for_leader(&alive);
        servers.servers[current].signal("-KILL");
        let killed_at = Instant::now();
        alive.retain(|&i| i != current);
        let next = servers.wait_for_leader(&alive);
        failovers.push(killed_at.elapsed());
        let (_, body) = get(&servers.servers[next].url("/v1/leader"));
        let epoch = body["epoch"].as_u64().expect("an epoch");
        assert!(epoch > last_epoch, "epoch {epoch} after {last_epoch}");
        last_epoch = epoch;
        let fresh = servers.spawn();
        alive.push(fresh);
        if let Ok(mut a) = addresses.lock() {
            a.push(servers.servers[fresh].address.clone());
        }
    }
    client.join().expect("the client thread");
    failovers.sort();
    println!(
        "failover on PostgreSQL over {} kills: p50 {} ms, max {} ms (lease_ttl = {LEASE_TTL_SECS}s)",
        failovers.len(),
        failovers[failovers.len() / 2].as_millis(),
        failovers[failovers.len() - 1].as_millis(),
    );

    // The leader stops (SIGSTOP) while clients create tables without waiting: some procedures are between two
    // writes. Another server takes over and finishes every create (the accepted ones recovered, the others sent
    // again with their id).
    let old = servers.wait_for_leader(&alive);
    let url = servers.servers[old].url("/v1/tables");
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (stop, url) = (stop.clone(), url.clone());
            std::thread::spawn(move || {
                let mut sent = Vec::new();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let (name, id) = (format!("w{c}_{n}"), format!("w{c}-{n}"));
                    let (status, _) = post(
                        &url,
                        &json!({"name": name, "regions": 2, "id": id, "wait": false}),
                    );
                    sent.push((name, id, status));
                    n += 1;
                    if status == 0 {
                        break;
                    }
                }
                sent
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1000));
    servers.servers[old].signal("-STOP");
    let stopped_at = Instant::now();
    stop.store(true, Ordering::Relaxed);
    let others: Vec<usize> = alive.iter().copied().filter(|&i| i != old).collect();
    let new = servers.wait_for_leader(&others);
    let sent: Vec<(String, String, u16)> = clients
        .into_iter()
        .flat_map(|c| c.join().expect("a client thread"))
        .collect();
    let accepted = sent.iter().filter(|(_, _, s)| *s == 202).count();
    assert!(accepted > 0, "no create was accepted before the pause");
    let new_url = servers.servers[new].url("/v1/tables");
    let mut table_ids: BTreeMap<String, u64> = BTreeMap::new();
    for (name, id, status) in &sent {
        if *status != 202 {
            let (status, body) = post(
                &new_url,
                &json!({"name": name, "regions": 2, "id": id, "wait": true}),
            );
            assert_eq!(status, 200, "{name} sent again: {body}");
        }
        let deadline = Instant::now() + PATIENCE;
        let table_id = loop {
            let (status, body) = get(&servers.servers[new].url(&format!("/v1/tables/{name}")));
            if status == 200 {
                break body["table_id"].as_u64().expect("table_id");
            }
            assert!(
                Instant::now() < deadline,
                "{name} (id {id}, first answer {status}) never appeared"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        table_ids.insert(name.clone(), table_id);
    }

    // The stopped leader resumes well past its lease: it steps down and writes nothing.
    let pause = Duration::from_secs(3 * LEASE_TTL_SECS);
    if let Some(rest) = pause.checked_sub(stopped_at.elapsed()) {
        std::thread::sleep(rest);
    }
    let before = metadata(&servers, &runtime);
    servers.servers[old].signal("-CONT");
    wait_until_it_follows(&servers, old, &servers.servers[new].address.clone());
    std::thread::sleep(Duration::from_secs(2 * LEASE_TTL_SECS));
    let after = metadata(&servers, &runtime);
    assert!(
        before == after,
        "the metadata changed after the old leader resumed with procedures in flight"
    );
    let fenced = get_text(&servers.servers[old].url("/metrics"))
        .lines()
        .find_map(|l| {
            l.strip_prefix("walctl_fenced_writes_total ")
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    println!(
        "SIGSTOP on PostgreSQL: {} creates sent, {accepted} accepted before the pause, {fenced} writes of the \
         resumed leader refused by the fence",
        sent.len()
    );

    let mut names: Vec<String> = (0..CLIENT_TABLES).map(|i| format!("client_{i}")).collect();
    names.extend(table_ids.keys().cloned());
    assert_each_table_once(&servers, &runtime, &names);
}

/// A PostgreSQL cluster of the test's own, removed on drop.
struct OwnPostgres {
    name: String,
    url: String,
    password_file: String,
}

impl OwnPostgres {
    fn start(tag: &str) -> Self {
        let name = unique(tag);
        services(&["start", "postgres", &name]);
        let endpoint = services(&["endpoint", &name]);
        let dir = crate::cluster::services_script()
            .parent()
            .and_then(|p| p.parent())
            .map(|root| root.join("target/services").join(&name))
            .expect("the state directory");
        OwnPostgres {
            url: format!("postgres://postgres@{}/remote_wal", endpoint.trim()),
            password_file: dir.join("password").display().to_string(),
            name,
        }
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let _ = std::process::Command::new(crate::cluster::services_script())
            .args(["remove", &self.name])
            .output();
    }
}

/// The database stops (a fast shutdown, every session cut) and starts again while a client creates tables through
/// two servers: the leader loses its term when it cannot renew, a server leads again once the database is back, and
/// every table the client asked for exists once.
#[test]
fn a_database_restart_under_load_loses_and_doubles_no_table() {
    let pg = OwnPostgres::start("pgrs");
    let servers = Servers::start(postgres_toml(&pg.url, &pg.password_file, "meta"), 2);
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    servers.wait_for_leader(&[0, 1]);
    const TABLES: usize = 40;
    let addresses: Vec<String> = servers.servers.iter().map(|s| s.address.clone()).collect();
    let created = Arc::new(AtomicUsize::new(0));
    let client = {
        let created = created.clone();
        std::thread::spawn(move || {
            let mut last_leader = None;
            for i in 0..TABLES {
                let (_, leader) = create_table_following_the_leader(
                    &addresses,
                    &format!("r_{i}"),
                    &format!("r-{i}"),
                    last_leader.take(),
                );
                last_leader = Some(leader);
                created.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    let deadline = Instant::now() + PATIENCE;
    while created.load(Ordering::SeqCst) < TABLES / 3 {
        assert!(Instant::now() < deadline, "the client made no progress");
        std::thread::sleep(Duration::from_millis(10));
    }
    services(&["stop", "postgres", &pg.name]);
    let at_stop = created.load(Ordering::SeqCst);
    // Down for longer than a lease: the leader's term ends.
    std::thread::sleep(Duration::from_secs(2 * LEASE_TTL_SECS));
    services(&["start", "postgres", &pg.name]);
    client.join().expect("the client thread");
    servers.wait_for_leader(&[0, 1]);
    println!("database restart: {at_stop} of {TABLES} tables created before the stop");
    let names: Vec<String> = (0..TABLES).map(|i| format!("r_{i}")).collect();
    assert_each_table_once(&servers, &runtime, &names);
}
