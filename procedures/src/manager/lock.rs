//! The lock table: shared and exclusive string keys with one FIFO queue per key, taken all-or-nothing.
//!
//! A procedure asks for every key of its [`LockKey`] (sorted by name) at once, under one mutex, and is granted
//! all of them or none: nobody holds part of its keys while waiting for the rest. A request that cannot be granted
//! joins the queue of each of its keys and sleeps on its own [`Notify`].
//!
//! **Conflicts.** Two holdings of a key conflict when one of them is exclusive, unless one holder is an ancestor of
//! the other: inside one procedure tree an exclusive key is held by one procedure at a time, except that a
//! descendant may take the keys its (suspended) ancestors hold. Siblings and cousins conflict like strangers.
//!
//! **Order.** A root procedure's request is granted only when no holding conflicts with it and no *earlier*
//! conflicting request waits in the queue of one of its keys: a waiting exclusive request blocks later shared ones,
//! so a stream of shared holders cannot starve it. A descendant's request is checked against the holdings only: its
//! ancestors hold their keys while they wait for it, and a queued request of another tree may be waiting for those
//! very keys, so queueing the descendant behind it could close a cycle.
//!
//! **Wake-ups.** Granting is done by whoever releases: a release (or a waiter leaving) walks the queues of the
//! released keys only, in request order, grants every request that can now be granted, and wakes exactly those.
//!
//! **Deadlocks.** A holder waits for its live descendants (a parent ends only after its children). A descendant's
//! request that would wait for a holder which, through such waits, waits for the requester itself can never be
//! granted; it is refused with [`Error::LockDeadlock`] naming the key and the procedures. The search follows holders
//! of every tree, so a cycle closed through another tree is refused as well as one inside the requester's own.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use crate::error::{Error, Result};
use crate::procedure::{LockKey, ProcedureId, StringKey};

/// One key a procedure holds (or declares), as the lock table and the record show it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HeldKey {
    /// The key.
    pub key: String,
    /// Whether it is held exclusively.
    pub exclusive: bool,
}

/// What a waiting procedure waits for: the first of its keys it cannot take yet.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LockWait {
    /// The key.
    pub key: String,
    /// Whether the procedure asks for it exclusively.
    pub exclusive: bool,
    /// A procedure in its way: a holder of the key when one conflicts, otherwise an earlier request queued for it.
    pub blocked_by: ProcedureId,
    /// Whether `blocked_by` holds the key (`false`: it is queued ahead).
    pub blocker_holds: bool,
}

/// The locks of one procedure: the keys it holds, or the key it waits for.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcedureLocks {
    /// The procedure.
    pub id: ProcedureId,
    /// The keys it holds, sorted by name (empty while it waits: keys are taken all at once).
    pub held: Vec<HeldKey>,
    /// While it waits for its keys: what it waits for.
    pub waiting: Option<LockWait>,
}

/// Who asks: a procedure and its ancestors (parent first, root last).
#[derive(Clone, Debug)]
pub(crate) struct Requester {
    pub(crate) id: ProcedureId,
    pub(crate) ancestors: Vec<ProcedureId>,
}

impl Requester {
    /// Whether `self` and `other` are the same procedure or one is an ancestor of the other.
    fn related(&self, other: &Requester) -> bool {
        self.id == other.id
            || self.ancestors.contains(&other.id)
            || other.ancestors.contains(&self.id)
    }

    /// A root's request waits in the FIFO queues; a descendant's is checked against holdings only.
    fn queues(&self) -> bool {
        self.ancestors.is_empty()
    }
}

/// One request: queued until granted, then held until released.
#[derive(Debug)]
struct Request {
    who: Requester,
    /// Sorted by name, each once: (key, exclusive).
    keys: Vec<(String, bool)>,
    granted: bool,
    wake: Arc<Notify>,
}

impl Request {
    fn conflicts(&self, exclusive: bool, other: &Request, other_exclusive: bool) -> bool {
        (exclusive || other_exclusive) && !self.who.related(&other.who)
    }
}

/// The holders and the queue of one key, by request number.
#[derive(Debug, Default)]
struct KeyState {
    /// In request order; a set, so that a release does not walk thousands of shared holders.
    holders: BTreeSet<u64>,
    /// How many of `holders` hold the key exclusively: a shared request skips the holders when none does (a key
    /// that every create-table holds shared may have thousands of holders).
    exclusive_holders: usize,
    queue: VecDeque<u64>,
}

