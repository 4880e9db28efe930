//! [`RsKafkaTopicAdmin`]: the [`TopicAdmin`] over rskafka 0.6.
//!
//! **One retry authority.** rskafka retries connection errors, broken connections and controller moves with its
//! backoff, which here always has the configured `backoff.deadline`. When that deadline runs out the error is
//! final (not retryable): the engine does not run the whole deadline again. rskafka has no request timeout of its
//! own, so every call is also bounded by `tokio::time::timeout` at `backoff.deadline` + `create_topic_timeout` (the
//! retries, then one request); running out of that bound is final too. A dead or wrong-protocol broker therefore
//! fails a call within `backoff.deadline` plus one request timeout, with an error naming the endpoints. What stays
//! retryable are the errors rskafka hands back at once without retrying although they may clear up (a broker
//! asking for a retry with REQUEST_TIMED_OUT, brokers fenced while they restart): the engine retries those.
//!
//! Batches go elsewhere: [`TopicAdmin::create_topics`] and [`TopicAdmin::describe_topics`] are answered by a
//! [`BatchAdmin`] on the same config (CreateTopics of up to `[wal] create_batch_size` topics per request, and
//! Metadata requests naming the topics), since rskafka 0.6 has neither.
//!
//! Errors are classified by rskafka's error variants and Kafka's protocol error codes, never by message text.
//!
//! A topic Kafka has just created can be missing from the next metadata response for a moment (the controller
//! answers before every broker has applied the new topic). So `Created` means "the controller committed it"; a
//! caller that needs it listed polls `list_topics` (the bootstrap procedure does, once for all topics). On
//! TOPIC_ALREADY_EXISTS the admin itself polls fresh metadata until the topic shows up, since it must compare the
//! partition count before answering `AlreadyExisted`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI16, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use backon::{ExponentialBuilder, Retryable};
use rskafka::ConnectionError;
use rskafka::client::Client;
use rskafka::client::controller::ControllerClient;
use rskafka::client::error::{Error as RsKafkaError, ProtocolError, RequestError};
use snafu::{IntoError, ensure};
use tokio::time::timeout;
use tracing::debug;

use super::admin::{CreateTopicOutcome, TopicAdmin, TopicCreation};
use super::batch_admin::BatchAdmin;
use crate::wal::config::TopicConfig;
use crate::wal::config::{KafkaConfig, validate_topic_name};
use crate::wal::error::Result;
use crate::wal::error::{
    CreateTopicSnafu, InvalidReplicationFactorSnafu, InvalidWalConfigSnafu,
    KafkaBrokersFencedSnafu, KafkaConnectSnafu, KafkaRejectedTopicNameSnafu, KafkaTimeoutSnafu,
    ListTopicsSnafu, TopicNotListedSnafu, TopicPartitionMismatchSnafu,
};

/// First wait between metadata polls for a topic that was reported as existing but is not listed yet.
const LISTED_POLL_INIT: Duration = Duration::from_millis(10);
/// Longest wait between those polls.
const LISTED_POLL_MAX: Duration = Duration::from_millis(500);

/// Creates and lists topics of one Kafka cluster through rskafka.
#[derive(Debug)]
pub struct RsKafkaTopicAdmin {
    client: Client,
    /// One controller client for all calls: it caches the controller connection and multiplexes requests on it.
    controller: ControllerClient,
    endpoints: Vec<String>,
    create_topic_timeout: Duration,
    /// The bound of one call: rskafka's retries until the backoff deadline, then one request.
    call_bound: Duration,
    /// The largest replication factor a topic was created with through this admin: the cluster has shown it can
    /// place that many replicas, so a later INVALID_REPLICATION_FACTOR for at most as many is its brokers being
    /// fenced (restarting), not a factor above the broker count.
    proven_replication: AtomicI16,
    /// Batched creates and metadata reads.
    batch: BatchAdmin,
}

