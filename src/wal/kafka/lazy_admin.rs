//! [`LazyTopicAdmin`]: a topic admin that connects on first use.

use std::collections::BTreeMap;

use async_trait::async_trait;
use tokio::sync::OnceCell;

use crate::wal::KafkaConfig;
use crate::wal::error::Result;
use crate::wal::kafka::admin::{CreateTopicOutcome, TopicAdmin};
use crate::wal::kafka::rskafka_admin::RsKafkaTopicAdmin;

/// A topic admin that connects to the brokers on first use, so a metasrv configured for Kafka starts (and lists
/// procedures, builds open requests) while the brokers are down; only what needs them fails.
#[derive(Debug)]
pub struct LazyTopicAdmin {
    config: KafkaConfig,
    admin: OnceCell<RsKafkaTopicAdmin>,
}

impl LazyTopicAdmin {
    /// An admin of the brokers `config` names, not connected yet.
    pub fn new(config: KafkaConfig) -> Self {
        LazyTopicAdmin {
            config,
            admin: OnceCell::new(),
        }
    }

    /// The connected admin, connecting on the first call (a failed connect is tried again by the next call).
    async fn get(&self) -> Result<&RsKafkaTopicAdmin> {
        self.admin
            .get_or_try_init(|| RsKafkaTopicAdmin::connect(&self.config))
            .await
    }
}

#[async_trait]
impl TopicAdmin for LazyTopicAdmin {
    fn endpoints(&self) -> Vec<String> {
        self.config.broker_endpoints.clone()
    }

    async fn list_topics(&self) -> Result<BTreeMap<String, usize>> {
        self.get().await?.list_topics().await
    }

    async fn create_topic(
        &self,
        name: &str,
        num_partitions: i32,
        replication_factor: i16,
    ) -> Result<CreateTopicOutcome> {
        self.get()
            .await?
            .create_topic(name, num_partitions, replication_factor)
            .await
    }

    // Every batched call goes to the connected admin too: the trait's defaults (topic by topic, a full listing)
    // would lose the batching.
    fn create_batch_size(&self) -> usize {
        self.config.create_batch_size
    }

    async fn create_topics(
        &self,
        names: &[String],
        num_partitions: i32,
        replication_factor: i16,
        topic_config: &crate::wal::TopicConfig,
    ) -> Result<Vec<crate::wal::kafka::admin::TopicCreation>> {
        self.get()
            .await?
            .create_topics(names, num_partitions, replication_factor, topic_config)
            .await
    }

    async fn describe_topics(&self, names: &[String]) -> Result<BTreeMap<String, usize>> {
        self.get().await?.describe_topics(names).await
    }

    async fn describe_topics_with_ids(
        &self,
        names: &[String],
    ) -> Result<BTreeMap<String, (usize, Option<crate::key::topic_name::TopicId>)>> {
        self.get().await?.describe_topics_with_ids(names).await
    }

    async fn describe_topics_on_each_broker(
        &self,
        names: &[String],
    ) -> Result<Vec<(String, BTreeMap<String, usize>)>> {
        self.get()
            .await?
            .describe_topics_on_each_broker(names)
            .await
    }

    async fn describe_topic_configs(
        &self,
        names: &[String],
        keys: &[String],
    ) -> Result<BTreeMap<String, crate::wal::TopicConfig>> {
        self.get().await?.describe_topic_configs(names, keys).await
    }
}
