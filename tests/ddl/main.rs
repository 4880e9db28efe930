//! Create-table tests: the procedure, its crash matrix, metadata compatibility with GreptimeDB, reliability,
//! fencing, format-1 upgrade fixtures and what datanodes open.

#[path = "../support/mod.rs"]
mod support;

mod commits;
mod crash_matrix;
mod create_table;
mod datanode_open;
mod drop_crash;
mod failover_crash;
mod fencing;
mod greptime_fixtures;
mod idempotent_create;
mod lifecycle;
mod metadata_compat;
mod migration_crash;
mod migration_fencing;
mod migration_target;
mod reliability;
mod rollback;
mod upgrade_format1;
