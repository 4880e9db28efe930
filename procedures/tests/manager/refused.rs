//! A procedure that refuses its request in its first step ([`Error::refused`]) leaves no record: its watchers get
//! [`Error::ProcedureRefused`] with the kind, the manager forgets it, and the id is free again. A refusal after a
//! persisted step is an ordinary failure, recorded.

use std::sync::Arc;

use async_trait::async_trait;

use crate::support::manager::{fast_config, within};
use procedures::record::record_key;
use procedures::{
    Context, Error, LocalManager, MemoryStateStore, Procedure, ProcedureId, ProcedureManager,
    ProcedureState, ProcedureWithId, Refusal, StateStore, Status,
};

/// Refuses at step `refuse_at` (0: its first step); persists every step before it.
struct Refuser {
    step: u32,
    refuse_at: u32,
}

#[async_trait]
impl Procedure for Refuser {
    fn type_name(&self) -> &str {
        "refuser"
    }
    async fn execute(&mut self, _ctx: &Context) -> procedures::Result<Status> {
        if self.step == self.refuse_at {
            return Err(Error::refused(
                Refusal::AlreadyExists,
                "thing 'x' already exists",
            ));
        }
        self.step += 1;
        Ok(Status::executing(true))
    }
    fn dump(&self) -> procedures::Result<serde_json::Value> {
        Ok(serde_json::json!({ "step": self.step }))
    }
    fn lock_key(&self) -> procedures::LockKey {
        procedures::LockKey::none()
    }
}

fn refuser(id: &str, refuse_at: u32) -> ProcedureWithId {
    ProcedureWithId::new(
        ProcedureId::new(id),
        Box::new(Refuser { step: 0, refuse_at }),
    )
}

#[tokio::test]
async fn a_refusal_in_the_first_step_leaves_no_record_and_frees_the_id() {
    let store = Arc::new(MemoryStateStore::new());
    let manager = LocalManager::new(store.clone(), fast_config());
    manager.start().await.unwrap();

    let mut watcher = manager.submit(refuser("r", 0)).await.unwrap();
    let error = within(watcher.wait()).await.unwrap_err();
    assert!(
        matches!(
            &error,
            Error::ProcedureRefused { id, refusal: Refusal::AlreadyExists, message }
                if id.as_str() == "r" && message == "thing 'x' already exists"
        ),
        "{error:?}"
    );
    assert_eq!(error.refusal(), Some(Refusal::AlreadyExists));
    assert_eq!(
        error.to_string(),
        "procedure r failed: thing 'x' already exists"
    );
    // Nothing of it is left: no record, nothing listed, nothing counted as failed.
    let id = ProcedureId::new("r");
    assert_eq!(store.get(&record_key(&id)).await.unwrap(), None);
    assert_eq!(manager.procedure_state(&id).await.unwrap(), None);
    assert!(manager.list_procedures().await.unwrap().is_empty());
    assert_eq!(manager.failed_count(), 0);
    // The id is free: a new submission under it runs (and refuses again, as new).
    let mut again = manager.submit(refuser("r", 0)).await.unwrap();
    assert!(again.is_new_submission());
    assert_eq!(
        within(again.wait()).await.unwrap_err().refusal(),
        Some(Refusal::AlreadyExists)
    );
    manager.stop().await.unwrap();
}

#[tokio::test]
async fn a_refusal_after_a_persisted_step_is_a_recorded_failure() {
    let store = Arc::new(MemoryStateStore::new());
    let manager = LocalManager::new(store.clone(), fast_config());
    manager.start().await.unwrap();

    let mut watcher = manager.submit(refuser("late", 1)).await.unwrap();
    let error = within(watcher.wait()).await.unwrap_err();
    assert!(
        matches!(&error, Error::ProcedureFailed { message, .. } if message == "thing 'x' already exists"),
        "{error:?}"
    );
    let info = manager
        .procedure_state(&ProcedureId::new("late"))
        .await
        .unwrap()
        .expect("the failed procedure is kept");
    assert_eq!(info.state, ProcedureState::Failed);
    assert!(
        store
            .get(&record_key(&ProcedureId::new("late")))
            .await
            .unwrap()
            .is_some()
    );
    manager.stop().await.unwrap();
}
