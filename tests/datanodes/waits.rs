//! A new incarnation gets no lease until every lease of the one it replaced has run out: within a term, its
//! predecessor's last grant + lease + `LEASE_MARGIN` (or, when the predecessor was itself still waiting, that wait);
//! after a failover, nothing for a `cleared` incarnation and, for one that is not, the longest lease of the
//! uncleared chain before it from the term's start. The lease a heartbeat grants is the one fixed at registration.
//!
//! The instants the tests keep are lower bounds of the registry's own: an instant taken before a call is no later
//! than anything the registry reckons from within it, and one taken after a call's answer is no earlier. So
//! "granted no earlier than X after Y" holds for them whenever it holds for the registry.

use std::time::Instant;

use remote_wal::metasrv::datanodes::LEASE_MARGIN;

use super::*;

/// The predecessor's interval: its lease (and so the wait) is longer than the successor's own lease + margin, so a
/// successor waiting only its own lease would be seen granting early.
const OLD_INTERVAL_MS: u64 = 300;
/// The successor's interval.
const NEW_INTERVAL_MS: u64 = 100;

/// The predecessor's lease + `LEASE_MARGIN`.
fn predecessor_wait() -> Duration {
    Duration::from_millis(lease_ms(OLD_INTERVAL_MS)) + LEASE_MARGIN
}

#[tokio::test]
async fn a_new_incarnation_gets_no_lease_until_its_predecessors_last_lease_ran_out() {
    assert!(
        Duration::from_millis(lease_ms(NEW_INTERVAL_MS)) + LEASE_MARGIN < predecessor_wait(),
        "the test tells the two waits apart"
    );
    let kv = memory_kv();
    let m = raft_metasrv(&kv, vec![1]).await;
    let created = create(&m, "waits", 2).await;
    let mine = regions_of(&created, 1);
    let registry = m.datanode_registry();
    registry.begin_term();

    registry
        .register(&register_request(1, "dn1-a:4001", OLD_INTERVAL_MS))
        .await
        .unwrap();
    assert_eq!(
        leased(&beat(registry, 1, 1, OLD_INTERVAL_MS, &mine, 0).await),
        mine
    );
    let before_last_grant = Instant::now();
    assert_eq!(
        leased(&beat(registry, 1, 1, OLD_INTERVAL_MS, &mine, 0).await),
        mine,
        "incarnation 1's last grant"
    );

    // Incarnation 1 stops heartbeating; incarnation 2 is accepted once two of its intervals passed.
    let second = register_once_allowed(
        registry,
        &register_request(1, "dn1-b:4001", NEW_INTERVAL_MS),
    )
    .await;
    assert_eq!(second.incarnation, 2);
    assert!(!record(&kv, 1).await.cleared);

    let first = beat(registry, 1, 2, NEW_INTERVAL_MS, &mine, 0).await;
    assert!(first.leases.is_empty(), "{first:?}");
    let wait_ms = u64::try_from(predecessor_wait().as_millis()).unwrap();
    assert!(
        first.leases_in_ms.is_some_and(|ms| ms > 0 && ms <= wait_ms),
        "held back at most the predecessor's lease + margin: {first:?}"
    );
    assert!(
        first.instructions.is_empty(),
        "its regions are reported open: {first:?}"
    );
    let listed = registry.list();
    assert_eq!(listed[0].incarnation, 2);
    assert!(
        listed[0].leases_in_ms.is_some_and(|ms| ms > 0),
        "{listed:?}"
    );
    assert!(!record(&kv, 1).await.cleared, "not cleared while it waits");

    let (granted, granted_at) = beat_until_leased(registry, 1, 2, NEW_INTERVAL_MS, &mine).await;
    assert_eq!(leased(&granted), mine);
    assert!(
        granted_at.duration_since(before_last_grant) >= predecessor_wait(),
        "granted {:?} after the predecessor's last grant, before its lease + margin ({:?}) ran out",
        granted_at.duration_since(before_last_grant),
        predecessor_wait()
    );
    assert!(
        record(&kv, 1).await.cleared,
        "the record says it waited its predecessor out"
    );
    assert_eq!(registry.list()[0].leases_in_ms, None);
    m.stop().await.unwrap();
}

#[tokio::test]
async fn after_a_failover_a_cleared_incarnation_is_granted_at_once() {
    let kv = memory_kv();
    let m = raft_metasrv(&kv, vec![1]).await;
    let created = create(&m, "failover_cleared", 2).await;
    let mine = regions_of(&created, 1);
    let registry = m.datanode_registry();
    registry.begin_term();

    // Incarnation 2 replaces 1 and waits it out in this term, which clears its record.
    registry
        .register(&register_request(1, "dn1-a:4001", OLD_INTERVAL_MS))
        .await
        .unwrap();
    registry
        .register(&register_request(1, "dn1-b:4001", NEW_INTERVAL_MS))
        .await
        .unwrap();
    let (granted, _) = beat_until_leased(registry, 1, 2, NEW_INTERVAL_MS, &mine).await;
    assert_eq!(leased(&granted), mine);
    let cleared = record(&kv, 1).await;
    assert_eq!(
        (
            cleared.incarnation,
            cleared.cleared,
            cleared.previous_lease_ms
        ),
        (2, true, lease_ms(OLD_INTERVAL_MS))
    );

    // A new term knows nothing of it but its record: cleared, so whatever lease is out there is its own.
    registry.end_term();
    registry.begin_term();
    let response = beat(registry, 1, 2, NEW_INTERVAL_MS, &mine, 0).await;
    assert_eq!(leased(&response), mine, "{response:?}");
    assert_eq!(response.leases_in_ms, None);
    m.stop().await.unwrap();
}

