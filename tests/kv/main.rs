//! Kv backend tests: the conformance suite on memory, redb, etcd and PostgreSQL; redb (file lock, damaged files); etcd;
//! PostgreSQL (racing conditional writes, refused credentials, another layout version, TLS);
//! `KvStateStore` on the engine's suite and crash matrix.

#[path = "../support/mod.rs"]
mod support;

mod conformance;
mod crash_matrix;
mod election;
mod etcd;
mod etcd_secure;
mod group_commit;
mod postgres;
mod postgres_election;
mod postgres_tls;
mod redb;
mod redb_damage;
mod state_store;
