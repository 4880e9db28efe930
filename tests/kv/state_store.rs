//! `KvStateStore`: the engine's StateStore conformance suite on memory, redb, etcd and PostgreSQL, and its limits.

use std::sync::Arc;

use procedures::testing::state_store_suite;
use procedures::{Condition, StateStore, WriteOp};
use remote_wal::kv::conformance::{etcd_from_env, postgres_from_env, unique_prefix};
use remote_wal::kv::{
    KvBackend, KvBackendRef, KvStateStore, MemoryKvBackend, RedbKvBackend, prefix_end,
};

#[tokio::test]
async fn on_memory_it_conforms() {
    state_store_suite(|| async {
        Arc::new(KvStateStore::new(Arc::new(MemoryKvBackend::new()))) as Arc<dyn StateStore>
    })
    .await;
}

#[tokio::test]
async fn on_redb_it_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let n = std::sync::atomic::AtomicUsize::new(0);
    state_store_suite(|| {
        let path = dir.path().join(format!(
            "{}.redb",
            n.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        ));
        async move {
            Arc::new(KvStateStore::new(Arc::new(
                RedbKvBackend::open(path).unwrap(),
            ))) as Arc<dyn StateStore>
        }
    })
    .await;
}

#[tokio::test]
async fn on_etcd_it_conforms() {
    conforms_on_a_shared_store(Arc::new(etcd_from_env().await)).await;
}

#[tokio::test]
async fn on_postgres_it_conforms() {
    conforms_on_a_shared_store(Arc::new(postgres_from_env("state_store").await)).await;
}

/// The suite on a store other runs share: a prefix per case, the run's keys removed at the end.
async fn conforms_on_a_shared_store(kv: KvBackendRef) {
    let run = String::from_utf8(unique_prefix("state-store")).unwrap();
    let n = std::sync::atomic::AtomicUsize::new(0);
    state_store_suite(|| {
        let kv = kv.clone();
        let prefix = format!(
            "{run}{}/",
            n.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        );
        async move { Arc::new(KvStateStore::with_prefix(kv, prefix)) as Arc<dyn StateStore> }
    })
    .await;
    kv.delete_range(run.as_bytes(), &prefix_end(run.as_bytes()), false)
        .await
        .unwrap();
}

#[tokio::test]
async fn keys_live_under_the_procedure_prefix() {
    let kv = Arc::new(MemoryKvBackend::new());
    let store = KvStateStore::new(kv.clone());
    store.put("proc/x", b"v".to_vec()).await.unwrap();
    assert_eq!(
        kv.dump().into_iter().map(|kv| kv.key).collect::<Vec<_>>(),
        vec![b"__procedure__/proc/x".to_vec()]
    );
    assert_eq!(
        store.scan("proc/").await.unwrap(),
        vec![("proc/x".to_string(), b"v".to_vec())]
    );
}

#[tokio::test]
async fn on_etcd_a_record_over_the_request_limit_is_refused_whole() {
    let kv = Arc::new(etcd_from_env().await);
    let max = kv.max_request_bytes();
    let prefix = String::from_utf8(unique_prefix("state-limit")).unwrap();
    let store = KvStateStore::with_prefix(kv.clone(), prefix.clone());
    let err = store
        .put("proc/big", vec![1; max + 1])
        .await
        .expect_err("over the limit");
    assert!(
        matches!(err, procedures::Error::StoreLimit { ref key, .. } if key == "proc/big"),
        "{err:?}"
    );
    let err = store
        .write(
            vec![Condition::Absent {
                key: "proc/big".into(),
            }],
            vec![
                WriteOp::Put {
                    key: "proc/small".into(),
                    value: b"s".to_vec(),
                },
                WriteOp::Put {
                    key: "proc/big".into(),
                    value: vec![1; max],
                },
            ],
        )
        .await
        .expect_err("the write as a whole is over the limit");
    assert!(
        matches!(err, procedures::Error::StoreLimit { .. }),
        "{err:?}"
    );
    assert!(!err.is_retryable());
    let ops: Vec<WriteOp> = (0..200)
        .map(|i| WriteOp::Put {
            key: format!("proc/{i}"),
            value: vec![1],
        })
        .collect();
    let err = store
        .write(vec![], ops)
        .await
        .expect_err("200 ops in one txn");
    assert!(
        matches!(err, procedures::Error::StoreLimit { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("128"), "{err}");
    assert!(
        store.scan("").await.unwrap().is_empty(),
        "nothing written, not even in part"
    );
}

#[tokio::test]
async fn an_unreachable_backend_is_a_retryable_store_error_keeping_the_source() {
    // A backend failing every call the way an etcd that stopped answering does.
    #[derive(Debug)]
    struct Down;
    #[async_trait::async_trait]
    impl KvBackend for Down {
        fn name(&self) -> String {
            "down".into()
        }
        fn max_txn_ops(&self) -> usize {
            usize::MAX
        }
        fn max_request_bytes(&self) -> usize {
            usize::MAX
        }
        async fn get(&self, _: &[u8]) -> remote_wal::kv::Result<Option<remote_wal::kv::KeyValue>> {
            Err(down())
        }
        async fn batch_get(
            &self,
            _: &[Vec<u8>],
        ) -> remote_wal::kv::Result<Vec<remote_wal::kv::KeyValue>> {
            Err(down())
        }
        async fn range(
            &self,
            _: remote_wal::kv::RangeRequest,
        ) -> remote_wal::kv::Result<remote_wal::kv::RangeResponse> {
            Err(down())
        }
        async fn put(
            &self,
            _: remote_wal::kv::PutRequest,
        ) -> remote_wal::kv::Result<Option<remote_wal::kv::KeyValue>> {
            Err(down())
        }
        async fn batch_put(
            &self,
            _: Vec<remote_wal::kv::KeyValue>,
            _: bool,
        ) -> remote_wal::kv::Result<Vec<remote_wal::kv::KeyValue>> {
            Err(down())
        }
        async fn compare_and_put(
            &self,
            _: remote_wal::kv::CompareAndPutRequest,
        ) -> remote_wal::kv::Result<remote_wal::kv::CompareAndPutResponse> {
            Err(down())
        }
        async fn delete_range(
            &self,
            _: &[u8],
            _: &[u8],
            _: bool,
        ) -> remote_wal::kv::Result<(u64, Vec<remote_wal::kv::KeyValue>)> {
            Err(down())
        }
        async fn batch_delete(
            &self,
            _: &[Vec<u8>],
            _: bool,
        ) -> remote_wal::kv::Result<Vec<remote_wal::kv::KeyValue>> {
            Err(down())
        }
        async fn txn(
            &self,
            _: remote_wal::kv::Txn,
        ) -> remote_wal::kv::Result<remote_wal::kv::TxnResponse> {
            Err(down())
        }
    }
    fn down() -> remote_wal::kv::Error {
        remote_wal::kv::Error::EtcdTimeout {
            endpoints: "127.0.0.1:1".into(),
            action: "txn",
            key: "k".into(),
            timeout: std::time::Duration::from_secs(1),
        }
    }
    let store = KvStateStore::new(Arc::new(Down));
    let err = store
        .write(
            vec![],
            vec![WriteOp::Delete {
                key: "proc/x".into(),
            }],
        )
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err}");
    match &err {
        procedures::Error::Store {
            action,
            key,
            source,
            ..
        } => {
            assert_eq!((*action, key.as_str()), ("write", "proc/x"));
            assert!(
                source.to_string().contains("127.0.0.1:1"),
                "the source is kept: {source}"
            );
        }
        other => panic!("expected a Store error, got {other:?}"),
    }
}
