//! The WAL prune round: one procedure over every topic, each topic's result recorded, a failing topic never
//! stopping the others — under the crash matrix (a crash before and after every durable write and at every
//! side-effect point, then recovery, and a second crash during recovery), on a memory store and a fake deleter.
//!
//! Seven topics in chunks of two: `t_0` prunable to 7, `t_1` pinned by a region without a checkpoint, `t_2` with an
//! undecodable region value, `t_3` whose records the brokers refuse to delete, `t_4` free (no region key, no
//! datanode table names it: its tables were dropped) so pruned to its end, `t_5` prunable to 5 after all of them,
//! and `t_6` without region keys but named by a datanode table (a table from before those keys existed): kept.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use procedures::testing::{
    CrashScenario, MatrixConfig, StoreDigest, run_crash_matrix, store_digest,
};
use procedures::{LocalManager, ProcedureId, ProcedureManager, ProcedureWithId, StateStore};
use remote_wal::key::topic_name::{TopicId, TopicNameValue, topic_name_key};
use remote_wal::key::topic_region::TopicRegionValue;
use remote_wal::kv::memory::MemoryKvBackend;
use remote_wal::kv::state_store::KvStateStore;
use remote_wal::kv::{KvBackend, KvBackendRef, PutRequest};
use remote_wal::wal::WalOptions;
use remote_wal::wal::prune::round::{PruneRoundOutput, TopicOutcome, WalPruneRound};
use remote_wal::wal::prune::{PruneMode, RecordDeleter};

const TOPICS: [&str; 7] = ["t_0", "t_1", "t_2", "t_3", "t_4", "t_5", "t_6"];

/// Each topic's last entry id on the fake brokers.
const END: u64 = 12;

/// A broker per topic: the low offset of each partition; `t_3`'s deletions are refused.
#[derive(Debug, Default)]
struct FakeBrokers {
    low: Mutex<BTreeMap<String, i64>>,
}

#[async_trait]
impl RecordDeleter for FakeBrokers {
    async fn delete_records_before(
        &self,
        topic: &str,
        offset: i64,
    ) -> remote_wal::wal::error::Result<()> {
        if topic == "t_3" {
            return Err(remote_wal::wal::Error::KafkaTimeout {
                endpoints: vec!["127.0.0.1:9".to_string()],
                operation: format!("delete records of '{topic}'"),
                timeout: std::time::Duration::from_secs(5),
                retryable: true,
            });
        }
        let mut low = self.low.lock().unwrap();
        let entry = low.entry(topic.to_string()).or_insert(0);
        *entry = (*entry).max(offset);
        Ok(())
    }

    async fn last_entry_id(&self, _topic: &str) -> remote_wal::wal::error::Result<Option<u64>> {
        Ok(Some(END))
    }
}

struct Env {
    kv: KvBackendRef,
    store: Arc<dyn StateStore>,
    brokers: Arc<FakeBrokers>,
}

async fn put(kv: &dyn KvBackend, key: &[u8], value: Vec<u8>) {
    kv.put(PutRequest {
        key: key.to_vec(),
        value,
        prev_kv: false,
    })
    .await
    .unwrap();
}

