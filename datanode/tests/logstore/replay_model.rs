//! A model-based test of replay exactness on the fake log (an in-memory partition and a memory metadata store):
//! random appends of entries of four regions sharing one topic, flushes (checkpoints recorded), WAL prunes in both
//! modes (some crashed at a durable write or side-effect point of the procedure, and recovered by the next prune),
//! datanode crashes (the log store dropped, sometimes in the middle of a large entry's produce requests, and
//! reopened on the same partition and metadata store), and replays of random sets of the regions.
//!
//! The model is what a region is owed: the entries whose append was acknowledged with an id above the region's
//! checkpoint (the highest entry id it flushed, or the topic's end when it was created). Every replay must give
//! each region exactly those, once each, in order, with their bytes; and a prune that ran to its end must leave the
//! watermark at the lowest checkpoint (and, in delete-records mode, the partition starting there).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use datanode::checkpoint::{CheckpointStore, start_kafka_region};
use datanode::log_store::kafka::{FetchedRecord, PartitionLog};
use datanode::log_store::memory_partition::MemoryPartition;
use datanode::log_store::record::EncodedRecord;
use datanode::log_store::{EntryId, EntryToWrite, KafkaLogStore, KafkaLogStoreConfig, LogStore};
use datanode::replay::replay_topic;
use procedures::testing::{CrashPlan, CrashPoint, CrashingStore, MatrixConfig};
use procedures::{LocalManager, ProcedureId, ProcedureManager, ProcedureWithId};
use proptest::prelude::*;
use remote_wal::key::topic_name::{TopicNameValue, topic_name_key};
use remote_wal::kv::KvBackend;
use remote_wal::wal::error::LogKafkaTimeoutSnafu;
use remote_wal::wal::prune::{PruneMode, PruneOutput, WalPruneProcedure, prune_procedure_id};

use crate::common::{Env, TOPIC, bytes, prune_env, shared_store};

/// The regions sharing the topic.
const REGIONS: [u64; 4] = [1, 2, 3, 4];

/// How long a crashed or recovered prune may take before the test calls it hung (a bound on hanging, not speed).
const HANG: Duration = Duration::from_secs(60);

#[derive(Clone, Debug)]
enum Op {
    /// One `append` call: entries of (region index, size), in this order. Entries over 738 bytes (the fragment
    /// size of 1 KiB requests) are split into fragments, each in a request of its own.
    Append(Vec<(usize, usize)>),
    /// The region flushes: up to the entry id of one of its acknowledged entries (`Some`), or everything written
    /// so far (`None`, the log store's `last_entry_id`).
    Flush {
        region: usize,
        upto: Option<prop::sample::Index>,
    },
    /// A prune of the topic; with `crash`, its manager crashes at that point (kind, index) and the next prune's
    /// manager recovers it.
    Prune {
        logical: bool,
        crash: Option<(u8, usize)>,
    },
    /// The datanode crashes and restarts: its log store is dropped and a new one opened on the same partition. With
    /// `torn`, it crashes while appending one large entry (region index, size), after `requests` of its produce
    /// requests (at least one, fewer than the entry has): a torn entry at the log's tail.
    Crash { torn: Option<(usize, usize, usize)> },
    /// A replay of the regions picked (all of them when none is).
    Replay(Vec<bool>),
}

fn op() -> impl Strategy<Value = Op> {
    let region = 0usize..REGIONS.len();
    prop_oneof![
        6 => prop::collection::vec((region.clone(), 0usize..2000), 1..6).prop_map(Op::Append),
        3 => (region.clone(), prop::option::of(any::<prop::sample::Index>()))
            .prop_map(|(region, upto)| Op::Flush { region, upto }),
        2 => (any::<bool>(), prop::option::of((0u8..3, 0usize..6)))
            .prop_map(|(logical, crash)| Op::Prune { logical, crash }),
        1 => prop::option::of((region, 1500usize..3000, 1usize..4))
            .prop_map(|torn| Op::Crash { torn }),
        2 => prop::collection::vec(any::<bool>(), REGIONS.len()).prop_map(Op::Replay),
    ]
}

/// A partition that takes `allowed` produce requests, then fails every other one as a timed-out call does: the
/// writer dies there.
#[derive(Debug)]
struct TearingPartition {
    inner: Arc<MemoryPartition>,
    allowed: AtomicUsize,
}

#[async_trait]
impl PartitionLog for TearingPartition {
    fn topic(&self) -> &str {
        self.inner.topic()
    }

