//! The datanode runtime on in-memory Kafka partitions and a temporary region storage: leases gate writes, a late
//! append is never acknowledged and makes the region reopen whole, two writers of one region (a zombie beside the
//! lease holder) both replay, flush plus replay rebuild a region after a restart, a new region starts at its
//! topic's end, a region without its `__topic_region` key is not opened, the flush threshold flushes first, and
//! a new leader at a higher region epoch fences the old one out before its first write.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datanode::error::Error;
use datanode::log_store::kafka::{FetchedRecord, PartitionLog};
use datanode::log_store::memory_partition::MemoryPartition;
use datanode::log_store::record::EncodedRecord;
use datanode::runtime::PartitionFactory;
use datanode::{Datanode, DatanodeOptions};
use remote_wal::datanode::RegionOpenRequest;
use remote_wal::datanode::protocol::{
    ClosedRegion, HeartbeatResponse, Instruction, RegionLease, RegionRole, RegionToOpen,
};
use remote_wal::wal::{KafkaConfig, WAL_OPTIONS_KEY};

mod incarnation;

const TOPIC: &str = "runtime_topic";
const REGION: u64 = (1024 << 32) | 1;

/// A partition whose produce calls take `delay_ms` longer (the broker's answer arriving late), and whose answers
/// wait while `hold` says so.
#[derive(Debug)]
struct SlowPartition {
    inner: Arc<MemoryPartition>,
    delay_ms: AtomicU64,
    hold: tokio::sync::watch::Sender<bool>,
}

#[async_trait]
impl PartitionLog for SlowPartition {
    fn topic(&self) -> &str {
        self.inner.topic()
    }

