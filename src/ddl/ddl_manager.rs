//! [`DdlManager`]: runs DDL tasks as procedures and waits for their result.

use procedures::{ProcedureManagerRef, ProcedureWithId};
use snafu::ResultExt;

use crate::ddl::context::DdlContext;
use crate::ddl::create_table::{CREATE_TABLE_TYPE_NAME, CreateTableProcedure};
use crate::ddl::table_name::TableNameValue;
use crate::ddl::task::CreateTableTask;
use crate::error::{CreateTableOutputSnafu, CreateTableSnafu, Result};

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
        task.validate_num_regions()?;
        let table = task.name.to_string();
        let procedure = CreateTableProcedure::new(task, self.context.clone());
        let procedure = ProcedureWithId::with_random_id(Box::new(procedure));
        let procedure_id = procedure.id.clone();
        let mut watcher = self
            .procedures
            .submit(procedure)
            .await
            .context(CreateTableSnafu {
                table: table.clone(),
            })?;
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
}