impl KeyState {
    /// Whether a request in mode `exclusive` needs to look at the holders at all.
    fn holders_may_conflict(&self, exclusive: bool) -> bool {
        exclusive || self.exclusive_holders > 0
    }
}

/// How the cycle search reached a holder: from which holder through which of its waiting descendants (`None`: it
/// blocks the requester directly), and on which key.
struct Reached {
    from: Option<(u64, u64)>,
    key: String,
}

#[derive(Debug, Default)]
struct Table {
    next: u64,
    requests: BTreeMap<u64, Request>,
    keys: HashMap<String, KeyState>,
}

impl Table {
    /// The first request (a holder, else an earlier queued one) standing in the way of request `n` on one of its
    /// keys: (key, exclusive, blocker, blocker holds).
    fn blocker(&self, n: u64, req: &Request) -> Option<(String, bool, u64, bool)> {
        for (key, exclusive) in &req.keys {
            let Some(state) = self.keys.get(key) else {
                continue;
            };
            let holding = if state.holders_may_conflict(*exclusive) {
                state
                    .holders
                    .iter()
                    .find(|&&h| self.conflicting(req, *exclusive, h, key))
            } else {
                None
            };
            if let Some(&h) = holding {
                return Some((key.clone(), *exclusive, h, true));
            }
            if req.who.queues() {
                let ahead = state
                    .queue
                    .iter()
                    .take_while(|&&w| w < n)
                    .find(|&&w| self.conflicting(req, *exclusive, w, key));
                if let Some(&w) = ahead {
                    return Some((key.clone(), *exclusive, w, false));
                }
            }
        }
        None
    }

    /// Whether request `other` (holding or asking for `key`) conflicts with `req` asking for it in mode `exclusive`.
    fn conflicting(&self, req: &Request, exclusive: bool, other: u64, key: &str) -> bool {
        self.requests.get(&other).is_some_and(|o| {
            let other_exclusive = o.keys.iter().any(|(k, x)| k == key && *x);
            req.conflicts(exclusive, o, other_exclusive)
        })
    }

    /// The holders in the way of `req` (on any of its keys), with the key.
    fn blocking_holders(&self, req: &Request) -> Vec<(u64, String)> {
        let mut out = Vec::new();
        for (key, exclusive) in &req.keys {
            if let Some(state) = self.keys.get(key)
                && state.holders_may_conflict(*exclusive)
            {
                for &h in &state.holders {
                    if self.conflicting(req, *exclusive, h, key) {
                        out.push((h, key.clone()));
                    }
                }
            }
        }
        out
    }

    /// Refuses `req` when it would wait for a holder that waits for it: a holder waits for its descendants, a
    /// waiting descendant waits for the holders in its way. Searched breadth-first from the holders in its way.
    fn check_cycle(&self, req: &Request) -> Result<()> {
        let mut reached: HashMap<u64, Reached> = HashMap::new();
        let mut frontier: VecDeque<u64> = VecDeque::new();
        for (h, key) in self.blocking_holders(req) {
            if let std::collections::hash_map::Entry::Vacant(e) = reached.entry(h) {
                e.insert(Reached { from: None, key });
                frontier.push_back(h);
            }
        }
        let mut seen_waiters: HashSet<u64> = HashSet::new();
        while let Some(h) = frontier.pop_front() {
            let Some(holder) = self.requests.get(&h) else {
                continue;
            };
            if req.who.ancestors.contains(&holder.who.id) {
                return Err(self.deadlock(req, h, &reached));
            }
            // The waiting descendants of this holder, and the holders in their way.
            for (&w, waiter) in &self.requests {
                if waiter.granted
                    || !waiter.who.ancestors.contains(&holder.who.id)
                    || !seen_waiters.insert(w)
                {
                    continue;
                }
                for (next, key) in self.blocking_holders(waiter) {
                    if let std::collections::hash_map::Entry::Vacant(e) = reached.entry(next) {
                        e.insert(Reached {
                            from: Some((h, w)),
                            key,
                        });
                        frontier.push_back(next);
                    }
                }
            }
        }
        Ok(())
    }

