//! [`store_digest`]: a normalised view of a [`StateStore`], equal for two stores holding the same procedures in the
//! same end states, however many managers and crashes it took to get there.

use std::collections::BTreeMap;

use crate::error::Result;
use crate::procedure::{Output, ProcedureId};
use crate::record::{EPOCH_KEY, ProcedureRecord, ProcedureState, RECORD_PREFIX};
use crate::store::StateStore;

/// One procedure record without what legitimately differs between runs (its timestamps).
#[derive(Clone, Debug, PartialEq)]
pub struct RecordDigest {
    /// The envelope's format version.
    pub format_version: u32,
    /// The id the record names (its key names it too; a record under another procedure's key differs here).
    pub id: ProcedureId,
    /// The procedure's type name.
    pub type_name: String,
    /// Its parent, for a subprocedure.
    pub parent_id: Option<ProcedureId>,
    /// Persisted transitions.
    pub step: u64,
    /// Its state.
    pub state: ProcedureState,
    /// Its own data, as last persisted.
    pub data: serde_json::Value,
    /// Its output.
    pub output: Option<Output>,
    /// Its error text.
    pub error: Option<String>,
    /// The children it waits for (a persisted suspension not followed by another write yet).
    pub waiting_for: Vec<ProcedureId>,
}

/// A value of the store as the digest sees it.
#[derive(Clone, Debug, PartialEq)]
pub enum DigestEntry {
    /// A procedure record that decodes.
    Record(RecordDigest),
    /// A key under the record prefix whose value does not decode as a record (shown lossily as text).
    Undecodable(String),
    /// Any other key (shown lossily as text).
    Other(String),
}

/// The normalised contents of a store: every key but the manager epoch, records decoded without timestamps.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoreDigest {
    /// Key → what it holds, in key order.
    pub entries: BTreeMap<String, DigestEntry>,
}

impl StoreDigest {
    /// The record digest under `id`, if there is one that decodes.
    pub fn record(&self, id: &ProcedureId) -> Option<&RecordDigest> {
        match self.entries.get(&crate::record::record_key(id)) {
            Some(DigestEntry::Record(r)) => Some(r),
            _ => None,
        }
    }
}

/// Reads everything in `store` and normalises it: the epoch key is dropped (every recovery claims a new epoch),
/// procedure records lose their timestamps, other keys are kept as (lossy) text. Two runs of the same procedures
/// that ended the same way give equal digests.
pub async fn store_digest(store: &dyn StateStore) -> Result<StoreDigest> {
    let mut entries = BTreeMap::new();
    for (key, value) in store.scan("").await? {
        if key == EPOCH_KEY {
            continue;
        }
        let entry = if key.starts_with(RECORD_PREFIX) {
            match serde_json::from_slice::<ProcedureRecord>(&value) {
                Ok(r) => DigestEntry::Record(RecordDigest {
                    format_version: r.format_version,
                    id: r.id,
                    type_name: r.type_name,
                    parent_id: r.parent_id,
                    step: r.step,
                    state: r.state,
                    data: r.data,
                    output: r.output,
                    error: r.error,
                    waiting_for: r.waiting_for,
                }),
                Err(_) => DigestEntry::Undecodable(String::from_utf8_lossy(&value).into_owned()),
            }
        } else {
            DigestEntry::Other(String::from_utf8_lossy(&value).into_owned())
        };
        entries.insert(key, entry);
    }
    Ok(StoreDigest { entries })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory_store::MemoryStateStore;
    use crate::record::{RECORD_FORMAT_VERSION, record_key};

    fn record(id: &str, updated_at_ms: u64) -> Vec<u8> {
        serde_json::to_vec(&ProcedureRecord {
            format_version: RECORD_FORMAT_VERSION,
            type_name: "t".into(),
            id: ProcedureId::new(id),
            parent_id: None,
            step: 2,
            state: ProcedureState::Done,
            data: serde_json::json!({"n": 1}),
            output: Some(serde_json::json!("out")),
            error: None,
            waiting_for: Vec::new(),
            created_at_ms: updated_at_ms - 5,
            step_name: None,
            lock_keys: Vec::new(),
            events: Vec::new(),
            updated_at_ms,
        })
        .unwrap()
    }

    #[tokio::test]
    async fn ignores_epoch_and_timestamps_but_not_content() {
        let a = MemoryStateStore::new();
        let b = MemoryStateStore::new();
        a.put(EPOCH_KEY, b"1".to_vec()).await.unwrap();
        b.put(EPOCH_KEY, b"7".to_vec()).await.unwrap();
        a.put(&record_key(&ProcedureId::new("p")), record("p", 100))
            .await
            .unwrap();
        b.put(&record_key(&ProcedureId::new("p")), record("p", 900))
            .await
            .unwrap();
        let da = store_digest(&a).await.unwrap();
        assert_eq!(da, store_digest(&b).await.unwrap());
        assert_eq!(da.entries.len(), 1);
        assert_eq!(
            da.record(&ProcedureId::new("p")).map(|r| r.state),
            Some(ProcedureState::Done)
        );

        b.put("other", b"x".to_vec()).await.unwrap();
        assert_ne!(da, store_digest(&b).await.unwrap());
        b.delete(&["other".to_string()]).await.unwrap();
        b.put(&record_key(&ProcedureId::new("p")), b"garbage".to_vec())
            .await
            .unwrap();
        let db = store_digest(&b).await.unwrap();
        assert_ne!(da, db);
        assert!(matches!(
            db.entries.get("proc/p"),
            Some(DigestEntry::Undecodable(_))
        ));
    }

    #[tokio::test]
    async fn sees_a_record_that_differs_only_in_what_it_waits_for() {
        let key = record_key(&ProcedureId::new("p"));
        let plain = MemoryStateStore::new();
        plain.put(&key, record("p", 100)).await.unwrap();
        // The same record, but still naming a child it waits for (format 2): a parent that would wait on recovery.
        let mut waiting: ProcedureRecord = serde_json::from_slice(&record("p", 100)).unwrap();
        waiting.waiting_for = vec![ProcedureId::new("p/c")];
        waiting.format_version = waiting.required_format_version();
        let other = MemoryStateStore::new();
        other
            .put(&key, serde_json::to_vec(&waiting).unwrap())
            .await
            .unwrap();
        assert_ne!(
            store_digest(&plain).await.unwrap(),
            store_digest(&other).await.unwrap()
        );
    }
}
