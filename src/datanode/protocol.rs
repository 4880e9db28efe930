//! The messages between a datanode and the metasrv leader (`docs/datanode.md`): registration, which gives the
//! datanode a new incarnation, and the heartbeat, which carries the datanode's regions and brings back a lease per
//! region and instructions (open, close, drop, flush). Both sides use these types; they travel as JSON over HTTP
//! (`POST /v1/datanodes/register`, `POST /v1/heartbeat` on `walctl serve`).
//!
//! **Leases.** A lease lets a region take writes as leader until its deadline, which the datanode counts from the
//! moment it *sent* the heartbeat that brought the lease (its monotonic clock), so the deadline is never later
//! than the metasrv's own reckoning, which starts when it answered.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::datanode::RegionOpenRequest;
use crate::key::topic_name::TopicId;

/// How many heartbeat intervals a lease lasts, plus [`LEASE_SLACK`]: a lease survives two lost heartbeats.
pub const LEASE_HEARTBEATS: u32 = 3;

/// What a lease lasts beyond [`LEASE_HEARTBEATS`] intervals.
pub const LEASE_SLACK: Duration = Duration::from_secs(1);

/// The lease of a datanode heartbeating every `interval`: 3 intervals + 1 s (10 s at GreptimeDB's 3 s interval).
pub fn lease_for(interval: Duration) -> Duration {
    interval.saturating_mul(LEASE_HEARTBEATS) + LEASE_SLACK
}

/// A region's role on a datanode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RegionRole {
    /// Takes writes while its lease holds.
    Leader,
    /// Open, refuses writes.
    Follower,
}

impl RegionRole {
    /// `leader` or `follower`.
    pub fn as_str(self) -> &'static str {
        match self {
            RegionRole::Leader => "leader",
            RegionRole::Follower => "follower",
        }
    }
}

/// `POST /v1/datanodes/register`: a datanode starting.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterRequest {
    /// The datanode's id (one of the metasrv's `[datanodes] ids`).
    pub datanode_id: u64,
    /// Where its API listens, for clients and the metasrv.
    pub address: String,
    /// Its heartbeat interval in milliseconds (its leases last [`lease_for`] it).
    pub heartbeat_interval_ms: u64,
}

/// The answer to a registration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterResponse {
    /// The datanode.
    pub datanode_id: u64,
    /// Its new incarnation: above every earlier one of this datanode, persisted before this answer.
    pub incarnation: u64,
}

/// One region as the datanode reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionStat {
    /// The region.
    pub region_id: u64,
    /// Its role now.
    pub role: RegionRole,
    /// The region epoch it last held a lease at (0 before any).
    pub epoch: u64,
    /// The entry id of its last acknowledged entry (its start when it has none).
    pub last_entry_id: u64,
    /// Entries up to this id are in region storage: where its replay starts, its checkpoint to be.
    pub flushed_entry_id: u64,
    /// Bytes of entries not yet flushed.
    pub memtable_bytes: u64,
    /// On a Kafka topic: the id the brokers gave the topic when the region was opened, the incarnation its entry
    /// ids (and so its checkpoint) count positions of (`None` when the brokers did not tell).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_id: Option<TopicId>,
}

/// `POST /v1/heartbeat`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatRequest {
    /// The datanode.
    pub datanode_id: u64,
    /// The incarnation its registration gave it.
    pub incarnation: u64,
    /// Where its API listens.
    pub address: String,
    /// Its heartbeat interval in milliseconds.
    pub heartbeat_interval_ms: u64,
    /// Every region it has open.
    pub regions: Vec<RegionStat>,
    /// Dropped regions whose storage it has deleted since its last answered heartbeat (after a
    /// [`Instruction::Drop`]): the metasrv then forgets them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<u64>,
    /// Regions it was told to open and refused because their WAL topic is no longer the incarnation their
    /// checkpoint counts: the entries after the checkpoint went with the old topic.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub wal_lost: Vec<WalLost>,
    /// Counts this incarnation's heartbeats, from 1 (0: a datanode that does not count them). A region missing
    /// from a heartbeat of a higher count than the one whose answer leased it was closed before this heartbeat
    /// was built, so that lease can no longer acknowledge anything (`docs/failover.md`, "Handing over").
    #[serde(default, skip_serializing_if = "is_zero")]
    pub seq: u64,
    /// Sent before its interval was up (a region opened or closed, or the last answer asked for it). The failure
    /// detector takes it as a sign of life, not as an interval: the datanode's regular heartbeats keep their
    /// schedule, and their spread is what suspicion is measured against.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub early: bool,
    /// Regions it closed since its last answered heartbeat, each with the last entry id it acknowledged: the
    /// region's next leader must replay at least that far ([`RegionToOpen::expected_last_entry_id`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub closed: Vec<ClosedRegion>,
}

/// A region a datanode closed, and the last entry id it acknowledged for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClosedRegion {
    /// The region.
    pub region_id: u64,
    /// The last entry id it acknowledged (or replayed) before the close.
    pub last_entry_id: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A region whose WAL tail was lost with its topic: the topic it wrote to was deleted (and perhaps created again
/// under the same name), so the entries after its checkpoint are gone. It is not opened: replaying the new topic
/// from the old checkpoint would skip or misplace entries without an error.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalLost {
    /// The region.
    pub region_id: u64,
    /// Its WAL topic.
    pub topic: String,
    /// Its checkpoint: entries up to it are in region storage; those after it were lost.
    pub checkpoint: u64,
    /// The topic incarnation the checkpoint counts.
    pub expected: TopicId,
    /// The id the brokers give the topic now (`None`: the topic does not exist).
    pub found: Option<TopicId>,
}

