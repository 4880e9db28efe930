//! [`BatchAdmin`]: batched CreateTopics and Metadata requests, spoken with the `kafka-protocol` crate's encoders.
//!
//! rskafka 0.6 creates one topic per request and has no way to ask for some topics' metadata, so the topic pool's
//! bulk work goes through this small client; rskafka keeps producing and fetching. Requests go to any reachable
//! bootstrap broker: in KRaft a broker forwards CreateTopics to the active controller, so the admin never needs to
//! know where the controller is.
//!
//! **Bounds and the one retry authority.** Connecting is retried here, with the configured `[wal.backoff]`, until
//! `backoff.deadline`: each attempt tries every endpoint with a connect timeout. When the deadline runs out the
//! error is final (not retryable), as is a request that gets no complete answer within its request timeout
//! (`create_topic_timeout` plus a margin), or an answer that cannot be decoded. A connection that breaks while a
//! request is in flight is retryable: the engine's step retry sends the batch again, and the topics it already
//! created answer TOPIC_ALREADY_EXISTS. Per-topic error codes are mapped by the same function as the rskafka
//! admin's errors ([`create_topic_error`]), so their text and retryability are the same.
//!
//! **Security.** Each connection is opened by [`connection::open`]: TLS and SASL as `[wal.security]` says. A broker
//! refusing the TLS handshake or the authentication is a final [`crate::wal::Error::KafkaSecurity`] naming the endpoint
//! and the cause, returned at once: it is not retried with the backoff, since the same settings get the same answer.
//!
//! **Throttling.** A response's `throttle_time_ms` is honoured: the next request waits until it has passed.
//!
//! **Already exists.** TOPIC_ALREADY_EXISTS (36) answers are checked together: one Metadata request for all of them
//! (polled while some are not listed yet, up to `create_topic_timeout`), then each partition count is compared.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI16, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, CreateTopicsRequest, CreateTopicsResponse, DescribeConfigsRequest,
    DescribeConfigsResponse, MetadataRequest, MetadataResponse, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use rskafka::client::error::{Error as RsKafkaError, ProtocolError, RequestContext};
use snafu::{IntoError, ensure};
use tokio::time::{Instant, timeout};
use tracing::debug;

use super::admin::{CreateTopicOutcome, TopicCreation};
use super::connection::{self, BrokerStream, OpenFailure};
use super::rskafka_admin::create_topic_error;
use super::security::ClientSecurity;
use crate::key::topic_name::TopicId;
use crate::wal::config::{
    KafkaConfig, TopicConfig, validate_topic_config_entry, validate_topic_name,
};
use crate::wal::error::Result;
use crate::wal::error::{
    InvalidWalConfigSnafu, KafkaConnectSnafu, KafkaRequestSnafu, KafkaTimeoutSnafu,
    TopicNotListedSnafu, TopicPartitionMismatchSnafu,
};

