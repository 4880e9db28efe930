//! Which incarnation of a Kafka topic the brokers serve now: a datanode asks before it replays a region from a
//! checkpoint, because entry ids are positions in the topic and a checkpoint counts the positions of the topic
//! incarnation the region wrote to. A topic deleted and created again under the same name (out of band, or by
//! `walctl bootstrap --recreate-missing`) gets another id from the controller; the region's entries after its
//! checkpoint went with the old one (`docs/remote-wal.md`, "Topic incarnations").

use async_trait::async_trait;
use remote_wal::key::topic_name::TopicId;
use remote_wal::wal::KafkaConfig;
use remote_wal::wal::error::Result;
use remote_wal::wal::kafka::batch_admin::BatchAdmin;
use tokio::sync::OnceCell;

/// What the brokers say of a topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopicIncarnation {
    /// They do not list it.
    Gone,
    /// They list it without an id (a broker before Metadata v10 or a nil id): incarnations cannot be told apart.
    Unknown,
    /// They list it under this id.
    Id(TopicId),
}

/// Reads a topic's current incarnation.
#[async_trait]
pub trait TopicIds: Send + Sync + std::fmt::Debug {
    /// The incarnation of `topic` the brokers serve now. An error means they could not be asked (retryable or not
    /// as the library decides); it is never taken for an answer.
    async fn incarnation(&self, topic: &str) -> Result<TopicIncarnation>;
}

/// [`TopicIds`] from the brokers of a `[wal]` config (one Metadata request per call, with its security), connecting
/// on first use.
#[derive(Debug)]
pub struct BrokerTopicIds {
    config: KafkaConfig,
    admin: OnceCell<BatchAdmin>,
}

impl BrokerTopicIds {
    /// Reads ids from `config`'s brokers.
    pub fn new(config: KafkaConfig) -> Self {
        BrokerTopicIds {
            config,
            admin: OnceCell::new(),
        }
    }
}

#[async_trait]
impl TopicIds for BrokerTopicIds {
    async fn incarnation(&self, topic: &str) -> Result<TopicIncarnation> {
        let admin = self
            .admin
            .get_or_try_init(|| async { BatchAdmin::new(&self.config) })
            .await?;
        let listed = admin.describe_topics_with_ids(&[topic.to_string()]).await?;
        Ok(match listed.get(topic) {
            None => TopicIncarnation::Gone,
            Some((_, None)) => TopicIncarnation::Unknown,
            Some((_, Some(id))) => TopicIncarnation::Id(*id),
        })
    }
}
