//! [`MemoryStateStore`]: a [`StateStore`] in an ordered map, for tests and benchmarks.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;

use crate::error::Result;
use crate::store::{Condition, StateStore, WriteOp, WriteOutcome};

/// A [`StateStore`] in memory. Nothing survives the process; everything survives a simulated crash of a manager
/// that shares it.
#[derive(Debug, Default)]
pub struct MemoryStateStore {
    map: Mutex<BTreeMap<String, Vec<u8>>>,
}

impl MemoryStateStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of everything in the store.
    pub fn snapshot(&self) -> BTreeMap<String, Vec<u8>> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Vec<u8>>> {
        // A panic while holding the lock cannot leave the map half-changed (every change is one map call), so a
        // poisoned lock is still usable.
        self.map
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[async_trait]
impl StateStore for MemoryStateStore {
    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.lock().get(key).cloned())
    }

    async fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let map = self.lock();
        Ok(map
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    async fn scan_page(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Vec<u8>)>> {
        use std::ops::Bound;
        let map = self.lock();
        let start = match after {
            Some(after) if after >= prefix => Bound::Excluded(after.to_string()),
            _ => Bound::Included(prefix.to_string()),
        };
        Ok(map
            .range((start, Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .take(limit.max(1))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    async fn put(&self, key: &str, value: Vec<u8>) -> Result<()> {
        self.lock().insert(key.to_string(), value);
        Ok(())
    }

    async fn delete(&self, keys: &[String]) -> Result<()> {
        let mut map = self.lock();
        for key in keys {
            map.remove(key);
        }
        Ok(())
    }

    async fn write(&self, conditions: Vec<Condition>, ops: Vec<WriteOp>) -> Result<WriteOutcome> {
        let mut map = self.lock();
        let holds = conditions.iter().all(|c| match c {
            Condition::Equals { key, value } => map.get(key) == Some(value),
            Condition::Absent { key } => !map.contains_key(key),
        });
        if !holds {
            let current = conditions
                .iter()
                .map(|c| (c.key().to_string(), map.get(c.key()).cloned()))
                .collect();
            return Ok(WriteOutcome::Rejected { current });
        }
        for op in ops {
            match op {
                WriteOp::Put { key, value } => {
                    map.insert(key, value);
                }
                WriteOp::Delete { key } => {
                    map.remove(&key);
                }
            }
        }
        Ok(WriteOutcome::Applied)
    }
}
