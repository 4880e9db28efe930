//! `walctl` without external services: the embedded default (redb in `./walctl-data`, raft-engine WAL) and small
//! TOML configs — every command's text and JSON output, usage and config errors, a create-table left by a killed
//! run, and purging a damaged procedure record.

#[path = "../support/mod.rs"]
mod support;

mod bench;
mod commands;
mod control;
mod damaged_file;
mod idempotent;
mod interrupt;
mod introspection;
mod postgres;
mod purge;
mod readonly;
mod replay;
mod resume;
