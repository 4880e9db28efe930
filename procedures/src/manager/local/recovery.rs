//! Recovery at `start`: claim the epoch, read every record, rebuild the procedure tree, and start a runner for each
//! unfinished recoverable procedure; loaders, and adopting a procedure another manager left.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::control::ControlRequests;
use crate::error::{Error, Result};
use crate::event::{EventKind, push_event, truncate_text};
use crate::manager::runner::Resume;
use crate::manager::{control, retention};
use crate::procedure::{BoxedProcedure, BoxedProcedureLoader, ProcedureId};
use crate::record::{
    ProcedureInfo, ProcedureRecord, ProcedureState, RECORD_FORMAT_VERSION, RECORD_PREFIX, now_ms,
    record_key,
};

use super::submission::self_not_started;
use super::{Entry, Inner, Phase};

impl Inner {
    /// Claims the epoch, loads every record, and starts a runner for every unfinished recoverable one.
    pub(crate) async fn start(self: &Arc<Self>) -> Result<()> {
        // Held for the whole start: a `stop` meanwhile waits and then stops what this start began.
        let _lifecycle = self.lifecycle.lock().await;
        let halted = matches!(self.state().phase, Phase::Halted(_));
        if halted {
            self.reset().await;
        }
        {
            let mut state = self.state();
            if !matches!(state.phase, Phase::New) {
                return Err(Error::ManagerNotRunning {
                    reason: "the manager is already started".to_string(),
                });
            }
            state.phase = Phase::Starting;
        }
        let loaded = async {
            let epoch = self.claim_epoch().await?;
            let records = self.read_records().await?;
            let noted = self.control_changes_now();
            let controls = self
                .read(|| ControlRequests::read(self.store.as_ref()))
                .await?;
            Ok::<_, Error>((epoch, records, (controls, noted)))
        }
        .await;
        let (epoch, records, controls) = match loaded {
            Ok(loaded) => loaded,
            Err(e) => {
                let mut state = self.state();
                // Not started: `start` may be tried again (unless the manager was stopped meanwhile).
                if matches!(state.phase, Phase::Starting) {
                    state.phase = Phase::New;
                }
                return Err(e);
            }
        };

        self.set_controls(controls.0, controls.1);
        // Records are decoded and loaders run before the manager's state is locked: a loader may call the manager
        // (its epoch, a watcher) without deadlocking it.
        let recovered: Vec<Recovered> = records
            .iter()
            .map(|(key, value)| self.recover(key, value))
            .collect();
        let mut runners = Vec::new();
        // Finished records older than `finished_in_memory` stay in the store only (read there when asked for).
        let keep_ms = u64::try_from(self.config.finished_in_memory.as_millis()).unwrap_or(u64::MAX);
        let loaded_at = now_ms();
        {
            let mut state = self.state();
            if let Phase::Halted(reason) = &state.phase {
                // Stopped while starting.
                return Err(reason.error());
            }
            state.epoch = Some(epoch);
            state.phase = Phase::Running;
            self.note_running(epoch);
            self.tasks.open(epoch);
            for recovered in recovered {
                match recovered {
                    Recovered::Finished(record)
                        if record.updated_at_ms.saturating_add(keep_ms) <= loaded_at =>
                    {
                        self.finished_only_in_store.store(true, Ordering::SeqCst);
                    }
                    Recovered::Finished(record) => {
                        let info = ProcedureInfo::from(&record);
                        state
                            .procedures
                            .insert(record.id.clone(), Entry::new(info, record.id.clone()));
                    }
                    Recovered::Unfinished(record, procedure) => {
                        let info = ProcedureInfo::from(&record);
                        state.procedures.insert(
                            record.id.clone(),
                            Entry::to_run(info, record.id.clone(), &self.history_room),
                        );
                        runners.push((record, procedure));
                    }
                    Recovered::Unrecoverable {
                        id,
                        type_name,
                        parent_id,
                        error,
                    } => {
                        tracing::warn!(%error, "procedure record cannot be recovered");
                        let now = now_ms();
                        // No loader: a manager that has one resumes it, so it is stalled, not failed. A record
                        // that no manager can read as it is (damaged, newer) is failed.
                        let shown = if matches!(error, Error::LoaderNotFound { .. }) {
                            self.stalled_total.fetch_add(1, Ordering::Relaxed);
                            ProcedureState::Stalled
                        } else {
                            self.failed_total.fetch_add(1, Ordering::Relaxed);
                            ProcedureState::Failed
                        };
                        let text = error.to_string();
                        let mut events = Vec::new();
                        let kind = if shown == ProcedureState::Stalled {
                            EventKind::Stalled {
                                reason: truncate_text(&text),
                            }
                        } else {
                            EventKind::Failed {
                                error: truncate_text(&text),
                            }
                        };
                        push_event(&mut events, now, kind);
                        let info = ProcedureInfo {
                            id: id.clone(),
                            type_name,
                            parent_id,
                            state: shown,
                            step: 0,
                            output: None,
                            error: Some(text.clone()),
                            created_at_ms: now,
                            updated_at_ms: now,
                            step_name: None,
                            attempt: 0,
                            last_error: Some(text),
                            next_retry_at_ms: None,
                            step_started_at_ms: None,
                            lock_keys: Vec::new(),
                            locks_held: Vec::new(),
                            lock_wait: None,
                            events,
                            refusal: None,
                        };
                        let mut entry = Entry::new(info, id.clone());
                        entry.unrecoverable = true;
                        entry.tx = None;
                        // Two damaged records may name the same id; keep the first.
                        state.procedures.entry(id).or_insert(entry);
                    }
                }
            }
            // Roots: follow parent links among the known procedures.
            let roots: Vec<(ProcedureId, ProcedureId)> = state
                .procedures
                .keys()
                .map(|id| (id.clone(), root_of(&state.procedures, id)))
                .collect();
            for (id, root) in roots {
                if let Some(entry) = state.procedures.get_mut(&id) {
                    entry.root = root;
                }
            }
            tracing::info!(
                epoch,
                recovering = runners.len(),
                "procedure manager started"
            );
            for (record, procedure) in runners {
                let resume = if record.state == ProcedureState::RollingBack {
                    Resume::RollBack(record.error.clone().unwrap_or_default())
                } else {
                    Resume::Execute
                };
                self.spawn_locked(&mut state, epoch, record, procedure, resume, true);
            }
            self.tasks
                .spawn(epoch, retention::run(Arc::downgrade(self)));
            self.tasks.spawn(epoch, control::run(Arc::downgrade(self)));
        }
        Ok(())
    }

