//! WAL tests: the Kafka topic admin, the pool bootstrap (steps, crashes, etcd, Kafka), the allocator, the pool
//! check, load-aware topic selection, topic-name values, config errors and the bad-input catalogue of
//! `docs/errors.md`.

#[path = "../support/mod.rs"]
mod support;

mod allocator;
mod bad_input;
mod batch_create;
mod batch_kafka;
mod bootstrap_crash;
mod bootstrap_etcd;
mod bootstrap_kafka;
mod bootstrap_record;
mod bootstrap_steps;
mod config_errors;
mod kafka_admin;
mod kafka_security;
mod late_persist_names;
mod pool_check;
mod prune_round;
mod selection;
mod topic_config;
mod topic_name_values;
