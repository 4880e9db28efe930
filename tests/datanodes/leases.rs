//! What a heartbeat brings back: a Leader lease per region the route gives the datanode and that it reports, at the
//! route's region epoch, lasting `lease_for(interval)`; `Close` for a region it reports that the route gives
//! another datanode; `Open` (with the open request) for a region of its route it does not report; `Flush` when
//! asked.
//!
//! The regions here have route epochs above 0, as regions that moved before: the datanode reports them at their
//! epoch (it held a lease at it), and a region it does not report is opened only once any lease an earlier term
//! may have granted on it elsewhere has run out (`migration.rs` shows why).

use remote_wal::datanode::protocol::{Instruction, RegionLease, RegionToOpen};
use remote_wal::datanode::{RegionOpener, WalProviderKind};

use super::*;

/// A metasrv on datanodes 1 and 2 with a 4-region table (two regions each) whose regions have distinct epochs;
/// returns the metasrv, its kv, the table and each region's epoch.
async fn setup() -> (Metasrv, KvBackendRef, TableRegions) {
    let kv = memory_kv();
    let m = raft_metasrv(&kv, vec![1, 2]).await;
    let created = create(&m, "leased", 4).await;
    assert_eq!(regions_of(&created, 1).len(), 2, "{created:?}");
    assert_eq!(regions_of(&created, 2).len(), 2, "{created:?}");
    // Epochs 10 + region number: a lease carrying another region's epoch, or 0, would show.
    let epochs: Vec<(u32, u64)> = (0..4).map(|n| (n, 10 + u64::from(n))).collect();
    set_region_epochs(m.kv(), created.table_id, &epochs).await;
    (m, kv, created)
}

fn epoch_of(region_id: u64) -> u64 {
    10 + (region_id & 0xffff_ffff)
}

/// `regions` as the datanode reports them: open, at their route epoch.
fn at_route_epochs(regions: &[u64]) -> Vec<RegionStat> {
    regions
        .iter()
        .map(|r| RegionStat {
            epoch: epoch_of(*r),
            ..stat(*r, 0)
        })
        .collect()
}

/// A heartbeat reporting `regions` at their route epochs (shadows the crate's `beat`, which reports epoch 0).
async fn beat(
    registry: &DatanodeRegistry,
    datanode_id: u64,
    incarnation: u64,
    interval_ms: u64,
    regions: &[u64],
    _flushed: u64,
) -> HeartbeatResponse {
    let request = heartbeat_request(
        datanode_id,
        incarnation,
        interval_ms,
        at_route_epochs(regions),
    );
    registry
        .heartbeat(&request, &BTreeSet::new())
        .await
        .expect("heartbeat accepted")
}

/// Heartbeats reporting `regions` until an answer holds an instruction; every answer before it says that it holds
/// regions back. A bounded wait.
async fn beat_until_instructed(
    registry: &DatanodeRegistry,
    datanode_id: u64,
    regions: &[u64],
) -> HeartbeatResponse {
    for _ in 0..POLLS {
        let response = beat(registry, datanode_id, 1, 100, regions, 0).await;
        if !response.instructions.is_empty() {
            return response;
        }
        assert!(response.leases_in_ms.is_some(), "{response:?}");
        tokio::time::sleep(POLL).await;
    }
    panic!("datanode {datanode_id} got no instruction in {POLLS} heartbeats");
}

