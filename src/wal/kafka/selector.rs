//! [`TopicSelector`]: which topic of the pool a new region gets — [`LeastLoadedTopicSelector`] (the fewest
//! regions, ties in turn; what a metasrv uses) or [`RoundRobinTopicSelector`] (strictly in turn).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::wal::error::EmptyTopicListSnafu;
use crate::wal::error::Result;

/// Chooses topics of a pool for new regions.
pub trait TopicSelector: Send + Sync + Debug {
    /// One topic of `topics` (an error when `topics` is empty).
    fn select<'a>(&self, topics: &'a [String]) -> Result<&'a String>;

    /// `n` topics of `topics`, one per region, in allocation order (an error when `topics` is empty and `n > 0`).
    fn select_many<'a>(&self, topics: &'a [String], n: usize) -> Result<Vec<&'a String>> {
        (0..n).map(|_| self.select(topics)).collect()
    }

    /// Gives the selector the regions already on each topic (topic name → regions), counted from the store when the
    /// pool loads. Only the first call counts (later ones return `false` and change nothing): from then on the
    /// selector's own allocations keep its counts. The default ignores the counts (a selector blind to load).
    fn seed_counts(&self, counts: &BTreeMap<String, u64>) -> bool {
        let _ = counts;
        false
    }

    /// Whether [`TopicSelector::seed_counts`] would still use counts (so the pool scans the store for them only
    /// then). The default: never.
    fn wants_counts(&self) -> bool {
        false
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

/// Hands each new region the topic with the fewest regions; among the topics tied at the fewest, the next one
/// after the last pick in pool order (round-robin), so a fresh pool fills evenly in index order.
///
/// Counts start from [`TopicSelector::seed_counts`] (the regions the store records per topic) and every pick adds
/// one to its topic. A pick and its count update happen under one lock, so concurrent allocations in a process
/// keep the counts exact and never both take the same "least loaded" topic. A pick costs O(log topics).
#[derive(Debug, Default)]
pub struct LeastLoadedTopicSelector {
    loads: Mutex<Loads>,
}

/// The selector's counts for one topic list.
#[derive(Debug, Default)]
struct Loads {
    /// The topic list the counts are for (counts are by index into it).
    topics: Vec<String>,
    /// Regions per topic, by index.
    counts: Vec<u64>,
    /// Topic indices grouped by their count; the first group holds the least loaded topics.
    by_count: BTreeMap<u64, BTreeSet<usize>>,
    /// The index after the last pick: ties go to the first tied topic at or after it.
    cursor: usize,
    /// Counts seeded before the topic list was known, by topic name.
    seeded: BTreeMap<String, u64>,
    /// Whether `seed_counts` has been applied.
    is_seeded: bool,
}

impl Loads {
    /// Re-keys the counts to `topics` when the list differs from the one they are for (the first call, or a pool
    /// reloaded with other topics): a topic keeps its count by name, a new one starts from its seeded count.
    fn follow(&mut self, topics: &[String]) {
        if self.topics.as_slice() == topics {
            return;
        }
        let mut by_name: BTreeMap<String, u64> = self.seeded.clone();
        for (topic, count) in self.topics.iter().zip(&self.counts) {
            by_name.insert(topic.clone(), *count);
        }
        self.topics = topics.to_vec();
        self.counts = topics
            .iter()
            .map(|t| by_name.get(t).copied().unwrap_or(0))
            .collect();
        self.by_count.clear();
        for (i, count) in self.counts.iter().enumerate() {
            self.by_count.entry(*count).or_default().insert(i);
        }
        self.cursor = 0;
    }

    /// The least loaded topic's index (ties: the first at or after the cursor, wrapping), its count incremented.
    fn pick(&mut self) -> Option<usize> {
        let mut least = self.by_count.first_entry()?;
        let count = *least.key();
        let tied = least.get_mut();
        let i = tied
            .range(self.cursor..)
            .next()
            .or_else(|| tied.first())
            .copied()?;
        tied.remove(&i);
        if tied.is_empty() {
            least.remove();
        }
        self.by_count.entry(count + 1).or_default().insert(i);
        self.counts[i] = count + 1;
        self.cursor = i + 1;
        Some(i)
    }
}

impl LeastLoadedTopicSelector {
    /// A selector that has counted no region yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Regions per topic as the selector counts them now (seeded counts plus its own picks), for the topic list
    /// it last selected from; before its first selection, the seeded counts.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        let loads = self.loads.lock().unwrap_or_else(|p| p.into_inner());
        if loads.topics.is_empty() {
            return loads.seeded.clone();
        }
        loads
            .topics
            .iter()
            .cloned()
            .zip(loads.counts.iter().copied())
            .collect()
    }
}

