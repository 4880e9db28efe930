//! What the façade's calls answer: a table's regions, a bootstrap's progress and report, the topic pool and how
//! regions spread over it, failover status. Plain data, serialised as `walctl --json` and the HTTP API show it.

use serde::{Deserialize, Serialize};

use crate::wal::kafka::TopicConfigDrift;

/// One region of a table: where it lives and which WAL it writes to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionPlacement {
    /// The region's number in its table.
    pub region_number: u32,
    /// `(table_id << 32) | region_number`.
    pub region_id: u64,
    /// The datanode serving it.
    pub datanode_id: u64,
    /// The encoded WAL options (`{"wal.provider":...}`), as recorded for the datanode.
    pub wal_options: String,
}

/// A table and its regions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableRegions {
    /// `catalog.schema.table`.
    pub table: String,
    /// The table id.
    pub table_id: u32,
    /// Its regions, by region number.
    pub regions: Vec<RegionPlacement>,
}

/// Where a Kafka pool bootstrap stands (reported while it runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct BootstrapProgress {
    /// Topics in the pool.
    pub wanted: usize,
    /// Wanted topics the brokers already show.
    pub on_broker: usize,
    /// Wanted topic names already persisted in the metadata store.
    pub persisted: usize,
}

/// The outcome of [`Metasrv::bootstrap`](crate::metasrv::Metasrv::bootstrap).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootstrapReport {
    /// `kafka` or `raft_engine`.
    pub provider: String,
    /// The pool's topic name prefix (Kafka only).
    pub topic_name_prefix: Option<String>,
    /// Topics in the pool (0 for raft-engine).
    pub num_topics: usize,
    /// Whether new regions can get WAL options now.
    pub ready: bool,
    /// Persisted pool topics this run found missing on the brokers (deleted out of band) and recreated.
    pub recreated_topics: usize,
    /// Pool topics whose configs differ from `[wal] topic_config` (reported, never changed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub config_drift: Vec<TopicConfigDrift>,
}

/// One topic and how many regions write to it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicUsage {
    /// The topic.
    pub topic: String,
    /// Regions whose recorded WAL options name it.
    pub regions: usize,
    /// Whether its name is persisted as part of the pool.
    pub persisted: bool,
    /// Whether it is one of the configured pool's topics (a topic used by regions but outside the configured
    /// pool appears with `false`, e.g. after the pool was configured smaller).
    pub in_pool: bool,
}

/// How evenly regions spread over the configured pool's topics: the fewest, the most and the mean regions per
/// topic (all 0 for a pool of no region). Load-aware selection keeps `max - min` at most 1 for regions it placed.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RegionSpread {
    /// Regions on the least loaded topic of the pool.
    pub min: usize,
    /// Regions on the most loaded topic of the pool.
    pub max: usize,
    /// Regions per topic of the pool, on average.
    pub mean: f64,
}

impl RegionSpread {
    /// The spread of `regions` (one count per topic); all 0 when there is no topic.
    pub fn of(regions: impl IntoIterator<Item = usize>) -> Self {
        let (mut min, mut max, mut sum, mut n) = (usize::MAX, 0, 0usize, 0usize);
        for r in regions {
            min = min.min(r);
            max = max.max(r);
            sum += r;
            n += 1;
        }
        if n == 0 {
            return RegionSpread {
                min: 0,
                max: 0,
                mean: 0.0,
            };
        }
        RegionSpread {
            min,
            max,
            mean: sum as f64 / n as f64,
        }
    }
}

/// The Kafka topic pool as recorded in the metadata store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TopicsReport {
    /// The pool's topic name prefix.
    pub topic_name_prefix: String,
    /// Topics the config asks for.
    pub num_topics: usize,
    /// Of those, how many are persisted.
    pub persisted: usize,
    /// Every wanted topic, then any other topic regions use or persisted beyond the pool, with region counts;
    /// each group sorted by pool index (`p_4` before `p_10`), names not of the form `{prefix}_{i}` last.
    pub topics: Vec<TopicUsage>,
    /// Regions per topic over the configured pool's topics (`in_pool`), persisted or not.
    pub spread: RegionSpread,
    /// Pool topics whose configs differ from `[wal] topic_config` (reported, never changed).
    pub config_drift: Vec<TopicConfigDrift>,
}

/// What `walctl failover status` and `GET /v1/failover` show.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailoverStatus {
    /// `[failover] enabled`.
    pub enabled: bool,
    /// Paused by an operator.
    pub paused: bool,
    /// The datanode incarnations the leader finds failed now.
    pub failed: Vec<FailedDatanode>,
    /// Regions that cannot lead anywhere until their failed datanode returns: on the raft-engine WAL, the regions
    /// of the failed datanodes (their WAL is on those machines), by id.
    #[serde(default)]
    pub unavailable_regions: Vec<u64>,
}

/// One failed datanode incarnation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedDatanode {
    /// The datanode.
    pub datanode: u64,
    /// Its failed incarnation.
    pub incarnation: u64,
}
