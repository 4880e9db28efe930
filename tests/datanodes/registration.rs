//! Registrations: only configured ids, one incarnation more per registration (persisted in `__datanode/{id}`),
//! none while the current incarnation heartbeats; heartbeats from a replaced or never registered incarnation are
//! refused, and so is one that was in flight while the next incarnation registered.

use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use remote_wal::Error;
use remote_wal::kv::{KvWrapper, RangeRequest, RangeResponse};
use tokio::sync::Semaphore;

use super::*;

/// A memory store that, once armed, holds the next range read of datanode 1's `__dn_table/1/` records (the scan
/// of the registry's `RegionOpener` in a heartbeat) until the test releases it.
#[derive(Debug)]
struct StalledScan {
    inner: MemoryKvBackend,
    armed: AtomicBool,
    entered: Semaphore,
    release: Semaphore,
}

impl StalledScan {
    fn new() -> Self {
        StalledScan {
            inner: MemoryKvBackend::new(),
            armed: AtomicBool::new(false),
            entered: Semaphore::new(0),
            release: Semaphore::new(0),
        }
    }
}

#[async_trait]
impl KvWrapper for StalledScan {
    fn inner(&self) -> &dyn KvBackend {
        &self.inner
    }

    async fn range(&self, req: RangeRequest) -> remote_wal::kv::Result<RangeResponse> {
        if req.key.starts_with(b"__dn_table/1/") && self.armed.swap(false, Ordering::SeqCst) {
            self.entered.add_permits(1);
            self.release
                .acquire()
                .await
                .expect("the release semaphore stays open")
                .forget();
        }
        self.inner.range(req).await
    }
}

#[tokio::test]
async fn an_id_outside_the_configured_ids_is_refused_naming_the_id_and_the_ids() {
    let kv = memory_kv();
    let m = raft_metasrv(&kv, vec![1, 2]).await;
    let registry = m.datanode_registry();
    registry.begin_term();

    let err = registry
        .register(&register_request(9, "dn9:4001", 100))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::DatanodeUnknown { datanode_id: 9, ids } if ids == &vec![1, 2]),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "datanode 9 is not one of [datanodes] ids [1, 2]"
    );
    assert!(!err.is_retryable());
    // Nothing was written for it, and a heartbeat with that id is refused the same way.
    assert!(kv.get(datanode_key(9).as_bytes()).await.unwrap().is_none());
    let err = registry
        .heartbeat(&heartbeat_request(9, 1, 100, Vec::new()), &BTreeSet::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::DatanodeUnknown { datanode_id: 9, .. }),
        "{err:?}"
    );
    m.stop().await.unwrap();
}

