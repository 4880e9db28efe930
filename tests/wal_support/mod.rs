//! Fakes shared by the WAL tests: a [`FakeAdmin`] with Kafka's CreateTopics semantics.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use remote_wal::Result;
use remote_wal::wal::kafka::admin::{CreateTopicOutcome, TopicAdmin};

/// An in-memory Kafka cluster's topic admin: a name is created once; creating it again answers "already existed"
/// (Kafka's TOPIC_ALREADY_EXISTS), or an error naming the topic when the partition count differs.
#[derive(Debug, Default)]
pub struct FakeAdmin {
    state: Mutex<FakeState>,
}

#[derive(Debug, Default)]
struct FakeState {
    /// Topic → partitions.
    topics: BTreeMap<String, usize>,
    /// Topic → how many create calls returned `Created` for it.
    created: BTreeMap<String, usize>,
    /// Topic → how many create calls were made for it.
    calls: BTreeMap<String, usize>,
}

impl FakeAdmin {
    /// An empty cluster.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state.lock().unwrap()
    }

    /// Creates a topic out of band (not through the admin's create call).
    pub fn add_out_of_band(&self, name: &str, partitions: usize) {
        self.lock().topics.insert(name.to_string(), partitions);
    }

    /// Deletes a topic (out of band).
    pub fn delete_out_of_band(&self, name: &str) {
        self.lock().topics.remove(name);
    }

    /// The cluster's topics with their partition counts.
    pub fn topics(&self) -> BTreeMap<String, usize> {
        self.lock().topics.clone()
    }

    /// How many times each topic was created (a `Created` answer).
    pub fn created_counts(&self) -> BTreeMap<String, usize> {
        self.lock().created.clone()
    }

    /// How many create calls each topic got.
    pub fn create_calls(&self) -> BTreeMap<String, usize> {
        self.lock().calls.clone()
    }

    /// Total create calls.
    pub fn total_create_calls(&self) -> usize {
        self.lock().calls.values().sum()
    }
}

#[async_trait]
impl TopicAdmin for FakeAdmin {
    fn endpoints(&self) -> Vec<String> {
        vec!["fake:9092".to_string()]
    }

    async fn list_topics(&self) -> Result<BTreeMap<String, usize>> {
        Ok(self.topics())
    }

    async fn create_topic(
        &self,
        name: &str,
        num_partitions: i32,
        _replication_factor: i16,
    ) -> Result<CreateTopicOutcome> {
        let mut s = self.lock();
        *s.calls.entry(name.to_string()).or_default() += 1;
        match s.topics.get(name) {
            Some(&actual) if actual == num_partitions as usize => {
                Ok(CreateTopicOutcome::AlreadyExisted)
            }
            Some(&actual) => Err(remote_wal::Error::PoolTopicPartitions {
                topic: name.to_string(),
                expected: num_partitions,
                actual,
            }),
            None => {
                s.topics.insert(name.to_string(), num_partitions as usize);
                *s.created.entry(name.to_string()).or_default() += 1;
                Ok(CreateTopicOutcome::Created)
            }
        }
    }
}