async fn new_env() -> Env {
    let memory = Arc::new(MemoryKvBackend::new());
    let kv: KvBackendRef = memory.clone();
    for topic in TOPICS {
        put(
            kv.as_ref(),
            &topic_name_key(topic),
            TopicNameValue {
                pruned_entry_id: 2,
                topic_id: None,
            }
            .encode(),
        )
        .await;
    }
    let region = |topic: &str, region: u64| format!("__topic_region/{topic}/{region}").into_bytes();
    put(
        kv.as_ref(),
        &region("t_0", 1),
        TopicRegionValue::at(9).encode(),
    )
    .await;
    put(
        kv.as_ref(),
        &region("t_0", 2),
        TopicRegionValue::at(7).encode(),
    )
    .await;
    put(
        kv.as_ref(),
        &region("t_1", 3),
        TopicRegionValue::at(9).encode(),
    )
    .await;
    put(
        kv.as_ref(),
        &region("t_1", 4),
        TopicRegionValue::default().encode(),
    )
    .await;
    put(kv.as_ref(), &region("t_2", 5), b"{not json".to_vec()).await;
    put(
        kv.as_ref(),
        &region("t_3", 6),
        TopicRegionValue::at(8).encode(),
    )
    .await;
    put(
        kv.as_ref(),
        &region("t_5", 7),
        TopicRegionValue::at(5).encode(),
    )
    .await;
    // Table 9 on datanode 1 writes region 0 to t_6 and has no `__topic_region` key.
    let options = WalOptions::kafka("t_6").encode();
    let table =
        serde_json::json!({"table_id": 9, "regions": [0], "region_wal_options": {"0": options}});
    put(
        kv.as_ref(),
        b"__dn_table/1/9",
        table.to_string().into_bytes(),
    )
    .await;
    Env {
        store: Arc::new(KvStateStore::new(memory)),
        kv,
        brokers: Arc::new(FakeBrokers::default()),
    }
}

fn round(env: &Env) -> WalPruneRound {
    WalPruneRound::with_chunk(
        TOPICS.iter().map(|t| t.to_string()).collect(),
        PruneMode::DeleteRecords,
        2,
        env.kv.clone(),
        env.brokers.clone(),
    )
}

#[derive(Debug, PartialEq)]
struct Outcome {
    store: StoreDigest,
    watermarks: BTreeMap<String, u64>,
    low_offsets: BTreeMap<String, i64>,
}

async fn outcome_of(env: &Env) -> Outcome {
    let mut watermarks = BTreeMap::new();
    for topic in TOPICS {
        let value = env.kv.get(&topic_name_key(topic)).await.unwrap().unwrap();
        let decoded = TopicNameValue::decode(b"k", &value.value).unwrap();
        watermarks.insert(topic.to_string(), decoded.pruned_entry_id);
    }
    Outcome {
        store: store_digest(env.store.as_ref()).await.unwrap(),
        watermarks,
        low_offsets: env.brokers.low.lock().unwrap().clone(),
    }
}

struct RoundScenario;

#[async_trait]
impl CrashScenario for RoundScenario {
    type Env = Env;
    type Outcome = Outcome;

    async fn new_env(&self) -> Env {
        new_env().await
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
            WalPruneRound::TYPE_NAME,
            WalPruneRound::loader(env.kv.clone(), env.brokers.clone()),
        )
    }

    fn procedures(&self, env: &Env) -> Vec<ProcedureWithId> {
        vec![ProcedureWithId::new(
            ProcedureId::new("wal_prune_round/1"),
            Box::new(round(env)),
        )]
    }

    async fn outcome(&self, env: &Env) -> Outcome {
        outcome_of(env).await
    }
}

