//! PersistNames writes the pool's names outside the procedure store, so the engine's epoch does not fence it: what
//! stops a deposed leader's late write is that each name is put only if absent, in one transaction
//! (`docs/ha.md`, "Fencing"). Here a first manager's bootstrap is held at its PersistNames transaction while a
//! second manager claims the epoch, recovers the bootstrap and finishes it, and a prune then raises a topic's
//! watermark. Let go, the first manager's transaction writes nothing (a blind put would reset the watermark to 0),
//! and the manager halts fenced without finishing the procedure.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use procedures::{LocalManager, ManagerConfig, ProcedureManager, ProcedureWithId, RetryPolicy};
use remote_wal::key::topic_name::{TopicNameValue, topic_name_key};
use remote_wal::kv::{
    KvBackend, KvBackendRef, KvStateStore, KvWrapper, MemoryKvBackend, PutRequest, RangeRequest,
    Txn, TxnResponse, range_all,
};
use remote_wal::wal::kafka::bootstrap::{TopicBootstrapProcedure, bootstrap_procedure_id};
use remote_wal::wal::kafka::testing::FakeTopicAdmin;
use remote_wal::wal::kafka::{ReadyPoll, TopicPoolSpec};
use tokio::sync::Semaphore;

const WAIT: Duration = Duration::from_secs(30);

/// Holds the first transaction on `__topic_name/` keys (before it reaches the store) until released.
#[derive(Debug)]
struct HeldNames {
    inner: KvBackendRef,
    armed: AtomicBool,
    entered: Semaphore,
    release: Semaphore,
}

#[async_trait]
impl KvWrapper for HeldNames {
    fn inner(&self) -> &dyn KvBackend {
        self.inner.as_ref()
    }

    async fn txn(&self, txn: Txn) -> remote_wal::kv::Result<TxnResponse> {
        let names = txn
            .success
            .iter()
            .any(|op| op.key().starts_with(b"__topic_name/"));
        if names && self.armed.swap(false, Ordering::SeqCst) {
            self.entered.add_permits(1);
            if let Ok(permit) = self.release.acquire().await {
                permit.forget();
            }
        }
        self.inner.txn(txn).await
    }
}

fn spec() -> TopicPoolSpec {
    let mut spec = TopicPoolSpec::new("late_names", 4);
    spec.ready_poll = ReadyPoll {
        init: Duration::from_millis(1),
        max: Duration::from_millis(5),
        factor: 2.0,
        deadline: Duration::from_secs(5),
    };
    spec
}

fn manager(kv: &KvBackendRef, names_kv: KvBackendRef, admin: &Arc<FakeTopicAdmin>) -> LocalManager {
    let quick = RetryPolicy {
        max_retries: 2,
        initial_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
        factor: 2.0,
    };
    let m = LocalManager::new(
        Arc::new(KvStateStore::new(kv.clone())),
        ManagerConfig {
            step_retry: quick.clone(),
            store_retry: quick,
            ..Default::default()
        },
    );
    m.register_loader(
        TopicBootstrapProcedure::TYPE_NAME,
        TopicBootstrapProcedure::loader(names_kv, admin.clone()),
    )
    .unwrap();
    m
}

/// Every `__topic_name/` key with its value, as text.
async fn names(kv: &KvBackendRef) -> Vec<(String, String)> {
    range_all(
        kv.as_ref(),
        RangeRequest::prefix(b"__topic_name/".to_vec()),
        1024,
    )
    .await
    .unwrap()
    .into_iter()
    .map(|kv| {
        (
            String::from_utf8_lossy(&kv.key).into_owned(),
            String::from_utf8_lossy(&kv.value).into_owned(),
        )
    })
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_managers_late_persist_names_writes_nothing_and_it_halts() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    let held = Arc::new(HeldNames {
        inner: kv.clone(),
        armed: AtomicBool::new(true),
        entered: Semaphore::new(0),
        release: Semaphore::new(0),
    });
    let id = bootstrap_procedure_id("late_names", 0);

    // The first manager: its bootstrap created the topics and is held at PersistNames' transaction.
    let a = manager(&kv, held.clone(), &admin);
    a.start().await.unwrap();
    let procedure = TopicBootstrapProcedure::new(spec(), held.clone(), admin.clone()).unwrap();
    let mut a_watcher = a
        .submit(ProcedureWithId::new(id.clone(), Box::new(procedure)))
        .await
        .unwrap();
    tokio::time::timeout(WAIT, held.entered.acquire())
        .await
        .expect("the first manager reaches PersistNames")
        .unwrap()
        .forget();
    assert!(names(&kv).await.is_empty());

    // A second manager claims the epoch and finishes the bootstrap; then a prune raises one watermark.
    let b = manager(&kv, kv.clone(), &admin);
    b.start().await.unwrap();
    let mut w = b.watch(&id).await.unwrap().expect("recovered");
    tokio::time::timeout(WAIT, w.wait())
        .await
        .expect("the second manager finishes")
        .unwrap();
    let persisted = names(&kv).await;
    assert_eq!(persisted.len(), 4, "{persisted:?}");
    let topic = "late_names_0";
    let key = topic_name_key(topic);
    let found = kv.get(&key).await.unwrap().expect("persisted");
    let mut value = TopicNameValue::decode(&key, &found.value).unwrap();
    value.pruned_entry_id = 50;
    kv.put(PutRequest {
        key: key.clone(),
        value: value.encode(),
        prev_kv: false,
    })
    .await
    .unwrap();
    let before = names(&kv).await;

    // Let go, the deposed manager's transaction writes nothing, and it does not finish the procedure.
    held.release.add_permits(1);
    let outcome = tokio::time::timeout(WAIT, a_watcher.wait())
        .await
        .expect("the deposed manager stops");
    assert!(
        outcome.is_err(),
        "the deposed manager finished the bootstrap: {outcome:?}"
    );
    assert_eq!(
        names(&kv).await,
        before,
        "the late PersistNames changed a name"
    );
    let kept = TopicNameValue::decode(&key, &kv.get(&key).await.unwrap().unwrap().value).unwrap();
    assert_eq!(kept.pruned_entry_id, 50, "the watermark was reset");
    let refused = a
        .submit(ProcedureWithId::with_random_id(Box::new(
            TopicBootstrapProcedure::new(spec(), kv.clone(), admin.clone()).unwrap(),
        )))
        .await
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(refused.contains("fenced by epoch"), "{refused}");
    b.stop().await.unwrap();
}
