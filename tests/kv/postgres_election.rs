//! The leader election on PostgreSQL (`POSTGRES_URL`): candidates racing on a fresh table lead one at a time with
//! rising epochs; a deposed leader's late write is refused after a takeover; a takeover waits for a write in flight
//! that compared the old leader key; and the term ends when its lease row is taken.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use procedures::record::EPOCH_KEY;
use procedures::{Condition, StateStore, WriteOp, WriteOutcome};
use remote_wal::kv::conformance::postgres_config_from_env;
use remote_wal::kv::state_store::{KvStateStore, LeaderFence};
use remote_wal::kv::{KvBackendRef, NamespacedKvBackend, PostgresKvBackend, PostgresKvConfig};
use remote_wal::metasrv::election::{Election, ElectionConfig, ElectionStore};

use crate::support::unique;

/// A bound on waits that should end soon; only a broken election reaches it.
const BOUND: Duration = Duration::from_secs(30);

async fn election(
    store: &PostgresKvConfig,
    prefix: &str,
    address: &str,
    ttl: Duration,
) -> (Election, Arc<LeaderFence>) {
    let fence = Arc::new(LeaderFence::new());
    let election = Election::connect(
        ElectionConfig {
            store: ElectionStore::Postgres(Box::new(store.clone())),
            connect_timeout: Duration::from_secs(5),
            key_prefix: prefix.to_string(),
            advertise: address.to_string(),
            lease_ttl: ttl,
        },
        fence.clone(),
    )
    .await
    .unwrap();
    (election, fence)
}

