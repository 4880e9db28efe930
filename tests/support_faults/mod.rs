//! Test code shared by `tests/fault_schedules.rs` and `tests/bad_input.rs`: a fake Kafka topic admin with Kafka's
//! create semantics, and a snapshot of a kv backend's whole contents.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use remote_wal::Result;
use remote_wal::error::TopicPartitionMismatchSnafu;
use remote_wal::kv::{KvBackend, RangeRequest, range_all};
use remote_wal::wal::kafka::admin::{CreateTopicOutcome, TopicAdmin};

/// One topic of the fake cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeTopic {
    /// Partition count it was created with.
    pub partitions: usize,
    /// Create requests that created it (Kafka lets exactly one win).
    pub creations: usize,
    /// Create requests refused with TOPIC_ALREADY_EXISTS.
    pub refused: usize,
}

/// A Kafka cluster's topic list in memory. A create of a name that exists is refused as Kafka does (error 36), which
/// the [`TopicAdmin`] contract maps to `AlreadyExisted` when the partition count matches and to an error otherwise.
#[derive(Debug, Default)]
pub struct FakeAdmin {
    topics: Mutex<BTreeMap<String, FakeTopic>>,
    /// Every create request, in order: (name, whether it created the topic).
    log: Mutex<Vec<(String, bool)>>,
}

impl FakeAdmin {
    /// An empty cluster.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, FakeTopic>> {
        self.topics.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every topic with its counters.
    pub fn topics(&self) -> BTreeMap<String, FakeTopic> {
        self.lock().clone()
    }

    /// Every create request so far: (name, created).
    pub fn create_log(&self) -> Vec<(String, bool)> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A topic created out of band (by an operator), with `partitions` partitions.
    pub fn create_out_of_band(&self, name: &str, partitions: usize) {
        self.lock().insert(
            name.to_string(),
            FakeTopic {
                partitions,
                creations: 1,
                refused: 0,
            },
        );
    }
}

#[async_trait]
impl TopicAdmin for FakeAdmin {
    fn endpoints(&self) -> Vec<String> {
        vec!["fake-broker:9092".to_string()]
    }

    async fn list_topics(&self) -> Result<BTreeMap<String, usize>> {
        Ok(self
            .lock()
            .iter()
            .map(|(name, t)| (name.clone(), t.partitions))
            .collect())
    }

    async fn create_topic(
        &self,
        name: &str,
        num_partitions: i32,
        _replication_factor: i16,
    ) -> Result<CreateTopicOutcome> {
        let wanted = usize::try_from(num_partitions).unwrap_or(0);
        let outcome = {
            let mut topics = self.lock();
            match topics.get_mut(name) {
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
                    topics.insert(
                        name.to_string(),
                        FakeTopic {
                            partitions: wanted,
                            creations: 1,
                            refused: 0,
                        },
                    );
                    Ok(CreateTopicOutcome::Created)
                }
            }
        };
        self.log.lock().unwrap_or_else(|p| p.into_inner()).push((
            name.to_string(),
            matches!(outcome, Ok(CreateTopicOutcome::Created)),
        ));
        outcome
    }
}

/// Every pair of a kv backend, as (key, value) in key order.
pub async fn kv_snapshot(kv: &dyn KvBackend) -> Vec<(Vec<u8>, Vec<u8>)> {
    range_all(kv, RangeRequest::prefix(Vec::<u8>::new()), 0)
        .await
        .expect("read the whole kv backend")
        .into_iter()
        .map(|kv| (kv.key, kv.value))
        .collect()
}
