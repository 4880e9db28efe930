//! The Kafka side of remote WAL: topic administration, the topic pool, the selector and the bootstrap procedure.

pub mod admin;
pub mod rskafka_admin;
