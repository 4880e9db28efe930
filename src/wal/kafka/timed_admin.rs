//! [`TimedTopicAdmin`]: a [`TopicAdmin`] wrapper that tells an optional [`TopicAdminObserver`] how long each call
//! to the brokers took, so a server can export Kafka admin latency.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::wal::config::TopicConfig;
use crate::wal::error::Result;
use crate::wal::kafka::admin::{CreateTopicOutcome, TopicAdmin, TopicAdminRef, TopicCreation};

/// Told of each call a [`TimedTopicAdmin`] made. Called on the calling task: an implementation must return
/// quickly and must not block.
pub trait TopicAdminObserver: Send + Sync + Debug {
    /// The call `call` (`list_topics`, `create_topic`, `create_topics`, `describe_topics`,
    /// `describe_topic_configs`) answered after `elapsed`, without error when `ok`.
    fn admin_call(&self, call: &'static str, elapsed: Duration, ok: bool);
}

/// Passes every call to the admin it wraps and times it (see the module documentation).
#[derive(Debug)]
pub struct TimedTopicAdmin {
    inner: TopicAdminRef,
    observer: RwLock<Option<Arc<dyn TopicAdminObserver>>>,
}

impl TimedTopicAdmin {
    /// Wraps `inner`; nothing is reported until [`TimedTopicAdmin::set_observer`].
    pub fn new(inner: TopicAdminRef) -> Self {
        TimedTopicAdmin {
            inner,
            observer: RwLock::new(None),
        }
    }

    /// Tells `observer` of every call from now on (replacing an observer set before).
    pub fn set_observer(&self, observer: Arc<dyn TopicAdminObserver>) {
        *self.observer.write().unwrap_or_else(|p| p.into_inner()) = Some(observer);
    }

    async fn timed<T>(
        &self,
        call: &'static str,
        fut: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let sent = Instant::now();
        let result = fut.await;
        let observer = self
            .observer
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(observer) = observer {
            observer.admin_call(call, sent.elapsed(), result.is_ok());
        }
        result
    }
}

#[async_trait]
impl TopicAdmin for TimedTopicAdmin {
    fn endpoints(&self) -> Vec<String> {
        self.inner.endpoints()
    }

    async fn list_topics(&self) -> Result<BTreeMap<String, usize>> {
        self.timed("list_topics", self.inner.list_topics()).await
    }

    async fn create_topic(
        &self,
        name: &str,
        num_partitions: i32,
        replication_factor: i16,
    ) -> Result<CreateTopicOutcome> {
        self.timed(
            "create_topic",
            self.inner
                .create_topic(name, num_partitions, replication_factor),
        )
        .await
    }

    fn create_batch_size(&self) -> usize {
        self.inner.create_batch_size()
    }

    async fn create_topics(
        &self,
        names: &[String],
        num_partitions: i32,
        replication_factor: i16,
        topic_config: &TopicConfig,
    ) -> Result<Vec<TopicCreation>> {
        self.timed(
            "create_topics",
            self.inner
                .create_topics(names, num_partitions, replication_factor, topic_config),
        )
        .await
    }

    async fn describe_topics(&self, names: &[String]) -> Result<BTreeMap<String, usize>> {
        self.timed("describe_topics", self.inner.describe_topics(names))
            .await
    }

    async fn describe_topics_with_ids(
        &self,
        names: &[String],
    ) -> Result<BTreeMap<String, (usize, Option<crate::key::topic_name::TopicId>)>> {
        self.timed(
            "describe_topics_with_ids",
            self.inner.describe_topics_with_ids(names),
        )
        .await
    }

    async fn describe_topics_on_each_broker(
        &self,
        names: &[String],
    ) -> Result<Vec<(String, BTreeMap<String, usize>)>> {
        self.timed(
            "describe_topics_on_each_broker",
            self.inner.describe_topics_on_each_broker(names),
        )
        .await
    }

    async fn describe_topic_configs(
        &self,
        names: &[String],
        keys: &[String],
    ) -> Result<BTreeMap<String, TopicConfig>> {
        self.timed(
            "describe_topic_configs",
            self.inner.describe_topic_configs(names, keys),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::wal::kafka::testing::FakeTopicAdmin;

    #[derive(Debug, Default)]
    struct Calls(Mutex<Vec<(&'static str, bool)>>);

    impl TopicAdminObserver for Calls {
        fn admin_call(&self, call: &'static str, _elapsed: Duration, ok: bool) {
            self.0.lock().unwrap().push((call, ok));
        }
    }

    #[tokio::test]
    async fn each_call_is_reported_with_its_name_and_outcome() {
        let admin = TimedTopicAdmin::new(Arc::new(FakeTopicAdmin::new()));
        // Before an observer is set nothing is reported (and nothing fails).
        admin.list_topics().await.unwrap();
        let calls = Arc::new(Calls::default());
        admin.set_observer(calls.clone());
        admin.create_topic("t", 1, 1).await.unwrap();
        admin.list_topics().await.unwrap();
        admin.describe_topics(&["t".to_string()]).await.unwrap();
        // A partition count that differs from the existing topic's is an error.
        assert!(admin.create_topic("t", 2, 1).await.is_err());
        assert_eq!(
            *calls.0.lock().unwrap(),
            vec![
                ("create_topic", true),
                ("list_topics", true),
                ("describe_topics", true),
                ("create_topic", false),
            ]
        );
    }
}
