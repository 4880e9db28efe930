//! The lock table seen through `LocalManager`: FIFO order per key, no starvation of an exclusive request behind a
//! stream of shared ones, wake-ups only for the waiters a release lets in, siblings that take one exclusive key one
//! at a time, and a child whose keys would deadlock with its own tree refused with the key and the procedures.
//!
//! Tests marked `start_paused = true` run on tokio's paused clock and depend on it: time advances only when every
//! task is idle, so lock hold times (`hold_ms`) and the spacing of submissions elapse in a fixed order and the
//! orderings asserted below are not a race with the machine's load. The others order their procedures with gates
//! (a procedure blocked at a step holds its keys until the test opens its gate).

use std::sync::Arc;
use std::time::Duration;

use crate::support::manager::{Env, Plan, TYPE, fast_config, within};
use procedures::record::record_key;
use procedures::{
    Error, LocalManager, LockWait, MemoryStateStore, ProcedureId, ProcedureManager, ProcedureState,
};

async fn manager(store: &Arc<MemoryStateStore>, env: &Arc<Env>) -> LocalManager {
    let manager = LocalManager::new(store.clone(), fast_config());
    manager.register_loader(TYPE, env.loader()).unwrap();
    manager.start().await.unwrap();
    manager
}

fn id(s: &str) -> ProcedureId {
    ProcedureId::new(s)
}

/// Waits (yielding to the runtime) until `check` holds.
async fn until(mut check: impl FnMut() -> bool) {
    within(async {
        while !check() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
}

fn waiting(m: &LocalManager, s: &str) -> Option<LockWait> {
    m.procedure_locks(&id(s)).and_then(|l| l.waiting)
}

fn holds(m: &LocalManager, s: &str) -> bool {
    m.procedure_locks(&id(s))
        .is_some_and(|l| !l.held.is_empty())
}

/// A procedure of one step taking `key` shared or exclusive.
fn on(key: &str, exclusive: bool) -> Plan {
    let key = vec![key.to_string()];
    if exclusive {
        Plan {
            exclusive: key,
            ..Plan::steps(1, true)
        }
    } else {
        Plan {
            shared: key,
            ..Plan::steps(1, true)
        }
    }
}

/// Shared, exclusive, shared arriving in that order: the second shared request waits for the exclusive one, although
/// it is compatible with the shared holder.
#[tokio::test]
async fn a_waiting_exclusive_request_blocks_later_shared_ones() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let gate = Env::new(false);
    let m = manager(&store, &env).await;
    let mut s1 = m
        .submit(gate.with_id(
            "s1",
            Plan {
                block_at: Some(0),
                ..on("schema", false)
            },
        ))
        .await
        .unwrap();
    until(|| holds(&m, "s1")).await;
    let mut x = m
        .submit(env.with_id("x", on("schema", true)))
        .await
        .unwrap();
    until(|| waiting(&m, "x").is_some()).await;
    let mut s2 = m
        .submit(env.with_id("s2", on("schema", false)))
        .await
        .unwrap();
    until(|| waiting(&m, "s2").is_some()).await;

    let x_waits = waiting(&m, "x").unwrap();
    assert_eq!(
        (
            x_waits.key.as_str(),
            x_waits.exclusive,
            &x_waits.blocked_by,
            x_waits.blocker_holds
        ),
        ("schema", true, &id("s1"), true)
    );
    let s2_waits = waiting(&m, "s2").unwrap();
    assert_eq!(
        (
            s2_waits.key.as_str(),
            s2_waits.exclusive,
            &s2_waits.blocked_by,
            s2_waits.blocker_holds
        ),
        ("schema", false, &id("x"), false),
        "the second shared request waits behind the queued exclusive one"
    );
    let listed: Vec<ProcedureId> = m.locks().into_iter().map(|l| l.id).collect();
    assert_eq!(listed, vec![id("s1"), id("s2"), id("x")]);

    assert!(
        env.events().is_empty(),
        "x and s2 ran while s1 held the key shared"
    );

    gate.gate.add_permits(1);
    within(s1.wait()).await.unwrap();
    within(x.wait()).await.unwrap();
    within(s2.wait()).await.unwrap();
    // The exclusive procedure ran alone, between the two shared ones.
    let (x_in, x_out) = env.span("x");
    let (s2_in, _) = env.span("s2");
    let events = env.events();
    assert!(x_out < s2_in, "s2 ran before x ended: {events:?}");
    assert!(x_in <= x_out);
    assert!(m.locks().is_empty(), "every key is released");
}

/// A stream of overlapping shared holders never leaves the key free; the exclusive request still runs before
/// every shared one submitted after it.
#[tokio::test(start_paused = true)]
async fn an_exclusive_request_is_not_starved_by_a_stream_of_shared_ones() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let m = manager(&store, &env).await;
    let shared = Plan {
        hold_ms: 10,
        ..on("schema", false)
    };
    let mut watchers = Vec::new();
    for i in 0..20 {
        if i == 3 {
            watchers.push(
                m.submit(env.with_id("x", on("schema", true)))
                    .await
                    .unwrap(),
            );
        }
        watchers.push(
            m.submit(env.with_id(&format!("s{i:02}"), shared.clone()))
                .await
                .unwrap(),
        );
        // Each holds the key for 10 ms; a new one arrives every 4 ms, so shared holders always overlap.
        tokio::time::sleep(Duration::from_millis(4)).await;
    }
    for mut w in watchers {
        within(w.wait()).await.unwrap();
    }
    let (x_in, x_out) = env.span("x");
    for i in 0..20 {
        let (s_in, s_out) = env.span(&format!("s{i:02}"));
        if i < 3 {
            assert!(s_out < x_in, "s{i:02} submitted before x ran with it");
        } else {
            assert!(
                x_out < s_in,
                "s{i:02} submitted after x ran before it ended"
            );
        }
    }
}

