//! [`FakeTopicAdmin`]: the one in-memory Kafka cluster of the tests and benchmarks (only with the `testing` feature).
//!
//! It answers as [`RsKafkaTopicAdmin`](super::rskafka_admin::RsKafkaTopicAdmin) does in the same situation, with
//! the same error kinds and retryability: a topic that exists is `AlreadyExisted` when its partition count matches
//! and [`Error::TopicPartitionMismatch`](crate::wal::Error::TopicPartitionMismatch) when it does not; an injected
//! [`FakeFault`] is turned into our error by the same mapping the real admin applies to rskafka's errors.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use rskafka::client::error::{Error as RsKafkaError, ProtocolError, RequestContext, RequestError};
use snafu::IntoError;

use super::admin::{CreateTopicOutcome, TopicAdmin, TopicCreation};
use super::rskafka_admin::{create_topic_error, is_retryable_rskafka_error};
use crate::key::topic_name::TopicId;
use crate::wal::config::{TopicConfig, validate_topic_config_entry, validate_topic_name};
use crate::wal::error::Result;
use crate::wal::error::{KafkaTimeoutSnafu, ListTopicsSnafu, TopicPartitionMismatchSnafu};

/// One topic of the fake cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeTopic {
    /// Its partition count.
    pub partitions: usize,
    /// Create requests that created it (1 for a topic created once, through the admin or out of band).
    pub creations: usize,
    /// Create requests refused with TOPIC_ALREADY_EXISTS (answered `AlreadyExisted` or a partition mismatch).
    pub refused: usize,
    /// The topic-level configs it was created with (or set out of band).
    pub configs: TopicConfig,
    /// Its topic id: a new one at every creation, as Kafka gives.
    pub id: TopicId,
}

/// A failure to inject, described as the situation the real admin meets; the fake builds the error the real admin
/// builds for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FakeFault {
    /// The broker answers the request with this Kafka error code.
    Server(ProtocolError),
    /// rskafka's backoff ran out of its deadline (brokers unreachable the whole time): final.
    DeadlineExhausted,
    /// The connection broke outside rskafka's retry loop: retryable.
    ConnectionBroken,
    /// The call did not finish within its bound (backoff deadline plus one request): final.
    CallTimeout,
}

/// What a hook run before each create call decides.
pub type CreateHook = Arc<dyn Fn(&str) -> BoxFuture<'static, ()> + Send + Sync>;

/// An in-memory Kafka cluster's topic admin with Kafka's CreateTopics semantics, recording every call, with knobs
/// to inject faults and to hold a create call (a hook awaited before it is applied).
#[derive(Default)]
pub struct FakeTopicAdmin {
    state: Mutex<FakeState>,
    hook: Mutex<Option<CreateHook>>,
}

#[derive(Debug, Default)]
struct FakeState {
    topics: BTreeMap<String, FakeTopic>,
    /// Every create request, in order: (name, whether it created the topic).
    log: Vec<(String, bool)>,
    /// Create calls so far (also failed ones).
    create_calls: usize,
    /// Create call number (1-based) → the fault it fails with.
    fail_create: BTreeMap<usize, FakeFault>,
    /// Faults for the next list calls, in order.
    fail_list: VecDeque<FakeFault>,
    /// A fault every call fails with (the brokers are gone).
    fail_all: Option<FakeFault>,
    /// The largest replication factor placed so far.
    proven_replication: i16,
    /// Topic ids given so far (the next topic created gets the next one).
    ids_given: u128,
    /// Topics per batched create (0 and 1: topic by topic, like an admin without a native batch).
    batch_size: usize,
    /// Batched create calls so far.
    batch_calls: usize,
    /// Topic → the fault its next answer within a batched create fails with.
    fail_topic: BTreeMap<String, FakeFault>,
    /// Metadata reads so far (`list_topics` and `describe_topics` calls).
    metadata_reads: usize,
    /// How many of the next metadata reads list no topic at all (a broker that has not caught up yet).
    stale_reads: usize,
}

