//! remote-wal: hands out write-ahead-log options per region — the local raft-engine WAL or a topic from a shared
//! pool of Kafka topics — for a database's metadata server. Every metadata operation (topic bootstrap, create table)
//! runs as a persisted, resumable procedure on the [`procedures`] engine, so a crash at any point never creates a
//! duplicate topic, never loses a table and never hands a region two different topics.
//!
//! Layers, from the bottom: [`kv`] (the metadata store), [`wal`] (WAL options, the Kafka topic pool and its
//! bootstrap procedure), [`ddl`] (table metadata and the create-table procedure), [`datanode`] (what a datanode
//! opens).
#![warn(missing_docs)]

pub mod config;
pub mod datanode;
pub mod ddl;
pub mod error;
pub mod kv;
pub mod metasrv;
pub mod wal;

pub use error::{Error, Result};
