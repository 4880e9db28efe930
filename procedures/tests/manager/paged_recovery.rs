//! Recovery reads the procedure records page by page (`StateStore::scan_page`), never in one scan of them all.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use procedures::record::RECORD_PREFIX;
use procedures::store::StateStore;
use procedures::testing::StateStoreWrapper;
use procedures::{
    Error, LocalManager, MemoryStateStore, ProcedureId, ProcedureManager, ProcedureState, Result,
};

use crate::support::manager::{Env, Plan, TYPE, fast_config, within};

/// A memory store whose pages hold at most [`SmallPages::PAGE`] pairs and that refuses a whole scan of the
/// records (a manager that still read them at once would fail to start).
struct SmallPages {
    inner: Arc<MemoryStateStore>,
    pages: AtomicUsize,
}

impl SmallPages {
    const PAGE: usize = 3;
}

#[async_trait]
impl StateStoreWrapper for SmallPages {
    fn inner(&self) -> &dyn StateStore {
        self.inner.as_ref()
    }

    async fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        if prefix == RECORD_PREFIX {
            return Err(Error::Store {
                action: "scan",
                key: prefix.to_string(),
                source: "this store reads the records in pages only".into(),
                retryable: false,
            });
        }
        self.inner.scan(prefix).await
    }

    async fn scan_page(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Vec<u8>)>> {
        self.pages.fetch_add(1, Ordering::SeqCst);
        self.inner
            .scan_page(prefix, after, limit.min(Self::PAGE))
            .await
    }
}

#[tokio::test]
async fn recovery_pages_through_the_records_and_resumes_every_one() {
    let memory = Arc::new(MemoryStateStore::new());
    let env = Env::new(false);
    let first = LocalManager::new(memory.clone(), fast_config());
    first.register_loader(TYPE, env.loader()).unwrap();
    first.start().await.unwrap();
    // Ten procedures left unfinished: each blocks in its first step until the gate opens.
    let ids: Vec<String> = (0..10).map(|i| format!("p{i:02}")).collect();
    for id in &ids {
        let plan = Plan {
            block_at: Some(0),
            ..Plan::steps(1, true)
        };
        first.submit(env.with_id(id, plan)).await.unwrap();
    }
    first.stop().await.unwrap();

    let paged = Arc::new(SmallPages {
        inner: memory.clone(),
        pages: AtomicUsize::new(0),
    });
    let second = LocalManager::new(paged.clone(), fast_config());
    second.register_loader(TYPE, env.loader()).unwrap();
    within(second.start()).await.unwrap();
    // 10 records in pages of 3: four pages with records, then an empty one that ends the read.
    assert_eq!(paged.pages.load(Ordering::SeqCst), 5);
    let listed = second.list_procedures().await.unwrap();
    let states: Vec<(String, ProcedureState)> =
        listed.iter().map(|p| (p.id.to_string(), p.state)).collect();
    let expected: Vec<(String, ProcedureState)> = ids
        .iter()
        .map(|id| (id.clone(), ProcedureState::Running))
        .collect();
    assert_eq!(states, expected, "every record recovered, none twice");
    env.gate.add_permits(usize::MAX >> 4);
    for id in &ids {
        let mut watcher = second
            .watch(&ProcedureId::new(id.as_str()))
            .await
            .unwrap()
            .unwrap();
        within(watcher.wait()).await.unwrap();
    }
    second.stop().await.unwrap();
}

#[tokio::test]
async fn memory_store_pages_follow_key_order_within_the_prefix() {
    let store = MemoryStateStore::new();
    for key in ["a/1", "b/1", "b/2", "b/3", "c/1"] {
        store.put(key, key.as_bytes().to_vec()).await.unwrap();
    }
    let keys = |page: Vec<(String, Vec<u8>)>| page.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
    assert_eq!(
        keys(store.scan_page("b/", None, 2).await.unwrap()),
        ["b/1", "b/2"]
    );
    assert_eq!(
        keys(store.scan_page("b/", Some("b/2"), 2).await.unwrap()),
        ["b/3"]
    );
    assert!(
        store
            .scan_page("b/", Some("b/3"), 2)
            .await
            .unwrap()
            .is_empty()
    );
    // An `after` before the prefix starts at the prefix.
    assert_eq!(
        keys(store.scan_page("b/", Some("a/9"), 5).await.unwrap()),
        ["b/1", "b/2", "b/3"]
    );
}