#[tokio::test]
async fn after_a_failover_an_incarnation_not_cleared_waits_its_predecessors_lease() {
    let kv = memory_kv();
    let m = raft_metasrv(&kv, vec![1]).await;
    let created = create(&m, "failover_not_cleared", 2).await;
    let mine = regions_of(&created, 1);
    let registry = m.datanode_registry();
    registry.begin_term();

    registry
        .register(&register_request(1, "dn1-a:4001", OLD_INTERVAL_MS))
        .await
        .unwrap();
    registry
        .register(&register_request(1, "dn1-b:4001", NEW_INTERVAL_MS))
        .await
        .unwrap();
    let registered = record(&kv, 1).await;
    assert_eq!(
        (
            registered.incarnation,
            registered.cleared,
            registered.previous_lease_ms
        ),
        (2, false, lease_ms(OLD_INTERVAL_MS)),
        "registered, never granted"
    );

    // The leader fails over before incarnation 2 got any lease: the previous leader may have granted
    // incarnation 1 a lease up to the end of its term.
    let before_term = Instant::now();
    registry.end_term();
    registry.begin_term();
    let first = beat(registry, 1, 2, NEW_INTERVAL_MS, &mine, 0).await;
    assert!(first.leases.is_empty(), "{first:?}");
    let wait_ms = u64::try_from(predecessor_wait().as_millis()).unwrap();
    assert!(
        first.leases_in_ms.is_some_and(|ms| ms > 0 && ms <= wait_ms),
        "{first:?}"
    );

    let (granted, granted_at) = beat_until_leased(registry, 1, 2, NEW_INTERVAL_MS, &mine).await;
    assert_eq!(leased(&granted), mine);
    assert!(
        granted_at.duration_since(before_term) >= predecessor_wait(),
        "granted {:?} into the term, before the predecessor's lease + margin ({:?})",
        granted_at.duration_since(before_term),
        predecessor_wait()
    );
    assert!(record(&kv, 1).await.cleared);
    m.stop().await.unwrap();
}

/// The interval incarnation 1 registers with in the fixed-lease test (its lease, and so its successor's wait).
const REGISTERED_INTERVAL_MS: u64 = 100;
/// The longer interval its heartbeat then reports: two of them (when a successor may register) end before
/// `lease_for` of it would, so a lease reckoned from this interval would still run when the successor is granted.
const REPORTED_INTERVAL_MS: u64 = 600;

#[tokio::test]
async fn a_heartbeat_grants_the_lease_fixed_at_registration_so_a_successor_waits_out_every_granted_lease()
 {
    assert!(
        Duration::from_millis(lease_ms(REPORTED_INTERVAL_MS))
            > Duration::from_millis(lease_ms(REGISTERED_INTERVAL_MS)) + LEASE_MARGIN,
        "a lease of the reported interval would outlast the successor's wait"
    );
    let kv = memory_kv();
    let m = raft_metasrv(&kv, vec![1]).await;
    let created = create(&m, "fixed_lease", 2).await;
    let mine = regions_of(&created, 1);
    let registry = m.datanode_registry();
    registry.begin_term();

    registry
        .register(&register_request(1, "dn1-a:4001", REGISTERED_INTERVAL_MS))
        .await
        .unwrap();
    let fixed = record(&kv, 1).await.lease_ms;
    assert_eq!(fixed, lease_ms(REGISTERED_INTERVAL_MS));

    // Its one heartbeat reports a longer interval: the leases still last what the record says.
    let before_grant = Instant::now();
    let granted = beat(registry, 1, 1, REPORTED_INTERVAL_MS, &mine, 0).await;
    assert_eq!(leased(&granted), mine);
    for lease in &granted.leases {
        assert_eq!(
            lease.duration_ms, fixed,
            "the lease fixed at registration, not lease_for({REPORTED_INTERVAL_MS} ms): {granted:?}"
        );
    }
    let longest = granted
        .leases
        .iter()
        .map(|l| l.duration_ms)
        .max()
        .expect("leases granted");

    // It stops; its successor registers as soon as it may, and gets no lease before every granted one ran out.
    let second = register_once_allowed(
        registry,
        &register_request(1, "dn1-b:4001", REGISTERED_INTERVAL_MS),
    )
    .await;
    assert_eq!(second.incarnation, 2);
    let (successor, granted_at) =
        beat_until_leased(registry, 1, 2, REGISTERED_INTERVAL_MS, &mine).await;
    assert_eq!(leased(&successor), mine);
    let wait = Duration::from_millis(longest) + LEASE_MARGIN;
    assert!(
        granted_at.duration_since(before_grant) >= wait,
        "the successor was granted {:?} after its predecessor's grant of {longest} ms leases (+ margin: {wait:?})",
        granted_at.duration_since(before_grant)
    );
    m.stop().await.unwrap();
}

