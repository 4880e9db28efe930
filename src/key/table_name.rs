//! A table's full name, its validation, and the `__table_name/{catalog}/{schema}/{table}` → `{"table_id":N}` key.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ddl::error::{InvalidNameSnafu, Result};

/// Prefix of table name keys.
pub const TABLE_NAME_KEY_PREFIX: &str = "__table_name";

/// The longest catalog, schema, table or engine name accepted.
pub const MAX_NAME_LEN: usize = 255;

/// A table's full name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TableName {
    /// The catalog.
    pub catalog: String,
    /// The schema.
    pub schema: String,
    /// The table.
    pub table: String,
}

impl TableName {
    /// A full name.
    pub fn new(
        catalog: impl Into<String>,
        schema: impl Into<String>,
        table: impl Into<String>,
    ) -> Self {
        TableName {
            catalog: catalog.into(),
            schema: schema.into(),
            table: table.into(),
        }
    }

    /// Checks every part: non-empty, at most [`MAX_NAME_LEN`] bytes, only `[a-zA-Z0-9_-]`. The error names the
    /// bad part.
    pub fn validate(&self) -> Result<()> {
        validate_name("catalog", &self.catalog)?;
        validate_name("schema", &self.schema)?;
        validate_name("table", &self.table)
    }

    /// The kv key of this name: `__table_name/{catalog}/{schema}/{table}`.
    pub fn key(&self) -> String {
        format!(
            "{TABLE_NAME_KEY_PREFIX}/{}/{}/{}",
            self.catalog, self.schema, self.table
        )
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.catalog, self.schema, self.table)
    }
}

/// Checks one name: non-empty, at most [`MAX_NAME_LEN`] bytes, only `[a-zA-Z0-9_-]`. `what` names the kind of
/// name in the error (`catalog`, `schema`, `table`, `engine`).
pub fn validate_name(what: &'static str, name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        Some("it is empty".to_string())
    } else if name.len() > MAX_NAME_LEN {
        Some(format!(
            "it is {} bytes long, at most {MAX_NAME_LEN} are allowed",
            name.len()
        ))
    } else {
        name.chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
            .map(|c| format!("character {c:?} is not allowed (only [a-zA-Z0-9_-])"))
    };
    match reason {
        Some(reason) => InvalidNameSnafu {
            what,
            name: name.to_string(),
            reason,
        }
        .fail(),
        None => Ok(()),
    }
}

/// The value of a table name key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableNameValue {
    /// The table's id.
    pub table_id: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_layout() {
        let name = TableName::new("greptime", "public", "cpu");
        assert_eq!(name.key(), "__table_name/greptime/public/cpu");
        assert_eq!(name.to_string(), "greptime.public.cpu");
    }

    #[test]
    fn value_layout() {
        let v = TableNameValue { table_id: 1024 };
        assert_eq!(serde_json::to_string(&v).unwrap(), r#"{"table_id":1024}"#);
    }

    #[test]
    fn validation_names_the_bad_part() {
        assert!(
            TableName::new("greptime", "public", "cpu-1_x")
                .validate()
                .is_ok()
        );
        let err = TableName::new("greptime", "", "cpu")
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("schema") && err.contains("empty"), "{err}");
        let err = TableName::new("greptime", "public", "a/b")
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("table") && err.contains("'a/b'"), "{err}");
        let long = "x".repeat(MAX_NAME_LEN + 1);
        let err = TableName::new(long.clone(), "public", "t")
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("catalog") && err.contains(&long), "{err}");
    }
}
