//! The leader election on the shared etcd (`ETCD_ENDPOINTS`): who wins, the epoch it hands the state store, and a
//! leader key deleted behind the leader's back ending its writes and its term.

use std::sync::Arc;
use std::time::Duration;

use procedures::record::EPOCH_KEY;
use procedures::{
    Condition, LocalManager, ManagerConfig, ProcedureManager, StateStore, WriteOp, WriteOutcome,
};
use remote_wal::kv::KvBackendRef;
use remote_wal::kv::NamespacedKvBackend;
use remote_wal::kv::etcd::{EtcdConfig, EtcdKvBackend};
use remote_wal::kv::state_store::{KvStateStore, LeaderFence};
use remote_wal::metasrv::election::{Election, ElectionConfig, ElectionStore};

use crate::support::fault_proxy::{Fault, FaultProxy};
use crate::support::{require_endpoints, unique};

/// A bound on waits that should end at once; only a broken election reaches it.
const BOUND: Duration = Duration::from_secs(20);
/// The lease TTL every election here runs with.
const TTL: Duration = Duration::from_secs(2);

async fn election(
    endpoints: &[String],
    prefix: &str,
    address: &str,
) -> (Election, Arc<LeaderFence>) {
    let fence = Arc::new(LeaderFence::new());
    let election = Election::connect(
        ElectionConfig {
            store: ElectionStore::Etcd {
                endpoints: endpoints.to_vec(),
                security: Default::default(),
            },
            connect_timeout: Duration::from_secs(5),
            key_prefix: prefix.to_string(),
            advertise: address.to_string(),
            lease_ttl: TTL,
        },
        fence.clone(),
    )
    .await
    .unwrap();
    (election, fence)
}

/// A state store on etcd `endpoints` (directly, not through any proxy) under `prefix`, writing under `fence`.
async fn fenced_store(
    endpoints: &[String],
    prefix: &str,
    fence: &Arc<LeaderFence>,
) -> Arc<KvStateStore> {
    let etcd: KvBackendRef = Arc::new(
        EtcdKvBackend::connect(EtcdConfig::new(endpoints.to_vec()))
            .await
            .unwrap(),
    );
    let kv: KvBackendRef = Arc::new(NamespacedKvBackend::new(etcd, prefix.to_string()));
    Arc::new(KvStateStore::new(kv).with_leader_fence(fence.clone()))
}

#[tokio::test]
async fn a_resigned_leader_hands_over_with_a_larger_epoch() {
    let endpoints = require_endpoints("ETCD_ENDPOINTS", "etcd");
    let prefix = format!("{}/", unique("election"));
    let (a, fence_a) = election(&endpoints, &prefix, "10.0.0.1:3002").await;
    let (b, fence_b) = election(&endpoints, &prefix, "10.0.0.2:3002").await;
    assert_eq!(a.leader().await.unwrap(), None);

    let term_a = tokio::time::timeout(BOUND, a.campaign())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(fence_a.current().map(|l| l.epoch), Some(term_a.epoch()));
    let leader = b.leader().await.unwrap().unwrap();
    assert_eq!(leader.address, "10.0.0.1:3002");
    assert_eq!(leader.epoch, term_a.epoch());

    let b = Arc::new(b);
    let campaigning = {
        let b = b.clone();
        tokio::spawn(async move { b.campaign().await })
    };
    // B is a candidate, not the leader, while A holds the term.
    assert_eq!(
        a.leader().await.unwrap().map(|l| l.epoch),
        Some(term_a.epoch())
    );
    let epoch_a = term_a.epoch();
    a.resign(term_a).await;
    assert_eq!(fence_a.current(), None);
    let term_b = tokio::time::timeout(BOUND, campaigning)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        term_b.epoch() > epoch_a,
        "{} after {epoch_a}",
        term_b.epoch()
    );
    assert_eq!(fence_b.current().map(|l| l.epoch), Some(term_b.epoch()));
    let leader = a.leader().await.unwrap().unwrap();
    assert_eq!(leader.address, "10.0.0.2:3002");
    b.resign(term_b).await;
}

