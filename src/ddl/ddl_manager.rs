//! [`DdlManager`]: runs DDL tasks as procedures and waits for their result.

use procedures::record::{ProcedureRecord, record_key};
use procedures::{ProcedureId, ProcedureManagerRef, ProcedureWithId, StateStore};
use snafu::ResultExt;

use crate::ddl::context::DdlContext;
use crate::ddl::create_table::{CREATE_TABLE_TYPE_NAME, CreateTableData, CreateTableProcedure};
use crate::ddl::error::{
    CreateTableIdInUseSnafu, CreateTableOutputSnafu, CreateTableSnafu, Result,
};
use crate::ddl::procedure_id::validate_procedure_id;
use crate::ddl::task::CreateTableTask;
use crate::key::table_name::TableNameValue;
use crate::kv::KvStateStore;

/// Submits DDL procedures to a procedure manager and awaits them.
#[derive(Clone)]
pub struct DdlManager {
    procedures: ProcedureManagerRef,
    context: DdlContext,
}

impl std::fmt::Debug for DdlManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DdlManager")
            .field("context", &self.context)
            .finish_non_exhaustive()
    }
}

impl DdlManager {
    /// A DDL manager over `procedures`. Call [`DdlManager::register_loaders`] before the manager starts.
    pub fn new(procedures: ProcedureManagerRef, context: DdlContext) -> Self {
        DdlManager {
            procedures,
            context,
        }
    }

    /// Registers the loaders of the DDL procedures (so unfinished ones resume after a restart).
    pub fn register_loaders(&self) -> Result<()> {
        self.procedures.register_loader(
            CREATE_TABLE_TYPE_NAME,
            CreateTableProcedure::loader(self.context.clone()),
        )?;
        Ok(())
    }

    /// The services the procedures run against.
    pub fn context(&self) -> &DdlContext {
        &self.context
    }

    /// Creates a table and returns its id. Concurrent calls for one name are serialised by the procedure's lock:
    /// one creates the table, the others fail with "table already exists" (or get its id with `if_not_exists`).
    ///
    /// A region count outside 1..=1024 is refused before the procedure is submitted, with an error naming
    /// `num_regions` and its value: nothing is written (the procedure's Prepare step validates the rest).
    pub async fn create_table(&self, task: CreateTableTask) -> Result<u32> {
        self.create_table_with_id(task, None).await
    }

    /// [`DdlManager::create_table`] under a procedure id the caller chose (a random one when `None`). The id is an
    /// idempotency key: a retry with the same id and task — after a lost reply, a timeout, a crash — gets the same
    /// table id back (waiting for the procedure if it still runs), never "already exists"; the same id with another
    /// task is refused with [`crate::ddl::Error::CreateTableIdInUse`] naming the id, and the other task's procedure is left
    /// alone. An id that is blank, over 128 bytes or not printable is refused before anything is submitted
    /// ([`validate_procedure_id`]).
    pub async fn create_table_with_id(
        &self,
        task: CreateTableTask,
        id: Option<ProcedureId>,
    ) -> Result<u32> {
        let table = task.name.to_string();
        let (procedure_id, mut watcher) = self.submit_create_table(task, id).await?;
        let output = watcher.wait().await.context(CreateTableSnafu {
            table: table.clone(),
        })?;
        output
            .as_ref()
            .and_then(|o| serde_json::from_value::<TableNameValue>(o.clone()).ok())
            .map(|v| v.table_id)
            .ok_or_else(|| {
                CreateTableOutputSnafu {
                    table,
                    procedure_id: procedure_id.to_string(),
                    output: format!("{output:?}"),
                }
                .build()
            })
    }

