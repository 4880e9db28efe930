//! Failure detection on the leader: a datanode whose heartbeats stop is suspected once its phi passes
//! `[failover] phi_threshold`, never during the term's warm-up (two of its leases from the term's start), and a
//! datanode that keeps heartbeating is never suspected. What the metasrv fails over: the suspected incarnations,
//! and registered datanodes that never heartbeated to this leader once the warm-up passed, each retired first (a
//! zombie of it is refused and a restart is a new incarnation); `[failover] enabled = false`, or the raft-engine WAL
//! (no region could move), fails over nothing.

use remote_wal::config::FailoverConfig;
use remote_wal::metasrv::datanodes::HANDOVER_POLL;

use super::*;

#[tokio::test]
async fn a_silent_datanode_is_suspected_after_the_warm_up_and_a_live_one_never() {
    let kv = memory_kv();
    let mut cfg = config(WalConfig::RaftEngine, vec![1, 2]);
    cfg.failover = FailoverConfig {
        enabled: true,
        phi_threshold: 8.0,
        acceptable_pause: Duration::ZERO,
        min_std: Duration::from_millis(1),
    };
    let m = Metasrv::with_parts(
        cfg,
        kv.clone(),
        None,
        Arc::new(MemoryDatanodeManager::new()),
    )
    .expect("valid config");
    m.start().await.expect("start");
    let registry = m.datanode_registry();
    let before_term = Instant::now();
    registry.begin_term();
    for id in [1, 2] {
        registry
            .register(&register_request(id, &format!("dn{id}:4001"), 200))
            .await
            .unwrap();
        beat(registry, id, 1, 200, &[], 0).await;
    }
    // Lease 3 × 200 ms + 1 s; the warm-up is two of them.
    let warm_up = 2 * Duration::from_millis(lease_ms(200));
    let mut seen_held_back = false;
    for _ in 0..POLLS {
        beat(registry, 1, 1, 200, &[], 0).await;
        let listed = registry.list();
        let observed = Instant::now();
        let one = listed
            .iter()
            .find(|d| d.id == 1)
            .expect("datanode 1 listed");
        let two = listed
            .iter()
            .find(|d| d.id == 2)
            .expect("datanode 2 listed");
        assert!(
            !one.suspected,
            "a heartbeating datanode is never suspected: {one:?}"
        );
        if observed.duration_since(before_term) < warm_up {
            assert!(!two.suspected, "suspected during the warm-up: {two:?}");
            seen_held_back |= two.phi >= 8.0;
        }
        if two.suspected {
            assert!(two.phi >= 8.0, "{two:?}");
            assert_eq!(registry.suspects(), vec![2]);
            assert_eq!(registry.failed().await.unwrap(), vec![(2, 1)]);
            assert_eq!(registry.live(), vec![1]);
            assert!(
                seen_held_back,
                "datanode 2's phi passed the threshold within the warm-up and was held back first"
            );
            m.stop().await.unwrap();
            return;
        }
        tokio::time::sleep(POLL).await;
    }
    panic!("datanode 2, silent, was never suspected");
}

#[test]
fn failover_settings_out_of_range_are_refused_naming_the_key() {
    for (toml, key) in [
        (
            "[failover]\nphi_threshold = 0.5\n",
            "failover.phi_threshold",
        ),
        (
            "[failover]\nacceptable_pause = \"1h\"\n",
            "failover.acceptable_pause",
        ),
        ("[failover]\nmin_std = \"0s\"\n", "failover.min_std"),
    ] {
        let err = MetasrvConfig::from_toml_str(toml, "test.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{toml}: {err}");
    }
    let ok = MetasrvConfig::from_toml_str(
        "[failover]\nenabled = false\nphi_threshold = 10\nacceptable_pause = \"5s\"\nmin_std = \"200ms\"\n",
        "test.toml",
    )
    .unwrap();
    assert_eq!(ok.failover.phi_threshold, 10.0);
    assert!(!ok.failover.enabled);
}

/// A metasrv whose detector suspects quickly, failover on or off, on the Kafka WAL (fake brokers) or raft-engine.
async fn quick_metasrv(kv: &KvBackendRef, enabled: bool, kafka: bool) -> Metasrv {
    let wal = if kafka {
        WalConfig::Kafka(KafkaConfig {
            num_topics: 1,
            topic_name_prefix: "failover_pool".to_string(),
            ..Default::default()
        })
    } else {
        WalConfig::RaftEngine
    };
    let mut cfg = config(wal, vec![1, 2, 3]);
    cfg.failover = FailoverConfig {
        enabled,
        phi_threshold: 8.0,
        acceptable_pause: Duration::ZERO,
        min_std: Duration::from_millis(1),
    };
    let m = Metasrv::with_parts(
        cfg,
        kv.clone(),
        kafka.then(|| Arc::new(FakeTopicAdmin::new()) as _),
        Arc::new(MemoryDatanodeManager::new()),
    )
    .expect("valid config");
    m.start().await.expect("start");
    m
}