#[tokio::test]
async fn a_leader_key_deleted_under_the_leader_fences_its_writes_and_ends_its_term() {
    let endpoints = require_endpoints("ETCD_ENDPOINTS", "etcd");
    let prefix = format!("{}/", unique("election"));
    let (leader, fence) = election(&endpoints, &prefix, "10.0.0.3:3002").await;
    let mut term = tokio::time::timeout(BOUND, leader.campaign())
        .await
        .unwrap()
        .unwrap();

    let etcd: KvBackendRef = Arc::new(
        EtcdKvBackend::connect(EtcdConfig::new(endpoints.clone()))
            .await
            .unwrap(),
    );
    let kv: KvBackendRef = Arc::new(NamespacedKvBackend::new(etcd.clone(), prefix.clone()));
    let store = Arc::new(KvStateStore::new(kv.clone()).with_leader_fence(fence.clone()));
    let manager = LocalManager::new(store.clone(), ManagerConfig::default());
    manager.start().await.unwrap();
    assert_eq!(manager.epoch(), Some(term.epoch()));
    manager.stop().await.unwrap();

    let epoch = term.epoch();
    let write = |key: &str| {
        (
            vec![Condition::Equals {
                key: EPOCH_KEY.to_string(),
                value: epoch.to_string().into_bytes(),
            }],
            vec![WriteOp::Put {
                key: key.to_string(),
                value: b"v".to_vec(),
            }],
        )
    };
    let (conditions, ops) = write("proc/kept");
    assert_eq!(
        store.write(conditions, ops).await.unwrap(),
        WriteOutcome::Applied
    );

    // The leader key goes away as it would when the lease expires.
    let lease = fence.current().unwrap();
    etcd.batch_delete(&[[prefix.as_bytes(), lease.key.as_slice()].concat()], false)
        .await
        .unwrap();
    let (conditions, ops) = write("proc/refused");
    let outcome = store.write(conditions, ops).await.unwrap();
    assert!(
        matches!(&outcome, WriteOutcome::Rejected { current } if current[0].1.as_deref() != Some(epoch.to_string().as_bytes())),
        "{outcome:?}"
    );
    assert!(store.get("proc/refused").await.unwrap().is_none());
    assert_eq!(store.get("proc/kept").await.unwrap(), Some(b"v".to_vec()));
    assert_eq!(fence.fenced_writes(), 1);
    tokio::time::timeout(BOUND, term.lost()).await.unwrap();
    assert!(term.is_lost());
    leader.resign(term).await;
}

/// A member that is down (an address nothing listens on, first in the list) costs a refused connection: every
/// call of the election (reading the leader, granting and keeping the lease, campaigning, resigning, revoking)
/// moves past it to a live member instead of failing.
#[tokio::test]
async fn a_member_refusing_connections_is_passed_over_by_every_election_call() {
    let live = require_endpoints("ETCD_ENDPOINTS", "etcd");
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.to_string())
        .unwrap();
    let mut endpoints = vec![dead];
    endpoints.extend(live);
    let prefix = format!("{}/", unique("election"));
    let (a, fence) = election(&endpoints, &prefix, "10.0.0.1:3002").await;
    for _ in 0..10 {
        assert_eq!(a.leader().await.unwrap(), None);
    }
    for round in 0..5 {
        let term = tokio::time::timeout(BOUND, a.campaign())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(fence.current().map(|l| l.epoch), Some(term.epoch()));
        let leader = a.leader().await.unwrap().unwrap();
        assert_eq!(leader.epoch, term.epoch());
        if round == 0 {
            // Several keep-alive rounds (one every third of the 2 s TTL): the term stays proven.
            tokio::time::sleep(Duration::from_secs(3)).await;
            assert!(
                !term.is_lost(),
                "the keep-alive failed past the dead member"
            );
        }
        a.resign(term).await;
        // Resigned: the leader key is gone at once (not when the lease would expire).
        assert_eq!(a.leader().await.unwrap(), None, "round {round}");
    }
}

/// How long the proxy holds a keep-alive before it closes the connection it came on.
const CLOSE_AFTER: Duration = Duration::from_millis(500);

