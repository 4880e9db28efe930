//! Region migration through the registry: a `RegionMigration` moves the route (and the `__dn_table` records) to
//! the target at epoch + 1; the old leader gets no lease on the region any more and is told to close it; the
//! target is told to open it, and leased, only once every lease the old leader got on it has run out, so its
//! replay starts after everything the old leader could acknowledge; the procedure ends when the target reports
//! the region as leader at the new epoch. Refused requests leave no record.

use std::collections::BTreeMap;

use remote_wal::datanode::protocol::{ClosedRegion, Instruction};
use remote_wal::key::datanode_table::{DatanodeTableValue, datanode_table_key};
use remote_wal::metasrv::datanodes::{HANDOVER_POLL, LEASE_MARGIN};

use super::*;

const INTERVAL_MS: u64 = 100;

/// A region the datanode reports open in `role` at `epoch`.
fn region(region_id: u64, role: RegionRole, epoch: u64) -> RegionStat {
    RegionStat {
        role,
        epoch,
        ..stat(region_id, 0)
    }
}

async fn beat_with(
    registry: &DatanodeRegistry,
    datanode_id: u64,
    incarnation: u64,
    regions: Vec<RegionStat>,
) -> HeartbeatResponse {
    registry
        .heartbeat(
            &heartbeat_request(datanode_id, incarnation, INTERVAL_MS, regions),
            &BTreeSet::new(),
        )
        .await
        .expect("heartbeat accepted")
}

fn opens(response: &HeartbeatResponse, region_id: u64) -> bool {
    response
        .instructions
        .iter()
        .any(|i| matches!(i, Instruction::Open(o) if o.request.region_id == region_id))
}

fn closes(response: &HeartbeatResponse, region_id: u64) -> bool {
    response.instructions.iter().any(
        |i| matches!(i, Instruction::Close { region_id: r, dropped: false } if *r == region_id),
    )
}

async fn dn_table(
    kv: &KvBackendRef,
    datanode_id: u64,
    table_id: u32,
) -> Option<DatanodeTableValue> {
    kv.get(datanode_table_key(datanode_id, table_id).as_bytes())
        .await
        .expect("kv readable")
        .map(|found| serde_json::from_slice(&found.value).expect("a datanode table value"))
}

async fn route(kv: &KvBackendRef, table_id: u32) -> TableRouteValue {
    let found = kv
        .get(table_route_key(table_id).as_bytes())
        .await
        .expect("kv readable")
        .expect("the route exists");
    serde_json::from_slice(&found.value).expect("a route")
}

