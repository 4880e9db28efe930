//! [`RsKafkaTopicAdmin`]: the [`TopicAdmin`] over rskafka 0.6.
//!
//! rskafka retries connection and controller errors with its backoff, which by default never gives up; here the
//! backoff always has the configured deadline, and every call is also bounded by `tokio::time::timeout`, so a dead
//! or black-holed broker turns into an error naming the endpoints instead of a hang:
//! - connecting: rskafka gives up at `backoff.deadline` (its error names the cause, e.g. connection refused); a
//!   hang is cut at `backoff.deadline` + [`CALL_MARGIN`];
//! - creating a topic: bounded by `create_topic_timeout` + [`CALL_MARGIN`] (the broker itself gets
//!   `create_topic_timeout`);
//! - listing topics: bounded by `create_topic_timeout` + [`CALL_MARGIN`].
//!
//! A topic Kafka has just created can be missing from the next metadata response for a moment (the controller
//! answers before every broker has applied the new topic). So `Created` means "the controller committed it"; a
//! caller that needs it listed polls `list_topics` (the bootstrap procedure does, once for all topics). On
//! TOPIC_ALREADY_EXISTS the admin itself polls fresh metadata until the topic shows up, since it must compare the
//! partition count before answering `AlreadyExisted`.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use rskafka::BackoffConfig as RsBackoffConfig;
use rskafka::client::controller::ControllerClient;
use rskafka::client::error::{Error as RsKafkaError, ProtocolError, RequestError};
use rskafka::client::{Client, ClientBuilder};
use snafu::{IntoError, ResultExt, ensure};
use tokio::time::{Instant, sleep, timeout};

use super::admin::{CreateTopicOutcome, TopicAdmin};
use crate::error::{
    CreateTopicSnafu, InvalidReplicationFactorSnafu, InvalidWalConfigSnafu,
    KafkaBrokersFencedSnafu, KafkaConnectSnafu, KafkaRejectedTopicNameSnafu, KafkaTimeoutSnafu,
    ListTopicsSnafu, Result, TopicNotListedSnafu, TopicPartitionMismatchSnafu,
};
use crate::wal::config::{KafkaConfig, validate_topic_name};

/// Time allowed on top of the broker-side create timeout for the round trip and rskafka's metadata refresh.
pub const CALL_MARGIN: Duration = Duration::from_secs(5);

/// First wait between metadata polls for a topic that was created (or reported existing) but is not listed yet.
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
}

impl RsKafkaTopicAdmin {
    /// Validates `config`, then connects to its brokers and reads the cluster metadata.
    ///
    /// Fails about `config.backoff.deadline` after the start (at most [`CALL_MARGIN`] later) with an error naming
    /// the endpoints when no broker answers.
    pub async fn connect(config: &KafkaConfig) -> Result<Self> {
        config.validate()?;
        let endpoints = config.broker_endpoints.clone();
        let backoff = RsBackoffConfig {
            init_backoff: config.backoff.init,
            max_backoff: config.backoff.max,
            base: config.backoff.base,
            deadline: Some(config.backoff.deadline),
        };
        let build = ClientBuilder::new(endpoints.clone())
            .client_id("remote-wal")
            .backoff_config(backoff)
            .build();
        // rskafka stops retrying at the deadline with an error saying why; the outer timeout only catches a hang,
        // so it must not race that error.
        let connect_timeout = config.backoff.deadline.saturating_add(CALL_MARGIN);
        let client = timeout(connect_timeout, build)
            .await
            .map_err(|_| {
                KafkaTimeoutSnafu {
                    endpoints: endpoints.clone(),
                    operation: "connect",
                    timeout: connect_timeout,
                }
                .build()
            })?
            .context(KafkaConnectSnafu {
                endpoints: endpoints.clone(),
            })?;
        let controller = client.controller_client().context(KafkaConnectSnafu {
            endpoints: endpoints.clone(),
        })?;
        Ok(Self {
            client,
            controller,
            endpoints,
            create_topic_timeout: config.create_topic_timeout,
        })
    }

    fn call_timeout(&self) -> Duration {
        self.create_topic_timeout + CALL_MARGIN
    }

