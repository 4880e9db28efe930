//! Batched topic creation and the bootstrap's one metadata read, against the shared fake admin with a native
//! batch: the missing topics go out in batches of the admin's batch size, a resume with every topic existing costs
//! one metadata read and no create, a batch in which some topics fail reports them and leaves the others created,
//! and the crash matrix (a side-effect point after each batch, one topic failing in its batch) ends at 0 mismatches.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use procedures::testing::{
    CrashScenario, MatrixConfig, StoreDigest, run_crash_matrix, store_digest,
};
use procedures::{
    Context, Procedure, ProcedureId, ProcedureManager, ProcedureWithId, StateStore, Status,
};
use remote_wal::key::topic_name::list_persisted_topics;
use remote_wal::kv::{KvBackendRef, KvStateStore, MemoryKvBackend};
use remote_wal::wal::kafka::admin::{CreateTopicOutcome, TopicAdmin};
use remote_wal::wal::kafka::bootstrap::{
    BootstrapStep, TopicBootstrapData, TopicBootstrapProcedure, bootstrap_procedure_id,
};
use remote_wal::wal::kafka::testing::{FakeFault, FakeTopicAdmin};
use remote_wal::wal::kafka::{ReadyPoll, TopicPoolSpec};
use rskafka::client::error::ProtocolError;

fn spec(prefix: &str, n: usize) -> TopicPoolSpec {
    let mut spec = TopicPoolSpec::new(prefix, n);
    spec.max_concurrent_creates = 2;
    spec.ready_poll = ReadyPoll {
        init: Duration::from_millis(1),
        max: Duration::from_millis(5),
        factor: 2.0,
        deadline: Duration::from_secs(5),
    };
    spec
}

fn batching_admin(batch_size: usize) -> Arc<FakeTopicAdmin> {
    let admin = Arc::new(FakeTopicAdmin::new());
    admin.set_create_batch_size(batch_size);
    admin
}

async fn run_to_done(p: &mut TopicBootstrapProcedure) -> procedures::Result<()> {
    let ctx = Context::new(ProcedureId::new("test"));
    loop {
        match p.execute(&ctx).await? {
            Status::Executing { .. } => {}
            Status::Done { .. } => return Ok(()),
            other => panic!("unexpected status {other:?}"),
        }
    }
}

async fn persisted(kv: &KvBackendRef, prefix: &str) -> usize {
    list_persisted_topics(kv.as_ref(), &format!("{prefix}_"))
        .await
        .unwrap()
        .len()
}

#[tokio::test]
async fn the_fake_answers_a_batch_per_topic() {
    let admin = batching_admin(10);
    admin.create_out_of_band("b_1", 1);
    admin.create_out_of_band("b_2", 4);
    admin.fail_topic_once(
        "b_3",
        FakeFault::Server(ProtocolError::InvalidTopicException),
    );
    let names: Vec<String> = (0..5).map(|i| format!("b_{i}")).collect();
    let answers = admin
        .create_topics(&names, 1, 1, &Default::default())
        .await
        .unwrap();
    let by_topic: BTreeMap<_, _> = answers.into_iter().collect();
    assert_eq!(
        by_topic["b_0"].as_ref().unwrap(),
        &CreateTopicOutcome::Created
    );
    assert_eq!(
        by_topic["b_1"].as_ref().unwrap(),
        &CreateTopicOutcome::AlreadyExisted
    );
    let mismatch = by_topic["b_2"].as_ref().unwrap_err().to_string();
    assert!(
        mismatch.contains(
            "topic 'b_2' already exists with 4 partition(s), but 1 partition(s) are wanted"
        ),
        "{mismatch}"
    );
    let rejected = by_topic["b_3"].as_ref().unwrap_err();
    assert!(!rejected.is_retryable());
    let text = rejected.to_string();
    assert!(
        text.contains("'b_3'") && text.contains("INVALID_TOPIC_EXCEPTION"),
        "{text}"
    );
    assert_eq!(
        by_topic["b_4"].as_ref().unwrap(),
        &CreateTopicOutcome::Created
    );
    assert_eq!(admin.batch_calls(), 1);
    assert!(
        !admin.topics().contains_key("b_3"),
        "a failed topic is not created"
    );
}

