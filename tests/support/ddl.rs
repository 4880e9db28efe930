//! Helpers shared by the ddl tests (not a test target itself).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use remote_wal::datanode::{RegionOpenRequest, RegionOpener, WalProviderKind};
use remote_wal::ddl::{
    DdlContext, MemoryDatanodeManager, RoundRobinPeerSelector, TableMetadataAllocator,
    TableMetadataManager, WalOptionsSource, WalOptionsSourceRef,
};
use remote_wal::kv::{KvBackendRef, RangeRequest};
use remote_wal::wal::WalOptions;

/// A pool of Kafka topics already in place (as after bootstrap): hands them out round-robin from the first.
#[derive(Debug)]
pub struct FakeKafkaPool {
    topics: Vec<String>,
    next: AtomicUsize,
}

impl FakeKafkaPool {
    pub fn new(n: usize) -> Self {
        FakeKafkaPool {
            topics: (0..n)
                .map(|i| format!("greptimedb_wal_topic_{i}"))
                .collect(),
            next: AtomicUsize::new(0),
        }
    }
}

impl WalOptionsSource for FakeKafkaPool {
    fn alloc_batch(&self, n: usize) -> remote_wal::ddl::error::Result<Vec<WalOptions>> {
        let first = self.next.fetch_add(n, Ordering::Relaxed);
        Ok((0..n)
            .map(|i| WalOptions::kafka(self.topics[(first + i) % self.topics.len()].clone()))
            .collect())
    }
}

/// A context as a freshly started metasrv process builds it: new allocator (new sequence cache, selector at its
/// first datanode) over the shared kv and datanodes.
pub fn context(
    kv: KvBackendRef,
    datanode_ids: Vec<u64>,
    wal: WalOptionsSourceRef,
    datanodes: Arc<MemoryDatanodeManager>,
) -> DdlContext {
    DdlContext {
        metadata: Arc::new(TableMetadataManager::new(kv.clone())),
        allocator: Arc::new(TableMetadataAllocator::new(
            kv,
            Arc::new(RoundRobinPeerSelector::new(datanode_ids)),
            wal,
        )),
        datanodes,
    }
}

/// What each datanode would open: its requests, and its errors as text.
pub async fn open_all(
    kv: &KvBackendRef,
    datanode_ids: &[u64],
    provider: WalProviderKind,
) -> BTreeMap<u64, (Vec<RegionOpenRequest>, Vec<String>)> {
    let mut out = BTreeMap::new();
    for &dn in datanode_ids {
        let open = RegionOpener::new(kv.clone(), dn, provider)
            .with_page_size(2)
            .open_regions()
            .await
            .expect("kv readable");
        let errors = open.errors.iter().map(|e| e.error.to_string()).collect();
        out.insert(dn, (open.requests, errors));
    }
    out
}

/// Every metadata key (table name/info/route, datanode tables, id sequence, allocation reservations) as text.
pub async fn metadata_snapshot(kv: &KvBackendRef) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for prefix in [
        "__table_name/",
        "__table_info/",
        "__table_route/",
        "__dn_table/",
        "__table_id_seq",
        "__table_allocation/",
    ] {
        let resp = remote_wal::kv::range_all(kv.as_ref(), RangeRequest::prefix(prefix), 128)
            .await
            .expect("kv readable");
        for kv in resp {
            out.insert(
                String::from_utf8_lossy(&kv.key).to_string(),
                String::from_utf8_lossy(&kv.value).to_string(),
            );
        }
    }
    out
}

/// Bootstraps the pool `spec` through `admin` with the real bootstrap procedure, and returns the persisted topic
/// keys (what every later metasrv finds in its kv).
pub async fn bootstrap_pool(
    spec: remote_wal::wal::kafka::TopicPoolSpec,
    admin: remote_wal::wal::kafka::admin::TopicAdminRef,
) -> Vec<remote_wal::kv::KeyValue> {
    let kv: KvBackendRef = Arc::new(remote_wal::kv::MemoryKvBackend::new());
    let topics = remote_wal::wal::kafka::KafkaTopicManager::new(
        spec,
        kv.clone(),
        admin,
        Arc::new(remote_wal::wal::kafka::RoundRobinTopicSelector::new()),
    )
    .expect("valid spec");
    let manager: procedures::ProcedureManagerRef = Arc::new(procedures::LocalManager::new(
        Arc::new(procedures::MemoryStateStore::new()),
        procedures::ManagerConfig::default(),
    ));
    topics.register_loader(manager.as_ref()).expect("register");
    manager.start().await.expect("start");
    topics.start(&manager).await.expect("bootstrap");
    manager.stop().await.expect("stop");
    remote_wal::kv::range_all(kv.as_ref(), RangeRequest::prefix("__topic_name/"), 0)
        .await
        .expect("kv readable")
}