    /// The error for a cycle closed by holder `end`, an ancestor of the requester: the chain of waits from the
    /// requester back to itself.
    fn deadlock(&self, req: &Request, end: u64, reached: &HashMap<u64, Reached>) -> Error {
        let name = |n: u64| {
            self.requests
                .get(&n)
                .map(|r| r.who.id.to_string())
                .unwrap_or_default()
        };
        // Walk back from `end` to the holder that blocks the requester directly; bounded by the holders reached.
        let mut links = vec![format!(
            "{} waits for its descendant {}",
            name(end),
            req.who.id
        )];
        let mut at = end;
        let mut first_key = String::new();
        for _ in 0..=reached.len() {
            let Some(step) = reached.get(&at) else {
                break;
            };
            match step.from {
                Some((holder, waiter)) => {
                    links.push(format!(
                        "{} waits for key '{}' held by {}",
                        name(waiter),
                        step.key,
                        name(at)
                    ));
                    links.push(format!(
                        "{} waits for its descendant {}",
                        name(holder),
                        name(waiter)
                    ));
                    at = holder;
                }
                None => {
                    first_key = step.key.clone();
                    break;
                }
            }
        }
        links.reverse();
        Error::LockDeadlock {
            procedure: req.who.id.clone(),
            key: first_key,
            holder: self
                .requests
                .get(&at)
                .map(|r| r.who.id.clone())
                .unwrap_or_else(|| req.who.id.clone()),
            cycle: links.join("; "),
        }
    }

    fn grant(&mut self, n: u64) {
        let Some(req) = self.requests.get_mut(&n) else {
            return;
        };
        req.granted = true;
        let keys: Vec<(String, bool)> = req.keys.clone();
        for (key, exclusive) in keys {
            let state = self.keys.entry(key).or_default();
            state.queue.retain(|&w| w != n);
            state.holders.insert(n);
            if exclusive {
                state.exclusive_holders += 1;
            }
        }
    }

    /// Removes request `n` (held or queued) and returns the keys it was on.
    fn remove(&mut self, n: u64) -> Vec<String> {
        let Some(req) = self.requests.remove(&n) else {
            return Vec::new();
        };
        let mut keys = Vec::with_capacity(req.keys.len());
        for (key, exclusive) in req.keys {
            if let Some(state) = self.keys.get_mut(&key) {
                if req.granted && exclusive {
                    state.exclusive_holders = state.exclusive_holders.saturating_sub(1);
                }
                state.holders.remove(&n);
                state.queue.retain(|&w| w != n);
                if state.holders.is_empty() && state.queue.is_empty() {
                    self.keys.remove(&key);
                }
            }
            keys.push(key);
        }
        keys
    }

    /// Grants, in request order, every queued request on `keys` that can be granted now; returns whom to wake.
    fn grant_waiters(&mut self, keys: &[String]) -> Vec<Arc<Notify>> {
        let mut candidates: Vec<u64> = keys
            .iter()
            .filter_map(|k| self.keys.get(k))
            .flat_map(|s| s.queue.iter().copied())
            .collect();
        candidates.sort_unstable();
        candidates.dedup();
        let mut woken = Vec::new();
        for n in candidates {
            let grantable = self
                .requests
                .get(&n)
                .is_some_and(|r| self.blocker(n, r).is_none());
            if grantable {
                self.grant(n);
                if let Some(r) = self.requests.get(&n) {
                    woken.push(Arc::clone(&r.wake));
                }
            }
        }
        woken
    }
}

/// Who holds which key, and who waits for which.
#[derive(Debug, Default)]
pub(crate) struct LockTable {
    table: Mutex<Table>,
    /// How many waiters a release (or a waiter leaving) has woken, since the table was made.
    wakeups: AtomicU64,
}