impl RsKafkaTopicAdmin {
    /// Validates `config`, then connects to its brokers and reads the cluster metadata.
    ///
    /// Fails within `config.backoff.deadline` + `config.create_topic_timeout` with a final (not retryable) error
    /// naming the endpoints when no broker answers, or none answers in Kafka's protocol; at once with an error
    /// naming the endpoint and the cause when a broker refuses `[wal.security]`'s TLS or SASL.
    pub async fn connect(config: &KafkaConfig) -> Result<Self> {
        config.validate()?;
        let endpoints = config.broker_endpoints.clone();
        let call_bound = config
            .backoff
            .deadline
            .saturating_add(config.create_topic_timeout);
        // rskafka retried until its deadline, so whatever ends the connect attempt is final: the engine must not
        // run the whole deadline again. A refused TLS handshake or SASL authentication is final at once.
        let client = super::partition::build_client(config, "remote-wal").await?;
        let controller = client.controller_client().map_err(|e| {
            KafkaConnectSnafu {
                endpoints: endpoints.clone(),
                retryable: is_retryable_rskafka_error(&e),
            }
            .into_error(e)
        })?;
        Ok(Self {
            client,
            controller,
            endpoints,
            create_topic_timeout: config.create_topic_timeout,
            call_bound,
            proven_replication: AtomicI16::new(0),
            batch: BatchAdmin::new(config)?,
        })
    }

    /// Polls fresh metadata until `name` shows up, then compares its partition count with `wanted`.
    ///
    /// A topic another client has just created can be missing from metadata briefly, so this polls (with `backon`'s
    /// exponential backoff) for up to `create_topic_timeout`; `outcome` is returned on a match.
    async fn await_listed(
        &self,
        name: &str,
        wanted: i32,
        outcome: CreateTopicOutcome,
    ) -> Result<CreateTopicOutcome> {
        /// One poll's answer: listed with this many partitions, not listed yet, or the listing failed.
        enum Poll {
            NotListed,
            Failed(crate::wal::Error),
        }
        let poll = || async {
            match self.list_topics().await {
                Ok(topics) => topics.get(name).copied().ok_or(Poll::NotListed),
                Err(e) => Err(Poll::Failed(e)),
            }
        };
        let backoff = ExponentialBuilder::default()
            .with_min_delay(LISTED_POLL_INIT)
            .with_max_delay(LISTED_POLL_MAX)
            .with_factor(2.0)
            .with_total_delay(Some(self.create_topic_timeout))
            .without_max_times();
        let found = match poll
            .retry(backoff)
            .when(|p| matches!(p, Poll::NotListed))
            .await
        {
            Ok(found) => found,
            Err(Poll::Failed(e)) => return Err(e),
            Err(Poll::NotListed) => {
                return TopicNotListedSnafu {
                    topic: name,
                    endpoints: self.endpoints.clone(),
                    timeout: self.create_topic_timeout,
                }
                .fail();
            }
        };
        ensure!(
            usize::try_from(wanted).is_ok_and(|w| w == found),
            TopicPartitionMismatchSnafu {
                topic: name,
                wanted,
                found,
            }
        );
        Ok(outcome)
    }
}

#[async_trait]
impl TopicAdmin for RsKafkaTopicAdmin {
    fn endpoints(&self) -> Vec<String> {
        self.endpoints.clone()
    }

    async fn list_topics(&self) -> Result<BTreeMap<String, usize>> {
        let topics = timeout(self.call_bound, self.client.list_topics())
            .await
            .map_err(|_| {
                KafkaTimeoutSnafu {
                    endpoints: self.endpoints.clone(),
                    operation: "list topics",
                    timeout: self.call_bound,
                    retryable: false,
                }
                .build()
            })?
            .map_err(|e| {
                ListTopicsSnafu {
                    endpoints: self.endpoints.clone(),
                    retryable: is_retryable_rskafka_error(&e),
                }
                .into_error(e)
            })?;
        Ok(topics
            .into_iter()
            .map(|t| (t.name, t.partitions.len()))
            .collect())
    }

    fn create_batch_size(&self) -> usize {
        self.batch.batch_size()
    }

    async fn create_topics(
        &self,
        names: &[String],
        num_partitions: i32,
        replication_factor: i16,
        topic_config: &TopicConfig,
    ) -> Result<Vec<TopicCreation>> {
        self.batch
            .create_topics(names, num_partitions, replication_factor, topic_config)
            .await
    }

    async fn describe_topics(&self, names: &[String]) -> Result<BTreeMap<String, usize>> {
        self.batch.describe_topics(names).await
    }

    async fn describe_topics_with_ids(
        &self,
        names: &[String],
    ) -> Result<BTreeMap<String, (usize, Option<crate::key::topic_name::TopicId>)>> {
        self.batch.describe_topics_with_ids(names).await
    }

    async fn describe_topics_on_each_broker(
        &self,
        names: &[String],
    ) -> Result<Vec<(String, BTreeMap<String, usize>)>> {
        self.batch.describe_topics_on_each_broker(names).await
    }

