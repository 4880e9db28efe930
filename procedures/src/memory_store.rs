//! [`MemoryStateStore`]: a [`StateStore`] in an ordered map, for tests and benchmarks.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::error::Result;
use crate::store::{Condition, StateStore, WriteOp, WriteOutcome};

/// A [`StateStore`] in memory. Nothing survives the process; everything survives a simulated crash of a manager
/// that shares it.
#[derive(Debug, Default)]
pub struct MemoryStateStore {
    contents: Mutex<Contents>,
}

/// The map, and the prefixes whose changes are counted ([`StateStore::counts_changes`]), under one lock: a change
/// is counted before the lock is released, so a reader that notes a count and then reads sees every change counted.
#[derive(Debug, Default)]
struct Contents {
    map: BTreeMap<String, Vec<u8>>,
    counted: Vec<(String, Arc<AtomicU64>)>,
}

impl Contents {
    /// Counts a change of `key` for every counted prefix it starts with.
    fn changed(&self, key: &str) {
        for (prefix, count) in &self.counted {
            if key.starts_with(prefix.as_str()) {
                count.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

impl MemoryStateStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of everything in the store.
    pub fn snapshot(&self) -> BTreeMap<String, Vec<u8>> {
        self.lock().map.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Contents> {
        // A panic while holding the lock cannot leave the map half-changed (every change is one map call), so a
        // poisoned lock is still usable.
        self.contents
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[async_trait]
impl StateStore for MemoryStateStore {
    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.lock().map.get(key).cloned())
    }

    async fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let contents = self.lock();
        Ok(contents
            .map
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
        let contents = self.lock();
        let start = match after {
            Some(after) if after >= prefix => Bound::Excluded(after.to_string()),
            _ => Bound::Included(prefix.to_string()),
        };
        Ok(contents
            .map
            .range((start, Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .take(limit.max(1))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    async fn put(&self, key: &str, value: Vec<u8>) -> Result<()> {
        let mut contents = self.lock();
        contents.map.insert(key.to_string(), value);
        contents.changed(key);
        Ok(())
    }

    async fn delete(&self, keys: &[String]) -> Result<()> {
        let mut contents = self.lock();
        for key in keys {
            contents.map.remove(key);
            contents.changed(key);
        }
        Ok(())
    }

    async fn write(&self, conditions: Vec<Condition>, ops: Vec<WriteOp>) -> Result<WriteOutcome> {
        let mut contents = self.lock();
        let map = &mut contents.map;
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
                    contents.changed(&key);
                    contents.map.insert(key, value);
                }
                WriteOp::Delete { key } => {
                    contents.map.remove(&key);
                    contents.changed(&key);
                }
            }
        }
        Ok(WriteOutcome::Applied)
    }

    fn counts_changes(&self, prefix: &str) -> Option<Arc<AtomicU64>> {
        let mut contents = self.lock();
        if let Some((_, count)) = contents.counted.iter().find(|(p, _)| p == prefix) {
            return Some(Arc::clone(count));
        }
        let count = Arc::new(AtomicU64::new(0));
        contents
            .counted
            .push((prefix.to_string(), Arc::clone(&count)));
        Some(count)
    }
}
