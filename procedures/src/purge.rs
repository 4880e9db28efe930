//! Purging a procedure's record from the store without a manager: what `procedures purge` does to a finished,
//! failed or damaged record that would otherwise stay until retention removes it (a damaged one, never).
//!
//! The records deleted are the one under the id's key and any whose envelope names the id (a damaged record may
//! sit under another key). The delete is one conditional write: each record as read, and the epoch key as read, so
//! a purge racing a manager that rewrote one of them (or claimed the store) deletes nothing and says which keys
//! moved. The caller decides first whether the procedure may be purged (not running in its own process).

use crate::error::Result;
use crate::record::{EPOCH_KEY, RECORD_PREFIX};
use crate::store::{Condition, StateStore, WriteOp, WriteOutcome};

/// What [`purge_records`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PurgeOutcome {
    /// The records were deleted.
    Purged,
    /// No record under the id's key or naming the id.
    NotFound,
    /// A record or the epoch changed between the read and the delete; nothing was deleted.
    Changed {
        /// The keys whose value was not the one read.
        keys: Vec<String>,
    },
}

/// Deletes the record of procedure `id` (and any record whose envelope names `id`) from `store`, conditioned on
/// each of them and the epoch key being as read.
pub async fn purge_records(store: &dyn StateStore, id: &str) -> Result<PurgeOutcome> {
    let records = store.scan(RECORD_PREFIX).await?;
    let doomed: Vec<(String, Vec<u8>)> = records
        .into_iter()
        .filter(|(key, value)| key.strip_prefix(RECORD_PREFIX) == Some(id) || names_id(value, id))
        .collect();
    if doomed.is_empty() {
        return Ok(PurgeOutcome::NotFound);
    }
    let mut expected: Vec<(String, Option<Vec<u8>>)> = doomed
        .iter()
        .map(|(key, value)| (key.clone(), Some(value.clone())))
        .collect();
    expected.push((EPOCH_KEY.to_string(), store.get(EPOCH_KEY).await?));
    let conditions = expected
        .iter()
        .map(|(key, value)| match value {
            Some(value) => Condition::Equals {
                key: key.clone(),
                value: value.clone(),
            },
            None => Condition::Absent { key: key.clone() },
        })
        .collect();
    let ops = doomed
        .into_iter()
        .map(|(key, _)| WriteOp::Delete { key })
        .collect();
    Ok(match store.write(conditions, ops).await? {
        WriteOutcome::Applied => PurgeOutcome::Purged,
        WriteOutcome::Rejected { current } => PurgeOutcome::Changed {
            keys: current
                .into_iter()
                .filter(|entry| !expected.contains(entry))
                .map(|(key, _)| key)
                .collect(),
        },
    })
}

/// Whether the record bytes `value` are a JSON object whose `id` is `id`.
fn names_id(value: &[u8], id: &str) -> bool {
    serde_json::from_slice::<serde_json::Value>(value)
        .ok()
        .and_then(|v| v.get("id").and_then(|i| i.as_str()).map(|i| i == id))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStateStore;

    async fn put(store: &MemoryStateStore, key: &str, value: &[u8]) {
        let outcome = store
            .write(
                Vec::new(),
                vec![WriteOp::Put {
                    key: key.to_string(),
                    value: value.to_vec(),
                }],
            )
            .await
            .unwrap();
        assert_eq!(outcome, WriteOutcome::Applied);
    }

    #[tokio::test]
    async fn the_record_under_the_id_and_a_damaged_one_naming_it_go_and_others_stay() {
        let store = MemoryStateStore::new();
        put(&store, &format!("{RECORD_PREFIX}a"), br#"{"id":"a"}"#).await;
        put(
            &store,
            &format!("{RECORD_PREFIX}elsewhere"),
            br#"{"id":"a","x":1"#,
        )
        .await;
        put(&store, &format!("{RECORD_PREFIX}moved"), br#"{"id":"a"}"#).await;
        put(&store, &format!("{RECORD_PREFIX}b"), br#"{"id":"b"}"#).await;
        assert_eq!(
            purge_records(&store, "a").await.unwrap(),
            PurgeOutcome::Purged
        );
        let left: Vec<String> = store
            .scan(RECORD_PREFIX)
            .await
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        // The unparsable record under another key does not name the id as JSON: it stays.
        assert_eq!(
            left,
            vec![
                format!("{RECORD_PREFIX}b"),
                format!("{RECORD_PREFIX}elsewhere")
            ]
        );
        assert_eq!(
            purge_records(&store, "a").await.unwrap(),
            PurgeOutcome::NotFound
        );
    }
}
