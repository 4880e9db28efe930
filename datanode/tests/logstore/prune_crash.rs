//! The WAL prune procedure under the crash matrix, on a memory metadata store and an in-memory partition (the fake
//! log): a crash before and after every durable write and at every side-effect point (after the records are
//! deleted, after the watermark moved), then recovery, and in the full matrix a second crash during recovery.
//! Every case must end like the uncrashed run: the same records deleted, the same watermark, every region still
//! replaying exactly the entries after its checkpoint; and across every case the stored watermark never moved
//! backwards (every value written to the topic's key is recorded by the store wrapper below).
//!
//! Also: a region created while a prune runs (between ComputePrunable and DeleteRecords) keeps its entries, and
//! the next prune is pinned at its start.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datanode::checkpoint::{CheckpointStore, TopicRegionValue, start_kafka_region};
use datanode::log_store::memory_partition::MemoryPartition;
use datanode::log_store::{KafkaLogStore, LogStore};
use datanode::replay::replay_topic;
use procedures::testing::{
    CrashScenario, MatrixConfig, MatrixReport, StoreDigest, run_crash_matrix, store_digest,
};
use procedures::{ProcedureManager, ProcedureWithId, StateStore};
use remote_wal::key::topic_name::{TopicNameValue, topic_name_key};
use remote_wal::kv::{KvBackend, KvBackendRef, PutRequest};
use remote_wal::wal::prune::{
    PruneMode, PruneOutput, RecordDeleter, WalPruneProcedure, prune_procedure_id,
};

use crate::common::{Env, MemoryDeleter, TOPIC, prune_env, prune_once, write};

/// Regions 1, 2, 3 write 30 entries in turn; their checkpoints are 24, 11 and (24, metadata 17); the topic
/// starts pruned at 3 (records below offset 3 deleted). `pinned` adds region 4 without a checkpoint.
struct PruneScenario {
    mode: PruneMode,
    pinned: bool,
}

pub(crate) const REGIONS: [u64; 3] = [1, 2, 3];

#[derive(Debug, PartialEq)]
struct Outcome {
    store: StoreDigest,
    watermark: u64,
    /// The partition's first offset still held.
    low_offset: Option<i64>,
    /// Region → entry ids a replay gives it now.
    replayed: BTreeMap<u64, Vec<u64>>,
    /// Every value the watermark was written with was at least the one before it.
    monotonic: bool,
}

pub(crate) async fn new_env(pinned: bool) -> Env {
    let env = prune_env().await;
    let (kv, watched, log) = (&env.kv, &env.watched, &env.log);
    let entries = (0..30u64)
        .map(|i| write(REGIONS[(i % 3) as usize], format!("e{i}").as_bytes()))
        .collect();
    log.append(entries).await.unwrap();
    env.partition.delete_below(3);
    watched
        .put(PutRequest {
            key: topic_name_key(TOPIC),
            value: TopicNameValue {
                pruned_entry_id: 3,
                topic_id: None,
            }
            .encode(),
            prev_kv: false,
        })
        .await
        .unwrap();
    let checkpoints = CheckpointStore::new(watched.clone());
    checkpoints.record_flushed(TOPIC, 1, 24).await.unwrap();
    checkpoints.record_flushed(TOPIC, 2, 11).await.unwrap();
    kv.put(PutRequest {
        key: b"__topic_region/memory_topic/3".to_vec(),
        value: br#"{"checkpoint":{"entry_id":24,"metadata_entry_id":17}}"#.to_vec(),
        prev_kv: false,
    })
    .await
    .unwrap();
    if pinned {
        kv.put(PutRequest {
            key: b"__topic_region/memory_topic/4".to_vec(),
            value: TopicRegionValue::default().encode(),
            prev_kv: false,
        })
        .await
        .unwrap();
    }
    env
}

async fn outcome_of(env: &Env, regions: &[u64]) -> Outcome {
    let value = env.kv.get(&topic_name_key(TOPIC)).await.unwrap().unwrap();
    let watermarks = env.watermarks.lock().unwrap().clone();
    let replay = replay_topic(env.log.as_ref(), &env.watched, regions)
        .await
        .unwrap();
    assert!(replay.errors.is_empty(), "{:?}", replay.errors);
    Outcome {
        store: store_digest(env.store.as_ref()).await.unwrap(),
        watermark: TopicNameValue::decode(b"k", &value.value)
            .unwrap()
            .pruned_entry_id,
        low_offset: env.log.partition().records().first().map(|r| r.offset),
        replayed: replay
            .regions
            .into_iter()
            .map(|(r, rr)| (r, rr.entries.iter().map(|e| e.entry_id).collect()))
            .collect(),
        monotonic: watermarks.windows(2).all(|w| w[0] <= w[1]),
    }
}

