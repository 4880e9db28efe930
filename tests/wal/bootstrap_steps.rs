//! Each step of the topic bootstrap procedure against a mocked topic admin (mockall) and kv store, plus whole runs
//! against the fake admin: which topics are created, what is persisted, and how errors surface.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use mockall::{Sequence, mock};
use procedures::{Context, Procedure, ProcedureId, Status};
use remote_wal::key::topic_name::TopicId;
use remote_wal::key::topic_name::{
    TopicNameValue, get_topic_value, list_persisted_topics, topic_name_key,
};
use remote_wal::kv::{
    CompareAndPutRequest, CompareAndPutResponse, KeyValue, KvBackend, KvBackendRef,
    MemoryKvBackend, PutRequest, RangeRequest, RangeResponse, Txn, TxnOpResponse, TxnResponse,
};
use remote_wal::wal::error::Result;
use remote_wal::wal::kafka::admin::{CreateTopicOutcome, TopicAdmin, TopicAdminRef};
use remote_wal::wal::kafka::bootstrap::{
    BootstrapStep, CHUNKS_PER_STEP, TopicBootstrapData, TopicBootstrapProcedure,
    bootstrap_procedure_id, pool_lock_key,
};
use remote_wal::wal::kafka::testing::FakeTopicAdmin;
use remote_wal::wal::kafka::{ReadyPoll, TopicPoolSpec};

mock! {
    pub Admin {}
    #[async_trait]
    impl TopicAdmin for Admin {
        fn endpoints(&self) -> Vec<String>;
        async fn list_topics(&self) -> Result<BTreeMap<String, usize>>;
        async fn create_topic(&self, name: &str, num_partitions: i32, replication_factor: i16)
            -> Result<CreateTopicOutcome>;
    }
}

mock! {
    pub Kv {}
    #[async_trait]
    impl KvBackend for Kv {
        fn name(&self) -> String;
        fn max_txn_ops(&self) -> usize;
        fn max_request_bytes(&self) -> usize;
        async fn get(&self, key: &[u8]) -> remote_wal::kv::Result<Option<KeyValue>>;
        async fn batch_get(&self, keys: &[Vec<u8>]) -> remote_wal::kv::Result<Vec<KeyValue>>;
        async fn range(&self, req: RangeRequest) -> remote_wal::kv::Result<RangeResponse>;
        async fn put(&self, req: PutRequest) -> remote_wal::kv::Result<Option<KeyValue>>;
        async fn batch_put(&self, kvs: Vec<KeyValue>, prev_kv: bool) -> remote_wal::kv::Result<Vec<KeyValue>>;
        async fn compare_and_put(&self, req: CompareAndPutRequest) -> remote_wal::kv::Result<CompareAndPutResponse>;
        async fn delete_range(&self, key: &[u8], range_end: &[u8], prev_kv: bool) -> remote_wal::kv::Result<(u64, Vec<KeyValue>)>;
        async fn batch_delete(&self, keys: &[Vec<u8>], prev_kv: bool) -> remote_wal::kv::Result<Vec<KeyValue>>;
        async fn txn(&self, txn: Txn) -> remote_wal::kv::Result<TxnResponse>;
    }
}

impl std::fmt::Debug for MockAdmin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MockAdmin")
    }
}

impl std::fmt::Debug for MockKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MockKv")
    }
}

fn spec(prefix: &str, n: usize) -> TopicPoolSpec {
    let mut spec = TopicPoolSpec::new(prefix, n);
    spec.max_concurrent_creates = 4;
    spec.ready_poll = ReadyPoll {
        init: Duration::from_millis(1),
        max: Duration::from_millis(5),
        factor: 2.0,
        deadline: Duration::from_millis(100),
    };
    spec
}

fn ctx() -> Context {
    Context::new(ProcedureId::new("test"))
}

fn names(prefix: &str, range: std::ops::Range<usize>) -> BTreeSet<String> {
    range.map(|i| format!("{prefix}_{i}")).collect()
}