async fn run_once(env: &Env) -> PruneRoundOutput {
    let manager = LocalManager::new(env.store.clone(), MatrixConfig::default().manager);
    RoundScenario.register_loaders(env, &manager).unwrap();
    manager.start().await.unwrap();
    let output = manager
        .submit(ProcedureWithId::new(
            ProcedureId::new("wal_prune_round/1"),
            Box::new(round(env)),
        ))
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    manager.stop().await.unwrap();
    serde_json::from_value(output.unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_prunes_every_topic_it_can_and_records_why_it_did_not_prune_the_others() {
    let env = new_env().await;
    let output = run_once(&env).await;
    let topics: Vec<&str> = output.topics.iter().map(|t| t.topic.as_str()).collect();
    assert_eq!(topics, TOPICS, "every topic, in order: {output:?}");
    let by_topic: BTreeMap<&str, &TopicOutcome> = output
        .topics
        .iter()
        .map(|t| (t.topic.as_str(), &t.outcome))
        .collect();
    assert_eq!(
        by_topic["t_0"],
        &TopicOutcome::Pruned {
            old_pruned_entry_id: 2,
            new_pruned_entry_id: 7,
            regions: 2,
            held_by: Some(2),
            last_entry_id: Some(END),
        }
    );
    match by_topic["t_1"] {
        TopicOutcome::Skipped {
            pruned_entry_id: 2,
            pinned_by: Some(4),
            reason,
            ..
        } => assert!(reason.contains("region 4"), "{reason}"),
        other => panic!("t_1: {other:?}"),
    }
    match by_topic["t_2"] {
        TopicOutcome::Failed {
            step,
            error,
            retryable: false,
        } => {
            assert_eq!(step, "Decide");
            assert!(
                error.contains("__topic_region/t_2/5"),
                "names the key: {error}"
            );
        }
        other => panic!("t_2: {other:?}"),
    }
    match by_topic["t_3"] {
        TopicOutcome::Failed {
            step,
            error,
            retryable: true,
        } => {
            assert_eq!(step, "DeleteRecords");
            assert!(error.contains("t_3"), "{error}");
        }
        other => panic!("t_3: {other:?}"),
    }
    // Its tables dropped, the topic is pruned to its end.
    assert_eq!(
        by_topic["t_4"],
        &TopicOutcome::Pruned {
            old_pruned_entry_id: 2,
            new_pruned_entry_id: END,
            regions: 0,
            held_by: None,
            last_entry_id: Some(END),
        }
    );
    match by_topic["t_6"] {
        TopicOutcome::Skipped {
            pruned_entry_id: 2,
            regions: 0,
            pinned_by: None,
            reason,
        } => assert!(reason.contains("datanode table"), "{reason}"),
        other => panic!("t_6: {other:?}"),
    }
    // After two failures and a skip, the next topic is still pruned.
    assert_eq!(
        by_topic["t_5"],
        &TopicOutcome::Pruned {
            old_pruned_entry_id: 2,
            new_pruned_entry_id: 5,
            regions: 1,
            held_by: Some(7),
            last_entry_id: Some(END),
        }
    );
    // The regions holding watermarks back, most behind first: region 7 keeps 7 entries of t_5, region 2 keeps 5
    // of t_0; the freed t_4 is held by no region.
    assert_eq!(output.most_behind(10), [("t_5", 7, 7), ("t_0", 2, 5)]);
    assert_eq!(output.counts(), (3, 2, 2));
    assert_eq!(output.failed_topics(), ["t_2", "t_3"]);
    let outcome = outcome_of(&env).await;
    assert_eq!(outcome.watermarks["t_0"], 7);
    assert_eq!(
        outcome.watermarks["t_3"], 2,
        "a failed delete leaves the watermark"
    );
    assert_eq!(outcome.watermarks["t_4"], END);
    assert_eq!(outcome.watermarks["t_5"], 5);
    assert_eq!(outcome.watermarks["t_6"], 2);
    assert_eq!(
        outcome.low_offsets,
        BTreeMap::from([
            ("t_0".to_string(), 7),
            ("t_4".to_string(), END as i64),
            ("t_5".to_string(), 5)
        ])
    );
    // One record for the whole round.
    let records = outcome
        .store
        .entries
        .keys()
        .filter(|k| k.contains("wal_prune_round"))
        .count();
    assert!(records >= 1, "{:?}", outcome.store.entries.keys());
    assert!(
        outcome
            .store
            .entries
            .keys()
            .all(|k| !k.contains("wal_prune/")),
        "no per-topic procedure: {:?}",
        outcome.store.entries.keys()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_crash_point_of_a_round_ends_as_the_uncrashed_round() {
    let report = run_crash_matrix(&RoundScenario, MatrixConfig::default()).await;
    eprintln!("crash matrix 'wal prune round, 7 topics in chunks of 2': {report}");
    report.assert_no_mismatch();
    // t_0, t_4 and t_5: after the deletion and after the watermark moved.
    assert_eq!(report.side_effect_points, 6);
    assert!(report.double_crash_cases > 0);
    assert_eq!(report.unreached_crash_points, 0);
}

/// Creates a table on `t_4` (its region key, empty) while the prune reads the topic's end, as a create-table
/// landing between the prune's first read of the region keys and its read of the end would.
#[derive(Debug)]
struct CreatingBrokers {
    kv: KvBackendRef,
}

#[async_trait]
impl RecordDeleter for CreatingBrokers {
    async fn delete_records_before(
        &self,
        topic: &str,
        offset: i64,
    ) -> remote_wal::wal::error::Result<()> {
        panic!("nothing may be deleted: {topic} below {offset}");
    }

    async fn last_entry_id(&self, _topic: &str) -> remote_wal::wal::error::Result<Option<u64>> {
        put(
            self.kv.as_ref(),
            b"__topic_region/t_4/77",
            TopicRegionValue::default().encode(),
        )
        .await;
        Ok(Some(END))
    }
}

/// A started manager on `env`'s store whose rounds read the metadata through `kv` and delete through `deleter`.
async fn started_manager(
    env: &Env,
    kv: KvBackendRef,
    deleter: Arc<dyn RecordDeleter>,
) -> LocalManager {
    let manager = LocalManager::new(env.store.clone(), MatrixConfig::default().manager);
    manager
        .register_loader(WalPruneRound::TYPE_NAME, WalPruneRound::loader(kv, deleter))
        .unwrap();
    manager.start().await.unwrap();
    manager
}

/// Waits for a deposed manager's procedure to end, and checks it did not finish: its manager halted.
async fn deposed_manager_stops(watcher: &mut procedures::Watcher) {
    let outcome = tokio::time::timeout(std::time::Duration::from_secs(30), watcher.wait())
        .await
        .expect("the deposed manager stops");
    assert!(
        outcome.is_err(),
        "the deposed manager finished: {outcome:?}"
    );
}

/// Runs one round over `topics` on a fresh manager of `env`'s store with `brokers`, and returns its output.
async fn run_round(
    env: &Env,
    brokers: Arc<dyn RecordDeleter>,
    topics: &[&str],
) -> PruneRoundOutput {
    let manager = LocalManager::new(env.store.clone(), MatrixConfig::default().manager);
    manager
        .register_loader(
            WalPruneRound::TYPE_NAME,
            WalPruneRound::loader(env.kv.clone(), brokers.clone()),
        )
        .unwrap();
    manager.start().await.unwrap();
    let round = WalPruneRound::new(
        topics.iter().map(|t| t.to_string()).collect(),
        PruneMode::DeleteRecords,
        env.kv.clone(),
        brokers,
    );
    let output = manager
        .submit(ProcedureWithId::new(
            ProcedureId::new(format!("wal_prune_round/{}", topics.join("_"))),
            Box::new(round),
        ))
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    manager.stop().await.unwrap();
    serde_json::from_value(output.unwrap()).unwrap()
}

#[tokio::test]
async fn a_table_created_while_a_free_topic_is_decided_pins_it_instead_of_losing_its_entries() {
    let env = new_env().await;
    let brokers = Arc::new(CreatingBrokers { kv: env.kv.clone() });
    let output = run_round(&env, brokers, &["t_4"]).await;
    assert_eq!(
        output.topics[0].outcome,
        TopicOutcome::Skipped {
            pruned_entry_id: 2,
            regions: 1,
            pinned_by: Some(77),
            reason: "region 77 has no checkpoint yet: it pins the topic".to_string(),
        }
    );
    let value = env.kv.get(&topic_name_key("t_4")).await.unwrap().unwrap();
    assert_eq!(
        TopicNameValue::decode(b"k", &value.value)
            .unwrap()
            .pruned_entry_id,
        2
    );
}

/// Brokers listing `t_0` and `t_5` under ids of their own: `t_0`'s is the recorded one, `t_5`'s is not (deleted and
/// created again since it was recorded).
#[derive(Debug, Default)]
struct RecreatedBrokers {
    inner: FakeBrokers,
}

const RECORDED: TopicId = TopicId(0x0a);
const RECREATED: TopicId = TopicId(0x0b);

#[async_trait]
impl RecordDeleter for RecreatedBrokers {
    async fn delete_records_before(
        &self,
        topic: &str,
        offset: i64,
    ) -> remote_wal::wal::error::Result<()> {
        assert_ne!(topic, "t_5", "a recreated topic is never deleted from");
        self.inner.delete_records_before(topic, offset).await
    }

    async fn topic_ids(
        &self,
        topics: &[String],
    ) -> remote_wal::wal::error::Result<BTreeMap<String, TopicId>> {
        Ok(topics
            .iter()
            .filter_map(|t| match t.as_str() {
                "t_0" => Some((t.clone(), RECORDED)),
                "t_5" => Some((t.clone(), RECREATED)),
                _ => None,
            })
            .collect())
    }
}

#[tokio::test]
async fn a_topic_listed_under_another_id_than_the_recorded_one_fails_alone_and_is_not_pruned() {
    let env = new_env().await;
    for topic in ["t_0", "t_5"] {
        put(
            env.kv.as_ref(),
            &topic_name_key(topic),
            TopicNameValue {
                pruned_entry_id: 2,
                topic_id: Some(RECORDED),
            }
            .encode(),
        )
        .await;
    }
    let output = run_round(&env, Arc::new(RecreatedBrokers::default()), &["t_0", "t_5"]).await;
    assert!(
        matches!(
            output.topics[0].outcome,
            TopicOutcome::Pruned {
                new_pruned_entry_id: 7,
                ..
            }
        ),
        "{output:?}"
    );
    match &output.topics[1].outcome {
        TopicOutcome::Failed {
            error, retryable, ..
        } => {
            assert!(
                error.contains(&format!(
                    "topic 't_5' was deleted and created again (recorded id {RECORDED}, now {RECREATED})"
                )),
                "{error}"
            );
            assert!(!retryable);
        }
        other => panic!("t_5 must fail: {other:?}"),
    }
    let value = env.kv.get(&topic_name_key("t_5")).await.unwrap().unwrap();
    let value = TopicNameValue::decode(b"k", &value.value).unwrap();
    assert_eq!(value.pruned_entry_id, 2, "the watermark did not move");
    assert_eq!(value.topic_id, Some(RECORDED));
    // The pruned topic kept its recorded id through the watermark's compare-and-put.
    let value = env.kv.get(&topic_name_key("t_0")).await.unwrap().unwrap();
    assert_eq!(
        TopicNameValue::decode(b"k", &value.value).unwrap().topic_id,
        Some(RECORDED)
    );
}

/// Holds the first compare-and-put on a `__topic_name/` key (the watermark's, after its read) until released.
#[derive(Debug)]
struct HeldWatermark {
    inner: KvBackendRef,
    armed: std::sync::atomic::AtomicBool,
    entered: tokio::sync::Semaphore,
    release: tokio::sync::Semaphore,
}

#[async_trait]
impl remote_wal::kv::KvWrapper for HeldWatermark {
    fn inner(&self) -> &dyn KvBackend {
        self.inner.as_ref()
    }

    async fn compare_and_put(
        &self,
        req: remote_wal::kv::CompareAndPutRequest,
    ) -> remote_wal::kv::Result<remote_wal::kv::CompareAndPutResponse> {
        if req.key.starts_with(b"__topic_name/")
            && self.armed.swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            self.entered.add_permits(1);
            if let Ok(permit) = self.release.acquire().await {
                permit.forget();
            }
        }
        self.inner.compare_and_put(req).await
    }

    async fn put(
        &self,
        req: PutRequest,
    ) -> remote_wal::kv::Result<Option<remote_wal::kv::KeyValue>> {
        // A put of the watermark is held the same way (none is expected: the watermark is written only by
        // compare-and-put; held here, a blind write would show in the test).
        if req.key.starts_with(b"__topic_name/")
            && self.armed.swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            self.entered.add_permits(1);
            if let Ok(permit) = self.release.acquire().await {
                permit.forget();
            }
        }
        self.inner.put(req).await
    }
}

/// The watermark is written outside the procedure store, so the engine's epoch does not fence it: what stops a
/// deposed leader's late write is the compare-and-put against the value it read, only upwards (`docs/ha.md`). A
/// first manager's round is held at that write while a second manager claims the epoch, finishes the round, and
/// (the regions having flushed further) runs another that raises the watermark past the first's target. Let go,
/// the late write changes nothing (a blind put would lower the watermark) and the first manager halts fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_managers_late_watermark_write_never_lowers_the_watermark_and_it_halts() {
    let env = new_env().await;
    let held = Arc::new(HeldWatermark {
        inner: env.kv.clone(),
        armed: std::sync::atomic::AtomicBool::new(true),
        entered: tokio::sync::Semaphore::new(0),
        release: tokio::sync::Semaphore::new(0),
    });
    let held_kv: KvBackendRef = held.clone();
    let id = ProcedureId::new("wal_prune_round/late");
    let a = started_manager(&env, held_kv.clone(), env.brokers.clone()).await;
    let round = WalPruneRound::new(
        vec!["t_0".to_string()],
        PruneMode::DeleteRecords,
        held_kv,
        env.brokers.clone(),
    );
    let mut a_watcher = a
        .submit(ProcedureWithId::new(id.clone(), Box::new(round)))
        .await
        .unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(30), held.entered.acquire())
        .await
        .expect("the first manager reaches the watermark write")
        .unwrap()
        .forget();

    // A second manager claims the epoch and finishes that round (t_0 to 7).
    let b = started_manager(&env, env.kv.clone(), env.brokers.clone()).await;
    let mut w = b.watch(&id).await.unwrap().expect("recovered");
    w.wait().await.unwrap();
    b.stop().await.unwrap();
    let watermark = |kv: KvBackendRef| async move {
        let value = kv.get(&topic_name_key("t_0")).await.unwrap().unwrap();
        TopicNameValue::decode(b"k", &value.value)
            .unwrap()
            .pruned_entry_id
    };
    assert_eq!(watermark(env.kv.clone()).await, 7);
    // The regions flush further; a later round raises t_0 to 10.
    let region = |r: u64| format!("__topic_region/t_0/{r}").into_bytes();
    put(
        env.kv.as_ref(),
        &region(1),
        TopicRegionValue::at(11).encode(),
    )
    .await;
    put(
        env.kv.as_ref(),
        &region(2),
        TopicRegionValue::at(10).encode(),
    )
    .await;
    let output = run_round(&env, env.brokers.clone(), &["t_0"]).await;
    assert!(
        matches!(
            output.topics[0].outcome,
            TopicOutcome::Pruned {
                new_pruned_entry_id: 10,
                ..
            }
        ),
        "{output:?}"
    );
    let low = env.brokers.low.lock().unwrap().get("t_0").copied();

    // Let go, the deposed manager's write (to 7, expecting the value it read at 2) changes nothing.
    held.release.add_permits(1);
    deposed_manager_stops(&mut a_watcher).await;
    assert_eq!(
        watermark(env.kv.clone()).await,
        10,
        "the late write lowered it"
    );
    assert_eq!(env.brokers.low.lock().unwrap().get("t_0").copied(), low);
}

