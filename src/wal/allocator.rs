//! [`WalOptionsAllocator`]: hands WAL options to new regions — the local raft-engine WAL, or a topic of the Kafka
//! pool once its bootstrap procedure has completed.

use std::sync::Arc;

use procedures::{ProcedureManager, ProcedureManagerRef};

use crate::kv::KvBackendRef;
use crate::wal::config::WalConfig;
use crate::wal::error::Result;
use crate::wal::kafka::KafkaTopicManager;
use crate::wal::kafka::rskafka_admin::RsKafkaTopicAdmin;
use crate::wal::options::WalOptions;

/// Allocates [`WalOptions`] for new regions.
#[derive(Debug)]
pub enum WalOptionsAllocator {
    /// Every region writes to its datanode's raft-engine WAL; ready at once.
    RaftEngine,
    /// Regions write to topics of a Kafka pool; ready after [`WalOptionsAllocator::start`].
    Kafka(KafkaTopicManager),
}

/// A shared [`WalOptionsAllocator`].
pub type WalOptionsAllocatorRef = Arc<WalOptionsAllocator>;

impl WalOptionsAllocator {
    /// The allocator `config` asks for. Kafka: validates the config and connects to the brokers (failing within
    /// the backoff deadline, naming the endpoints, when none answers); persisted names go to `kv`.
    pub async fn from_config(config: &WalConfig, kv: KvBackendRef) -> Result<Self> {
        match config {
            WalConfig::RaftEngine => Ok(WalOptionsAllocator::RaftEngine),
            WalConfig::Kafka(kafka) => {
                let admin = Arc::new(RsKafkaTopicAdmin::connect(kafka).await?);
                Ok(WalOptionsAllocator::Kafka(KafkaTopicManager::from_config(
                    kafka, kv, admin,
                )?))
            }
        }
    }

    /// Registers the loaders of the procedures `start` submits; call before the procedure manager starts.
    pub fn register_loaders(&self, manager: &dyn ProcedureManager) -> Result<()> {
        match self {
            WalOptionsAllocator::RaftEngine => Ok(()),
            WalOptionsAllocator::Kafka(topics) => topics.register_loader(manager),
        }
    }

    /// Makes the allocator ready. Raft-engine: nothing to do. Kafka: runs (or joins, or resumes) the pool's
    /// bootstrap procedure on `manager` (started, with [`Self::register_loaders`] done), waits for it and loads the
    /// pool; an error when the bootstrap fails.
    pub async fn start(&self, manager: &ProcedureManagerRef) -> Result<()> {
        self.start_with(manager, false).await
    }

    /// [`Self::start`], recreating lost pool topics when `recreate_missing` (see
    /// [`crate::wal::kafka::KafkaTopicManager::start_with`]).
    pub async fn start_with(
        &self,
        manager: &ProcedureManagerRef,
        recreate_missing: bool,
    ) -> Result<()> {
        match self {
            WalOptionsAllocator::RaftEngine => Ok(()),
            WalOptionsAllocator::Kafka(topics) => {
                topics.start_with(manager, recreate_missing).await
            }
        }
    }

    /// Whether `alloc` can succeed.
    pub fn is_ready(&self) -> bool {
        match self {
            WalOptionsAllocator::RaftEngine => true,
            WalOptionsAllocator::Kafka(topics) => topics.is_ready(),
        }
    }

    /// Options for one new region; an error (never a fallback to raft-engine) while the Kafka pool is not ready.
    pub fn alloc(&self) -> Result<WalOptions> {
        match self {
            WalOptionsAllocator::RaftEngine => Ok(WalOptions::RaftEngine),
            WalOptionsAllocator::Kafka(topics) => topics.alloc(),
        }
    }

    /// Options for `n` new regions, in order; an error (never a fallback) while the Kafka pool is not ready.
    pub fn alloc_batch(&self, n: usize) -> Result<Vec<WalOptions>> {
        match self {
            WalOptionsAllocator::RaftEngine => Ok(vec![WalOptions::RaftEngine; n]),
            WalOptionsAllocator::Kafka(topics) => topics.alloc_batch(n),
        }
    }
}
