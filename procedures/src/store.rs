//! Where procedure state is persisted: the [`StateStore`] trait.

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::procedure::ProcedureId;
use crate::record::EPOCH_KEY;
use crate::step_writes::{StepStore, StepWrites};

/// A precondition of an atomic [`StateStore::write`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Condition {
    /// The key holds exactly this value.
    Equals {
        /// The key.
        key: String,
        /// The expected value.
        value: Vec<u8>,
    },
    /// The key holds no value.
    Absent {
        /// The key.
        key: String,
    },
}

impl Condition {
    /// The key the condition reads.
    pub fn key(&self) -> &str {
        match self {
            Condition::Equals { key, .. } | Condition::Absent { key } => key,
        }
    }
}

/// One change of an atomic [`StateStore::write`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteOp {
    /// Set `key` to `value`.
    Put {
        /// The key.
        key: String,
        /// The value.
        value: Vec<u8>,
    },
    /// Remove `key` (no error if it is absent).
    Delete {
        /// The key.
        key: String,
    },
}

impl WriteOp {
    /// The key the op changes.
    pub fn key(&self) -> &str {
        match self {
            WriteOp::Put { key, .. } | WriteOp::Delete { key } => key,
        }
    }
}

/// What an atomic [`StateStore::write`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Every condition held; every op was applied.
    Applied,
    /// Some condition failed; nothing was applied. `current` holds, for each condition key, its value at that
    /// moment (`None` = absent).
    Rejected {
        /// The condition keys and their current values.
        current: Vec<(String, Option<Vec<u8>>)>,
    },
}

/// Durable key-value storage for procedure records. Every method is one durable operation: when it returns `Ok`,
/// the change survives a crash.
#[async_trait]
pub trait StateStore: Send + Sync {
    /// The value of `key`.
    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>>;

    /// Every key starting with `prefix`, with its value, in key order.
    async fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>>;

    /// One page of [`StateStore::scan`]: at most `limit` (≥ 1) keys starting with `prefix` and after `after`
    /// (from the first when `None`), with their values, in key order. A store may return fewer than `limit` (its
    /// own page size); an empty page means no key is left. Pages are separate reads, not one snapshot. The
    /// default reads the whole prefix and keeps the page: stores that can read a range override it.
    async fn scan_page(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Vec<u8>)>> {
        Ok(page_of(self.scan(prefix).await?, after, limit))
    }

    /// Sets `key` to `value`.
    async fn put(&self, key: &str, value: Vec<u8>) -> Result<()>;

    /// Removes `keys` (absent keys are not an error), atomically.
    async fn delete(&self, keys: &[String]) -> Result<()>;

    /// Applies `ops` atomically if every one of `conditions` holds, else nothing.
    async fn write(&self, conditions: Vec<Condition>, ops: Vec<WriteOp>) -> Result<WriteOutcome>;

    /// Claims the epoch a starting manager runs under, in one attempt: `Ok(Some(epoch))` once it is stored;
    /// `Ok(None)` when another manager changed the epoch key between this claim's read and its write (the manager
    /// tries again). The default is the engine's own claim ([`claim_next_epoch`]): read
    /// [`crate::record::EPOCH_KEY`] and write the next number conditioned on the value read. A store whose epoch
    /// comes from elsewhere (an election) overrides it and writes that epoch, conditioned on its own proof of
    /// leadership: the claim is a kind of write of its own, never a write of the epoch key the store would have to
    /// recognise.
    async fn claim_epoch(&self) -> Result<Option<u64>> {
        claim_next_epoch(self).await
    }

    /// Tells of changes to the keys under `prefix` as they happen, when the store can: a counter raised after each
    /// change (and whenever changes may have been missed). The manager then reads the control keys and the epoch
    /// when they change instead of every `control_poll_interval`. `None` (the default): the manager polls.
    fn watch_changes(&self, prefix: &str) -> Option<tokio::sync::watch::Receiver<u64>> {
        let _ = prefix;
        None
    }