    async fn produce(
        &self,
        records: Vec<EncodedRecord>,
    ) -> remote_wal::wal::error::Result<Vec<i64>> {
        let left = self.allowed.load(Ordering::SeqCst);
        if left == 0 {
            return LogKafkaTimeoutSnafu {
                topic: TOPIC,
                operation: "produce (the writer crashed)",
                timeout: Duration::ZERO,
            }
            .fail();
        }
        self.allowed.store(left - 1, Ordering::SeqCst);
        self.inner.produce(records).await
    }

    async fn fetch(
        &self,
        offset: i64,
        max_bytes: i32,
    ) -> remote_wal::wal::error::Result<(Vec<FetchedRecord>, i64)> {
        self.inner.fetch(offset, max_bytes).await
    }

    async fn high_watermark(&self) -> remote_wal::wal::error::Result<i64> {
        self.inner.high_watermark().await
    }

    async fn low_watermark(&self) -> remote_wal::wal::error::Result<i64> {
        self.inner.low_watermark().await
    }
}

/// The fake datanode and metasrv, and the model.
struct World {
    env: Env,
    /// The datanode's log store (replaced at every crash).
    writer: KafkaLogStore<Arc<MemoryPartition>>,
    checkpoints: CheckpointStore,
    /// Region → its checkpoint, for the regions created so far.
    checkpoint: BTreeMap<u64, EntryId>,
    /// Region → every entry whose append was acknowledged: (entry id, bytes), in order.
    written: BTreeMap<u64, Vec<(EntryId, Vec<u8>)>>,
    /// A prune whose manager crashed, left for the next prune's manager to recover.
    crashed_prune: Option<ProcedureId>,
    seed: u64,
    /// What happened, for the failure message.
    log: Vec<String>,
}

impl World {
    async fn new() -> Self {
        let env = prune_env().await;
        World {
            writer: shared_store(&env.partition),
            checkpoints: CheckpointStore::new(env.watched.clone()),
            env,
            checkpoint: BTreeMap::new(),
            written: BTreeMap::new(),
            crashed_prune: None,
            seed: 0,
            log: Vec::new(),
        }
    }

    /// Creates `region` on the topic before its first append or flush: its checkpoint is the topic's end.
    async fn ensure_region(&mut self, region: u64) {
        if self.checkpoint.contains_key(&region) {
            return;
        }
        let start = start_kafka_region(&self.writer, &self.checkpoints, region)
            .await
            .unwrap();
        self.log.push(format!("region {region} created at {start}"));
        self.checkpoint.insert(region, start);
    }

    fn data(&mut self, size: usize) -> Vec<u8> {
        self.seed += 1;
        bytes(self.seed, size)
    }