/// The CreateTopics version sent (flexible; Kafka 4.x accepts 2–7).
const CREATE_TOPICS_VERSION: i16 = 5;
/// The Metadata version sent (flexible, names topics by name and answers their topic ids; Kafka 4.x accepts 4–13).
const METADATA_VERSION: i16 = 10;
/// The DescribeConfigs version sent (flexible; Kafka 4.x accepts 1–4).
const DESCRIBE_CONFIGS_VERSION: i16 = 4;
/// DescribeConfigs' resource type of a topic.
const TOPIC_RESOURCE: i8 = 2;
/// Topics named in one Metadata request: a pool of 100,000 topics takes 10 requests.
pub const METADATA_TOPICS_PER_REQUEST: usize = 10_000;
/// The longest a TCP connect to one endpoint may take.
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Added to `create_topic_timeout` (the broker's own bound) for the answer to travel back.
const REQUEST_MARGIN: Duration = Duration::from_secs(5);
/// First wait between metadata polls for topics reported as existing but not listed yet.
const LISTED_POLL_INIT: Duration = Duration::from_millis(10);
/// Longest wait between those polls.
const LISTED_POLL_MAX: Duration = Duration::from_millis(500);
/// Kafka's UNKNOWN_TOPIC_OR_PARTITION: the topic does not exist.
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
/// Kafka's TOPIC_ALREADY_EXISTS.
const TOPIC_ALREADY_EXISTS: i16 = 36;

/// Batched topic creation and metadata reads against a Kafka cluster's brokers.
#[derive(Debug)]
pub struct BatchAdmin {
    endpoints: Vec<String>,
    create_topic_timeout: Duration,
    connect_timeout: Duration,
    request_timeout: Duration,
    backoff: crate::wal::config::BackoffConfig,
    batch_size: usize,
    correlation: AtomicI32,
    /// No request is sent before this instant (the broker's last `throttle_time_ms`).
    throttled_until: Mutex<Option<Instant>>,
    /// The largest replication factor placed through this admin; see [`create_topic_error`].
    proven_replication: AtomicI16,
    /// TLS and SASL of every connection (`[wal.security]`, loaded).
    security: Arc<ClientSecurity>,
}

/// A whole-request failure, before it is turned into the crate's error.
enum Failure {
    /// No endpoint accepted a connection.
    Connect(String),
    /// A broker refused the TLS handshake or the SASL authentication: final, never retried.
    Refused(crate::wal::Error),
    /// The request failed on an open connection to `broker`.
    Request {
        broker: String,
        reason: String,
        retryable: bool,
    },
}

impl BatchAdmin {
    /// An admin for `config`'s brokers (validated, `[wal.security]`'s files read); it connects per request, so
    /// building it sends nothing.
    pub fn new(config: &KafkaConfig) -> Result<Self> {
        config.validate()?;
        let security = Arc::new(config.security.load()?);
        Ok(Self {
            security,
            endpoints: config.broker_endpoints.clone(),
            create_topic_timeout: config.create_topic_timeout,
            connect_timeout: config.create_topic_timeout.min(MAX_CONNECT_TIMEOUT),
            request_timeout: config.create_topic_timeout.saturating_add(REQUEST_MARGIN),
            backoff: config.backoff.clone(),
            batch_size: config.create_batch_size,
            correlation: AtomicI32::new(0),
            throttled_until: Mutex::new(None),
            proven_replication: AtomicI16::new(0),
        })
    }

    /// The most topics one [`BatchAdmin::create_topics`] call sends in one request (`[wal] create_batch_size`).
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Creates `names` with CreateTopics requests of at most [`BatchAdmin::batch_size`] topics each, and answers
    /// per topic: created; already existing with `num_partitions` partitions; or the error naming the topic, the
    /// code's name and the broker's message.
    pub async fn create_topics(
        &self,
        names: &[String],
        num_partitions: i32,
        replication_factor: i16,
        topic_config: &TopicConfig,
    ) -> Result<Vec<TopicCreation>> {
        for name in names {
            validate_topic_name(name)?;
        }
        for (key, value) in topic_config {
            validate_topic_config_entry(key, value)?;
        }
        ensure!(
            num_partitions >= 1,
            InvalidWalConfigSnafu {
                field: "num_partitions",
                value: num_partitions.to_string(),
                reason: "must be at least 1",
            }
        );
        ensure!(
            replication_factor >= 1,
            InvalidWalConfigSnafu {
                field: "replication_factor",
                value: replication_factor.to_string(),
                reason: "must be at least 1",
            }
        );
        let mut answers = Vec::with_capacity(names.len());
        for batch in names.chunks(self.batch_size.max(1)) {
            answers.extend(
                self.create_batch(batch, num_partitions, replication_factor, topic_config)
                    .await?,
            );
        }
        Ok(answers)
    }

    /// One CreateTopics request for `batch`, each topic with the configs `topic_config`.
    async fn create_batch(
        &self,
        batch: &[String],
        num_partitions: i32,
        replication_factor: i16,
        topic_config: &TopicConfig,
    ) -> Result<Vec<TopicCreation>> {
        let configs: Vec<CreatableTopicConfig> = topic_config
            .iter()
            .map(|(key, value)| {
                CreatableTopicConfig::default()
                    .with_name(StrBytes::from_string(key.clone()))
                    .with_value(Some(StrBytes::from_string(value.clone())))
            })
            .collect();
        // Validated config keeps this in range; saturate rather than fail for a hand-built admin.
        let timeout_ms = i32::try_from(self.create_topic_timeout.as_millis()).unwrap_or(i32::MAX);
        let request = CreateTopicsRequest::default()
            .with_timeout_ms(timeout_ms)
            .with_topics(
                batch
                    .iter()
                    .map(|name| {
                        CreatableTopic::default()
                            .with_name(TopicName(StrBytes::from_string(name.clone())))
                            .with_num_partitions(num_partitions)
                            .with_replication_factor(replication_factor)
                            .with_configs(configs.clone())
                    })
                    .collect(),
            );
        let operation = describe_batch("CreateTopics", batch);
        let response: CreateTopicsResponse = self
            .round_trip(
                &request,
                ApiKey::CreateTopics,
                CREATE_TOPICS_VERSION,
                &operation,
            )
            .await?;
        let mut by_name: BTreeMap<String, (i16, Option<String>)> = response
            .topics
            .into_iter()
            .map(|t| {
                (
                    t.name.0.as_str().to_string(),
                    (
                        t.error_code,
                        t.error_message.map(|m| m.as_str().to_string()),
                    ),
                )
            })
            .collect();
        let mut answers = Vec::with_capacity(batch.len());
        let mut existing = Vec::new();
        for name in batch {
            let outcome = match by_name.remove(name) {
                Some((0, _)) => {
                    self.proven_replication
                        .fetch_max(replication_factor, Ordering::Relaxed);
                    Ok(CreateTopicOutcome::Created)
                }
                Some((TOPIC_ALREADY_EXISTS, _)) => {
                    existing.push(name.clone());
                    continue;
                }
                Some((code, message)) => {
                    Err(self.topic_error(name, replication_factor, code, message))
                }
                None => Err(KafkaRequestSnafu {
                    broker: self.endpoints.join(","),
                    endpoints: self.endpoints.clone(),
                    operation: operation.clone(),
                    reason: format!("the answer does not mention topic '{name}'"),
                    retryable: false,
                }
                .build()),
            };
            answers.push((name.clone(), outcome));
        }
        if !existing.is_empty() {
            debug!(
                topics = existing.len(),
                "topics already exist; checking their partition counts"
            );
            answers.extend(self.check_existing(&existing, num_partitions).await?);
        }
        Ok(answers)
    }

    /// Our error for a per-topic error `code`: the same mapping as the rskafka admin's (the code's name, the
    /// broker's message, retryability by code).
    fn topic_error(
        &self,
        name: &str,
        replication_factor: i16,
        code: i16,
        message: Option<String>,
    ) -> crate::wal::Error {
        let protocol_error = ProtocolError::new(code).unwrap_or(ProtocolError::UnknownServerError);
        create_topic_error(
            &self.endpoints,
            name,
            replication_factor,
            self.proven_replication.load(Ordering::Relaxed),
            RsKafkaError::ServerError {
                protocol_error,
                error_message: message,
                request: RequestContext::Topic(name.to_string()),
                response: None,
                is_virtual: false,
            },
        )
    }

    /// Answers for topics Kafka said already exist: polls metadata until all are listed (up to
    /// `create_topic_timeout`), then compares each partition count with `wanted`.
    async fn check_existing(&self, names: &[String], wanted: i32) -> Result<Vec<TopicCreation>> {
        /// One poll's answer: some topics are not listed yet, or the read failed.
        enum Poll {
            NotListed(BTreeMap<String, usize>),
            Failed(crate::wal::Error),
        }
        let poll = || async {
            match self.describe_topics(names).await {
                Ok(found) if found.len() == names.len() => Ok(found),
                Ok(found) => Err(Poll::NotListed(found)),
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
            .when(|p| matches!(p, Poll::NotListed(_)))
            .await
        {
            Ok(found) => found,
            Err(Poll::Failed(e)) => return Err(e),
            Err(Poll::NotListed(found)) => found,
        };
        Ok(names
            .iter()
            .map(|name| {
                let outcome = match found.get(name) {
                    Some(&count) if usize::try_from(wanted).is_ok_and(|w| w == count) => {
                        Ok(CreateTopicOutcome::AlreadyExisted)
                    }
                    Some(&count) => TopicPartitionMismatchSnafu {
                        topic: name.as_str(),
                        wanted,
                        found: count,
                    }
                    .fail(),
                    None => TopicNotListedSnafu {
                        topic: name.as_str(),
                        endpoints: self.endpoints.clone(),
                        timeout: self.create_topic_timeout,
                    }
                    .fail(),
                };
                (name.clone(), outcome)
            })
            .collect())
    }

    /// Those of `names` that exist, with their partition counts, from Metadata requests naming at most
    /// [`METADATA_TOPICS_PER_REQUEST`] topics each (one request for a pool up to that size). Internal topics and
    /// topics Kafka does not know are left out; so is a topic whose partitions are not assigned yet (it is not
    /// usable yet).
    pub async fn describe_topics(&self, names: &[String]) -> Result<BTreeMap<String, usize>> {
        Ok(self
            .describe_topics_with_ids(names)
            .await?
            .into_iter()
            .map(|(name, (partitions, _))| (name, partitions))
            .collect())
    }

    /// [`BatchAdmin::describe_topics`] with each topic's id (Metadata v10 and later carry it; the nil UUID, which
    /// a broker answers when it has none, is `None`).
    pub async fn describe_topics_with_ids(
        &self,
        names: &[String],
    ) -> Result<BTreeMap<String, (usize, Option<TopicId>)>> {
        let mut found = BTreeMap::new();
        for chunk in names.chunks(METADATA_TOPICS_PER_REQUEST) {
            let request = MetadataRequest::default().with_topics(Some(
                chunk
                    .iter()
                    .map(|name| {
                        MetadataRequestTopic::default()
                            .with_name(Some(TopicName(StrBytes::from_string(name.clone()))))
                    })
                    .collect(),
            ));
            let operation = describe_batch("Metadata", chunk);
            let response: MetadataResponse = self
                .round_trip(&request, ApiKey::Metadata, METADATA_VERSION, &operation)
                .await?;
            for topic in response.topics {
                let Some(name) = topic.name else { continue };
                if topic.is_internal || topic.error_code == UNKNOWN_TOPIC_OR_PARTITION {
                    continue;
                }
                if topic.error_code != 0 || topic.partitions.is_empty() {
                    debug!(topic = %name.0.as_str(), code = topic.error_code, "topic listed without partitions yet");
                    continue;
                }
                let id = Some(TopicId(topic.topic_id.as_u128())).filter(|id| id.0 != 0);
                found.insert(name.0.as_str().to_string(), (topic.partitions.len(), id));
            }
        }
        Ok(found)
    }

    /// [`BatchAdmin::describe_topics`] asked of each endpoint alone (see
    /// [`super::admin::TopicAdmin::describe_topics_on_each_broker`]).
    pub async fn describe_topics_on_each_broker(
        &self,
        names: &[String],
    ) -> Result<Vec<(String, BTreeMap<String, usize>)>> {
        let mut listed = Vec::with_capacity(self.endpoints.len());
        for endpoint in &self.endpoints {
            let alone = BatchAdmin {
                endpoints: vec![endpoint.clone()],
                create_topic_timeout: self.create_topic_timeout,
                connect_timeout: self.connect_timeout,
                request_timeout: self.request_timeout,
                backoff: self.backoff.clone(),
                batch_size: self.batch_size,
                correlation: AtomicI32::new(0),
                throttled_until: Mutex::new(None),
                proven_replication: AtomicI16::new(0),
                security: Arc::clone(&self.security),
            };
            listed.push((endpoint.clone(), alone.describe_topics(names).await?));
        }
        Ok(listed)
    }

    /// The current values of the configs `keys` of each topic of `names`, from DescribeConfigs requests naming at
    /// most [`METADATA_TOPICS_PER_REQUEST`] topics each. A topic Kafka does not know is left out; a config with no
    /// value (a sensitive one) is absent from its topic's map; any other per-topic error code is an error naming
    /// the topic, the code's name and the broker's message.
    pub async fn describe_topic_configs(
        &self,
        names: &[String],
        keys: &[String],
    ) -> Result<BTreeMap<String, TopicConfig>> {
        let mut found = BTreeMap::new();
        for chunk in names.chunks(METADATA_TOPICS_PER_REQUEST) {
            let request = DescribeConfigsRequest::default().with_resources(
                chunk
                    .iter()
                    .map(|name| {
                        DescribeConfigsResource::default()
                            .with_resource_type(TOPIC_RESOURCE)
                            .with_resource_name(StrBytes::from_string(name.clone()))
                            .with_configuration_keys(Some(
                                keys.iter()
                                    .map(|k| StrBytes::from_string(k.clone()))
                                    .collect(),
                            ))
                    })
                    .collect(),
            );
            let operation = describe_batch("DescribeConfigs", chunk);
            let response: DescribeConfigsResponse = self
                .round_trip(
                    &request,
                    ApiKey::DescribeConfigs,
                    DESCRIBE_CONFIGS_VERSION,
                    &operation,
                )
                .await?;
            for result in response.results {
                let topic = result.resource_name.as_str().to_string();
                match result.error_code {
                    0 => {}
                    UNKNOWN_TOPIC_OR_PARTITION => continue,
                    code => {
                        let name = ProtocolError::new(code)
                            .map_or_else(|| format!("error code {code}"), |e| e.to_string());
                        return KafkaRequestSnafu {
                            broker: self.endpoints.join(","),
                            endpoints: self.endpoints.clone(),
                            operation: format!("DescribeConfigs of topic '{topic}'"),
                            reason: format!(
                                "{name}: {}",
                                result
                                    .error_message
                                    .as_ref()
                                    .map_or("no message", |m| m.as_str())
                            ),
                            retryable: false,
                        }
                        .fail();
                    }
                }
                let configs: TopicConfig = result
                    .configs
                    .into_iter()
                    .filter_map(|c| {
                        c.value
                            .map(|v| (c.name.as_str().to_string(), v.as_str().to_string()))
                    })
                    .collect();
                found.insert(topic, configs);
            }
        }
        Ok(found)
    }

    /// Sends `request` at `version` to a broker and reads its answer, within the bounds described in the module
    /// documentation.
    async fn round_trip<Req, Resp>(
        &self,
        request: &Req,
        api: ApiKey,
        version: i16,
        operation: &str,
    ) -> Result<Resp>
    where
        Req: Encodable + HeaderVersion + Sync,
        Resp: Decodable + HeaderVersion + ThrottleTime + Send,
    {
        self.wait_for_throttle().await;
        let attempt = || async {
            let (mut stream, broker) = self.connect_any().await?;
            let correlation_id = self.correlation.fetch_add(1, Ordering::Relaxed);
            let exchanged = timeout(
                self.request_timeout,
                connection::exchange::<Req, Resp, _>(
                    &mut stream,
                    correlation_id,
                    request,
                    api,
                    version,
                ),
            )
            .await;
            match exchanged {
                Ok(Ok(response)) => Ok(response),
                Ok(Err((reason, retryable))) => Err(Failure::Request {
                    broker,
                    reason,
                    retryable,
                }),
                Err(_) => Err(Failure::Request {
                    broker,
                    reason: format!("no answer within {:?}", self.request_timeout),
                    retryable: false,
                }),
            }
        };
        let backoff = ExponentialBuilder::default()
            .with_min_delay(self.backoff.init)
            .with_max_delay(self.backoff.max)
            .with_factor(self.backoff.base as f32)
            .with_total_delay(Some(self.backoff.deadline))
            .without_max_times();
        // The backoff counts only its sleeps; this bounds the connect attempts too.
        let bound = self.backoff.deadline.saturating_add(self.request_timeout);
        let answered = timeout(
            bound,
            attempt
                .retry(backoff)
                .when(|f| matches!(f, Failure::Connect(_))),
        )
        .await
        .map_err(|_| {
            KafkaTimeoutSnafu {
                endpoints: self.endpoints.clone(),
                operation: operation.to_string(),
                timeout: bound,
                retryable: false,
            }
            .build()
        })?;
        match answered {
            Ok(response) => {
                self.note_throttle(response.throttle_time_ms());
                Ok(response)
            }
            Err(Failure::Refused(e)) => Err(e),
            // The backoff deadline ran out: final, the engine must not run it again.
            Err(Failure::Connect(reason)) => Err(KafkaConnectSnafu {
                endpoints: self.endpoints.clone(),
                retryable: false,
            }
            .into_error(RsKafkaError::RetryFailed(
                rskafka::BackoffError::DeadlineExceded {
                    deadline: self.backoff.deadline,
                    source: reason.into(),
                },
            ))),
            Err(Failure::Request {
                broker,
                reason,
                retryable,
            }) if reason.starts_with("no answer within") => {
                debug!(%broker, %operation, "request timed out");
                Err(KafkaTimeoutSnafu {
                    endpoints: self.endpoints.clone(),
                    operation: format!("{operation} to {broker}"),
                    timeout: self.request_timeout,
                    retryable,
                }
                .build())
            }
            Err(Failure::Request {
                broker,
                reason,
                retryable,
            }) => Err(KafkaRequestSnafu {
                broker,
                endpoints: self.endpoints.clone(),
                operation,
                reason,
                retryable,
            }
            .build()),
        }
    }

    /// Opens a connection (TCP, then TLS and SASL as `[wal.security]` says) to the first endpoint that accepts
    /// one within the connect timeout. A refused handshake or authentication ends the search at once: the
    /// brokers of one cluster share their security settings.
    async fn connect_any(&self) -> std::result::Result<(BrokerStream, String), Failure> {
        let mut reasons = Vec::new();
        for endpoint in &self.endpoints {
            match connection::open(endpoint, &self.security, self.connect_timeout).await {
                Ok(stream) => return Ok((stream, endpoint.clone())),
                Err(OpenFailure::Unreachable(reason)) => reasons.push(reason),
                Err(OpenFailure::Refused(e)) => return Err(Failure::Refused(e)),
            }
        }
        Err(Failure::Connect(reasons.join("; ")))
    }

    /// Sleeps until the broker's last throttle has passed.
    async fn wait_for_throttle(&self) {
        let until = *self
            .throttled_until
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(until) = until {
            tokio::time::sleep_until(until).await;
        }
    }

    /// Remembers a broker's `throttle_time_ms` for the next request.
    fn note_throttle(&self, throttle_ms: i32) {
        if throttle_ms <= 0 {
            return;
        }
        let until = Instant::now() + Duration::from_millis(u64::from(throttle_ms.unsigned_abs()));
        debug!(throttle_ms, "the broker throttles this client");
        let mut slot = self
            .throttled_until
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        *slot = Some(slot.map_or(until, |u| u.max(until)));
    }
}

/// A response's `throttle_time_ms`.
pub trait ThrottleTime {
    /// How long the broker asks this client to wait before its next request, in milliseconds.
    fn throttle_time_ms(&self) -> i32;
}

impl ThrottleTime for CreateTopicsResponse {
    fn throttle_time_ms(&self) -> i32 {
        self.throttle_time_ms
    }
}

impl ThrottleTime for DescribeConfigsResponse {
    fn throttle_time_ms(&self) -> i32 {
        self.throttle_time_ms
    }
}

impl ThrottleTime for MetadataResponse {
    fn throttle_time_ms(&self) -> i32 {
        self.throttle_time_ms
    }
}

/// `{api} of {n} topic(s) ({first} … {last})`, for error messages.
fn describe_batch(api: &str, names: &[String]) -> String {
    match names {
        [] => format!("{api} of no topic"),
        [one] => format!("{api} of topic '{one}'"),
        [first, .., last] => format!("{api} of {} topic(s) ('{first}' … '{last}')", names.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_named_by_its_ends() {
        let names: Vec<String> = (0..3).map(|i| format!("wal_{i}")).collect();
        assert_eq!(
            describe_batch("CreateTopics", &names),
            "CreateTopics of 3 topic(s) ('wal_0' … 'wal_2')"
        );
        assert_eq!(
            describe_batch("Metadata", &names[..1]),
            "Metadata of topic 'wal_0'"
        );
    }

    #[test]
    fn a_rejected_batch_size_names_the_key() {
        for bad in [0, MAX_CREATE_BATCH_SIZE + 1] {
            let config = KafkaConfig {
                create_batch_size: bad,
                ..KafkaConfig::default()
            };
            let err = BatchAdmin::new(&config).unwrap_err().to_string();
            assert!(err.contains("create_batch_size"), "{err}");
            assert!(err.contains(&bad.to_string()), "{err}");
        }
    }

    #[tokio::test]
    async fn an_unknown_error_code_names_the_topic_the_code_and_the_message() {
        let admin = BatchAdmin::new(&KafkaConfig::default()).unwrap();
        let err = admin
            .topic_error("wal_3", 1, 40, Some("Invalid config value".to_string()))
            .to_string();
        assert!(err.contains("wal_3"), "{err}");
        assert!(err.contains("InvalidConfig"), "{err}");
        assert!(err.contains("Invalid config value"), "{err}");
    }

    use crate::wal::config::MAX_CREATE_BATCH_SIZE;
}