/// A TCP proxy to `target`. Once frozen, it holds the next chunk the client sends without forwarding it, closes
/// that connection [`CLOSE_AFTER`] later, and from then on accepts connections but forwards nothing and answers
/// nothing: a member whose stream breaks while a keep-alive waits for its answer, and which then stops answering.
/// Returns its address, the freeze switch and the moment it held the chunk.
async fn freezable_proxy(
    target: String,
) -> (
    String,
    Arc<std::sync::atomic::AtomicBool>,
    Arc<std::sync::Mutex<Option<tokio::time::Instant>>>,
) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let frozen = Arc::new(AtomicBool::new(false));
    let held_at: Arc<std::sync::Mutex<Option<tokio::time::Instant>>> = Arc::default();
    let (switch, held) = (frozen.clone(), held_at.clone());
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            if switch.load(Ordering::SeqCst) {
                // Accepted, never answered.
                tokio::spawn(async move {
                    let _open = client;
                    std::future::pending::<()>().await;
                });
                continue;
            }
            let Ok(server) = tokio::net::TcpStream::connect(&target).await else {
                continue;
            };
            let (switch, held) = (switch.clone(), held.clone());
            tokio::spawn(async move {
                let (mut from_client, mut to_client) = client.into_split();
                let (mut from_server, mut to_server) = server.into_split();
                let (mut up, mut down) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
                loop {
                    tokio::select! {
                        n = from_client.read(&mut up) => {
                            let n = match n {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if switch.load(Ordering::SeqCst) {
                                held.lock().unwrap().get_or_insert_with(tokio::time::Instant::now);
                                tokio::time::sleep(CLOSE_AFTER).await;
                                return;
                            }
                            if to_server.write_all(&up[..n]).await.is_err() {
                                return;
                            }
                        }
                        n = from_server.read(&mut down) => {
                            let n = match n {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if to_client.write_all(&down[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    (address, frozen, held_at)
}

/// etcd stops answering as a keep-alive goes out, and the stream breaks while that keep-alive waits for its answer;
/// the member accepts connections but answers nothing after that, so replacing the stream hangs. The term's bound
/// is the fence's: two thirds of the TTL after the send of the last acknowledged keep-alive, so before the freeze
/// plus two thirds of the TTL, and it does not move while the upkeep tries to reopen the stream. From that instant
/// on the fence holds nothing whatever the upkeep is doing (the stream's replacement once ran to its own timeout
/// before the deadline was looked at, stretching the term by up to a third of the TTL: the margin kept before etcd
/// may expire the lease), and the term is declared lost.
#[tokio::test]
async fn a_term_ends_two_thirds_of_the_ttl_after_the_last_acknowledged_keep_alive_even_while_reopening()
 {
    let live = require_endpoints("ETCD_ENDPOINTS", "etcd");
    let (proxy, freeze, held_at) = freezable_proxy(live[0].clone()).await;
    let prefix = format!("{}/", unique("election"));
    let (a, fence) = election(&[proxy], &prefix, "10.0.0.1:3002").await;
    let mut term = tokio::time::timeout(BOUND, a.campaign())
        .await
        .unwrap()
        .unwrap();
    // A few keep-alive rounds (every third of the 2 s TTL) go through, then everything is held.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!term.is_lost());
    let proven_before = fence.proven_until().expect("a term is bounded");
    let frozen_at = std::time::Instant::now();
    freeze.store(true, std::sync::atomic::Ordering::SeqCst);
    // Every keep-alive acknowledged after this was sent before it: its bytes passed the proxy before the freeze.
    let bound = frozen_at + TTL * 2 / 3;
    tokio::time::timeout(BOUND, term.lost()).await.unwrap();
    assert!(held_at.lock().unwrap().is_some(), "a keep-alive was held");
    assert!(fence.current().is_none(), "the fence outlived the term");
    let proven = fence.proven_until().expect("a term is bounded");
    assert!(proven >= proven_before, "the bound went back");
    assert!(
        proven < bound,
        "the fence was proven {:?} past the freeze: longer than two thirds of the TTL after any acknowledged \
         keep-alive",
        proven - frozen_at
    );
    println!(
        "fence proven until {} ms after the freeze; term declared lost {} ms after it",
        (proven - frozen_at).as_millis(),
        frozen_at.elapsed().as_millis()
    );
}

/// Request load cannot cost the term: the runtime the election was made on (this test's, one thread) is blocked
/// for two TTLs, as a burst of work that never yields would block it. The lease's upkeep runs on a thread of its
/// own with connections of its own, so the lease stays alive, the fence stays proven and the term is not lost;
/// a write under the fence is applied afterwards. On the server's runtime the keep-alive would not have been sent,
/// etcd would have expired the lease, and the upkeep would have declared the term lost on its next poll.
#[tokio::test(flavor = "current_thread")]
async fn a_term_outlives_its_runtime_blocked_for_two_ttls() {
    let endpoints = require_endpoints("ETCD_ENDPOINTS", "etcd");
    let prefix = format!("{}/", unique("election"));
    let (a, fence) = election(&endpoints, &prefix, "10.0.0.1:3002").await;
    let term = tokio::time::timeout(BOUND, a.campaign())
        .await
        .unwrap()
        .unwrap();
    let store = fenced_store(&endpoints, &prefix, &fence).await;
    let manager = LocalManager::new(store.clone(), ManagerConfig::default());
    manager.start().await.unwrap();
    manager.stop().await.unwrap();
    let proven_before = fence.proven_until().expect("a term is bounded");

    // Blocks the only thread of the runtime the election, the store and the test run on.
    std::thread::sleep(TTL * 2);

    assert!(
        !term.is_lost(),
        "the term was lost while its runtime was blocked"
    );
    assert!(
        fence.proven_until().expect("a term is bounded") > proven_before + TTL,
        "the upkeep did not renew the lease while the runtime was blocked"
    );
    assert_eq!(fence.current().map(|l| l.epoch), Some(term.epoch()));
    let outcome = store
        .write(
            vec![Condition::Equals {
                key: EPOCH_KEY.to_string(),
                value: term.epoch().to_string().into_bytes(),
            }],
            vec![WriteOp::Put {
                key: "proc/after-the-block".to_string(),
                value: b"v".to_vec(),
            }],
        )
        .await
        .unwrap();
    assert_eq!(outcome, WriteOutcome::Applied);
    assert_eq!(fence.fenced_writes(), 0);
    a.resign(term).await;
}

/// The member the leader's calls start at stops answering (blackholed: connections accepted, nothing answered, no
/// error). The lease's upkeep keeps streams on two members, so the other goes on proving the lease: every write
/// under the fence, one every 200 ms over three TTLs, is applied — etcd would refuse them once the lease expired
/// and its leader key went with it — and the term is never lost. A second candidate whose first member is the
/// blackholed one still reaches etcd (its calls move on) and waits as a follower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_first_member_is_blackholed_keeps_its_term() {
    let live = require_endpoints("ETCD_ENDPOINTS", "etcd");
    let first = FaultProxy::start(&live[0]);
    let second = FaultProxy::start(&live[0]);
    let endpoints = vec![first.address().to_string(), second.address().to_string()];
    let prefix = format!("{}/", unique("election"));
    let (leader, fence) = election(&endpoints, &prefix, "10.0.0.1:3002").await;
    let term = tokio::time::timeout(BOUND, leader.campaign())
        .await
        .unwrap()
        .unwrap();
    let store = fenced_store(&live, &prefix, &fence).await;
    let manager = LocalManager::new(store.clone(), ManagerConfig::default());
    manager.start().await.unwrap();
    assert_eq!(manager.epoch(), Some(term.epoch()));
    manager.stop().await.unwrap();
    let epoch = term.epoch().to_string().into_bytes();

    first.set(Fault::Blackhole);
    let writes = 30;
    for i in 0..writes {
        let outcome = store
            .write(
                vec![Condition::Equals {
                    key: EPOCH_KEY.to_string(),
                    value: epoch.clone(),
                }],
                vec![WriteOp::Put {
                    key: format!("proc/w{i}"),
                    value: b"v".to_vec(),
                }],
            )
            .await
            .unwrap();
        assert_eq!(
            outcome,
            WriteOutcome::Applied,
            "write {i} ({} ms after the blackhole) was refused: the lease was not kept alive",
            i * 200
        );
        assert!(!term.is_lost(), "the term was lost by write {i}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(fence.fenced_writes(), 0);

    let (follower, follower_fence) = election(&endpoints, &prefix, "10.0.0.2:3002").await;
    let seen = tokio::time::timeout(BOUND, follower.leader())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(seen.address, "10.0.0.1:3002");
    assert_eq!(seen.epoch, term.epoch());
    let follower = Arc::new(follower);
    let campaigning = {
        let follower = follower.clone();
        tokio::spawn(async move { follower.campaign().await })
    };
    leader.resign(term).await;
    let follower_term = tokio::time::timeout(BOUND, campaigning)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(follower_term.epoch() > seen.epoch);
    assert_eq!(
        follower_fence.current().map(|l| l.epoch),
        Some(follower_term.epoch())
    );
    follower.resign(follower_term).await;
}

/// A candidate whose campaign waits behind a leader for longer than etcd's ping policy tolerates bad pings (its
/// `--grpc-keepalive-min-time`, 5 s: three pings sooner than that close the connection) with nothing else on its
/// connections, and then wins when the leader resigns: the campaign call it made at first is the one that wins.
/// With pings every second the waiting campaign's connection was closed every few seconds and the campaign failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_waiting_twenty_seconds_behind_a_leader_wins_when_it_resigns() {
    let endpoints = require_endpoints("ETCD_ENDPOINTS", "etcd");
    let prefix = format!("{}/", unique("election"));
    let (a, _) = election(&endpoints, &prefix, "10.0.0.1:3002").await;
    let (b, fence_b) = election(&endpoints, &prefix, "10.0.0.2:3002").await;
    let term_a = tokio::time::timeout(BOUND, a.campaign())
        .await
        .unwrap()
        .unwrap();
    let b = Arc::new(b);
    let campaigning = {
        let b = b.clone();
        tokio::spawn(async move { b.campaign().await })
    };
    tokio::time::sleep(Duration::from_secs(20)).await;
    let epoch_a = term_a.epoch();
    a.resign(term_a).await;
    let term_b = tokio::time::timeout(BOUND, campaigning)
        .await
        .unwrap()
        .unwrap()
        .unwrap_or_else(|e| panic!("the waiting campaign failed: {e}"));
    assert!(term_b.epoch() > epoch_a);
    assert_eq!(fence_b.current().map(|l| l.epoch), Some(term_b.epoch()));
    b.resign(term_b).await;
}