    /// Rebuilds one record.
    pub(super) fn recover(&self, key: &str, value: &[u8]) -> Recovered {
        let key_id = ProcedureId::new(key.strip_prefix(RECORD_PREFIX).unwrap_or(key));
        let record: ProcedureRecord = match serde_json::from_slice(value) {
            Ok(record) => record,
            Err(e) => {
                // Name what can still be read of a damaged envelope.
                let loose: Option<serde_json::Value> = serde_json::from_slice(value).ok();
                let field = |name: &str| {
                    loose
                        .as_ref()
                        .and_then(|v| v.get(name))
                        .and_then(|v| v.as_str())
                        .map(str::to_string)
                };
                let id = field("id").map(ProcedureId::new).unwrap_or(key_id);
                let type_name = field("type_name").unwrap_or_else(|| "unknown".to_string());
                return Recovered::Unrecoverable {
                    error: Error::CorruptRecord {
                        id: id.clone(),
                        type_name: type_name.clone(),
                        key: key.to_string(),
                        reason: format!("the record envelope does not parse: {e}"),
                    },
                    id,
                    type_name,
                    parent_id: field("parent_id").map(ProcedureId::new),
                };
            }
        };
        if record.id != key_id {
            // Resumed (or deleted by retention) as the id it names, it would write over that procedure's record.
            return Recovered::Unrecoverable {
                error: Error::CorruptRecord {
                    id: key_id.clone(),
                    type_name: record.type_name.clone(),
                    key: key.to_string(),
                    reason: format!(
                        "the record names procedure {}, not the one of its key",
                        record.id
                    ),
                },
                id: key_id,
                type_name: record.type_name,
                parent_id: record.parent_id,
            };
        }
        let unrecoverable = |error: Error| Recovered::Unrecoverable {
            id: record.id.clone(),
            type_name: record.type_name.clone(),
            parent_id: record.parent_id.clone(),
            error,
        };
        if record.format_version > RECORD_FORMAT_VERSION {
            return unrecoverable(Error::CorruptRecord {
                id: record.id.clone(),
                type_name: record.type_name.clone(),
                key: key.to_string(),
                reason: format!(
                    "record format version {} is newer than the {} this manager reads",
                    record.format_version, RECORD_FORMAT_VERSION
                ),
            });
        }
        if record.state.is_finished() {
            return Recovered::Finished(record);
        }
        let loaders = self.loaders.read().unwrap_or_else(|p| p.into_inner());
        let Some(loader) = loaders.get(&record.type_name) else {
            return unrecoverable(Error::LoaderNotFound {
                id: record.id.clone(),
                type_name: record.type_name.clone(),
                key: key.to_string(),
            });
        };
        match loader(record.data.clone()) {
            Ok(procedure) => {
                drop(loaders);
                Recovered::Unfinished(record, procedure)
            }
            Err(e) => unrecoverable(Error::CorruptRecord {
                id: record.id.clone(),
                type_name: record.type_name.clone(),
                key: key.to_string(),
                reason: format!("the loader refused its data: {e}"),
            }),
        }
    }

    /// Whether a loader is registered for `type_name`, so that [`Inner::reload`] can rebuild its procedures
    /// (loaders are never unregistered).
    pub(crate) fn has_loader(&self, type_name: &str) -> bool {
        self.loaders
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(type_name)
    }