/// Two keys, one waiter on the first and four on the second: releasing the first wakes exactly its waiter, and
/// each release of the second wakes exactly the next one (an exclusive key lets one in at a time).
#[tokio::test]
async fn a_release_wakes_only_the_waiters_it_lets_in() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let gate_a = Env::new(false);
    let gate_b = Env::new(false);
    let m = manager(&store, &env).await;
    let blocked = |key: &str| Plan {
        block_at: Some(0),
        ..on(key, true)
    };
    let mut ha = m.submit(gate_a.with_id("ha", blocked("a"))).await.unwrap();
    let mut hb = m.submit(gate_b.with_id("hb", blocked("b"))).await.unwrap();
    until(|| holds(&m, "ha") && holds(&m, "hb")).await;
    let mut wa = m.submit(env.with_id("wa", on("a", true))).await.unwrap();
    let mut wbs = Vec::new();
    for i in 0..4 {
        let name = format!("wb{i}");
        wbs.push(m.submit(env.with_id(&name, on("b", true))).await.unwrap());
        until(|| waiting(&m, &name).is_some()).await;
    }
    until(|| waiting(&m, "wa").is_some()).await;
    assert_eq!(m.lock_wakeups(), 0);

    gate_a.gate.add_permits(1);
    within(ha.wait()).await.unwrap();
    within(wa.wait()).await.unwrap();
    assert_eq!(
        m.lock_wakeups(),
        1,
        "releasing `a` woke its one waiter and none of `b`'s"
    );
    for i in 0..4 {
        assert!(waiting(&m, &format!("wb{i}")).is_some());
    }

    gate_b.gate.add_permits(1);
    within(hb.wait()).await.unwrap();
    for mut w in wbs {
        within(w.wait()).await.unwrap();
    }
    assert_eq!(
        m.lock_wakeups(),
        5,
        "each release of `b` woke only the next waiter"
    );
}

/// Two children of one parent both take the parent's exclusive key: they run one after the other, each while the
/// parent (their ancestor) holds the key.
#[tokio::test(start_paused = true)]
async fn siblings_take_an_exclusive_key_one_at_a_time() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let m = manager(&store, &env).await;
    let child = Plan {
        hold_ms: 10,
        ..on("k", true)
    };
    let parent = Plan {
        children: vec![("c1".into(), child.clone()), ("c2".into(), child)],
        ..on("k", true)
    };
    let mut w = m.submit(env.with_id("p", parent)).await.unwrap();
    within(w.wait()).await.unwrap();
    let (c1_in, c1_out) = env.span("p/c1");
    let (c2_in, c2_out) = env.span("p/c2");
    assert!(
        c1_out < c2_in || c2_out < c1_in,
        "siblings overlapped on an exclusive key: {:?}",
        env.events()
    );
}

/// Root `r` has children `a` (holding `ka`) and `h` (holding `kh`); `a` starts a child asking for `kh` at once,
/// `h` one asking for `ka` 10 ms later. The second closes a cycle (each branch waits for its child, each child for
/// the other branch's key): its submission is refused with the key and the procedures, before its child is
/// written, and the tree ends instead of hanging. (On the paused clock, `a`'s child is queued before `h` goes on.)
#[tokio::test(start_paused = true)]
async fn a_child_whose_keys_would_deadlock_its_tree_is_refused() {
    let store = Arc::new(MemoryStateStore::new());
    let env = Env::new(true);
    let m = manager(&store, &env).await;
    let branch = |own: &str, wanted: &str, hold_ms: u64| Plan {
        hold_ms,
        children: vec![("c".into(), on(wanted, true))],
        ..on(own, true)
    };
    let root = Plan {
        children: vec![
            ("a".into(), branch("ka", "kh", 0)),
            ("h".into(), branch("kh", "ka", 10)),
        ],
        ..Plan::steps(1, true)
    };
    let mut w = m.submit(env.with_id("r", root)).await.unwrap();
    until(|| waiting(&m, "r/a/c").is_some()).await;
    let wait = waiting(&m, "r/a/c").unwrap();
    assert_eq!(
        (wait.key.as_str(), &wait.blocked_by, wait.blocker_holds),
        ("kh", &id("r/h"), true)
    );

    let err = within(w.wait()).await.unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, Error::ProcedureFailed { .. }),
        "the root fails: {text}"
    );
    for part in [
        "procedure r/h/c cannot take lock key 'ka' held by r/a: it would deadlock",
        "r/a waits for its descendant r/a/c",
        "r/a/c waits for key 'kh' held by r/h",
        "r/h waits for its descendant r/h/c",
    ] {
        assert!(text.contains(part), "`{part}` missing from: {text}");
    }
    // The refused child was never written; its parent failed, the other branch and its child finished.
    let snapshot = store.snapshot();
    assert!(!snapshot.contains_key(&record_key(&id("r/h/c"))));
    let state = |s: &str| {
        serde_json::from_slice::<procedures::ProcedureRecord>(&snapshot[&record_key(&id(s))])
            .unwrap()
            .state
    };
    assert_eq!(state("r/h"), ProcedureState::Failed);
    assert_eq!(state("r/a"), ProcedureState::Done);
    assert_eq!(state("r/a/c"), ProcedureState::Done);
    assert!(m.locks().is_empty(), "every key is released");
}