    async fn describe_topic_configs(
        &self,
        names: &[String],
        keys: &[String],
    ) -> Result<BTreeMap<String, TopicConfig>> {
        self.batch.describe_topic_configs(names, keys).await
    }

    async fn create_topic(
        &self,
        name: &str,
        num_partitions: i32,
        replication_factor: i16,
    ) -> Result<CreateTopicOutcome> {
        validate_topic_name(name)?;
        // Kafka reads -1 as "the broker's default"; the pool always asks for explicit counts.
        ensure!(
            num_partitions >= 1,
            InvalidWalConfigSnafu {
                field: "num_partitions",
                value: num_partitions.to_string(),
                reason: format!("must be at least 1 (creating topic '{name}')"),
            }
        );
        ensure!(
            replication_factor >= 1,
            InvalidWalConfigSnafu {
                field: "replication_factor",
                value: replication_factor.to_string(),
                reason: format!("must be at least 1 (creating topic '{name}')"),
            }
        );
        // Validated config keeps this in range; saturate rather than fail for a hand-built admin.
        let timeout_ms = i32::try_from(self.create_topic_timeout.as_millis()).unwrap_or(i32::MAX);
        let create =
            self.controller
                .create_topic(name, num_partitions, replication_factor, timeout_ms);
        let created = timeout(self.call_bound, create).await.map_err(|_| {
            KafkaTimeoutSnafu {
                endpoints: self.endpoints.clone(),
                operation: format!("create topic '{name}'"),
                timeout: self.call_bound,
                retryable: false,
            }
            .build()
        })?;
        match created {
            Ok(()) => {
                self.proven_replication
                    .fetch_max(replication_factor, Ordering::Relaxed);
                Ok(CreateTopicOutcome::Created)
            }
            // Success, not a failure: also after our own earlier attempt timed out on the wire and rskafka retried,
            // it counts as created once the partition count matches. Logged at debug only.
            Err(RsKafkaError::ServerError {
                protocol_error: ProtocolError::TopicAlreadyExists,
                ..
            }) => {
                debug!(topic = %name, "topic already exists; checking its partition count");
                self.await_listed(name, num_partitions, CreateTopicOutcome::AlreadyExisted)
                    .await
            }
            Err(e) => Err(create_topic_error(
                &self.endpoints,
                name,
                replication_factor,
                self.proven_replication.load(Ordering::Relaxed),
                e,
            )),
        }
    }
}

/// Maps rskafka's error for a CreateTopics request to ours, by its variant and Kafka error code (never the broker's
/// message text); TOPIC_ALREADY_EXISTS is success and handled by the caller.
///
/// `proven_replication` is the largest replication factor the cluster has already placed for this admin: an
/// INVALID_REPLICATION_FACTOR (38) for at most that many replicas means the controller has fenced the brokers while
/// they shut down or restart (transient, retryable), above it the factor exceeds the brokers (final).
pub fn create_topic_error(
    endpoints: &[String],
    name: &str,
    replication_factor: i16,
    proven_replication: i16,
    e: RsKafkaError,
) -> crate::wal::Error {
    let message = match &e {
        RsKafkaError::ServerError { error_message, .. } => {
            error_message.clone().unwrap_or_else(|| "n/a".to_string())
        }
        _ => String::new(),
    };
    let code = match &e {
        RsKafkaError::ServerError { protocol_error, .. } => Some(*protocol_error),
        _ => None,
    };
    match code {
        Some(ProtocolError::BrokerNotAvailable) => KafkaBrokersFencedSnafu {
            topic: name,
            endpoints: endpoints.to_vec(),
            message,
        }
        .into_error(e),
        Some(ProtocolError::InvalidReplicationFactor)
            if replication_factor <= proven_replication =>
        {
            KafkaBrokersFencedSnafu {
                topic: name,
                endpoints: endpoints.to_vec(),
                message,
            }
            .into_error(e)
        }
        Some(ProtocolError::InvalidReplicationFactor) => InvalidReplicationFactorSnafu {
            topic: name,
            replication_factor,
            message,
        }
        .into_error(e),
        Some(ProtocolError::InvalidTopicException) => KafkaRejectedTopicNameSnafu {
            topic: name,
            message,
        }
        .into_error(e),
        _ => {
            let retryable = is_retryable_rskafka_error(&e);
            CreateTopicSnafu {
                topic: name,
                endpoints: endpoints.to_vec(),
                retryable,
            }
            .into_error(e)
        }
    }
}

