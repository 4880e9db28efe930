//! Start-up of a manager over 10,000 unfinished procedures, from `start` until every one of them is running (has
//! entered its step), on the memory store and on a redb file (`KvStateStore` over `RedbKvBackend`). Reported as
//! procedures recovered per second; the goal is at most 1 s per start-up on each store.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use procedures::{
    BoxedProcedureLoader, Context, LocalManager, LockKey, ManagerConfig, MemoryStateStore,
    Procedure, ProcedureId, ProcedureManager, ProcedureWithId, Result, StateStore, Status,
};
use remote_wal::kv::redb::RedbKvBackend;
use remote_wal::kv::state_store::KvStateStore;
use tokio::sync::Notify;

const PROCEDURES: usize = 10_000;
const TYPE: &str = "bench_waits";

/// Counts its entry into its step, then waits until the manager stops.
struct Waits {
    entered: Arc<Entered>,
}

struct Entered {
    count: AtomicUsize,
    all: Notify,
}

impl Entered {
    fn new() -> Arc<Self> {
        Arc::new(Entered {
            count: AtomicUsize::new(0),
            all: Notify::new(),
        })
    }
}

#[async_trait]
impl Procedure for Waits {
    fn type_name(&self) -> &str {
        TYPE
    }

    async fn execute(&mut self, _ctx: &Context) -> Result<Status> {
        if self.entered.count.fetch_add(1, Ordering::SeqCst) + 1 == PROCEDURES {
            self.entered.all.notify_one();
        }
        std::future::pending::<()>().await;
        Ok(Status::done())
    }

    fn dump(&self) -> Result<serde_json::Value> {
        Ok(serde_json::json!({}))
    }

    fn lock_key(&self) -> LockKey {
        LockKey::none()
    }
}

fn loader(entered: &Arc<Entered>) -> BoxedProcedureLoader {
    let entered = entered.clone();
    Box::new(move |_| {
        Ok(Box::new(Waits {
            entered: entered.clone(),
        }))
    })
}

fn config() -> ManagerConfig {
    ManagerConfig {
        max_running_procedures: PROCEDURES,
        ..ManagerConfig::default()
    }
}

/// Leaves `PROCEDURES` unfinished procedures in `store`, as a stopped manager leaves them.
async fn leave_unfinished(store: Arc<dyn StateStore>) {
    let entered = Entered::new();
    let manager = LocalManager::new(store, config());
    manager
        .register_loader(TYPE, loader(&entered))
        .expect("loader");
    manager.start().await.expect("manager starts");
    for i in 0..PROCEDURES {
        let procedure = Box::new(Waits {
            entered: entered.clone(),
        });
        manager
            .submit(ProcedureWithId::new(
                ProcedureId::new(format!("p{i:05}")),
                procedure,
            ))
            .await
            .expect("submitted");
    }
    manager.stop().await.expect("manager stops");
}

/// From `start` on `store` until every procedure entered its step; the manager is stopped afterwards.
async fn recover(store: Arc<dyn StateStore>) -> Duration {
    let entered = Entered::new();
    let manager = LocalManager::new(store, config());
    manager
        .register_loader(TYPE, loader(&entered))
        .expect("loader");
    let started = Instant::now();
    manager.start().await.expect("manager starts");
    entered.all.notified().await;
    let elapsed = started.elapsed();
    manager.stop().await.expect("manager stops");
    elapsed
}

fn recovery(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let records: Vec<(String, Vec<u8>)> = rt.block_on(async {
        let store = Arc::new(MemoryStateStore::new());
        leave_unfinished(store.clone()).await;
        store.snapshot().into_iter().collect()
    });
    // One redb file holding the same procedures; each start-up claims the next epoch on it and recovers them all.
    let dir = tempfile::tempdir().expect("temp dir");
    let redb: Arc<dyn StateStore> = {
        let kv = RedbKvBackend::open(dir.path().join("recovery.redb")).expect("redb opens");
        Arc::new(KvStateStore::new(Arc::new(kv)))
    };
    rt.block_on(leave_unfinished(redb.clone()));

    let mut group = c.benchmark_group("recovery");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(PROCEDURES as u64));
    group.bench_function("10000_unfinished/memory", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let records = &records;
            async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let store = Arc::new(MemoryStateStore::new());
                    for (key, value) in records {
                        store.put(key, value.clone()).await.expect("put");
                    }
                    total += recover(store).await;
                }
                total
            }
        })
    });
    group.bench_function("10000_unfinished/redb", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let redb = redb.clone();
            async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    total += recover(redb.clone()).await;
                }
                total
            }
        })
    });
    group.finish();
}

criterion_group!(benches, recovery);
criterion_main!(benches);