/// A ready `WalOptionsAllocator::Kafka` over a kv holding the pool's persisted topic keys, handing out topics
/// round-robin from the first.
pub async fn kafka_allocator(
    spec: remote_wal::wal::kafka::TopicPoolSpec,
    admin: remote_wal::wal::kafka::admin::TopicAdminRef,
    kv: KvBackendRef,
) -> remote_wal::wal::WalOptionsAllocator {
    let topics = remote_wal::wal::kafka::KafkaTopicManager::new(
        spec,
        kv,
        admin,
        Arc::new(remote_wal::wal::kafka::RoundRobinTopicSelector::new()),
    )
    .expect("valid spec");
    topics.load_ready().await.expect("pool persisted");
    remote_wal::wal::WalOptionsAllocator::Kafka(topics)
}

/// Kafka endpoints from `KAFKA_ENDPOINTS`; fails the test when unset.
pub fn kafka_endpoints() -> Vec<String> {
    let raw = std::env::var("KAFKA_ENDPOINTS").unwrap_or_default();
    let endpoints: Vec<String> = raw
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(String::from)
        .collect();
    assert!(
        !endpoints.is_empty(),
        "KAFKA_ENDPOINTS is not set: this test needs a running Kafka broker (comma-separated host:port)"
    );
    endpoints
}

/// A leadership that reports each region's routed datanode as its leader at the route's region epoch (as the
/// registry does once that datanode heartbeats with a lease), and `live` as the live datanodes.
#[derive(Debug)]
pub struct RouteLeadership {
    pub kv: KvBackendRef,
    pub live: Vec<u64>,
}

#[async_trait::async_trait]
impl remote_wal::ddl::RegionLeadership for RouteLeadership {
    async fn region_leader(&self, region_id: u64) -> Option<(u64, u64)> {
        let table = (region_id >> 32) as u32;
        let key = remote_wal::key::table_route::table_route_key(table);
        let found = self.kv.get(key.as_bytes()).await.ok()??;
        let route: remote_wal::key::table_route::TableRouteValue =
            serde_json::from_slice(&found.value).ok()?;
        let number = (region_id & 0xffff_ffff) as u32;
        route
            .region_routes
            .get(&number)
            .map(|dn| (*dn, route.region_epoch(number)))
    }

    async fn live_datanodes(&self) -> Vec<u64> {
        self.live.clone()
    }
}

/// A table's route (version 1, no epochs) and one `__dn_table` record per datanode, for `placement` (region
/// number → datanode) with each region's encoded WAL options from `wal`.
pub fn table_keys(
    table: u32,
    placement: &BTreeMap<u32, u64>,
    wal: &dyn Fn(u32) -> String,
) -> Vec<remote_wal::kv::KeyValue> {
    use remote_wal::key::datanode_table::{DatanodeTableValue, datanode_table_key};
    use remote_wal::key::table_route::{TableRouteValue, table_route_key};
    let route = TableRouteValue {
        region_routes: placement.clone(),
        version: 1,
        region_epochs: BTreeMap::new(),
    };
    let mut kvs = vec![remote_wal::kv::KeyValue {
        key: table_route_key(table).into_bytes(),
        value: serde_json::to_vec(&route).expect("a route encodes"),
    }];
    let mut by_dn: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    for (number, dn) in placement {
        by_dn.entry(*dn).or_default().push(*number);
    }
    for (dn, regions) in by_dn {
        let value = DatanodeTableValue {
            table_id: table,
            region_wal_options: regions.iter().map(|n| (*n, wal(*n))).collect(),
            regions,
            engine: "mito".to_string(),
            region_storage_path: "greptime/public".to_string(),
            region_options: BTreeMap::new(),
            version: 1,
        };
        kvs.push(remote_wal::kv::KeyValue {
            key: datanode_table_key(dn, table).into_bytes(),
            value: serde_json::to_vec(&value).expect("a record encodes"),
        });
    }
    kvs
}
