//! A prune racing a replay of the regions on its topic, on a memory metadata store and an in-memory partition:
//! the prune runs to its end at every call the replay makes on the partition (before the first one, between any
//! two, after the last), and the replay runs between every two steps of the prune. Every interleaving must give
//! each region exactly the entries after its checkpoint, and the prune must end as it does alone.
//!
//! The partition below answers a fetch from an offset the prune already deleted as Kafka does (OFFSET_OUT_OF_RANGE),
//! not by starting at the first record still held, so a replay that fetches below what a prune deletes is seen.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use datanode::log_store::kafka::{FetchedRecord, PartitionLog};
use datanode::log_store::record::EncodedRecord;
use datanode::log_store::{KafkaLogStore, KafkaLogStoreConfig};
use datanode::replay::replay_topic;
use procedures::testing::MatrixConfig;
use procedures::{ProcedureManager, ProcedureWithId};
use remote_wal::wal::error::LogKafkaSnafu;
use remote_wal::wal::prune::{
    PruneMode, PruneOutput, RecordDeleter, WalPruneProcedure, prune_procedure_id,
};
use rskafka::client::error::{Error as RsKafkaError, ProtocolError, RequestContext};
use snafu::IntoError;

use crate::common::{Env, TOPIC, prune_once};
use crate::prune_crash::{REGIONS, new_env, written_by};

/// The topic's partition as a replay sees it: each call first passes a gate, and the gate numbered `prune_at`
/// runs a whole prune of the topic before letting the call through.
struct GatedPartition {
    env: Arc<Env>,
    prune_at: usize,
    calls: AtomicUsize,
}

impl fmt::Debug for GatedPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GatedPartition")
            .field("prune_at", &self.prune_at)
            .finish()
    }
}

impl GatedPartition {
    async fn gate(&self) {
        if self.calls.fetch_add(1, Ordering::SeqCst) == self.prune_at {
            prune_once(&self.env, PruneMode::DeleteRecords).await;
        }
    }
}

#[async_trait]
impl PartitionLog for GatedPartition {
    fn topic(&self) -> &str {
        TOPIC
    }

    async fn produce(
        &self,
        records: Vec<EncodedRecord>,
    ) -> remote_wal::wal::error::Result<Vec<i64>> {
        self.gate().await;
        self.env.log.partition().produce(records).await
    }

    async fn fetch(
        &self,
        offset: i64,
        max_bytes: i32,
    ) -> remote_wal::wal::error::Result<(Vec<FetchedRecord>, i64)> {
        self.gate().await;
        let partition = self.env.log.partition();
        if offset < partition.low_watermark().await? {
            // What rskafka reports for a fetch below the partition's log start offset.
            let error = RsKafkaError::ServerError {
                protocol_error: ProtocolError::OffsetOutOfRange,
                error_message: None,
                request: RequestContext::Partition(TOPIC.to_string(), 0),
                response: None,
                is_virtual: false,
            };
            return Err(LogKafkaSnafu {
                topic: TOPIC,
                operation: format!("fetch from offset {offset}"),
                retryable: false,
            }
            .into_error(error));
        }
        partition.fetch(offset, max_bytes).await
    }

    async fn high_watermark(&self) -> remote_wal::wal::error::Result<i64> {
        self.gate().await;
        self.env.log.partition().high_watermark().await
    }

    async fn low_watermark(&self) -> remote_wal::wal::error::Result<i64> {
        self.gate().await;
        self.env.log.partition().low_watermark().await
    }
}

/// What each region must replay: the entries it wrote above its flushed entry id (region 3: its metadata one).
fn wanted() -> BTreeMap<u64, Vec<u64>> {
    [(1, 24), (2, 11), (3, 17)]
        .into_iter()
        .map(|(region, flushed)| {
            let ids = written_by(region)
                .into_iter()
                .filter(|id| *id > flushed)
                .collect();
            (region, ids)
        })
        .collect()
}