impl fmt::Debug for FakeTopicAdmin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeTopicAdmin")
            .field("state", &*self.lock())
            .finish_non_exhaustive()
    }
}

/// The endpoint the fake reports (and its errors name).
pub const FAKE_ENDPOINT: &str = "fake-broker:9092";

impl FakeTopicAdmin {
    /// An empty cluster.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, FakeState> {
        // Every change is complete before the lock is released: a poisoned lock still holds a consistent state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every topic with its counters.
    pub fn topics(&self) -> BTreeMap<String, FakeTopic> {
        self.lock().topics.clone()
    }

    /// Every topic with its partition count (what `list_topics` answers).
    pub fn partitions(&self) -> BTreeMap<String, usize> {
        self.lock()
            .topics
            .iter()
            .map(|(name, t)| (name.clone(), t.partitions))
            .collect()
    }

    /// Every create request that reached the cluster, in order: (name, whether it created the topic).
    pub fn create_log(&self) -> Vec<(String, bool)> {
        self.lock().log.clone()
    }

    /// How many create requests created each topic (an `Created` answer).
    pub fn created_counts(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for (name, created) in self.lock().log.iter() {
            if *created {
                *counts.entry(name.clone()).or_default() += 1;
            }
        }
        counts
    }

    /// How many create requests reached the cluster for each topic.
    pub fn create_calls(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for (name, _) in self.lock().log.iter() {
            *counts.entry(name.clone()).or_default() += 1;
        }
        counts
    }

    /// How many create requests reached the cluster.
    pub fn total_create_calls(&self) -> usize {
        self.lock().log.len()
    }

    /// A topic created out of band (by an operator), with `partitions` partitions.
    pub fn create_out_of_band(&self, name: &str, partitions: usize) {
        let mut s = self.lock();
        let id = s.next_id();
        s.topics.insert(
            name.to_string(),
            FakeTopic {
                partitions,
                creations: 1,
                refused: 0,
                configs: TopicConfig::new(),
                id,
            },
        );
    }

    /// Sets a config of an existing topic out of band (as `kafka-configs --alter` would); nothing for a topic that
    /// does not exist.
    pub fn set_config_out_of_band(&self, name: &str, key: &str, value: &str) {
        if let Some(topic) = self.lock().topics.get_mut(name) {
            topic.configs.insert(key.to_string(), value.to_string());
        }
    }

    /// Deletes a topic out of band.
    pub fn delete_out_of_band(&self, name: &str) {
        self.lock().topics.remove(name);
    }

    /// Makes the `n`-th create call from now on (counting from 1, failed calls included) fail with `fault`;
    /// nothing is created by it.
    pub fn fail_nth_create(&self, n: usize, fault: FakeFault) {
        let mut s = self.lock();
        let at = s.create_calls + n;
        s.fail_create.insert(at, fault);
    }

    /// Sets how many topics one batched create carries ([`TopicAdmin::create_batch_size`]); the default, 1, makes
    /// the bootstrap create topic by topic.
    pub fn set_create_batch_size(&self, n: usize) {
        self.lock().batch_size = n;
    }

    /// Makes the next batched create that carries `name` answer `fault` for it alone (the batch's other topics are
    /// applied); the topic is not created by that call.
    pub fn fail_topic_once(&self, name: &str, fault: FakeFault) {
        self.lock().fail_topic.insert(name.to_string(), fault);
    }

    /// Batched create calls so far (each is one CreateTopics request on a real broker).
    pub fn batch_calls(&self) -> usize {
        self.lock().batch_calls
    }

    /// Metadata reads so far: `list_topics` and `describe_topics` calls, each one request on a real broker.
    pub fn metadata_reads(&self) -> usize {
        self.lock().metadata_reads
    }

    /// Makes the next list call fail with `fault` (several calls queue up, in order).
    pub fn fail_next_list(&self, fault: FakeFault) {
        self.lock().fail_list.push_back(fault);
    }