    /// Counts the changes made through this store to the keys under `prefix`, when the store sees every change to
    /// them (an embedded store one process owns, not a shared service others write to): the count is raised for a
    /// change before any read can see the change, so a reader that notes the count and then reads the keys has
    /// seen every change counted up to the count it noted. The manager then skips its step boundaries' read of the
    /// control keys while their count has not moved since its last read. `None` (the default): every boundary
    /// reads the keys. Asked once per prefix by a manager; every call for one prefix returns the same count.
    fn counts_changes(&self, prefix: &str) -> Option<std::sync::Arc<std::sync::atomic::AtomicU64>> {
        let _ = prefix;
        None
    }

    /// Waits until no write handed to this store is still queued or in flight (a store that commits writes in a
    /// task of its own, e.g. a group commit). The manager calls it when it stops, after its own tasks are gone, so
    /// nothing it wrote lands after [`crate::ProcedureManager::stop`] returns. The default has nothing to wait for.
    async fn quiesce(&self) {}

    /// Whether [`StateStore::write_with_step`] can apply writes meant for `store` atomically with this store's own:
    /// this store lives in `store`. `false` by default; the engine then applies a step's writes alone first.
    fn joins(&self, _store: &dyn StepStore) -> bool {
        false
    }

    /// [`StateStore::write`] plus `step`'s conditions and ops (on the store this one [joins](StateStore::joins)),
    /// all in one atomic commit. A rejection lists this write's `conditions` first, then `step`'s conditions, each
    /// with its current value. Only called when [`StateStore::joins`] said yes for `step`'s store; the default
    /// refuses.
    async fn write_with_step(
        &self,
        conditions: Vec<Condition>,
        ops: Vec<WriteOp>,
        step: &StepWrites,
    ) -> Result<WriteOutcome> {
        let _ = (conditions, ops);
        Err(crate::error::Error::Store {
            action: "write with step writes",
            key: step
                .ops()
                .first()
                .map(|op| op.key().to_string())
                .unwrap_or_default(),
            source: "this state store cannot join a step's writes".into(),
            retryable: false,
        })
    }
}

/// The page [`StateStore::scan_page`] returns by default: at most `limit` (at least 1) of `all` (one whole scan, in
/// key order) after `after`.
pub(crate) fn page_of(
    all: Vec<(String, Vec<u8>)>,
    after: Option<&str>,
    limit: usize,
) -> Vec<(String, Vec<u8>)> {
    all.into_iter()
        .filter(|(k, _)| after.is_none_or(|after| k.as_str() > after))
        .take(limit.max(1))
        .collect()
}

/// The engine's own epoch claim, one attempt (see [`StateStore::claim_epoch`]): reads [`EPOCH_KEY`] and writes the
/// next number conditioned on the value read (on the key being absent: 1).
pub async fn claim_next_epoch<S: StateStore + ?Sized>(store: &S) -> Result<Option<u64>> {
    let current = store.get(EPOCH_KEY).await?;
    let (condition, previous) = match &current {
        Some(bytes) => {
            let previous = std::str::from_utf8(bytes)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| Error::CorruptRecord {
                    id: ProcedureId::new(EPOCH_KEY),
                    type_name: "epoch".to_string(),
                    key: EPOCH_KEY.to_string(),
                    reason: format!(
                        "the epoch is not a decimal number: {:?}",
                        String::from_utf8_lossy(bytes)
                    ),
                })?;
            (
                Condition::Equals {
                    key: EPOCH_KEY.to_string(),
                    value: bytes.clone(),
                },
                previous,
            )
        }
        None => (
            Condition::Absent {
                key: EPOCH_KEY.to_string(),
            },
            0,
        ),
    };
    // An epoch never wraps: a manager claiming 0 after u64::MAX would be fenced by every older one.
    let Some(epoch) = previous.checked_add(1) else {
        return Err(Error::ManagerNotRunning {
            reason: format!(
                "could not claim an epoch: '{EPOCH_KEY}' holds {previous}, the largest epoch; no newer one exists \
                 (repair by hand: stop every manager, then reset '{EPOCH_KEY}' to 0)"
            ),
        });
    };
    let outcome = store
        .write(
            vec![condition],
            vec![WriteOp::Put {
                key: EPOCH_KEY.to_string(),
                value: epoch.to_string().into_bytes(),
            }],
        )
        .await?;
    Ok((outcome == WriteOutcome::Applied).then_some(epoch))
}