/// Brokers whose topics end at `end` (moved by the test), holding the first DeleteRecords of an armed run at a
/// gate, sent but not applied.
#[derive(Debug)]
struct HeldDeletes {
    low: Mutex<BTreeMap<String, i64>>,
    end: std::sync::atomic::AtomicU64,
    armed: std::sync::atomic::AtomicBool,
    entered: tokio::sync::Semaphore,
    release: tokio::sync::Semaphore,
}

#[async_trait]
impl RecordDeleter for HeldDeletes {
    async fn delete_records_before(
        &self,
        topic: &str,
        offset: i64,
    ) -> remote_wal::wal::error::Result<()> {
        if self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            self.entered.add_permits(1);
            if let Ok(permit) = self.release.acquire().await {
                permit.forget();
            }
        }
        let mut low = self.low.lock().unwrap();
        let entry = low.entry(topic.to_string()).or_insert(0);
        // Kafka never lowers a partition's low watermark.
        *entry = (*entry).max(offset);
        Ok(())
    }

    async fn last_entry_id(&self, _topic: &str) -> remote_wal::wal::error::Result<Option<u64>> {
        Ok(Some(self.end.load(std::sync::atomic::Ordering::SeqCst)))
    }
}

/// Kafka's DeleteRecords is outside every store, so no epoch fences it: what makes a deposed leader's late one
/// harmless is that it deletes below the target its round stored, computed from what the regions had flushed
/// then, and that entries written later sit above it (`docs/ha.md`). `t_4` has no region, so a round prunes it
/// to its end (12). A first manager's DeleteRecords for it is held while a second manager claims the epoch and
/// finishes the round, then a table is created on `t_4` and writes entries 13 to 20, its region not flushed yet.
/// Let go, the late DeleteRecords deletes nothing of the new region's: the low offset stays where the round put it,
/// below 13, the first entry the region needs. (Computed at send time from the brokers' end, it would delete them all, and this test fails.) The
/// first manager then halts fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_managers_late_delete_records_deletes_nothing_written_after_its_round_read() {
    let env = new_env().await;
    let brokers = Arc::new(HeldDeletes {
        low: Mutex::new(BTreeMap::new()),
        end: std::sync::atomic::AtomicU64::new(END),
        armed: std::sync::atomic::AtomicBool::new(true),
        entered: tokio::sync::Semaphore::new(0),
        release: tokio::sync::Semaphore::new(0),
    });
    let deleter: Arc<dyn RecordDeleter> = brokers.clone();
    let id = ProcedureId::new("wal_prune_round/late_delete");
    let a = started_manager(&env, env.kv.clone(), deleter.clone()).await;
    let round = WalPruneRound::new(
        vec!["t_4".to_string()],
        PruneMode::DeleteRecords,
        env.kv.clone(),
        deleter.clone(),
    );
    let mut a_watcher = a
        .submit(ProcedureWithId::new(id.clone(), Box::new(round)))
        .await
        .unwrap();
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        brokers.entered.acquire(),
    )
    .await
    .expect("the first manager reaches DeleteRecords")
    .unwrap()
    .forget();

    // A second manager claims the epoch and finishes that round.
    let b = started_manager(&env, env.kv.clone(), deleter.clone()).await;
    let mut w = b.watch(&id).await.unwrap().expect("recovered");
    w.wait().await.unwrap();
    b.stop().await.unwrap();
    let low_after_round = brokers.low.lock().unwrap().get("t_4").copied();
    assert_eq!(
        low_after_round,
        Some(i64::try_from(END).unwrap()),
        "pruned to its end"
    );
    // A table is created on t_4; its region writes entries 13 to 20 and has flushed none of them.
    put(
        env.kv.as_ref(),
        b"__topic_region/t_4/90",
        TopicRegionValue::default().encode(),
    )
    .await;
    brokers.end.store(20, std::sync::atomic::Ordering::SeqCst);

    // Let go, the deposed manager's DeleteRecords deletes nothing the new region needs.
    brokers.release.add_permits(1);
    deposed_manager_stops(&mut a_watcher).await;
    assert_eq!(
        brokers.low.lock().unwrap().get("t_4").copied(),
        low_after_round,
        "the late DeleteRecords deleted entries written after its round read the regions"
    );
}