#[tokio::test]
async fn a_registered_datanode_never_heard_this_term_fails_after_the_warm_up_and_an_unregistered_one_never()
 {
    let kv = memory_kv();
    let m = quick_metasrv(&kv, true, true).await;
    let registry = m.datanode_registry();
    registry.begin_term();
    // Datanode 3 registered with an earlier leader (its record exists) and died: it never heartbeats to this one.
    let three = registry
        .register(&register_request(3, "dn3:4001", 200))
        .await
        .unwrap()
        .incarnation;
    registry.end_term();
    let term = Instant::now();
    registry.begin_term();
    registry
        .register(&register_request(1, "dn1:4001", 200))
        .await
        .unwrap();
    let warm_up = 2 * Duration::from_millis(lease_ms(200));
    for _ in 0..POLLS {
        beat(registry, 1, 1, 200, &[], 0).await;
        let failed = registry.failed().await.unwrap();
        if Instant::now().duration_since(term) < warm_up {
            assert!(
                failed.iter().all(|(id, _)| *id != 3),
                "failed during the warm-up: {failed:?}"
            );
        }
        if !failed.is_empty() {
            // Datanode 2 never registered: nothing of it to fail over.
            assert_eq!(failed, vec![(3, three)]);
            assert!(Instant::now().duration_since(term) >= warm_up);
            // Paused (maintenance): nothing is failed over, and the status says so.
            assert!(!m.pause_failover().await.unwrap());
            assert!(m.pause_failover().await.unwrap(), "paused already");
            assert!(m.fail_over_failed_datanodes().await.unwrap().is_empty());
            let status = m.failover_status().await.unwrap();
            assert!(status.enabled && status.paused, "{status:?}");
            assert_eq!(status.failed.len(), 1);
            assert!(m.resume_failover().await.unwrap());
            assert!(!m.resume_failover().await.unwrap(), "resumed already");
            let answer = beat(registry, 1, 1, 200, &[], 0).await;
            assert_eq!(answer.heartbeat_in_ms, None, "{answer:?}");
            let submitted = m.fail_over_failed_datanodes().await.unwrap();
            // Datanode 3 is retired and its regions about to move: the others are asked to heartbeat often, so
            // their new regions' open instructions reach them at once.
            let answer = beat(registry, 1, 1, 200, &[], 0).await;
            assert!(
                answer
                    .heartbeat_in_ms
                    .is_some_and(|ms| ms <= HANDOVER_POLL.as_millis() as u64),
                "{answer:?}"
            );
            assert_eq!(
                submitted,
                vec![remote_wal::ddl::failover_procedure_id(3, three)]
            );
            // Submitting again starts nothing new: the incarnation is retired, no longer failed.
            assert!(m.fail_over_failed_datanodes().await.unwrap().is_empty());
            assert!(registry.failed().await.unwrap().is_empty());
            assert!(record(&kv, 3).await.retired);
            // Back from the dead, that incarnation is refused and must stop; a restart is a new incarnation.
            let err = registry
                .heartbeat(
                    &heartbeat_request(3, three, 200, Vec::new()),
                    &BTreeSet::new(),
                )
                .await
                .unwrap_err();
            assert!(
                matches!(err, remote_wal::Error::DatanodeRetired { .. }),
                "{err}"
            );
            let again = registry
                .register(&register_request(3, "dn3:4001", 200))
                .await
                .unwrap();
            assert_eq!(again.incarnation, three + 1);
            assert!(!record(&kv, 3).await.retired);
            m.stop().await.unwrap();
            return;
        }
        tokio::time::sleep(POLL).await;
    }
    panic!("datanode 3 was never found failed");
}

#[tokio::test]
async fn with_failover_disabled_nothing_is_failed_over() {
    nothing_is_failed_over(false, true).await;
}

#[tokio::test]
async fn on_the_raft_engine_wal_nothing_is_failed_over() {
    nothing_is_failed_over(true, false).await;
}

async fn nothing_is_failed_over(enabled: bool, kafka: bool) {
    let kv = memory_kv();
    let m = quick_metasrv(&kv, enabled, kafka).await;
    // Three regions, one per datanode (round-robin from datanode 1).
    let created = create(&m, "stays", 3).await;
    let on_three = regions_of(&created, 3);
    assert_eq!(on_three.len(), 1);
    let registry = m.datanode_registry();
    registry.begin_term();
    registry
        .register(&register_request(3, "dn3:4001", 200))
        .await
        .unwrap();
    beat(registry, 3, 1, 200, &[], 0).await;
    for _ in 0..POLLS {
        if !registry.failed().await.unwrap().is_empty() {
            assert!(m.fail_over_failed_datanodes().await.unwrap().is_empty());
            // On raft-engine its regions cannot lead anywhere until it returns, and the status says which.
            let status = m.failover_status().await.unwrap();
            let expected = if kafka { Vec::new() } else { on_three.clone() };
            assert_eq!(status.unavailable_regions, expected, "{status:?}");
            let failovers = m
                .list_procedures()
                .await
                .unwrap()
                .into_iter()
                .filter(|p| p.type_name == remote_wal::ddl::DATANODE_FAILOVER_TYPE_NAME)
                .count();
            assert_eq!(failovers, 0);
            m.stop().await.unwrap();
            return;
        }
        tokio::time::sleep(POLL).await;
    }
    panic!("datanode 3 was never found failed");
}