    /// The submission of [`DdlManager::create_table_with_id`] without the wait: returns once the procedure's
    /// record is stored (or, for an id that names an existing procedure, once its record is found to hold the
    /// same task), with the procedure's id and a watcher of it. What `POST /v1/tables` with `"wait":false`
    /// answers 202 on: the same id with another task is [`crate::ddl::Error::CreateTableIdInUse`] here, never a 202.
    /// The procedure itself refuses a table that exists (no record is left; its watcher gets
    /// [`procedures::Error::ProcedureRefused`]).
    pub async fn submit_create_table(
        &self,
        task: CreateTableTask,
        id: Option<ProcedureId>,
    ) -> Result<(ProcedureId, procedures::Watcher)> {
        if let Some(id) = &id {
            validate_procedure_id(&task.name, id.as_str())?;
        }
        task.validate_num_regions()?;
        let table = task.name.to_string();
        let chosen = id.is_some().then(|| task.clone());
        let procedure = Box::new(CreateTableProcedure::new(task, self.context.clone()));
        let procedure = match id {
            Some(id) => ProcedureWithId::new(id, procedure),
            None => ProcedureWithId::with_random_id(procedure),
        };
        let procedure_id = procedure.id.clone();
        let watcher = self
            .procedures
            .submit(procedure)
            .await
            .context(CreateTableSnafu {
                table: table.clone(),
            })?;
        // A submission that stored the record ran `task` by construction; only an id that named an existing
        // procedure needs its record read and compared.
        let mut watcher = watcher;
        if let Some(task) = &chosen
            && !watcher.is_new_submission()
        {
            self.ensure_same_task(&procedure_id, task).await?;
            // The same request under an id whose create-table failed and was rolled back (nothing of it is left):
            // it runs again rather than answer the old failure (a failure that may have been the store's, for
            // work a retry would finish).
            let info = watcher.info();
            if info.state == procedures::ProcedureState::Failed && info.refusal.is_none() {
                let again = Box::new(CreateTableProcedure::new(
                    task.clone(),
                    self.context.clone(),
                ));
                watcher = self
                    .procedures
                    .submit_again_if_rolled_back(ProcedureWithId::new(procedure_id.clone(), again))
                    .await
                    .context(CreateTableSnafu {
                        table: table.clone(),
                    })?;
            }
        }
        Ok((procedure_id, watcher))
    }

    /// Checks that the procedure under a caller-chosen id runs `task`: its record (written by this submission, or
    /// found under the id) holds the task it was submitted with.
    async fn ensure_same_task(&self, id: &ProcedureId, task: &CreateTableTask) -> Result<()> {
        let store = KvStateStore::new(self.context.metadata.kv().clone());
        let Some(bytes) = store.get(&record_key(id)).await? else {
            // Deleted since the submission answered (purged after it finished): nothing is left to compare.
            return Ok(());
        };
        let existing = serde_json::from_slice::<ProcedureRecord>(&bytes)
            .ok()
            .and_then(|record| serde_json::from_value::<CreateTableData>(record.data).ok())
            .map(|data| data.task);
        match existing {
            Some(existing) if existing == *task => Ok(()),
            other => CreateTableIdInUseSnafu {
                procedure_id: id.to_string(),
                table: task.name.to_string(),
                existing: match other {
                    Some(t) => format!(
                        "table {}, {} region(s); this request differs: {}",
                        t.name,
                        t.num_regions,
                        task_differences(&t, task)
                    ),
                    None => "a record that does not read as a create-table task".to_string(),
                },
            }
            .fail(),
        }
    }
}

/// How `requested` differs from `existing`, field by field (`table greptime.public.b, not greptime.public.a; 3
/// region(s), not 2`), for the error refusing a used id.
fn task_differences(existing: &CreateTableTask, requested: &CreateTableTask) -> String {
    let mut differences = Vec::new();
    if requested.name != existing.name {
        differences.push(format!("table {}, not {}", requested.name, existing.name));
    }
    if requested.num_regions != existing.num_regions {
        differences.push(format!(
            "{} region(s), not {}",
            requested.num_regions, existing.num_regions
        ));
    }
    if requested.engine != existing.engine {
        differences.push(format!(
            "engine {}, not {}",
            requested.engine, existing.engine
        ));
    }
    if requested.if_not_exists != existing.if_not_exists {
        differences.push(format!(
            "if_not_exists {}, not {}",
            requested.if_not_exists, existing.if_not_exists
        ));
    }
    let keys: std::collections::BTreeSet<&String> = existing
        .options
        .keys()
        .chain(requested.options.keys())
        .collect();
    for key in keys {
        let (old, new) = (existing.options.get(key), requested.options.get(key));
        if old != new {
            let show = |v: Option<&String>| v.map_or("(absent)".to_string(), |v| format!("'{v}'"));
            differences.push(format!("option '{key}' {}, not {}", show(new), show(old)));
        }
    }
    if differences.is_empty() {
        "(no field differs; the stored task does not compare equal)".to_string()
    } else {
        differences.join("; ")
    }
}