impl TopicSelector for LeastLoadedTopicSelector {
    fn select<'a>(&self, topics: &'a [String]) -> Result<&'a String> {
        let mut picked = self.select_many(topics, 1)?;
        picked.pop().map_or_else(|| EmptyTopicListSnafu.fail(), Ok)
    }

    fn select_many<'a>(&self, topics: &'a [String], n: usize) -> Result<Vec<&'a String>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        if topics.is_empty() {
            return EmptyTopicListSnafu.fail();
        }
        // One lock for the whole batch: picks and count updates of concurrent allocations never interleave.
        let mut loads = self.loads.lock().unwrap_or_else(|p| p.into_inner());
        loads.follow(topics);
        let mut picked = Vec::with_capacity(n);
        for _ in 0..n {
            match loads.pick() {
                Some(i) => picked.push(&topics[i]),
                None => return EmptyTopicListSnafu.fail(),
            }
        }
        Ok(picked)
    }

    fn wants_counts(&self) -> bool {
        !self
            .loads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_seeded
    }

    fn seed_counts(&self, counts: &BTreeMap<String, u64>) -> bool {
        let mut loads = self.loads.lock().unwrap_or_else(|p| p.into_inner());
        if loads.is_seeded {
            return false;
        }
        loads.is_seeded = true;
        loads.seeded = counts.clone();
        // Counts already followed a topic list (picks before seeding): add the seeded ones to them.
        let topics = std::mem::take(&mut loads.topics);
        let picks: BTreeMap<String, u64> = topics
            .iter()
            .cloned()
            .zip(loads.counts.iter().copied())
            .collect();
        for (topic, own) in picks {
            *loads.seeded.entry(topic).or_insert(0) += own;
        }
        loads.counts.clear();
        loads.follow(&topics);
        loads.seeded = counts.clone();
        true
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
        assert!(matches!(
            s.select(&[]),
            Err(crate::wal::Error::EmptyTopicList)
        ));
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

    fn counted(s: &LeastLoadedTopicSelector, t: &[String], n: usize) -> BTreeMap<String, u64> {
        let mut counts = BTreeMap::new();
        for topic in s.select_many(t, n).unwrap() {
            *counts.entry(topic.clone()).or_insert(0) += 1;
        }
        counts
    }

    #[test]
    fn least_loaded_fills_a_fresh_pool_in_index_order() {
        let s = LeastLoadedTopicSelector::new();
        let t = topics(3);
        let picked: Vec<_> = s.select_many(&t, 7).unwrap();
        assert_eq!(picked, ["t_0", "t_1", "t_2", "t_0", "t_1", "t_2", "t_0"]);
        assert_eq!(s.select(&t).unwrap(), "t_1");
    }

    #[test]
    fn least_loaded_fills_the_emptiest_topics_first() {
        let s = LeastLoadedTopicSelector::new();
        let t = topics(4);
        let seed = BTreeMap::from([
            ("t_0".to_string(), 5),
            ("t_1".to_string(), 2),
            ("t_3".to_string(), 3),
            // A topic outside the pool is kept by name but never picked.
            ("old_9".to_string(), 1),
        ]);
        assert!(s.wants_counts());
        assert!(s.seed_counts(&seed));
        assert!(!s.wants_counts());
        // t_2 (0) gets two, then t_1 and t_2 tie at 2 and alternate, then t_3 joins at 3.
        let picked: Vec<_> = s.select_many(&t, 5).unwrap();
        assert_eq!(picked, ["t_2", "t_2", "t_1", "t_2", "t_3"]);
        let counts = s.counts();
        assert_eq!(counts["t_0"], 5);
        assert_eq!(counts["t_1"], 3);
        assert_eq!(counts["t_2"], 3);
        assert_eq!(counts["t_3"], 4);
        // A second seed changes nothing: the selector's own counts rule from the first one on.
        assert!(!s.seed_counts(&BTreeMap::new()));
        assert_eq!(s.counts(), counts);
    }

    #[test]
    fn seeding_after_picks_adds_to_them() {
        let s = LeastLoadedTopicSelector::new();
        let t = topics(2);
        assert_eq!(s.select(&t).unwrap(), "t_0");
        assert!(s.seed_counts(&BTreeMap::from([("t_1".to_string(), 4)])));
        assert_eq!(
            s.counts(),
            BTreeMap::from([("t_0".to_string(), 1), ("t_1".to_string(), 4)])
        );
    }

    #[test]
    fn least_loaded_keeps_counts_by_name_when_the_pool_changes() {
        let s = LeastLoadedTopicSelector::new();
        assert_eq!(counted(&s, &topics(2), 4).len(), 2);
        // The pool grows: the new topics are emptiest and get the next regions.
        let grown = counted(&s, &topics(4), 4);
        assert_eq!(
            grown,
            BTreeMap::from([("t_2".to_string(), 2), ("t_3".to_string(), 2)])
        );
        assert!(s.counts().values().all(|c| *c == 2), "{:?}", s.counts());
    }

    #[test]
    fn least_loaded_empty_topic_list_is_an_error() {
        let s = LeastLoadedTopicSelector::new();
        assert!(matches!(
            s.select(&[]),
            Err(crate::wal::Error::EmptyTopicList)
        ));
        assert!(s.select_many(&[], 1).is_err());
        assert!(s.select_many(&[], 0).unwrap().is_empty());
    }

    #[test]
    fn concurrent_batches_keep_counts_exact_and_even() {
        let s = Arc::new(LeastLoadedTopicSelector::new());
        let t = Arc::new(topics(7));
        let threads: Vec<_> = (0..8)
            .map(|k| {
                let (s, t) = (s.clone(), t.clone());
                std::thread::spawn(move || {
                    for i in 0..50 {
                        s.select_many(&t, 1 + (i + k) % 5).unwrap();
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        let total: usize = (0..8)
            .flat_map(|k| (0..50).map(move |i| 1 + (i + k) % 5))
            .sum();
        let counts = s.counts();
        assert_eq!(counts.values().sum::<u64>(), total as u64);
        let (min, max) = (counts.values().min(), counts.values().max());
        assert!(max.zip(min).is_some_and(|(a, b)| a - b <= 1), "{counts:?}");
    }
}