impl LockTable {
    /// An empty table.
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(LockTable::default())
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        // Every change under this lock is a few map operations that cannot panic half-way.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn request(who: &Requester, keys: &LockKey) -> Request {
        Request {
            who: who.clone(),
            keys: keys
                .keys()
                .iter()
                .map(|k| (k.name().to_string(), matches!(k, StringKey::Exclusive(_))))
                .collect(),
            granted: false,
            wake: Arc::new(Notify::new()),
        }
    }

    /// Whether a descendant asking for `keys` now would wait for its own ancestors: [`Error::LockDeadlock`] if so.
    /// Checked when a parent submits its children, before anything is written.
    pub(crate) fn check(&self, who: &Requester, keys: &LockKey) -> Result<()> {
        let req = Self::request(who, keys);
        self.table().check_cycle(&req)
    }

    /// Takes every key of `keys` for `who`, waiting (in the FIFO queues of the keys, for a root) until all of them
    /// can be granted together. The keys are released when the returned guard is dropped. A request that would
    /// wait for a holder waiting for it is refused with [`Error::LockDeadlock`].
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        who: &Requester,
        keys: &LockKey,
    ) -> Result<LockGuard> {
        let (n, wake) = {
            let mut table = self.table();
            let req = Self::request(who, keys);
            let n = table.next;
            table.next += 1;
            let blocked = table.blocker(n, &req).is_some();
            if blocked && !req.who.queues() {
                table.check_cycle(&req)?;
            }
            let wake = Arc::clone(&req.wake);
            let names: Vec<String> = req.keys.iter().map(|(k, _)| k.clone()).collect();
            table.requests.insert(n, req);
            if blocked {
                for key in names {
                    table.keys.entry(key).or_default().queue.push_back(n);
                }
            } else {
                table.grant(n);
            }
            (n, wake)
        };
        // From here on the request is the guard's: dropping this future while it waits takes it out of the queues.
        let guard = LockGuard {
            table: Arc::clone(self),
            request: n,
        };
        loop {
            let granted = self.table().requests.get(&n).is_some_and(|r| r.granted);
            if granted {
                return Ok(guard);
            }
            // A grant stores a permit in `wake` before notifying, so a grant between the look and the wait is kept.
            wake.notified().await;
        }
    }

    /// Removes request `n` and grants the waiters its keys were holding up.
    fn release(&self, n: u64) {
        let woken = {
            let mut table = self.table();
            let keys = table.remove(n);
            table.grant_waiters(&keys)
        };
        self.wakeups
            .fetch_add(woken.len() as u64, Ordering::Relaxed);
        for wake in woken {
            wake.notify_one();
        }
    }

    /// The locks of one procedure: held keys, or what it waits for; `None` when it neither holds nor waits.
    pub(crate) fn procedure_locks(&self, id: &ProcedureId) -> Option<ProcedureLocks> {
        let table = self.table();
        table
            .requests
            .iter()
            .find(|(_, r)| &r.who.id == id && !r.keys.is_empty())
            .map(|(&n, r)| Self::show(&table, n, r))
    }

    /// The locks of every procedure that holds or waits, sorted by id.
    pub(crate) fn all(&self) -> Vec<ProcedureLocks> {
        let table = self.table();
        let mut all: Vec<ProcedureLocks> = table
            .requests
            .iter()
            .filter(|(_, r)| !r.keys.is_empty())
            .map(|(&n, r)| Self::show(&table, n, r))
            .collect();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all
    }

    /// How many requests the table holds, granted or waiting.
    #[cfg(test)]
    pub(crate) fn requests_held(&self) -> usize {
        self.table().requests.len()
    }

    /// How many waiters releases have woken so far (each wake-up grants the waiter its keys).
    pub(crate) fn wakeups(&self) -> u64 {
        self.wakeups.load(Ordering::Relaxed)
    }

    fn show(table: &Table, n: u64, r: &Request) -> ProcedureLocks {
        if r.granted {
            return ProcedureLocks {
                id: r.who.id.clone(),
                held: r
                    .keys
                    .iter()
                    .map(|(key, exclusive)| HeldKey {
                        key: key.clone(),
                        exclusive: *exclusive,
                    })
                    .collect(),
                waiting: None,
            };
        }
        let waiting = table
            .blocker(n, r)
            .map(|(key, exclusive, b, holds)| LockWait {
                key,
                exclusive,
                blocked_by: table
                    .requests
                    .get(&b)
                    .map(|o| o.who.id.clone())
                    .unwrap_or_else(|| r.who.id.clone()),
                blocker_holds: holds,
            });
        ProcedureLocks {
            id: r.who.id.clone(),
            held: Vec::new(),
            waiting,
        }
    }
}

/// One request of a procedure: while it waits, its place in the queues; once granted, its keys. Dropping it leaves
/// the queues or releases the keys, and wakes only the waiters of those keys that can now be granted.
#[derive(Debug)]
pub(crate) struct LockGuard {
    table: Arc<LockTable>,
    request: u64,
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.table.release(self.request);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn root(s: &str) -> Requester {
        Requester {
            id: ProcedureId::new(s),
            ancestors: Vec::new(),
        }
    }

    /// `s` with ancestors `up` (parent first).
    fn child(s: &str, up: &[&str]) -> Requester {
        Requester {
            id: ProcedureId::new(s),
            ancestors: up.iter().map(|a| ProcedureId::new(*a)).collect(),
        }
    }

