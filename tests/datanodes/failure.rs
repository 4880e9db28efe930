//! Failure detection on the leader: a datanode whose heartbeats stop is suspected once its phi passes
//! `[failover] phi_threshold`, never during the term's warm-up (two of its leases from the term's start), and a
//! datanode that keeps heartbeating is never suspected.

use remote_wal::config::FailoverConfig;

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
