//! [`Datanode`]: the regions one datanode process has open, their WALs and region storage, the write path and
//! flushes, and what heartbeats report and bring back (leases and instructions). `walctl datanode` serves it over
//! HTTP; a database's datanode can embed it the same way (`docs/datanode.md`).
//!
//! **Opening a region** reads its storage, then replays its WAL above the highest of: what storage holds, its
//! `__topic_region` checkpoint, the topic's pruned entry id. A Kafka region that never had a checkpoint (it was
//! never opened) starts at the topic's current end, which it reports as its flushed entry id; the metasrv records
//! that checkpoint before it grants the region a lease, so every entry the region writes lies above a checkpoint
//! a prune sees. The regions a heartbeat asks to open on one topic are replayed in one read of it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use remote_wal::datanode::protocol::{
    ClosedRegion, HeartbeatRequest, HeartbeatResponse, Instruction, RegionRole, RegionToOpen,
    WalLost, writer_id,
};
use remote_wal::wal::{KafkaConfig, WAL_OPTIONS_KEY, WalOptions};
use rskafka::client::Client;
use serde::Serialize;
use tokio::sync::OnceCell;

use crate::error::{
    NoTopicRegionKeySnafu, NotLeaderSnafu, OutcomeUnknownSnafu, RegionDroppedSnafu,
    RegionNotOpenSnafu, RegionWalSnafu, Result, WalTailLostSnafu,
};
use crate::log_store::kafka::{PartitionLog, RsKafkaPartition, call_bound, connect_client};
use crate::log_store::{
    Entry, EntryId, EntryToWrite, KafkaLogStore, KafkaLogStoreConfig, LogStore, RaftEngineLogStore,
    RegionId,
};
use crate::region::{Memtable, Region, RegionCounters, RegionWal};
use crate::storage::RegionStorage;
use crate::topic_ids::{BrokerTopicIds, TopicIds, TopicIncarnation};

/// How a datanode runs.
#[derive(Clone)]
pub struct DatanodeOptions {
    /// Its id.
    pub id: u64,
    /// The address it advertises.
    pub address: String,
    /// Its raft-engine WAL directory.
    pub wal_dir: PathBuf,
    /// Region storage, shared by every datanode.
    pub region_storage: PathBuf,
    /// The Kafka WAL's brokers and backoff, when regions use Kafka.
    pub kafka: Option<KafkaConfig>,
    /// How often it heartbeats.
    pub heartbeat_interval: Duration,
    /// Unflushed bytes per region past which a write flushes first.
    pub flush_threshold: u64,
    /// Where Kafka topics' partitions come from: `None` = rskafka on `kafka`'s brokers; tests give in-memory ones.
    pub partitions: Option<PartitionFactory>,
    /// Where topic incarnations are read before a region replays from a checkpoint: `None` = Metadata requests
    /// to `kafka`'s brokers, unless `partitions` is given (then incarnations are not checked); tests give fakes.
    pub topic_ids: Option<Arc<dyn TopicIds>>,
}

/// How many dropped regions a datanode remembers, to answer writes to them that they were dropped (a region
/// forgotten past this is answered as not open here, which a client resolves through the metasrv).
pub const REMEMBERED_DROPS: usize = 65_536;

/// A datanode's log store on one topic.
pub type TopicStore = KafkaLogStore<Arc<dyn PartitionLog>>;

/// Makes the partition 0 of a topic (tests: an in-memory or a slowed one).
pub type PartitionFactory = Arc<dyn Fn(&str) -> Arc<dyn PartitionLog> + Send + Sync>;

impl std::fmt::Debug for DatanodeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatanodeOptions")
            .field("id", &self.id)
            .field("address", &self.address)
            .field("wal_dir", &self.wal_dir)
            .field("region_storage", &self.region_storage)
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("flush_threshold", &self.flush_threshold)
            .finish_non_exhaustive()
    }
}

/// A region as `GET /v1/regions` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RegionInfo {
    /// The region.
    pub region_id: RegionId,
    /// `leader` while its lease holds, else `follower`.
    pub role: RegionRole,
    /// The region epoch of its lease.
    pub epoch: u64,
    /// Its WAL.
    pub wal: String,
    /// Its last acknowledged entry id.
    pub last_entry_id: EntryId,
    /// Entries up to here are in region storage.
    pub flushed_entry_id: EntryId,
    /// Unflushed bytes.
    pub memtable_bytes: u64,
    /// Milliseconds of lease left (0 without one).
    pub lease_left_ms: u64,
}

/// What a flush did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FlushReport {
    /// The region.
    pub region_id: RegionId,
    /// Entries written to storage.
    pub entries: usize,
    /// Its flushed entry id afterwards.
    pub flushed_entry_id: EntryId,
}