    /// Takes `keys` at once, or panics: the test expects no wait.
    async fn take(table: &Arc<LockTable>, who: &Requester, keys: &LockKey) -> LockGuard {
        let acquire = table.acquire(who, keys);
        match tokio::time::timeout(Duration::from_secs(1), acquire).await {
            Ok(Ok(guard)) => guard,
            Ok(Err(e)) => panic!("{} refused: {e}", who.id),
            Err(_) => panic!("{} waits", who.id),
        }
    }

    /// Starts `who` asking for `keys` in a task; it is queued once the task has run.
    async fn queue(
        table: &Arc<LockTable>,
        who: Requester,
        keys: LockKey,
    ) -> tokio::task::JoinHandle<Result<LockGuard>> {
        let t = Arc::clone(table);
        let task = tokio::spawn(async move { t.acquire(&who, &keys).await });
        tokio::task::yield_now().await;
        task
    }

    fn waits(table: &LockTable, id: &str) -> Option<LockWait> {
        table
            .procedure_locks(&ProcedureId::new(id))
            .and_then(|l| l.waiting)
    }

    fn holds(table: &LockTable, id: &str) -> bool {
        table
            .procedure_locks(&ProcedureId::new(id))
            .is_some_and(|l| !l.held.is_empty())
    }

    // The current-thread runtime of `tokio::test`: a spawned task runs at the next `yield_now`, so queueing is
    // ordered by the test, not by timing.
    #[tokio::test]
    async fn exclusive_waiter_blocks_later_shared_requests() {
        let table = LockTable::new();
        let s1 = take(&table, &root("s1"), &LockKey::shared("k")).await;
        let x = queue(&table, root("x"), LockKey::exclusive("k")).await;
        let s2 = queue(&table, root("s2"), LockKey::shared("k")).await;
        let wait = waits(&table, "s2").expect("s2 waits");
        assert_eq!(wait.blocked_by, ProcedureId::new("x"));
        assert!(
            !wait.blocker_holds,
            "s2 waits behind the queued exclusive request"
        );
        let wait = waits(&table, "x").expect("x waits");
        assert_eq!(
            (wait.blocked_by, wait.blocker_holds),
            (ProcedureId::new("s1"), true)
        );

        drop(s1);
        let x = x.await.unwrap().unwrap();
        assert!(holds(&table, "x"));
        assert!(
            waits(&table, "s2").is_some(),
            "s2 still waits while x holds the key"
        );
        drop(x);
        let _s2 = s2.await.unwrap().unwrap();
        assert!(holds(&table, "s2"));
    }

    #[tokio::test]
    async fn siblings_hold_an_exclusive_key_one_at_a_time() {
        let table = LockTable::new();
        let _parent = take(&table, &root("p"), &LockKey::exclusive("k")).await;
        // A child takes its parent's key.
        let c1 = take(&table, &child("p/c1", &["p"]), &LockKey::exclusive("k")).await;
        let c2 = queue(&table, child("p/c2", &["p"]), LockKey::exclusive("k")).await;
        let wait = waits(&table, "p/c2").expect("the sibling waits");
        assert_eq!(
            (wait.blocked_by, wait.blocker_holds),
            (ProcedureId::new("p/c1"), true)
        );
        // The grandchild of c1 takes the key: both holders above it are its ancestors.
        let _g = take(
            &table,
            &child("p/c1/g", &["p/c1", "p"]),
            &LockKey::exclusive("k"),
        )
        .await;
        drop(_g);
        drop(c1);
        let _c2 = c2.await.unwrap().unwrap();
        assert!(holds(&table, "p/c2"));
    }

    #[tokio::test]
    async fn a_descendant_is_not_queued_behind_waiters_of_other_trees() {
        let table = LockTable::new();
        let _p = take(&table, &root("p"), &LockKey::shared("k")).await;
        // Another tree waits for `k` exclusively, i.e. for p, which waits for its child.
        let _x = queue(&table, root("x"), LockKey::exclusive("k")).await;
        let _c = take(&table, &child("p/c", &["p"]), &LockKey::shared("k")).await;
    }

