//! A read-only view of the procedures persisted in a state store, for callers that only report on them
//! (`walctl procedures list/show`): it claims no epoch, resumes nothing and writes nothing.

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::procedure::ProcedureId;
use crate::record::{
    ProcedureInfo, ProcedureRecord, ProcedureState, RECORD_FORMAT_VERSION, RECORD_PREFIX,
};
use crate::store::StateStore;

/// Every procedure record in `store` as a manager would report it, sorted by id, reading the store once.
///
/// Unfinished procedures are shown in the state their record holds (no manager runs them here). A record a manager
/// could not recover — an envelope that does not parse, a key naming another id, a newer format — is reported as
/// failed with the reason, like [`crate::ProcedureManager::list_procedures`] does after a start; timestamps of such a
/// record are those it names, or 0 when it names none. Whether a loader exists for an unfinished record's type is
/// not checked (that is decided by the manager that resumes it).
pub async fn read_procedures(store: &dyn StateStore) -> Result<Vec<ProcedureInfo>> {
    let records = store.scan(RECORD_PREFIX).await?;
    let mut out: BTreeMap<ProcedureId, ProcedureInfo> = BTreeMap::new();
    for (key, value) in records {
        let info = info_of(&key, &value);
        // Two damaged records may name the same id; keep the first, as the manager does.
        out.entry(info.id.clone()).or_insert(info);
    }
    Ok(out.into_values().collect())
}

/// One procedure's record from `store`, read-only; `None` when no record has that id.
pub async fn read_procedure(
    store: &dyn StateStore,
    id: &ProcedureId,
) -> Result<Option<ProcedureInfo>> {
    Ok(read_procedures(store)
        .await?
        .into_iter()
        .find(|info| &info.id == id))
}

fn info_of(key: &str, value: &[u8]) -> ProcedureInfo {
    let key_id = ProcedureId::new(key.strip_prefix(RECORD_PREFIX).unwrap_or(key));
    let loose: Option<serde_json::Value> = serde_json::from_slice(value).ok();
    let field = |name: &str| {
        loose
            .as_ref()
            .and_then(|v| v.get(name))
            .and_then(|v| v.as_str())
            .map(str::to_string)
    };
    let number = |name: &str| {
        loose
            .as_ref()
            .and_then(|v| v.get(name))
            .and_then(|v| v.as_u64())
            .unwrap_or(0)
    };
    let failed = |id: ProcedureId, type_name: String, reason: String| {
        let error = Error::CorruptRecord {
            id: id.clone(),
            type_name: type_name.clone(),
            key: key.to_string(),
            reason,
        };
        tracing::warn!(%error, "procedure record cannot be recovered");
        ProcedureInfo {
            id,
            type_name,
            parent_id: field("parent_id").map(ProcedureId::new),
            state: ProcedureState::Failed,
            step: 0,
            output: None,
            error: Some(error.to_string()),
            created_at_ms: number("created_at_ms"),
            updated_at_ms: number("updated_at_ms"),
            step_name: None,
            attempt: 0,
            last_error: Some(error.to_string()),
            next_retry_at_ms: None,
            step_started_at_ms: None,
            lock_keys: Vec::new(),
            locks_held: Vec::new(),
            lock_wait: None,
            events: Vec::new(),
            refusal: None,
        }
    };
    let record: ProcedureRecord = match serde_json::from_slice(value) {
        Ok(record) => record,
        Err(e) => {
            let id = field("id").map(ProcedureId::new).unwrap_or(key_id);
            let type_name = field("type_name").unwrap_or_else(|| "unknown".to_string());
            return failed(
                id,
                type_name,
                format!("the record envelope does not parse: {e}"),
            );
        }
    };
    if record.id != key_id {
        return failed(
            key_id,
            record.type_name.clone(),
            format!(
                "the record names procedure {}, not the one of its key",
                record.id
            ),
        );
    }
    if record.format_version > RECORD_FORMAT_VERSION {
        return failed(
            record.id.clone(),
            record.type_name.clone(),
            format!(
                "record format version {} is newer than the {} this manager reads",
                record.format_version, RECORD_FORMAT_VERSION
            ),
        );
    }
    ProcedureInfo::from(&record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory_store::MemoryStateStore;
    use crate::record::EPOCH_KEY;

    #[tokio::test]
    async fn reads_records_and_damaged_ones_without_writing() {
        let store = MemoryStateStore::new();
        store.put(EPOCH_KEY, b"7".to_vec()).await.unwrap();
        store
            .put(&format!("{RECORD_PREFIX}broken"), b"{not json".to_vec())
            .await
            .unwrap();
        let before = store.snapshot();

        let list = read_procedures(&store).await.unwrap();
        assert_eq!(list.len(), 1, "{list:?}");
        assert_eq!(list[0].id, ProcedureId::new("broken"));
        assert_eq!(list[0].state, ProcedureState::Failed);
        assert!(
            list[0]
                .error
                .as_deref()
                .is_some_and(|e| e.contains("does not parse")),
            "{list:?}"
        );
        assert_eq!(
            read_procedure(&store, &ProcedureId::new("broken"))
                .await
                .unwrap()
                .map(|i| i.id),
            Some(ProcedureId::new("broken"))
        );
        assert_eq!(
            read_procedure(&store, &ProcedureId::new("other"))
                .await
                .unwrap(),
            None
        );
        assert_eq!(store.snapshot(), before, "reading wrote to the store");
    }
}