/// Replays the three regions through a partition whose gate `prune_at` runs a prune; the entry ids each got and
/// how many partition calls the replay made.
async fn replay_with_prune_at(
    env: Arc<Env>,
    prune_at: usize,
) -> (
    remote_wal::wal::error::Result<BTreeMap<u64, Vec<u64>>>,
    usize,
) {
    let gated = GatedPartition {
        env: env.clone(),
        prune_at,
        calls: AtomicUsize::new(0),
    };
    let store = KafkaLogStore::new(gated, KafkaLogStoreConfig::for_max_batch_bytes(1024));
    let replay = replay_topic(&store, &env.watched, &REGIONS).await;
    let calls = store.partition().calls.load(Ordering::SeqCst);
    let replayed = replay.map(|replay| {
        assert!(replay.errors.is_empty(), "{:?}", replay.errors);
        replay
            .regions
            .into_iter()
            .map(|(r, rr)| (r, rr.entries.iter().map(|e| e.entry_id).collect()))
            .collect()
    });
    (replayed, calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prune_at_any_point_of_a_replay_deletes_nothing_a_region_replays() {
    // Without a prune: how many partition calls a replay makes.
    let (alone, calls) = replay_with_prune_at(Arc::new(new_env(false).await), usize::MAX).await;
    assert_eq!(alone.unwrap(), wanted());
    assert!(calls >= 4, "high and low watermark, twice, then fetches");
    // The prune before the replay's first partition call, between any two, and after the last.
    for prune_at in 0..=calls {
        let env = Arc::new(new_env(false).await);
        let (replayed, _) = replay_with_prune_at(env.clone(), prune_at).await;
        if prune_at == calls {
            // No call passed gate `calls`: the prune runs after the replay's last partition call.
            prune_once(&env, PruneMode::DeleteRecords).await;
        }
        let replayed =
            replayed.unwrap_or_else(|e| panic!("prune at partition call {prune_at}: {e}"));
        assert_eq!(replayed, wanted(), "prune at partition call {prune_at}");
        // The prune did run, and deleted what it does alone.
        assert_eq!(
            *env.deleter.calls.lock().unwrap(),
            vec![11],
            "prune at partition call {prune_at}"
        );
        assert_eq!(
            env.log.partition().records().first().map(|r| r.offset),
            Some(11)
        );
    }
}

/// A deleter that replays the topic's regions just before and just after it deletes: between the prune's
/// ComputePrunable and DeleteRecords, and between DeleteRecords and AdvanceWatermark.
struct ReplayingDeleter {
    env: Arc<Env>,
    replays: std::sync::Mutex<Vec<BTreeMap<u64, Vec<u64>>>>,
}

impl fmt::Debug for ReplayingDeleter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplayingDeleter").finish()
    }
}

impl ReplayingDeleter {
    async fn replay(&self) {
        let (replayed, _) = replay_with_prune_at(self.env.clone(), usize::MAX).await;
        self.replays.lock().unwrap().push(replayed.unwrap());
    }
}

#[async_trait]
impl RecordDeleter for ReplayingDeleter {
    async fn delete_records_before(
        &self,
        topic: &str,
        offset: i64,
    ) -> remote_wal::wal::error::Result<()> {
        self.replay().await;
        self.env
            .deleter
            .delete_records_before(topic, offset)
            .await?;
        self.replay().await;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_between_any_two_steps_of_a_prune_gets_every_entry_after_each_checkpoint() {
    let env = Arc::new(new_env(false).await);
    let deleter = Arc::new(ReplayingDeleter {
        env: env.clone(),
        replays: std::sync::Mutex::new(Vec::new()),
    });
    let manager = procedures::LocalManager::new(env.store.clone(), MatrixConfig::default().manager);
    manager
        .register_loader(
            WalPruneProcedure::TYPE_NAME,
            WalPruneProcedure::loader(env.watched.clone(), deleter.clone()),
        )
        .unwrap();
    manager.start().await.unwrap();
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
    manager.stop().await.unwrap();
    let report: PruneOutput = serde_json::from_value(output.unwrap()).unwrap();
    assert_eq!(report.new_pruned_entry_id, 11);
    // Before the deletion (watermark 3, records from offset 3), after it (watermark still 3, records from 11),
    // and after the watermark moved (11).
    let (after, _) = replay_with_prune_at(env.clone(), usize::MAX).await;
    let mut replays = deleter.replays.lock().unwrap().clone();
    replays.push(after.unwrap());
    assert_eq!(replays.len(), 3);
    for (i, replayed) in replays.into_iter().enumerate() {
        assert_eq!(replayed, wanted(), "replay {i}");
    }
}