/// A bootstrap resumed at `step`, with the watermark at 0; it reads the persisted names from `kv`.
fn at_step(
    step: BootstrapStep,
    spec: TopicPoolSpec,
    kv: KvBackendRef,
    admin: TopicAdminRef,
) -> TopicBootstrapProcedure {
    TopicBootstrapProcedure::from_data(
        TopicBootstrapData {
            step,
            spec,
            persisted_below: 0,
        },
        kv,
        admin,
    )
}

/// A range answer holding a persisted key (value 0) per topic of `topics`, in key order.
fn persisted_range(topics: &[&str]) -> RangeResponse {
    let mut kvs: Vec<KeyValue> = topics
        .iter()
        .map(|t| KeyValue {
            key: topic_name_key(t),
            value: TopicNameValue::default().encode(),
        })
        .collect();
    kvs.sort_by(|a, b| a.key.cmp(&b.key));
    RangeResponse { kvs, more: false }
}

async fn persist(kv: &dyn KvBackend, topic: &str, pruned: u64) {
    kv.put(PutRequest {
        key: topic_name_key(topic),
        value: TopicNameValue {
            pruned_entry_id: pruned,
            topic_id: None,
        }
        .encode(),
        prev_kv: false,
    })
    .await
    .unwrap();
}

/// Runs every step until done; the output.
async fn run_to_done(
    p: &mut TopicBootstrapProcedure,
) -> procedures::Result<Option<serde_json::Value>> {
    loop {
        match p.execute(&ctx()).await? {
            Status::Executing { persist, .. } => {
                // Only LoadTopics (a read) asks for no record.
                assert_eq!(
                    persist,
                    p.data().step != BootstrapStep::CreateMissing,
                    "what persists"
                )
            }
            Status::Done { output, .. } => return Ok(output),
            other => panic!("unexpected status {other:?}"),
        }
    }
}

fn listed(topics: &BTreeSet<String>, partitions: usize) -> BTreeMap<String, usize> {
    topics.iter().map(|t| (t.clone(), partitions)).collect()
}

#[tokio::test]
async fn load_topics_reads_only_this_pools_names() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    for t in [
        "p_0", "p_1", "p_7", "p_01", "p_x", "p_x_1", "other_0", "pp_0",
    ] {
        persist(kv.as_ref(), t, 0).await;
    }
    let admin = Arc::new(MockAdmin::new()); // no calls expected
    let mut p = TopicBootstrapProcedure::new(spec("p", 4), kv, admin).unwrap();
    let status = p.execute(&ctx()).await.unwrap();
    // A read only: nothing is recorded after it.
    assert!(matches!(status, Status::Executing { persist: false, .. }));
    assert_eq!(p.data().step, BootstrapStep::CreateMissing);
    // p_7 is beyond num_topics (a shrunk pool) but is the pool's: kept, never deleted.
    assert_eq!(
        p.known_persisted(),
        Some(&["p_0", "p_1", "p_7"].map(String::from).into())
    );
    // The record names no topic.
    let record = p.dump().unwrap().to_string();
    assert!(!record.contains("p_0"), "{record}");
}

#[tokio::test]
async fn create_missing_creates_exactly_the_missing_topics() {
    let mut admin = MockAdmin::new();
    for t in ["p_1", "p_3"] {
        admin
            .expect_create_topic()
            .withf(move |name, partitions, rf| name == t && *partitions == 1 && *rf == 1)
            .times(1)
            .returning(|_, _, _| Ok(CreateTopicOutcome::Created));
    }
    // The step's only read lists the persisted topics; the creates' acknowledgements vouch for the others.
    admin
        .expect_list_topics()
        .times(1)
        .returning(|| Ok(listed(&["p_0", "p_2"].map(String::from).into(), 1)));
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    for t in ["p_0", "p_2"] {
        persist(kv.as_ref(), t, 0).await;
    }
    let mut p = at_step(
        BootstrapStep::CreateMissing,
        spec("p", 4),
        kv,
        Arc::new(admin),
    );
    let status = p.execute(&ctx()).await.unwrap();
    assert!(matches!(status, Status::Executing { persist: true, .. }));
    assert_eq!(p.data().step, BootstrapStep::PersistNames);
    // PersistNames starts after p_0, the only name persisted in a row from the first.
    assert_eq!(p.data().persisted_below, 1);
}

