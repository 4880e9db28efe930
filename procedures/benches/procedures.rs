//! Throughput of the procedure engine on the in-memory store: procedures of 1, 4 and 16 steps, persisted or not,
//! submitted one at a time or 64 at once. Reported as procedures per second.

// The allocator walctl runs with, so the figures are the ones an operator gets (see docs/procedures.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use procedures::testing::Steps;
use procedures::{
    LocalManager, ManagerConfig, MemoryStateStore, ProcedureId, ProcedureManager, ProcedureWithId,
};

fn throughput(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let next_id = Arc::new(AtomicU64::new(0));
    let mut group = c.benchmark_group("procedures");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1));
    for concurrency in [1u64, 64] {
        group.throughput(Throughput::Elements(concurrency));
        for steps in [1u32, 4, 16] {
            for persist in [false, true] {
                let manager =
                    LocalManager::new(Arc::new(MemoryStateStore::new()), ManagerConfig::default());
                rt.block_on(manager.start()).expect("manager starts");
                let name = format!(
                    "{steps}_steps/{}/{concurrency}_concurrent",
                    if persist {
                        "persisted"
                    } else {
                        "not_persisted"
                    }
                );
                group.bench_function(BenchmarkId::from_parameter(name), |b| {
                    b.to_async(&rt).iter(|| {
                        let manager = &manager;
                        let next_id = &next_id;
                        async move {
                            let mut watchers = Vec::with_capacity(concurrency as usize);
                            for _ in 0..concurrency {
                                let id = ProcedureId::new(format!(
                                    "p{}",
                                    next_id.fetch_add(1, Ordering::Relaxed)
                                ));
                                let procedure = Box::new(Steps::new(steps, persist));
                                watchers.push(
                                    manager
                                        .submit(ProcedureWithId::new(id, procedure))
                                        .await
                                        .expect("submitted"),
                                );
                            }
                            for mut watcher in watchers {
                                watcher.wait().await.expect("procedure done");
                            }
                        }
                    })
                });
                rt.block_on(manager.stop()).expect("manager stops");
            }
        }
    }
    group.finish();
}

criterion_group!(benches, throughput);
criterion_main!(benches);
