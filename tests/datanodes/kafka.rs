//! Regions on a Kafka topic: create table writes their `__topic_region/{topic}/{region_id}` keys empty; a heartbeat
//! moves a reported region's checkpoint to its flushed entry id by compare-and-put and leases it only once that
//! checkpoint is stored; a region whose key is gone gets no lease, and no heartbeat writes its key again.

use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use remote_wal::key::topic_region::{TOPIC_REGION_PREFIX, TopicRegionValue, topic_region_key};
use remote_wal::kv::{
    CompareAndPutRequest, CompareAndPutResponse, KeyValue, KvWrapper, PutRequest,
};
use remote_wal::wal::WalOptions;

use super::*;

/// A memory store whose compare-and-puts on `__topic_region/` keys lose (as if another writer moved the key each
/// time) while `refuse` is set.
#[derive(Debug, Default)]
struct CheckpointGate {
    inner: MemoryKvBackend,
    refuse: AtomicBool,
}

#[async_trait]
impl KvWrapper for CheckpointGate {
    fn inner(&self) -> &dyn KvBackend {
        &self.inner
    }

    async fn compare_and_put(
        &self,
        req: CompareAndPutRequest,
    ) -> remote_wal::kv::Result<CompareAndPutResponse> {
        if self.refuse.load(Ordering::SeqCst) && req.key.starts_with(TOPIC_REGION_PREFIX.as_bytes())
        {
            return Ok(CompareAndPutResponse {
                success: false,
                prev_kv: self.inner.get(&req.key).await?,
            });
        }
        self.inner.compare_and_put(req).await
    }
}

/// Each region's `__topic_region` key, by region id.
fn topic_region_keys(created: &TableRegions) -> Vec<(u64, Vec<u8>)> {
    created
        .regions
        .iter()
        .map(|r| {
            let topic = match WalOptions::decode(&r.wal_options).expect("recorded WAL options") {
                WalOptions::Kafka(k) => k.topic,
                other => panic!("expected a Kafka topic, got {other:?}"),
            };
            (r.region_id, topic_region_key(&topic, r.region_id))
        })
        .collect()
}

/// The checkpoint stored in `key` (`None`: the key holds none), or `Err(())` when the key is absent.
async fn checkpoint(kv: &KvBackendRef, key: &[u8]) -> Result<Option<u64>, ()> {
    match kv.get(key).await.expect("kv readable") {
        None => Err(()),
        Some(found) => Ok(TopicRegionValue::decode(&found.key, &found.value)
            .expect("a topic region value")
            .flushed_entry_id()),
    }
}

