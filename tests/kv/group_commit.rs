//! Group commit of `KvStateStore`: writes that arrive while a commit is in flight share the next commit (one kv
//! transaction, the epoch compared once); a write whose own condition fails is refused alone and the rest of its
//! batch commits; a batch whose epoch moved is refused whole and its manager halts. The commit in flight is held
//! by a gate on the backend, so which writes share a batch is decided by the test, not by timing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use procedures::record::EPOCH_KEY;
use procedures::store::{Condition, StateStore, WriteOp, WriteOutcome};
use procedures::{
    Context, LocalManager, LockKey, ManagerConfig, Procedure, ProcedureId, ProcedureManager,
    ProcedureWithId, Status,
};
use remote_wal::kv::{
    Compare, KvBackend, KvBackendRef, KvStateStore, KvWrapper, MemoryKvBackend, PutRequest,
    RedbKvBackend, Txn, TxnResponse,
};
use tokio::sync::Semaphore;

const WAIT: Duration = Duration::from_secs(10);

/// A backend whose transactions, once [`Gate::close`]d, wait for a permit each ([`Gate::open`]); it records every
/// transaction sent.
#[derive(Debug)]
struct Gate {
    inner: KvBackendRef,
    closed: Mutex<bool>,
    permits: Semaphore,
    /// Transactions waiting at the closed gate.
    waiting: AtomicUsize,
    /// The limit of operations per transaction it reports (its inner backend's when `None`).
    max_ops: Option<usize>,
    /// The transactions in flight it asks a writer for (its inner backend's when `None`).
    in_flight: Option<usize>,
    /// While the gate is closed, transactions putting this key wait for a permit of `key_permits` instead.
    held_key: Mutex<Option<Vec<u8>>>,
    key_permits: Semaphore,
    /// A transaction putting this key fails with a transport error, retryable and unapplied, once it passes.
    failing_key: Mutex<Option<Vec<u8>>>,
    txns: Mutex<Vec<Txn>>,
}

impl Gate {
    fn new(inner: KvBackendRef) -> Arc<Self> {
        Arc::new(Gate {
            inner,
            closed: Mutex::new(false),
            permits: Semaphore::new(0),
            waiting: AtomicUsize::new(0),
            max_ops: None,
            in_flight: None,
            held_key: Mutex::new(None),
            key_permits: Semaphore::new(0),
            failing_key: Mutex::new(None),
            txns: Mutex::new(Vec::new()),
        })
    }

    /// A gate of `max_ops` operations per transaction that asks for `in_flight` transactions at once.
    fn pipelining(inner: KvBackendRef, max_ops: usize, in_flight: usize) -> Arc<Self> {
        let mut gate = Arc::into_inner(Gate::new(inner)).expect("not shared yet");
        gate.max_ops = Some(max_ops);
        gate.in_flight = Some(in_flight);
        Arc::new(gate)
    }

    /// Lets `n` held (or later) transactions through, the gate staying closed.
    fn release(&self, n: usize) {
        self.permits.add_permits(n);
    }

