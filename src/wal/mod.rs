//! WAL configuration and options: which WAL a region writes to (raft-engine or a Kafka topic), the Kafka topic
//! pool and its bootstrap procedure, and the allocator that hands options to new regions.

pub mod allocator;
pub mod assigned;
pub mod config;
pub mod error;
pub mod kafka;
pub mod options;
pub mod prune;

pub use allocator::{WalOptionsAllocator, WalOptionsAllocatorRef};
pub use config::{BackoffConfig, KafkaConfig, SelectorType, TopicConfig, WalConfig};
pub use error::Error;
pub use options::{KafkaWalOptions, WAL_OPTIONS_KEY, WalOptions};