#[tokio::test]
async fn create_table_writes_each_kafka_regions_topic_region_key_empty() {
    let kv = memory_kv();
    let m = kafka_metasrv(&kv, vec![1], 2).await;
    let created = create(&m, "kafka_keys", 3).await;
    let keys = topic_region_keys(&created);
    assert_eq!(keys.len(), 3);
    for (region_id, key) in &keys {
        let found = kv.get(key).await.unwrap().unwrap_or_else(|| {
            panic!(
                "region {region_id}: '{}' missing",
                String::from_utf8_lossy(key)
            )
        });
        assert!(
            found.value.is_empty(),
            "a new region's key holds no checkpoint: {found:?}"
        );
    }
    // The regions share the pool's topics: they are spread over both.
    let topics: BTreeSet<&[u8]> = keys
        .iter()
        .map(|(_, key)| &key[..key.iter().rposition(|b| *b == b'/').unwrap()])
        .collect();
    assert_eq!(topics.len(), 2, "{keys:?}");
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_reported_kafka_region_is_leased_only_once_its_checkpoint_is_stored() {
    let gate = Arc::new(CheckpointGate::default());
    let kv: KvBackendRef = gate.clone();
    let m = kafka_metasrv(&kv, vec![1], 2).await;
    let created = create(&m, "kafka_leases", 2).await;
    let keys = topic_region_keys(&created);
    let mine = regions_of(&created, 1);
    let registry = m.datanode_registry();
    registry.begin_term();
    registry
        .register(&register_request(1, "dn1:4001", 100))
        .await
        .unwrap();

    // The checkpoint cannot be written: no lease, and the keys stay as they were.
    gate.refuse.store(true, Ordering::SeqCst);
    let response = beat(registry, 1, 1, 100, &mine, 42).await;
    assert!(response.leases.is_empty(), "{response:?}");
    assert_eq!(response.leases_in_ms, None, "not held back: refused");
    for (_, key) in &keys {
        assert_eq!(checkpoint(&kv, key).await, Ok(None));
    }

    // Once it can: the checkpoint moves to the flushed entry id, and the lease comes with it.
    gate.refuse.store(false, Ordering::SeqCst);
    let response = beat(registry, 1, 1, 100, &mine, 42).await;
    assert_eq!(leased(&response), mine);
    for (_, key) in &keys {
        assert_eq!(checkpoint(&kv, key).await, Ok(Some(42)));
    }

    // It moves forward with later flushes, and never back.
    let request = heartbeat_request(1, 1, 100, vec![stat(mine[0], 50), stat(mine[1], 7)]);
    let response = registry
        .heartbeat(&request, &BTreeSet::new())
        .await
        .unwrap();
    assert_eq!(leased(&response), mine);
    let by_region: std::collections::HashMap<u64, Vec<u8>> = keys.into_iter().collect();
    assert_eq!(checkpoint(&kv, &by_region[&mine[0]]).await, Ok(Some(50)));
    assert_eq!(checkpoint(&kv, &by_region[&mine[1]]).await, Ok(Some(42)));
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_kafka_region_whose_key_was_deleted_gets_no_lease_and_its_key_is_not_recreated() {
    let kv = memory_kv();
    let m = kafka_metasrv(&kv, vec![1], 2).await;
    let created = create(&m, "kafka_dropped", 2).await;
    let keys = topic_region_keys(&created);
    let mine = regions_of(&created, 1);
    let registry = m.datanode_registry();
    registry.begin_term();
    registry
        .register(&register_request(1, "dn1:4001", 100))
        .await
        .unwrap();
    let response = beat(registry, 1, 1, 100, &mine, 5).await;
    assert_eq!(leased(&response), mine);

    // The first region's key goes (as a drop, or a repair, removes it).
    let gone_key = keys[0].1.clone();
    let (kept, kept_key) = keys[1].clone();
    kv.batch_delete(std::slice::from_ref(&gone_key), false)
        .await
        .unwrap();

    // A later checkpoint for it is not written: the key stays gone, and the region is not leased.
    let response = beat(registry, 1, 1, 100, &mine, 9).await;
    assert_eq!(leased(&response), vec![kept], "{response:?}");
    assert_eq!(
        checkpoint(&kv, &gone_key).await,
        Err(()),
        "the key was written again"
    );
    assert_eq!(checkpoint(&kv, &kept_key).await, Ok(Some(9)));
    assert!(
        !response
            .instructions
            .iter()
            .any(|i| matches!(i, remote_wal::datanode::protocol::Instruction::Open(_))),
        "{response:?}"
    );
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_kafka_region_whose_key_was_deleted_loses_its_lease_even_if_its_flushed_id_does_not_grow()
{
    let kv = memory_kv();
    let m = kafka_metasrv(&kv, vec![1], 2).await;
    let created = create(&m, "kafka_same_flush", 2).await;
    let keys = topic_region_keys(&created);
    let mine = regions_of(&created, 1);
    let registry = m.datanode_registry();
    registry.begin_term();
    registry
        .register(&register_request(1, "dn1:4001", 100))
        .await
        .unwrap();
    let response = beat(registry, 1, 1, 100, &mine, 5).await;
    assert_eq!(leased(&response), mine);
    for (_, key) in &keys {
        assert_eq!(checkpoint(&kv, key).await, Ok(Some(5)));
    }

    let gone_key = keys[0].1.clone();
    let (kept, kept_key) = keys[1].clone();
    kv.batch_delete(std::slice::from_ref(&gone_key), false)
        .await
        .unwrap();

    // The same flushed id as before: nothing to write, but the key is read again, and found gone.
    let response = beat(registry, 1, 1, 100, &mine, 5).await;
    assert_eq!(leased(&response), vec![kept], "{response:?}");
    assert_eq!(
        checkpoint(&kv, &gone_key).await,
        Err(()),
        "the key was written again"
    );
    assert_eq!(checkpoint(&kv, &kept_key).await, Ok(Some(5)));
    m.stop().await.unwrap();
}

#[tokio::test]
async fn region_to_open_by_id_carries_the_kafka_regions_key_and_checkpoint() {
    let kv = memory_kv();
    let m = kafka_metasrv(&kv, vec![1, 2], 2).await;
    let created = create(&m, "kafka_open", 2).await;
    let keys = topic_region_keys(&created);
    let registry = m.datanode_registry();
    registry.begin_term();

    let first = &created.regions[0];
    let (dn, to_open) = registry
        .region_to_open_by_id(first.region_id)
        .await
        .unwrap()
        .expect("routed");
    assert_eq!(dn, first.datanode_id);
    assert_eq!(
        (
            to_open.topic_region_key,
            to_open.checkpoint,
            to_open.pruned_entry_id
        ),
        (true, None, 0),
        "a new region: its key exists, with no checkpoint"
    );
    assert_eq!(
        to_open
            .request
            .options
            .get(remote_wal::wal::WAL_OPTIONS_KEY),
        Some(&first.wal_options)
    );

    // Its datanode reports it flushed to 17: the checkpoint is what a reopening reads.
    registry
        .register(&register_request(dn, "dn:4001", 100))
        .await
        .unwrap();
    beat(registry, dn, 1, 100, &[first.region_id], 17).await;
    let (_, to_open) = registry
        .region_to_open_by_id(first.region_id)
        .await
        .unwrap()
        .expect("routed");
    assert_eq!(
        (to_open.topic_region_key, to_open.checkpoint),
        (true, Some(17))
    );

    // Without its key, it says so (a datanode does not open it).
    kv.batch_delete(std::slice::from_ref(&keys[0].1), false)
        .await
        .unwrap();
    let (_, to_open) = registry
        .region_to_open_by_id(first.region_id)
        .await
        .unwrap()
        .expect("routed");
    assert_eq!(
        (to_open.topic_region_key, to_open.checkpoint),
        (false, None)
    );
    m.stop().await.unwrap();
}

/// A dropped table's regions get `Close` and no lease; a heartbeat reporting them flushed further does not write
/// their `__topic_region` keys back (a late checkpoint never resurrects a region); the drop finishes once the
/// datanode reports them closed, and the pool counts them no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_tables_regions_close_and_no_late_checkpoint_brings_their_keys_back() {
    let kv = memory_kv();
    let m = Arc::new(kafka_metasrv(&kv, vec![1], 2).await);
    let created = create(&m, "dropped", 2).await;
    let keys = topic_region_keys(&created);
    let registry = m.datanode_registry().clone();
    registry.begin_term();
    registry
        .register(&register_request(1, "dn1:4001", 100))
        .await
        .unwrap();
    let mine = regions_of(&created, 1);
    beat_until_leased(&registry, 1, 1, 100, &mine).await;
    let leading: Vec<RegionStat> = mine
        .iter()
        .map(|r| RegionStat {
            role: RegionRole::Leader,
            ..stat(*r, 3)
        })
        .collect();
    registry
        .heartbeat(
            &heartbeat_request(1, 1, 100, leading.clone()),
            &BTreeSet::new(),
        )
        .await
        .unwrap();
    let before = m.topics().await.unwrap();
    assert_eq!(before.topics.iter().map(|t| t.regions).sum::<usize>(), 2);

    let dropping = {
        let m = m.clone();
        tokio::spawn(async move { m.drop_table(table("dropped"), false).await })
    };
    // Still reported open and flushed further: no lease, Close saying the table is being dropped, and no key
    // written back.
    let mut closed = false;
    for _ in 0..POLLS {
        let late: Vec<RegionStat> = leading
            .iter()
            .map(|s| RegionStat {
                flushed_entry_id: 9,
                last_entry_id: 9,
                ..s.clone()
            })
            .collect();
        let answer = registry
            .heartbeat(&heartbeat_request(1, 1, 100, late), &BTreeSet::new())
            .await
            .unwrap();
        if answer.instructions.len() == mine.len() {
            assert!(answer.leases.is_empty(), "{answer:?}");
            for r in &mine {
                assert!(
                    answer.instructions.contains(
                        &remote_wal::datanode::protocol::Instruction::Close {
                            region_id: *r,
                            dropped: true
                        }
                    ),
                    "{answer:?}"
                );
            }
            closed = true;
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    assert!(closed, "the dropped regions were never closed");
    for (region, key) in &keys {
        assert_eq!(
            checkpoint(&kv, key).await,
            Err(()),
            "region {region}'s key came back"
        );
    }
    // The datanode closed them: the drop finishes.
    beat(&registry, 1, 1, 100, &[], 0).await;
    let output = tokio::time::timeout(Duration::from_secs(30), dropping)
        .await
        .expect("the drop finishes")
        .unwrap()
        .unwrap();
    assert_eq!(output["dropped"], true);
    assert_eq!(output["regions"], 2);
    let after = m.topics().await.unwrap();
    assert_eq!(after.topics.iter().map(|t| t.regions).sum::<usize>(), 0);
    for (_, key) in &keys {
        assert_eq!(checkpoint(&kv, key).await, Err(()));
    }
}

/// A kv that holds every compare-and-put of a `__topic_region` key while armed: it says so on `reached` and waits
/// for `release`, so a test can run a drop between the checkpoint's read and its write.
#[derive(Debug)]
struct GatedCheckpoints {
    inner: MemoryKvBackend,
    armed: AtomicBool,
    reached: tokio::sync::Notify,
    release: tokio::sync::Notify,
    /// The answers of the held writes, in order.
    answers: std::sync::Mutex<Vec<bool>>,
}

impl GatedCheckpoints {
    /// Whether a write of `key` is held; when it is, says so on `reached` and returns once released.
    async fn hold(&self, key: &[u8]) -> bool {
        if !(self.armed.load(Ordering::SeqCst) && key.starts_with(TOPIC_REGION_PREFIX.as_bytes())) {
            return false;
        }
        let released = self.release.notified();
        self.reached.notify_one();
        released.await;
        true
    }

    fn answered(&self, applied: bool) {
        self.answers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(applied);
    }
}

#[async_trait]
impl KvWrapper for GatedCheckpoints {
    fn inner(&self) -> &dyn KvBackend {
        &self.inner
    }

    async fn compare_and_put(
        &self,
        req: CompareAndPutRequest,
    ) -> remote_wal::kv::Result<CompareAndPutResponse> {
        let held = self.hold(&req.key).await;
        let answer = self.inner.compare_and_put(req).await?;
        if held {
            self.answered(answer.success);
        }
        Ok(answer)
    }

    // A blind write of a checkpoint is held the same way (and always applies), so that the test catches one.
    async fn put(&self, req: PutRequest) -> remote_wal::kv::Result<Option<KeyValue>> {
        let held = self.hold(&req.key).await;
        let previous = self.inner.put(req).await?;
        if held {
            self.answered(true);
        }
        Ok(previous)
    }
}

/// A flush racing a drop, made to interleave at the worst point: the heartbeat reads a region's `__topic_region`
/// key (the checkpoint at 3), the drop then moves the table's keys to tombstones, and only then does the
/// heartbeat's checkpoint write (to 9) reach the store. Written blind, it would create the key again and pin the
/// topic forever; as a compare-and-put against the value read, it is refused, the key stays gone and the drop
/// finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_write_that_lands_after_a_drop_deleted_its_key_does_not_recreate_it() {
    let gated = Arc::new(GatedCheckpoints {
        inner: MemoryKvBackend::new(),
        armed: AtomicBool::new(false),
        reached: tokio::sync::Notify::new(),
        release: tokio::sync::Notify::new(),
        answers: std::sync::Mutex::new(Vec::new()),
    });
    let kv: KvBackendRef = gated.clone();
    let m = Arc::new(kafka_metasrv(&kv, vec![1], 2).await);
    let created = create(&m, "raced", 1).await;
    let keys = topic_region_keys(&created);
    let (region, key) = keys[0].clone();
    let registry = m.datanode_registry().clone();
    registry.begin_term();
    registry
        .register(&register_request(1, "dn1:4001", 100))
        .await
        .unwrap();
    beat_until_leased(&registry, 1, 1, 100, &[region]).await;
    let leading = |flushed: u64| RegionStat {
        role: RegionRole::Leader,
        ..stat(region, flushed)
    };
    registry
        .heartbeat(
            &heartbeat_request(1, 1, 100, vec![leading(3)]),
            &BTreeSet::new(),
        )
        .await
        .unwrap();
    assert_eq!(checkpoint(&kv, &key).await, Ok(Some(3)));

    // The flush to 9: read, then held at its write.
    gated.armed.store(true, Ordering::SeqCst);
    let reached = gated.reached.notified();
    let flushing = {
        let registry = registry.clone();
        let request = heartbeat_request(1, 1, 100, vec![leading(9)]);
        tokio::spawn(async move { registry.heartbeat(&request, &BTreeSet::new()).await })
    };
    tokio::time::timeout(Duration::from_secs(30), reached)
        .await
        .expect("the checkpoint write reaches the store");
    gated.armed.store(false, Ordering::SeqCst);

    // The drop moves the keys to tombstones while that write waits.
    let dropping = {
        let m = m.clone();
        tokio::spawn(async move { m.drop_table(table("raced"), false).await })
    };
    let mut deleted = false;
    for _ in 0..POLLS {
        if checkpoint(&kv, &key).await == Err(()) {
            deleted = true;
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    assert!(deleted, "the drop never deleted region {region}'s key");

    // Now the late write lands: refused, and the key stays gone.
    gated.release.notify_one();
    tokio::time::timeout(Duration::from_secs(30), flushing)
        .await
        .expect("the heartbeat answers")
        .unwrap()
        .unwrap();
    assert_eq!(
        *gated.answers.lock().unwrap_or_else(|e| e.into_inner()),
        vec![false],
        "the held checkpoint write was applied"
    );
    assert_eq!(checkpoint(&kv, &key).await, Err(()), "the key came back");

    // The datanode reports the region closed: the drop finishes, and nothing brought the key back.
    beat(&registry, 1, 1, 100, &[], 0).await;
    let output = tokio::time::timeout(Duration::from_secs(30), dropping)
        .await
        .expect("the drop finishes")
        .unwrap()
        .unwrap();
    assert_eq!(output["dropped"], true);
    assert_eq!(checkpoint(&kv, &key).await, Err(()));
    assert_eq!(
        m.topics()
            .await
            .unwrap()
            .topics
            .iter()
            .map(|t| t.regions)
            .sum::<usize>(),
        0
    );
}

/// The topic incarnation a checkpoint counts travels with it: a heartbeat records the id the datanode opened the
/// region on (once, even with no entry to move past, and never moving the checkpoint back), the open instruction
/// carries it back (or, for a checkpoint recorded without one, the pool's recorded id), and regions a datanode
/// refused as lost are listed with it.
#[tokio::test]
async fn checkpoints_record_the_topic_incarnation_they_count() {
    use remote_wal::datanode::protocol::WalLost;
    use remote_wal::key::topic_name::{TopicId, TopicNameValue, topic_name_key};

    let old = TopicId(0x0b9e_4ab6_3f1c_4c52_9d36_7a1f_0e2d_4c8b);
    let new = TopicId(0x5d21_90aa_11be_4f07_8e44_c3a9_62d0_17f5);
    let kv = memory_kv();
    let m = kafka_metasrv(&kv, vec![1], 1).await;
    let created = create(&m, "incarnations", 1).await;
    let (region, key) = topic_region_keys(&created)[0].clone();
    let registry = m.datanode_registry().clone();
    registry.begin_term();
    registry
        .register(&register_request(1, "dn1:4001", 100))
        .await
        .unwrap();
    beat_until_leased(&registry, 1, 1, 100, &[region]).await;
    let stored = |kv: KvBackendRef, key: Vec<u8>| async move {
        let found = kv.get(&key).await.unwrap().unwrap();
        TopicRegionValue::decode(&found.key, &found.value).unwrap()
    };
    assert_eq!(stored(kv.clone(), key.clone()).await.topic_id, None);

    let on = |flushed: u64, id: Option<TopicId>| RegionStat {
        topic_id: id,
        ..stat(region, flushed)
    };
    let beat_with = |stats: Vec<RegionStat>, lost: Vec<WalLost>| {
        let registry = registry.clone();
        async move {
            let mut request = heartbeat_request(1, 1, 100, stats);
            request.wal_lost = lost;
            registry
                .heartbeat(&request, &BTreeSet::new())
                .await
                .unwrap()
        }
    };
    // The same flushed entry id as stored, now with the id the datanode read: recorded.
    beat_with(vec![on(0, Some(old))], Vec::new()).await;
    let value = stored(kv.clone(), key.clone()).await;
    assert_eq!(
        (value.flushed_entry_id(), value.topic_id),
        (Some(0), Some(old))
    );
    beat_with(vec![on(7, Some(old))], Vec::new()).await;
    let value = stored(kv.clone(), key.clone()).await;
    assert_eq!(
        (value.flushed_entry_id(), value.topic_id),
        (Some(7), Some(old))
    );
    // A report without an id keeps the recorded one; a lower flushed entry id never moves it back.
    beat_with(vec![on(3, None)], Vec::new()).await;
    let value = stored(kv.clone(), key.clone()).await;
    assert_eq!(
        (value.flushed_entry_id(), value.topic_id),
        (Some(7), Some(old))
    );

    let (_, to_open) = registry
        .region_to_open_by_id(region)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((to_open.checkpoint, to_open.topic_id), (Some(7), Some(old)));

    // A checkpoint recorded without an id counts the incarnation the pool recorded.
    let topic = String::from_utf8(key.clone()).unwrap();
    let topic = topic
        .strip_prefix("__topic_region/")
        .and_then(|rest| rest.rsplit_once('/'))
        .map(|(t, _)| t.to_string())
        .unwrap();
    kv.put(PutRequest {
        key: key.clone(),
        value: TopicRegionValue::at(5).encode(),
        prev_kv: false,
    })
    .await
    .unwrap();
    kv.put(PutRequest {
        key: topic_name_key(&topic),
        value: TopicNameValue {
            pruned_entry_id: 0,
            topic_id: Some(new),
        }
        .encode(),
        prev_kv: false,
    })
    .await
    .unwrap();
    let (_, to_open) = registry
        .region_to_open_by_id(region)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((to_open.checkpoint, to_open.topic_id), (Some(5), Some(new)));

    // A region refused as lost is listed with the datanode until it is no longer reported.
    let lost = WalLost {
        region_id: region,
        topic: topic.clone(),
        checkpoint: 5,
        expected: new,
        found: None,
    };
    beat_with(Vec::new(), vec![lost.clone()]).await;
    let listed = registry.list();
    assert_eq!(listed[0].wal_lost, vec![lost]);
    beat_with(Vec::new(), Vec::new()).await;
    assert!(registry.list()[0].wal_lost.is_empty());
}
