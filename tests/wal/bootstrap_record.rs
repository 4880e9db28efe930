//! The bootstrap's persisted record: constant-size whatever the pool's size (no topic name in it), and records of
//! the format-1 release (which listed the names) still decode and resume.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use procedures::{Context, Procedure, ProcedureId, Status};
use remote_wal::key::topic_name::list_persisted_topics;
use remote_wal::kv::{KvBackendRef, MemoryKvBackend};
use remote_wal::wal::kafka::bootstrap::{
    BootstrapStep, TopicBootstrapData, TopicBootstrapProcedure,
};
use remote_wal::wal::kafka::testing::FakeTopicAdmin;
use remote_wal::wal::kafka::{ReadyPoll, TopicPoolSpec};
use serde_json::Value;

fn ctx() -> Context {
    Context::new(ProcedureId::new("record"))
}

fn fast_poll() -> ReadyPoll {
    ReadyPoll {
        init: Duration::from_millis(1),
        max: Duration::from_millis(5),
        factor: 2.0,
        deadline: Duration::from_secs(5),
    }
}

/// Runs the procedure step by step to the end; every dumped state (what the engine persists after a step).
async fn run_dumping(p: &mut TopicBootstrapProcedure) -> Vec<Value> {
    let mut dumps = vec![p.dump().unwrap()];
    loop {
        let status = p.execute(&ctx()).await.unwrap();
        dumps.push(p.dump().unwrap());
        match status {
            // Only LoadTopics (a read) asks for no record.
            Status::Executing { persist, .. } => {
                assert_eq!(
                    persist,
                    p.data().step != BootstrapStep::CreateMissing,
                    "what persists"
                )
            }
            Status::Done { .. } => return dumps,
            other => panic!("unexpected status {other:?}"),
        }
    }
}

#[tokio::test]
async fn the_record_stays_under_4_kib_at_100000_topics_and_names_no_topic() {
    const TOPICS: usize = 100_000;
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    admin.set_create_batch_size(1000);
    let mut spec = TopicPoolSpec::new("wal_topic", TOPICS);
    spec.ready_poll = fast_poll();
    let mut p = TopicBootstrapProcedure::new(spec, kv.clone(), admin.clone()).unwrap();
    let dumps = run_dumping(&mut p).await;
    // The submission, LoadTopics, CreateMissing, PersistNames (one chunk: the memory store has no transaction
    // limit) ending done.
    assert!(dumps.len() >= 4, "{}", dumps.len());
    for dump in &dumps {
        let bytes = serde_json::to_vec(dump).unwrap();
        assert!(bytes.len() < 4096, "{} bytes: {dump}", bytes.len());
        let text = String::from_utf8(bytes).unwrap();
        assert!(!text.contains("wal_topic_"), "no topic name: {text}");
    }
    assert_eq!(dumps.last().unwrap()["persisted_below"], TOPICS);
    assert_eq!(
        list_persisted_topics(kv.as_ref(), "wal_topic_")
            .await
            .unwrap()
            .len(),
        TOPICS
    );
    assert_eq!(admin.partitions().len(), TOPICS);
}

#[tokio::test]
async fn the_record_is_the_same_size_at_10_and_at_100000_topics() {
    let size = |n: usize| {
        let data = TopicBootstrapData {
            step: BootstrapStep::PersistNames,
            spec: TopicPoolSpec::new("p", n),
            persisted_below: n / 2,
        };
        serde_json::to_vec(&data).unwrap().len()
    };
    // Only the digits of the two numbers differ.
    assert_eq!(size(100_000) - size(10), 2 * ("100000".len() - "10".len()));
}

/// The record a format-1 release wrote at `step` of a 3-topic pool, its lists filled as that release did.
fn format1_record(step: &str, persisted: &[&str], created: &[&str]) -> Value {
    serde_json::json!({
        "created": created,
        "persisted": persisted,
        "spec": {
            "max_concurrent_creates": 1,
            "num_partitions": 1,
            "num_topics": 3,
            "ready_poll": {"deadline": "5s", "factor": 2.0, "init": "1ms", "max": "5ms"},
            "replication_factor": 1,
            "topic_name_prefix": "old"
        },
        "step": step
    })
}

#[test]
fn format1_records_decode_to_their_step_and_spec() {
    for (step, want) in [
        ("load_topics", BootstrapStep::LoadTopics),
        ("create_missing", BootstrapStep::CreateMissing),
        ("persist_names", BootstrapStep::PersistNames),
    ] {
        let data = TopicBootstrapData::decode(format1_record(
            step,
            &["old_0"],
            &["old_0", "old_1", "old_2"],
        ))
        .unwrap();
        assert_eq!(data.step, want);
        assert_eq!(data.spec.topic_name_prefix, "old");
        assert_eq!(data.spec.num_topics, 3);
        assert_eq!(data.spec.ready_poll, fast_poll());
        assert_eq!(
            data.persisted_below, 0,
            "PersistNames restarts from the first name"
        );
        // Re-encoded in this release's shape: no list.
        let again = serde_json::to_value(&data).unwrap();
        assert!(again.get("persisted").is_none() && again.get("created").is_none());
    }
    // A damaged record is still an error.
    let mut bad = format1_record("persist_names", &[], &[]);
    bad["persisted"] = serde_json::json!("not a list");
    assert!(TopicBootstrapData::decode(bad).is_err());
}

/// The format-1 fixture killed after its PersistNames record (`tests/fixtures/format1/`) resumes through the loader
/// and persists the pool, keeping a name already persisted with its `pruned_entry_id`.
#[tokio::test]
async fn a_format1_record_at_persist_names_resumes_through_the_loader() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/format1/topic_bootstrap_step2_running_persist_names.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let record_text = fixture["kv"]
        .as_array()
        .unwrap()
        .iter()
        .find(|pair| {
            pair["key"]
                .as_str()
                .unwrap()
                .starts_with("__procedure__/proc/")
        })
        .expect("the fixture holds the bootstrap's record")["value"]
        .as_str()
        .unwrap()
        .to_string();
    let record: Value = serde_json::from_str(&record_text).unwrap();
    let data = record["data"].clone();
    assert!(data["created"].is_array(), "a format-1 record: {data}");

    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    let created: Vec<String> = data["created"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    for t in &created {
        admin.create_out_of_band(t, 1);
    }
    // One name made it to the store before the kill, and GreptimeDB advanced it since.
    kv.put(remote_wal::kv::PutRequest {
        key: remote_wal::key::topic_name::topic_name_key(&created[0]),
        value: br#"{"pruned_entry_id":9}"#.to_vec(),
        prev_kv: false,
    })
    .await
    .unwrap();
    let loader = TopicBootstrapProcedure::loader(kv.clone(), admin.clone());
    let mut loaded = loader(data).unwrap();
    let dumped = loaded.dump().unwrap();
    assert_eq!(dumped["step"], "persist_names");
    assert!(dumped.get("created").is_none(), "{dumped}");
    let output = loop {
        match loaded.execute(&ctx()).await.unwrap() {
            Status::Done { output, .. } => break output,
            Status::Executing { .. } => {}
            other => panic!("unexpected status {other:?}"),
        }
    };
    assert_eq!(output.unwrap()["topics"], created.len());
    let mut wanted = created.clone();
    wanted.sort();
    assert_eq!(
        list_persisted_topics(kv.as_ref(), "").await.unwrap(),
        wanted
    );
    let kept = kv
        .get(&remote_wal::key::topic_name::topic_name_key(&created[0]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept.value, br#"{"pruned_entry_id":9}"#);
    assert_eq!(admin.total_create_calls(), 0, "nothing is created again");
}