#[async_trait]
impl CrashScenario for PruneScenario {
    type Env = Env;
    type Outcome = Outcome;

    async fn new_env(&self) -> Env {
        new_env(self.pinned).await
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
            WalPruneProcedure::TYPE_NAME,
            WalPruneProcedure::loader(env.watched.clone(), env.deleter.clone()),
        )
    }

    fn procedures(&self, env: &Env) -> Vec<ProcedureWithId> {
        let procedure =
            WalPruneProcedure::new(TOPIC, self.mode, env.watched.clone(), env.deleter.clone());
        vec![ProcedureWithId::new(
            procedures::ProcedureId::new("wal_prune/memory_topic/1"),
            Box::new(procedure),
        )]
    }

    async fn outcome(&self, env: &Env) -> Outcome {
        outcome_of(env, &REGIONS).await
    }
}

fn print(name: &str, report: &MatrixReport) {
    let _ = writeln!(std::io::stderr(), "crash matrix '{name}': {report}");
}

/// Entry ids 1..=30 were written round robin: region r wrote ids r, r + 3, …
pub(crate) fn written_by(region: u64) -> Vec<u64> {
    (1..=30u64)
        .filter(|id| (id - 1) % 3 == region - 1)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_crash_point_of_a_delete_records_prune_ends_pruned_at_the_lowest_checkpoint() {
    let scenario = PruneScenario {
        mode: PruneMode::DeleteRecords,
        pinned: false,
    };
    let golden = {
        let env = scenario.new_env().await;
        let report = prune_once(&env, PruneMode::DeleteRecords).await;
        // The lowest flushed id is region 2's 11 (region 3's metadata checkpoint 17 is above it).
        assert_eq!(
            (report.old_pruned_entry_id, report.new_pruned_entry_id),
            (3, 11)
        );
        assert_eq!(*env.deleter.calls.lock().unwrap(), vec![11]);
        outcome_of(&env, &REGIONS).await
    };
    assert_eq!(golden.watermark, 11);
    assert_eq!(golden.low_offset, Some(11));
    assert!(golden.monotonic);
    // Every region still replays every entry it wrote after its checkpoint.
    for (region, flushed) in [(1, 24), (2, 11), (3, 17)] {
        let wanted: Vec<u64> = written_by(region)
            .into_iter()
            .filter(|id| *id > flushed)
            .collect();
        assert_eq!(golden.replayed[&region], wanted, "region {region}");
    }
    let report = run_crash_matrix(&scenario, MatrixConfig::default()).await;
    print("wal prune, delete_records, two crash levels", &report);
    report.assert_no_mismatch();
    // After the deletion and after the watermark moved.
    assert_eq!(report.side_effect_points, 2);
    assert!(report.double_crash_cases > 0);
    assert_eq!(report.unreached_crash_points, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_crash_point_of_a_logical_prune_moves_only_the_watermark() {
    let scenario = PruneScenario {
        mode: PruneMode::Logical,
        pinned: false,
    };
    let env = scenario.new_env().await;
    let report = prune_once(&env, PruneMode::Logical).await;
    assert_eq!(report.new_pruned_entry_id, 11);
    assert!(env.deleter.calls.lock().unwrap().is_empty());
    assert_eq!(
        env.log.partition().records().first().map(|r| r.offset),
        Some(3)
    );
    let report = run_crash_matrix(&scenario, MatrixConfig::default()).await;
    print("wal prune, logical, two crash levels", &report);
    report.assert_no_mismatch();
    assert_eq!(report.side_effect_points, 1);
    assert_eq!(report.unreached_crash_points, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_without_a_checkpoint_pins_the_topic_at_every_crash_point() {
    let scenario = PruneScenario {
        mode: PruneMode::DeleteRecords,
        pinned: true,
    };
    let env = scenario.new_env().await;
    let report = prune_once(&env, PruneMode::DeleteRecords).await;
    assert_eq!(report.pinned_by, Some(4));
    assert_eq!(
        (report.old_pruned_entry_id, report.new_pruned_entry_id),
        (3, 3)
    );
    // Nothing new is deleted: the watermark's records were already gone.
    assert_eq!(
        env.log.partition().records().first().map(|r| r.offset),
        Some(3)
    );
    let report = run_crash_matrix(&scenario, MatrixConfig::default()).await;
    print("wal prune, pinned, two crash levels", &report);
    report.assert_no_mismatch();
    assert_eq!(report.unreached_crash_points, 0);
}

/// A deleter that creates region 9 on the topic and writes its entries before deleting, as a create-table and
/// its first writes landing between ComputePrunable and DeleteRecords would.
#[derive(Debug)]
struct CreatingDeleter {
    inner: Arc<MemoryDeleter>,
    log: Arc<KafkaLogStore<Arc<MemoryPartition>>>,
    checkpoints: CheckpointStore,
    kv: KvBackendRef,
    created: Mutex<bool>,
}

#[async_trait]
impl RecordDeleter for CreatingDeleter {
    async fn delete_records_before(
        &self,
        topic: &str,
        offset: i64,
    ) -> remote_wal::wal::error::Result<()> {
        let first = !std::mem::replace(&mut *self.created.lock().unwrap(), true);
        if first {
            let log = &self.log;
            // The region records its checkpoint (the topic's end) before its first append.
            start_kafka_region(log.as_ref(), &self.checkpoints, 9)
                .await
                .unwrap();
            log.append(vec![write(9, b"n1"), write(1, b"x"), write(9, b"n2")])
                .await
                .unwrap();
            // The old regions flush everything so far (region 3's metric engine too).
            let end = log.last_entry_id(1).await.unwrap();
            for region in [1, 2] {
                self.checkpoints
                    .record_flushed(TOPIC, region, end)
                    .await
                    .unwrap();
            }
            self.kv
                .put(PutRequest {
                    key: b"__topic_region/memory_topic/3".to_vec(),
                    value: TopicRegionValue::at(end).encode(),
                    prev_kv: false,
                })
                .await
                .unwrap();
        }
        self.inner.delete_records_before(topic, offset).await
    }
}

#[tokio::test]
async fn a_region_created_during_a_prune_keeps_its_entries_and_pins_the_next_prune() {
    let env = new_env(false).await;
    let checkpoints = CheckpointStore::new(env.watched.clone());
    let deleter: Arc<CreatingDeleter> = Arc::new(CreatingDeleter {
        inner: env.deleter.clone(),
        log: env.log.clone(),
        checkpoints: checkpoints.clone(),
        kv: env.watched.clone(),
        created: Mutex::new(false),
    });
    let manager = procedures::LocalManager::new(env.store.clone(), MatrixConfig::default().manager);
    manager
        .register_loader(
            WalPruneProcedure::TYPE_NAME,
            WalPruneProcedure::loader(env.watched.clone(), deleter.clone()),
        )
        .unwrap();
    manager.start().await.unwrap();
    let mut reports = Vec::new();
    for _ in 0..2 {
        let procedure = WalPruneProcedure::new(
            TOPIC,
            PruneMode::DeleteRecords,
            env.watched.clone(),
            deleter.clone(),
        );
        let output = manager
            .submit(ProcedureWithId::new(
                prune_procedure_id(TOPIC),
                Box::new(procedure),
            ))
            .await
            .unwrap()
            .wait()
            .await
            .unwrap();
        reports.push(serde_json::from_value::<PruneOutput>(output.unwrap()).unwrap());
    }
    manager.stop().await.unwrap();
    // The first prune decided 11 before region 9 existed; the second is bounded by region 9's start (30, the
    // topic's end when it was created), below the old regions' new checkpoints (33).
    assert_eq!(reports[0].new_pruned_entry_id, 11);
    assert_eq!(reports[1].new_pruned_entry_id, 30);
    assert_eq!(reports[1].regions, 4);
    assert_eq!(
        checkpoints.get(TOPIC, 9).await.unwrap(),
        Some(TopicRegionValue::at(30))
    );
    let replay = replay_topic(env.log.as_ref(), &env.watched, &[9])
        .await
        .unwrap();
    assert!(replay.errors.is_empty(), "{:?}", replay.errors);
    let region9: Vec<Vec<u8>> = replay.regions[&9]
        .entries
        .iter()
        .map(|e| e.data.clone())
        .collect();
    assert_eq!(region9, vec![b"n1".to_vec(), b"n2".to_vec()]);
    assert!(
        env.watermarks
            .lock()
            .unwrap()
            .windows(2)
            .all(|w| w[0] <= w[1])
    );
}
