//! The kv conformance suite on every backend: memory, redb (a temp file per case), a real etcd
//! (`ETCD_ENDPOINTS`, a random key prefix per case) and a real PostgreSQL (`POSTGRES_URL`, one table, a random key
//! prefix per case).

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
async fn postgres_backend_conforms() {
    conforms_on_a_shared_store(Arc::new(
        remote_wal::kv::conformance::postgres_from_env("conformance").await,
    ))
    .await;
}

/// The same suite with every call over TLS, as a user the server admits only with a client certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_backend_over_tls_conforms() {
    let config = remote_wal::kv::conformance::postgres_tls_config_from_env(
        "conformance_tls",
        "ca.pem",
        true,
    )
    .unwrap();
    let kv = remote_wal::kv::PostgresKvBackend::connect(config)
        .await
        .unwrap_or_else(|e| panic!("this test needs the test command's PostgreSQL over TLS: {e}"));
    conforms_on_a_shared_store(Arc::new(kv)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_backend_conforms() {
    conforms_on_a_shared_store(Arc::new(remote_wal::kv::conformance::etcd_from_env().await)).await;
}

/// The suite on a store other runs share: one random prefix for the run, one sub-prefix per case; the run's keys
/// are removed at the end.
async fn conforms_on_a_shared_store(kv: KvBackendRef) {
    // One random prefix for the run, one sub-prefix per case; the run's keys are removed at the end.
    let run = remote_wal::kv::conformance::unique_prefix("conformance");
    let n = std::sync::atomic::AtomicUsize::new(0);
    run_all(|| {
        let kv = kv.clone();
        let ns = [
            run.clone(),
            format!("{}/", n.fetch_add(1, std::sync::atomic::Ordering::SeqCst)).into_bytes(),
        ]
        .concat();
        async move { (kv, ns) }
    })
    .await;
    kv.delete_range(&run, &remote_wal::kv::prefix_end(&run), false)
        .await
        .unwrap();
}