/// One datanode's regions.
#[derive(Debug)]
pub struct Datanode {
    options: DatanodeOptions,
    incarnation: AtomicU64,
    storage: RegionStorage,
    regions: RwLock<HashMap<RegionId, Arc<Region>>>,
    /// Regions being opened (an open instruction repeated meanwhile is ignored).
    opening: Mutex<HashSet<RegionId>>,
    kafka_client: OnceCell<Arc<Client>>,
    kafka_stores: tokio::sync::Mutex<HashMap<String, Arc<TopicStore>>>,
    raft_engine: OnceCell<RaftEngineLogStore>,
    /// Dropped regions being deleted (a drop instruction repeated meanwhile is ignored).
    dropping: Mutex<HashSet<RegionId>>,
    /// Dropped regions deleted and not yet reported in an answered heartbeat.
    dropped: Mutex<BTreeSet<RegionId>>,
    /// Regions of dropped tables this process closed or deleted: a write to one is answered that it was dropped.
    /// Region ids are never reused; the oldest (lowest) are forgotten past [`REMEMBERED_DROPS`].
    dropped_regions: Mutex<BTreeSet<RegionId>>,
    /// Regions refused because their WAL tail was lost with their topic (reported in every heartbeat).
    wal_lost: Mutex<BTreeMap<RegionId, WalLost>>,
    /// Reads topic incarnations (`None`: not checked).
    topic_ids: Option<Arc<dyn TopicIds>>,
    stopped: AtomicBool,
    /// Regions closed and not yet reported in an answered heartbeat, with the last entry id each acknowledged.
    closed: Mutex<BTreeMap<RegionId, EntryId>>,
    /// The count of the last heartbeat built ([`HeartbeatRequest::seq`]).
    heartbeat_seq: AtomicU64,
    /// Woken when something happened that the metasrv should hear of before the next interval: a region opened
    /// (it gets its lease only once reported) or closed (its old lease stops holding another datanode back).
    report_soon: tokio::sync::Notify,
}

impl Datanode {
    /// A datanode with no region open; it writes as incarnation 0 until [`Datanode::set_incarnation`].
    pub fn new(options: DatanodeOptions) -> Self {
        let topic_ids = match (&options.topic_ids, &options.partitions, &options.kafka) {
            (Some(ids), _, _) => Some(ids.clone()),
            (None, None, Some(kafka)) => {
                Some(Arc::new(BrokerTopicIds::new(kafka.clone())) as Arc<dyn TopicIds>)
            }
            _ => None,
        };
        Datanode {
            storage: RegionStorage::new(options.region_storage.clone()),
            options,
            incarnation: AtomicU64::new(0),
            regions: RwLock::new(HashMap::new()),
            opening: Mutex::new(HashSet::new()),
            kafka_client: OnceCell::new(),
            kafka_stores: tokio::sync::Mutex::new(HashMap::new()),
            raft_engine: OnceCell::new(),
            dropping: Mutex::new(HashSet::new()),
            dropped: Mutex::new(BTreeSet::new()),
            wal_lost: Mutex::new(BTreeMap::new()),
            dropped_regions: Mutex::new(BTreeSet::new()),
            topic_ids,
            stopped: AtomicBool::new(false),
            closed: Mutex::new(BTreeMap::new()),
            heartbeat_seq: AtomicU64::new(0),
            report_soon: tokio::sync::Notify::new(),
        }
    }

    /// Its options.
    pub fn options(&self) -> &DatanodeOptions {
        &self.options
    }

    /// Its region storage.
    pub fn storage(&self) -> &RegionStorage {
        &self.storage
    }

    /// The incarnation registration gave it (set before any region opens: its WAL writer id comes from it).
    pub fn set_incarnation(&self, incarnation: u64) {
        self.incarnation.store(incarnation, Ordering::SeqCst);
    }

    /// Its incarnation (0 before registration).
    pub fn incarnation(&self) -> u64 {
        self.incarnation.load(Ordering::SeqCst)
    }