impl std::fmt::Display for WalLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let found = match self.found {
            Some(id) => format!("the brokers now list it under id {id}"),
            None => "the brokers no longer list it".to_string(),
        };
        write!(
            f,
            "region {}: its WAL topic '{}' is not the incarnation its checkpoint counts (topic id {}; {found}): \
             its entries after {} were lost with the old topic, so it is not opened",
            self.region_id, self.topic, self.expected, self.checkpoint
        )
    }
}

/// A lease on one region.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionLease {
    /// The region.
    pub region_id: u64,
    /// What the region may be until the lease ends.
    pub role: RegionRole,
    /// The region epoch the route gives it: written in every record the region appends under this lease.
    pub epoch: u64,
    /// How long the lease lasts, counted from when the heartbeat was sent.
    pub duration_ms: u64,
}

/// A region the datanode is to open, with what the metasrv knows of its WAL.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionToOpen {
    /// The region's open request (its WAL options among its options).
    pub request: RegionOpenRequest,
    /// The region epoch of its route.
    pub epoch: u64,
    /// On a Kafka topic: whether its `__topic_region` key exists. A region without one is not opened (a prune
    /// could not see what it writes).
    #[serde(default)]
    pub topic_region_key: bool,
    /// On a Kafka topic: its checkpoint in that key (`None` while it has none: it was never opened).
    #[serde(default)]
    pub checkpoint: Option<u64>,
    /// On a Kafka topic: the topic's pruned entry id (replay never starts below it).
    #[serde(default)]
    pub pruned_entry_id: u64,
    /// On a Kafka topic with a checkpoint: the topic incarnation the checkpoint counts (the id recorded with it,
    /// else the pool's recorded id of the topic). The datanode opens the region only if the brokers still give
    /// the topic this id ([`WalLost`] otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_id: Option<TopicId>,
    /// The last entry id a datanode that closed the region this term reported having acknowledged (the highest
    /// such report): a replay that ends below it missed acknowledged entries, and the region is not opened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_last_entry_id: Option<u64>,
}

/// What the metasrv asks of a datanode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Instruction {
    /// Open a region the route gives this datanode.
    Open(RegionToOpen),
    /// Close a region the route does not give this datanode.
    Close {
        /// The region.
        region_id: u64,
        /// Its table is being dropped: writes to it are answered that the table was dropped (a datanode that does
        /// not know the field closes the region all the same).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        dropped: bool,
    },
    /// Delete what this datanode holds of a dropped table's region: its region storage and (on the raft-engine
    /// WAL) its WAL entries, then report it in [`HeartbeatRequest::dropped`]. Sent only once no datanode leads the
    /// region; deleting what is already gone is no error.
    Drop {
        /// The region.
        region_id: u64,
        /// It wrote to this datanode's raft-engine WAL: its entries there are deleted too.
        #[serde(default)]
        raft_engine: bool,
    },
    /// Flush a region's unflushed entries to region storage.
    Flush {
        /// The region.
        region_id: u64,
    },
}

/// The answer to a heartbeat.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatResponse {
    /// A lease per region the route gives this datanode and that it reported open.
    pub leases: Vec<RegionLease>,
    /// What to do.
    pub instructions: Vec<Instruction>,
    /// When leases are held back (a new incarnation waits for its predecessor's leases to run out; a new metasrv
    /// leader waits one lease), how long still, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leases_in_ms: Option<u64>,
    /// Send the next heartbeat within this many milliseconds rather than a whole interval: leases are held back
    /// (this incarnation waits for its predecessor's, or a region the route gives it waits for another datanode
    /// to close it or for a lease to run out), and this is when to ask again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_in_ms: Option<u64>,
}

/// The writer id of a datanode incarnation in its WAL records: datanode id in the high 32 bits, incarnation in the
/// low 32 (never 0: incarnations start at 1).
pub fn writer_id(datanode_id: u64, incarnation: u64) -> u64 {
    (datanode_id << 32) | (incarnation & 0xffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_lease_is_three_intervals_and_a_second() {
        assert_eq!(lease_for(Duration::from_secs(3)), Duration::from_secs(10));
        assert_eq!(lease_for(Duration::from_secs(1)), Duration::from_secs(4));
    }

    #[test]
    fn instructions_read_as_their_kind() {
        let close = |dropped| Instruction::Close {
            region_id: 7,
            dropped,
        };
        let text = serde_json::to_string(&close(false)).unwrap();
        assert_eq!(text, r#"{"close":{"region_id":7}}"#);
        let text = serde_json::to_string(&close(true)).unwrap();
        assert_eq!(text, r#"{"close":{"region_id":7,"dropped":true}}"#);
        // An answer of this release read by a datanode of an earlier one: the field is ignored, the region closed.
        #[derive(Deserialize, Debug, PartialEq)]
        #[serde(rename_all = "snake_case")]
        enum Earlier {
            Close { region_id: u64 },
        }
        let earlier: Earlier = serde_json::from_str(&text).unwrap();
        assert_eq!(earlier, Earlier::Close { region_id: 7 });
    }
}