#[tokio::test]
async fn already_existed_counts_as_created() {
    let mut admin = MockAdmin::new();
    admin
        .expect_create_topic()
        .times(3)
        .returning(|_, _, _| Ok(CreateTopicOutcome::AlreadyExisted));
    // Not listed by the step's first read (created meanwhile by someone else), then listed.
    let mut seq = Sequence::new();
    admin
        .expect_list_topics()
        .times(1)
        .in_sequence(&mut seq)
        .returning(|| Ok(BTreeMap::new()));
    admin
        .expect_list_topics()
        .in_sequence(&mut seq)
        .returning(|| Ok(listed(&names("p", 0..3), 1)));
    let mut p = at_step(
        BootstrapStep::CreateMissing,
        spec("p", 3),
        Arc::new(MemoryKvBackend::new()),
        Arc::new(admin),
    );
    p.execute(&ctx()).await.unwrap();
    assert_eq!(p.data().step, BootstrapStep::PersistNames);
}

#[tokio::test]
async fn a_wrong_partition_count_fails_naming_the_topic() {
    let mut admin = MockAdmin::new();
    admin
        .expect_create_topic()
        .returning(|_, _, _| Ok(CreateTopicOutcome::Created));
    admin.expect_list_topics().times(1).returning(|| {
        let mut l = listed(&names("p", 0..3), 1);
        l.insert("p_1".to_string(), 3);
        Ok(l)
    });
    let mut p = at_step(
        BootstrapStep::CreateMissing,
        spec("p", 3),
        Arc::new(MemoryKvBackend::new()),
        Arc::new(admin),
    );
    let err = p.execute(&ctx()).await.unwrap_err();
    assert!(!err.is_retryable());
    let text = err.to_string();
    assert!(
        text.contains("'p_1'") && text.contains("3 partitions"),
        "{text}"
    );
    assert_eq!(p.data().step, BootstrapStep::CreateMissing);
}

#[tokio::test]
async fn admin_errors_keep_whether_they_are_retryable() {
    for retryable in [true, false] {
        let mut admin = MockAdmin::new();
        admin.expect_create_topic().returning(move |name, _, _| {
            let source = if retryable {
                procedures::Error::retry_later(format!("broker timed out creating {name}"))
            } else {
                procedures::Error::external(format!("policy violation creating {name}"))
            };
            Err(remote_wal::wal::Error::from(source))
        });
        admin.expect_list_topics().returning(|| Ok(BTreeMap::new()));
        let mut p = at_step(
            BootstrapStep::CreateMissing,
            spec("p", 1),
            Arc::new(MemoryKvBackend::new()),
            Arc::new(admin),
        );
        let err = p.execute(&ctx()).await.unwrap_err();
        assert_eq!(err.is_retryable(), retryable, "{err}");
        assert!(err.to_string().contains("p_0"), "{err}");
    }
}

#[tokio::test]
async fn create_missing_trusts_acknowledged_creations_without_waiting_for_a_listing() {
    let mut admin = MockAdmin::new();
    admin
        .expect_create_topic()
        .times(2)
        .returning(|_, _, _| Ok(CreateTopicOutcome::Created));
    // The step's first read, and no other: the acknowledged creations are not polled for, although no broker
    // ever lists them.
    admin
        .expect_list_topics()
        .times(1)
        .returning(|| Ok(BTreeMap::new()));
    let mut p = at_step(
        BootstrapStep::CreateMissing,
        spec("p", 2),
        Arc::new(MemoryKvBackend::new()),
        Arc::new(admin),
    );
    p.execute(&ctx()).await.unwrap();
    assert_eq!(p.data().step, BootstrapStep::PersistNames);
}

#[tokio::test]
async fn a_persisted_topic_a_lagging_broker_does_not_list_is_not_recreated_or_reported() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    let spec = spec("behind", 3);
    let mut p = TopicBootstrapProcedure::new(spec.clone(), kv.clone(), admin.clone()).unwrap();
    run_to_done(&mut p).await.unwrap();

    // The first reads of the next run come from a broker that has applied nothing yet: the persisted topics are
    // read again until it lists them, and none is created again or reported lost.
    admin.stale_metadata_reads(3);
    let mut p = TopicBootstrapProcedure::new(spec, kv, admin.clone()).unwrap();
    let output = run_to_done(&mut p).await.unwrap().expect("an output");
    assert!(output.get("recreated").is_none(), "{output}");
    assert!(
        admin.created_counts().values().all(|&n| n == 1),
        "{:?}",
        admin.created_counts()
    );
    assert_eq!(
        admin.total_create_calls(),
        3,
        "only the first run's creations"
    );
    assert_eq!(
        admin.metadata_reads(),
        1 + 4,
        "the first run's read, then four"
    );
}