/// Incarnation 1's interval in the chain tests: its lease is the longest of the chain.
const FIRST_INTERVAL_MS: u64 = 1_000;

/// Incarnation 1's lease + `LEASE_MARGIN`.
fn first_wait() -> Duration {
    Duration::from_millis(lease_ms(FIRST_INTERVAL_MS)) + LEASE_MARGIN
}

#[tokio::test]
async fn a_new_incarnation_never_skips_the_pending_wait_of_a_predecessor_that_never_heartbeated() {
    assert!(
        lease_ms(NEW_INTERVAL_MS) < lease_ms(FIRST_INTERVAL_MS),
        "the later incarnations' own leases are shorter than the first's"
    );
    let kv = memory_kv();
    let m = raft_metasrv(&kv, vec![1]).await;
    let created = create(&m, "pending_wait", 2).await;
    let mine = regions_of(&created, 1);
    let registry = m.datanode_registry();
    registry.begin_term();

    registry
        .register(&register_request(1, "dn1-a:4001", FIRST_INTERVAL_MS))
        .await
        .unwrap();
    let before_last_grant = Instant::now();
    assert_eq!(
        leased(&beat(registry, 1, 1, FIRST_INTERVAL_MS, &mine, 0).await),
        mine,
        "incarnation 1's last grant"
    );

    // After two silent intervals incarnation 2 registers; it never heartbeats, so incarnation 3 registers at once,
    // while incarnation 2 still waits out incarnation 1's lease.
    let second = register_once_allowed(
        registry,
        &register_request(1, "dn1-b:4001", NEW_INTERVAL_MS),
    )
    .await;
    assert_eq!(second.incarnation, 2);
    let third = registry
        .register(&register_request(1, "dn1-c:4001", NEW_INTERVAL_MS))
        .await
        .unwrap();
    assert_eq!(third.incarnation, 3);
    assert!(
        registry.list()[0].leases_in_ms.is_some_and(|ms| ms > 0),
        "incarnation 3 inherits the wait: {:?}",
        registry.list()
    );

    let (granted, granted_at) = beat_until_leased(registry, 1, 3, NEW_INTERVAL_MS, &mine).await;
    assert_eq!(leased(&granted), mine);
    assert!(
        granted_at.duration_since(before_last_grant) >= first_wait(),
        "incarnation 3 was granted {:?} after incarnation 1's last grant, before its lease + margin ({:?})",
        granted_at.duration_since(before_last_grant),
        first_wait()
    );
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_chain_of_incarnations_never_cleared_keeps_the_longest_lease_to_wait_out_after_a_failover()
 {
    let kv = memory_kv();
    let m = raft_metasrv(&kv, vec![1]).await;
    let created = create(&m, "longest_lease", 2).await;
    let mine = regions_of(&created, 1);
    let registry = m.datanode_registry();
    registry.begin_term();

    // Incarnation 1 (the long lease), then 2 and 3 (short leases), neither of which ever got a lease.
    registry
        .register(&register_request(1, "dn1-a:4001", FIRST_INTERVAL_MS))
        .await
        .unwrap();
    registry
        .register(&register_request(1, "dn1-b:4001", NEW_INTERVAL_MS))
        .await
        .unwrap();
    assert_eq!(
        record(&kv, 1).await.previous_lease_ms,
        lease_ms(FIRST_INTERVAL_MS)
    );
    registry
        .register(&register_request(1, "dn1-c:4001", NEW_INTERVAL_MS))
        .await
        .unwrap();
    assert_eq!(
        record(&kv, 1).await,
        DatanodeRecord {
            incarnation: 3,
            address: "dn1-c:4001".to_string(),
            lease_ms: lease_ms(NEW_INTERVAL_MS),
            previous_lease_ms: lease_ms(FIRST_INTERVAL_MS),
            cleared: false,
            retired: false,
        },
        "incarnation 2 was not cleared: incarnation 1's longer lease is still the one to wait out"
    );

    // A new leader loads incarnation 3 from its record and waits that lease from its term's start.
    let before_term = Instant::now();
    registry.end_term();
    registry.begin_term();
    let (granted, granted_at) = beat_until_leased(registry, 1, 3, NEW_INTERVAL_MS, &mine).await;
    assert_eq!(leased(&granted), mine);
    assert!(
        granted_at.duration_since(before_term) >= first_wait(),
        "granted {:?} into the term, before incarnation 1's lease + margin ({:?})",
        granted_at.duration_since(before_term),
        first_wait()
    );
    assert!(record(&kv, 1).await.cleared);
    m.stop().await.unwrap();
}
