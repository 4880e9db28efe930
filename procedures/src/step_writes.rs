//! [`StepWrites`]: writes a step hands the engine to commit in the same atomic write as the procedure's next state.
//!
//! A step that changes data of its own (e.g. a table's metadata) usually writes it itself and then returns, and the
//! engine persists the procedure's next state in a second commit. When that data lives in the very store the
//! procedure state lives in, both can be one commit: the step returns its writes in its [`crate::Status`] instead
//! of making them, and the engine applies them together with the next state (and its epoch condition). A state
//! store joins the writes of a [`StepStore`] it lives in ([`crate::StateStore::joins`]); for any other pair the
//! engine applies the step's writes alone on their store first and persists the state afterwards, which is what
//! the step would have done itself.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::store::{Condition, WriteOp, WriteOutcome};

/// The store a step's writes go to, as the step knows it: keys are the store's own (not the state store's).
#[async_trait]
pub trait StepStore: Send + Sync + fmt::Debug {
    /// This store as [`Any`], so a state store can recognise the store it lives in.
    fn as_any(&self) -> &dyn Any;

    /// Applies `ops` atomically if every one of `conditions` holds, else nothing: one commit of its own, used when
    /// the state store cannot join the writes.
    async fn write(&self, conditions: Vec<Condition>, ops: Vec<WriteOp>) -> Result<WriteOutcome>;
}

/// A shared [`StepStore`].
pub type StepStoreRef = Arc<dyn StepStore>;

/// The writes of one step: `ops` on `store`, applied only if every one of `conditions` holds (see the module
/// documentation). Empty by default.
#[derive(Clone, Debug, Default)]
pub struct StepWrites {
    store: Option<StepStoreRef>,
    conditions: Vec<Condition>,
    ops: Vec<WriteOp>,
}

impl StepWrites {
    /// No writes.
    pub fn none() -> Self {
        Self::default()
    }

    /// `ops` on `store`, if every one of `conditions` holds.
    pub fn new(store: StepStoreRef, conditions: Vec<Condition>, ops: Vec<WriteOp>) -> Self {
        StepWrites {
            store: Some(store),
            conditions,
            ops,
        }
    }

    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.store.is_none() || (self.conditions.is_empty() && self.ops.is_empty())
    }

    /// The store the writes go to.
    pub fn store(&self) -> Option<&StepStoreRef> {
        self.store.as_ref()
    }

    /// The conditions.
    pub fn conditions(&self) -> &[Condition] {
        &self.conditions
    }

    /// The ops.
    pub fn ops(&self) -> &[WriteOp] {
        &self.ops
    }

    /// Applies the writes alone, in one commit on their store: what the engine does when the state store cannot
    /// join them, and what a test driving single steps does. A condition that fails is
    /// [`Error::StepConditionFailed`] naming its key; nothing is written then.
    pub async fn apply_alone(&self) -> Result<()> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        if self.is_empty() {
            return Ok(());
        }
        match store
            .write(self.conditions.clone(), self.ops.clone())
            .await?
        {
            WriteOutcome::Applied => Ok(()),
            WriteOutcome::Rejected { current } => Err(self.rejected(&current)),
        }
    }

    /// The error of a write whose step conditions were refused; `current` holds the condition keys' values (other
    /// keys are ignored).
    pub fn rejected(&self, current: &[(String, Option<Vec<u8>>)]) -> Error {
        let failed = self.conditions.iter().find(|c| {
            let now = current
                .iter()
                .rev()
                .find(|(key, _)| key == c.key())
                .map(|(_, v)| v.as_deref());
            match (c, now) {
                (Condition::Equals { value, .. }, Some(now)) => now != Some(value.as_slice()),
                (Condition::Absent { .. }, Some(now)) => now.is_some(),
                (_, None) => false,
            }
        });
        let (key, expected) = match failed {
            Some(Condition::Equals { key, .. }) => (key.clone(), "to hold the expected value"),
            Some(Condition::Absent { key }) => (key.clone(), "to be absent"),
            None => (
                self.conditions
                    .first()
                    .map(|c| c.key().to_string())
                    .unwrap_or_default(),
                "to hold (the store did not say which one failed)",
            ),
        };
        Error::StepConditionFailed {
            key,
            expected: expected.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory_store::MemoryStateStore;
    use crate::store::StateStore;

    #[async_trait]
    impl StepStore for MemoryStateStore {
        fn as_any(&self) -> &dyn Any {
            self
        }

        async fn write(
            &self,
            conditions: Vec<Condition>,
            ops: Vec<WriteOp>,
        ) -> Result<WriteOutcome> {
            StateStore::write(self, conditions, ops).await
        }
    }

    #[tokio::test]
    async fn applied_alone_a_failed_condition_names_its_key_and_writes_nothing() {
        let store = Arc::new(MemoryStateStore::new());
        StateStore::put(store.as_ref(), "taken", b"1".to_vec())
            .await
            .unwrap();
        let writes = StepWrites::new(
            store.clone(),
            vec![
                Condition::Absent { key: "free".into() },
                Condition::Absent {
                    key: "taken".into(),
                },
            ],
            vec![WriteOp::Put {
                key: "free".into(),
                value: b"v".to_vec(),
            }],
        );
        let err = writes.apply_alone().await.unwrap_err();
        assert!(!err.is_retryable() && !err.is_fatal(), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("'taken'") && text.contains("absent"),
            "{text}"
        );
        assert_eq!(store.get("free").await.unwrap(), None);

        StateStore::delete(store.as_ref(), &["taken".to_string()])
            .await
            .unwrap();
        writes.apply_alone().await.unwrap();
        assert_eq!(store.get("free").await.unwrap(), Some(b"v".to_vec()));
        assert!(StepWrites::none().is_empty());
        StepWrites::none().apply_alone().await.unwrap();
    }
}
