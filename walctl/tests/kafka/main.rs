//! `walctl` against the real services (`KAFKA_ENDPOINTS`, `ETCD_ENDPOINTS`; the tests fail saying so when they are
//! unset): the topic pool on Kafka and metadata in etcd, a bootstrap killed half-way, what walctl logs while a
//! bootstrap fails, resumes or waits on a dead broker.

#[path = "../support/mod.rs"]
mod support;

mod kill;
mod logging;
mod pool;
mod readonly;
mod recovery;
mod replay;
mod spread;
mod topic_config;
mod wal_prune;
