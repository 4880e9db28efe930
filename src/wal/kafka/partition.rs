//! Partition 0 of a pool topic as the metasrv side reaches it: an rskafka client connected with the pool's backoff
//! and deadline ([`connect_client`]), and [`KafkaPartition`], whose calls read offsets and watermarks and delete
//! records (a prune), each under a hard bound ([`call_bound`]). Nothing here appends or reads entries: that is the
//! datanode's (its log store wraps [`KafkaPartition`] for produce and fetch).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rskafka::client::partition::{OffsetAt, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use snafu::IntoError;
use tokio::time::timeout;

use crate::wal::config::KafkaConfig;
use crate::wal::error::Result;
use crate::wal::error::{
    KafkaConnectSnafu, KafkaSecuritySnafu, KafkaTimeoutSnafu, LogKafkaSnafu, LogKafkaTimeoutSnafu,
};
use crate::wal::kafka::connection;
use crate::wal::kafka::rskafka_admin::is_retryable_rskafka_error;

/// Connects an rskafka client to `config`'s brokers (with its backoff and deadline), bounded by
/// `backoff.deadline` + `create_topic_timeout`; errors name the endpoints and are final (rskafka already retried).
pub async fn connect_client(config: &KafkaConfig) -> Result<Arc<Client>> {
    build_client(config, "remote-wal-log-store")
        .await
        .map(Arc::new)
}

/// An rskafka client of `config`'s brokers, with `[wal.security]`'s TLS and SASL, its backoff and its deadline.
///
/// With TLS or SASL configured, one connection of our own first checks the settings against the brokers
/// ([`connection::check_security`]): rskafka would retry a refused handshake or a wrong password until the backoff
/// deadline, while this fails at once with an error naming the endpoint and the cause. The whole connect is
/// bounded by `backoff.deadline` + `create_topic_timeout`; its errors are final (rskafka already retried).
pub async fn build_client(config: &KafkaConfig, client_id: &str) -> Result<Client> {
    let endpoints = config.broker_endpoints.clone();
    let security = config.security.load()?;
    let backoff = rskafka::BackoffConfig {
        init_backoff: config.backoff.init,
        max_backoff: config.backoff.max,
        base: config.backoff.base,
        deadline: Some(config.backoff.deadline),
    };
    let bound = call_bound(config);
    let step_timeout = config
        .create_topic_timeout
        .min(connection::MAX_STEP_TIMEOUT);
    let build = async {
        connection::check_security(&endpoints, &security, step_timeout).await?;
        security
            .apply(ClientBuilder::new(endpoints.clone()))
            .client_id(client_id)
            .backoff_config(backoff)
            .build()
            .await
            .map_err(|e| {
                // Every connection closed unanswered until the deadline, in plaintext: what a TLS listener does.
                let text = e.to_string();
                if security.is_plaintext() && text.to_ascii_lowercase().contains("eof") {
                    return KafkaSecuritySnafu {
                        endpoint: endpoints.join(","),
                        stage: "plaintext connection",
                        reason: format!(
                            "{text}; the broker closed every connection without an answer, as a TLS (SSL or \
                             SASL_SSL) listener does with plaintext: see [wal.security]"
                        ),
                    }
                    .build();
                }
                KafkaConnectSnafu {
                    endpoints: endpoints.clone(),
                    retryable: false,
                }
                .into_error(e)
            })
    };
    // A TLS listener spoken to in plaintext never answers: say so when nothing is configured.
    let operation = if security.is_plaintext() {
        "connect in plaintext (a TLS listener never answers one: see [wal.security])"
    } else {
        "connect"
    };
    timeout(bound, build).await.map_err(|_| {
        KafkaTimeoutSnafu {
            endpoints: endpoints.clone(),
            operation,
            timeout: bound,
            retryable: false,
        }
        .build()
    })?
}

/// The bound of one log-store call: rskafka's retries until the backoff deadline, then one request.
pub fn call_bound(config: &KafkaConfig) -> Duration {
    config
        .backoff
        .deadline
        .saturating_add(config.create_topic_timeout)
}

/// Partition 0 of a topic through rskafka, every call bounded by a timeout.
pub struct KafkaPartition {
    client: PartitionClient,
    topic: String,
    bound: Duration,
}

impl fmt::Debug for KafkaPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaPartition")
            .field("topic", &self.topic)
            .field("bound", &self.bound)
            .finish()
    }
}

impl KafkaPartition {
    /// The partition client of `topic` on `client`; every call (this one too) is bounded by `bound`.
    pub async fn new(client: &Client, topic: &str, bound: Duration) -> Result<Self> {
        let partition = guard(
            topic,
            "open partition 0",
            bound,
            client.partition_client(topic, 0, UnknownTopicHandling::Retry),
        )
        .await?;
        Ok(KafkaPartition {
            client: partition,
            topic: topic.to_string(),
            bound,
        })
    }
}

impl KafkaPartition {
    /// Deletes the partition's records below `offset` (Kafka's DeleteRecords); a low watermark already at or
    /// above it stays. `offset` must not exceed the high watermark.
    pub async fn delete_records_before(&self, offset: i64) -> Result<()> {
        let timeout_ms = i32::try_from(self.bound.as_millis()).unwrap_or(i32::MAX);
        guard(
            &self.topic,
            &format!("delete records below offset {offset}"),
            self.bound,
            self.client.delete_records(offset, timeout_ms),
        )
        .await
    }
}

/// Runs one rskafka call under `bound`, mapping its error (retryability decided from rskafka's error) and its
/// timeout (final: rskafka's own retries ran inside the bound).
pub async fn guard<T>(
    topic: &str,
    operation: &str,
    bound: Duration,
    call: impl std::future::Future<Output = rskafka::client::error::Result<T>>,
) -> Result<T> {
    match timeout(bound, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => {
            let retryable = is_retryable_rskafka_error(&e);
            Err(LogKafkaSnafu {
                topic,
                operation,
                retryable,
            }
            .into_error(e))
        }
        Err(_) => LogKafkaTimeoutSnafu {
            topic,
            operation,
            timeout: bound,
        }
        .fail(),
    }
}

impl KafkaPartition {
    /// The topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// rskafka's partition client, for calls this type does not wrap (run them under [`guard`] with [`Self::bound`]).
    pub fn client(&self) -> &PartitionClient {
        &self.client
    }

    /// The bound of every call.
    pub fn bound(&self) -> Duration {
        self.bound
    }

    /// The next offset to be written (the high watermark).
    pub async fn high_watermark(&self) -> Result<i64> {
        guard(
            &self.topic,
            "read the high watermark",
            self.bound,
            self.client.get_offset(OffsetAt::Latest),
        )
        .await
    }

    /// The earliest offset still kept (records below it were deleted or expired).
    pub async fn low_watermark(&self) -> Result<i64> {
        guard(
            &self.topic,
            "read the low watermark",
            self.bound,
            self.client.get_offset(OffsetAt::Earliest),
        )
        .await
    }
}
