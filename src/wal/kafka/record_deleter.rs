//! [`KafkaRecordDeleter`]: the [`RecordDeleter`] a WAL prune uses on real brokers, Kafka's DeleteRecords on
//! partition 0 of the topic through [`KafkaPartition`] (every call bounded), and [`LazyRecordDeleter`], which
//! connects on first use. The procedure (`crate::wal::prune`) only knows the trait.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rskafka::client::Client;
use tokio::sync::OnceCell;

use crate::key::topic_name::TopicId;
use crate::wal::KafkaConfig;
use crate::wal::error::Result;
use crate::wal::kafka::batch_admin::BatchAdmin;
use crate::wal::kafka::partition::{KafkaPartition, call_bound, connect_client};
use crate::wal::prune::RecordDeleter;

/// Deletes records through an rskafka client.
pub struct KafkaRecordDeleter {
    client: Arc<Client>,
    bound: Duration,
}

impl std::fmt::Debug for KafkaRecordDeleter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaRecordDeleter")
            .field("bound", &self.bound)
            .finish_non_exhaustive()
    }
}

impl KafkaRecordDeleter {
    /// A deleter on `client`, every call bounded by `bound`.
    pub fn new(client: Arc<Client>, bound: Duration) -> Self {
        KafkaRecordDeleter { client, bound }
    }
}

#[async_trait]
impl RecordDeleter for KafkaRecordDeleter {
    async fn delete_records_before(&self, topic: &str, offset: i64) -> Result<()> {
        let partition = KafkaPartition::new(&self.client, topic, self.bound).await?;
        partition.delete_records_before(offset).await
    }

    async fn last_entry_id(&self, topic: &str) -> Result<Option<u64>> {
        let partition = KafkaPartition::new(&self.client, topic, self.bound).await?;
        let high = partition.high_watermark().await?;
        Ok(Some(u64::try_from(high).unwrap_or(0)))
    }
}

/// A [`KafkaRecordDeleter`] that connects to the brokers on first use, so a metasrv configured for Kafka starts
/// while the brokers are down; only a prune needs them.
pub struct LazyRecordDeleter {
    config: KafkaConfig,
    deleter: OnceCell<KafkaRecordDeleter>,
    /// Reads topic ids (Metadata); built on first use.
    admin: OnceCell<BatchAdmin>,
}

impl std::fmt::Debug for LazyRecordDeleter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyRecordDeleter")
            .field("endpoints", &self.config.broker_endpoints)
            .finish_non_exhaustive()
    }
}

impl LazyRecordDeleter {
    /// A deleter for `config`'s brokers, connecting on first use.
    pub fn new(config: KafkaConfig) -> Self {
        LazyRecordDeleter {
            config,
            deleter: OnceCell::new(),
            admin: OnceCell::new(),
        }
    }

    /// The connected deleter, connecting first if this is the first call.
    async fn deleter(&self) -> Result<&KafkaRecordDeleter> {
        self.deleter
            .get_or_try_init(|| async {
                let client = connect_client(&self.config).await?;
                Ok::<_, crate::wal::Error>(KafkaRecordDeleter::new(
                    client,
                    call_bound(&self.config),
                ))
            })
            .await
    }
}

#[async_trait]
impl RecordDeleter for LazyRecordDeleter {
    async fn delete_records_before(&self, topic: &str, offset: i64) -> Result<()> {
        self.deleter()
            .await?
            .delete_records_before(topic, offset)
            .await
    }

    async fn last_entry_id(&self, topic: &str) -> Result<Option<u64>> {
        self.deleter().await?.last_entry_id(topic).await
    }

    async fn topic_ids(&self, topics: &[String]) -> Result<BTreeMap<String, TopicId>> {
        let admin = self
            .admin
            .get_or_try_init(|| async { BatchAdmin::new(&self.config) })
            .await?;
        Ok(admin
            .describe_topics_with_ids(topics)
            .await?
            .into_iter()
            .filter_map(|(topic, (_, id))| id.map(|id| (topic, id)))
            .collect())
    }
}