/// A raw session on the test's PostgreSQL, for what a test does behind the backend's back.
async fn raw(store: &PostgresKvConfig) -> tokio_postgres::Client {
    let (client, connection) = store
        .connection
        .connect(tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// Ends every live lease of `table`'s elections now, as the database's clock passing their expiry would.
async fn expire_leases(store: &PostgresKvConfig, table: &str) {
    raw(store)
        .await
        .batch_execute(&format!(
            "UPDATE public.\"{table}_election\" SET expires_at = clock_timestamp() - interval '1 second'"
        ))
        .await
        .unwrap();
}

/// A fenced procedure-state write of `epoch` putting `key`.
fn write(epoch: u64, key: &str) -> (Vec<Condition>, Vec<WriteOp>) {
    (
        vec![Condition::Equals {
            key: EPOCH_KEY.to_string(),
            value: epoch.to_string().into_bytes(),
        }],
        vec![WriteOp::Put {
            key: key.to_string(),
            value: epoch.to_string().into_bytes(),
        }],
    )
}

/// Four candidates start campaigning together on a table with no lease row yet, and each leads twice: never two
/// at once (each checks on winning that nobody else holds a term), every epoch larger than the one before, and
/// the leader everyone reads is the one holding the term.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn candidates_racing_on_a_fresh_table_lead_one_at_a_time_with_rising_epochs() {
    let table = unique("pgelect");
    let store = postgres_config_from_env(&table);
    let prefix = format!("{}/", unique("race"));
    let leading = Arc::new(AtomicUsize::new(0));
    let epochs = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut candidates = Vec::new();
    for i in 0..4 {
        let (e, fence) = election(
            &store,
            &prefix,
            &format!("10.0.0.{i}:3002"),
            Duration::from_secs(5),
        )
        .await;
        let (leading, epochs) = (leading.clone(), epochs.clone());
        candidates.push(tokio::spawn(async move {
            for _ in 0..2 {
                let term = e.campaign().await.unwrap();
                assert_eq!(
                    leading.fetch_add(1, Ordering::SeqCst),
                    0,
                    "candidate {i} won while another held a term"
                );
                assert_eq!(fence.current().map(|l| l.epoch), Some(term.epoch()));
                let leader = e.leader().await.unwrap().unwrap();
                assert_eq!(leader.address, format!("10.0.0.{i}:3002"));
                assert_eq!(leader.epoch, term.epoch());
                epochs.lock().unwrap().push(term.epoch());
                // Hold the term a moment, so a candidate that could win beside it would do so now.
                tokio::time::sleep(Duration::from_millis(150)).await;
                leading.fetch_sub(1, Ordering::SeqCst);
                e.resign(term).await;
                assert_eq!(fence.current(), None);
            }
        }));
    }
    for c in candidates {
        tokio::time::timeout(BOUND, c).await.unwrap().unwrap();
    }
    let epochs = epochs.lock().unwrap().clone();
    assert_eq!(epochs.len(), 8);
    assert!(
        epochs.windows(2).all(|w| w[0] < w[1]),
        "epochs do not rise: {epochs:?}"
    );
}

/// A leads and writes; its lease row expires (as when A is frozen past its TTL) and B takes over. A's fence still
/// holds its term (nothing told A yet), so A sends its next write late, from the deposed side: it is refused by
/// the leader key's compare, B's claim and write pass, and A's term ends at its next renewal. Without the compare
/// of the leader key in the write's transaction A's write would land after B's claim.
#[tokio::test]
async fn a_deposed_leaders_late_write_is_refused_after_a_takeover() {
    let table = unique("pgelect");
    let store = postgres_config_from_env(&table);
    let prefix = format!("{}/", unique("late"));
    // A long TTL: A's renewal does not run (and notice the takeover) while the test writes.
    let ttl = Duration::from_secs(30);
    let (a, fence_a) = election(&store, &prefix, "10.0.0.1:3002", ttl).await;
    let (b, fence_b) = election(&store, &prefix, "10.0.0.2:3002", ttl).await;
    let pg: KvBackendRef = Arc::new(PostgresKvBackend::connect(store.clone()).await.unwrap());
    let kv: KvBackendRef = Arc::new(NamespacedKvBackend::new(pg, prefix.clone()));
    let store_a = KvStateStore::new(kv.clone()).with_leader_fence(fence_a.clone());
    let store_b = KvStateStore::new(kv.clone()).with_leader_fence(fence_b.clone());

    let term_a = tokio::time::timeout(BOUND, a.campaign())
        .await
        .unwrap()
        .unwrap();
    let epoch_a = term_a.epoch();
    assert_eq!(store_a.claim_epoch().await.unwrap(), Some(epoch_a));
    let (conditions, ops) = write(epoch_a, "proc/a-kept");
    assert_eq!(
        store_a.write(conditions, ops).await.unwrap(),
        WriteOutcome::Applied
    );

    expire_leases(&store, &table).await;
    let term_b = tokio::time::timeout(BOUND, b.campaign())
        .await
        .unwrap()
        .unwrap();
    let epoch_b = term_b.epoch();
    assert!(epoch_b > epoch_a, "{epoch_b} after {epoch_a}");
    assert_eq!(b.leader().await.unwrap().unwrap().address, "10.0.0.2:3002");

    // A still believes it leads, and writes late.
    assert_eq!(fence_a.current().map(|l| l.epoch), Some(epoch_a));
    let (conditions, ops) = write(epoch_a, "proc/a-late");
    let outcome = store_a.write(conditions, ops).await.unwrap();
    assert!(
        matches!(&outcome, WriteOutcome::Rejected { .. }),
        "a deposed leader's late write was not refused: {outcome:?}"
    );
    assert_eq!(store_a.get("proc/a-late").await.unwrap(), None);
    assert_eq!(fence_a.fenced_writes(), 1);
    // The refusal cleared A's fence, which ends its term.
    assert_eq!(fence_a.current(), None);

    assert_eq!(store_b.claim_epoch().await.unwrap(), Some(epoch_b));
    let (conditions, ops) = write(epoch_b, "proc/b");
    assert_eq!(
        store_b.write(conditions, ops).await.unwrap(),
        WriteOutcome::Applied
    );
    assert_eq!(
        store_b.get("proc/a-kept").await.unwrap(),
        Some(epoch_a.to_string().into_bytes())
    );
    let mut term_a = term_a;
    tokio::time::timeout(BOUND, term_a.lost()).await.unwrap();
    a.resign(term_a).await;
    b.resign(term_b).await;
}

/// A write of the old leader is in flight: its transaction holds the locks the backend takes (the leader key's
/// shared, as a key it only compares; the key it writes exclusive), read the leader key, and has not committed. The old lease expires; B's takeover must not overtake
/// that write: B keeps looking (each look gives up on the lock after a third of the TTL) until the write commits,
/// and only then leads. The write, serialized before the takeover, stays.
#[tokio::test]
async fn a_takeover_waits_for_a_write_in_flight_that_compared_the_old_leader_key() {
    let table = unique("pgelect");
    let store = postgres_config_from_env(&table);
    let prefix = format!("{}/", unique("inflight"));
    let ttl = Duration::from_secs(3);
    let (a, _fence_a) = election(&store, &prefix, "10.0.0.1:3002", ttl).await;
    let (b, fence_b) = election(&store, &prefix, "10.0.0.2:3002", ttl).await;
    let term_a = tokio::time::timeout(BOUND, a.campaign())
        .await
        .unwrap()
        .unwrap();
    let leader_key = format!("{prefix}__metasrv/election").into_bytes();
    let late_key = format!("{prefix}__procedure__/proc/in-flight").into_bytes();

    let backend = PostgresKvBackend::connect(store.clone()).await.unwrap();
    let (table_lock, leader_lock) = backend.lock_ids(&leader_key);
    let (_, late_lock) = backend.lock_ids(&late_key);

    // The old leader's write, held open between its compare and its commit.
    let mut writer = raw(&store).await;
    let tx = writer.transaction().await.unwrap();
    let mut locks = [leader_lock, late_lock];
    locks.sort();
    let shared = |id: i64| if id == leader_lock { "_shared" } else { "" };
    tx.execute(
        &format!(
            "SELECT pg_advisory_xact_lock_shared($1), pg_advisory_xact_lock{}($2), pg_advisory_xact_lock{}($3)",
            shared(locks[0]),
            shared(locks[1])
        ),
        &[&table_lock, &locks[0], &locks[1]],
    )
    .await
    .unwrap();
    let read = tx
        .query_one(
            &format!("SELECT v FROM public.\"{table}\" WHERE k = $1"),
            &[&leader_key],
        )
        .await
        .unwrap();
    assert!(!read.get::<_, Vec<u8>>(0).is_empty());

    // A stops renewing (as if frozen) and its row expires; B campaigns.
    drop(term_a);
    expire_leases(&store, &table).await;
    let b = Arc::new(b);
    let campaign = {
        let b = b.clone();
        tokio::spawn(async move { b.campaign().await })
    };
    // B is blocked on the leader key's lock: PostgreSQL shows a session waiting for it (a bigint advisory lock is
    // (classid, objid) = its high and low 32 bits, objsubid 1).
    let watcher = raw(&store).await;
    let waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
         AND classid::int8 = $1 AND objid::int8 = $2 AND objsubid = 1";
    let (high, low) = (
        ((leader_lock as u64) >> 32) as i64,
        ((leader_lock as u64) & 0xffff_ffff) as i64,
    );
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        let n: i64 = watcher
            .query_one(waiting, &[&high, &low])
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            break;
        }
        assert!(
            !campaign.is_finished(),
            "the takeover did not wait for the write in flight"
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "the takeover never waited on the leader key"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        fence_b.current(),
        None,
        "B leads while the old write is open"
    );
    tx.execute(
        &format!("INSERT INTO public.\"{table}\" (k, v) VALUES ($1, 'late')"),
        &[&late_key],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();

    let term_b = tokio::time::timeout(BOUND, campaign)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(fence_b.current().is_some());
    let row = watcher
        .query_opt(
            &format!("SELECT v FROM public.\"{table}\" WHERE k = $1"),
            &[&late_key],
        )
        .await
        .unwrap();
    assert_eq!(row.map(|r| r.get::<_, Vec<u8>>(0)), Some(b"late".to_vec()));
    b.resign(term_b).await;
}

/// The term ends on its own when its lease row is taken behind its back: the renewal finds another term, clears
/// the fence and reports the term lost.
#[tokio::test]
async fn a_term_whose_row_is_taken_is_lost_at_the_next_renewal() {
    let table = unique("pgelect");
    let store = postgres_config_from_env(&table);
    let prefix = format!("{}/", unique("taken"));
    let ttl = Duration::from_secs(2);
    let (a, fence_a) = election(&store, &prefix, "10.0.0.1:3002", ttl).await;
    let mut term = tokio::time::timeout(BOUND, a.campaign())
        .await
        .unwrap()
        .unwrap();
    raw(&store)
        .await
        .batch_execute(&format!(
            "UPDATE public.\"{table}_election\" SET term = term + 1"
        ))
        .await
        .unwrap();
    tokio::time::timeout(BOUND, term.lost()).await.unwrap();
    assert!(term.is_lost());
    assert_eq!(fence_a.current(), None);
    a.resign(term).await;
}