#[tokio::test]
async fn a_moved_region_opens_and_leads_on_its_target_only_after_the_old_leaders_lease_ran_out() {
    let kv = memory_kv();
    let m = kafka_metasrv(&kv, vec![1, 2], 2).await;
    let created = create(&m, "moving", 2).await;
    let registry = m.datanode_registry().clone();
    registry.begin_term();
    let moving = regions_of(&created, 1)[0];
    let staying = regions_of(&created, 2)[0];
    let table_id = created.table_id;
    let number = (moving & 0xffff_ffff) as u32;

    let one = registry
        .register(&register_request(1, "dn1:4001", INTERVAL_MS))
        .await
        .unwrap()
        .incarnation;
    let two = registry
        .register(&register_request(2, "dn2:4001", INTERVAL_MS))
        .await
        .unwrap()
        .incarnation;
    // Datanode 1 leads the region at epoch 0.
    beat_until_leased(&registry, 1, one, INTERVAL_MS, &[moving]).await;
    beat_until_leased(&registry, 2, two, INTERVAL_MS, &[staying]).await;
    let sent_before = Instant::now();
    let answer = beat_with(
        &registry,
        1,
        one,
        vec![region(moving, RegionRole::Leader, 0)],
    )
    .await;
    assert_eq!(leased(&answer), [moving]);
    assert_eq!(registry.region_leader(moving), Some((1, 0)));

    let (id, mut watcher) = m
        .submit_region_migration(moving, 2)
        .await
        .expect("submitted");
    // The route names datanode 2 at epoch 1 once UpdateRoute committed; the procedure then waits for the leader.
    let mut moved = false;
    for _ in 0..POLLS {
        let r = route(m.kv(), table_id).await;
        if r.region_routes.get(&number) == Some(&2) {
            assert_eq!(r.region_epoch(number), 1);
            moved = true;
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    assert!(moved, "the route never moved");
    let from = dn_table(m.kv(), 1, table_id).await;
    assert!(
        from.as_ref().is_none_or(|v| !v.regions.contains(&number)),
        "{from:?}"
    );
    let to = dn_table(m.kv(), 2, table_id)
        .await
        .expect("datanode 2's record");
    assert!(to.regions.contains(&number), "{to:?}");
    assert!(to.region_wal_options.contains_key(&number), "{to:?}");

    // The old leader, still reporting the region as leader, gets no lease on it and is told to close it.
    let answer = beat_with(
        &registry,
        1,
        one,
        vec![region(moving, RegionRole::Leader, 0)],
    )
    .await;
    assert!(leased(&answer).is_empty(), "{answer:?}");
    assert!(closes(&answer, moving), "{answer:?}");

    // The target is told to open it only once the old leader's last lease (reckoned from no earlier than the
    // heartbeat that brought it was sent) has run out.
    let lease = Duration::from_millis(lease_ms(INTERVAL_MS));
    let mut opened_at = None;
    for _ in 0..POLLS {
        let answer = beat_with(
            &registry,
            2,
            two,
            vec![region(staying, RegionRole::Leader, 0)],
        )
        .await;
        if opens(&answer, moving) {
            opened_at = Some(Instant::now());
            break;
        }
        assert!(
            answer.leases_in_ms.is_some(),
            "held back, and says so: {answer:?}"
        );
        tokio::time::sleep(POLL).await;
    }
    let opened_at = opened_at.expect("the target was never told to open the region");
    assert!(
        opened_at >= sent_before + lease,
        "opened {:?} after the old leader's lease was sent, before the lease of {lease:?} ran out",
        opened_at - sent_before
    );
    let waiting = watcher.info();
    assert!(
        !waiting.state.is_finished() && waiting.step_name.as_deref() == Some("WaitLeader"),
        "still waiting for the leader: {waiting:?}"
    );

    // Opened (as follower, no lease yet): leased at the new epoch; reported as leader: the migration is done.
    let answer = beat_with(
        &registry,
        2,
        two,
        vec![
            region(moving, RegionRole::Follower, 0),
            region(staying, RegionRole::Leader, 0),
        ],
    )
    .await;
    let lease = answer
        .leases
        .iter()
        .find(|l| l.region_id == moving)
        .expect("the moved region is leased");
    assert_eq!((lease.role, lease.epoch), (RegionRole::Leader, 1));
    // Reported as leader (every heartbeat, as a datanode does): the migration is done.
    let finished = {
        let mut output = None;
        for _ in 0..POLLS {
            beat_with(
                &registry,
                2,
                two,
                vec![
                    region(moving, RegionRole::Leader, 1),
                    region(staying, RegionRole::Leader, 0),
                ],
            )
            .await;
            if watcher.info().state.is_finished() {
                output = Some(watcher.wait().await);
                break;
            }
            tokio::time::sleep(POLL).await;
        }
        output.expect("the migration finishes")
    };
    let output = finished.expect("the migration finishes");
    assert_eq!(
        output,
        Some(serde_json::json!({"region_id": moving, "from": 1, "to": 2, "epoch": 1}))
    );
    assert_eq!(registry.region_leader(moving), Some((2, 1)));
    let info = m.procedure(id.as_str()).await.unwrap();
    assert_eq!(info.type_name, "remote_wal::RegionMigration");

    // A late heartbeat of the old leader still gets nothing on it.
    let answer = beat_with(
        &registry,
        1,
        one,
        vec![region(moving, RegionRole::Leader, 0)],
    )
    .await;
    assert!(
        leased(&answer).is_empty() && closes(&answer, moving),
        "{answer:?}"
    );

    // A new term: the target reports the region at its epoch and is leased at once; the old one is not.
    registry.end_term();
    registry.begin_term();
    let answer = beat_with(
        &registry,
        2,
        two,
        vec![
            region(moving, RegionRole::Leader, 1),
            region(staying, RegionRole::Leader, 0),
        ],
    )
    .await;
    assert_eq!(leased(&answer), {
        let mut both = vec![moving, staying];
        both.sort_unstable();
        both
    });
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_new_term_holds_a_moved_region_back_one_whole_lease_on_a_target_that_never_led_it() {
    let kv = memory_kv();
    let m = kafka_metasrv(&kv, vec![1, 2], 1).await;
    let created = create(&m, "new_term", 1).await;
    let moving = created.regions[0].region_id;
    let target = if created.regions[0].datanode_id == 1 {
        2
    } else {
        1
    };
    let registry = m.datanode_registry().clone();
    registry.begin_term();
    let incarnation = registry
        .register(&register_request(target, "dn:4001", INTERVAL_MS))
        .await
        .unwrap()
        .incarnation;
    let (_, _watcher) = m.submit_region_migration(moving, target).await.unwrap();
    for _ in 0..POLLS {
        if route(m.kv(), created.table_id).await.region_epoch(0) == 1 {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    // This leader never granted the region to anyone, but an earlier one may have, up to its last moment: the
    // target waits one whole lease from the term's start.
    registry.end_term();
    let term_start = Instant::now();
    registry.begin_term();
    let lease = Duration::from_millis(lease_ms(INTERVAL_MS));
    let mut opened_at = None;
    for _ in 0..POLLS {
        if opens(
            &beat_with(&registry, target, incarnation, Vec::new()).await,
            moving,
        ) {
            opened_at = Some(Instant::now());
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    let opened_at = opened_at.expect("never opened");
    assert!(
        opened_at >= term_start + lease,
        "{:?}",
        opened_at - term_start
    );
    m.stop().await.unwrap();
}

#[tokio::test]
async fn refused_migrations_leave_no_record_and_name_the_reason() {
    let kv = memory_kv();
    let raft = raft_metasrv(&kv, vec![1, 2]).await;
    let created = create(&raft, "local", 1).await;
    let region_id = created.regions[0].region_id;
    let other = if created.regions[0].datanode_id == 1 {
        2
    } else {
        1
    };
    let cases = [
        (region_id, other, "its WAL is raft-engine"),
        (
            region_id,
            9,
            "datanode 9 is not one of the datanodes [1, 2]",
        ),
        (region_id + 5, other, "has no region number 5"),
        (
            (u64::from(created.table_id) + 1) << 32,
            other,
            "does not exist",
        ),
    ];
    for (region, to, why) in cases {
        let (_, mut watcher) = raft.submit_region_migration(region, to).await.unwrap();
        let err = watcher.wait().await.unwrap_err().to_string();
        assert!(
            err.contains(&format!("cannot migrate region {region} to datanode {to}"))
                && err.contains(why),
            "{err}"
        );
    }
    let kinds: BTreeMap<String, usize> =
        raft.list_procedures()
            .await
            .unwrap()
            .iter()
            .fold(BTreeMap::new(), |mut m, p| {
                *m.entry(p.type_name.clone()).or_default() += 1;
                m
            });
    assert_eq!(kinds.get("remote_wal::RegionMigration"), None, "{kinds:?}");
    raft.stop().await.unwrap();
}

/// A heartbeat of datanode `datanode_id` counted `seq` ([`HeartbeatRequest::seq`]), reporting `regions`.
async fn beat_counted(
    registry: &DatanodeRegistry,
    datanode_id: u64,
    incarnation: u64,
    interval_ms: u64,
    seq: u64,
    regions: Vec<RegionStat>,
) -> HeartbeatResponse {
    let request = HeartbeatRequest {
        seq,
        ..heartbeat_request(datanode_id, incarnation, interval_ms, regions)
    };
    registry
        .heartbeat(&request, &BTreeSet::new())
        .await
        .expect("heartbeat accepted")
}

#[tokio::test]
async fn a_moved_region_opens_on_its_target_as_soon_as_the_old_leader_reports_it_closed_and_not_on_an_older_report()
 {
    // A long interval: the old leader's lease (4 s + margin) lasts the rest of the test once granted, so only its
    // close report can let the target open the region early.
    const INTERVAL: u64 = 1_000;
    let kv = memory_kv();
    let m = kafka_metasrv(&kv, vec![1, 2], 2).await;
    let created = create(&m, "handover", 2).await;
    let registry = m.datanode_registry().clone();
    registry.begin_term();
    let moving = regions_of(&created, 1)[0];
    let staying = regions_of(&created, 2)[0];
    let table_id = created.table_id;
    let number = (moving & 0xffff_ffff) as u32;
    let one = registry
        .register(&register_request(1, "dn1:4001", INTERVAL))
        .await
        .unwrap()
        .incarnation;
    let two = registry
        .register(&register_request(2, "dn2:4001", INTERVAL))
        .await
        .unwrap()
        .incarnation;
    beat_until_leased(&registry, 1, one, INTERVAL, &[moving]).await;
    beat_until_leased(&registry, 2, two, INTERVAL, &[staying]).await;
    // A new term holds back a moved region until every lease an earlier term may have granted ran out, whoever
    // reports what: wait that out first (one lease and the margin after the term began).
    tokio::time::sleep(Duration::from_millis(lease_ms(INTERVAL)) + LEASE_MARGIN).await;
    // Heartbeat 5 of datanode 1 brings its lease on the region.
    let answer = beat_counted(
        &registry,
        1,
        one,
        INTERVAL,
        5,
        vec![region(moving, RegionRole::Leader, 0)],
    )
    .await;
    assert_eq!(leased(&answer), [moving]);
    let leased_at = Instant::now();

    let (_, mut watcher) = m
        .submit_region_migration(moving, 2)
        .await
        .expect("submitted");
    let mut moved = false;
    for _ in 0..POLLS {
        if route(m.kv(), table_id).await.region_routes.get(&number) == Some(&2) {
            moved = true;
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    assert!(moved, "the route never moved");
    let target_beat = |seq: u64, with_moving: bool| {
        let mut regions = vec![region(staying, RegionRole::Leader, 0)];
        if with_moving {
            regions.push(region(moving, RegionRole::Follower, 0));
        }
        beat_counted(&registry, 2, two, INTERVAL, seq, regions)
    };

    // The old leader still heartbeats: the target is held back, and asked to come back soon rather than after
    // the lease, because the old leader will be told to close the region.
    let answer = target_beat(10, false).await;
    assert!(!opens(&answer, moving), "{answer:?}");
    let again = answer
        .heartbeat_in_ms
        .expect("asked to heartbeat again soon");
    assert!(
        again <= HANDOVER_POLL.as_millis() as u64,
        "{again} ms, not the handover poll: {answer:?}"
    );
    // Heartbeat 6 of the old leader, still reporting it: told to close it.
    let answer = beat_counted(
        &registry,
        1,
        one,
        INTERVAL,
        6,
        vec![region(moving, RegionRole::Leader, 0)],
    )
    .await;
    assert!(closes(&answer, moving), "{answer:?}");
    // A heartbeat built before the lease was granted (count 4) arrives late, without the region: it says nothing
    // of the lease granted after it. Still held back.
    beat_counted(&registry, 1, one, INTERVAL, 4, Vec::new()).await;
    let answer = target_beat(11, false).await;
    assert!(
        !opens(&answer, moving),
        "an older report voided the lease: {answer:?}"
    );
    assert_eq!(
        registry.region_leader(moving),
        Some((1, 0)),
        "an older report replaced the regions the datanode last reported"
    );
    // Heartbeat 7, built after the close: the lease is void, the target opens the region at once and is leased
    // at the new epoch once it reports it, all long before the old lease would have run out.
    // It reports the close with the last entry id it acknowledged: the target must replay that far.
    let closing = HeartbeatRequest {
        seq: 7,
        closed: vec![ClosedRegion {
            region_id: moving,
            last_entry_id: 42,
        }],
        ..heartbeat_request(1, one, INTERVAL, Vec::new())
    };
    registry
        .heartbeat(&closing, &BTreeSet::new())
        .await
        .expect("heartbeat accepted");
    assert_eq!(registry.region_leader(moving), None);
    let answer = target_beat(12, false).await;
    assert!(opens(&answer, moving), "{answer:?}");
    let expected = answer.instructions.iter().find_map(|i| match i {
        Instruction::Open(o) if o.request.region_id == moving => o.expected_last_entry_id,
        _ => None,
    });
    assert_eq!(expected, Some(42), "{answer:?}");
    let answer = target_beat(13, true).await;
    let lease = answer
        .leases
        .iter()
        .find(|l| l.region_id == moving)
        .expect("the moved region is leased");
    assert_eq!(lease.epoch, 1);
    assert!(
        leased_at.elapsed() < Duration::from_millis(lease_ms(INTERVAL)),
        "the test ran past the old lease: it proves nothing"
    );
    for _ in 0..POLLS {
        beat_counted(
            &registry,
            2,
            two,
            INTERVAL,
            14,
            vec![
                region(staying, RegionRole::Leader, 0),
                region(moving, RegionRole::Leader, 1),
            ],
        )
        .await;
        if watcher.info().state.is_finished() {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    assert_eq!(
        watcher.wait().await.expect("the migration finishes"),
        Some(serde_json::json!({"region_id": moving, "from": 1, "to": 2, "epoch": 1}))
    );
    m.stop().await.unwrap();
}
