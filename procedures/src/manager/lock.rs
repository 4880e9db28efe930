//! The lock table: shared and exclusive string keys, owned per procedure tree, taken all-or-nothing.
//!
//! A procedure takes every key of its [`LockKey`] at once under one mutex, or none of them; while it cannot, it
//! waits on a [`Notify`] that every release wakes. Nobody ever holds part of its keys while waiting for the rest, so
//! two procedures cannot deadlock on each other's keys, and nobody spins.
//!
//! Ownership is per procedure *tree* (identified by the root's id): a procedure may take a key that only its own
//! tree holds, whatever the modes, so a child can take the keys its parent holds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use crate::procedure::{LockKey, ProcedureId, StringKey};

/// One holding of a key.
#[derive(Debug)]
struct Holding {
    /// The root id of the holder's tree.
    tree: ProcedureId,
    /// The procedure holding it.
    holder: ProcedureId,
    /// Exclusive or shared.
    exclusive: bool,
}

/// Who holds which key.
#[derive(Debug, Default)]
pub(crate) struct LockTable {
    held: Mutex<HashMap<String, Vec<Holding>>>,
    released: Notify,
}

impl LockTable {
    /// An empty table.
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(LockTable::default())
    }

    fn held(&self) -> MutexGuard<'_, HashMap<String, Vec<Holding>>> {
        // Every change under this lock is a few map operations that cannot panic half-way.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes every key of `keys` for procedure `holder` of tree `tree`, waiting until all of them are free for it.
    /// The keys are released when the returned guard is dropped.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        tree: &ProcedureId,
        holder: &ProcedureId,
        keys: &LockKey,
    ) -> LockGuard {
        loop {
            // Register for the next release before looking, so a release between the look and the wait is not lost.
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if self.try_acquire(tree, holder, keys) {
                return LockGuard {
                    table: Arc::clone(self),
                    holder: holder.clone(),
                    keys: keys.keys().iter().map(|k| k.name().to_string()).collect(),
                };
            }
            released.await;
        }
    }

    /// Takes all the keys, or none when one of them is held in a conflicting way by another tree.
    fn try_acquire(&self, tree: &ProcedureId, holder: &ProcedureId, keys: &LockKey) -> bool {
        let mut held = self.held();
        let free = keys.keys().iter().all(|key| {
            let exclusive = matches!(key, StringKey::Exclusive(_));
            held.get(key.name()).is_none_or(|holdings| {
                holdings
                    .iter()
                    .all(|h| &h.tree == tree || (!exclusive && !h.exclusive))
            })
        });
        if !free {
            return false;
        }
        for key in keys.keys() {
            held.entry(key.name().to_string())
                .or_default()
                .push(Holding {
                    tree: tree.clone(),
                    holder: holder.clone(),
                    exclusive: matches!(key, StringKey::Exclusive(_)),
                });
        }
        true
    }

    fn release(&self, holder: &ProcedureId, keys: &[String]) {
        {
            let mut held = self.held();
            for key in keys {
                if let Some(holdings) = held.get_mut(key) {
                    if let Some(pos) = holdings.iter().position(|h| &h.holder == holder) {
                        holdings.swap_remove(pos);
                    }
                    if holdings.is_empty() {
                        held.remove(key);
                    }
                }
            }
        }
        self.released.notify_waiters();
    }
}

/// The keys one procedure holds; dropping it releases them and wakes every waiter.
#[derive(Debug)]
pub(crate) struct LockGuard {
    table: Arc<LockTable>,
    holder: ProcedureId,
    keys: Vec<String>,
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.table.release(&self.holder, &self.keys);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> ProcedureId {
        ProcedureId::new(s)
    }

    #[test]
    fn exclusive_key_of_another_tree_blocks() {
        let table = LockTable::new();
        let key = LockKey::exclusive("k");
        assert!(table.try_acquire(&id("a"), &id("a"), &key));
        assert!(!table.try_acquire(&id("b"), &id("b"), &key));
        assert!(!table.try_acquire(&id("b"), &id("b"), &LockKey::shared("k")));
        table.release(&id("a"), &["k".to_string()]);
        assert!(table.try_acquire(&id("b"), &id("b"), &key));
    }

    #[test]
    fn shared_keys_coexist_but_block_exclusive() {
        let table = LockTable::new();
        assert!(table.try_acquire(&id("a"), &id("a"), &LockKey::shared("k")));
        assert!(table.try_acquire(&id("b"), &id("b"), &LockKey::shared("k")));
        assert!(!table.try_acquire(&id("c"), &id("c"), &LockKey::exclusive("k")));
    }

    #[test]
    fn same_tree_takes_held_keys() {
        let table = LockTable::new();
        assert!(table.try_acquire(&id("a"), &id("a"), &LockKey::exclusive("k")));
        assert!(table.try_acquire(&id("a"), &id("a/c"), &LockKey::exclusive("k")));
        // Releasing the child leaves the parent's holding in place.
        table.release(&id("a/c"), &["k".to_string()]);
        assert!(!table.try_acquire(&id("b"), &id("b"), &LockKey::shared("k")));
    }

    #[test]
    fn all_or_nothing() {
        let table = LockTable::new();
        assert!(table.try_acquire(&id("a"), &id("a"), &LockKey::exclusive("y")));
        let both = LockKey::new([
            StringKey::Exclusive("x".into()),
            StringKey::Exclusive("y".into()),
        ]);
        assert!(!table.try_acquire(&id("b"), &id("b"), &both));
        // "x" was not taken by the failed attempt.
        assert!(table.try_acquire(&id("c"), &id("c"), &LockKey::exclusive("x")));
    }
}
