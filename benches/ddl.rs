//! Create-table end to end (64 regions), group commit against one commit per write on redb and (with
//! `ETCD_ENDPOINTS`) etcd (64 create-tables of 8 regions in flight, and one alone), the same stores' writes of 64
//! create-tables without the engine (the anchor of those figures, see [`bench_store_ceiling`]), and building a
//! datanode's open requests (100k regions). `BENCH_ALONE_PAIRS=N` adds N interleaved pairs of one create-table
//! alone with group commit on and off (see [`alone_pairs`]).

// The allocator walctl runs with, so the figures are the ones an operator gets.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use futures::StreamExt;
use procedures::{LocalManager, ManagerConfig, ProcedureManager, StateStore};
use remote_wal::datanode::{RegionOpener, WalProviderKind};
use remote_wal::ddl::allocator::TABLE_ID_SEQ_KEY;
use remote_wal::ddl::{
    CreateTableTask, DatanodeTableValue, DdlContext, DdlManager, MemoryDatanodeManager,
    RoundRobinPeerSelector, TableMetadataAllocator, TableMetadataManager, TableName,
    WalOptionsSource,
};
use remote_wal::key::datanode_table::datanode_table_key;
use remote_wal::kv::NamespacedKvBackend;
use remote_wal::kv::etcd::{EtcdConfig, EtcdKvBackend};
use remote_wal::kv::redb::RedbKvBackend;
use remote_wal::kv::state_store::{KvStateStore, PROCEDURE_PREFIX};
use remote_wal::kv::{
    Compare, CountingKvBackend, KeyValue, KvBackend, KvBackendRef, MemoryKvBackend, PutRequest,
    RangeRequest, Txn, TxnOp, range_all,
};
use remote_wal::wal::WalOptions;
use tokio::runtime::Runtime;

/// A ready Kafka topic pool of 64 topics, handed out round-robin.
#[derive(Debug, Default)]
struct Pool(AtomicUsize);

impl WalOptionsSource for Pool {
    fn alloc_batch(&self, n: usize) -> remote_wal::ddl::error::Result<Vec<WalOptions>> {
        let first = self.0.fetch_add(n, Ordering::Relaxed);
        Ok((0..n)
            .map(|i| WalOptions::kafka(format!("greptimedb_wal_topic_{}", (first + i) % 64)))
            .collect())
    }
}

fn ddl_manager(rt: &Runtime, kv: KvBackendRef, store: Arc<dyn StateStore>) -> DdlManager {
    let context = DdlContext {
        metadata: Arc::new(TableMetadataManager::new(kv.clone())),
        allocator: Arc::new(TableMetadataAllocator::new(
            kv,
            Arc::new(RoundRobinPeerSelector::new((1..=8).collect())),
            Arc::new(Pool::default()),
        )),
        datanodes: Arc::new(MemoryDatanodeManager::new()),
    };
    let manager = Arc::new(LocalManager::new(store, ManagerConfig::default()));
    let ddl = DdlManager::new(manager.clone(), context);
    ddl.register_loaders().expect("register");
    rt.block_on(manager.start()).expect("start");
    ddl
}

fn bench_create_table(c: &mut Criterion) {
    let rt = Runtime::new().expect("runtime");
    let mut group = c.benchmark_group("create_table_64_regions");
    group.sample_size(10);

    let dir = tempfile::tempdir().expect("temp dir");
    let redb: KvBackendRef =
        Arc::new(RedbKvBackend::open(dir.path().join("ddl.redb")).expect("redb"));
    let run = run_id();
    // Metadata and procedure state on the same backend, as a metasrv runs.
    let mut backends: Vec<(&str, KvBackendRef)> =
        vec![("memory", Arc::new(MemoryKvBackend::new())), ("redb", redb)];
    // etcd only when a cluster is given (a separate run: set ETCD_ENDPOINTS first); keys are unique per run.
    if let Some(etcd) = etcd_from_env(&rt) {
        // 64 regions on Kafka topics make a metadata transaction of 154 operations, over the 128 etcd takes in one
        // transaction (the create is refused with that error): etcd measures 32.
        backends.push(("etcd_32_regions", etcd));
    }
    for (name, kv) in backends {
        let regions = if name.starts_with("etcd") { 32 } else { 64 };
        let store = Arc::new(KvStateStore::with_prefix(
            kv.clone(),
            format!("__bench_procedures/{run}/"),
        ));
        let ddl = ddl_manager(&rt, kv, store);
        let n = AtomicUsize::new(0);
        group.bench_function(name, |b| {
            b.to_async(&rt).iter(|| async {
                let i = n.fetch_add(1, Ordering::Relaxed);
                let table = TableName::new("greptime", format!("bench_{run}"), format!("t{i}"));
                ddl.create_table(CreateTableTask::new(table, regions))
                    .await
                    .expect("create")
            })
        });
    }
    group.finish();
}