    /// Polls fresh metadata until `name` shows up, then compares its partition count with `wanted`.
    ///
    /// A topic another client has just created can be missing from metadata briefly, so this polls for up to
    /// `create_topic_timeout`; `outcome` is returned on a match.
    async fn await_listed(
        &self,
        name: &str,
        wanted: i32,
        outcome: CreateTopicOutcome,
    ) -> Result<CreateTopicOutcome> {
        let give_up_at = Instant::now() + self.create_topic_timeout;
        let mut wait = LISTED_POLL_INIT;
        loop {
            if let Some(&found) = self.list_topics().await?.get(name) {
                ensure!(
                    usize::try_from(wanted).is_ok_and(|w| w == found),
                    TopicPartitionMismatchSnafu {
                        topic: name,
                        wanted,
                        found,
                    }
                );
                return Ok(outcome);
            }
            ensure!(
                Instant::now() + wait <= give_up_at,
                TopicNotListedSnafu {
                    topic: name,
                    endpoints: self.endpoints.clone(),
                    timeout: self.create_topic_timeout,
                }
            );
            sleep(wait).await;
            wait = (wait * 2).min(LISTED_POLL_MAX);
        }
    }

    /// Maps rskafka's create error to ours; TOPIC_ALREADY_EXISTS is handled by the caller.
    fn create_error(&self, name: &str, replication_factor: i16, e: RsKafkaError) -> crate::Error {
        let message = match &e {
            RsKafkaError::ServerError { error_message, .. } => {
                error_message.clone().unwrap_or_else(|| "n/a".to_string())
            }
            _ => String::new(),
        };
        match &e {
            // A broker that is shutting down or restarting is fenced by the controller, which then refuses every
            // replica placement with this code: transient, unlike a replication factor above the broker count.
            RsKafkaError::ServerError {
                protocol_error: ProtocolError::InvalidReplicationFactor,
                ..
            } if message.contains("fenced") => KafkaBrokersFencedSnafu {
                topic: name,
                endpoints: self.endpoints.clone(),
                message,
            }
            .into_error(e),
            RsKafkaError::ServerError {
                protocol_error: ProtocolError::InvalidReplicationFactor,
                ..
            } => InvalidReplicationFactorSnafu {
                topic: name,
                replication_factor,
                message,
            }
            .into_error(e),
            RsKafkaError::ServerError {
                protocol_error: ProtocolError::InvalidTopicException,
                ..
            } => KafkaRejectedTopicNameSnafu {
                topic: name,
                message,
            }
            .into_error(e),
            _ => CreateTopicSnafu {
                topic: name,
                endpoints: self.endpoints.clone(),
            }
            .into_error(e),
        }
    }
}

#[async_trait]
impl TopicAdmin for RsKafkaTopicAdmin {
    fn endpoints(&self) -> Vec<String> {
        self.endpoints.clone()
    }

    async fn list_topics(&self) -> Result<BTreeMap<String, usize>> {
        let topics = timeout(self.call_timeout(), self.client.list_topics())
            .await
            .map_err(|_| {
                KafkaTimeoutSnafu {
                    endpoints: self.endpoints.clone(),
                    operation: "list topics",
                    timeout: self.call_timeout(),
                }
                .build()
            })?
            .context(ListTopicsSnafu {
                endpoints: self.endpoints.clone(),
            })?;
        Ok(topics
            .into_iter()
            .map(|t| (t.name, t.partitions.len()))
            .collect())
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
        let created = timeout(self.call_timeout(), create).await.map_err(|_| {
            KafkaTimeoutSnafu {
                endpoints: self.endpoints.clone(),
                operation: format!("create topic '{name}'"),
                timeout: self.call_timeout(),
            }
            .build()
        })?;
        match created {
            Ok(()) => Ok(CreateTopicOutcome::Created),
            // Also after our own earlier attempt timed out on the wire and rskafka retried: it counts as created
            // once the partition count matches.
            Err(RsKafkaError::ServerError {
                protocol_error: ProtocolError::TopicAlreadyExists,
                ..
            }) => {
                self.await_listed(name, num_partitions, CreateTopicOutcome::AlreadyExisted)
                    .await
            }
            Err(e) => Err(self.create_error(name, replication_factor, e)),
        }
    }
}

/// Whether an rskafka error may go away on its own: a broker unreachable or restarting, a timeout, the controller
/// moving. A bad name, replication factor or request does not.
pub fn is_retryable_rskafka_error(e: &RsKafkaError) -> bool {
    match e {
        RsKafkaError::Connection(_) | RsKafkaError::Timeout => true,
        RsKafkaError::Request(r) => matches!(r, RequestError::IO(_) | RequestError::Poisoned(_)),
        // rskafka retries only retryable errors; running out of its deadline leaves them retryable.
        RsKafkaError::RetryFailed(_) => true,
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
            operation: "connect",
            timeout: Duration::from_secs(1),
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
        }
        .into_error(server_error(ProtocolError::NotController));
        assert!(net.is_retryable());
        let bad_name = validate_topic_name("a b").unwrap_err();
        assert!(!bad_name.is_retryable());
    }
}