    /// Makes the next `reads` metadata reads answer with no topic, as a broker does that has not yet applied the
    /// controller's metadata log (topics the controller just created are missing from its answers).
    pub fn stale_metadata_reads(&self, reads: usize) {
        self.lock().stale_reads = reads;
    }

    /// Makes every call fail with `fault` (the brokers are gone), or, with `None`, none.
    pub fn fail_all(&self, fault: Option<FakeFault>) {
        self.lock().fail_all = fault;
    }

    /// Runs `hook` with the topic's name before each create call is applied (after a fault check): a test holds
    /// a call there, or lets something happen in between, without sleeping.
    pub fn on_create(&self, hook: CreateHook) {
        *self.hook.lock().unwrap_or_else(|p| p.into_inner()) = Some(hook);
    }

    fn endpoints_vec() -> Vec<String> {
        vec![FAKE_ENDPOINT.to_string()]
    }

    fn list_error(fault: FakeFault) -> crate::wal::Error {
        match fault {
            FakeFault::CallTimeout => KafkaTimeoutSnafu {
                endpoints: Self::endpoints_vec(),
                operation: "list topics",
                timeout: Duration::ZERO,
                retryable: false,
            }
            .build(),
            other => {
                let e = rskafka_error(other, "");
                ListTopicsSnafu {
                    endpoints: Self::endpoints_vec(),
                    retryable: is_retryable_rskafka_error(&e),
                }
                .into_error(e)
            }
        }
    }

    fn create_error(
        &self,
        fault: FakeFault,
        name: &str,
        replication_factor: i16,
    ) -> crate::wal::Error {
        match fault {
            FakeFault::CallTimeout => KafkaTimeoutSnafu {
                endpoints: Self::endpoints_vec(),
                operation: format!("create topic '{name}'"),
                timeout: Duration::ZERO,
                retryable: false,
            }
            .build(),
            other => create_topic_error(
                &Self::endpoints_vec(),
                name,
                replication_factor,
                self.lock().proven_replication,
                rskafka_error(other, name),
            ),
        }
    }
}

/// The rskafka error the real admin sees in the situation `fault` describes.
fn rskafka_error(fault: FakeFault, topic: &str) -> RsKafkaError {
    match fault {
        FakeFault::Server(protocol_error) => RsKafkaError::ServerError {
            protocol_error,
            error_message: Some(format!("injected {protocol_error}")),
            request: RequestContext::Topic(topic.to_string()),
            response: None,
            is_virtual: false,
        },
        FakeFault::DeadlineExhausted => {
            RsKafkaError::RetryFailed(rskafka::BackoffError::DeadlineExceded {
                deadline: Duration::ZERO,
                source: format!("injected: no broker answered at {FAKE_ENDPOINT}").into(),
            })
        }
        FakeFault::ConnectionBroken | FakeFault::CallTimeout => {
            RsKafkaError::Request(RequestError::IO(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "injected: connection reset",
            )))
        }
    }
}

impl FakeState {
    /// A topic id not given before.
    fn next_id(&mut self) -> TopicId {
        self.ids_given += 1;
        TopicId(0xfa4e_0000_0000_0000_0000_0000_0000_0000 | self.ids_given)
    }
}

#[async_trait]
impl TopicAdmin for FakeTopicAdmin {
    fn endpoints(&self) -> Vec<String> {
        Self::endpoints_vec()
    }

    async fn list_topics(&self) -> Result<BTreeMap<String, usize>> {
        let fault = {
            let mut s = self.lock();
            s.metadata_reads += 1;
            s.fail_all.or_else(|| s.fail_list.pop_front())
        };
        if let Some(fault) = fault {
            return Err(Self::list_error(fault));
        }
        {
            let mut s = self.lock();
            if s.stale_reads > 0 {
                s.stale_reads -= 1;
                return Ok(BTreeMap::new());
            }
        }
        Ok(self.partitions())
    }