#[tokio::test]
async fn missing_topics_go_out_in_batches_of_the_admins_batch_size() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = batching_admin(4);
    // Two topics exist already: the metadata read finds them and they are not sent.
    admin.create_out_of_band("m_0", 1);
    admin.create_out_of_band("m_7", 1);
    let mut p = TopicBootstrapProcedure::new(spec("m", 12), kv.clone(), admin.clone()).unwrap();
    run_to_done(&mut p).await.unwrap();

    // 10 missing topics in batches of at most 4: 3 requests, each topic sent once.
    assert_eq!(admin.batch_calls(), 3);
    assert_eq!(admin.total_create_calls(), 10);
    assert!(admin.create_calls().values().all(|&n| n == 1));
    assert!(!admin.create_calls().contains_key("m_0"));
    assert_eq!(admin.partitions().len(), 12);
    assert_eq!(persisted(&kv, "m").await, 12);
}

#[tokio::test]
async fn a_resume_with_every_topic_existing_costs_one_metadata_read_and_no_create() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = batching_admin(1000);
    let wanted = spec("r", 300);
    for t in wanted.topic_names() {
        admin.create_out_of_band(&t, 1);
    }
    // A crash before PersistNames: the procedure resumes at CreateMissing with nothing persisted.
    let mut p = TopicBootstrapProcedure::from_data(
        TopicBootstrapData {
            step: BootstrapStep::CreateMissing,
            spec: wanted,
            persisted_below: 0,
        },
        kv.clone(),
        admin.clone(),
    );
    run_to_done(&mut p).await.unwrap();
    assert_eq!(admin.metadata_reads(), 1);
    assert_eq!(admin.total_create_calls(), 0);
    assert_eq!(admin.batch_calls(), 0);
    assert_eq!(persisted(&kv, "r").await, 300);
}

#[tokio::test]
async fn a_batch_with_failing_topics_names_them_and_the_rerun_sends_only_those() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = batching_admin(8);
    admin.fail_topic_once("f_2", FakeFault::Server(ProtocolError::RequestTimedOut));
    admin.fail_topic_once("f_5", FakeFault::Server(ProtocolError::RequestTimedOut));
    let mut p = TopicBootstrapProcedure::new(spec("f", 8), kv.clone(), admin.clone()).unwrap();
    let err = run_to_done(&mut p).await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(err.to_string().contains("'f_2'"), "{err}");
    // The batch's other topics were created by the same request.
    assert_eq!(admin.partitions().len(), 6);
    assert_eq!(persisted(&kv, "f").await, 0);

    // The engine retries the step: only the two failed topics are missing, and only they are sent, in one batch
    // (a failed topic's answer never reached the cluster, so each topic is in the log once).
    run_to_done(&mut p).await.unwrap();
    assert_eq!(admin.batch_calls(), 2);
    let log = admin.create_log();
    assert_eq!(log.len(), 8, "{log:?}");
    assert_eq!(
        log[6..],
        [("f_2".to_string(), true), ("f_5".to_string(), true)]
    );
    assert_eq!(persisted(&kv, "f").await, 8);
}

/// The crash matrix of a 10-topic bootstrap with batches of 3 (4 batches, at most 2 in flight), in which topic
/// `wal_batch_4` fails once in its batch with a retryable error.
struct BatchScenario {
    spec: TopicPoolSpec,
}

struct Env {
    store: Arc<dyn StateStore>,
    kv: Arc<MemoryKvBackend>,
    admin: Arc<FakeTopicAdmin>,
}

#[derive(Debug, PartialEq)]
struct Outcome {
    store: StoreDigest,
    topics: BTreeMap<String, usize>,
    created: BTreeMap<String, usize>,
    names: Vec<String>,
}

#[async_trait]
impl CrashScenario for BatchScenario {
    type Env = Env;
    type Outcome = Outcome;

