//! The Kafka side of remote WAL: topic administration, the topic pool, the selector and the bootstrap procedure.

pub mod admin;
pub mod batch_admin;
pub mod bootstrap;
pub mod connection;
pub mod java_client;
pub mod lazy_admin;
pub mod partition;
pub mod record_deleter;
pub mod region_count;
pub mod rskafka_admin;
pub mod security;
pub mod selector;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod timed_admin;
pub mod topic_pool;

pub use bootstrap::TopicBootstrapProcedure;
pub use selector::{
    LeastLoadedTopicSelector, RoundRobinTopicSelector, TopicSelector, TopicSelectorRef,
};
pub use topic_pool::{KafkaTopicManager, ReadyPoll, TopicConfigDrift, TopicPoolSpec};