    /// Stops serving: every region gives up its lease; writes are refused from now on.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        for region in self.all_regions() {
            region.revoke();
        }
    }

    /// Whether [`Datanode::stop`] ran.
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    fn all_regions(&self) -> Vec<Arc<Region>> {
        self.regions
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    fn region(&self, region_id: RegionId) -> Result<Arc<Region>> {
        let open = self
            .regions
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&region_id)
            .cloned();
        open.ok_or_else(|| {
            let dropped = self
                .dropped_regions
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .contains(&region_id);
            if dropped {
                RegionDroppedSnafu {
                    region_id,
                    datanode_id: self.options.id,
                }
                .build()
            } else {
                RegionNotOpenSnafu {
                    region_id,
                    datanode_id: self.options.id,
                    leader: None::<String>,
                }
                .build()
            }
        })
    }

    /// Remembers that `region_id`'s table was dropped (writes to it are answered so).
    fn remember_dropped(&self, region_id: RegionId) {
        let mut dropped = self
            .dropped_regions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        dropped.insert(region_id);
        while dropped.len() > REMEMBERED_DROPS {
            dropped.pop_first();
        }
    }

    /// The heartbeat to send now: every open region with its role, epoch and entry ids.
    pub fn heartbeat_request(&self) -> HeartbeatRequest {
        self.heartbeat_request_early(false)
    }

    /// [`Datanode::heartbeat_request`], saying whether it goes out before its interval is up
    /// ([`HeartbeatRequest::early`]).
    pub fn heartbeat_request_early(&self, early: bool) -> HeartbeatRequest {
        let now = Instant::now();
        let mut regions: Vec<_> = self.all_regions().iter().map(|r| r.stat(now)).collect();
        regions.sort_by_key(|r| r.region_id);
        HeartbeatRequest {
            datanode_id: self.options.id,
            incarnation: self.incarnation(),
            address: self.options.address.clone(),
            heartbeat_interval_ms: u64::try_from(self.options.heartbeat_interval.as_millis())
                .unwrap_or(u64::MAX),
            regions,
            dropped: self
                .dropped
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter()
                .copied()
                .collect(),
            wal_lost: self.wal_lost(),
            seq: self.heartbeat_seq.fetch_add(1, Ordering::SeqCst) + 1,
            early,
            closed: self
                .closed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter()
                .map(|(region_id, last_entry_id)| ClosedRegion {
                    region_id: *region_id,
                    last_entry_id: *last_entry_id,
                })
                .collect(),
        }
    }

    /// Resolves once a region opened or closed since the last heartbeat was built (at once if one did while
    /// nobody waited): the heartbeat loop then reports it without waiting for the interval.
    pub async fn report_wanted(&self) {
        self.report_soon.notified().await;
    }

    /// The regions refused because their WAL tail was lost with their topic.
    pub fn wal_lost(&self) -> Vec<WalLost> {
        self.wal_lost
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    /// Whether `open` was refused before for the same lost incarnation (the answer cannot change: a topic id is
    /// never given again).
    fn known_lost(&self, open: &RegionToOpen) -> bool {
        let lost = self
            .wal_lost
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        lost.get(&open.request.region_id).is_some_and(|l| {
            Some(l.expected) == open.topic_id && Some(l.checkpoint) == open.checkpoint
        })
    }

    /// A heartbeat reporting `closed` was answered: the metasrv has recorded those closes.
    pub fn closed_reported(&self, closed: &[ClosedRegion]) {
        let mut pending = self
            .closed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for c in closed {
            if pending.get(&c.region_id) == Some(&c.last_entry_id) {
                pending.remove(&c.region_id);
            }
        }
    }

    /// A heartbeat reporting `dropped` was answered: the metasrv has forgotten those regions.
    pub fn dropped_reported(&self, dropped: &[RegionId]) {
        let mut done = self
            .dropped
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for id in dropped {
            done.remove(id);
        }
    }

    /// Deletes what this datanode holds of a dropped region: it is closed, its region storage deleted and, when
    /// it wrote to this datanode's raft-engine WAL, its entries there. Reported in the next heartbeats until one is
    /// answered.
    pub async fn drop_region(&self, region_id: RegionId, raft_engine: bool) -> Result<()> {
        self.remember_dropped(region_id);
        self.close_region(region_id);
        self.storage.delete_region(region_id).await?;
        if raft_engine {
            let store = self
                .raft_engine
                .get_or_try_init(|| RaftEngineLogStore::open(&self.options.wal_dir))
                .await?;
            store.delete_region(region_id).await?;
        }
        self.dropped
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(region_id);
        tracing::info!(region_id, "dropped region deleted");
        Ok(())
    }

    /// Applies a heartbeat's answer, `sent_at` being when the heartbeat was sent: leases count from then. Opens
    /// and flushes run in the background (a long replay must not hold up the next heartbeat); closes at once.
    pub fn apply(self: &Arc<Self>, response: HeartbeatResponse, sent_at: Instant) {
        if self.is_stopped() {
            return;
        }
        for lease in &response.leases {
            if let Ok(region) = self.region(lease.region_id) {
                let deadline = sent_at + Duration::from_millis(lease.duration_ms);
                region.grant(lease.role, lease.epoch, deadline);
            }
        }
        let mut to_open = Vec::new();
        for instruction in response.instructions {
            match instruction {
                Instruction::Open(open) => {
                    let id = open.request.region_id;
                    if self.known_lost(&open) {
                        continue;
                    }
                    let fresh = self
                        .opening
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .insert(id);
                    if fresh {
                        to_open.push(open);
                    }
                }
                Instruction::Close { region_id, dropped } => {
                    if dropped {
                        self.remember_dropped(region_id);
                    }
                    if self.close_region(region_id) {
                        self.report_soon.notify_one();
                    }
                }
                Instruction::Drop {
                    region_id,
                    raft_engine,
                } => {
                    let fresh = self
                        .dropping
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .insert(region_id);
                    if fresh {
                        let me = self.clone();
                        tokio::spawn(async move {
                            if let Err(e) = me.drop_region(region_id, raft_engine).await {
                                tracing::warn!(region_id, error = %e, "cannot delete a dropped region");
                            }
                            me.dropping
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .remove(&region_id);
                        });
                    }
                }
                Instruction::Flush { region_id } => {
                    let me = self.clone();
                    tokio::spawn(async move {
                        if let Err(e) = me.flush(region_id).await {
                            tracing::warn!(region_id, error = %e, "the flush the metasrv asked for failed");
                        }
                    });
                }
            }
        }
        if !to_open.is_empty() {
            let me = self.clone();
            tokio::spawn(async move {
                let ids: Vec<RegionId> = to_open.iter().map(|o| o.request.region_id).collect();
                for (region_id, result) in me.open_regions(to_open).await {
                    match result {
                        Ok(()) => tracing::info!(region_id, "region opened"),
                        Err(e) => tracing::warn!(region_id, error = %e, "cannot open the region"),
                    }
                }
                {
                    let mut opening = me
                        .opening
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    for id in ids {
                        opening.remove(&id);
                    }
                }
                me.report_soon.notify_one();
            });
        }
    }

    /// Reopens the regions whose last append's outcome was unknown, from storage and their WAL; returns how many.
    pub async fn reopen_poisoned(&self) -> usize {
        let poisoned: Vec<Arc<Region>> = self
            .all_regions()
            .into_iter()
            .filter(|r| r.lease().needs_reopen)
            .collect();
        let mut reopened = 0;
        for region in poisoned {
            let mut from = region.opened_from.clone();
            // It was opened before: its start is a checkpoint, never the topic's end again.
            from.checkpoint = Some(region.counters().flushed_entry_id);
            from.topic_region_key = true;
            // No append or flush of it runs while it is replaced.
            let memtable = region.memtable.lock().await;
            self.regions
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&region.id);
            drop(memtable);
            for (region_id, result) in self.open_regions(vec![from]).await {
                match result {
                    Ok(()) => reopened += 1,
                    Err(e) => tracing::warn!(region_id, error = %e, "cannot reopen the region"),
                }
            }
        }
        reopened
    }

    /// Closes a region (its lease ends at once; its WAL store stops taking its appends); whether it was open. A
    /// write of it in flight is not acknowledged once this returned, so a heartbeat built afterwards, which no
    /// longer reports the region, tells the metasrv that nothing of this datanode's lease on it can be
    /// acknowledged any more.
    pub fn close_region(&self, region_id: RegionId) -> bool {
        let removed = self
            .regions
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&region_id);
        if let Some(region) = removed {
            region.revoke();
            self.closed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(region_id, region.counters().last_entry_id);
            if let RegionWal::Kafka { store, .. } = &region.wal {
                store.unregister_region(region_id);
            }
            tracing::info!(region_id, "region closed");
            return true;
        }
        false
    }

    /// The WAL of an open request (opening the Kafka or raft-engine store on first need).
    async fn wal_of(&self, open: &RegionToOpen) -> Result<RegionWal> {
        let region_id = open.request.region_id;
        let encoded = open.request.options.get(WAL_OPTIONS_KEY).ok_or_else(|| {
            RegionWalSnafu {
                region_id,
                reason: format!("its options carry no '{WAL_OPTIONS_KEY}'"),
            }
            .build()
        })?;
        let options = WalOptions::decode(encoded)?;
        match options {
            WalOptions::RaftEngine => {
                let store = self
                    .raft_engine
                    .get_or_try_init(|| RaftEngineLogStore::open(&self.options.wal_dir))
                    .await?;
                Ok(RegionWal::RaftEngine(store.clone()))
            }
            WalOptions::Kafka(kafka) => {
                let store = self.kafka_store(region_id, &kafka.topic).await?;
                Ok(RegionWal::Kafka {
                    topic: kafka.topic,
                    store,
                })
            }
            _ => Ok(RegionWal::Noop),
        }
    }

    async fn kafka_store(&self, region_id: RegionId, topic: &str) -> Result<Arc<TopicStore>> {
        let Some(kafka) = &self.options.kafka else {
            return RegionWalSnafu {
                region_id,
                reason: format!(
                    "its WAL is Kafka topic '{topic}' but this datanode's [wal] is not Kafka"
                ),
            }
            .fail();
        };
        let mut stores = self.kafka_stores.lock().await;
        if let Some(store) = stores.get(topic) {
            return Ok(store.clone());
        }
        let partition: Arc<dyn PartitionLog> = match &self.options.partitions {
            Some(factory) => factory(topic),
            None => {
                let client = self
                    .kafka_client
                    .get_or_try_init(|| connect_client(kafka))
                    .await?;
                Arc::new(RsKafkaPartition::new(client, topic, call_bound(kafka)).await?)
            }
        };
        let store = Arc::new(KafkaLogStore::with_writer(
            partition,
            KafkaLogStoreConfig::for_kafka(kafka)?,
            writer_id(self.options.id, self.incarnation()),
        ));
        store.restrict_to_registered();
        stores.insert(topic.to_string(), store.clone());
        Ok(store)
    }

    /// Opens `regions` (as follower: a lease comes with the next heartbeat), replaying the Kafka regions of one
    /// topic in one read of it. Returns each region's outcome; an already open region is left as it is.
    pub async fn open_regions(&self, regions: Vec<RegionToOpen>) -> Vec<(RegionId, Result<()>)> {
        let mut out = Vec::new();
        let mut by_topic: BTreeMap<String, Vec<(RegionToOpen, RegionWal)>> = BTreeMap::new();
        for open in regions {
            let region_id = open.request.region_id;
            if self.region(region_id).is_ok() {
                out.push((region_id, Ok(())));
                continue;
            }
            match self.wal_of(&open).await {
                Ok(wal @ RegionWal::Kafka { .. }) => {
                    let RegionWal::Kafka { topic, .. } = &wal else {
                        continue;
                    };
                    if !open.topic_region_key {
                        let error = NoTopicRegionKeySnafu {
                            region_id,
                            topic: topic.clone(),
                        }
                        .build();
                        out.push((region_id, Err(error)));
                        continue;
                    }
                    by_topic.entry(topic.clone()).or_default().push((open, wal));
                }
                Ok(wal) => {
                    let result = self.open_local(open, wal).await;
                    out.push((region_id, result));
                }
                Err(e) => out.push((region_id, Err(e))),
            }
        }
        for (_, group) in by_topic {
            out.extend(self.open_kafka_group(group).await);
        }
        out
    }

    /// Opens a raft-engine or noop region.
    async fn open_local(&self, open: RegionToOpen, wal: RegionWal) -> Result<()> {
        let region_id = open.request.region_id;
        let stored = self.storage.read(region_id).await?;
        let mut start = stored.flushed_entry_id;
        let mut replayed = Vec::new();
        let mut last = start;
        if let RegionWal::RaftEngine(store) = &wal {
            start = start.max(store.flushed_entry_id(region_id).await?);
            replayed = store.read(region_id, start.saturating_add(1)).await?;
            last = store.last_entry_id(region_id).await?.max(start);
        }
        self.install(open, wal, start, last, replayed);
        Ok(())
    }

    /// Opens the regions of one topic, replaying them in one read.
    async fn open_kafka_group(
        &self,
        group: Vec<(RegionToOpen, RegionWal)>,
    ) -> Vec<(RegionId, Result<()>)> {
        let mut out = Vec::new();
        let Some((_, RegionWal::Kafka { store, .. })) = group.first() else {
            return out;
        };
        let store = store.clone();
        let incarnation = match &self.topic_ids {
            None => TopicIncarnation::Unknown,
            Some(ids) => match ids.incarnation(store.topic()).await {
                Ok(found) => found,
                Err(e) => return failing(group, &format!("cannot read its topic's id: {e}")),
            },
        };
        // Regions whose checkpoint counts another incarnation than the brokers serve are refused: their entries
        // after the checkpoint went with the old topic, and the new one's positions mean nothing to them.
        let mut group = group;
        group.retain(|(open, _)| {
            let region_id = open.request.region_id;
            let (Some(expected), Some(checkpoint)) = (open.topic_id, open.checkpoint) else {
                return true;
            };
            let found = match incarnation {
                TopicIncarnation::Unknown => return true,
                TopicIncarnation::Id(id) if id == expected => return true,
                TopicIncarnation::Id(id) => Some(id),
                TopicIncarnation::Gone => None,
            };
            let lost = WalLost {
                region_id,
                topic: store.topic().to_string(),
                checkpoint,
                expected,
                found,
            };
            self.wal_lost
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(region_id, lost.clone());
            out.push((region_id, Err(WalTailLostSnafu { lost }.build())));
            false
        });
        if group.is_empty() {
            return out;
        }
        let end = match store.end_entry_id().await {
            Ok(end) => end,
            Err(e) => {
                // With the regions refused above: every region of the group gets its outcome.
                out.extend(failing(group, &format!("cannot read its topic's end: {e}")));
                return out;
            }
        };
        let mut starts = BTreeMap::new();
        let mut ready = Vec::new();
        for (open, wal) in group {
            let region_id = open.request.region_id;
            let stored = match self.storage.read(region_id).await {
                Ok(stored) => stored,
                Err(e) => {
                    out.push((region_id, Err(e)));
                    continue;
                }
            };
            let start = match open.checkpoint {
                // Never opened: nothing of it is in the topic; it starts at the end.
                None => stored.flushed_entry_id.max(open.pruned_entry_id).max(end),
                Some(c) => stored.flushed_entry_id.max(c).max(open.pruned_entry_id),
            };
            starts.insert(region_id, start.saturating_add(1));
            ready.push((open, wal, start));
        }
        let mut replayed = match store.read_regions_counted(&starts).await {
            Ok((entries, _)) => entries,
            Err(e) => {
                let message = e.to_string();
                for (open, _, _) in ready {
                    let error = RegionWalSnafu {
                        region_id: open.request.region_id,
                        reason: format!("replay failed: {message}"),
                    }
                    .build();
                    out.push((open.request.region_id, Err(error)));
                }
                return out;
            }
        };
        for (mut open, wal, start) in ready {
            let region_id = open.request.region_id;
            // The incarnation its entry ids now count, reported with its stats and recorded with its checkpoint.
            open.topic_id = match incarnation {
                TopicIncarnation::Id(id) => Some(id),
                _ => open.topic_id,
            };
            self.wal_lost
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&region_id);
            let entries = replayed.remove(&region_id).unwrap_or_default();
            let last = entries.last().map_or(start, |e| e.entry_id).max(start);
            // Its previous leader closed it having acknowledged up to `expected`: a replay that ends below that
            // missed acknowledged entries. Leading it would lose them; it stays closed.
            if let Some(expected) = open.expected_last_entry_id
                && last < expected
            {
                let error = RegionWalSnafu {
                    region_id,
                    reason: format!(
                        "its replay of topic '{}' ends at entry {last}, but its previous leader acknowledged up \
                         to entry {expected}: not opened",
                        store.topic()
                    ),
                }
                .build();
                out.push((region_id, Err(error)));
                continue;
            }
            self.install(open, wal, start, last, entries);
            out.push((region_id, Ok(())));
        }
        out
    }

    fn install(
        &self,
        open: RegionToOpen,
        wal: RegionWal,
        flushed: EntryId,
        last: EntryId,
        replayed: Vec<Entry>,
    ) {
        let region_id = open.request.region_id;
        let bytes: usize = replayed.iter().map(|e| e.data.len()).sum();
        let counters = RegionCounters {
            last_entry_id: last,
            flushed_entry_id: flushed,
            memtable_bytes: bytes as u64,
        };
        let memtable = Memtable {
            entries: replayed,
            bytes,
        };
        let region = Arc::new(Region::new(region_id, wal, open, memtable, counters));
        self.regions
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(region_id, region);
    }

    /// Appends `entries` to the region's WAL and acknowledges them (their entry ids) only if the WAL did before
    /// the region's lease deadline. A region past its flush threshold flushes first (the write waits).
    pub async fn write(&self, region_id: RegionId, entries: Vec<Vec<u8>>) -> Result<Vec<EntryId>> {
        let region = self.region(region_id)?;
        let mut memtable = region.memtable.lock().await;
        if memtable.bytes as u64 >= self.options.flush_threshold
            && self.writable_until(&region, Instant::now()).is_some()
        {
            self.flush_locked(&region, &mut memtable).await?;
        }
        let now = Instant::now();
        let Some(deadline) = self.writable_until(&region, now) else {
            return self.not_leader(&region, now);
        };
        self.fence_before_first_write(&region, &mut memtable, deadline)
            .await?;
        let bytes: usize = entries.iter().map(Vec::len).sum();
        let appended = match &region.wal {
            RegionWal::Kafka { store, .. } => {
                append_until(store.as_ref(), region_id, &entries, deadline).await
            }
            RegionWal::RaftEngine(store) => {
                append_until(store, region_id, &entries, deadline).await
            }
            RegionWal::Noop => {
                let first = region.counters().last_entry_id + 1;
                Ok((first..first + entries.len() as u64).collect())
            }
        };
        let ids = match appended {
            // Closed meanwhile (revoked): the metasrv may already have heard that this datanode no longer holds
            // the region and let another open it, whose replay may not see this append.
            Ok(_) if region.lease().writable_until(Instant::now()).is_none() => {
                region.poison();
                return OutcomeUnknownSnafu {
                    region_id,
                    reason: "the region was closed or its lease ran out while the WAL took the append",
                }
                .fail();
            }
            Ok(ids) if Instant::now() < deadline => ids,
            Ok(_) => {
                region.poison();
                return OutcomeUnknownSnafu {
                    region_id,
                    reason: "the WAL acknowledged the append after the region's lease ran out",
                }
                .fail();
            }
            Err(reason) => {
                region.poison();
                return OutcomeUnknownSnafu { region_id, reason }.fail();
            }
        };
        for (id, data) in ids.iter().zip(entries) {
            memtable.entries.push(Entry {
                region_id,
                entry_id: *id,
                data,
            });
        }
        memtable.bytes += bytes;
        let last = ids.last().copied().unwrap_or(0);
        let memtable_bytes = memtable.bytes as u64;
        region.update_counters(|c| {
            c.last_entry_id = c.last_entry_id.max(last);
            c.memtable_bytes = memtable_bytes;
        });
        Ok(ids)
    }

    /// Before a Kafka region's first entry at a region epoch above 0 that it has not fenced yet (it leads after a
    /// move, or again after a restart): appends a fence record at that epoch to the topic, at offset `F`, then
    /// reads the region's records between its last entry and `F` into its memtable. From `F` on, every replay
    /// ignores the region's records of a lower epoch (a deposed leader's late appends); the records before `F`
    /// that this datanode's open replay did not see (appends of the old leader that landed after it read the
    /// topic, which the old leader never acknowledged: it acknowledges only before its deadline) are taken in, so
    /// the memtable holds what any later replay will find. The memtable lock is held throughout.
    async fn fence_before_first_write(
        &self,
        region: &Region,
        memtable: &mut Memtable,
        deadline: Instant,
    ) -> Result<()> {
        let RegionWal::Kafka { store, .. } = &region.wal else {
            return Ok(());
        };
        let epoch = region.lease().epoch;
        if epoch == 0 || region.fenced_epoch() >= epoch {
            return Ok(());
        }
        let region_id = region.id;
        let fenced =
            tokio::time::timeout_at(deadline.into(), store.append_fence(region_id, epoch)).await;
        // A fence whose outcome is unknown, or a read that fails after it, leaves the region's state unknown: it
        // reopens (a full replay), as after an append of unknown outcome.
        let fence_id = match fenced {
            Ok(Ok(id)) => id,
            Ok(Err(e)) => {
                region.poison();
                return OutcomeUnknownSnafu {
                    region_id,
                    reason: format!("its fence record at epoch {epoch}: {e}"),
                }
                .fail();
            }
            Err(_) => {
                region.poison();
                return OutcomeUnknownSnafu {
                    region_id,
                    reason: format!(
                        "its fence record at epoch {epoch} was not acknowledged before the region's lease ran out"
                    ),
                }
                .fail();
            }
        };
        let last = region.counters().last_entry_id;
        let from = BTreeMap::from([(region_id, last + 1)]);
        let read = store.read_regions_fenced(&from, &BTreeMap::new()).await;
        let mut read = match read {
            Ok((read, _)) => read,
            Err(e) => {
                region.poison();
                return OutcomeUnknownSnafu {
                    region_id,
                    reason: format!("reading up to its fence record at epoch {epoch}: {e}"),
                }
                .fail();
            }
        };
        let late: Vec<Entry> = read
            .remove(&region_id)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.entry_id < fence_id && e.entry_id > last)
            .collect();
        if let Some(newest) = late.last().map(|e| e.entry_id) {
            let bytes: usize = late.iter().map(|e| e.data.len()).sum();
            memtable.bytes += bytes;
            memtable.entries.extend(late);
            let memtable_bytes = memtable.bytes as u64;
            region.update_counters(|c| {
                c.last_entry_id = c.last_entry_id.max(newest);
                c.memtable_bytes = memtable_bytes;
            });
        }
        region.set_fenced_epoch(epoch);
        tracing::info!(
            region_id,
            epoch,
            fence_entry_id = fence_id,
            "region fenced at its new epoch"
        );
        Ok(())
    }

    fn writable_until(&self, region: &Region, now: Instant) -> Option<Instant> {
        if self.is_stopped() {
            return None;
        }
        region.lease().writable_until(now)
    }

    fn not_leader<T>(&self, region: &Region, now: Instant) -> Result<T> {
        let lease = region.lease();
        let why = if self.is_stopped() {
            "this datanode stopped serving"
        } else if lease.needs_reopen {
            "the region is reopening after a write of unknown outcome"
        } else if lease.deadline.is_some_and(|d| d <= now) {
            "its lease ran out"
        } else {
            "it holds no lease"
        };
        NotLeaderSnafu {
            region_id: region.id,
            datanode_id: self.options.id,
            why,
            leader: None::<String>,
        }
        .fail()
    }

    /// Flushes the region's unflushed entries to region storage (durable first), then moves its flushed entry id.
    pub async fn flush(&self, region_id: RegionId) -> Result<FlushReport> {
        let region = self.region(region_id)?;
        let mut memtable = region.memtable.lock().await;
        self.flush_locked(&region, &mut memtable).await
    }

    async fn flush_locked(&self, region: &Region, memtable: &mut Memtable) -> Result<FlushReport> {
        let region_id = region.id;
        // Region storage is shared: only the lease holder publishes a flush, and only before its lease's deadline
        // (a deposed datanode's file would otherwise claim entries of the new leader's as flushed).
        let now = Instant::now();
        let Some(deadline) = self.writable_until(region, now) else {
            return self.not_leader(region, now);
        };
        let counters = region.counters();
        // On Kafka the region has no entry between its last and the topic's end (no append runs while the
        // memtable is held), so it is flushed up to that end: an idle region never pins its topic.
        let flushed = match &region.wal {
            RegionWal::Kafka { store, .. } => store.end_entry_id().await?,
            RegionWal::RaftEngine(_) | RegionWal::Noop => counters.last_entry_id,
        }
        .max(counters.flushed_entry_id);
        let entries = std::mem::take(&mut memtable.entries);
        let n = entries.len();
        if flushed > counters.flushed_entry_id || n > 0 {
            if let Err(e) = self
                .storage
                .flush(region_id, entries.clone(), flushed, Some(deadline))
                .await
            {
                memtable.entries = entries;
                return Err(e);
            }
            if let RegionWal::RaftEngine(store) = &region.wal
                && flushed > 0
            {
                store.flush(region_id, flushed).await?;
            }
        }
        memtable.bytes = 0;
        region.update_counters(|c| {
            c.flushed_entry_id = flushed;
            c.memtable_bytes = 0;
        });
        Ok(FlushReport {
            region_id,
            entries: n,
            flushed_entry_id: flushed,
        })
    }

    /// Every entry of an open region as a reopening datanode would see it: what region storage holds, then the
    /// entries replayed or written since (its memtable), in entry-id order.
    pub async fn region_entries(&self, region_id: RegionId) -> Result<Vec<Entry>> {
        let region = self.region(region_id)?;
        let memtable = region.memtable.lock().await;
        let mut entries = self.storage.read(region_id).await?.entries;
        let flushed = entries.last().map_or(0, |e| e.entry_id);
        entries.extend(
            memtable
                .entries
                .iter()
                .filter(|e| e.entry_id > flushed)
                .cloned(),
        );
        Ok(entries)
    }

    /// Every open region, by id.
    pub fn regions(&self) -> Vec<RegionInfo> {
        let now = Instant::now();
        let mut out: Vec<RegionInfo> = self
            .all_regions()
            .iter()
            .map(|r| {
                let stat = r.stat(now);
                let left = r.lease().writable_until(now).map_or(0, |d| {
                    u64::try_from((d - now).as_millis()).unwrap_or(u64::MAX)
                });
                RegionInfo {
                    region_id: r.id,
                    role: stat.role,
                    epoch: stat.epoch,
                    wal: r.wal.describe(),
                    last_entry_id: stat.last_entry_id,
                    flushed_entry_id: stat.flushed_entry_id,
                    memtable_bytes: stat.memtable_bytes,
                    lease_left_ms: left,
                }
            })
            .collect();
        out.sort_by_key(|r| r.region_id);
        out
    }
}

