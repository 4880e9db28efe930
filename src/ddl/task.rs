//! [`CreateTableTask`]: what a create-table request asks for, and its validation.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use snafu::ensure;

use crate::ddl::error::{InvalidCreateTableSnafu, Result};
use crate::key::table_name::{TableName, validate_name};
use crate::wal::WAL_OPTIONS_KEY;

/// The most regions one table may have.
pub const MAX_REGIONS_PER_TABLE: u32 = 1024;

/// A request to create a table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateTableTask {
    /// The table's full name.
    pub name: TableName,
    /// The storage engine of its regions (e.g. `mito`).
    pub engine: String,
    /// How many regions (numbered `0..num_regions`), 1 to [`MAX_REGIONS_PER_TABLE`].
    pub num_regions: u32,
    /// Table options; every region gets them, plus its `wal_options`.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
    /// When the table exists: succeed with its id instead of failing.
    #[serde(default)]
    pub if_not_exists: bool,
}

impl CreateTableTask {
    /// A task for `name` with `num_regions` regions of engine `mito`, no options, failing if the table exists.
    pub fn new(name: TableName, num_regions: u32) -> Self {
        CreateTableTask {
            name,
            engine: "mito".to_string(),
            num_regions,
            options: BTreeMap::new(),
            if_not_exists: false,
        }
    }

    /// Checks names, engine, region count and options; the error names the culprit.
    pub fn validate(&self) -> Result<()> {
        self.name.validate()?;
        validate_name("engine", &self.engine)?;
        self.validate_num_regions()?;
        ensure!(
            !self.options.contains_key(WAL_OPTIONS_KEY),
            InvalidCreateTableSnafu {
                table: self.name.to_string(),
                reason: format!(
                    "option '{WAL_OPTIONS_KEY}' is reserved: WAL options are allocated per region"
                ),
            }
        );
        Ok(())
    }

    /// Checks that `num_regions` is within 1..=[`MAX_REGIONS_PER_TABLE`]; the error names the field and value.
    pub fn validate_num_regions(&self) -> Result<()> {
        ensure!(
            (1..=MAX_REGIONS_PER_TABLE).contains(&self.num_regions),
            InvalidCreateTableSnafu {
                table: self.name.to_string(),
                reason: format!(
                    "num_regions = {}: a table has 1 to {MAX_REGIONS_PER_TABLE} regions",
                    self.num_regions
                ),
            }
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(n: u32) -> CreateTableTask {
        CreateTableTask::new(TableName::new("greptime", "public", "cpu"), n)
    }

    #[test]
    fn region_count_bounds() {
        assert!(task(1).validate().is_ok());
        assert!(task(MAX_REGIONS_PER_TABLE).validate().is_ok());
        for n in [0, MAX_REGIONS_PER_TABLE + 1] {
            let err = task(n).validate().unwrap_err().to_string();
            assert!(
                err.contains("greptime.public.cpu") && err.contains(&format!("num_regions = {n}")),
                "{err}"
            );
        }
    }

    #[test]
    fn wal_options_is_a_reserved_option() {
        let mut t = task(1);
        t.options.insert("wal_options".into(), "x".into());
        let err = t.validate().unwrap_err().to_string();
        assert!(err.contains("wal_options"), "{err}");
    }

    #[test]
    fn bad_engine_is_named() {
        let mut t = task(1);
        t.engine = "mi to".into();
        let err = t.validate().unwrap_err().to_string();
        assert!(err.contains("engine") && err.contains("'mi to'"), "{err}");
    }
}