/// The recorded topic id of `topic`.
async fn recorded_id(kv: &KvBackendRef, topic: &str) -> Option<TopicId> {
    let found = kv
        .get(&topic_name_key(topic))
        .await
        .unwrap()
        .expect("persisted");
    TopicNameValue::decode(&found.key, &found.value)
        .unwrap()
        .topic_id
}

#[tokio::test]
async fn a_persisted_topic_missing_from_the_cluster_fails_the_bootstrap_until_recreation_is_asked_for()
 {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    let mut spec = spec("lost", 3);
    spec.ready_poll.deadline = Duration::from_secs(3600); // not waited for
    let mut p = TopicBootstrapProcedure::new(spec.clone(), kv.clone(), admin.clone()).unwrap();
    run_to_done(&mut p).await.unwrap();
    // The first run created the topics, so no read had listed them: a second run records their ids.
    let mut p = TopicBootstrapProcedure::new(spec.clone(), kv.clone(), admin.clone()).unwrap();
    run_to_done(&mut p).await.unwrap();
    let old = recorded_id(&kv, "lost_1")
        .await
        .expect("recorded by the second run");
    assert_eq!(Some(old), admin.topics().get("lost_1").map(|t| t.id));
    admin.delete_out_of_band("lost_1");

    let mut p = TopicBootstrapProcedure::new(spec.clone(), kv.clone(), admin.clone()).unwrap();
    let err = run_to_done(&mut p).await.unwrap_err().to_string();
    assert!(
        err.contains(&format!(
            "topic 'lost_1' (id {old}) is gone from the brokers"
        )),
        "{err}"
    );
    assert!(err.contains("--recreate-missing"), "{err}");
    assert!(
        !admin.topics().contains_key("lost_1"),
        "not recreated unasked"
    );

    spec.recreate_missing = true;
    let mut p = TopicBootstrapProcedure::new(spec, kv.clone(), admin.clone()).unwrap();
    let output = run_to_done(&mut p).await.unwrap().expect("an output");
    assert_eq!(output["recreated"], 1, "{output}");
    let new = admin.topics()["lost_1"].id;
    assert_ne!(new, old);
    assert_eq!(recorded_id(&kv, "lost_1").await, Some(new));
}

#[tokio::test]
async fn a_topic_deleted_and_created_again_out_of_band_is_named_with_both_ids_and_its_regions() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    let spec = spec("again", 2);
    for _ in 0..2 {
        let mut p = TopicBootstrapProcedure::new(spec.clone(), kv.clone(), admin.clone()).unwrap();
        run_to_done(&mut p).await.unwrap();
    }
    // A region on the topic: its datanode record names it.
    kv.put(PutRequest {
        key: b"__dn_table/1/1024".to_vec(),
        value: serde_json::to_vec(&serde_json::json!({
            "table_id": 1024,
            "regions": [0],
            "region_wal_options": {"0": r#"{"wal.provider":"kafka","wal.kafka.topic":"again_0"}"#},
        }))
        .unwrap(),
        prev_kv: false,
    })
    .await
    .unwrap();
    let old = recorded_id(&kv, "again_0").await.expect("recorded");
    admin.delete_out_of_band("again_0");
    admin.create_out_of_band("again_0", 1);
    let new = admin.topics()["again_0"].id;

    let mut p = TopicBootstrapProcedure::new(spec.clone(), kv.clone(), admin.clone()).unwrap();
    let err = run_to_done(&mut p).await.unwrap_err().to_string();
    assert!(
        err.contains(&format!(
            "topic 'again_0' was deleted and created again (id {old}, now {new}), regions on it: {}",
            1024u64 << 32
        )),
        "{err}"
    );
    assert_eq!(
        recorded_id(&kv, "again_0").await,
        Some(old),
        "nothing recorded"
    );

    // Asked for, the new id is recorded and the topic's watermark starts again from 0.
    persist(kv.as_ref(), "again_0", 0).await;
    let mut spec = spec;
    spec.recreate_missing = true;
    let mut p = TopicBootstrapProcedure::new(spec, kv.clone(), admin.clone()).unwrap();
    run_to_done(&mut p).await.unwrap();
    assert_eq!(recorded_id(&kv, "again_0").await, Some(new));
}

