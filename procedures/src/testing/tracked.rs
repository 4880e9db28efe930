//! The harness's transparent procedure wrapper: it refuses to start a step once the simulated process is dead, and
//! counts the steps in flight so the harness can wait for a dead manager's last step to end before recovering.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;
use crate::manager::ProcedureManager;
use crate::procedure::{
    BoxedProcedure, BoxedProcedureLoader, Context, LockKey, Procedure, ProcedureId,
    ProcedureWithId, Status,
};
use crate::record::ProcedureInfo;
use crate::testing::crash::CrashController;
use crate::watcher::Watcher;

/// Wraps `procedure` (and, later, every child it suspends on).
pub(crate) fn track(
    procedure: ProcedureWithId,
    controller: &Arc<CrashController>,
) -> ProcedureWithId {
    ProcedureWithId {
        id: procedure.id,
        procedure: Box::new(Tracked {
            inner: procedure.procedure,
            controller: Arc::clone(controller),
        }),
    }
}

struct Tracked {
    inner: BoxedProcedure,
    controller: Arc<CrashController>,
}

#[async_trait]
impl Procedure for Tracked {
    fn type_name(&self) -> &str {
        self.inner.type_name()
    }

    async fn execute(&mut self, ctx: &Context) -> Result<Status> {
        let _guard = self.controller.enter_step(ctx.procedure_id())?;
        let status = self.inner.execute(ctx).await?;
        Ok(match status {
            Status::Suspended {
                subprocedures,
                persist,
            } => Status::Suspended {
                subprocedures: subprocedures
                    .into_iter()
                    .map(|child| track(child, &self.controller))
                    .collect(),
                persist,
            },
            other => other,
        })
    }

    fn dump(&self) -> Result<serde_json::Value> {
        self.inner.dump()
    }

    fn lock_key(&self) -> LockKey {
        self.inner.lock_key()
    }

    fn rollback_supported(&self) -> bool {
        self.inner.rollback_supported()
    }

    async fn rollback(&mut self, ctx: &Context) -> Result<()> {
        let _guard = self.controller.enter_step(ctx.procedure_id())?;
        self.inner.rollback(ctx).await
    }

    fn timeout(&self) -> Option<Duration> {
        self.inner.timeout()
    }
}

/// What a scenario registers its loaders on: a manager whose loaders (and submissions) produce tracked procedures.
pub(crate) struct TrackingManager {
    pub(crate) inner: Arc<dyn ProcedureManager>,
    pub(crate) controller: Arc<CrashController>,
}

#[async_trait]
impl ProcedureManager for TrackingManager {
    fn register_loader(&self, type_name: &str, loader: BoxedProcedureLoader) -> Result<()> {
        let controller = Arc::clone(&self.controller);
        let wrapped: BoxedProcedureLoader = Box::new(move |data| {
            let procedure = loader(data)?;
            Ok(Box::new(Tracked {
                inner: procedure,
                controller: Arc::clone(&controller),
            }) as BoxedProcedure)
        });
        self.inner.register_loader(type_name, wrapped)
    }

    async fn start(&self) -> Result<()> {
        self.inner.start().await
    }

    async fn stop(&self) -> Result<()> {
        self.inner.stop().await
    }

    async fn submit(&self, procedure: ProcedureWithId) -> Result<Watcher> {
        self.inner.submit(track(procedure, &self.controller)).await
    }

    async fn watch(&self, id: &ProcedureId) -> Result<Option<Watcher>> {
        self.inner.watch(id).await
    }

    async fn procedure_state(&self, id: &ProcedureId) -> Result<Option<ProcedureInfo>> {
        self.inner.procedure_state(id).await
    }

    async fn list_procedures(&self) -> Result<Vec<ProcedureInfo>> {
        self.inner.list_procedures().await
    }

    fn epoch(&self) -> Option<u64> {
        self.inner.epoch()
    }

    async fn cancel(&self, id: &ProcedureId) -> Result<()> {
        self.inner.cancel(id).await
    }

    async fn pause(&self, id: &ProcedureId) -> Result<()> {
        self.inner.pause(id).await
    }

    async fn resume(&self, id: &ProcedureId) -> Result<()> {
        self.inner.resume(id).await
    }

    async fn pause_all(&self) -> Result<()> {
        self.inner.pause_all().await
    }

    async fn resume_all(&self) -> Result<()> {
        self.inner.resume_all().await
    }
}
