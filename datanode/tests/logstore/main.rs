//! Region log store tests: the Kafka record format (fragments, torn tails, duplicates, offset 0) on an in-memory
//! partition, a model-based test of the record decoder, a model-based test of replay
//! exactness under random writes, flushes, prunes and crashes, the Kafka store on the real broker (`KAFKA_ENDPOINTS`;
//! those tests fail when it is unset), and the raft-engine store in a temporary directory.

#[path = "../../../tests/support/mod.rs"]
mod support;

mod checkpoint;
mod common;
mod decoder_model;
mod deleted_topic;
mod duplicates;
mod fence;
mod fragments;
mod kafka_broker;
mod offset_zero;
mod produce;
mod prune_crash;
mod prune_open;
mod prune_race;
mod pruned;
mod raft_engine;
mod recreated_topic;
mod replay;
mod replay_model;
mod topic_config;
mod writers;
