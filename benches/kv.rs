//! The metadata store's cost per call: put, get, range of 1k keys and a txn on memory, redb and (when
//! `ETCD_ENDPOINTS` is set) etcd, next to a raw redb commit of one 512 B put so the trait's overhead reads as a ratio.
//!
//! `cargo bench --bench kv` (add `-- --quick` style criterion flags as needed). etcd is skipped, with a note, when
//! `ETCD_ENDPOINTS` is unset: this is a benchmark, not a test.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use redb::{Database, ReadableDatabase, TableDefinition};
use remote_wal::kv::{
    Compare, EtcdConfig, EtcdKvBackend, KeyValue, KvBackendRef, MemoryKvBackend, PutRequest,
    RangeRequest, RedbKvBackend, Txn, TxnOp, range_all,
};
use tokio::runtime::Runtime;

const VALUE: [u8; 512] = [0x5a; 512];

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn backends(rt: &Runtime, dir: &tempfile::TempDir) -> Vec<(&'static str, KvBackendRef, Vec<u8>)> {
    let mut out: Vec<(&'static str, KvBackendRef, Vec<u8>)> = vec![
        ("memory", Arc::new(MemoryKvBackend::new()), Vec::new()),
        (
            "redb",
            Arc::new(RedbKvBackend::open(dir.path().join("bench.redb")).expect("open redb")),
            Vec::new(),
        ),
    ];
    match std::env::var("ETCD_ENDPOINTS") {
        Ok(endpoints) if !endpoints.trim().is_empty() => {
            let config = EtcdConfig::new(endpoints.split(',').map(|e| e.trim().to_string()));
            let kv = rt
                .block_on(EtcdKvBackend::connect(config))
                .expect("connect to ETCD_ENDPOINTS");
            let prefix = format!("kvbench-{}/", std::process::id()).into_bytes();
            out.push(("etcd", Arc::new(kv), prefix));
        }
        _ => eprintln!("ETCD_ENDPOINTS is unset: the etcd benchmarks are skipped"),
    }
    out
}

fn key(prefix: &[u8], name: &str) -> Vec<u8> {
    [prefix, name.as_bytes()].concat()
}

fn bench_backends(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("temp dir");
    let backends = backends(&rt, &dir);
    let counter = AtomicU64::new(0);

    let mut group = c.benchmark_group("kv");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));
    for (name, kv, prefix) in &backends {
        // 1k keys for get and range.
        let kvs: Vec<KeyValue> = (0..1000)
            .map(|i| KeyValue {
                key: key(prefix, &format!("range/{i:04}")),
                value: VALUE.to_vec(),
            })
            .collect();
        rt.block_on(kv.batch_put(kvs, false)).expect("load 1k keys");

        group.bench_with_input(BenchmarkId::new("put_512B", name), kv, |b, kv| {
            b.to_async(&rt).iter(|| async {
                let i = counter.fetch_add(1, Ordering::Relaxed);
                kv.put(PutRequest {
                    key: key(prefix, &format!("put/{i}")),
                    value: VALUE.to_vec(),
                    prev_kv: false,
                })
                .await
                .expect("put")
            })
        });
        group.bench_with_input(BenchmarkId::new("get", name), kv, |b, kv| {
            let k = key(prefix, "range/0500");
            b.to_async(&rt)
                .iter(|| async { kv.get(&k).await.expect("get") })
        });
        group.bench_with_input(BenchmarkId::new("range_1k", name), kv, |b, kv| {
            b.to_async(&rt).iter(|| async {
                let kvs = range_all(kv.as_ref(), RangeRequest::prefix(key(prefix, "range/")), 0)
                    .await
                    .expect("range");
                assert_eq!(kvs.len(), 1000);
            })
        });
        group.bench_with_input(BenchmarkId::new("txn_cas_put", name), kv, |b, kv| {
            // The shape of a procedure-state write: compare one key, put two.
            let fence = key(prefix, "txn/epoch");
            rt.block_on(kv.put(PutRequest {
                key: fence.clone(),
                value: b"1".to_vec(),
                prev_kv: false,
            }))
            .expect("put the fence");
            b.to_async(&rt).iter(|| async {
                let i = counter.fetch_add(1, Ordering::Relaxed);
                let resp = kv
                    .txn(Txn {
                        compare: vec![Compare::ValueEquals(fence.clone(), b"1".to_vec())],
                        success: vec![
                            TxnOp::Put(key(prefix, &format!("txn/{i}")), VALUE.to_vec()),
                            TxnOp::Put(key(prefix, "txn/last"), i.to_string().into_bytes()),
                        ],
                        failure: vec![],
                    })
                    .await
                    .expect("txn");
                assert!(resp.succeeded);
            })
        });
        if !prefix.is_empty() {
            rt.block_on(kv.delete_range(prefix, &remote_wal::kv::prefix_end(prefix), false))
                .expect("clean the bench prefix");
        }
    }
    group.finish();
}

/// redb on its own: one write transaction with one 512 B insert, committed durably — the floor under the redb
/// backend's put — and one read.
fn bench_raw_redb(c: &mut Criterion) {
    const TABLE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("raw");
    let dir = tempfile::tempdir().expect("temp dir");
    let db = Database::create(dir.path().join("raw.redb")).expect("create redb");
    let mut i: u64 = 0;
    let mut group = c.benchmark_group("kv");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));
    group.bench_function("raw_redb_commit_512B", |b| {
        b.iter(|| {
            i += 1;
            let tx = db.begin_write().expect("begin");
            {
                let mut table = tx.open_table(TABLE).expect("table");
                table
                    .insert(format!("put/{i}").as_bytes(), VALUE.as_slice())
                    .expect("insert");
            }
            tx.commit().expect("commit");
        })
    });
    // The floor under the redb backend's get: one read transaction reading one 512 B value.
    group.bench_function("raw_redb_get_512B", |b| {
        b.iter(|| {
            let tx = db.begin_read().expect("begin");
            let table = tx.open_table(TABLE).expect("table");
            let value = table
                .get(b"put/1".as_slice())
                .expect("get")
                .expect("present");
            assert_eq!(value.value().len(), VALUE.len());
        })
    });
    group.finish();
}

criterion_group!(benches, bench_raw_redb, bench_backends);
criterion_main!(benches);
