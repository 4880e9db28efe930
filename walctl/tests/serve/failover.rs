//! Three servers on a three-member etcd: one leads, followers redirect, kill -9 fails over, ids keep creation
//! exactly-once across it, SIGTERM hands over at once.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use remote_wal::kv::redb::RedbOpenMode;
use remote_wal::metasrv::{Metasrv, parse_table_name};
use serde_json::json;

use crate::cluster::{
    EtcdCluster, PATIENCE, Servers, create_table_following_the_leader, election_keys, get,
    metadata_keys, post,
};

/// Burst tables submitted without waiting just before the leader is killed.
const BURST: usize = 20;
/// Tables a client creates with its own ids while the leader is killed under it.
const CLIENT_TABLES: usize = 200;
/// Leader kills while the client runs.
const KILLS: usize = 3;

#[test]
fn one_leader_followers_redirect_and_kill_9_fails_over_without_losing_or_doubling_a_table() {
    let etcd = EtcdCluster::start("srvfo");
    let mut servers = Servers::on_etcd(&etcd.endpoints, 3);
    let leader = servers.wait_for_leader(&[0, 1, 2]);
    let leader_address = servers.servers[leader].address.clone();

    // Everyone agrees on who leads; only the leader says it is itself.
    let mut epochs = BTreeSet::new();
    for (i, server) in servers.servers.iter().enumerate() {
        assert_eq!(get(&server.url("/health")).0, 200);
        let (status, body) = get(&server.url("/v1/leader"));
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["leader"], json!(leader_address), "server {i}: {body}");
        assert_eq!(body["self"], json!(i == leader), "server {i}: {body}");
        epochs.insert(body["epoch"].as_u64().expect("an epoch"));
    }
    assert_eq!(epochs.len(), 1, "servers disagree on the epoch: {epochs:?}");
    let old_epoch = epochs.into_iter().next().unwrap_or_default();

    // A follower never takes a write: 503 naming the leader.
    let follower = (leader + 1) % 3;
    let (status, body) = post(
        &servers.servers[follower].url("/v1/tables"),
        &json!({"name": "refused", "regions": 1}),
    );
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["kind"], "not_leader", "{body}");
    assert_eq!(body["error"]["leader"], json!(leader_address), "{body}");
    assert_eq!(
        body["error"]["message"],
        json!(format!(
            "this server is not the leader (the leader is {leader_address}); send writes to the leader"
        ))
    );
    assert_eq!(body["error"]["retryable"], json!(true));
    assert_eq!(get(&servers.servers[follower].url("/ready")).0, 503);

    // A burst of creations accepted without waiting, then kill -9 at once: some are unfinished in the store.
    for i in 0..BURST {
        let (status, body) = post(
            &servers.servers[leader].url("/v1/tables"),
            &json!({"name": format!("burst_{i}"), "regions": 2, "id": format!("burst-{i}"), "wait": false}),
        );
        assert_eq!(status, 202, "{body}");
        assert_eq!(body["procedure_id"], json!(format!("burst-{i}")));
    }
    servers.servers[leader].signal("-KILL");
    let killed_at = Instant::now();
    let prefix = servers.metasrv_config().metadata_store.key_prefix.clone();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let records = runtime.block_on(metadata_keys(
        &etcd.endpoints,
        &format!("{prefix}__procedure__/proc/burst-"),
    ));
    // A 202 means stored: every burst procedure has its record, finished or not.
    assert_eq!(
        records.len(),
        BURST,
        "a 202 was answered before its procedure was stored"
    );
    let unfinished = records
        .iter()
        .filter(|(_, value, _)| {
            serde_json::from_slice::<serde_json::Value>(value)
                .map(|v| v["state"] != "done")
                .unwrap_or(true)
        })
        .count();
    println!("burst: {unfinished} of {BURST} create-table procedures unfinished at the kill");

    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let new_leader = servers.wait_for_leader(&others);
    let failover = killed_at.elapsed();
    println!(
        "failover (kill -9 -> new leader answers /ready): {} ms with lease_ttl = {}s",
        failover.as_millis(),
        crate::cluster::LEASE_TTL_SECS
    );
    let (_, body) = get(&servers.servers[new_leader].url("/v1/leader"));
    let new_epoch = body["epoch"].as_u64().expect("an epoch");
    assert!(new_epoch > old_epoch, "epoch {new_epoch} after {old_epoch}");

    // The new leader recovered what the killed one left unfinished: every stored burst procedure ends done.
    let deadline = Instant::now() + PATIENCE;
    for (key, _, _) in &records {
        let id = key.rsplit("/proc/").next().unwrap_or_default().to_string();
        loop {
            let (status, body) =
                get(&servers.servers[new_leader].url(&format!("/v1/procedures/{id}")));
            if status == 200 && body["state"] == "done" {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "procedure {id} did not finish: {status} {body}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    // A client creates tables with its own ids while the leader is killed under it three times; each killed
    // server is replaced by a new one the client learns of.
    let mut alive: Vec<usize> = others.clone();
    alive.push(servers.spawn());
    let addresses = Arc::new(Mutex::new(
        servers
            .servers
            .iter()
            .map(|s| s.address.clone())
            .collect::<Vec<_>>(),
    ));
    let created = Arc::new(AtomicUsize::new(0));
    let client = {
        let created = created.clone();
        let addresses = addresses.clone();
        std::thread::spawn(move || {
            let mut ids = Vec::new();
            let mut last_leader = None;
            for i in 0..CLIENT_TABLES {
                let known = addresses.lock().map(|a| a.clone()).unwrap_or_default();
                let (table_id, leader) = create_table_following_the_leader(
                    &known,
                    &format!("client_{i}"),
                    &format!("client-{i}"),
                    last_leader.take(),
                );
                ids.push(table_id);
                last_leader = Some(leader);
                created.fetch_add(1, Ordering::SeqCst);
            }
            ids
        })
    };
    let mut failovers = vec![failover];
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
        servers.wait_for_leader(&alive);
        failovers.push(killed_at.elapsed());
        let fresh = servers.spawn();
        alive.push(fresh);
        if let Ok(mut a) = addresses.lock() {
            a.push(servers.servers[fresh].address.clone());
        }
    }
    let client_ids = client.join().expect("the client thread");
    let distinct: BTreeSet<u64> = client_ids.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        CLIENT_TABLES,
        "table ids repeat: {client_ids:?}"
    );
    failovers.sort();
    println!(
        "failover over {} kills: p50 {} ms, max {} ms (lease_ttl = {}s)",
        failovers.len(),
        failovers[failovers.len() / 2].as_millis(),
        failovers[failovers.len() - 1].as_millis(),
        crate::cluster::LEASE_TTL_SECS
    );

    // In the store: every table once, complete, with its own id; no other table.
    let reader = runtime
        .block_on(Metasrv::open(
            servers.metasrv_config(),
            RedbOpenMode::MustExist,
        ))
        .expect("open a reader");
    let mut ids = BTreeSet::new();
    for name in (0..BURST)
        .map(|i| format!("burst_{i}"))
        .chain((0..CLIENT_TABLES).map(|i| format!("client_{i}")))
    {
        let table = parse_table_name(&name).expect("a table name");
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
    let infos = runtime.block_on(metadata_keys(
        &etcd.endpoints,
        &format!("{prefix}__table_info/"),
    ));
    assert_eq!(
        infos.len(),
        BURST + CLIENT_TABLES,
        "a table was created twice"
    );

    // SIGTERM on a follower: it withdraws its candidate key at once and exits 0.
    let current = servers.wait_for_leader(&alive);
    let follower = alive
        .iter()
        .copied()
        .find(|&i| i != current)
        .expect("a follower");
    let campaigning = runtime.block_on(election_keys(&etcd.endpoints, &prefix));
    assert_eq!(
        campaigning,
        alive.len(),
        "one candidate key per live server"
    );
    servers.servers[follower].signal("-TERM");
    assert_eq!(
        servers.servers[follower].wait(),
        Some(0),
        "{}",
        servers.servers[follower].log_tail()
    );
    alive.retain(|&i| i != follower);
    assert_eq!(
        runtime.block_on(election_keys(&etcd.endpoints, &prefix)),
        alive.len(),
        "the stopped follower's candidate key is still there"
    );

    // SIGTERM on the leader: it resigns and exits 0; another server takes over.
    alive.retain(|&i| i != current);
    servers.servers[current].signal("-TERM");
    assert_eq!(
        servers.servers[current].wait(),
        Some(0),
        "{}",
        servers.servers[current].log_tail()
    );
    servers.wait_for_leader(&alive);
}
