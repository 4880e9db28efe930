//! The metasrv's datanode registry (`src/metasrv/datanodes.rs`): registrations and their incarnations, heartbeats
//! from stale or unknown incarnations, the region leases and instructions a heartbeat brings back, how a new
//! incarnation (or a new term) waits out the leases granted before it, Kafka regions' checkpoints, and the routes
//! clients and `walctl` read (`region_to_open_by_id`, `table_leaders`).
//!
//! Every test builds its metadata with the library itself on the in-memory kv backend: a `Metasrv` started on it
//! (with the raft-engine WAL, or the Kafka WAL on the library's `FakeTopicAdmin`, whose pool `start` bootstraps)
//! creates the tables, and the registry is the metasrv's own.

mod cache;
mod drop;
mod failure;
mod kafka;
mod leases;
mod migration;
mod registration;
mod routes;
mod waits;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use remote_wal::config::{DatanodesConfig, MetadataBackend, MetadataStoreConfig, MetasrvConfig};
use remote_wal::datanode::protocol::{
    HeartbeatRequest, HeartbeatResponse, RegionRole, RegionStat, RegisterRequest, RegisterResponse,
    lease_for,
};
use remote_wal::ddl::{MemoryDatanodeManager, TableName};
use remote_wal::key::table_route::{TableRouteValue, table_route_key};
use remote_wal::kv::{KvBackend, KvBackendRef, MemoryKvBackend, PutRequest};
use remote_wal::metasrv::datanodes::{DatanodeRecord, DatanodeRegistry, datanode_key};
use remote_wal::metasrv::{Metasrv, TableRegions};
use remote_wal::wal::kafka::testing::FakeTopicAdmin;
use remote_wal::wal::{KafkaConfig, WalConfig};

/// How many times a bounded wait polls (every [`POLL`]) before the test fails: far beyond any lease the tests use.
const POLLS: u32 = 600;

/// The pause between two polls of a bounded wait.
const POLL: Duration = Duration::from_millis(20);