    /// Waits until exactly `n` transactions wait at the closed gate.
    async fn holding_exactly(&self, n: usize) {
        tokio::time::timeout(WAIT, async {
            while self.waiting.load(Ordering::SeqCst) != n {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{n} transactions at the gate"));
    }

    /// A gate that reports at most `max_ops` operations per transaction, and refuses a larger one as etcd does.
    fn with_max_ops(inner: KvBackendRef, max_ops: usize) -> Arc<Self> {
        let mut gate = Arc::into_inner(Gate::new(inner)).expect("not shared yet");
        gate.max_ops = Some(max_ops);
        Arc::new(gate)
    }

    fn close(&self) {
        *self.closed.lock().unwrap() = true;
    }

    /// Opens the gate for good (held transactions go on).
    fn open(&self) {
        *self.closed.lock().unwrap() = false;
        self.permits.add_permits(1024);
        self.key_permits.add_permits(1024);
    }

    /// While closed, holds transactions that put `key` until [`Gate::open`], whatever [`Gate::release`] lets by.
    fn hold_key(&self, key: &str) {
        *self.held_key.lock().unwrap() = Some(format!("__procedure__/{key}").into_bytes());
    }

    /// Transactions that put `key` fail as a broken connection would fail them (nothing applied), until
    /// [`Gate::heal`].
    fn fail_key(&self, key: &str) {
        *self.failing_key.lock().unwrap() = Some(format!("__procedure__/{key}").into_bytes());
    }

    fn heal(&self) {
        *self.failing_key.lock().unwrap() = None;
    }

    fn txns(&self) -> Vec<Txn> {
        self.txns.lock().unwrap().clone()
    }

    /// Waits until a transaction waits at the closed gate.
    async fn holding(&self) {
        tokio::time::timeout(WAIT, async {
            while self.waiting.load(Ordering::SeqCst) == 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("a commit reaches the gate");
    }
}

#[async_trait]
impl KvWrapper for Gate {
    fn inner(&self) -> &dyn KvBackend {
        self.inner.as_ref()
    }
    fn max_txn_ops(&self) -> usize {
        self.max_ops.unwrap_or_else(|| self.inner.max_txn_ops())
    }
    fn max_txns_in_flight(&self) -> usize {
        self.in_flight
            .unwrap_or_else(|| self.inner.max_txns_in_flight())
    }
    async fn txn(&self, txn: Txn) -> remote_wal::kv::Result<TxnResponse> {
        let closed = *self.closed.lock().unwrap();
        if closed {
            let held_key = self.held_key.lock().unwrap().clone();
            let puts_held_key = held_key.is_some_and(|held| {
                txn.success
                    .iter()
                    .any(|op| matches!(op, remote_wal::kv::TxnOp::Put(key, _) if *key == held))
            });
            let permits = if puts_held_key {
                &self.key_permits
            } else {
                &self.permits
            };
            self.waiting.fetch_add(1, Ordering::SeqCst);
            permits
                .acquire()
                .await
                .expect("the gate's semaphore is never closed")
                .forget();
            self.waiting.fetch_sub(1, Ordering::SeqCst);
        }
        self.txns.lock().unwrap().push(txn.clone());
        if let Some(failing) = self.failing_key.lock().unwrap().clone()
            && puts(&txn, &failing)
        {
            return Err(remote_wal::kv::Error::EtcdOp {
                endpoints: "127.0.0.1:2379".to_string(),
                action: "txn",
                key: String::from_utf8_lossy(&failing).into_owned(),
                detail: "transport error (connection reset)".to_string(),
                source: Box::new(etcd_client::Error::IoError(std::io::Error::from(
                    std::io::ErrorKind::ConnectionReset,
                ))),
                retryable: true,
            });
        }
        let ops = txn.compare.len() + txn.success.len().max(txn.failure.len());
        if let Some(max) = self.max_ops {
            assert!(
                ops <= max,
                "a transaction of {ops} operations, over the limit of {max}"
            );
        }
        self.inner.txn(txn).await
    }
}

/// Whether `txn` puts `key` (a raw kv key).
fn puts(txn: &Txn, key: &[u8]) -> bool {
    txn.success
        .iter()
        .any(|op| matches!(op, remote_wal::kv::TxnOp::Put(k, _) if k.as_slice() == key))
}

fn epoch_is(epoch: u64) -> Condition {
    Condition::Equals {
        key: EPOCH_KEY.to_string(),
        value: epoch.to_string().into_bytes(),
    }
}

fn put(key: &str) -> WriteOp {
    WriteOp::Put {
        key: key.to_string(),
        value: format!("v-{key}").into_bytes(),
    }
}

fn absent(key: &str) -> Condition {
    Condition::Absent {
        key: key.to_string(),
    }
}

/// A group-committing store at epoch 1 on a gate of `max_ops` operations per transaction that asks for
/// `in_flight` transactions at once.
async fn pipelining_store(max_ops: usize, in_flight: usize) -> (Arc<Gate>, Arc<KvStateStore>) {
    let gate = Gate::pipelining(Arc::new(MemoryKvBackend::new()), max_ops, in_flight);
    let store = Arc::new(KvStateStore::new(gate.clone()));
    store.put(EPOCH_KEY, b"1".to_vec()).await.unwrap();
    (gate, store)
}

fn spawn_write(
    store: &Arc<KvStateStore>,
    conditions: Vec<Condition>,
    ops: Vec<WriteOp>,
) -> tokio::task::JoinHandle<procedures::Result<WriteOutcome>> {
    let store = store.clone();
    tokio::spawn(async move { store.write(conditions, ops).await })
}

/// Writes `k0`, `k1`, … (each absent, then put), queued one after the other so the queue's order is theirs.
async fn queue_in_order(
    store: &Arc<KvStateStore>,
    n: usize,
) -> Vec<tokio::task::JoinHandle<procedures::Result<WriteOutcome>>> {
    let queued_before = store.queued_writes();
    let mut tasks = Vec::new();
    for i in 0..n {
        let key = format!("k{i}");
        tasks.push(spawn_write(
            store,
            vec![epoch_is(1), absent(&key)],
            vec![put(&key)],
        ));
        queued(store, queued_before + i + 1).await;
    }
    tasks
}

/// Waits until `n` writes are queued behind the commit in flight.
async fn queued(store: &KvStateStore, n: usize) {
    tokio::time::timeout(WAIT, async {
        while store.queued_writes() < n {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{n} writes queue up (got {})", store.queued_writes()));
}

/// The epoch compares of a transaction of `store`.
fn epoch_compares(txn: &Txn) -> usize {
    txn.compare
        .iter()
        .filter(|c| c.key() == b"__procedure__/epoch")
        .count()
}

/// Holds one write in commit, queues `writes` behind it, lets them go; returns the queued writes' outcomes.
async fn batch_behind_a_held_commit(
    store: &Arc<KvStateStore>,
    gate: &Gate,
    writes: Vec<(Vec<Condition>, Vec<WriteOp>)>,
) -> Vec<procedures::Result<WriteOutcome>> {
    gate.close();
    let held = {
        let store = store.clone();
        tokio::spawn(async move { store.write(vec![epoch_is(1)], vec![put("held")]).await })
    };
    // The held write is in flight: taken off the queue, its transaction waits at the gate.
    gate.holding().await;
    let n = writes.len();
    let tasks: Vec<_> = writes
        .into_iter()
        .map(|(conditions, ops)| {
            let store = store.clone();
            tokio::spawn(async move { store.write(conditions, ops).await })
        })
        .collect();
    queued(store, n).await;
    gate.open();
    assert_eq!(
        held.await.unwrap().unwrap(),
        WriteOutcome::Applied,
        "the held write"
    );
    let mut out = Vec::new();
    for t in tasks {
        out.push(tokio::time::timeout(WAIT, t).await.unwrap().unwrap());
    }
    out
}

async fn store_on(kv: KvBackendRef) -> (Arc<Gate>, Arc<KvStateStore>) {
    let gate = Gate::new(kv);
    let store = Arc::new(KvStateStore::new(gate.clone()));
    store.put(EPOCH_KEY, b"1".to_vec()).await.unwrap();
    (gate, store)
}

async fn one_failed_condition_fails_alone(kv: KvBackendRef) {
    let (gate, store) = store_on(kv).await;
    store.put("taken", b"old".to_vec()).await.unwrap();
    let outcomes = batch_behind_a_held_commit(
        &store,
        &gate,
        vec![
            (vec![epoch_is(1), absent("a")], vec![put("a")]),
            (vec![epoch_is(1), absent("taken")], vec![put("taken")]),
            (vec![epoch_is(1), absent("c")], vec![put("c"), put("c2")]),
        ],
    )
    .await;
    assert_eq!(outcomes[0].as_ref().unwrap(), &WriteOutcome::Applied);
    assert_eq!(
        outcomes[1].as_ref().unwrap(),
        &WriteOutcome::Rejected {
            current: vec![
                (EPOCH_KEY.to_string(), Some(b"1".to_vec())),
                ("taken".to_string(), Some(b"old".to_vec())),
            ]
        },
        "the refused write reports its own conditions, as alone"
    );
    assert_eq!(outcomes[2].as_ref().unwrap(), &WriteOutcome::Applied);
    assert_eq!(store.get("a").await.unwrap(), Some(b"v-a".to_vec()));
    assert_eq!(store.get("c2").await.unwrap(), Some(b"v-c2".to_vec()));
    assert_eq!(store.get("taken").await.unwrap(), Some(b"old".to_vec()));

    // The three queued writes went into one transaction (refused by the one condition), then the two others into
    // a second; the epoch compared once in each.
    let txns = gate.txns();
    let batches: Vec<&Txn> = txns.iter().filter(|t| t.success.len() >= 3).collect();
    assert_eq!(batches.len(), 2, "{txns:#?}");
    assert_eq!(batches[0].success.len(), 4);
    assert_eq!(batches[1].success.len(), 3);
    for t in &batches {
        assert_eq!(epoch_compares(t), 1, "{t:#?}");
    }
    assert!(
        batches[1]
            .compare
            .iter()
            .all(|c| c != &Compare::Absent(b"__procedure__/taken".to_vec())),
        "the second commit is without the refused write"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_memory_a_write_whose_condition_fails_is_refused_alone_and_its_batch_commits() {
    one_failed_condition_fails_alone(Arc::new(MemoryKvBackend::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redb_a_write_whose_condition_fails_is_refused_alone_and_its_batch_commits() {
    let dir = tempfile::tempdir().unwrap();
    let kv = Arc::new(RedbKvBackend::open(dir.path().join("meta.redb")).unwrap());
    one_failed_condition_fails_alone(kv).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_epoch_moved_is_refused_whole() {
    let (gate, store) = store_on(Arc::new(MemoryKvBackend::new())).await;
    gate.close();
    let held = {
        let store = store.clone();
        tokio::spawn(async move { store.write(vec![epoch_is(1)], vec![put("held")]).await })
    };
    gate.holding().await;
    let tasks: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .map(|key| {
            let store = store.clone();
            tokio::spawn(async move { store.write(vec![epoch_is(1)], vec![put(key)]).await })
        })
        .collect();
    queued(&store, 3).await;
    // Another manager claims the store while the writes wait.
    store
        .backend()
        .put(PutRequest {
            key: b"__procedure__/epoch".to_vec(),
            value: b"2".to_vec(),
            prev_kv: false,
        })
        .await
        .unwrap();
    gate.open();
    let refused = WriteOutcome::Rejected {
        current: vec![(EPOCH_KEY.to_string(), Some(b"2".to_vec()))],
    };
    assert_eq!(held.await.unwrap().unwrap(), refused);
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap(), refused);
    }
    for key in ["held", "a", "b", "c"] {
        assert_eq!(store.get(key).await.unwrap(), None, "{key}");
    }
    // One refused transaction for the three queued writes: none was retried alone.
    let txns = gate.txns();
    assert_eq!(txns.len(), 2, "{txns:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_group_commit_off_every_write_is_its_own_commit() {
    let gate = Gate::new(Arc::new(MemoryKvBackend::new()));
    let store = Arc::new(KvStateStore::new(gate.clone()).with_group_commit(false));
    assert!(!store.group_commit());
    store.put(EPOCH_KEY, b"1".to_vec()).await.unwrap();
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .write(vec![epoch_is(1)], vec![put(&format!("k{i}"))])
                    .await
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap(), WriteOutcome::Applied);
    }
    assert_eq!(store.queued_writes(), 0);
    assert_eq!(gate.txns().len(), 8);
}

/// One step that sleeps on nothing and finishes: its submission and its `done` record are its two writes.
struct Quick;

#[async_trait]
impl Procedure for Quick {
    fn type_name(&self) -> &str {
        "quick"
    }
    async fn execute(&mut self, _ctx: &Context) -> procedures::Result<Status> {
        Ok(Status::done())
    }
    fn dump(&self) -> procedures::Result<serde_json::Value> {
        Ok(serde_json::Value::Null)
    }
    fn lock_key(&self) -> LockKey {
        LockKey::none()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_in_the_middle_of_a_batch_the_whole_batch_is_refused_and_the_manager_halts() {
    let gate = Gate::new(Arc::new(MemoryKvBackend::new()));
    let store = Arc::new(KvStateStore::new(gate.clone()));
    let manager = Arc::new(LocalManager::new(store.clone(), ManagerConfig::default()));
    manager
        .register_loader("quick", Box::new(|_| Ok(Box::new(Quick))))
        .unwrap();
    manager.start().await.unwrap();
    let epoch = manager.epoch().unwrap();

    // The first submission's commit is held; four more queue behind it.
    let sent_before = gate.txns().len();
    gate.close();
    let submit = |i: usize| {
        let manager = manager.clone();
        tokio::spawn(async move {
            manager
                .submit(ProcedureWithId::new(
                    ProcedureId::new(format!("p{i}")),
                    Box::new(Quick),
                ))
                .await?
                .wait()
                .await
        })
    };
    let first = submit(0);
    gate.holding().await;
    let rest: Vec<_> = (1..5).map(submit).collect();
    queued(&store, 4).await;
    // A newer manager claims the store meanwhile.
    store
        .backend()
        .put(PutRequest {
            key: b"__procedure__/epoch".to_vec(),
            value: (epoch + 1).to_string().into_bytes(),
            prev_kv: false,
        })
        .await
        .unwrap();
    gate.open();

    for (i, t) in std::iter::once(first).chain(rest).enumerate() {
        let err = tokio::time::timeout(WAIT, t)
            .await
            .unwrap()
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("fenced") || err.contains("not running"),
            "submission {i}: {err}"
        );
    }
    for i in 0..5 {
        let key = procedures::record::record_key(&ProcedureId::new(format!("p{i}")));
        assert_eq!(store.get(&key).await.unwrap(), None, "no record of p{i}");
        assert!(
            store
                .scan("")
                .await
                .unwrap()
                .iter()
                .all(|(k, _)| !k.contains(&format!("p{i}"))),
            "nothing of p{i} in the store"
        );
    }
    // The manager halted: it takes no new work, naming the newer epoch.
    let err = manager
        .submit(ProcedureWithId::new(
            ProcedureId::new("late"),
            Box::new(Quick),
        ))
        .await
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(err.contains("fenced by epoch"), "{err}");
    // The four queued submissions: the halt aborted their callers, so a write still queued then is dropped, not
    // sent; one already taken into the next batch is sent and refused there, with the epoch compared once for its
    // batch. Which happens depends on whether the commit task took the batch before the aborts reached the queue;
    // either way nothing of them is stored (above) and nothing is left once the store is quiet.
    tokio::time::timeout(WAIT, store.quiesce())
        .await
        .expect("the store's commit task ends");
    assert_eq!(store.queued_writes(), 0, "nothing is left queued");
    // The held submission's transaction, then what the four's was.
    let later: Vec<Txn> = gate.txns().into_iter().skip(sent_before + 1).collect();
    let sent: usize = later.iter().map(|t| t.success.len()).sum();
    assert!(sent <= 4, "{later:#?}");
    for txn in &later {
        assert_eq!(epoch_compares(txn), 1, "{txn:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_the_backends_transaction_limit_is_split_into_several_commits() {
    // 8 operations per transaction: the epoch compare, then per write one compare and one put (and one read in the
    // failure branch): at most 3 writes a commit.
    let gate = Gate::with_max_ops(Arc::new(MemoryKvBackend::new()), 8);
    let store = Arc::new(KvStateStore::new(gate.clone()));
    store.put(EPOCH_KEY, b"1".to_vec()).await.unwrap();
    let writes = (0..6)
        .map(|i| {
            let key = format!("k{i}");
            (vec![epoch_is(1), absent(&key)], vec![put(&key)])
        })
        .collect();
    let outcomes = batch_behind_a_held_commit(&store, &gate, writes).await;
    for (i, outcome) in outcomes.into_iter().enumerate() {
        assert_eq!(outcome.unwrap(), WriteOutcome::Applied, "k{i}");
        assert!(store.get(&format!("k{i}")).await.unwrap().is_some(), "k{i}");
    }
    // The held write alone, then the six queued ones in two commits of three.
    let sizes: Vec<usize> = gate.txns().iter().map(|t| t.success.len()).collect();
    assert_eq!(sizes, vec![1, 3, 3], "{:#?}", gate.txns());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_pipelining_backend_batches_on_disjoint_keys_are_in_flight_together() {
    // 8 operations per transaction (3 writes of one compare and one put), two transactions in flight.
    let (gate, store) = pipelining_store(8, 2).await;
    gate.close();
    let held = spawn_write(&store, vec![epoch_is(1)], vec![put("held")]);
    gate.holding_exactly(1).await;
    // Six writes on keys of their own, then one more on the held write's key with a compare of its own (too big to
    // join a batch of three).
    let mut tasks = queue_in_order(&store, 6).await;
    tasks.push(spawn_write(
        &store,
        vec![epoch_is(1), absent("other")],
        vec![put("held")],
    ));
    queued(&store, 7).await;
    gate.release(1);
    // The held commit done, two batches of three go out together; the last write waits for a free slot.
    gate.holding_exactly(2).await;
    assert_eq!(store.queued_writes(), 1, "{:#?}", gate.txns());
    gate.open();
    assert_eq!(held.await.unwrap().unwrap(), WriteOutcome::Applied);
    for (i, t) in tasks.into_iter().enumerate() {
        let outcome = tokio::time::timeout(WAIT, t).await.unwrap().unwrap();
        assert_eq!(outcome.unwrap(), WriteOutcome::Applied, "write {i}");
    }
    // The held write, the two batches of three (in either order) and the last write, which may pass the gate
    // before the second batch does once the gate opens.
    let txns = gate.txns();
    let mut sizes: Vec<usize> = txns.iter().map(|t| t.success.len()).collect();
    assert_eq!(sizes[0], 1, "{txns:#?}");
    sizes.sort();
    assert_eq!(sizes, vec![1, 1, 3, 3], "{txns:#?}");
    let batches: Vec<&Txn> = txns.iter().filter(|t| t.success.len() == 3).collect();
    // The two in flight together touch no key in common.
    let keys = |t: &Txn| -> std::collections::BTreeSet<Vec<u8>> {
        t.success
            .iter()
            .filter_map(|op| match op {
                remote_wal::kv::TxnOp::Put(key, _) => Some(key.clone()),
                _ => None,
            })
            .collect()
    };
    assert!(keys(batches[0]).is_disjoint(&keys(batches[1])), "{txns:#?}");
    for i in 0..6 {
        assert!(store.get(&format!("k{i}")).await.unwrap().is_some(), "k{i}");
    }
}

/// A transport error (the connection broke: the outcome of that one transaction is unknown to the store) fails the
/// writes of the transaction it struck, each with a retryable error naming its own key, and nothing else: the other
/// batch in flight at the same time commits, and each failed write, sent again, is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transport_error_fails_only_the_writes_of_its_transaction_and_retryably() {
    let (gate, store) = pipelining_store(8, 2).await;
    gate.close();
    let held = spawn_write(&store, vec![epoch_is(1)], vec![put("held")]);
    gate.holding_exactly(1).await;
    let tasks = queue_in_order(&store, 6).await;
    gate.fail_key("k0");
    gate.release(1);
    // The held commit done, two batches of three go out together: the one holding k0 fails.
    gate.holding_exactly(2).await;
    gate.open();
    assert_eq!(held.await.unwrap().unwrap(), WriteOutcome::Applied);
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(tokio::time::timeout(WAIT, t).await.unwrap().unwrap());
    }
    let failing = b"__procedure__/k0".to_vec();
    let struck: Vec<Txn> = gate
        .txns()
        .into_iter()
        .filter(|t| puts(t, &failing))
        .collect();
    assert_eq!(struck.len(), 1, "one transaction was struck: {struck:#?}");
    let in_struck = |i: usize| puts(&struck[0], format!("__procedure__/k{i}").as_bytes());
    let failed: Vec<usize> = (0..6).filter(|&i| in_struck(i)).collect();
    assert_eq!(failed.len(), 3, "{struck:#?}");
    for (i, outcome) in outcomes.iter().enumerate() {
        let key = format!("k{i}");
        if in_struck(i) {
            let err = outcome
                .as_ref()
                .expect_err("a write of the struck transaction");
            assert!(err.is_retryable(), "k{i}: {err}");
            assert!(err.to_string().contains(&key), "k{i}: {err}");
            assert_eq!(store.get(&key).await.unwrap(), None, "k{i} was applied");
        } else {
            assert_eq!(outcome.as_ref().unwrap(), &WriteOutcome::Applied, "k{i}");
            assert!(store.get(&key).await.unwrap().is_some(), "k{i}");
        }
    }
    // Sent again (as a procedure's retry would), each failed write is applied.
    gate.heal();
    for i in failed {
        let key = format!("k{i}");
        let outcome = store
            .write(vec![epoch_is(1), absent(&key)], vec![put(&key)])
            .await
            .unwrap();
        assert_eq!(outcome, WriteOutcome::Applied, "k{i} sent again");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_pipelining_backend_the_epoch_claim_goes_alone_and_nothing_overtakes_it() {
    let (gate, store) = pipelining_store(128, 4).await;
    gate.close();
    let held = spawn_write(&store, vec![epoch_is(1)], vec![put("held")]);
    gate.holding_exactly(1).await;
    // A newer manager's claim of the epoch, then a write of the old epoch on another key.
    let claim = spawn_write(
        &store,
        vec![epoch_is(1)],
        vec![WriteOp::Put {
            key: EPOCH_KEY.to_string(),
            value: b"2".to_vec(),
        }],
    );
    queued(&store, 1).await;
    let late = spawn_write(&store, vec![epoch_is(1)], vec![put("late")]);
    queued(&store, 2).await;
    gate.release(1);
    assert_eq!(held.await.unwrap().unwrap(), WriteOutcome::Applied);
    // The claim goes alone; the late write stays queued behind it although slots are free.
    gate.holding_exactly(1).await;
    assert_eq!(store.queued_writes(), 1);
    gate.open();
    assert_eq!(claim.await.unwrap().unwrap(), WriteOutcome::Applied);
    // Sent after the claim, the late write finds the epoch moved.
    assert!(
        matches!(late.await.unwrap().unwrap(), WriteOutcome::Rejected { .. }),
        "{:#?}",
        gate.txns()
    );
    assert!(store.get("late").await.unwrap().is_none());
    let sizes: Vec<usize> = gate.txns().iter().map(|t| t.success.len()).collect();
    assert_eq!(sizes, vec![1, 1, 1], "{:#?}", gate.txns());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_pipelining_backend_a_write_on_a_key_in_flight_waits_for_that_commit() {
    // 3 writes a transaction, two transactions in flight; transactions putting `k0` held until the gate opens.
    let (gate, store) = pipelining_store(8, 2).await;
    gate.close();
    gate.hold_key("k0");
    let held = spawn_write(&store, vec![epoch_is(1)], vec![put("held")]);
    gate.holding_exactly(1).await;
    let first = queue_in_order(&store, 6).await;
    // A second write on k0, whose first write goes in the batch of k0, k1, k2.
    let again = spawn_write(
        &store,
        vec![epoch_is(1)],
        vec![WriteOp::Put {
            key: "k0".to_string(),
            value: b"second".to_vec(),
        }],
    );
    queued(&store, 7).await;
    gate.release(1);
    // Batches {k0, k1, k2} and {k3, k4, k5} in flight; let the second through, the first stays held.
    gate.holding_exactly(2).await;
    gate.release(1);
    let mut first = first.into_iter();
    let held_batch: Vec<_> = first.by_ref().take(3).collect();
    for t in first {
        let outcome = tokio::time::timeout(WAIT, t).await.unwrap().unwrap();
        assert_eq!(outcome.unwrap(), WriteOutcome::Applied);
    }
    // A slot is free, but the second write on k0 must not go beside the commit that holds k0's first write.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(store.queued_writes(), 1, "{:#?}", gate.txns());
    assert_eq!(gate.waiting.load(Ordering::SeqCst), 1, "{:#?}", gate.txns());
    gate.open();
    assert_eq!(held.await.unwrap().unwrap(), WriteOutcome::Applied);
    for t in held_batch {
        let outcome = tokio::time::timeout(WAIT, t).await.unwrap().unwrap();
        assert_eq!(outcome.unwrap(), WriteOutcome::Applied);
    }
    assert_eq!(
        tokio::time::timeout(WAIT, again)
            .await
            .unwrap()
            .unwrap()
            .unwrap(),
        WriteOutcome::Applied
    );
    // The second write on k0 was sent after the first: the value is its own.
    assert_eq!(store.get("k0").await.unwrap(), Some(b"second".to_vec()));
    let last = gate.txns().last().cloned().expect("transactions");
    assert_eq!(last.success.len(), 1, "{last:#?}");
}

/// A write whose caller went away while it waited in the queue (its task aborted, as a stopping manager aborts its
/// runners) is not sent: only the write in flight lands, and the store is idle afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_write_whose_caller_went_away_is_not_committed() {
    let (gate, store) = store_on(Arc::new(MemoryKvBackend::new())).await;
    gate.close();
    let held = spawn_write(&store, vec![epoch_is(1)], vec![put("held")]);
    gate.holding().await;
    let gone = spawn_write(&store, vec![epoch_is(1), absent("gone")], vec![put("gone")]);
    queued(&store, 1).await;
    gone.abort();
    assert!(gone.await.unwrap_err().is_cancelled());
    gate.open();
    assert_eq!(held.await.unwrap().unwrap(), WriteOutcome::Applied);
    tokio::time::timeout(WAIT, store.quiesce())
        .await
        .expect("the commit task ends");
    assert_eq!(store.get("gone").await.unwrap(), None);
    assert_eq!(store.get("held").await.unwrap(), Some(b"v-held".to_vec()));
    assert_eq!(gate.txns().len(), 1, "only the held write was sent");
}

/// `quiesce` (what the manager's stop waits for) does not return while a batch is in flight, and returns once it
/// is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiesce_waits_for_the_batch_in_flight() {
    let (gate, store) = store_on(Arc::new(MemoryKvBackend::new())).await;
    gate.close();
    let held = spawn_write(&store, vec![epoch_is(1)], vec![put("held")]);
    gate.holding().await;
    let mut quiet = Box::pin(store.quiesce());
    assert!(
        futures::poll!(quiet.as_mut()).is_pending(),
        "idle while a batch waits at the gate"
    );
    gate.open();
    tokio::time::timeout(WAIT, quiet)
        .await
        .expect("idle once the batch is answered");
    assert_eq!(held.await.unwrap().unwrap(), WriteOutcome::Applied);
}

/// A commit task spawned but never run (its runtime went away first) leaves nothing that blocks: a later write on
/// another runtime starts its own commit and lands. The task's guard is made before the spawn, so dropping the
/// unpolled task resets the queue.
#[test]
fn a_commit_task_that_never_ran_blocks_no_later_write() {
    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = first.block_on(async {
        let store = Arc::new(KvStateStore::new(Arc::new(MemoryKvBackend::new())));
        store.put(EPOCH_KEY, b"1".to_vec()).await.unwrap();
        {
            let mut write = Box::pin(store.write(vec![epoch_is(1)], vec![put("orphan")]));
            // One poll queues the write and spawns the commit task, which this thread never gets to run.
            assert!(futures::poll!(write.as_mut()).is_pending());
        }
        store
    });
    drop(first);
    let second = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    second.block_on(async {
        let written =
            tokio::time::timeout(WAIT, store.write(vec![epoch_is(1)], vec![put("later")]))
                .await
                .expect("a later write is not stuck behind the task that never ran");
        assert_eq!(written.unwrap(), WriteOutcome::Applied);
        assert_eq!(store.get("orphan").await.unwrap(), None);
    });
}