/// Appends under a timeout ending at `deadline`; `Err` carries why the outcome is unknown.
async fn append_until<S: LogStore + ?Sized>(
    store: &S,
    region_id: RegionId,
    entries: &[Vec<u8>],
    deadline: Instant,
) -> std::result::Result<Vec<EntryId>, String> {
    let batch = entries
        .iter()
        .map(|data| EntryToWrite {
            region_id,
            data: data.clone(),
        })
        .collect();
    let left = deadline.saturating_duration_since(Instant::now());
    match tokio::time::timeout(left, store.append(batch)).await {
        Ok(Ok(appended)) => Ok(appended.into_iter().map(|a| a.entry_id).collect()),
        Ok(Err(e)) => Err(format!("the append failed: {e}")),
        Err(_) => Err(format!(
            "the append did not finish within the lease's remaining {} ms",
            left.as_millis()
        )),
    }
}

/// Each region of `group` failing to open for `reason`.
fn failing(group: Vec<(RegionToOpen, RegionWal)>, reason: &str) -> Vec<(RegionId, Result<()>)> {
    group
        .into_iter()
        .map(|(open, _)| {
            let region_id = open.request.region_id;
            let error = RegionWalSnafu {
                region_id,
                reason: reason.to_string(),
            }
            .build();
            (region_id, Err(error))
        })
        .collect()
}