#[tokio::test]
async fn the_routed_regions_a_datanode_reports_get_a_leader_lease_at_the_route_epoch() {
    let (m, _kv, created) = setup().await;
    let registry = m.datanode_registry();
    registry.begin_term();
    let mine = regions_of(&created, 1);
    registry
        .register(&register_request(1, "dn1:4001", 100))
        .await
        .unwrap();

    // The lease is the one fixed at registration (what a successor waits out), whatever a heartbeat says.
    for interval_ms in [100, 2_000] {
        let response = beat(registry, 1, 1, interval_ms, &mine, 0).await;
        let mut leases = response.leases.clone();
        leases.sort_by_key(|l| l.region_id);
        let expected: Vec<RegionLease> = mine
            .iter()
            .map(|r| RegionLease {
                region_id: *r,
                role: RegionRole::Leader,
                epoch: epoch_of(*r),
                duration_ms: lease_ms(100),
            })
            .collect();
        assert_eq!(leases, expected, "interval {interval_ms} ms");
        assert!(response.instructions.is_empty(), "{response:?}");
        assert_eq!(response.leases_in_ms, None);
    }
    let listed = registry.list();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].leases, 2);
    assert_eq!(listed[0].leases_in_ms, None);
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_reported_region_the_route_gives_another_datanode_gets_close_and_no_lease() {
    let (m, _kv, created) = setup().await;
    let registry = m.datanode_registry();
    registry.begin_term();
    let mine = regions_of(&created, 1);
    let theirs = regions_of(&created, 2);
    registry
        .register(&register_request(1, "dn1:4001", 100))
        .await
        .unwrap();

    // Its own regions and one of datanode 2's, and a region of no table at all.
    let stray = (u64::from(created.table_id + 100) << 32) | 1;
    let reported = [mine.clone(), vec![theirs[0], stray]].concat();
    let response = beat(registry, 1, 1, 100, &reported, 0).await;
    assert_eq!(
        leased(&response),
        mine,
        "only the routed regions are leased"
    );
    assert_eq!(
        response.instructions,
        vec![
            Instruction::Close {
                region_id: theirs[0],
                dropped: false
            },
            Instruction::Close {
                region_id: stray,
                dropped: false
            },
        ]
    );
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_routed_region_the_datanode_does_not_report_gets_open_and_no_lease() {
    let (m, kv, created) = setup().await;
    let registry = m.datanode_registry();
    registry.begin_term();
    let mine = regions_of(&created, 2);
    registry
        .register(&register_request(2, "dn2:4001", 100))
        .await
        .unwrap();

    // It reports only its first region: that one is leased at once; the other is opened once an earlier term's
    // leases on it (elsewhere) may have run out.
    let response = beat_until_instructed(registry, 2, &mine[..1]).await;
    assert_eq!(leased(&response), vec![mine[0]]);
    let open = RegionOpener::new(kv.clone(), 2, WalProviderKind::RaftEngine)
        .open_regions()
        .await
        .unwrap();
    let request = open
        .requests
        .iter()
        .find(|r| r.region_id == mine[1])
        .expect("the opener lists the region")
        .clone();
    assert_eq!(
        response.instructions,
        vec![Instruction::Open(RegionToOpen {
            request,
            epoch: epoch_of(mine[1]),
            topic_region_key: false,
            checkpoint: None,
            pruned_entry_id: 0,
            topic_id: None,
            expected_last_entry_id: None,
        })]
    );

    // Reporting nothing: both are to be opened, none leased.
    let response = beat(registry, 2, 1, 100, &[], 0).await;
    assert!(response.leases.is_empty(), "{response:?}");
    let opened: Vec<u64> = response
        .instructions
        .iter()
        .map(|i| match i {
            Instruction::Open(o) => o.request.region_id,
            other => panic!("expected only Open, got {other:?}"),
        })
        .collect();
    assert_eq!(opened, mine);
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_reported_region_asked_to_flush_gets_flush_and_keeps_its_lease() {
    let (m, _kv, created) = setup().await;
    let registry = m.datanode_registry();
    registry.begin_term();
    let mine = regions_of(&created, 1);
    let theirs = regions_of(&created, 2);
    registry
        .register(&register_request(1, "dn1:4001", 100))
        .await
        .unwrap();

    // A flush asked for one of its regions, and for another datanode's region (not this one's to flush).
    let flush: BTreeSet<u64> = [mine[1], theirs[0]].into_iter().collect();
    let request = heartbeat_request(1, 1, 100, at_route_epochs(&mine));
    let response = registry.heartbeat(&request, &flush).await.unwrap();
    assert_eq!(leased(&response), mine);
    assert_eq!(
        response.instructions,
        vec![Instruction::Flush { region_id: mine[1] }]
    );
    m.stop().await.unwrap();
}
