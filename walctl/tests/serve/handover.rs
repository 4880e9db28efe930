//! SIGTERM on a leader under load: it stops its manager (every task aborted, so nothing of it writes after), then
//! resigns and revokes its lease, so a follower leads at once; it exits 0, and clients retrying with their ids get
//! every table exactly once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::cluster::{EtcdCluster, PATIENCE, Servers, get, metadata_keys};
use crate::partition::load;

/// Clients creating tables at once.
const CLIENTS: usize = 4;

#[test]
fn sigterm_on_a_loaded_leader_hands_over_before_it_stops_and_loses_no_table() {
    let etcd = EtcdCluster::start("hand");
    let servers = Servers::on_etcd(&etcd.endpoints, 3);
    let old = servers.wait_for_leader(&[0, 1, 2]);
    let addresses: Vec<String> = servers.servers.iter().map(|s| s.address.clone()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let tags = ["sigterm_a", "sigterm_b", "sigterm_c", "sigterm_d"];
    let clients: Vec<_> = tags[..CLIENTS]
        .iter()
        .map(|tag| load(addresses.clone(), tag, stop.clone()))
        .collect();
    std::thread::sleep(Duration::from_secs(2));

    let others: Vec<usize> = (0..3).filter(|&i| i != old).collect();
    let signalled = Instant::now();
    servers.servers[old].signal("-TERM");
    let successor = loop {
        if let Some(&i) = others
            .iter()
            .find(|&&i| get(&servers.servers[i].url("/ready")).0 == 200)
        {
            break i;
        }
        assert!(
            signalled.elapsed() < PATIENCE,
            "no server led after the SIGTERM within {PATIENCE:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let handed_over = signalled.elapsed();
    let mut servers = servers;
    let code = servers.servers[old].wait();
    let exited = signalled.elapsed();
    println!(
        "SIGTERM under load ({CLIENTS} clients): server {successor} ready {} ms after the signal; the old leader \
         exited after {} ms",
        handed_over.as_millis(),
        exited.as_millis()
    );
    assert_eq!(code, Some(0), "{}", servers.servers[old].log_tail());
    // No server logged a warning: not the one shut down, not the followers.
    for server in &servers.servers {
        let log = std::fs::read_to_string(&server.log).unwrap_or_default();
        let noisy: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .collect();
        assert!(noisy.is_empty(), "{}: {noisy:#?}", server.address);
    }

    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    let mut created = Vec::new();
    for client in clients {
        let seen = client.join().expect("a client");
        assert!(
            seen.final_errors.is_empty(),
            "final errors: {:?}",
            seen.final_errors
        );
        created.extend(seen.created);
    }
    let mut ids: Vec<u64> = created.iter().map(|(_, id)| *id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), created.len(), "a table id was given twice");
    let prefix = servers.metasrv_config().metadata_store.key_prefix.clone();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let tables = runtime
        .block_on(metadata_keys(&etcd.endpoints, &prefix))
        .iter()
        .filter(|(k, _, _)| k.contains("__table_name/"))
        .count();
    assert_eq!(tables, created.len(), "every table created exists once");
    let (status, failed) =
        get(&servers.servers[successor].url("/v1/procedures?state=failed,stalled"));
    assert_eq!((status, &failed["matched"]), (200, &json!(0)), "{failed}");
}
