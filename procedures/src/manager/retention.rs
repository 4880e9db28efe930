//! Finished procedures: they leave the manager's memory `config.finished_in_memory` after they finished (their
//! records stay in the store), and their records are deleted from the store `config.retention` after they finished.
//!
//! Both act on whole trees (a root and its subprocedures), once the root and every member are finished; a child is
//! never forgotten or deleted while its root runs. Records that could not be recovered are never deleted (a later
//! manager with the right loader needs them) and stay in memory (they show why).
//!
//! The retention sweep reads the store, not the memory: it pages through every record ([`StateStore::scan_page`],
//! keeping a few fields of each), so records that left memory, or that this manager never loaded, are deleted too.
//!
//! [`StateStore::scan_page`]: crate::StateStore::scan_page

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::manager::local::Inner;
use crate::procedure::ProcedureId;
use crate::record::{ProcedureState, RECORD_FORMAT_VERSION, RECORD_PREFIX, now_ms, record_key};
use crate::store::{WriteOp, WriteOutcome};

/// Records read per store request by the retention sweep.
const SWEEP_PAGE: usize = 1024;

/// The shortest pause between two checks of the finished procedures in memory.
const MIN_EVICT_INTERVAL: Duration = Duration::from_millis(10);

/// How often the finished procedures in memory are checked against `finished_in_memory`: every half of it, but at
/// least every `retention_check_interval` and at most every [`MIN_EVICT_INTERVAL`].
fn evict_interval(inner: &Inner) -> Duration {
    (inner.config.finished_in_memory / 2)
        .min(inner.config.retention_check_interval)
        .max(MIN_EVICT_INTERVAL)
}

/// The retention task: forgets finished trees every [`evict_interval`] and sweeps the store every
/// `retention_check_interval`, until the manager is gone or halted.
pub(crate) async fn run(inner: Weak<Inner>) {
    let (sweep_every, evict_every) = match inner.upgrade() {
        Some(inner) => (
            inner.config.retention_check_interval,
            evict_interval(&inner),
        ),
        None => return,
    };
    let mut next_sweep = Instant::now() + sweep_every;
    let mut next_evict = Instant::now() + evict_every;
    loop {
        tokio::time::sleep_until(next_sweep.min(next_evict)).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if inner.is_halted() {
            return;
        }
        let now = Instant::now();
        if now >= next_evict {
            evict(&inner);
            next_evict = now + evict_every;
        }
        if now >= next_sweep {
            sweep(&inner).await;
            next_sweep = Instant::now() + sweep_every;
        }
    }
}

/// Forgets every finished tree in memory whose members all finished `finished_in_memory` ago or earlier. Their
/// watchers resolve from the last information (the channel closes with a finished state). Also frees the tasks that
/// have ended (runners of finished procedures), which otherwise wait for the next spawn. Returns how many
/// procedures were forgotten.
pub(crate) fn evict(inner: &Inner) -> usize {
    let keep_ms = u64::try_from(inner.config.finished_in_memory.as_millis()).unwrap_or(u64::MAX);
    let now = now_ms();
    inner.tasks.reap();
    let mut state = inner.state();
    let mut trees: BTreeMap<ProcedureId, (bool, Vec<ProcedureId>)> = BTreeMap::new();
    for (id, entry) in &state.procedures {
        let tree = trees
            .entry(entry.root.clone())
            .or_insert((true, Vec::new()));
        let old = entry.info.updated_at_ms.saturating_add(keep_ms) <= now;
        tree.0 &= entry.info.state.is_finished() && !entry.unrecoverable && old;
        tree.1.push(id.clone());
    }
    let mut forgotten = 0;
    for (_, members) in trees.into_values().filter(|(old, _)| *old) {
        for id in &members {
            state.procedures.remove(id);
        }
        forgotten += members.len();
        inner
            .finished_only_in_store
            .store(true, std::sync::atomic::Ordering::SeqCst);
        tracing::debug!(procedures = ?members, "finished procedures left memory; their records stay in the store");
    }
    forgotten
}

/// What the sweep keeps of one record.
#[derive(serde::Deserialize)]
struct Summary {
    format_version: u32,
    id: ProcedureId,
    #[serde(default)]
    parent_id: Option<ProcedureId>,
    state: ProcedureState,
    updated_at_ms: u64,
}