    async fn new_env(&self) -> Env {
        let kv = Arc::new(MemoryKvBackend::new());
        let admin = batching_admin(3);
        admin.fail_topic_once(
            "wal_batch_4",
            FakeFault::Server(ProtocolError::RequestTimedOut),
        );
        Env {
            store: Arc::new(KvStateStore::new(kv.clone())),
            kv,
            admin,
        }
    }

    fn state_store(&self, env: &Env) -> Arc<dyn StateStore> {
        env.store.clone()
    }

    fn register_loaders(
        &self,
        env: &Env,
        manager: &dyn ProcedureManager,
    ) -> procedures::Result<()> {
        manager.register_loader(
            TopicBootstrapProcedure::TYPE_NAME,
            TopicBootstrapProcedure::loader(env.kv.clone(), env.admin.clone()),
        )
    }

    fn procedures(&self, env: &Env) -> Vec<ProcedureWithId> {
        let procedure =
            TopicBootstrapProcedure::new(self.spec.clone(), env.kv.clone(), env.admin.clone())
                .expect("valid spec");
        vec![ProcedureWithId::new(
            bootstrap_procedure_id(&self.spec.topic_name_prefix, 0),
            Box::new(procedure),
        )]
    }

    async fn outcome(&self, env: &Env) -> Outcome {
        Outcome {
            store: store_digest(env.store.as_ref()).await.expect("digest"),
            topics: env.admin.partitions(),
            created: env.admin.created_counts(),
            names: env
                .kv
                .dump()
                .into_iter()
                .filter(|kv| kv.key.starts_with(b"__topic_name/"))
                .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
                .collect(),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_crash_point_of_a_batched_bootstrap_with_a_failing_topic_ends_with_each_topic_once() {
    let scenario = BatchScenario {
        spec: spec("wal_batch", 10),
    };
    let report = run_crash_matrix(&scenario, MatrixConfig::default()).await;
    let _ = writeln!(
        std::io::stderr(),
        "crash matrix 'batched bootstrap': {report}"
    );
    report.assert_no_mismatch();
    // The golden run's points: the first attempt sends batches (0–2) and (3–5) side by side; (0–2) answers, a
    // point; (3–5) creates 3 and 5 but fails 4, so the step fails before its point and before (6–8), (9) are
    // sent. The retried step reads metadata and sends the missing 4, 6, 7, 8, 9 as (4, 6, 7) and (8, 9): two
    // points. Then the persist: four in all.
    assert_eq!(report.side_effect_points, 4, "{report}");
    assert!(report.double_crash_cases > 0);
    assert_eq!(report.unreached_crash_points, 0);

    // The uncrashed run's world: every topic once, every name persisted.
    let env = scenario.new_env().await;
    let manager = procedures::LocalManager::new(env.store.clone(), MatrixConfig::default().manager);
    scenario.register_loaders(&env, &manager).unwrap();
    manager.start().await.unwrap();
    for p in scenario.procedures(&env) {
        manager.submit(p).await.unwrap().wait().await.unwrap();
    }
    manager.stop().await.unwrap();
    let outcome = scenario.outcome(&env).await;
    let wanted = scenario.spec.topic_names();
    assert_eq!(outcome.topics.len(), 10);
    assert!(
        outcome.created.values().all(|&n| n == 1),
        "{:?}",
        outcome.created
    );
    assert_eq!(outcome.created.len(), 10);
    assert_eq!(outcome.names.len(), wanted.len());
}

#[test]
fn create_batch_size_out_of_range_is_refused_naming_the_key() {
    for (value, shown) in [("0", "0"), ("10001", "10001")] {
        let text = format!("[wal]\nprovider = \"kafka\"\ncreate_batch_size = {value}\n");
        let err = remote_wal::config::MetasrvConfig::from_toml_str(&text, "metasrv.toml")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            format!(
                "config file 'metasrv.toml': invalid WAL config: create_batch_size = {shown}: must be between 1 \
                 and 10000"
            )
        );
    }
}
