//! Kv backend tests: the conformance suite on memory, redb and etcd; redb (file lock, damaged files); etcd;
//! `KvStateStore` on the engine's suite and crash matrix.

#[path = "../support/mod.rs"]
mod support;

mod conformance;
mod crash_matrix;
mod election;
mod etcd;
mod etcd_secure;
mod group_commit;
mod redb;
mod redb_damage;
mod state_store;