/// Deletes every expired finished tree of the store. Returns how many records were deleted.
pub(crate) async fn sweep(inner: &Arc<Inner>) -> usize {
    let retention_ms = u64::try_from(inner.config.retention.as_millis()).unwrap_or(u64::MAX);
    let Some(epoch) = inner.state().epoch else {
        return 0;
    };
    // Every record of the store, page by page: its parent link, and whether it may be deleted on its own account.
    let mut records: HashMap<ProcedureId, (Option<ProcedureId>, bool)> = HashMap::new();
    // Trees holding a record that cannot be read here: never deleted.
    let mut kept: HashSet<ProcedureId> = HashSet::new();
    let mut after: Option<String> = None;
    let now = now_ms();
    loop {
        let page = match inner
            .read(|| {
                inner
                    .store
                    .scan_page(RECORD_PREFIX, after.as_deref(), SWEEP_PAGE)
            })
            .await
        {
            Ok(page) => page,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the procedure records to delete expired ones");
                return 0;
            }
        };
        let Some((last, _)) = page.last() else {
            break;
        };
        after = Some(last.clone());
        for (key, value) in page {
            let key_id = ProcedureId::new(key.strip_prefix(RECORD_PREFIX).unwrap_or(&key));
            match serde_json::from_slice::<Summary>(&value) {
                Ok(s) if s.id == key_id && s.format_version <= RECORD_FORMAT_VERSION => {
                    let expired = s.state.is_finished()
                        && s.updated_at_ms.saturating_add(retention_ms) <= now;
                    records.insert(s.id, (s.parent_id, expired));
                }
                // Damaged, newer, or under another id's key: left as it is, and so is its tree.
                Ok(s) => {
                    kept.insert(key_id);
                    if let Some(parent) = s.parent_id {
                        kept.insert(parent);
                    }
                }
                Err(_) => {
                    kept.insert(key_id);
                }
            }
        }
    }
    {
        // Records this manager could not recover are kept, whatever their state says.
        let state = inner.state();
        for (id, entry) in &state.procedures {
            if entry.unrecoverable {
                kept.insert(id.clone());
            }
        }
    }
    // Trees by root: follow the parent links among the records (a record whose parent is gone is judged with the
    // others naming the same parent).
    let kept_roots: HashSet<ProcedureId> = kept.iter().map(|id| root_in(&records, id)).collect();
    let mut trees: BTreeMap<ProcedureId, (bool, Vec<ProcedureId>)> = BTreeMap::new();
    for (id, (_, expired)) in &records {
        let root = root_in(&records, id);
        let deletable = *expired && !kept.contains(id) && !kept_roots.contains(&root);
        let tree = trees.entry(root).or_insert((true, Vec::new()));
        tree.0 &= deletable;
        tree.1.push(id.clone());
    }
    let mut deleted = 0;
    for (_, mut members) in trees.into_values().filter(|(deletable, _)| *deletable) {
        members.sort();
        let ops = members
            .iter()
            .map(|id| WriteOp::Delete {
                key: record_key(id),
            })
            .collect();
        match inner.write(epoch, Vec::new(), ops, &[]).await {
            Ok(WriteOutcome::Applied) => {
                let mut state = inner.state();
                for id in &members {
                    state.procedures.remove(id);
                }
                deleted += members.len();
                tracing::debug!(procedures = ?members, "deleted expired procedure records");
            }
            Ok(WriteOutcome::Rejected { current }) => {
                tracing::warn!(?current, "the state store refused a retention delete");
            }
            Err(e) if e.is_fatal() => {
                inner.halt_on(&e);
                return deleted;
            }
            Err(e) => {
                tracing::warn!(error = %e, procedures = ?members, "cannot delete expired procedure records");
            }
        }
    }
    deleted
}

/// The root of `id` among `records`: the last ancestor reached through parent links (a parent without a record
/// ends the walk as the root). The walk is bounded: a cycle of parent links in damaged records must not hang it.
fn root_in(
    records: &HashMap<ProcedureId, (Option<ProcedureId>, bool)>,
    id: &ProcedureId,
) -> ProcedureId {
    let mut current = id.clone();
    for _ in 0..=records.len() {
        match records.get(&current).and_then(|(parent, _)| parent.clone()) {
            Some(parent) => current = parent,
            None => return current,
        }
    }
    current
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::testing::run_steps;
    use crate::{LocalManager, ManagerConfig, MemoryStateStore, ProcedureId, ProcedureManager};

    /// The runners of a burst are freed by the retention task's next round, with no submission after them. Runs on
    /// tokio's paused clock, and depends on it: the sleep elapses at once, after the retention task's rounds.
    #[tokio::test(start_paused = true)]
    async fn the_tasks_of_a_burst_are_freed_without_another_submission() {
        let config = ManagerConfig {
            retention_check_interval: Duration::from_millis(20),
            ..ManagerConfig::default()
        };
        let manager = LocalManager::new(Arc::new(MemoryStateStore::new()), config);
        manager.start().await.unwrap();
        // The manager's own tasks (retention, control poll).
        let own = manager.inner.tasks.held();
        let ids = (0..10).map(|i| ProcedureId::new(format!("burst-{i}")));
        run_steps(&manager, ids, 1, true).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(manager.inner.tasks.held(), own, "runner tasks left");
        assert_eq!(
            manager.list_procedures().await.unwrap().len(),
            10,
            "nothing forgotten"
        );
        manager.stop().await.unwrap();
    }
}