#[tokio::test]
async fn persist_names_writes_every_missing_name_once_in_one_atomic_txn() {
    let mut kv = MockKv::new();
    kv.expect_max_txn_ops().return_const(128usize);
    kv.expect_max_request_bytes().return_const(usize::MAX);
    kv.expect_txn()
        .times(1)
        .withf(|txn| {
            let want: Vec<Vec<u8>> = ["p_1", "p_2"].iter().map(|t| topic_name_key(t)).collect();
            txn.compare
                == want
                    .iter()
                    .map(|k| remote_wal::kv::Compare::Absent(k.clone()))
                    .collect::<Vec<_>>()
                && txn.success
                    == want
                        .iter()
                        .map(|k| {
                            remote_wal::kv::TxnOp::Put(
                                k.clone(),
                                br#"{"pruned_entry_id":0}"#.to_vec(),
                            )
                        })
                        .collect::<Vec<_>>()
                && txn.failure.is_empty()
        })
        .returning(|txn| {
            Ok(TxnResponse {
                succeeded: true,
                responses: vec![TxnOpResponse::Put; txn.success.len()],
            })
        });
    // The step reads the pool's persisted names once (one page).
    kv.expect_range()
        .times(1)
        .returning(|_| Ok(persisted_range(&["p_0"])));
    // No put, batch_put or any other write is expected: a call would fail the test.
    let mut p = at_step(
        BootstrapStep::PersistNames,
        spec("p", 3),
        Arc::new(kv),
        Arc::new(MockAdmin::new()),
    );
    // The execution that writes the last chunk finishes.
    let status = p.execute(&ctx()).await.unwrap();
    assert_eq!(p.data().persisted_below, 3);
    match status {
        Status::Done { output, .. } => assert_eq!(
            output,
            Some(serde_json::json!({"topics": 3, "num_partitions": 1}))
        ),
        other => panic!("expected done, got {other:?}"),
    }
}

#[tokio::test]
async fn persist_names_chunks_only_as_the_backend_requires() {
    let mut kv = MockKv::new();
    kv.expect_max_txn_ops().return_const(4usize); // 2 names (compare + put each) per txn
    kv.expect_max_request_bytes().return_const(usize::MAX);
    kv.expect_txn()
        .times(18) // 35 names, 2 per txn
        .withf(|txn| txn.compare.len() == txn.success.len() && txn.success.len() <= 2)
        .returning(|txn| {
            Ok(TxnResponse {
                succeeded: true,
                responses: vec![TxnOpResponse::Put; txn.success.len()],
            })
        });
    kv.expect_range()
        .times(1)
        .returning(|_| Ok(persisted_range(&[])));
    let mut p = at_step(
        BootstrapStep::PersistNames,
        spec("p", 35),
        Arc::new(kv),
        Arc::new(MockAdmin::new()),
    );
    // Up to CHUNKS_PER_STEP (16) chunks per execution, the watermark moving past them; the execution that writes
    // the last chunks is done.
    assert_eq!(CHUNKS_PER_STEP, 16);
    let status = p.execute(&ctx()).await.unwrap();
    assert!(matches!(status, Status::Executing { persist: true, .. }));
    assert_eq!(p.data().persisted_below, 32);
    assert!(matches!(
        p.execute(&ctx()).await.unwrap(),
        Status::Done { .. }
    ));
    assert_eq!(p.data().persisted_below, 35);
    assert_eq!(p.known_persisted(), Some(&names("p", 0..35)));
}

