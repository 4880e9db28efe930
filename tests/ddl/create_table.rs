//! `DdlManager::create_table` end to end on a `LocalManager`: concurrency, duplicates, bad input, retries.

use crate::support::ddl as support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use procedures::{LocalManager, ManagerConfig, MemoryStateStore, ProcedureManager, RetryPolicy};
use remote_wal::datanode::WalProviderKind;
use remote_wal::ddl::{CreateTableTask, DdlManager, MemoryDatanodeManager, TableName};
use remote_wal::kv::{KvBackendRef, MemoryKvBackend};

const DATANODES: [u64; 3] = [1, 2, 3];

struct Setup {
    ddl: Arc<DdlManager>,
    kv: KvBackendRef,
    datanodes: Arc<MemoryDatanodeManager>,
    manager: Arc<LocalManager>,
}

async fn setup() -> Setup {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let datanodes = Arc::new(MemoryDatanodeManager::new());
    let quick = RetryPolicy {
        max_retries: 5,
        initial_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
        factor: 2.0,
    };
    let config = ManagerConfig {
        step_retry: quick.clone(),
        store_retry: quick,
        ..ManagerConfig::default()
    };
    let manager = Arc::new(LocalManager::new(Arc::new(MemoryStateStore::new()), config));
    let context = support::context(
        kv.clone(),
        DATANODES.to_vec(),
        Arc::new(support::FakeKafkaPool::new(8)),
        datanodes.clone(),
    );
    let ddl = Arc::new(DdlManager::new(manager.clone(), context));
    ddl.register_loaders().unwrap();
    manager.start().await.unwrap();
    Setup {
        ddl,
        kv,
        datanodes,
        manager,
    }
}

fn task(table: &str, n: u32) -> CreateTableTask {
    CreateTableTask::new(TableName::new("greptime", "public", table), n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_distinct_tables_in_parallel_get_distinct_ids() {
    let s = setup().await;
    let handles: Vec<_> = (0..32)
        .map(|i| {
            let ddl = s.ddl.clone();
            tokio::spawn(async move { ddl.create_table(task(&format!("t{i}"), 2)).await })
        })
        .collect();
    let mut ids = BTreeSet::new();
    for h in handles {
        ids.insert(h.await.unwrap().unwrap());
    }
    assert_eq!(ids.len(), 32);
    let metadata = remote_wal::ddl::TableMetadataManager::new(s.kv.clone());
    for i in 0..32 {
        let id = metadata
            .table_id(&TableName::new("greptime", "public", format!("t{i}")))
            .await
            .unwrap()
            .unwrap();
        assert!(ids.contains(&id));
        assert_eq!(
            metadata.table_info(id).await.unwrap().unwrap().name,
            format!("t{i}")
        );
    }
    assert_eq!(s.datanodes.creations().len(), 64);
    assert!(s.datanodes.creations().values().all(|&n| n == 1));
    let open = support::open_all(&s.kv, &DATANODES, WalProviderKind::Kafka).await;
    assert_eq!(
        open.values()
            .map(|(r, e)| {
                assert!(e.is_empty());
                r.len()
            })
            .sum::<usize>(),
        64
    );
    s.manager.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_creates_of_one_name_one_wins_the_others_see_it_exists() {
    let s = setup().await;
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let ddl = s.ddl.clone();
            tokio::spawn(async move { ddl.create_table(task("cpu", 3)).await })
        })
        .collect();
    let mut won = Vec::new();
    let mut lost = Vec::new();
    for h in handles {
        match h.await.unwrap() {
            Ok(id) => won.push(id),
            Err(e) => lost.push(e.to_string()),
        }
    }
    assert_eq!(won.len(), 1, "winners {won:?}, errors {lost:?}");
    assert_eq!(lost.len(), 7);
    for e in &lost {
        assert!(
            e.contains("greptime.public.cpu") && e.contains("already exists"),
            "{e}"
        );
    }
    // Only the winner's regions exist.
    assert_eq!(s.datanodes.creations().len(), 3);
    assert!(
        s.datanodes
            .creations()
            .keys()
            .all(|r| (r >> 32) as u32 == won[0])
    );

    // With if_not_exists, every caller gets the existing id.
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let ddl = s.ddl.clone();
            let mut t = task("cpu", 3);
            t.if_not_exists = true;
            tokio::spawn(async move { ddl.create_table(t).await })
        })
        .collect();
    for h in handles {
        assert_eq!(h.await.unwrap().unwrap(), won[0]);
    }
    assert_eq!(s.datanodes.creations().len(), 3);
    s.manager.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_if_not_exists_creates_of_one_name_all_get_one_id() {
    let s = setup().await;
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let ddl = s.ddl.clone();
            let mut t = task("mem", 2);
            t.if_not_exists = true;
            tokio::spawn(async move { ddl.create_table(t).await })
        })
        .collect();
    let ids: BTreeSet<u32> = futures::future::join_all(handles)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .collect();
    assert_eq!(ids.len(), 1);
    assert_eq!(s.datanodes.creations().len(), 2);
    s.manager.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_fails_naming_the_culprit_and_writes_nothing() {
    let s = setup().await;
    let err = s
        .ddl
        .create_table(task("no space", 1))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("'no space'"), "{err}");
    let err = s
        .ddl
        .create_table(task("ok", 0))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("greptime.public.ok") && err.contains("num_regions = 0"),
        "{err}"
    );
    assert!(support::metadata_snapshot(&s.kv).await.is_empty());
    assert_eq!(s.datanodes.calls(), 0);
    s.manager.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unavailable_datanode_is_retried_until_it_answers() {
    let s = setup().await;
    s.datanodes.fail_next(2, 3);
    let id = s.ddl.create_table(task("cpu", 3)).await.unwrap();
    assert_eq!(s.datanodes.creations().len(), 3);
    assert!(
        s.datanodes
            .creations()
            .keys()
            .all(|r| (r >> 32) as u32 == id)
    );
    s.manager.stop().await.unwrap();
}
