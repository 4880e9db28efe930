//! Retention: finished procedures stay listable for `config.retention`, then their records are deleted.
//!
//! A tree (a root and its subprocedures) is deleted together, in one write, once its root and every member are
//! finished and the root finished longer than `retention` ago; a child is never deleted while its root runs.
//! Records that could not be recovered are never deleted: a later manager with the right loader needs them.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use crate::manager::local::Inner;
use crate::procedure::ProcedureId;
use crate::record::{now_ms, record_key};
use crate::store::{WriteOp, WriteOutcome};

/// The retention task: checks every `retention_check_interval` until the manager is gone or halted.
pub(crate) async fn run(inner: Weak<Inner>) {
    let interval = match inner.upgrade() {
        Some(inner) => inner.config.retention_check_interval,
        None => return,
    };
    loop {
        tokio::time::sleep(interval).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if inner.is_halted() {
            return;
        }
        sweep(&inner).await;
    }
}

/// Deletes every expired finished tree. Returns how many procedures were deleted.
pub(crate) async fn sweep(inner: &Arc<Inner>) -> usize {
    let retention_ms = u64::try_from(inner.config.retention.as_millis()).unwrap_or(u64::MAX);
    let now = now_ms();
    let (epoch, trees) = {
        let state = inner.state();
        let Some(epoch) = state.epoch else {
            return 0;
        };
        let mut trees: BTreeMap<ProcedureId, (bool, Vec<ProcedureId>)> = BTreeMap::new();
        for (id, entry) in &state.procedures {
            let tree = trees
                .entry(entry.root.clone())
                .or_insert((true, Vec::new()));
            let expired = entry.info.updated_at_ms.saturating_add(retention_ms) <= now;
            tree.0 &= entry.info.state.is_finished() && !entry.unrecoverable && expired;
            tree.1.push(id.clone());
        }
        // A tree whose root is not known here (its record is gone) is judged by its members alone.
        let trees: Vec<Vec<ProcedureId>> = trees
            .into_values()
            .filter(|(deletable, _)| *deletable)
            .map(|(_, members)| members)
            .collect();
        (epoch, trees)
    };
    let mut deleted = 0;
    for members in trees {
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
