//! PersistNames on etcd (`ETCD_ENDPOINTS`; fails when unset): 96 names do not fit one transaction under etcd's
//! 128-operation limit (a compare and a put per name), so they go in the fewest transactions that fit, and a re-run
//! from stale state writes nothing. Topics come from the fake admin; each test uses its own topic prefix.

use std::sync::Arc;
use std::time::Duration;

use procedures::{Context, Procedure, ProcedureId, Status};
use remote_wal::kv::conformance::{etcd_from_env, unique_prefix};
use remote_wal::kv::{KvBackendRef, RangeRequest};
use remote_wal::wal::kafka::bootstrap::{
    BootstrapStep, TopicBootstrapData, TopicBootstrapProcedure,
};
use remote_wal::wal::kafka::testing::FakeTopicAdmin;
use remote_wal::wal::kafka::topic_key::{
    TopicNameValue, get_topic_value, list_persisted_topics, topic_name_key,
};
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
            Status::Done { output } => break output,
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
        value: TopicNameValue { pruned_entry_id: 7 }.encode(),
        prev_kv: false,
    })
    .await
    .unwrap();
    let mut rerun = TopicBootstrapProcedure::from_data(
        TopicBootstrapData {
            step: BootstrapStep::PersistNames,
            spec: spec.clone(),
            persisted: Default::default(),
            created: Default::default(),
        },
        kv.clone(),
        admin,
    );
    assert!(matches!(
        rerun.execute(&ctx).await.unwrap(),
        Status::Done { .. }
    ));
    assert_eq!(
        get_topic_value(kv.as_ref(), &spec.topic_name(0))
            .await
            .unwrap(),
        Some(TopicNameValue { pruned_entry_id: 7 })
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