    /// The procedure of `record` rebuilt from its persisted data by its registered loader: what a step whose
    /// writes were refused, or whose run a cancel or pause interrupted, goes back to (its in-memory state ran ahead
    /// of what is stored).
    pub(crate) fn reload(&self, record: &ProcedureRecord) -> Result<BoxedProcedure> {
        let loaders = self.loaders.read().unwrap_or_else(|p| p.into_inner());
        let Some(loader) = loaders.get(&record.type_name) else {
            return Err(Error::LoaderNotFound {
                id: record.id.clone(),
                type_name: record.type_name.clone(),
                key: record_key(&record.id),
            });
        };
        loader(record.data.clone())
    }

    pub(crate) fn register_loader(
        &self,
        type_name: &str,
        loader: BoxedProcedureLoader,
    ) -> Result<()> {
        let mut loaders = self.loaders.write().unwrap_or_else(|p| p.into_inner());
        if loaders.contains_key(type_name) {
            return Err(Error::LoaderConflict {
                type_name: type_name.to_string(),
            });
        }
        loaders.insert(type_name.to_string(), loader);
        Ok(())
    }

    /// Loads a record that exists in the store but not in memory (a child submitted before a crash that this
    /// manager did not see at start), so its parent can wait for it.
    pub(crate) async fn adopt(self: &Arc<Self>, id: &ProcedureId) -> Result<()> {
        let key = record_key(id);
        let Some(value) = self.read(|| self.store.get(&key)).await? else {
            return Err(Error::ManagerNotRunning {
                reason: format!("procedure {id} was reported to exist at '{key}' but is absent"),
            });
        };
        let recovered = self.recover(&key, &value);
        let mut state = self.state();
        let epoch = match (&state.phase, state.epoch) {
            (Phase::Running, Some(epoch)) => epoch,
            (Phase::Halted(reason), _) => return Err(reason.error()),
            _ => return Err(self_not_started()),
        };
        if state.procedures.contains_key(id) {
            return Ok(());
        }
        match recovered {
            Recovered::Finished(record) => {
                let root = adopted_root(&state.procedures, &record);
                state
                    .procedures
                    .insert(id.clone(), Entry::new(ProcedureInfo::from(&record), root));
            }
            Recovered::Unfinished(record, procedure) => {
                let root = adopted_root(&state.procedures, &record);
                state.procedures.insert(
                    id.clone(),
                    Entry::to_run(ProcedureInfo::from(&record), root, &self.history_room),
                );
                let resume = if record.state == ProcedureState::RollingBack {
                    Resume::RollBack(record.error.clone().unwrap_or_default())
                } else {
                    Resume::Execute
                };
                self.spawn_locked(&mut state, epoch, record, procedure, resume, true);
            }
            Recovered::Unrecoverable { error, .. } => return Err(error),
        }
        Ok(())
    }
}

/// The record stored at `key`, or [`Error::CorruptRecord`] naming the key when it does not parse.
pub(super) fn decode_record(key: &str, value: &[u8]) -> Result<ProcedureRecord> {
    serde_json::from_slice(value).map_err(|e| Error::CorruptRecord {
        id: ProcedureId::new(key.strip_prefix(RECORD_PREFIX).unwrap_or(key)),
        type_name: "unknown".to_string(),
        key: key.to_string(),
        reason: format!("the record envelope does not parse: {e}"),
    })
}

/// What a stored record turned into.
pub(super) enum Recovered {
    Finished(ProcedureRecord),
    Unfinished(ProcedureRecord, BoxedProcedure),
    Unrecoverable {
        id: ProcedureId,
        type_name: String,
        parent_id: Option<ProcedureId>,
        error: Error,
    },
}

/// The root of the tree of `record`, a record being adopted (not in `procedures` yet): its parent's root, or the
/// parent's id when the parent is unknown, or its own id for a root. (`root_of` on its id would stop at once, since
/// the id is not known yet, and make it a tree of its own: locked out of its parent's keys, deleted apart from it.)
pub(super) fn adopted_root(
    procedures: &HashMap<ProcedureId, Entry>,
    record: &ProcedureRecord,
) -> ProcedureId {
    match &record.parent_id {
        Some(parent) => procedures
            .get(parent)
            .map(|p| p.root.clone())
            .unwrap_or_else(|| parent.clone()),
        None => record.id.clone(),
    }
}

/// The root of `id`'s tree among `procedures` (a procedure whose parent is unknown is its own root).
pub(super) fn root_of(procedures: &HashMap<ProcedureId, Entry>, id: &ProcedureId) -> ProcedureId {
    let mut current = id.clone();
    // Bounded walk: a cycle of parent links in damaged records must not hang the manager.
    for _ in 0..=procedures.len() {
        match procedures
            .get(&current)
            .and_then(|e| e.info.parent_id.clone())
        {
            Some(parent) if procedures.contains_key(&parent) => current = parent,
            Some(parent) => {
                // The parent may be known by its root already.
                return procedures
                    .get(&parent)
                    .map(|p| p.root.clone())
                    .unwrap_or(parent);
            }
            None => return current,
        }
    }
    current
}
