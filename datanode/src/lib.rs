//! The datanode side of remote-wal, for a database's datanode to embed (and `walctl datanode` to run): the region
//! log stores on a Kafka topic or a raft-engine directory, their record format, replay from a checkpoint,
//! checkpoints that only move forward, region storage, region leases and the write path.
//!
//! It depends on the `remote-wal` library's shared types (WAL options, the metadata keys, the kv backends, the
//! heartbeat protocol) and never on the metasrv façade; the metasrv never depends on this package. See
//! `docs/datanode.md` and `docs/architecture.md` in the repository.
#![warn(missing_docs)]

pub mod checkpoint;
pub mod error;
pub mod heartbeat;
pub mod log_store;
pub mod region;
pub mod replay;
pub mod runtime;
pub mod storage;
pub mod topic_ids;

pub use runtime::{Datanode, DatanodeOptions};