#[tokio::test]
async fn persist_names_rerun_after_commit_writes_nothing_and_keeps_pruned_ids() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    for t in names("p", 0..3) {
        persist(kv.as_ref(), &t, 0).await;
    }
    persist(kv.as_ref(), "p_1", 7).await; // GreptimeDB advanced it meanwhile
    // The state predates the commit (a crash after the txn, before the step was recorded).
    let mut p = at_step(
        BootstrapStep::PersistNames,
        spec("p", 3),
        kv.clone(),
        Arc::new(MockAdmin::new()),
    );
    run_to_done(&mut p).await.unwrap();
    assert_eq!(
        get_topic_value(kv.as_ref(), "p_1").await.unwrap(),
        Some(TopicNameValue {
            pruned_entry_id: 7,
            topic_id: None,
        })
    );
    assert_eq!(
        list_persisted_topics(kv.as_ref(), "").await.unwrap(),
        ["p_0", "p_1", "p_2"]
    );
}

#[tokio::test]
async fn a_whole_run_creates_and_persists_the_pool_byte_for_byte() {
    let kv = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    let mut p = TopicBootstrapProcedure::new(spec("wal", 8), kv.clone(), admin.clone()).unwrap();
    run_to_done(&mut p).await.unwrap();
    assert_eq!(admin.partitions(), listed(&names("wal", 0..8), 1));
    let stored: Vec<(String, String)> = kv
        .dump()
        .into_iter()
        .map(|kv| {
            (
                String::from_utf8(kv.key).unwrap(),
                String::from_utf8(kv.value).unwrap(),
            )
        })
        .collect();
    let mut want: Vec<(String, String)> = (0..8)
        .map(|i| {
            (
                format!("__topic_name/kafka/wal_{i}"),
                r#"{"pruned_entry_id":0}"#.to_string(),
            )
        })
        .collect();
    want.sort();
    assert_eq!(stored, want);
}

#[tokio::test]
async fn growing_64_to_96_creates_only_the_32_new_topics() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    let mut p = TopicBootstrapProcedure::new(spec("g", 64), kv.clone(), admin.clone()).unwrap();
    run_to_done(&mut p).await.unwrap();
    assert_eq!(admin.total_create_calls(), 64);

    let mut p = TopicBootstrapProcedure::new(spec("g", 96), kv.clone(), admin.clone()).unwrap();
    run_to_done(&mut p).await.unwrap();
    let calls = admin.create_calls();
    assert_eq!(admin.total_create_calls(), 96);
    assert!(calls.values().all(|&c| c == 1), "{calls:?}");
    assert_eq!(admin.partitions(), listed(&names("g", 0..96), 1));
    let persisted: BTreeSet<String> = list_persisted_topics(kv.as_ref(), "")
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(persisted, names("g", 0..96));
}

#[tokio::test]
async fn shrinking_creates_nothing_and_deletes_nothing() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    let mut p = TopicBootstrapProcedure::new(spec("s", 16), kv.clone(), admin.clone()).unwrap();
    run_to_done(&mut p).await.unwrap();

    let mut p = TopicBootstrapProcedure::new(spec("s", 4), kv.clone(), admin.clone()).unwrap();
    run_to_done(&mut p).await.unwrap();
    assert_eq!(admin.total_create_calls(), 16);
    assert_eq!(admin.partitions(), listed(&names("s", 0..16), 1));
    let persisted: BTreeSet<String> = list_persisted_topics(kv.as_ref(), "")
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(persisted, names("s", 0..16));
}

#[tokio::test]
async fn a_topic_made_out_of_band_with_other_partitions_fails_the_run_naming_it() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    admin.create_out_of_band("o_2", 3);
    let mut p = TopicBootstrapProcedure::new(spec("o", 4), kv.clone(), admin.clone()).unwrap();
    let err = run_to_done(&mut p).await.unwrap_err().to_string();
    // Found by the step's metadata read, before anything is created.
    assert!(
        err.contains("Kafka topic 'o_2' has 3 partitions but the pool needs 1"),
        "{err}"
    );
    assert_eq!(admin.total_create_calls(), 0);
    assert!(
        list_persisted_topics(kv.as_ref(), "")
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn state_round_trips_through_the_loader() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin: TopicAdminRef = Arc::new(FakeTopicAdmin::new());
    let p = at_step(
        BootstrapStep::PersistNames,
        spec("r", 3),
        kv.clone(),
        admin.clone(),
    );
    let dumped = p.dump().unwrap();
    let loader = TopicBootstrapProcedure::loader(kv, admin);
    let loaded = loader(dumped.clone()).unwrap();
    assert_eq!(loaded.type_name(), "remote_wal::TopicBootstrap");
    assert_eq!(loaded.dump().unwrap(), dumped);
    assert!(loader(serde_json::json!({"step": "nope"})).is_err());
}