    async fn apply(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Append(writes) => {
                let mut entries = Vec::new();
                for (index, size) in writes {
                    let region = REGIONS[index];
                    self.ensure_region(region).await;
                    let data = self.data(size);
                    entries.push(EntryToWrite {
                        region_id: region,
                        data,
                    });
                }
                let appended = self.writer.append(entries.clone()).await.unwrap();
                prop_assert_eq!(appended.len(), entries.len());
                for (entry, at) in entries.into_iter().zip(&appended) {
                    prop_assert_eq!(at.region_id, entry.region_id);
                    self.written
                        .entry(entry.region_id)
                        .or_default()
                        .push((at.entry_id, entry.data));
                }
                self.log.push(format!(
                    "append {:?}",
                    appended
                        .iter()
                        .map(|a| (a.region_id, a.entry_id))
                        .collect::<Vec<_>>()
                ));
            }
            Op::Flush { region, upto } => {
                let region = REGIONS[region];
                self.ensure_region(region).await;
                let acknowledged = self.written.get(&region).filter(|l| !l.is_empty());
                let entry_id = match (upto, acknowledged) {
                    (Some(pick), Some(list)) => list[pick.index(list.len())].0,
                    _ => self.writer.last_entry_id(region).await.unwrap(),
                };
                let stored = self
                    .checkpoints
                    .record_flushed(TOPIC, region, entry_id)
                    .await
                    .unwrap();
                let model = self.checkpoint.get_mut(&region).unwrap();
                *model = (*model).max(entry_id);
                prop_assert_eq!(stored, *model, "region {} flushed at {}", region, entry_id);
                self.log.push(format!(
                    "flush region {region} at {entry_id} → checkpoint {stored}"
                ));
            }
            Op::Prune { logical, crash } => self.prune(logical, crash).await?,
            Op::Crash { torn } => {
                if let Some((index, size, requests)) = torn {
                    let region = REGIONS[index];
                    self.ensure_region(region).await;
                    let tearing = KafkaLogStore::new(
                        TearingPartition {
                            inner: self.env.partition.clone(),
                            allowed: AtomicUsize::new(requests.min((size - 1) / 738)),
                        },
                        KafkaLogStoreConfig::for_max_batch_bytes(1024),
                    );
                    let data = self.data(size);
                    let failed = tearing
                        .append(vec![EntryToWrite {
                            region_id: region,
                            data,
                        }])
                        .await;
                    prop_assert!(failed.is_err(), "the torn append was acknowledged");
                }
                self.restart_writer().await;
                self.log.push(format!("crash (torn: {torn:?})"));
            }
            Op::Replay(picked) => {
                let mut regions: Vec<u64> = REGIONS
                    .iter()
                    .zip(&picked)
                    .filter(|(r, p)| **p && self.checkpoint.contains_key(r))
                    .map(|(r, _)| *r)
                    .collect();
                if regions.is_empty() {
                    regions = self.checkpoint.keys().copied().collect();
                }
                self.check_replay(&regions).await?;
            }
        }
        Ok(())
    }

    /// A new writer, as a restarted datanode opens one: another writer id, its counters from 1 again. Nothing it
    /// writes can pass for a copy of what the previous writer wrote (no waiting for a clock).
    async fn restart_writer(&mut self) {
        self.writer = shared_store(&self.env.partition);
    }

    /// One prune, its manager crashing at `crash` if given; a prune crashed earlier is recovered (and waited for)
    /// first.
    async fn prune(
        &mut self,
        logical: bool,
        crash: Option<(u8, usize)>,
    ) -> Result<(), TestCaseError> {
        let mode = if logical {
            PruneMode::Logical
        } else {
            PruneMode::DeleteRecords
        };
        let plan = match crash {
            None => CrashPlan::none(),
            Some((0, k)) => CrashPlan::at(CrashPoint::BeforeWrite(k)),
            Some((1, k)) => CrashPlan::at(CrashPoint::AfterWrite(k)),
            Some((_, m)) => CrashPlan::at(CrashPoint::SideEffect(m)),
        };
        let crashing = Arc::new(CrashingStore::with_plan(self.env.store.clone(), plan));
        let manager = LocalManager::with_side_effect_hook(
            crashing.clone(),
            MatrixConfig::default().manager,
            crashing.clone(),
        );
        manager
            .register_loader(
                WalPruneProcedure::TYPE_NAME,
                WalPruneProcedure::loader(self.env.watched.clone(), self.env.deleter.clone()),
            )
            .unwrap();
        let low_before = self.env.partition.low_watermark().await.unwrap();
        let mut crashed = manager.start().await.is_err();
        let mut recovered = false;
        if !crashed && let Some(id) = self.crashed_prune.take() {
            recovered = true;
            // The start resumed the crashed prune; it runs before this one (they share the topic's lock).
            let watched = manager
                .watch(&id)
                .await
                .map_err(|e| TestCaseError::fail(format!("watch the recovered prune {id}: {e}")))?;
            if let Some(mut watcher) = watched {
                let result = tokio::time::timeout(HANG, watcher.wait())
                    .await
                    .map_err(|_| TestCaseError::fail(format!("recovered prune {id} hung")))?;
                if crashing.controller().is_crashed() {
                    self.crashed_prune = Some(id);
                } else {
                    result
                        .map_err(|e| TestCaseError::fail(format!("recovered prune {id}: {e}")))?;
                }
            }
        }
        crashed |= crashing.controller().is_crashed();
        let mut output = None;
        if !crashed {
            let id = prune_procedure_id(TOPIC);
            let procedure = WalPruneProcedure::new(
                TOPIC,
                mode,
                self.env.watched.clone(),
                self.env.deleter.clone(),
            );
            let submitted = manager
                .submit(ProcedureWithId::new(id.clone(), Box::new(procedure)))
                .await;
            let result = match submitted {
                Ok(mut watcher) => tokio::time::timeout(HANG, watcher.wait())
                    .await
                    .map_err(|_| TestCaseError::fail(format!("prune {id} hung")))?
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if crashing.controller().is_crashed() {
                // Left for the next prune to recover (a crash before its first write leaves nothing to recover).
                self.crashed_prune.get_or_insert(id);
            } else {
                let value = result
                    .map_err(|e| TestCaseError::fail(format!("prune failed: {e}")))?
                    .ok_or_else(|| TestCaseError::fail("prune returned no output"))?;
                output = Some(serde_json::from_value::<PruneOutput>(value).unwrap());
            }
        }
        let _ = tokio::time::timeout(HANG, manager.stop()).await;
        let watermark = self.watermark().await;
        let low = self.env.partition.low_watermark().await.unwrap();
        self.log.push(format!(
            "prune {mode:?} (crash at {:?}): {output:?}; watermark {watermark}, first offset {low}",
            plan.point()
        ));
        if output.is_some() {
            // Ran to its end: up to the lowest checkpoint (nothing while the topic has no region).
            let lowest = self.checkpoint.values().min().copied().unwrap_or(0);
            prop_assert_eq!(watermark, lowest, "the watermark after a whole prune");
            if mode == PruneMode::DeleteRecords && lowest > 0 {
                prop_assert_eq!(
                    low,
                    lowest as i64,
                    "the first offset after a whole delete-records prune"
                );
            } else if mode == PruneMode::Logical && !recovered {
                prop_assert_eq!(low, low_before, "a logical prune deleted records");
            }
        }
        Ok(())
    }

    /// The topic's pruned entry id (0 when never pruned).
    async fn watermark(&self) -> u64 {
        match self.env.kv.get(&topic_name_key(TOPIC)).await.unwrap() {
            Some(kv) => {
                TopicNameValue::decode(&kv.key, &kv.value)
                    .unwrap()
                    .pruned_entry_id
            }
            None => 0,
        }
    }

    /// Replays `regions` with a fresh reader (small fetches, so a pass takes several) and compares each with the
    /// model.
    async fn check_replay(&mut self, regions: &[u64]) -> Result<(), TestCaseError> {
        let reader = KafkaLogStore::new(
            self.env.partition.clone(),
            KafkaLogStoreConfig {
                fetch_bytes: 1500,
                ..KafkaLogStoreConfig::for_max_batch_bytes(1024)
            },
        );
        let replay = replay_topic(&reader, &self.env.watched, regions)
            .await
            .map_err(|e| TestCaseError::fail(format!("replay of {regions:?}: {e}")))?;
        prop_assert!(
            replay.errors.is_empty(),
            "replay errors: {:?}",
            replay.errors
        );
        for region in regions {
            let checkpoint = self.checkpoint[region];
            let wanted: Vec<(EntryId, Vec<u8>)> = self
                .written
                .get(region)
                .map(|list| {
                    list.iter()
                        .filter(|(id, _)| *id > checkpoint)
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            let got = replay
                .regions
                .get(region)
                .ok_or_else(|| TestCaseError::fail(format!("region {region} not replayed")))?;
            prop_assert_eq!(
                got.checkpoint,
                checkpoint,
                "region {}'s replay checkpoint",
                region
            );
            let got_entries: Vec<(EntryId, Vec<u8>)> = got
                .entries
                .iter()
                .map(|e| {
                    assert_eq!(e.region_id, *region);
                    (e.entry_id, e.data.clone())
                })
                .collect();
            let ids = |l: &[(EntryId, Vec<u8>)]| l.iter().map(|e| e.0).collect::<Vec<_>>();
            prop_assert_eq!(
                ids(&got_entries),
                ids(&wanted),
                "entry ids replayed for region {} above checkpoint {}",
                region,
                checkpoint
            );
            prop_assert!(
                got_entries == wanted,
                "the bytes of region {}'s entries",
                region
            );
            prop_assert_eq!(got.entries_replayed, wanted.len() as u64);
        }
        self.log.push(format!("replay {regions:?}: ok"));
        Ok(())
    }
}

async fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut world = World::new().await;
    for op in ops {
        let shown = format!("{op:?}");
        if let Err(e) = world.apply(op).await {
            return Err(TestCaseError::fail(format!(
                "{e}\nat {shown}\nafter:\n  {}",
                world.log.join("\n  ")
            )));
        }
    }
    // A last crash and replay of every region, once any prune left behind is recovered.
    world.restart_writer().await;
    if world.crashed_prune.is_some() {
        world.prune(false, None).await?;
    }
    let regions: Vec<u64> = world.checkpoint.keys().copied().collect();
    if let Err(e) = world.check_replay(&regions).await {
        return Err(TestCaseError::fail(format!(
            "{e}\nat the final replay, after:\n  {}",
            world.log.join("\n  ")
        )));
    }
    let watermarks = world.env.watermarks.lock().unwrap().clone();
    prop_assert!(
        watermarks.windows(2).all(|w| w[0] <= w[1]),
        "the watermark moved backwards: {:?}",
        watermarks
    );
    Ok(())
}

proptest! {
    #[test]
    fn every_region_replays_exactly_its_entries_after_its_checkpoint(
        ops in prop::collection::vec(op(), 1..40),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(run(ops))?;
    }
}
