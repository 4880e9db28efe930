//! [`KvStepStore`]: a [`KvBackend`](crate::kv::KvBackend) as the store of a procedure step's own writes.
//!
//! A step that writes metadata hands its writes to the engine as [`procedures::StepWrites`] on a `KvStepStore`.
//! A [`KvStateStore`] on the same backend (the same `Arc`) joins them: the writes, the
//! procedure's next record and the manager's epoch condition go into one kv transaction. With any other state
//! store the engine applies them alone, in one transaction of their own, before it writes the record.

use std::any::Any;

use async_trait::async_trait;
use procedures::StepStore;
use procedures::store::{Condition, StateStore, WriteOp, WriteOutcome};

use crate::kv::{KvBackendRef, KvStateStore};

/// The store of a step's own writes on a kv backend: keys are the backend's raw keys.
#[derive(Clone, Debug)]
pub struct KvStepStore {
    kv: KvBackendRef,
    /// The same backend with no prefix: how the writes are applied alone.
    raw: KvStateStore,
}

impl KvStepStore {
    /// The step store of `kv`.
    pub fn new(kv: KvBackendRef) -> Self {
        KvStepStore {
            raw: KvStateStore::with_prefix(kv.clone(), ""),
            kv,
        }
    }

    /// The backend.
    pub fn backend(&self) -> &KvBackendRef {
        &self.kv
    }
}

#[async_trait]
impl StepStore for KvStepStore {
    fn as_any(&self) -> &dyn Any {
        self
    }

    async fn write(
        &self,
        conditions: Vec<Condition>,
        ops: Vec<WriteOp>,
    ) -> procedures::Result<WriteOutcome> {
        self.raw.write(conditions, ops).await
    }
}
