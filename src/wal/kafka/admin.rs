//! The [`TopicAdmin`] trait: the only two things remote-wal asks of a Kafka cluster.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;

use crate::error::Result;

/// What creating one topic did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateTopicOutcome {
    /// This call created it.
    Created,
    /// It existed already (Kafka's TOPIC_ALREADY_EXISTS) with the wanted partition count; counts as created.
    AlreadyExisted,
}

/// Topic administration of a Kafka cluster.
#[async_trait]
pub trait TopicAdmin: Send + Sync + Debug {
    /// The broker endpoints, for error messages.
    fn endpoints(&self) -> Vec<String>;

    /// Every topic in the cluster with its partition count (fresh metadata, not a cache).
    async fn list_topics(&self) -> Result<BTreeMap<String, usize>>;

    /// Creates one topic. A topic that already exists is [`CreateTopicOutcome::AlreadyExisted`] when its partition
    /// count is `num_partitions`, and an error naming the topic and both counts when it is not.
    async fn create_topic(
        &self,
        name: &str,
        num_partitions: i32,
        replication_factor: i16,
    ) -> Result<CreateTopicOutcome>;
}

/// A shared [`TopicAdmin`].
pub type TopicAdminRef = Arc<dyn TopicAdmin>;