/// A key prefix of this run's own: the time in nanoseconds.
fn run_id() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

/// The etcd of `ETCD_ENDPOINTS`, when it is set.
fn etcd_from_env(rt: &Runtime) -> Option<KvBackendRef> {
    std::env::var("ETCD_ENDPOINTS").ok().map(|endpoints| {
        let config = EtcdConfig::new(endpoints.split(',').map(str::trim));
        let etcd = rt.block_on(EtcdKvBackend::connect(config)).expect("etcd");
        Arc::new(etcd) as KvBackendRef
    })
}

/// 64 create-tables of 8 regions in flight, and one alone, with group commit on and off: on redb, and on etcd
/// when `ETCD_ENDPOINTS` is set (a cluster of its own; each configuration under a fresh key prefix). Each redb
/// configuration has a file of its own; metadata and procedure state share one backend, as a metasrv runs.
/// Throughput is in tables.
fn bench_group_commit(c: &mut Criterion) {
    alone_pairs();
    let rt = Runtime::new().expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let run = run_id();
    let etcd = etcd_from_env(&rt);
    let mut stores: Vec<&str> = vec!["redb"];
    if etcd.is_some() {
        stores.push("etcd");
    }
    for store_name in stores {
        let mut group = c.benchmark_group(format!("group_commit_{store_name}"));
        group.sample_size(10);
        group.measurement_time(std::time::Duration::from_secs(5));
        for (in_flight, label) in [(64usize, "64_in_flight_8_regions"), (1, "alone_8_regions")] {
            group.throughput(Throughput::Elements(in_flight as u64));
            for on in [true, false] {
                let name = if on {
                    "group_commit"
                } else {
                    "no_group_commit"
                };
                let backend: KvBackendRef = match (store_name, &etcd) {
                    ("etcd", Some(etcd)) => NamespacedKvBackend::wrap(
                        etcd.clone(),
                        &format!("__bench_ddl/{run}/{label}/{name}/"),
                    ),
                    _ => {
                        let path = dir.path().join(format!("{label}-{name}.redb"));
                        Arc::new(RedbKvBackend::open(path).expect("redb"))
                    }
                };
                let counting = Arc::new(CountingKvBackend::new(backend));
                let kv: KvBackendRef = counting.clone();
                let store = Arc::new(KvStateStore::new(kv.clone()).with_group_commit(on));
                let ddl = ddl_manager(&rt, kv, store);
                let n = AtomicUsize::new(0);
                let commits_before = counting.commits();
                group.bench_function(format!("{label}/{name}"), |b| {
                    b.to_async(&rt).iter(|| async {
                        let creates = (0..in_flight).map(|_| {
                            let i = n.fetch_add(1, Ordering::Relaxed);
                            let table = TableName::new("greptime", "public", format!("t{i}"));
                            ddl.create_table(CreateTableTask::new(table, 8))
                        });
                        for id in futures::future::join_all(creates).await {
                            id.expect("create");
                        }
                    })
                });
                let tables = n.load(Ordering::Relaxed);
                let commits = counting.commits() - commits_before;
                // Nothing to say of a case the filter left out.
                if tables == 0 {
                    continue;
                }
                eprintln!(
                    "{store_name}/{label}/{name}: {tables} tables, {commits} store commits ({:.2} per table)",
                    commits as f64 / tables as f64
                );
            }
        }
        group.finish();
    }
    // The etcd keys of this run go with it.
    if let Some(etcd) = etcd {
        let prefix = format!("__bench_ddl/{run}/").into_bytes();
        let end = remote_wal::kv::prefix_end(&prefix);
        rt.block_on(etcd.delete_range(&prefix, &end, false))
            .expect("delete the run's etcd keys");
    }
}

/// With `BENCH_ALONE_PAIRS=N`: one create-table of 8 regions alone with group commit on, then one with it off,
/// N times over (each configuration on a redb file of its own), and the median of each: the two configurations
/// meet the same moments of the disk, which separate criterion runs do not. Prints the medians and their ratio.
fn alone_pairs() {
    let Some(pairs) = std::env::var("BENCH_ALONE_PAIRS")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
    else {
        return;
    };
    let rt = Runtime::new().expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let managers: Vec<DdlManager> = [true, false]
        .into_iter()
        .map(|on| {
            let path = dir.path().join(format!("pairs-{on}.redb"));
            let kv: KvBackendRef = Arc::new(RedbKvBackend::open(path).expect("redb"));
            let store = Arc::new(KvStateStore::new(kv.clone()).with_group_commit(on));
            ddl_manager(&rt, kv, store)
        })
        .collect();
    let mut times: [Vec<std::time::Duration>; 2] = [Vec::new(), Vec::new()];
    for i in 0..pairs {
        // Which configuration goes first alternates too.
        let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
        for which in order {
            let table = TableName::new("greptime", "public", format!("t{i}"));
            let start = std::time::Instant::now();
            rt.block_on(managers[which].create_table(CreateTableTask::new(table, 8)))
                .expect("create");
            times[which].push(start.elapsed());
        }
    }
    let median = |v: &mut Vec<std::time::Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let on = median(&mut times[0]);
    let off = median(&mut times[1]);
    eprintln!(
        "alone, {pairs} interleaved pairs on redb: median {:.3} ms with group commit, {:.3} ms without ({:.3}x)",
        on.as_secs_f64() * 1e3,
        off.as_secs_f64() * 1e3,
        on.as_secs_f64() / off.as_secs_f64()
    );
}

