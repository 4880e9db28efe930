//! One open region on a datanode: its WAL, its lease (role, region epoch, deadline), and its memtable — the entries
//! acknowledged since its last flush, which region storage does not hold yet.
//!
//! **The lease rule.** A region takes a write only while it is leader and its lease's deadline is ahead; it
//! acknowledges the write only if the WAL acknowledged the append before that deadline (the append itself runs
//! under a timeout that ends at the deadline). A write whose append failed, timed out or finished late is answered
//! "outcome unknown", and the region stops taking writes until it has been reopened from storage and its WAL (so
//! its memtable holds exactly what a reopening datanode would see). A lapsed lease makes the region a follower.

use std::sync::Arc;
use std::time::Instant;

use remote_wal::datanode::protocol::{RegionRole, RegionStat, RegionToOpen};

use crate::log_store::{Entry, EntryId, RaftEngineLogStore, RegionId};

/// Where a region's WAL is.
#[derive(Clone, Debug)]
pub enum RegionWal {
    /// A Kafka topic shared with other regions (this datanode's store of it).
    Kafka {
        /// The topic.
        topic: String,
        /// The datanode's store on it.
        store: Arc<crate::runtime::TopicStore>,
    },
    /// The datanode's raft-engine directory.
    RaftEngine(RaftEngineLogStore),
    /// No WAL: acknowledged entries live in the memtable until a flush.
    Noop,
}

impl RegionWal {
    /// `topic 'T'`, `raft-engine`, `noop`.
    pub fn describe(&self) -> String {
        match self {
            RegionWal::Kafka { topic, .. } => format!("topic '{topic}'"),
            RegionWal::RaftEngine(_) => "raft-engine".to_string(),
            RegionWal::Noop => "noop".to_string(),
        }
    }
}

/// The lease side of a region: read by every write and heartbeat, never held across an await.
#[derive(Clone, Copy, Debug)]
pub struct LeaseState {
    /// Leader while a lease holds.
    pub role: RegionRole,
    /// The region epoch of the last lease.
    pub epoch: u64,
    /// When the lease ends (monotonic; counted from the sending of the heartbeat that brought it).
    pub deadline: Option<Instant>,
    /// An append's outcome was unknown: no write until the region is reopened.
    pub needs_reopen: bool,
}

impl LeaseState {
    /// The deadline of a lease that lets the region write now, if it has one.
    pub fn writable_until(&self, now: Instant) -> Option<Instant> {
        match (self.role, self.deadline) {
            (RegionRole::Leader, Some(deadline)) if deadline > now && !self.needs_reopen => {
                Some(deadline)
            }
            _ => None,
        }
    }
}

/// The write side of a region, held across an append or a flush (one at a time per region).
#[derive(Debug, Default)]
pub struct Memtable {
    /// Entries acknowledged since the last flush, in entry-id order.
    pub entries: Vec<Entry>,
    /// Their bytes.
    pub bytes: usize,
}

/// Figures a heartbeat reports, kept apart so a heartbeat never waits for an append.
#[derive(Clone, Copy, Debug, Default)]
pub struct RegionCounters {
    /// The last acknowledged entry id (the region's start when none).
    pub last_entry_id: EntryId,
    /// Entries up to here are in storage.
    pub flushed_entry_id: EntryId,
    /// Unflushed bytes.
    pub memtable_bytes: u64,
}

/// One open region.
#[derive(Debug)]
pub struct Region {
    /// The region.
    pub id: RegionId,
    /// Its WAL.
    pub wal: RegionWal,
    /// What it was opened from (reopened from the same, with its current checkpoint).
    pub opened_from: RegionToOpen,
    /// Appends and flushes, one at a time.
    pub memtable: tokio::sync::Mutex<Memtable>,
    lease: std::sync::Mutex<LeaseState>,
    counters: std::sync::Mutex<RegionCounters>,
    /// The region epoch this datanode last wrote a fence record at (0: none). A Kafka region leading at a higher
    /// epoch writes one before its first entry (`Datanode::write`).
    fenced_epoch: std::sync::atomic::AtomicU64,
}

impl Region {
    /// A region opened as follower (no lease yet), with `memtable` replayed and `counters` as found.
    pub fn new(
        id: RegionId,
        wal: RegionWal,
        opened_from: RegionToOpen,
        memtable: Memtable,
        counters: RegionCounters,
    ) -> Self {
        Region {
            id,
            wal,
            lease: std::sync::Mutex::new(LeaseState {
                role: RegionRole::Follower,
                epoch: opened_from.epoch,
                deadline: None,
                needs_reopen: false,
            }),
            opened_from,
            memtable: tokio::sync::Mutex::new(memtable),
            counters: std::sync::Mutex::new(counters),
            fenced_epoch: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The lease state now.
    pub fn lease(&self) -> LeaseState {
        *self
            .lease
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes a lease: `role` at `epoch` until `deadline`. A deadline earlier than the one held (an answer that
    /// overtook a later one) does not shorten it.
    pub fn grant(&self, role: RegionRole, epoch: u64, deadline: Instant) {
        let mut lease = self
            .lease
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if lease.epoch != epoch {
            lease.deadline = None;
        }
        lease.role = role;
        lease.epoch = epoch;
        lease.deadline = Some(match lease.deadline {
            Some(held) if held > deadline => held,
            _ => deadline,
        });
        if let RegionWal::Kafka { store, .. } = &self.wal {
            store.register_region(self.id, epoch);
        }
    }

    /// Gives up the lease at once (the region stops taking writes).
    pub fn revoke(&self) {
        let mut lease = self
            .lease
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        lease.role = RegionRole::Follower;
        lease.deadline = None;
    }

    /// Marks that an append's outcome is unknown: no write until reopened.
    pub fn poison(&self) {
        let mut lease = self
            .lease
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        lease.needs_reopen = true;
        lease.role = RegionRole::Follower;
        lease.deadline = None;
    }

    /// The region epoch this datanode last wrote a fence record at (0: none).
    pub fn fenced_epoch(&self) -> u64 {
        self.fenced_epoch.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Records that a fence record at `epoch` is written.
    pub fn set_fenced_epoch(&self, epoch: u64) {
        self.fenced_epoch
            .fetch_max(epoch, std::sync::atomic::Ordering::SeqCst);
    }

    /// The counters now.
    pub fn counters(&self) -> RegionCounters {
        *self
            .counters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Changes the counters.
    pub fn update_counters(&self, change: impl FnOnce(&mut RegionCounters)) {
        let mut counters = self
            .counters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        change(&mut counters);
    }

    /// What a heartbeat reports of the region at `now` (leader only while its lease holds).
    pub fn stat(&self, now: Instant) -> RegionStat {
        let lease = self.lease();
        let counters = self.counters();
        RegionStat {
            region_id: self.id,
            role: if lease.writable_until(now).is_some() {
                RegionRole::Leader
            } else {
                RegionRole::Follower
            },
            epoch: lease.epoch,
            last_entry_id: counters.last_entry_id,
            flushed_entry_id: counters.flushed_entry_id,
            memtable_bytes: counters.memtable_bytes,
            topic_id: match &self.wal {
                RegionWal::Kafka { .. } => self.opened_from.topic_id,
                _ => None,
            },
        }
    }
}
