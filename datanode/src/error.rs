//! The datanode runtime's errors ([`Error`]): each names the region (and the file, topic or datanode) it is about,
//! and says whether the same call may succeed later ([`Error::is_retryable`]). Errors of the log stores, which the
//! datanode shares with the library, arrive as [`Error::Wal`].

use snafu::Snafu;

/// Result alias of the datanode runtime.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong on a datanode.
#[derive(Debug, Snafu)]
#[snafu(visibility(pub))]
#[non_exhaustive]
pub enum Error {
    /// Reading or writing region storage failed.
    #[snafu(display("region {region_id}: region storage '{path}': {source}"))]
    StorageIo {
        /// The region.
        region_id: u64,
        /// The file or directory.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A flush was ready to publish its file only after the region's lease ran out: nothing was published.
    #[snafu(display(
        "region {region_id}: the flush to '{path}' was not published: the region's lease ran out first"
    ))]
    StorageLate {
        /// The region.
        region_id: u64,
        /// The file it would have been.
        path: String,
    },
    /// A region storage file does not decode.
    #[snafu(display("region {region_id}: region storage file '{path}' is damaged: {reason}"))]
    StorageCorrupt {
        /// The region.
        region_id: u64,
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A log store or the metadata codecs failed.
    #[snafu(display("{source}"))]
    Wal {
        /// The library's error.
        source: remote_wal::Error,
    },
    /// A region this datanode does not have open.
    #[snafu(display(
        "region {region_id} is not open on datanode {datanode_id}{}",
        leader_hint(leader)
    ))]
    RegionNotOpen {
        /// The region.
        region_id: u64,
        /// This datanode.
        datanode_id: u64,
        /// The region's leader datanode's address, when known.
        leader: Option<String>,
    },
    /// A write to a region this datanode has open but does not lead (no lease, or its lease ran out).
    #[snafu(display(
        "datanode {datanode_id} is not the leader of region {region_id} ({why}){}",
        leader_hint(leader)
    ))]
    NotLeader {
        /// The region.
        region_id: u64,
        /// This datanode.
        datanode_id: u64,
        /// Why: `no lease`, `its lease ran out`, `the region is reopening`.
        why: String,
        /// The leader's address, when known.
        leader: Option<String>,
    },
    /// An append whose outcome cannot be told: it failed, timed out, or Kafka acknowledged it after the lease's
    /// deadline. The entries may or may not be in the WAL; none is acknowledged.
    #[snafu(display("region {region_id}: the write's outcome is unknown: {reason}"))]
    OutcomeUnknown {
        /// The region.
        region_id: u64,
        /// What happened.
        reason: String,
    },
    /// A Kafka region whose `__topic_region` key does not exist: it is not opened (a prune could not see what it
    /// writes).
    #[snafu(display(
        "region {region_id} on topic '{topic}' has no __topic_region key; it is not opened"
    ))]
    NoTopicRegionKey {
        /// The region.
        region_id: u64,
        /// The topic.
        topic: String,
    },
    /// The region's WAL options do not decode, or name a WAL this datanode is not configured for.
    #[snafu(display("region {region_id}: {reason}"))]
    RegionWal {
        /// The region.
        region_id: u64,
        /// What is wrong.
        reason: String,
    },
    /// The region's table was dropped: it takes no more writes, here or anywhere.
    #[snafu(display(
        "region {region_id} was dropped with its table: it takes no more writes (datanode {datanode_id})"
    ))]
    RegionDropped {
        /// The region.
        region_id: u64,
        /// This datanode.
        datanode_id: u64,
    },
    /// The region's WAL topic is not the incarnation its checkpoint counts: its entries after the checkpoint went
    /// with the old topic, and it is not opened.
    #[snafu(display("{lost}"))]
    WalTailLost {
        /// The region, its topic and both ids.
        lost: remote_wal::datanode::protocol::WalLost,
    },
    /// The metasrv said this incarnation is stale: a newer one of the same datanode registered.
    #[snafu(display(
        "datanode {datanode_id}: incarnation {incarnation} is stale (a newer one registered); stopped serving"
    ))]
    StaleIncarnation {
        /// The datanode.
        datanode_id: u64,
        /// This process's incarnation.
        incarnation: u64,
    },
    /// No metasrv answered, or it refused.
    #[snafu(display("metasrv {endpoints}: {detail}"))]
    Metasrv {
        /// The servers tried.
        endpoints: String,
        /// What happened.
        detail: String,
        /// Whether trying again may help.
        retryable: bool,
    },
}

fn leader_hint(leader: &Option<String>) -> String {
    match leader {
        Some(l) => format!("; its leader is at {l}"),
        None => String::new(),
    }
}

impl Error {
    /// Whether the same call may succeed later (another lease, another leader, a service back).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Wal { source } => source.is_retryable(),
            Error::RegionNotOpen { .. } | Error::NotLeader { .. } => true,
            Error::Metasrv { retryable, .. } => *retryable,
            Error::StorageLate { .. } => true,
            Error::StorageIo { .. }
            | Error::StorageCorrupt { .. }
            | Error::OutcomeUnknown { .. }
            | Error::NoTopicRegionKey { .. }
            | Error::RegionWal { .. }
            | Error::WalTailLost { .. }
            | Error::RegionDropped { .. }
            | Error::StaleIncarnation { .. } => false,
        }
    }
}

impl From<remote_wal::wal::Error> for Error {
    fn from(source: remote_wal::wal::Error) -> Self {
        Error::Wal {
            source: source.into(),
        }
    }
}

impl From<remote_wal::Error> for Error {
    fn from(source: remote_wal::Error) -> Self {
        Error::Wal { source }
    }
}
