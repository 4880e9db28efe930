//! The [`TopicAdmin`] trait: what remote-wal asks of a Kafka cluster — list topics, read some topics' metadata,
//! and create topics, one or a batch at a time.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;

use crate::key::topic_name::TopicId;
use crate::wal::config::TopicConfig;
use crate::wal::error::InvalidWalConfigSnafu;
use crate::wal::error::Result;

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

    /// How many topics one [`TopicAdmin::create_topics`] call should carry at most. The default is 1: an admin
    /// without a native batch creates topic by topic, and its callers run that many calls side by side.
    fn create_batch_size(&self) -> usize {
        1
    }

    /// Creates `names` (one batch, at most [`TopicAdmin::create_batch_size`] of them for one request) with the
    /// topic-level configs `topic_config`, with one answer per topic in the order of `names`; each answer is what
    /// [`TopicAdmin::create_topic`] would answer. A topic that exists keeps its configs (they are not compared
    /// here; see [`TopicAdmin::describe_topic_configs`]). The outer error is a failure of the whole call (nothing
    /// is known of any topic).
    ///
    /// The default creates topic by topic, in order, and refuses any topic config (it cannot apply one).
    async fn create_topics(
        &self,
        names: &[String],
        num_partitions: i32,
        replication_factor: i16,
        topic_config: &TopicConfig,
    ) -> Result<Vec<TopicCreation>> {
        if !topic_config.is_empty() {
            return InvalidWalConfigSnafu {
                field: "topic_config",
                value: format!("{topic_config:?}"),
                reason: format!(
                    "the topic admin for {:?} creates topics one by one and cannot apply topic configs",
                    self.endpoints()
                ),
            }
            .fail();
        }
        let mut answers = Vec::with_capacity(names.len());
        for name in names {
            let outcome = self
                .create_topic(name, num_partitions, replication_factor)
                .await;
            answers.push((name.clone(), outcome));
        }
        Ok(answers)
    }

    /// Those of `names` that exist in the cluster, with their partition counts (fresh metadata). A topic absent
    /// from the answer does not exist (or is not listed yet).
    ///
    /// The default filters [`TopicAdmin::list_topics`].
    async fn describe_topics(&self, names: &[String]) -> Result<BTreeMap<String, usize>> {
        let listed = self.list_topics().await?;
        Ok(names
            .iter()
            .filter_map(|n| listed.get(n).map(|&p| (n.clone(), p)))
            .collect())
    }

    /// [`TopicAdmin::describe_topics`] with each listed topic's Kafka topic id (`None` where the admin cannot
    /// tell). One metadata read, like [`TopicAdmin::describe_topics`].
    ///
    /// The default gives no id.
    async fn describe_topics_with_ids(
        &self,
        names: &[String],
    ) -> Result<BTreeMap<String, (usize, Option<TopicId>)>> {
        Ok(self
            .describe_topics(names)
            .await?
            .into_iter()
            .map(|(name, partitions)| (name, (partitions, None)))
            .collect())
    }

    /// [`TopicAdmin::describe_topics`] asked of **each** broker endpoint in turn (each answers from its own metadata
    /// cache, which follows the controller's records a little behind): per endpoint, those of `names` it lists.
    /// A topic is usable by clients of every broker only once each lists it.
    ///
    /// The default asks any one broker (an admin that cannot address brokers one by one), under the admin's
    /// endpoints joined.
    async fn describe_topics_on_each_broker(
        &self,
        names: &[String],
    ) -> Result<Vec<(String, BTreeMap<String, usize>)>> {
        Ok(vec![(
            self.endpoints().join(","),
            self.describe_topics(names).await?,
        )])
    }

    /// The current value of each config named in `keys` for each topic of `names` that exists (a config with no
    /// value is absent from its map). A topic absent from the answer does not exist.
    ///
    /// The default refuses: an admin without DescribeConfigs cannot tell.
    async fn describe_topic_configs(
        &self,
        names: &[String],
        keys: &[String],
    ) -> Result<BTreeMap<String, TopicConfig>> {
        let _ = names;
        InvalidWalConfigSnafu {
            field: "topic_config",
            value: format!("{keys:?}"),
            reason: format!(
                "the topic admin for {:?} cannot read topic configs",
                self.endpoints()
            ),
        }
        .fail()
    }
}

/// One topic's answer within a batched create: the topic and what creating it did, or why it failed.
pub type TopicCreation = (String, Result<CreateTopicOutcome>);

/// A shared [`TopicAdmin`].
pub type TopicAdminRef = Arc<dyn TopicAdmin>;