    async fn describe_topics_with_ids(
        &self,
        names: &[String],
    ) -> Result<BTreeMap<String, (usize, Option<TopicId>)>> {
        let listed = self.describe_topics(names).await?;
        let s = self.lock();
        Ok(listed
            .into_iter()
            .map(|(name, partitions)| {
                let id = s.topics.get(&name).map(|t| t.id);
                (name, (partitions, id))
            })
            .collect())
    }

    async fn create_topic(
        &self,
        name: &str,
        num_partitions: i32,
        replication_factor: i16,
    ) -> Result<CreateTopicOutcome> {
        validate_topic_name(name)?;
        let fault = {
            let mut s = self.lock();
            s.create_calls += 1;
            let n = s.create_calls;
            s.fail_all.or_else(|| s.fail_create.remove(&n))
        };
        if let Some(fault) = fault {
            return Err(self.create_error(fault, name, replication_factor));
        }
        let hook = self.hook.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(hook) = hook {
            hook(name).await;
        }
        apply_create(
            &mut self.lock(),
            name,
            num_partitions,
            replication_factor,
            &TopicConfig::new(),
        )
    }

    fn create_batch_size(&self) -> usize {
        self.lock().batch_size.max(1)
    }

    /// One "request" for the whole batch: a call fault ([`FakeTopicAdmin::fail_nth_create`],
    /// [`FakeTopicAdmin::fail_all`]) fails it as a whole, creating nothing; a topic fault
    /// ([`FakeTopicAdmin::fail_topic_once`]) fails only that topic's answer while the others are applied.
    async fn create_topics(
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
        let (fault, topic_faults) = {
            let mut s = self.lock();
            s.create_calls += 1;
            s.batch_calls += 1;
            let n = s.create_calls;
            let fault = s.fail_all.or_else(|| s.fail_create.remove(&n));
            let topic_faults: BTreeMap<String, FakeFault> = if fault.is_some() {
                BTreeMap::new()
            } else {
                names
                    .iter()
                    .filter_map(|name| s.fail_topic.remove(name).map(|f| (name.clone(), f)))
                    .collect()
            };
            (fault, topic_faults)
        };
        if let Some(fault) = fault {
            let first = names.first().map(String::as_str).unwrap_or_default();
            return Err(self.create_error(fault, first, replication_factor));
        }
        let hook = self.hook.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut answers = Vec::with_capacity(names.len());
        for name in names {
            if let Some(hook) = &hook {
                hook(name).await;
            }
            let outcome = match topic_faults.get(name) {
                Some(&fault) => Err(self.create_error(fault, name, replication_factor)),
                None => apply_create(
                    &mut self.lock(),
                    name,
                    num_partitions,
                    replication_factor,
                    topic_config,
                ),
            };
            answers.push((name.clone(), outcome));
        }
        Ok(answers)
    }

    /// The configs of `keys` each existing topic of `names` was created with (or set out of band); one metadata
    /// read.
    async fn describe_topic_configs(
        &self,
        names: &[String],
        keys: &[String],
    ) -> Result<BTreeMap<String, TopicConfig>> {
        let fault = {
            let mut s = self.lock();
            s.metadata_reads += 1;
            s.fail_all
        };
        if let Some(fault) = fault {
            return Err(Self::list_error(fault));
        }
        let s = self.lock();
        Ok(names
            .iter()
            .filter_map(|name| {
                let topic = s.topics.get(name)?;
                let configs = keys
                    .iter()
                    .filter_map(|k| topic.configs.get(k).map(|v| (k.clone(), v.clone())))
                    .collect();
                Some((name.clone(), configs))
            })
            .collect())
    }
}