    async fn produce(
        &self,
        records: Vec<EncodedRecord>,
    ) -> remote_wal::wal::error::Result<Vec<i64>> {
        // The records land at once; the answer is late.
        let offsets = self.inner.produce(records).await;
        let delay = self.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        let mut hold = self.hold.subscribe();
        let _ = hold.wait_for(|held| !*held).await;
        offsets
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

/// The shared "brokers": one slowed in-memory partition per topic.
#[derive(Clone, Default)]
struct Brokers {
    topics: Arc<Mutex<HashMap<String, Arc<SlowPartition>>>>,
}

impl Brokers {
    fn partition(&self, topic: &str) -> Arc<SlowPartition> {
        self.topics
            .lock()
            .unwrap()
            .entry(topic.to_string())
            .or_insert_with(|| {
                Arc::new(SlowPartition {
                    inner: Arc::new(MemoryPartition::new(topic)),
                    delay_ms: AtomicU64::new(0),
                    hold: tokio::sync::watch::channel(false).0,
                })
            })
            .clone()
    }

    fn factory(&self) -> PartitionFactory {
        let brokers = self.clone();
        Arc::new(move |topic: &str| brokers.partition(topic) as Arc<dyn PartitionLog>)
    }
}

struct World {
    brokers: Brokers,
    storage: tempfile::TempDir,
}

impl World {
    fn new() -> Self {
        World {
            brokers: Brokers::default(),
            storage: tempfile::tempdir().unwrap(),
        }
    }

    /// A datanode (id 1) of incarnation `incarnation` on the shared partitions and storage.
    fn datanode(&self, incarnation: u64, flush_threshold: u64) -> Arc<Datanode> {
        let dn = Datanode::new(DatanodeOptions {
            id: 1,
            address: "127.0.0.1:1".to_string(),
            wal_dir: self.storage.path().join("wal"),
            region_storage: self.storage.path().join("regions"),
            kafka: Some(KafkaConfig::default()),
            heartbeat_interval: Duration::from_millis(100),
            flush_threshold,
            partitions: Some(self.brokers.factory()),
            topic_ids: None,
        });
        dn.set_incarnation(incarnation);
        Arc::new(dn)
    }
}

fn to_open(region: u64, checkpoint: Option<u64>) -> RegionToOpen {
    RegionToOpen {
        request: RegionOpenRequest {
            region_id: region,
            engine: "mito".to_string(),
            region_dir: format!("data/{region}/"),
            options: BTreeMap::from([(
                WAL_OPTIONS_KEY.to_string(),
                format!(r#"{{"wal.provider":"kafka","wal.kafka.topic":"{TOPIC}"}}"#),
            )]),
        },
        epoch: 0,
        topic_region_key: true,
        checkpoint,
        pruned_entry_id: 0,
        topic_id: None,
        expected_last_entry_id: None,
    }
}

async fn open(dn: &Datanode, region: u64, checkpoint: Option<u64>) {
    for (id, result) in dn.open_regions(vec![to_open(region, checkpoint)]).await {
        result.unwrap_or_else(|e| panic!("open {id}: {e}"));
    }
}

/// A lease on `region` lasting `ms` from now, as a heartbeat's answer brings it.
fn lease(dn: &Arc<Datanode>, region: u64, ms: u64) {
    let response = HeartbeatResponse {
        leases: vec![RegionLease {
            region_id: region,
            role: RegionRole::Leader,
            epoch: 0,
            duration_ms: ms,
        }],
        ..HeartbeatResponse::default()
    };
    dn.apply(response, Instant::now());
}

/// A leader lease on `region` at region epoch `epoch`, lasting a minute from now.
fn lease_at(dn: &Arc<Datanode>, region: u64, epoch: u64) {
    let response = HeartbeatResponse {
        leases: vec![RegionLease {
            region_id: region,
            role: RegionRole::Leader,
            epoch,
            duration_ms: 60_000,
        }],
        ..HeartbeatResponse::default()
    };
    dn.apply(response, Instant::now());
}

fn sequences(entries: &[datanode::log_store::Entry]) -> Vec<Vec<u8>> {
    entries.iter().map(|e| e.data.clone()).collect()
}

#[tokio::test]
async fn a_write_without_a_lease_is_refused_and_one_within_it_is_acknowledged() {
    let world = World::new();
    let dn = world.datanode(1, u64::MAX);
    let err = dn.write(REGION, vec![b"x".to_vec()]).await.unwrap_err();
    assert!(matches!(err, Error::RegionNotOpen { .. }), "{err}");
    open(&dn, REGION, Some(0)).await;
    let err = dn.write(REGION, vec![b"x".to_vec()]).await.unwrap_err();
    assert!(matches!(err, Error::NotLeader { .. }), "{err}");
    assert!(err.to_string().contains("holds no lease"), "{err}");
    lease(&dn, REGION, 60_000);
    let ids = dn
        .write(REGION, vec![b"a".to_vec(), b"b".to_vec()])
        .await
        .unwrap();
    assert_eq!(ids, vec![1, 2]);
    // A lease that ran out: refused again.
    let other = REGION + 1;
    open(&dn, other, Some(0)).await;
    lease(&dn, other, 50);
    tokio::time::sleep(Duration::from_millis(120)).await;
    let err = dn.write(other, vec![b"late".to_vec()]).await.unwrap_err();
    assert!(err.to_string().contains("lease ran out"), "{err}");
}

#[tokio::test]
async fn an_append_answered_after_the_deadline_is_not_acknowledged_and_the_region_reopens_whole() {
    let world = World::new();
    let dn = world.datanode(1, u64::MAX);
    open(&dn, REGION, Some(0)).await;
    lease(&dn, REGION, 60_000);
    dn.write(REGION, vec![b"first".to_vec()]).await.unwrap();
    // The broker takes the records at once but answers after the lease is over.
    world
        .brokers
        .partition(TOPIC)
        .delay_ms
        .store(400, Ordering::SeqCst);
    // A region whose lease was not renewed: the same region reopened (it replays "first") with a short lease.
    dn.close_region(REGION);
    open(&dn, REGION, Some(0)).await;
    lease(&dn, REGION, 150);
    let err = dn.write(REGION, vec![b"late".to_vec()]).await.unwrap_err();
    assert!(matches!(err, Error::OutcomeUnknown { .. }), "{err}");
    world
        .brokers
        .partition(TOPIC)
        .delay_ms
        .store(0, Ordering::SeqCst);
    // A fresh lease does not make it writable: it must reopen first, so its memtable is what the WAL holds.
    lease(&dn, REGION, 60_000);
    let err = dn.write(REGION, vec![b"x".to_vec()]).await.unwrap_err();
    assert!(err.to_string().contains("reopening"), "{err}");
    assert_eq!(dn.reopen_poisoned().await, 1);
    let entries = dn.region_entries(REGION).await.unwrap();
    assert_eq!(
        sequences(&entries),
        vec![b"first".to_vec(), b"late".to_vec()]
    );
    lease(&dn, REGION, 60_000);
    dn.write(REGION, vec![b"after".to_vec()]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_and_the_lease_holder_both_replay() {
    let world = World::new();
    let zombie = world.datanode(1, u64::MAX);
    open(&zombie, REGION, Some(0)).await;
    lease(&zombie, REGION, 60_000);
    zombie.write(REGION, vec![b"z1".to_vec()]).await.unwrap();
    // A new incarnation opens the region (replaying z1) while the old one still believes in its lease.
    let holder = world.datanode(2, u64::MAX);
    open(&holder, REGION, Some(0)).await;
    lease(&holder, REGION, 60_000);
    holder.write(REGION, vec![b"h1".to_vec()]).await.unwrap();
    zombie.write(REGION, vec![b"z2".to_vec()]).await.unwrap();
    holder.write(REGION, vec![b"h2".to_vec()]).await.unwrap();
    // A third reader sees every acknowledged entry once: counters of different writers never pass for copies.
    let reader = world.datanode(3, u64::MAX);
    open(&reader, REGION, Some(0)).await;
    let entries = reader.region_entries(REGION).await.unwrap();
    assert_eq!(
        sequences(&entries),
        vec![
            b"z1".to_vec(),
            b"h1".to_vec(),
            b"z2".to_vec(),
            b"h2".to_vec()
        ]
    );
}

#[tokio::test]
async fn flushed_and_replayed_entries_rebuild_the_region_after_a_restart() {
    let world = World::new();
    let dn = world.datanode(1, u64::MAX);
    open(&dn, REGION, Some(0)).await;
    lease(&dn, REGION, 60_000);
    let mut want = Vec::new();
    for i in 0..10u8 {
        dn.write(REGION, vec![vec![i]]).await.unwrap();
        want.push(vec![i]);
    }
    let flushed = dn.flush(REGION).await.unwrap();
    assert_eq!(flushed.entries, 10);
    assert_eq!(flushed.flushed_entry_id, 10);
    for i in 10..15u8 {
        dn.write(REGION, vec![vec![i]]).await.unwrap();
        want.push(vec![i]);
    }
    drop(dn);
    // The restart: a new incarnation, the checkpoint as the metasrv recorded it from a heartbeat.
    let dn = world.datanode(2, u64::MAX);
    open(&dn, REGION, Some(flushed.flushed_entry_id)).await;
    let region = dn
        .regions()
        .into_iter()
        .find(|r| r.region_id == REGION)
        .unwrap();
    assert_eq!(region.flushed_entry_id, 10);
    assert_eq!(region.last_entry_id, 15);
    assert_eq!(sequences(&dn.region_entries(REGION).await.unwrap()), want);
    // Even with a checkpoint that lags storage (a heartbeat that never got through), nothing comes twice.
    let dn = world.datanode(3, u64::MAX);
    open(&dn, REGION, Some(0)).await;
    assert_eq!(sequences(&dn.region_entries(REGION).await.unwrap()), want);
}

#[tokio::test]
async fn a_region_never_opened_starts_at_its_topics_end_and_an_idle_one_flushes_to_it() {
    let world = World::new();
    let dn = world.datanode(1, u64::MAX);
    let other = REGION + 7;
    open(&dn, other, Some(0)).await;
    lease(&dn, other, 60_000);
    dn.write(other, vec![b"o1".to_vec(), b"o2".to_vec(), b"o3".to_vec()])
        .await
        .unwrap();
    open(&dn, REGION, None).await;
    let region = dn
        .regions()
        .into_iter()
        .find(|r| r.region_id == REGION)
        .unwrap();
    assert_eq!(region.flushed_entry_id, 3, "it starts at the topic's end");
    assert_eq!(region.last_entry_id, 3);
    dn.write(other, vec![b"o4".to_vec()]).await.unwrap();
    // Without a lease it does not flush: region storage is shared, only the lease holder publishes there.
    let err = dn.flush(REGION).await.unwrap_err();
    assert!(matches!(err, Error::NotLeader { .. }), "{err}");
    // Idle, it flushes to the topic's end: it never pins the topic below what others wrote.
    lease(&dn, REGION, 60_000);
    let flushed = dn.flush(REGION).await.unwrap();
    assert_eq!(flushed.entries, 0);
    assert_eq!(flushed.flushed_entry_id, 4);
}

#[tokio::test]
async fn a_kafka_region_without_its_key_is_not_opened() {
    let world = World::new();
    let dn = world.datanode(1, u64::MAX);
    let mut open = to_open(REGION, None);
    open.topic_region_key = false;
    let results = dn.open_regions(vec![open]).await;
    let err = results[0].1.as_ref().unwrap_err();
    assert!(
        err.to_string().contains("no __topic_region key") && err.to_string().contains(TOPIC),
        "{err}"
    );
    let err = dn.write(REGION, vec![b"x".to_vec()]).await.unwrap_err();
    assert!(matches!(err, Error::RegionNotOpen { .. }), "{err}");
}

#[tokio::test]
async fn past_the_flush_threshold_a_write_flushes_first() {
    let world = World::new();
    let dn = world.datanode(1, 4096);
    open(&dn, REGION, Some(0)).await;
    lease(&dn, REGION, 60_000);
    for _ in 0..5 {
        dn.write(REGION, vec![vec![7u8; 3000]]).await.unwrap();
        let region = dn
            .regions()
            .into_iter()
            .find(|r| r.region_id == REGION)
            .unwrap();
        assert!(region.memtable_bytes <= 6000, "{region:?}");
    }
    let region = dn
        .regions()
        .into_iter()
        .find(|r| r.region_id == REGION)
        .unwrap();
    assert!(region.flushed_entry_id >= 4, "{region:?}");
    assert_eq!(dn.region_entries(REGION).await.unwrap().len(), 5);
}

/// The hand-over: the old leader (epoch 0) appends after the new one opened (its replay did not see that
/// entry); the new leader's first write at epoch 1 appends a fence record first and takes that entry in; an append
/// of the old leader after the fence is ignored by every later replay, while what the new leader holds is exactly
/// what a replay finds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_fences_its_epoch_before_its_first_write_and_replay_drops_the_old_leaders_later_appends()
 {
    let world = World::new();
    let old = world.datanode(1, u64::MAX);
    open(&old, REGION, Some(0)).await;
    lease_at(&old, REGION, 0);
    old.write(REGION, vec![b"o1".to_vec()]).await.unwrap();

    let new = world.datanode(2, u64::MAX);
    let mut moved = to_open(REGION, Some(0));
    moved.epoch = 1;
    for (id, result) in new.open_regions(vec![moved]).await {
        result.unwrap_or_else(|e| panic!("open {id}: {e}"));
    }
    // Landed after the new leader's replay read the topic.
    old.write(REGION, vec![b"o2".to_vec()]).await.unwrap();
    let records_before = world
        .brokers
        .partition(TOPIC)
        .inner
        .high_watermark()
        .await
        .unwrap();

    lease_at(&new, REGION, 1);
    new.write(REGION, vec![b"n1".to_vec()]).await.unwrap();
    // o2 (before the fence) is in the new leader's memtable; one fence record and n1 were appended.
    assert_eq!(
        sequences(&new.region_entries(REGION).await.unwrap()),
        vec![b"o1".to_vec(), b"o2".to_vec(), b"n1".to_vec()]
    );
    let records_after = world
        .brokers
        .partition(TOPIC)
        .inner
        .high_watermark()
        .await
        .unwrap();
    assert_eq!(records_after - records_before, 2, "the fence record and n1");
    // A second write does not fence again.
    new.write(REGION, vec![b"n2".to_vec()]).await.unwrap();
    assert_eq!(
        world
            .brokers
            .partition(TOPIC)
            .inner
            .high_watermark()
            .await
            .unwrap()
            - records_after,
        1
    );

    // The deposed leader appends after the fence (it still believes in its lease).
    old.write(REGION, vec![b"o3".to_vec()]).await.unwrap();
    let reader = world.datanode(3, u64::MAX);
    open(&reader, REGION, Some(0)).await;
    assert_eq!(
        sequences(&reader.region_entries(REGION).await.unwrap()),
        vec![
            b"o1".to_vec(),
            b"o2".to_vec(),
            b"n1".to_vec(),
            b"n2".to_vec()
        ],
        "the replay ignores the old epoch's append after the fence"
    );
}

/// `to_open` on the datanode's raft-engine WAL.
fn to_open_local(region: u64) -> RegionToOpen {
    let mut open = to_open(region, None);
    open.request.options.insert(
        WAL_OPTIONS_KEY.to_string(),
        r#"{"wal.provider":"raft_engine"}"#.to_string(),
    );
    open.topic_region_key = false;
    open
}

#[tokio::test]
async fn a_drop_instruction_deletes_the_regions_storage_and_wal_and_is_reported_until_answered() {
    let world = World::new();
    let dn = world.datanode(1, u64::MAX);
    const LOCAL: u64 = (1024 << 32) | 2;
    open(&dn, REGION, Some(0)).await;
    for (id, result) in dn.open_regions(vec![to_open_local(LOCAL)]).await {
        result.unwrap_or_else(|e| panic!("open {id}: {e}"));
    }
    for region in [REGION, LOCAL] {
        lease(&dn, region, 60_000);
        dn.write(region, vec![b"a".to_vec(), b"b".to_vec()])
            .await
            .unwrap();
        dn.flush(region).await.unwrap();
        dn.write(region, vec![b"c".to_vec()]).await.unwrap();
        assert!(dn.storage().region_dir(region).exists());
    }
    assert!(dn.heartbeat_request().dropped.is_empty());

    dn.apply(
        HeartbeatResponse {
            instructions: vec![
                Instruction::Drop {
                    region_id: REGION,
                    raft_engine: false,
                },
                Instruction::Drop {
                    region_id: LOCAL,
                    raft_engine: true,
                },
            ],
            ..HeartbeatResponse::default()
        },
        Instant::now(),
    );
    let mut reported = Vec::new();
    for _ in 0..600 {
        reported = dn.heartbeat_request().dropped;
        if reported.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(reported, vec![REGION, LOCAL]);
    for region in [REGION, LOCAL] {
        assert!(
            !dn.storage().region_dir(region).exists(),
            "region {region}'s storage is left"
        );
        assert!(dn.regions().iter().all(|r| r.region_id != region));
        let refused = dn.write(region, vec![b"late".to_vec()]).await;
        assert!(
            matches!(refused, Err(Error::RegionDropped { .. })),
            "a dropped region's write is answered so: {refused:?}"
        );
    }
    // The raft-engine WAL holds nothing of the dropped region: opened again, it is empty.
    for (id, result) in dn.open_regions(vec![to_open_local(LOCAL)]).await {
        result.unwrap_or_else(|e| panic!("open {id}: {e}"));
    }
    assert!(dn.region_entries(LOCAL).await.unwrap().is_empty());
    // A report that was answered is not sent again; a repeated instruction deletes nothing more and is reported.
    dn.dropped_reported(&reported);
    assert!(dn.heartbeat_request().dropped.is_empty());
    dn.drop_region(REGION, false).await.unwrap();
    assert_eq!(dn.heartbeat_request().dropped, vec![REGION]);
}

#[tokio::test]
async fn a_region_closed_for_a_drop_answers_writes_that_it_was_dropped_and_one_that_moved_that_it_is_not_here()
 {
    let world = World::new();
    let dn = world.datanode(1, u64::MAX);
    let moved = REGION + 1;
    for region in [REGION, moved] {
        open(&dn, region, Some(0)).await;
        lease(&dn, region, 60_000);
        dn.write(region, vec![b"a".to_vec()]).await.unwrap();
    }
    dn.apply(
        HeartbeatResponse {
            instructions: vec![
                Instruction::Close {
                    region_id: REGION,
                    dropped: true,
                },
                Instruction::Close {
                    region_id: moved,
                    dropped: false,
                },
            ],
            ..HeartbeatResponse::default()
        },
        Instant::now(),
    );
    let dropped = dn.write(REGION, vec![b"late".to_vec()]).await.unwrap_err();
    assert!(matches!(dropped, Error::RegionDropped { .. }), "{dropped}");
    assert!(!dropped.is_retryable());
    assert_eq!(
        dropped.to_string(),
        format!("region {REGION} was dropped with its table: it takes no more writes (datanode 1)")
    );
    let moved = dn.write(moved, vec![b"late".to_vec()]).await.unwrap_err();
    assert!(matches!(moved, Error::RegionNotOpen { .. }), "{moved}");
    assert!(moved.is_retryable());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_in_flight_when_its_region_closes_is_not_acknowledged_and_the_close_is_reported_at_once()
 {
    let world = World::new();
    let dn = world.datanode(1, u64::MAX);
    open(&dn, REGION, Some(0)).await;
    lease(&dn, REGION, 60_000);
    dn.write(REGION, vec![b"first".to_vec()]).await.unwrap();
    let before = dn.heartbeat_request();
    assert!(before.regions.iter().any(|r| r.region_id == REGION));
    // The broker takes the append at once and answers late; the region is closed while it waits.
    let partition = world.brokers.partition(TOPIC);
    let landed = partition.inner.high_watermark().await.unwrap();
    partition.hold.send_replace(true);
    let writer = {
        let dn = dn.clone();
        tokio::spawn(async move { dn.write(REGION, vec![b"in flight".to_vec()]).await })
    };
    for _ in 0..1_000 {
        if partition.inner.high_watermark().await.unwrap() > landed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        partition.inner.high_watermark().await.unwrap() > landed,
        "the append never reached the partition"
    );
    dn.apply(
        HeartbeatResponse {
            instructions: vec![Instruction::Close {
                region_id: REGION,
                dropped: false,
            }],
            ..HeartbeatResponse::default()
        },
        Instant::now(),
    );
    // The close is news for the metasrv: the heartbeat loop is woken at once; the next heartbeat, counted after
    // the last, no longer reports the region.
    tokio::time::timeout(Duration::from_secs(10), dn.report_wanted())
        .await
        .expect("the close wakes the heartbeat loop");
    let after = dn.heartbeat_request();
    assert!(after.seq > before.seq, "{} then {}", before.seq, after.seq);
    assert!(!after.regions.iter().any(|r| r.region_id == REGION));
    // Its lease had a minute left, but the region closed before the broker answered: not acknowledged.
    partition.hold.send_replace(false);
    let answered = tokio::time::timeout(Duration::from_secs(120), writer)
        .await
        .expect("the write ends")
        .expect("the write task ran");
    let err = answered.expect_err("a write finished after its region closed was acknowledged");
    assert!(matches!(err, Error::OutcomeUnknown { .. }), "{err}");
}

#[tokio::test]
async fn a_region_whose_replay_ends_below_what_its_previous_leader_acknowledged_is_not_opened() {
    let world = World::new();
    let old = world.datanode(1, u64::MAX);
    open(&old, REGION, Some(0)).await;
    lease(&old, REGION, 60_000);
    assert_eq!(
        old.write(REGION, vec![b"a".to_vec(), b"b".to_vec()])
            .await
            .unwrap(),
        vec![1, 2]
    );
    assert!(old.close_region(REGION));
    // The close goes out with the last entry id it acknowledged, until a heartbeat reporting it is answered.
    let report = old.heartbeat_request();
    assert_eq!(
        report.closed,
        vec![ClosedRegion {
            region_id: REGION,
            last_entry_id: 2
        }]
    );
    old.closed_reported(&report.closed);
    assert!(old.heartbeat_request().closed.is_empty());

    // The next leader is told to replay at least that far. Told more than the topic holds (acknowledged entries
    // missing from it), it refuses to open the region, naming both ids.
    let next = world.datanode(2, u64::MAX);
    let too_far = RegionToOpen {
        expected_last_entry_id: Some(3),
        ..to_open(REGION, Some(0))
    };
    let (_, result) = next
        .open_regions(vec![too_far])
        .await
        .pop()
        .expect("an outcome");
    let err = result.expect_err("opened although its replay ended below the acknowledged entries");
    let message = err.to_string();
    assert!(
        message.contains("ends at entry 2") && message.contains("up to entry 3"),
        "{message}"
    );
    assert!(matches!(
        next.write(REGION, vec![b"x".to_vec()]).await,
        Err(Error::RegionNotOpen { .. })
    ));
    let enough = RegionToOpen {
        expected_last_entry_id: Some(2),
        ..to_open(REGION, Some(0))
    };
    open_request_ok(&next, enough).await;
    assert_eq!(
        sequences(&next.region_entries(REGION).await.unwrap()),
        vec![b"a".to_vec(), b"b".to_vec()]
    );
}

async fn open_request_ok(dn: &Datanode, request: RegionToOpen) {
    for (id, result) in dn.open_regions(vec![request]).await {
        result.unwrap_or_else(|e| panic!("open {id}: {e}"));
    }
}
