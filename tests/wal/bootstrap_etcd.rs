//! PersistNames on etcd (`ETCD_ENDPOINTS`; fails when unset): 96 names do not fit one transaction under etcd's
//! 128-operation limit (a compare and a put per name), so they go in the fewest transactions that fit, and a re-run
//! from stale state writes nothing; a 100,000-topic pool bootstraps through the procedure engine with its records
//! on etcd too. Topics come from the fake admin; each test uses its own topic prefix.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use procedures::{
    Context, LocalManager, ManagerConfig, Procedure, ProcedureId, ProcedureManager,
    ProcedureWithId, Status,
};
use remote_wal::key::topic_name::{
    TopicNameValue, get_topic_value, list_persisted_topics, topic_name_key,
};
use remote_wal::kv::NamespacedKvBackend;
use remote_wal::kv::conformance::{etcd_from_env, unique_prefix};
use remote_wal::kv::{KvBackendRef, KvStateStore, RangeRequest};
use remote_wal::wal::kafka::bootstrap::{
    BootstrapStep, TopicBootstrapData, TopicBootstrapProcedure, bootstrap_procedure_id,
};
use remote_wal::wal::kafka::testing::FakeTopicAdmin;
use remote_wal::wal::kafka::{ReadyPoll, TopicPoolSpec};

#[tokio::test]
async fn ninety_six_names_persist_on_etcd_and_a_rerun_writes_nothing() {
    let kv: KvBackendRef = Arc::new(etcd_from_env().await);
    assert!(
        kv.max_txn_ops() < 2 * 96,
        "the case needs more than one transaction"
    );
    let prefix = String::from_utf8(unique_prefix("pool"))
        .unwrap()
        .trim_end_matches('/')
        .replace('-', "_");
    let mut spec = TopicPoolSpec::new(&prefix, 96);
    spec.ready_poll = ReadyPoll {
        init: Duration::from_millis(1),
        max: Duration::from_millis(5),
        factor: 2.0,
        deadline: Duration::from_secs(5),
    };
    let admin = Arc::new(FakeTopicAdmin::new());
    let ctx = Context::new(ProcedureId::new("etcd"));

    let mut p = TopicBootstrapProcedure::new(spec.clone(), kv.clone(), admin.clone()).unwrap();
    let output = loop {
        match p.execute(&ctx).await.unwrap() {
            Status::Done { output, .. } => break output,
            Status::Executing { .. } => {}
            other => panic!("unexpected status {other:?}"),
        }
    };
    assert_eq!(
        output,
        Some(serde_json::json!({"topics": 96, "num_partitions": 1}))
    );
    let mut wanted = spec.topic_names();
    wanted.sort();
    let pool = format!("{prefix}_");
    assert_eq!(
        list_persisted_topics(kv.as_ref(), &pool).await.unwrap(),
        wanted
    );

    // PersistNames again from a state that predates the commit: the conditional txn is refused, nothing written.
    // Meanwhile GreptimeDB advanced one topic's pruned entry id: the re-run must keep it.
    kv.put(remote_wal::kv::PutRequest {
        key: topic_name_key(&spec.topic_name(0)),
        value: TopicNameValue {
            pruned_entry_id: 7,
            topic_id: None,
        }
        .encode(),
        prev_kv: false,
    })
    .await
    .unwrap();
    let mut rerun = TopicBootstrapProcedure::from_data(
        TopicBootstrapData {
            step: BootstrapStep::PersistNames,
            spec: spec.clone(),
            persisted_below: 0,
        },
        kv.clone(),
        admin,
    );
    // Both chunks (of at most 64 names) in one execution, writing nothing, which finishes the procedure.
    let mut executions = 1;
    while !matches!(rerun.execute(&ctx).await.unwrap(), Status::Done { .. }) {
        executions += 1;
    }
    assert_eq!(
        executions, 1,
        "96 names are two chunks of at most 64, in the one execution that finishes"
    );
    assert_eq!(rerun.data().persisted_below, 96);
    assert_eq!(
        get_topic_value(kv.as_ref(), &spec.topic_name(0))
            .await
            .unwrap(),
        Some(TopicNameValue {
            pruned_entry_id: 7,
            topic_id: None,
        })
    );
    assert_eq!(
        list_persisted_topics(kv.as_ref(), &pool).await.unwrap(),
        wanted
    );

    // Leave etcd as found.
    let range = RangeRequest::prefix(topic_name_key(&pool));
    kv.delete_range(&range.key, &range.range_end, false)
        .await
        .unwrap();
}

/// A 100,000-topic pool (the largest `num_topics` allows) bootstraps on etcd through the engine, the records and the
/// names in one etcd under a unique key prefix: every record write stays under etcd's request limit (the record is
/// constant-size), every name is persisted once, and the record holds no topic name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100000_topic_pool_bootstraps_on_etcd() {
    const TOPICS: usize = 100_000;
    let etcd: KvBackendRef = Arc::new(etcd_from_env().await);
    let namespace = unique_prefix("pool100k");
    let kv: KvBackendRef = Arc::new(NamespacedKvBackend::new(etcd.clone(), namespace.clone()));
    let mut spec = TopicPoolSpec::new("big", TOPICS);
    spec.ready_poll.init = Duration::from_millis(1);
    let admin = Arc::new(FakeTopicAdmin::new());
    admin.set_create_batch_size(1000);

    let started = Instant::now();
    let manager = LocalManager::new(
        Arc::new(KvStateStore::new(kv.clone())),
        ManagerConfig::default(),
    );
    manager
        .register_loader(
            TopicBootstrapProcedure::TYPE_NAME,
            TopicBootstrapProcedure::loader(kv.clone(), admin.clone()),
        )
        .unwrap();
    manager.start().await.unwrap();
    let id = bootstrap_procedure_id("big", 0);
    let procedure = TopicBootstrapProcedure::new(spec.clone(), kv.clone(), admin.clone()).unwrap();
    let output = manager
        .submit(ProcedureWithId::new(id.clone(), Box::new(procedure)))
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    let took = started.elapsed();
    let record = kv
        .get(format!("__procedure__/proc/{}", id.as_str()).as_bytes())
        .await
        .unwrap()
        .expect("the record is retained");
    manager.stop().await.unwrap();
    let _ = writeln!(
        std::io::stderr(),
        "bootstrapped {TOPICS} topics on etcd in {took:?}; record {} bytes",
        record.value.len()
    );
    assert_eq!(
        output,
        Some(serde_json::json!({"topics": TOPICS, "num_partitions": 1}))
    );
    assert_eq!(admin.partitions().len(), TOPICS);
    let persisted = list_persisted_topics(kv.as_ref(), "big_").await.unwrap();
    assert_eq!(persisted.len(), TOPICS);
    // The procedure's own state is constant-size; the record around it adds the engine's bounded event history
    // (the last 100 events), so the whole stays far below etcd's request limit at any pool size.
    let envelope: serde_json::Value = serde_json::from_slice(&record.value).unwrap();
    let data_len = serde_json::to_vec(&envelope["data"]).unwrap().len();
    assert!(data_len < 4096, "{data_len}");
    assert!(record.value.len() < 64 * 1024, "{}", record.value.len());
    let text = String::from_utf8_lossy(&record.value);
    assert!(!text.contains("big_0"), "the record names no topic: {text}");

    // Leave etcd as found.
    let end = remote_wal::kv::prefix_end(&namespace);
    etcd.delete_range(&namespace, &end, false).await.unwrap();
}
