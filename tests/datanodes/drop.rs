//! A dropped table's regions: the registry hands each `__region_drop` key out as a `Drop` instruction (a Kafka
//! region to any datanode, a raft-engine region to the datanode that held it) and deletes the key once that
//! datanode reports the region deleted.

use std::collections::BTreeSet;

use remote_wal::datanode::protocol::{HeartbeatResponse, Instruction};
use remote_wal::key::region_drop::{REGION_DROP_PREFIX, region_drop_key};
use remote_wal::kv::RangeRequest;

use super::*;

/// The `Drop` instructions of an answer: (region, raft_engine), sorted.
fn drops(response: &HeartbeatResponse) -> Vec<(u64, bool)> {
    let mut out: Vec<(u64, bool)> = response
        .instructions
        .iter()
        .filter_map(|i| match i {
            Instruction::Drop {
                region_id,
                raft_engine,
            } => Some((*region_id, *raft_engine)),
            _ => None,
        })
        .collect();
    out.sort_unstable();
    out
}

/// The regions with a `__region_drop` key.
async fn pending(kv: &KvBackendRef) -> Vec<u64> {
    kv.range(RangeRequest::prefix(REGION_DROP_PREFIX))
        .await
        .unwrap()
        .kvs
        .iter()
        .map(|kv| {
            String::from_utf8_lossy(&kv.key)
                .trim_start_matches(REGION_DROP_PREFIX)
                .parse()
                .unwrap()
        })
        .collect()
}

/// A heartbeat of `datanode_id` with no region open, reporting `dropped`.
async fn report(
    registry: &DatanodeRegistry,
    datanode_id: u64,
    dropped: &[u64],
) -> HeartbeatResponse {
    let request = HeartbeatRequest {
        dropped: dropped.to_vec(),
        ..heartbeat_request(datanode_id, 1, 100, Vec::new())
    };
    registry
        .heartbeat(&request, &BTreeSet::new())
        .await
        .expect("heartbeat accepted")
}

#[tokio::test]
async fn a_dropped_kafka_tables_regions_go_to_any_datanode_and_are_forgotten_once_one_reports_them()
{
    let kv = memory_kv();
    let m = kafka_metasrv(&kv, vec![1, 2], 2).await;
    let created = create(&m, "gone", 3).await;
    let kept = create(&m, "kept", 1).await;
    let registry = m.datanode_registry().clone();
    registry.begin_term();
    for id in [1, 2] {
        registry
            .register(&register_request(id, &format!("dn{id}:4001"), 100))
            .await
            .unwrap();
    }
    let mut regions: Vec<u64> = created.regions.iter().map(|r| r.region_id).collect();
    regions.sort_unstable();
    assert!(
        report(&registry, 1, &[])
            .await
            .instructions
            .iter()
            .all(|i| !matches!(i, Instruction::Drop { .. }))
    );

    m.drop_table(table("gone"), false).await.expect("drop");
    assert_eq!(pending(&kv).await, regions, "one key per dropped region");
    let expected: Vec<(u64, bool)> = regions.iter().map(|r| (*r, false)).collect();
    // Region storage is shared: every datanode may delete a Kafka region, whichever held it.
    assert_eq!(drops(&report(&registry, 1, &[]).await), expected);
    assert_eq!(drops(&report(&registry, 2, &[]).await), expected);

    // Datanode 2 deleted the first; the other two are still handed out.
    let answer = report(&registry, 2, &regions[..1]).await;
    assert_eq!(drops(&answer), expected[1..].to_vec());
    assert_eq!(pending(&kv).await, regions[1..].to_vec());
    // A report of a region that is not dropped (the kept table's) deletes nothing.
    let answer = report(&registry, 1, &[kept.regions[0].region_id]).await;
    assert_eq!(drops(&answer), expected[1..].to_vec());
    let answer = report(&registry, 1, &regions[1..]).await;
    assert!(drops(&answer).is_empty(), "{answer:?}");
    assert!(pending(&kv).await.is_empty());
    assert!(drops(&report(&registry, 2, &[]).await).is_empty());
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_dropped_raft_engine_region_goes_only_to_the_datanode_that_held_it() {
    let kv = memory_kv();
    let m = raft_metasrv(&kv, vec![1, 2]).await;
    let created = create(&m, "local", 4).await;
    let on_1 = regions_of(&created, 1);
    let on_2 = regions_of(&created, 2);
    assert!(!on_1.is_empty() && !on_2.is_empty(), "{created:?}");
    let registry = m.datanode_registry().clone();
    registry.begin_term();
    for id in [1, 2] {
        registry
            .register(&register_request(id, &format!("dn{id}:4001"), 100))
            .await
            .unwrap();
    }
    m.drop_table(table("local"), false).await.expect("drop");

    let to_1 = drops(&report(&registry, 1, &[]).await);
    assert_eq!(to_1, on_1.iter().map(|r| (*r, true)).collect::<Vec<_>>());
    // Datanode 2 cannot delete datanode 1's WAL entries: its report of them changes nothing.
    let to_2 = drops(&report(&registry, 2, &on_1).await);
    assert_eq!(to_2, on_2.iter().map(|r| (*r, true)).collect::<Vec<_>>());
    let mut all: Vec<u64> = on_1.iter().chain(&on_2).copied().collect();
    all.sort_unstable();
    assert_eq!(pending(&kv).await, all);
    report(&registry, 1, &on_1).await;
    report(&registry, 2, &on_2).await;
    assert!(pending(&kv).await.is_empty());
    for region in all {
        assert!(
            kv.get(region_drop_key(region).as_bytes())
                .await
                .unwrap()
                .is_none()
        );
    }
    m.stop().await.unwrap();
}
