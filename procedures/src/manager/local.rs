//! The local manager's internals. (Placeholder: being implemented.)

use std::sync::Arc;

use async_trait::async_trait;

use crate::config::ManagerConfig;
use crate::error::Result;
use crate::manager::{LocalManager, ProcedureManager};
use crate::procedure::{BoxedProcedureLoader, ProcedureId, ProcedureWithId, SideEffectHook};
use crate::record::ProcedureInfo;
use crate::store::StateStore;
use crate::watcher::Watcher;

pub(crate) struct Inner {
    _store: Arc<dyn StateStore>,
    _config: ManagerConfig,
    _hook: Option<Arc<dyn SideEffectHook>>,
}

impl Inner {
    pub(crate) fn new(
        store: Arc<dyn StateStore>,
        config: ManagerConfig,
        hook: Option<Arc<dyn SideEffectHook>>,
    ) -> Arc<Self> {
        Arc::new(Inner {
            _store: store,
            _config: config,
            _hook: hook,
        })
    }
}

#[async_trait]
impl ProcedureManager for LocalManager {
    fn register_loader(&self, _type_name: &str, _loader: BoxedProcedureLoader) -> Result<()> {
        todo!()
    }
    async fn start(&self) -> Result<()> {
        todo!()
    }
    async fn stop(&self) -> Result<()> {
        todo!()
    }
    async fn submit(&self, _procedure: ProcedureWithId) -> Result<Watcher> {
        todo!()
    }
    fn watch(&self, _id: &ProcedureId) -> Option<Watcher> {
        todo!()
    }
    async fn procedure_state(&self, _id: &ProcedureId) -> Result<Option<ProcedureInfo>> {
        todo!()
    }
    async fn list_procedures(&self) -> Result<Vec<ProcedureInfo>> {
        todo!()
    }
    fn epoch(&self) -> Option<u64> {
        todo!()
    }
}
