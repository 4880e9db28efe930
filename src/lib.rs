//! remote-wal: hands out write-ahead-log options per region — the local raft-engine WAL or a topic from a shared
//! pool of Kafka topics — for a database's metadata server. Every metadata operation (topic bootstrap, create table)
//! runs as a persisted, resumable procedure on the [`procedures`] engine, so a crash at any point never creates a
//! duplicate topic, never loses a table and never hands a region two different topics.
//!
//! Layers, from the bottom (a module uses only those below it):
//!
//! - [`error`]: the crate's one [`Error`] type; each error names what it touched and decides where it is built
//!   whether it is retryable. It depends on no other module.
//! - [`kv`]: the metadata store — the [`kv::KvBackend`] trait, its memory, redb and etcd backends, and
//!   [`kv::KvStateStore`], the procedure engine's state store on any backend.
//! - [`wal`]: WAL options per region (raft-engine or a Kafka topic), the Kafka topic pool and its bootstrap
//!   procedure, and the allocator handing options to new regions.
//! - [`ddl`]: table metadata keys and values, id / placement / WAL allocation, the create-table procedure and the
//!   DDL manager.
//! - [`datanode`]: what a datanode opens — one open request per region recorded for it, with its WAL options.
//! - [`config`]: [`config::MetasrvConfig`], the TOML file a metasrv is built from.
//! - [`metasrv`]: [`metasrv::Metasrv`], the façade an embedding metadata server and the `walctl` CLI use.
//!
//! With the `testing` feature, test helpers for an embedder's tests are public too: the kv conformance suite
//! (`kv::conformance`), an in-memory Kafka (`wal::kafka::testing`) and the procedure engine's crash harness. See
//! `docs/architecture.md` in the repository for the packages, the layers and the key layout.
#![warn(missing_docs)]

pub mod config;
pub mod datanode;
pub mod ddl;
pub mod error;
pub mod key;
pub mod kv;
pub mod metasrv;
mod tls;
pub mod wal;

pub use error::{Error, Result};