/// The bytes one create-table of 8 regions leaves in the store: its `done` record and its metadata pairs (the id
/// sequence left out), from a real create-table on a memory backend.
fn one_table_bytes(rt: &Runtime) -> (Vec<u8>, Vec<KeyValue>) {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let ddl = ddl_manager(rt, kv.clone(), Arc::new(KvStateStore::new(kv.clone())));
    let table = TableName::new("greptime", "public", "sample");
    rt.block_on(ddl.create_table(CreateTableTask::new(table, 8)))
        .expect("create the sample table");
    let all = rt
        .block_on(range_all(kv.as_ref(), RangeRequest::prefix(Vec::new()), 0))
        .expect("read the sample table");
    let record_prefix = format!("{PROCEDURE_PREFIX}proc/").into_bytes();
    let record = all
        .iter()
        .find(|pair| pair.key.starts_with(&record_prefix))
        .map(|pair| pair.value.clone())
        .expect("the sample table's record");
    let metadata = all
        .into_iter()
        .filter(|pair| {
            !pair.key.starts_with(PROCEDURE_PREFIX.as_bytes())
                && pair.key != TABLE_ID_SEQ_KEY.as_bytes()
        })
        .collect();
    (record, metadata)
}

/// The three transactions of create-table `i` as the state store and the metadata make them, with the bytes of
/// the sample table: its submission (record absent → put), its allocation (the record), its `done` record with
/// every metadata key put if absent. Each under the manager's epoch, as the engine writes.
fn table_txns(i: usize, record: &[u8], metadata: &[KeyValue]) -> [Txn; 3] {
    let epoch = Compare::ValueEquals(b"ceiling/epoch".to_vec(), b"1".to_vec());
    let record_key = format!("ceiling/proc/{i:08}").into_bytes();
    let put_record = TxnOp::Put(record_key.clone(), record.to_vec());
    let mut done = Txn {
        compare: vec![epoch.clone()],
        success: vec![put_record.clone()],
        failure: Vec::new(),
    };
    for pair in metadata {
        let mut key = format!("ceiling/{i:08}/").into_bytes();
        key.extend_from_slice(&pair.key);
        done.compare.push(Compare::Absent(key.clone()));
        done.success.push(TxnOp::Put(key, pair.value.clone()));
    }
    [
        Txn {
            compare: vec![epoch.clone(), Compare::Absent(record_key)],
            success: vec![put_record.clone()],
            failure: Vec::new(),
        },
        Txn {
            compare: vec![epoch],
            success: vec![put_record],
            failure: Vec::new(),
        },
        done,
    ]
}

/// `txns` merged into as few transactions as the backend takes (its op limit; one epoch comparison each).
fn merged(txns: Vec<Txn>, max_ops: usize) -> Vec<Txn> {
    let mut out: Vec<Txn> = Vec::new();
    for txn in txns {
        let size = |t: &Txn| t.compare.len() + t.success.len();
        let fits = out
            .last()
            .is_some_and(|last| size(last) + size(&txn) - 1 <= max_ops);
        match out.last_mut() {
            Some(last) if fits => {
                // The epoch comparison once per transaction.
                last.compare.extend(txn.compare.into_iter().skip(1));
                last.success.extend(txn.success);
            }
            _ => out.push(txn),
        }
    }
    out
}