/// Applies one create request to the cluster with Kafka's semantics and logs it.
fn apply_create(
    s: &mut FakeState,
    name: &str,
    num_partitions: i32,
    replication_factor: i16,
    topic_config: &TopicConfig,
) -> Result<CreateTopicOutcome> {
    let wanted = usize::try_from(num_partitions).unwrap_or(0);
    let outcome = match s.topics.get_mut(name) {
        Some(existing) => {
            existing.refused += 1;
            if existing.partitions == wanted {
                Ok(CreateTopicOutcome::AlreadyExisted)
            } else {
                TopicPartitionMismatchSnafu {
                    topic: name,
                    wanted: num_partitions,
                    found: existing.partitions,
                }
                .fail()
            }
        }
        None => {
            let id = s.next_id();
            s.topics.insert(
                name.to_string(),
                FakeTopic {
                    partitions: wanted,
                    creations: 1,
                    refused: 0,
                    configs: topic_config.clone(),
                    id,
                },
            );
            s.proven_replication = s.proven_replication.max(replication_factor);
            Ok(CreateTopicOutcome::Created)
        }
    };
    let created = matches!(outcome, Ok(CreateTopicOutcome::Created));
    s.log.push((name.to_string(), created));
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn answers_like_kafka_and_records_every_request() {
        let admin = FakeTopicAdmin::new();
        assert_eq!(
            admin.create_topic("t_0", 2, 1).await.unwrap(),
            CreateTopicOutcome::Created
        );
        assert_eq!(
            admin.create_topic("t_0", 2, 1).await.unwrap(),
            CreateTopicOutcome::AlreadyExisted
        );
        let err = admin.create_topic("t_0", 3, 1).await.unwrap_err();
        assert!(
            matches!(
                err,
                crate::wal::Error::TopicPartitionMismatch {
                    wanted: 3,
                    found: 2,
                    ..
                }
            ),
            "{err}"
        );
        assert!(!err.is_retryable());
        assert_eq!(admin.topics()["t_0"].refused, 2);
        assert_eq!(admin.created_counts(), BTreeMap::from([("t_0".into(), 1)]));
        assert_eq!(admin.total_create_calls(), 3);
    }

    #[tokio::test]
    async fn injected_faults_have_the_real_admins_kinds() {
        let admin = FakeTopicAdmin::new();
        admin.fail_nth_create(2, FakeFault::DeadlineExhausted);
        admin.fail_nth_create(3, FakeFault::ConnectionBroken);
        admin.fail_nth_create(
            4,
            FakeFault::Server(ProtocolError::InvalidReplicationFactor),
        );
        admin.fail_nth_create(
            5,
            FakeFault::Server(ProtocolError::InvalidReplicationFactor),
        );
        admin.create_topic("f_0", 1, 1).await.unwrap();
        let exhausted = admin.create_topic("f_1", 1, 1).await.unwrap_err();
        assert!(
            matches!(
                exhausted,
                crate::wal::Error::CreateTopic {
                    retryable: false,
                    ..
                }
            ),
            "{exhausted:?}"
        );
        assert!(exhausted.to_string().contains(FAKE_ENDPOINT), "{exhausted}");
        let broken = admin.create_topic("f_1", 1, 1).await.unwrap_err();
        assert!(broken.is_retryable(), "{broken}");
        // Replication factor 1 was placed already: 38 now means fenced brokers. 2 was never placed: too many.
        let fenced = admin.create_topic("f_1", 1, 1).await.unwrap_err();
        assert!(
            matches!(fenced, crate::wal::Error::KafkaBrokersFenced { .. }) && fenced.is_retryable(),
            "{fenced:?}"
        );
        let too_many = admin.create_topic("f_1", 1, 2).await.unwrap_err();
        assert!(
            matches!(
                too_many,
                crate::wal::Error::InvalidReplicationFactor {
                    replication_factor: 2,
                    ..
                }
            ) && !too_many.is_retryable(),
            "{too_many:?}"
        );
        assert_eq!(admin.total_create_calls(), 1, "failed calls reach no topic");
        admin.fail_all(Some(FakeFault::CallTimeout));
        let gone = admin.list_topics().await.unwrap_err();
        assert!(
            matches!(
                gone,
                crate::wal::Error::KafkaTimeout {
                    retryable: false,
                    ..
                }
            ),
            "{gone:?}"
        );
    }
}