fn config(wal: WalConfig, ids: Vec<u64>) -> MetasrvConfig {
    MetasrvConfig {
        metadata_store: MetadataStoreConfig {
            backend: MetadataBackend::Memory,
            ..Default::default()
        },
        wal,
        datanodes: DatanodesConfig {
            ids,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A started metasrv with the raft-engine WAL on `kv`, placing regions on `ids`.
async fn raft_metasrv(kv: &KvBackendRef, ids: Vec<u64>) -> Metasrv {
    let m = Metasrv::with_parts(
        config(WalConfig::RaftEngine, ids),
        kv.clone(),
        None,
        Arc::new(MemoryDatanodeManager::new()),
    )
    .expect("valid config");
    m.start().await.expect("start");
    m
}

/// A started metasrv with the Kafka WAL on fake brokers (its pool of `num_topics` topics bootstrapped by `start`).
async fn kafka_metasrv(kv: &KvBackendRef, ids: Vec<u64>, num_topics: usize) -> Metasrv {
    let wal = WalConfig::Kafka(KafkaConfig {
        num_topics,
        topic_name_prefix: "dn_pool".to_string(),
        ..Default::default()
    });
    let m = Metasrv::with_parts(
        config(wal, ids),
        kv.clone(),
        Some(Arc::new(FakeTopicAdmin::new())),
        Arc::new(MemoryDatanodeManager::new()),
    )
    .expect("valid config");
    m.start().await.expect("start (bootstraps the fake pool)");
    m
}

fn memory_kv() -> KvBackendRef {
    Arc::new(MemoryKvBackend::new())
}

fn table(name: &str) -> TableName {
    TableName::new("greptime", "public", name)
}

async fn create(m: &Metasrv, name: &str, regions: u32) -> TableRegions {
    m.create_table(table(name), regions, false)
        .await
        .expect("create table")
}

/// The region ids the table's route gives `datanode_id`.
fn regions_of(created: &TableRegions, datanode_id: u64) -> Vec<u64> {
    created
        .regions
        .iter()
        .filter(|r| r.datanode_id == datanode_id)
        .map(|r| r.region_id)
        .collect()
}

fn register_request(datanode_id: u64, address: &str, interval_ms: u64) -> RegisterRequest {
    RegisterRequest {
        datanode_id,
        address: address.to_string(),
        heartbeat_interval_ms: interval_ms,
    }
}

/// A region the datanode reports open, flushed up to `flushed`.
fn stat(region_id: u64, flushed: u64) -> RegionStat {
    RegionStat {
        region_id,
        role: RegionRole::Follower,
        epoch: 0,
        last_entry_id: flushed,
        flushed_entry_id: flushed,
        memtable_bytes: 0,
        topic_id: None,
    }
}

fn heartbeat_request(
    datanode_id: u64,
    incarnation: u64,
    interval_ms: u64,
    regions: Vec<RegionStat>,
) -> HeartbeatRequest {
    HeartbeatRequest {
        datanode_id,
        incarnation,
        address: format!("dn{datanode_id}-{incarnation}:4001"),
        heartbeat_interval_ms: interval_ms,
        regions,
        dropped: Vec::new(),
        wal_lost: Vec::new(),
        seq: 0,
        early: false,
        closed: Vec::new(),
    }
}

/// A heartbeat of datanode `datanode_id` reporting `regions` flushed up to `flushed`, asking no flush.
async fn beat(
    registry: &DatanodeRegistry,
    datanode_id: u64,
    incarnation: u64,
    interval_ms: u64,
    regions: &[u64],
    flushed: u64,
) -> HeartbeatResponse {
    let request = heartbeat_request(
        datanode_id,
        incarnation,
        interval_ms,
        regions.iter().map(|r| stat(*r, flushed)).collect(),
    );
    registry
        .heartbeat(&request, &BTreeSet::new())
        .await
        .expect("heartbeat accepted")
}

/// The leased region ids of an answer, sorted.
fn leased(response: &HeartbeatResponse) -> Vec<u64> {
    let mut ids: Vec<u64> = response.leases.iter().map(|l| l.region_id).collect();
    ids.sort_unstable();
    ids
}

/// `lease_for(interval)` in milliseconds.
fn lease_ms(interval_ms: u64) -> u64 {
    u64::try_from(lease_for(Duration::from_millis(interval_ms)).as_millis()).unwrap()
}

/// The stored registration record of `datanode_id`.
async fn record(kv: &KvBackendRef, datanode_id: u64) -> DatanodeRecord {
    let key = datanode_key(datanode_id);
    let found = kv
        .get(key.as_bytes())
        .await
        .expect("kv readable")
        .unwrap_or_else(|| panic!("'{key}' is missing"));
    serde_json::from_slice(&found.value).expect("a DatanodeRecord")
}

/// Registers `request`, retrying while the current incarnation still counts as heartbeating (a bounded wait).
async fn register_once_allowed(
    registry: &DatanodeRegistry,
    request: &RegisterRequest,
) -> RegisterResponse {
    for _ in 0..POLLS {
        match registry.register(request).await {
            Ok(response) => return response,
            Err(remote_wal::Error::DatanodeStillHeartbeating { .. }) => {
                tokio::time::sleep(POLL).await;
            }
            Err(e) => panic!("registration refused: {e}"),
        }
    }
    panic!("the registration of {request:?} was refused for {POLLS} polls");
}

/// Heartbeats (reporting `regions` flushed at 0) until an answer brings leases; checks that every answer before it
/// held leases back and said for how long. Returns that answer and the instant right after it arrived.
async fn beat_until_leased(
    registry: &DatanodeRegistry,
    datanode_id: u64,
    incarnation: u64,
    interval_ms: u64,
    regions: &[u64],
) -> (HeartbeatResponse, Instant) {
    for _ in 0..POLLS {
        let response = beat(registry, datanode_id, incarnation, interval_ms, regions, 0).await;
        let now = Instant::now();
        if !response.leases.is_empty() {
            assert_eq!(
                response.leases_in_ms, None,
                "an answer with leases says none are held back"
            );
            return (response, now);
        }
        assert!(
            response.leases_in_ms.is_some_and(|ms| ms > 0),
            "an answer without leases says how long they are held back: {response:?}"
        );
        tokio::time::sleep(POLL).await;
    }
    panic!("datanode {datanode_id} incarnation {incarnation} got no lease in {POLLS} heartbeats");
}

/// Sets the region epochs of table `table_id`'s route (as a leader change would have bumped them), written through
/// `kv`: the metasrv's own (`m.kv()`), as a procedure of that metasrv writes routes.
async fn set_region_epochs(kv: &KvBackendRef, table_id: u32, epochs: &[(u32, u64)]) {
    let key = table_route_key(table_id);
    let found = kv
        .get(key.as_bytes())
        .await
        .expect("kv readable")
        .expect("the route exists");
    let mut route: TableRouteValue = serde_json::from_slice(&found.value).expect("a route");
    route.region_epochs.extend(epochs.iter().copied());
    kv.put(PutRequest {
        key: key.into_bytes(),
        value: serde_json::to_vec(&route).unwrap(),
        prev_kv: false,
    })
    .await
    .expect("kv writable");
}