#[tokio::test]
async fn each_registration_persists_the_next_incarnation() {
    let kv = memory_kv();
    let m = raft_metasrv(&kv, vec![1, 2]).await;
    let registry = m.datanode_registry();
    registry.begin_term();

    let first = registry
        .register(&register_request(1, "dn1-a:4001", 100))
        .await
        .unwrap();
    assert_eq!((first.datanode_id, first.incarnation), (1, 1));
    assert_eq!(
        record(&kv, 1).await,
        DatanodeRecord {
            incarnation: 1,
            address: "dn1-a:4001".to_string(),
            lease_ms: lease_ms(100),
            previous_lease_ms: 0,
            cleared: true,
            retired: false,
        },
        "the first incarnation ever has no predecessor to wait for"
    );

    // Incarnation 1 never heartbeated: a restart may register at once.
    let second = registry
        .register(&register_request(1, "dn1-b:4002", 250))
        .await
        .unwrap();
    assert_eq!((second.datanode_id, second.incarnation), (1, 2));
    assert_eq!(
        record(&kv, 1).await,
        DatanodeRecord {
            incarnation: 2,
            address: "dn1-b:4002".to_string(),
            lease_ms: lease_ms(250),
            previous_lease_ms: lease_ms(100),
            cleared: false,
            retired: false,
        }
    );

    // Another datanode's incarnations are its own.
    let other = registry
        .register(&register_request(2, "dn2:4001", 100))
        .await
        .unwrap();
    assert_eq!((other.datanode_id, other.incarnation), (2, 1));
    assert_eq!(record(&kv, 1).await.incarnation, 2);

    // The incarnation survives the term: a new leader continues from the stored record.
    registry.end_term();
    registry.begin_term();
    let third = registry
        .register(&register_request(1, "dn1-c:4003", 100))
        .await
        .unwrap();
    assert_eq!(third.incarnation, 3);
    assert_eq!(record(&kv, 1).await.incarnation, 3);
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_registration_while_the_current_incarnation_heartbeats_is_refused() {
    let kv = memory_kv();
    let m = raft_metasrv(&kv, vec![1]).await;
    let registry = m.datanode_registry();
    registry.begin_term();

    // A long interval: the heartbeat below stays within two of them for the rest of the test.
    let interval_ms = 30_000;
    let first = registry
        .register(&register_request(1, "dn1-a:4001", interval_ms))
        .await
        .unwrap();
    let request = HeartbeatRequest {
        address: "dn1-a:4001".to_string(),
        ..heartbeat_request(1, first.incarnation, interval_ms, Vec::new())
    };
    registry
        .heartbeat(&request, &BTreeSet::new())
        .await
        .unwrap();

    let err = registry
        .register(&register_request(1, "dn1-b:4002", 100))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::DatanodeStillHeartbeating { datanode_id: 1, incarnation: 1, address, .. }
                if address == "dn1-a:4001"
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.starts_with("datanode 1: incarnation 1 at dn1-a:4001 is still heartbeating"),
        "{text}"
    );
    assert!(err.is_retryable(), "{err:?}");
    // Refused before anything was written: the stored incarnation is still 1.
    assert_eq!(record(&kv, 1).await.incarnation, 1);
    assert_eq!(record(&kv, 1).await.address, "dn1-a:4001");
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_heartbeat_from_a_replaced_incarnation_is_refused_as_stale() {
    let kv = memory_kv();
    let m = raft_metasrv(&kv, vec![1]).await;
    let registry = m.datanode_registry();
    registry.begin_term();

    assert_eq!(
        registry
            .register(&register_request(1, "dn1-a:4001", 100))
            .await
            .unwrap()
            .incarnation,
        1
    );
    assert_eq!(
        registry
            .register(&register_request(1, "dn1-b:4001", 100))
            .await
            .unwrap()
            .incarnation,
        2
    );
    let stale = heartbeat_request(1, 1, 100, Vec::new());
    let err = registry
        .heartbeat(&stale, &BTreeSet::new())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::DatanodeStaleIncarnation {
                datanode_id: 1,
                incarnation: 1,
                current: 2
            }
        ),
        "{err:?}"
    );
    assert!(
        !err.is_retryable(),
        "a stale incarnation must stop: {err:?}"
    );

    // Also in a later term, which loads the record afresh.
    registry.end_term();
    registry.begin_term();
    let err = registry
        .heartbeat(&stale, &BTreeSet::new())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::DatanodeStaleIncarnation {
                incarnation: 1,
                current: 2,
                ..
            }
        ),
        "{err:?}"
    );
    // The current incarnation is accepted.
    registry
        .heartbeat(&heartbeat_request(1, 2, 100, Vec::new()), &BTreeSet::new())
        .await
        .expect("the current incarnation heartbeats");
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_heartbeat_from_an_incarnation_never_registered_is_refused() {
    let kv = memory_kv();
    let m = raft_metasrv(&kv, vec![1, 2]).await;
    let registry = m.datanode_registry();
    registry.begin_term();

    // Datanode 2 never registered at all.
    let err = registry
        .heartbeat(&heartbeat_request(2, 1, 100, Vec::new()), &BTreeSet::new())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::DatanodeNotRegistered {
                datanode_id: 2,
                incarnation: 1
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "datanode 2: incarnation 1 was never registered (register first)"
    );

    // Datanode 1 registered incarnations 1 and 2; 3 was never given.
    registry
        .register(&register_request(1, "dn1:4001", 100))
        .await
        .unwrap();
    registry
        .register(&register_request(1, "dn1:4001", 100))
        .await
        .unwrap();
    let err = registry
        .heartbeat(&heartbeat_request(1, 3, 100, Vec::new()), &BTreeSet::new())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::DatanodeNotRegistered {
                datanode_id: 1,
                incarnation: 3
            }
        ),
        "{err:?}"
    );
    // Refusing it changed nothing: incarnation 2 still heartbeats.
    assert_eq!(record(&kv, 1).await.incarnation, 2);
    registry
        .heartbeat(&heartbeat_request(1, 2, 100, Vec::new()), &BTreeSet::new())
        .await
        .expect("the current incarnation heartbeats");
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_heartbeat_in_flight_while_the_next_incarnation_registered_is_refused_as_stale_with_no_lease()
 {
    let store = Arc::new(StalledScan::new());
    let kv: KvBackendRef = store.clone();
    let m = raft_metasrv(&kv, vec![1]).await;
    let created = create(&m, "raced", 2).await;
    let mine = regions_of(&created, 1);
    let registry = m.datanode_registry();
    registry.begin_term();
    registry
        .register(&register_request(1, "dn1-a:4001", 100))
        .await
        .unwrap();
    assert_eq!(
        leased(&beat(registry, 1, 1, 100, &mine, 0).await),
        mine,
        "incarnation 1 holds its leases"
    );

    // Incarnation 1's next heartbeat is held at its scan of the route's regions; meanwhile (once it was silent
    // for two intervals) incarnation 2 registers; then the heartbeat goes on. A route written through the
    // metasrv first makes that heartbeat read the store again: answered from the registry's cache, it would not
    // wait on anything.
    set_region_epochs(m.kv(), created.table_id, &[]).await;
    store.armed.store(true, Ordering::SeqCst);
    let request = heartbeat_request(1, 1, 100, mine.iter().map(|r| stat(*r, 0)).collect());
    let no_flush = BTreeSet::new();
    let (raced, second) = tokio::join!(registry.heartbeat(&request, &no_flush), async {
        tokio::time::timeout(POLL * POLLS, store.entered.acquire())
            .await
            .expect("the heartbeat reaches its scan")
            .expect("the entered semaphore stays open")
            .forget();
        let second = register_once_allowed(registry, &register_request(1, "dn1-b:4001", 100)).await;
        store.release.add_permits(1);
        second
    });
    assert_eq!(second.incarnation, 2);

    let err = raced
        .expect_err("a heartbeat that raced the registration of incarnation 2 hands out leases");
    assert!(
        matches!(
            err,
            Error::DatanodeStaleIncarnation {
                datanode_id: 1,
                incarnation: 1,
                current: 2
            }
        ),
        "{err:?}"
    );
    assert!(
        !err.is_retryable(),
        "a stale incarnation must stop: {err:?}"
    );
    assert_eq!(record(&kv, 1).await.incarnation, 2);
    let listed = registry.list();
    assert_eq!(
        (listed[0].incarnation, listed[0].leases),
        (2, 0),
        "{listed:?}"
    );
    m.stop().await.unwrap();
}
