//! The procedure engine on redb, against redb itself: steps per second of 1-step and 16-step procedures that
//! persist every step, 64 in flight, on a `KvStateStore` over a `RedbKvBackend` with group commit on and off; and,
//! in the same run, the raw redb commit rate (one durable write transaction of one put at a time, no trait, no
//! engine), which is what the engine would be held to if every durable transition paid its own commit.
//!
//! `cargo bench --bench engine_redb`. Throughput is in steps for the engine cases and in commits for the raw case,
//! so criterion's elements/s read side by side. After each engine case it prints the store commits per step,
//! counted by `CountingKvBackend`.

// The allocator walctl runs with, so the figures are the ones an operator gets (see docs/procedures.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use procedures::testing::Steps;
use procedures::{LocalManager, ManagerConfig, ProcedureId, ProcedureManager, ProcedureWithId};
use redb::{Database, TableDefinition};
use remote_wal::kv::redb::RedbKvBackend;
use remote_wal::kv::state_store::KvStateStore;
use remote_wal::kv::{CountingKvBackend, KvBackendRef};

/// Procedures in flight at once in the engine cases.
const IN_FLIGHT: u64 = 64;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn bench_engine_on_redb(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("temp dir");
    let next_id = AtomicU64::new(0);
    let mut group = c.benchmark_group("engine_redb");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));

    // The raw rate first, on a file of its own: one put of a record-sized value per durable commit.
    let raw = Database::create(dir.path().join("raw.redb")).expect("raw redb");
    let table: TableDefinition<&[u8], &[u8]> = TableDefinition::new("raw");
    let value = [0x5au8; 256];
    let counter = AtomicU64::new(0);
    group.throughput(Throughput::Elements(1));
    group.bench_function("raw_redb_commit", |b| {
        b.iter(|| {
            let key = counter.fetch_add(1, Ordering::Relaxed).to_be_bytes();
            let txn = raw.begin_write().expect("begin");
            {
                let mut t = txn.open_table(table).expect("table");
                t.insert(key.as_slice(), value.as_slice()).expect("insert");
            }
            txn.commit().expect("commit");
        })
    });

    for steps in [1u32, 16] {
        group.throughput(Throughput::Elements(IN_FLIGHT * u64::from(steps)));
        for on in [true, false] {
            let name = if on {
                "group_commit"
            } else {
                "no_group_commit"
            };
            let path = dir.path().join(format!("{steps}-{name}.redb"));
            let redb: KvBackendRef = Arc::new(RedbKvBackend::open(path).expect("redb"));
            let counting = Arc::new(CountingKvBackend::new(redb));
            let kv: KvBackendRef = counting.clone();
            let store = Arc::new(KvStateStore::new(kv).with_group_commit(on));
            let manager = LocalManager::new(store, ManagerConfig::default());
            rt.block_on(manager.start()).expect("manager starts");
            let commits_before = counting.commits();
            let procedures_before = next_id.load(Ordering::Relaxed);
            group.bench_function(
                format!("{steps}_steps_persisted_64_in_flight/{name}"),
                |b| {
                    b.to_async(&rt).iter(|| async {
                        // Submitted together, as concurrent callers would: each submission is a durable write too.
                        let runs = (0..IN_FLIGHT).map(|_| {
                            let id = ProcedureId::new(format!(
                                "p{}",
                                next_id.fetch_add(1, Ordering::Relaxed)
                            ));
                            let procedure = Box::new(Steps::new(steps, true));
                            let manager = &manager;
                            async move {
                                let mut watcher = manager
                                    .submit(ProcedureWithId::new(id, procedure))
                                    .await
                                    .expect("submitted");
                                watcher.wait().await.expect("procedure done");
                            }
                        });
                        futures::future::join_all(runs).await;
                    })
                },
            );
            rt.block_on(manager.stop()).expect("manager stops");
            let procedures = next_id.load(Ordering::Relaxed) - procedures_before;
            // Nothing to say of a case the filter left out.
            if procedures == 0 {
                continue;
            }
            let commits = counting.commits() - commits_before;
            eprintln!(
                "{steps}_steps/{name}: {procedures} procedures, {commits} store commits ({:.3} per step)",
                commits as f64 / (procedures * u64::from(steps)) as f64
            );
        }
    }
    group.finish();
}

criterion_group!(benches, bench_engine_on_redb);
criterion_main!(benches);
