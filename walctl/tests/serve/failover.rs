//! Three servers on a three-member etcd with the Kafka WAL: one leads, followers redirect, kill -9 fails over, ids
//! keep creation exactly-once across it (and every region gets one topic of the pool, which is created once),
//! SIGTERM hands over at once.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use remote_wal::kv::redb::RedbOpenMode;
use remote_wal::metasrv::{Metasrv, parse_table_name};
use serde_json::json;

use crate::cluster::{
    EtcdCluster, PATIENCE, Servers, create_table_following_the_leader, election_keys, get,
    metadata_keys, post, unique,
};
use crate::support::{endpoints, pool_topics_on_broker};

/// Burst tables submitted without waiting just before the leader is killed.
const BURST: usize = 20;
/// Tables a client creates with its own ids while the leader is killed under it.
const CLIENT_TABLES: usize = 200;
/// Leader kills while the client runs.
const KILLS: usize = 3;
/// Topics in the Kafka pool: fewer than the regions, so topics are shared and a doubled one would show.
const POOL_TOPICS: usize = 8;

#[test]
fn one_leader_followers_redirect_and_kill_9_fails_over_without_losing_or_doubling_a_table() {
    let etcd = EtcdCluster::start("srvfo");
    let kafka = endpoints("KAFKA_ENDPOINTS");
    let topic_prefix = unique("srvfo");
    let brokers: Vec<String> = kafka.iter().map(|e| format!("{e:?}")).collect();
    let wal = format!(
        "\n[wal]\nprovider = \"kafka\"\nbroker_endpoints = [{}]\nnum_topics = {POOL_TOPICS}\n\
         topic_name_prefix = \"{topic_prefix}\"\nreplication_factor = 1\n",
        brokers.join(", ")
    );
    let mut servers = Servers::on_etcd_with(&etcd.endpoints, &wal, 3);
    let leader = servers.wait_for_leader(&[0, 1, 2]);
    let pool: BTreeSet<String> = (0..POOL_TOPICS)
        .map(|i| format!("{topic_prefix}_{i}"))
        .collect();
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
        for region in &regions.regions {
            let topic = kafka_topic(&region.wal_options)
                .unwrap_or_else(|| panic!("{name}: not one Kafka WAL option: {region:?}"));
            assert!(
                pool.contains(&topic),
                "{name}: topic {topic} is not in the pool"
            );
        }
        assert!(ids.insert(id), "table id {id} used twice");
    }
    // Each datanode's record of a table holds one WAL option per region it serves, and none for another region.
    let datanode_tables = runtime.block_on(metadata_keys(
        &etcd.endpoints,
        &format!("{prefix}__dn_table/"),
    ));
    let mut region_options = 0;
    for (key, value, _) in &datanode_tables {
        let value: serde_json::Value =
            serde_json::from_slice(value).expect("a datanode table value");
        let served: BTreeSet<String> = value["regions"]
            .as_array()
            .map(|r| r.iter().map(|n| n.to_string()).collect())
            .unwrap_or_default();
        let options = value["region_wal_options"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        let with_options: BTreeSet<String> = options.keys().cloned().collect();
        assert_eq!(with_options, served, "{key}: {value}");
        region_options += options.len();
        for option in options.values() {
            let topic = option
                .as_str()
                .and_then(kafka_topic)
                .unwrap_or_else(|| panic!("{key}: not one Kafka WAL option: {option}"));
            assert!(
                pool.contains(&topic),
                "{key}: topic {topic} is not in the pool"
            );
        }
    }
    assert_eq!(
        region_options,
        2 * (BURST + CLIENT_TABLES),
        "one WAL option per region in all"
    );
    // Every pool topic exists once on the broker with one partition, and no other topic of the pool's prefix; the
    // store persists exactly the pool's names; no leader found a topic missing and created it again.
    let on_broker = pool_topics_on_broker(&kafka, &topic_prefix);
    let expected: std::collections::BTreeMap<String, usize> =
        pool.iter().map(|t| (t.clone(), 1)).collect();
    assert_eq!(on_broker, expected, "the pool's topics on the broker");
    let persisted: BTreeSet<String> = runtime
        .block_on(metadata_keys(
            &etcd.endpoints,
            &format!("{prefix}__topic_name/kafka/"),
        ))
        .into_iter()
        .map(|(key, _, _)| key.rsplit('/').next().unwrap_or_default().to_string())
        .collect();
    assert_eq!(persisted, pool, "persisted topic names");
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
    let (status, bootstrap) = post(&servers.servers[current].url("/v1/bootstrap"), &json!({}));
    assert_eq!(status, 200, "{bootstrap}");
    assert_eq!(bootstrap["ready"], json!(true), "{bootstrap}");
    assert_eq!(bootstrap["recreated_topics"], json!(0), "{bootstrap}");
    assert_eq!(bootstrap["num_topics"], json!(POOL_TOPICS), "{bootstrap}");
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

/// The topic of encoded WAL options that are exactly `{"wal.provider":"kafka","wal.kafka.topic":T}`.
fn kafka_topic(wal_options: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(wal_options).ok()?;
    let object = value.as_object()?;
    if object.len() != 2 || object.get("wal.provider")? != "kafka" {
        return None;
    }
    object.get("wal.kafka.topic")?.as_str().map(str::to_string)
}

/// `walctl --server A,B,C --json create-table NAME --regions 2 [--id ID] --wait 60s`, started in the background.
fn walctl_create_table(
    addresses: &str,
    name: &str,
    id: Option<&str>,
) -> std::thread::JoinHandle<std::process::Output> {
    let child = std::process::Command::new(crate::support::walctl_path())
        .args([
            "--server",
            addresses,
            "--wait",
            "60s",
            "--json",
            "create-table",
        ])
        .args([name, "--regions", "2"])
        .args(id.map(|id| ["--id", id]).iter().flatten())
        .env_remove("WALCTL_SERVER")
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn walctl --server");
    std::thread::spawn(move || child.wait_with_output().expect("walctl output"))
}

#[test]
fn walctl_server_create_table_accepted_by_a_leader_killed_under_it_is_finished_by_the_next_once() {
    let etcd = endpoints("ETCD_ENDPOINTS");
    let servers = Servers::on_etcd(&etcd, 3);
    let leader = servers.wait_for_leader(&[0, 1, 2]);
    let addresses: Vec<String> = servers.servers.iter().map(|s| s.address.clone()).collect();
    let addresses = addresses.join(",");
    let prefix = servers.metasrv_config().metadata_store.key_prefix.clone();

    // Every procedure paused (a key in the store, so the next leader sees it too): the leader stores each
    // create-table and holds its request open, so the kill lands while the commands wait for their answers.
    let (status, body) = post(
        &servers.servers[leader].url("/v1/procedures/pause"),
        &json!({}),
    );
    assert_eq!(status, 200, "{body}");
    // Three with their ids, and one whose id the command picks itself (it must send the same one again).
    let accepted: Vec<String> = (0..3).map(|i| format!("accepted-{i}")).collect();
    let mut commands: Vec<(String, std::thread::JoinHandle<std::process::Output>)> = accepted
        .iter()
        .map(|id| {
            (
                id.replace('-', "_"),
                walctl_create_table(&addresses, &id.replace('-', "_"), Some(id)),
            )
        })
        .collect();
    commands.push((
        "no_id".to_string(),
        walctl_create_table(&addresses, "no_id", None),
    ));
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (_, list) = get(&servers.servers[leader].url("/v1/procedures"));
        let stored = list["procedures"]
            .as_array()
            .map(|p| {
                p.iter()
                    .filter(|p| p["type_name"] == "remote_wal::CreateTable")
                    .inspect(|p| assert_ne!(p["state"], json!("done"), "paused, not done: {p}"))
                    .count()
            })
            .unwrap_or(0);
        if stored == commands.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the commands were never submitted: {list}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    servers.servers[leader].signal("-KILL");
    // One more command while no server leads: it has to find the next leader by itself.
    commands.push((
        "during_election".to_string(),
        walctl_create_table(&addresses, "during_election", Some("during-election")),
    ));
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let new_leader = servers.wait_for_leader(&others);
    for (name, command) in &commands {
        assert!(
            !command.is_finished(),
            "create-table {name} answered while every procedure is paused"
        );
    }
    let (status, body) = post(
        &servers.servers[new_leader].url("/v1/procedures/resume"),
        &json!({}),
    );
    assert_eq!(status, 200, "{body}");

    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let reader = runtime
        .block_on(Metasrv::open(
            servers.metasrv_config(),
            RedbOpenMode::MustExist,
        ))
        .expect("open a reader");
    let mut table_ids = BTreeSet::new();
    for (name, command) in commands {
        let out = command.join().expect("a walctl thread");
        assert!(
            out.status.success(),
            "walctl --server create-table {name} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines = crate::support::json_lines(&String::from_utf8_lossy(&out.stdout));
        // One line per region, each naming the table.
        assert_eq!(lines.len(), 2, "{lines:?}");
        let table_id = lines[0]["table_id"].as_u64().expect("a table id");
        assert_eq!(lines[1]["table_id"], json!(table_id), "{lines:?}");
        assert!(table_ids.insert(table_id), "table id {table_id} twice");
        assert_eq!(lines[0]["table"], json!(format!("greptime.public.{name}")));
        // The table the command printed is the one the store holds under its name.
        let table = parse_table_name(&name).expect("a table name");
        let stored = runtime
            .block_on(reader.table_id(&table))
            .expect("read the table id")
            .unwrap_or_else(|| panic!("table {name} is missing"));
        assert_eq!(u64::from(stored), table_id, "{name}");
    }
    // Each table exists once: five table infos, five create-table procedures (a retry under a new id would have
    // left a sixth), each done.
    let infos = runtime.block_on(metadata_keys(&etcd, &format!("{prefix}__table_info/")));
    assert_eq!(infos.len(), 5, "a table was created twice");
    let (_, list) = get(&servers.servers[new_leader].url("/v1/procedures"));
    let created: Vec<&serde_json::Value> = list["procedures"]
        .as_array()
        .map(|p| {
            p.iter()
                .filter(|p| p["type_name"] == "remote_wal::CreateTable")
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(created.len(), 5, "{list}");
    for procedure in created {
        assert_eq!(procedure["state"], json!("done"), "{procedure}");
    }
}
