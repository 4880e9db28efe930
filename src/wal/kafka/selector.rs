//! [`TopicSelector`]: which topic of the pool a new region gets.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{EmptyTopicListSnafu, Result};

/// Chooses topics of a pool for new regions.
pub trait TopicSelector: Send + Sync + Debug {
    /// One topic of `topics` (an error when `topics` is empty).
    fn select<'a>(&self, topics: &'a [String]) -> Result<&'a String>;

    /// `n` topics of `topics`, one per region, in allocation order (an error when `topics` is empty and `n > 0`).
    fn select_many<'a>(&self, topics: &'a [String], n: usize) -> Result<Vec<&'a String>> {
        (0..n).map(|_| self.select(topics)).collect()
    }
}

/// A shared [`TopicSelector`].
pub type TopicSelectorRef = Arc<dyn TopicSelector>;

/// Hands out the pool's topics in turn, so regions spread evenly over the topics.
#[derive(Debug, Default)]
pub struct RoundRobinTopicSelector {
    cursor: AtomicUsize,
}

impl RoundRobinTopicSelector {
    /// A selector starting at the first topic.
    pub fn new() -> Self {
        Self::default()
    }

    /// A selector whose first pick is `topics[start % topics.len()]` (tests seed it to know what comes out; a
    /// metasrv may seed it randomly so restarts do not always begin with topic 0).
    pub fn with_start(start: usize) -> Self {
        RoundRobinTopicSelector {
            cursor: AtomicUsize::new(start),
        }
    }
}

impl TopicSelector for RoundRobinTopicSelector {
    fn select<'a>(&self, topics: &'a [String]) -> Result<&'a String> {
        if topics.is_empty() {
            return EmptyTopicListSnafu.fail();
        }
        let i = self.cursor.fetch_add(1, Ordering::Relaxed);
        Ok(&topics[i % topics.len()])
    }

    fn select_many<'a>(&self, topics: &'a [String], n: usize) -> Result<Vec<&'a String>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        if topics.is_empty() {
            return EmptyTopicListSnafu.fail();
        }
        // One atomic step for the whole batch: the batch gets consecutive topics even under concurrency.
        let first = self.cursor.fetch_add(n, Ordering::Relaxed);
        Ok((0..n)
            .map(|k| &topics[first.wrapping_add(k) % topics.len()])
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topics(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("t_{i}")).collect()
    }

    #[test]
    fn round_robin_cycles_from_the_seeded_start() {
        let s = RoundRobinTopicSelector::with_start(2);
        let t = topics(3);
        let picked: Vec<_> = (0..5).map(|_| s.select(&t).unwrap().clone()).collect();
        assert_eq!(picked, ["t_2", "t_0", "t_1", "t_2", "t_0"]);
    }

    #[test]
    fn select_many_continues_where_select_left_off() {
        let s = RoundRobinTopicSelector::new();
        let t = topics(4);
        assert_eq!(s.select(&t).unwrap(), "t_0");
        let many: Vec<_> = s.select_many(&t, 5).unwrap();
        assert_eq!(many, ["t_1", "t_2", "t_3", "t_0", "t_1"]);
        assert_eq!(s.select(&t).unwrap(), "t_2");
    }

    #[test]
    fn empty_topic_list_is_an_error() {
        let s = RoundRobinTopicSelector::new();
        assert!(matches!(s.select(&[]), Err(crate::Error::EmptyTopicList)));
        assert!(s.select_many(&[], 1).is_err());
        assert!(s.select_many(&[], 0).unwrap().is_empty());
    }

    #[test]
    fn batch_spreads_evenly() {
        let s = RoundRobinTopicSelector::with_start(7);
        let t = topics(8);
        let mut counts = std::collections::HashMap::new();
        for topic in s.select_many(&t, 800).unwrap() {
            *counts.entry(topic.as_str()).or_insert(0) += 1;
        }
        assert_eq!(counts.len(), 8);
        assert!(counts.values().all(|&c| c == 100), "{counts:?}");
    }
}
