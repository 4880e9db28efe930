//! The kv conformance suite on every backend: memory, redb (a temp file per case) and a real etcd
//! (`ETCD_ENDPOINTS`, a random key prefix per case).

use std::sync::Arc;

use remote_wal::kv::conformance::run_all;
use remote_wal::kv::{KvBackendRef, MemoryKvBackend};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_backend_conforms() {
    run_all(|| async { (Arc::new(MemoryKvBackend::new()) as KvBackendRef, Vec::new()) }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redb_backend_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let n = std::sync::atomic::AtomicUsize::new(0);
    run_all(|| {
        let path = dir.path().join(format!(
            "case-{}.redb",
            n.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        ));
        async move {
            let kv = remote_wal::kv::RedbKvBackend::open(path).unwrap();
            (Arc::new(kv) as KvBackendRef, Vec::new())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_backend_conforms() {
    let kv: KvBackendRef = Arc::new(remote_wal::kv::conformance::etcd_from_env().await);
    run_all(|| {
        let kv = kv.clone();
        async move {
            (
                kv,
                remote_wal::kv::conformance::unique_prefix("conformance"),
            )
        }
    })
    .await;
}