    #[tokio::test]
    async fn a_release_wakes_only_the_waiters_it_unblocks() {
        let table = LockTable::new();
        let a = take(&table, &root("a"), &LockKey::exclusive("a")).await;
        let b = take(&table, &root("b"), &LockKey::exclusive("b")).await;
        let on_a = queue(&table, root("wa"), LockKey::exclusive("a")).await;
        let on_b1 = queue(&table, root("wb1"), LockKey::exclusive("b")).await;
        let on_b2 = queue(&table, root("wb2"), LockKey::exclusive("b")).await;
        assert_eq!(table.wakeups(), 0);

        drop(a);
        let wa = on_a.await.unwrap().unwrap();
        assert_eq!(
            table.wakeups(),
            1,
            "releasing `a` wakes its one waiter, none of `b`'s"
        );
        drop(wa);
        assert_eq!(table.wakeups(), 1, "nobody waits for `a` any more");
        drop(b);
        let wb1 = on_b1.await.unwrap().unwrap();
        assert_eq!(
            table.wakeups(),
            2,
            "only the first waiter of `b` can be granted"
        );
        assert!(waits(&table, "wb2").is_some());
        drop(wb1);
        let _wb2 = on_b2.await.unwrap().unwrap();
        assert_eq!(table.wakeups(), 3);
    }

    #[tokio::test]
    async fn keys_are_granted_all_or_nothing() {
        let table = LockTable::new();
        let y = take(&table, &root("a"), &LockKey::exclusive("y")).await;
        let both = LockKey::new([
            StringKey::Exclusive("x".into()),
            StringKey::Exclusive("y".into()),
        ]);
        let b = queue(&table, root("b"), both).await;
        assert!(
            table
                .procedure_locks(&ProcedureId::new("b"))
                .is_some_and(|l| l.held.is_empty())
        );
        // `x` is held by nobody: a later request for it waits only because b is queued first.
        let c = queue(&table, root("c"), LockKey::exclusive("x")).await;
        let wait = waits(&table, "c").expect("c waits");
        assert_eq!(
            (wait.blocked_by, wait.blocker_holds),
            (ProcedureId::new("b"), false)
        );
        drop(y);
        let b = b.await.unwrap().unwrap();
        assert!(holds(&table, "b"));
        drop(b);
        let _c = c.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_waiter_that_leaves_lets_the_next_one_in() {
        let table = LockTable::new();
        let s = take(&table, &root("s"), &LockKey::shared("k")).await;
        let x = queue(&table, root("x"), LockKey::exclusive("k")).await;
        let s2 = queue(&table, root("s2"), LockKey::shared("k")).await;
        x.abort();
        let _ = x.await;
        let _s2 = s2.await.unwrap().unwrap();
        assert!(holds(&table, "s2"));
        drop(s);
        assert!(table.procedure_locks(&ProcedureId::new("x")).is_none());
    }

    #[tokio::test]
    async fn a_cycle_through_the_own_tree_is_refused() {
        let table = LockTable::new();
        // Root r's children a and h each hold one key; a's child waits for h's key.
        let _a = take(&table, &child("r/a", &["r"]), &LockKey::exclusive("ka")).await;
        let _h = take(&table, &child("r/h", &["r"]), &LockKey::exclusive("kh")).await;
        let _x = queue(
            &table,
            child("r/a/x", &["r/a", "r"]),
            LockKey::exclusive("kh"),
        )
        .await;
        // h's child asking for a's key would close the cycle.
        let d = child("r/h/d", &["r/h", "r"]);
        let err = table.check(&d, &LockKey::exclusive("ka")).unwrap_err();
        let text = err.to_string();
        for name in ["r/h/d", "'ka'", "r/a", "r/a/x", "r/h"] {
            assert!(text.contains(name), "{name} missing from: {text}");
        }
        assert!(matches!(
            table.acquire(&d, &LockKey::exclusive("ka")).await,
            Err(Error::LockDeadlock { .. })
        ));
        assert!(
            table.procedure_locks(&d.id).is_none(),
            "the refused request is not queued"
        );
        // Asking for a free key is fine.
        assert!(table.check(&d, &LockKey::exclusive("free")).is_ok());
    }

    #[tokio::test]
    async fn a_cycle_through_another_tree_is_refused() {
        let table = LockTable::new();
        let _p = take(&table, &root("p"), &LockKey::exclusive("k")).await;
        let _q = take(&table, &root("q"), &LockKey::exclusive("j")).await;
        let c = queue(&table, child("p/c", &["p"]), LockKey::exclusive("j")).await;
        let err = table
            .check(&child("q/d", &["q"]), &LockKey::exclusive("k"))
            .unwrap_err();
        assert!(
            err.to_string().contains("p/c waits for key 'j' held by q"),
            "{err}"
        );
        // Without the waiting child of p there is no cycle: q/d would only wait for p to end.
        c.abort();
        let _ = c.await;
        assert!(
            table
                .check(&child("q/d", &["q"]), &LockKey::exclusive("k"))
                .is_ok()
        );
    }
}