/// Whether an rskafka error may go away on its own if the same call is made again.
///
/// rskafka's own backoff already retried broken connections, unreachable brokers and controller moves until the
/// deadline: an error saying that deadline ran out ([`RsKafkaError::RetryFailed`], or a connection error of that
/// kind) is final, so the engine does not run the deadline again. Errors rskafka returns at once although they may
/// clear up (a broken connection outside its retry loop, a timeout, a broker asking to retry) are retryable. A bad
/// name, replication factor or request is not.
pub fn is_retryable_rskafka_error(e: &RsKafkaError) -> bool {
    match e {
        RsKafkaError::RetryFailed(_) => false,
        RsKafkaError::Connection(c) => !matches!(c, ConnectionError::RetryFailed(_)),
        RsKafkaError::Timeout => true,
        RsKafkaError::Request(r) => matches!(r, RequestError::IO(_) | RequestError::Poisoned(_)),
        RsKafkaError::ServerError { protocol_error, .. } => matches!(
            protocol_error,
            ProtocolError::NotController
                | ProtocolError::RequestTimedOut
                | ProtocolError::LeaderNotAvailable
                | ProtocolError::NotLeaderOrFollower
                | ProtocolError::BrokerNotAvailable
                | ProtocolError::NetworkException
                | ProtocolError::StaleControllerEpoch
                | ProtocolError::ThrottlingQuotaExceeded
        ),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use rskafka::client::error::RequestContext;

    use super::*;

    fn server_error(protocol_error: ProtocolError) -> RsKafkaError {
        RsKafkaError::ServerError {
            protocol_error,
            error_message: Some("broker says no".to_string()),
            request: RequestContext::Topic("t".to_string()),
            response: None,
            is_virtual: false,
        }
    }

    #[test]
    fn controller_moves_and_timeouts_are_retryable() {
        for p in [ProtocolError::NotController, ProtocolError::RequestTimedOut] {
            assert!(is_retryable_rskafka_error(&server_error(p)), "{p:?}");
        }
        assert!(is_retryable_rskafka_error(&RsKafkaError::Timeout));
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert!(is_retryable_rskafka_error(&RsKafkaError::Request(
            RequestError::IO(io)
        )));
    }

    #[test]
    fn an_exhausted_backoff_deadline_is_final() {
        let exhausted = || rskafka::BackoffError::DeadlineExceded {
            deadline: Duration::from_secs(3),
            source: "connection refused".into(),
        };
        assert!(!is_retryable_rskafka_error(&RsKafkaError::RetryFailed(
            exhausted()
        )));
        assert!(!is_retryable_rskafka_error(&RsKafkaError::Connection(
            ConnectionError::RetryFailed(exhausted())
        )));
    }

    #[test]
    fn bad_requests_are_not_retryable() {
        for p in [
            ProtocolError::InvalidReplicationFactor,
            ProtocolError::InvalidTopicException,
            ProtocolError::TopicAlreadyExists,
            ProtocolError::InvalidPartitions,
            ProtocolError::InvalidRequest,
        ] {
            assert!(!is_retryable_rskafka_error(&server_error(p)), "{p:?}");
        }
        assert!(!is_retryable_rskafka_error(&RsKafkaError::InvalidResponse(
            "x".to_string()
        )));
    }

    #[test]
    fn crate_errors_carry_retryability() {
        let timeout = KafkaTimeoutSnafu {
            endpoints: vec!["k:9092".to_string()],
            operation: "create topic 't'",
            timeout: Duration::from_secs(1),
            retryable: true,
        }
        .build();
        assert!(timeout.is_retryable());
        let mismatch = TopicPartitionMismatchSnafu {
            topic: "t",
            wanted: 1,
            found: 3usize,
        }
        .build();
        assert!(!mismatch.is_retryable());
        let rf = InvalidReplicationFactorSnafu {
            topic: "t",
            replication_factor: 3i16,
            message: "m",
        }
        .into_error(server_error(ProtocolError::InvalidReplicationFactor));
        assert!(!rf.is_retryable());
        let net = CreateTopicSnafu {
            topic: "t",
            endpoints: vec!["k:9092".to_string()],
            retryable: is_retryable_rskafka_error(&server_error(ProtocolError::NotController)),
        }
        .into_error(server_error(ProtocolError::NotController));
        assert!(net.is_retryable());
        let bad_name = validate_topic_name("a b").unwrap_err();
        assert!(!bad_name.is_retryable());
    }
}