#[test]
fn one_pool_one_lock_and_one_procedure_id() {
    assert_eq!(
        bootstrap_procedure_id("greptimedb_wal_topic", 0).as_str(),
        "topic_bootstrap/greptimedb_wal_topic"
    );
    assert_eq!(
        bootstrap_procedure_id("greptimedb_wal_topic", 2).as_str(),
        "topic_bootstrap/greptimedb_wal_topic/attempt-2"
    );
    assert_eq!(
        pool_lock_key("x"),
        procedures::LockKey::exclusive("wal/kafka/topic_pool/x")
    );
}

/// Log lines at INFO and above written on this thread while the capture's guard lives.
#[derive(Clone, Default)]
struct InfoLogs(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for InfoLogs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn topics_that_already_exist_are_success_and_logged_at_debug_only() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    for t in names("again", 0..8) {
        admin.create_out_of_band(&t, 1);
    }
    let logs = InfoLogs::default();
    let subscriber = {
        let logs = logs.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || logs.clone())
            .finish()
    };
    let mut p = TopicBootstrapProcedure::new(spec("again", 8), kv.clone(), admin.clone()).unwrap();
    {
        let _guard = tracing::subscriber::set_default(subscriber);
        run_to_done(&mut p).await.unwrap();
    }
    // The step's metadata read found every topic: nothing is sent to be created, the pool is persisted whole.
    assert_eq!(admin.total_create_calls(), 0);
    assert!(admin.created_counts().is_empty());
    assert_eq!(
        list_persisted_topics(kv.as_ref(), "again_")
            .await
            .unwrap()
            .into_iter()
            .collect::<BTreeSet<_>>(),
        names("again", 0..8)
    );
    let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    assert!(
        !text.contains("WARN") && !text.contains("ERROR"),
        "no warning or error for success: {text}"
    );
    assert!(
        !text.to_lowercase().contains("already"),
        "'already exists' is not logged above debug: {text}"
    );
}

#[tokio::test]
async fn a_resume_on_a_complete_pool_costs_one_metadata_read_and_one_range_read() {
    // Every topic exists and every name is persisted: a crash after the last chunk, before the record said so.
    const TOPICS: usize = 4096;
    let admin = Arc::new(FakeTopicAdmin::new());
    for i in 0..TOPICS {
        admin.create_out_of_band(&format!("full_{i}"), 1);
    }
    // Each name persisted with its topic's id (as a bootstrap records it): nothing to fill in.
    let ids = admin.topics();
    let mut listing = RangeResponse {
        kvs: (0..TOPICS)
            .map(|i| format!("full_{i}"))
            .map(|t| KeyValue {
                key: topic_name_key(&t),
                value: TopicNameValue {
                    pruned_entry_id: 0,
                    topic_id: Some(ids[&t].id),
                }
                .encode(),
            })
            .collect(),
        more: false,
    };
    listing.kvs.sort_by(|a, b| a.key.cmp(&b.key));
    let mut kv = MockKv::new();
    kv.expect_max_txn_ops().return_const(128usize);
    kv.expect_max_request_bytes().return_const(usize::MAX);
    // One range read of the names (one answer holding all of them); no txn, put or any other call is expected:
    // one would fail the test.
    kv.expect_range()
        .times(1)
        .returning(move |_| Ok(listing.clone()));
    let mut p = at_step(
        BootstrapStep::CreateMissing,
        spec("full", TOPICS),
        Arc::new(kv),
        admin.clone(),
    );
    run_to_done(&mut p).await.unwrap();
    assert_eq!(admin.metadata_reads(), 1);
    assert_eq!(admin.total_create_calls(), 0);
    assert_eq!(p.data().persisted_below, TOPICS);
}