/// The store alone, as an anchor for the group-commit figures: the writes of 64 create-tables of 8 regions (the
/// sample table's bytes, three transactions each, see [`table_txns`]) without the engine or the DDL around them.
/// `one_by_one`: each table's three transactions in turn, 64 tables at once (what the store does without group
/// commit); `merged`: the 64 tables' first transactions merged into as few as the backend takes, sent up to its
/// transactions in flight at once, then the second, then the third (the best a group commit could do). On redb,
/// and on etcd when `ETCD_ENDPOINTS` is set. Throughput is in tables.
fn bench_store_ceiling(c: &mut Criterion) {
    let rt = Runtime::new().expect("runtime");
    let (record, metadata) = one_table_bytes(&rt);
    let dir = tempfile::tempdir().expect("temp dir");
    let run = run_id();
    let etcd = etcd_from_env(&rt);
    let mut stores = vec!["redb"];
    if etcd.is_some() {
        stores.push("etcd");
    }
    for store_name in stores {
        let mut group = c.benchmark_group(format!("store_ceiling_{store_name}"));
        group.sample_size(10);
        group.measurement_time(std::time::Duration::from_secs(5));
        group.throughput(Throughput::Elements(64));
        for mode in ["one_by_one", "merged"] {
            let kv: KvBackendRef = match (store_name, &etcd) {
                ("etcd", Some(etcd)) => NamespacedKvBackend::wrap(
                    etcd.clone(),
                    &format!("__bench_ceiling/{run}/{mode}/"),
                ),
                _ => Arc::new(
                    RedbKvBackend::open(dir.path().join(format!("ceiling-{mode}.redb")))
                        .expect("redb"),
                ),
            };
            rt.block_on(kv.put(PutRequest {
                key: b"ceiling/epoch".to_vec(),
                value: b"1".to_vec(),
                prev_kv: false,
            }))
            .expect("the epoch");
            let max_ops = kv.max_txn_ops();
            let in_flight = kv.max_txns_in_flight();
            let n = AtomicUsize::new(0);
            group.bench_function(format!("64_tables_8_regions/{mode}"), |b| {
                b.to_async(&rt).iter(|| async {
                    let first = n.fetch_add(64, Ordering::Relaxed);
                    let tables: Vec<[Txn; 3]> = (first..first + 64)
                        .map(|i| table_txns(i, &record, &metadata))
                        .collect();
                    if mode == "one_by_one" {
                        let writes = tables.into_iter().map(|txns| {
                            let kv = &kv;
                            async move {
                                for txn in txns {
                                    let response = kv.txn(txn).await.expect("txn");
                                    assert!(
                                        response.succeeded,
                                        "a ceiling transaction was refused"
                                    );
                                }
                            }
                        });
                        futures::future::join_all(writes).await;
                        return;
                    }
                    let mut waves: [Vec<Txn>; 3] = Default::default();
                    for txns in tables {
                        for (wave, txn) in waves.iter_mut().zip(txns) {
                            wave.push(txn);
                        }
                    }
                    for wave in waves {
                        let batches = merged(wave, max_ops);
                        let sent =
                            futures::stream::iter(batches.into_iter().map(|txn| kv.txn(txn)))
                                .buffer_unordered(in_flight);
                        let responses: Vec<_> = sent.collect().await;
                        for response in responses {
                            assert!(
                                response.expect("txn").succeeded,
                                "a merged ceiling transaction was refused"
                            );
                        }
                    }
                })
            });
        }
        group.finish();
    }
    if let Some(etcd) = etcd {
        let prefix = format!("__bench_ceiling/{run}/").into_bytes();
        let end = remote_wal::kv::prefix_end(&prefix);
        rt.block_on(etcd.delete_range(&prefix, &end, false))
            .expect("delete the run's etcd keys");
    }
}

fn bench_open_regions(c: &mut Criterion) {
    let rt = Runtime::new().expect("runtime");
    let kv = Arc::new(MemoryKvBackend::new());
    // 1,000 tables of 100 regions on datanode 1: 100,000 regions.
    let kvs: Vec<KeyValue> = (0..1000u32)
        .map(|t| {
            let table_id = 1024 + t;
            let regions: Vec<u32> = (0..100).collect();
            let value = DatanodeTableValue {
                table_id,
                regions: regions.clone(),
                engine: "mito".into(),
                region_storage_path: "greptime/public".into(),
                region_options: Default::default(),
                region_wal_options: regions
                    .iter()
                    .map(|&r| {
                        (
                            r,
                            WalOptions::kafka(format!("greptimedb_wal_topic_{}", r % 64)).encode(),
                        )
                    })
                    .collect(),
                version: 0,
            };
            KeyValue {
                key: datanode_table_key(1, table_id).into_bytes(),
                value: serde_json::to_vec(&value).expect("encode"),
            }
        })
        .collect();
    rt.block_on(kv.batch_put(kvs, false)).expect("load");
    let opener = RegionOpener::new(kv, 1, WalProviderKind::Kafka);
    let mut group = c.benchmark_group("open_regions");
    group.sample_size(10);
    group.bench_function("100k_regions_memory", |b| {
        b.to_async(&rt).iter(|| async {
            let open = opener.open_regions().await.expect("open");
            assert_eq!(open.requests.len(), 100_000);
            open
        })
    });
    group.finish();
}

criterion_group!(
    benches,
    bench_create_table,
    bench_group_commit,
    bench_store_ceiling,
    bench_open_regions
);
criterion_main!(benches);
