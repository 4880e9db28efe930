//! A region replays from its checkpoint only on the topic incarnation the checkpoint counts: a topic deleted and
//! created again under the same name starts its positions over, so the region's entries after the checkpoint are
//! gone and the new topic's entries below it would be skipped without an error. Such a region is refused with
//! [`Error::WalTailLost`] naming both ids, and reported in every heartbeat until it opens.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use datanode::topic_ids::{TopicIds, TopicIncarnation};
use remote_wal::key::topic_name::TopicId;

use super::*;

/// The brokers' answer, set by the test, and how many times it was asked.
#[derive(Debug)]
struct FakeIds {
    now: Mutex<TopicIncarnation>,
    asked: AtomicUsize,
}

impl FakeIds {
    fn new(now: TopicIncarnation) -> Arc<Self> {
        Arc::new(FakeIds {
            now: Mutex::new(now),
            asked: AtomicUsize::new(0),
        })
    }
}

#[async_trait]
impl TopicIds for FakeIds {
    async fn incarnation(&self, _topic: &str) -> remote_wal::wal::error::Result<TopicIncarnation> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        Ok(*self.now.lock().unwrap())
    }
}

const OLD: TopicId = TopicId(0x0b9e_4ab6_3f1c_4c52_9d36_7a1f_0e2d_4c8b);
const NEW: TopicId = TopicId(0x5d21_90aa_11be_4f07_8e44_c3a9_62d0_17f5);

fn datanode_with(world: &World, incarnation: u64, ids: Arc<FakeIds>) -> Arc<Datanode> {
    let dn = Datanode::new(DatanodeOptions {
        id: 1,
        address: "127.0.0.1:1".to_string(),
        wal_dir: world.storage.path().join("wal"),
        region_storage: world.storage.path().join("regions"),
        kafka: Some(KafkaConfig::default()),
        heartbeat_interval: Duration::from_millis(100),
        flush_threshold: u64::MAX,
        partitions: Some(world.brokers.factory()),
        topic_ids: Some(ids),
    });
    dn.set_incarnation(incarnation);
    Arc::new(dn)
}

fn to_open_on(checkpoint: Option<u64>, topic_id: Option<TopicId>) -> RegionToOpen {
    RegionToOpen {
        topic_id,
        ..to_open(REGION, checkpoint)
    }
}

/// Writes 10 entries to REGION on `dn`, flushes them and writes 5 more; returns the flushed entry id.
async fn write_and_flush(dn: &Arc<Datanode>) -> u64 {
    lease(dn, REGION, 60_000);
    for i in 0..10u8 {
        dn.write(REGION, vec![vec![i]]).await.unwrap();
    }
    let flushed = dn.flush(REGION).await.unwrap().flushed_entry_id;
    for i in 10..15u8 {
        dn.write(REGION, vec![vec![i]]).await.unwrap();
    }
    flushed
}

#[tokio::test]
async fn a_region_reports_the_incarnation_it_opened_on_and_replays_when_it_is_still_served() {
    let world = World::new();
    let ids = FakeIds::new(TopicIncarnation::Id(OLD));
    let dn = datanode_with(&world, 1, ids.clone());
    for (_, result) in dn.open_regions(vec![to_open_on(None, None)]).await {
        result.unwrap();
    }
    let stat = dn.heartbeat_request().regions;
    assert_eq!(
        stat[0].topic_id,
        Some(OLD),
        "the heartbeat names the incarnation"
    );
    let flushed = write_and_flush(&dn).await;
    drop(dn);

    let dn = datanode_with(&world, 2, ids.clone());
    for (_, result) in dn
        .open_regions(vec![to_open_on(Some(flushed), Some(OLD))])
        .await
    {
        result.unwrap();
    }
    assert_eq!(dn.region_entries(REGION).await.unwrap().len(), 15);
    assert!(dn.heartbeat_request().wal_lost.is_empty());

    // Brokers that give no ids cannot tell incarnations apart: the region opens as before.
    *ids.now.lock().unwrap() = TopicIncarnation::Unknown;
    let dn = datanode_with(&world, 3, ids);
    for (_, result) in dn
        .open_regions(vec![to_open_on(Some(flushed), Some(OLD))])
        .await
    {
        result.unwrap();
    }
    assert_eq!(dn.region_entries(REGION).await.unwrap().len(), 15);
}

#[tokio::test]
async fn a_recreated_topic_is_not_replayed_from_the_old_checkpoint() {
    let world = World::new();
    let ids = FakeIds::new(TopicIncarnation::Id(OLD));
    let dn = datanode_with(&world, 1, ids.clone());
    open(&dn, REGION, Some(0)).await;
    let flushed = write_and_flush(&dn).await;
    drop(dn);
    // Deleted and created again out of band: empty, another id; another region writes 3 entries to it.
    world.brokers.topics.lock().unwrap().remove(TOPIC);
    *ids.now.lock().unwrap() = TopicIncarnation::Id(NEW);
    let writer = datanode_with(&world, 2, ids.clone());
    let other = REGION + 1;
    for (_, result) in writer.open_regions(vec![to_open(other, Some(0))]).await {
        result.unwrap();
    }
    lease(&writer, other, 60_000);
    writer
        .write(other, vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()])
        .await
        .unwrap();

    let dn = datanode_with(&world, 3, ids.clone());
    let results = dn
        .open_regions(vec![to_open_on(Some(flushed), Some(OLD))])
        .await;
    let err = match &results[..] {
        [(_, Err(e))] => e.to_string(),
        other => panic!("expected one refusal, got {other:?}"),
    };
    assert!(
        matches!(results[0].1, Err(Error::WalTailLost { .. })),
        "{err}"
    );
    assert!(
        err.contains(&format!("region {REGION}"))
            && err.contains(&OLD.to_string())
            && err.contains(&NEW.to_string())
            && err.contains(&format!("after {flushed} were lost")),
        "{err}"
    );
    assert!(dn.regions().is_empty(), "the region is not opened");
    let lost = dn.heartbeat_request().wal_lost;
    assert_eq!(lost.len(), 1);
    assert_eq!(
        (
            lost[0].region_id,
            lost[0].checkpoint,
            lost[0].expected,
            lost[0].found
        ),
        (REGION, flushed, OLD, Some(NEW))
    );

    // Gone altogether: the same refusal, saying the brokers no longer list it.
    *ids.now.lock().unwrap() = TopicIncarnation::Gone;
    let dn = datanode_with(&world, 4, ids);
    let results = dn
        .open_regions(vec![to_open_on(Some(flushed), Some(OLD))])
        .await;
    match &results[..] {
        [(_, Err(e @ Error::WalTailLost { .. }))] => {
            assert!(e.to_string().contains("no longer list it"), "{e}")
        }
        other => panic!("expected one refusal, got {other:?}"),
    }
    assert_eq!(dn.heartbeat_request().wal_lost[0].found, None);
}
