//! `walctl` against the real services (`KAFKA_ENDPOINTS`, `ETCD_ENDPOINTS`, and the SASL_SSL broker's
//! `KAFKA_SECURE_ENDPOINTS`; the tests fail saying so when they are unset): the topic pool on Kafka and metadata in
//! etcd, a bootstrap killed half-way, what walctl logs while a bootstrap fails, resumes or waits on a dead broker,
//! and the main flow over `[wal.security]`.

#[path = "../support/mod.rs"]
mod support;

mod kill;
mod logging;
mod pool;
mod readonly;
mod recovery;
mod replay;
mod security;
mod spread;
mod topic_config;
mod wal_prune;
