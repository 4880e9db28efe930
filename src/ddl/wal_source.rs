//! [`WalOptionsSource`]: where the create-table procedure gets the WAL options of new regions.

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;

use crate::ddl::error::Result;
use crate::wal::WalOptions;

/// Hands out WAL options for new regions. The WAL options allocator implements it; tests mock it.
#[cfg_attr(test, mockall::automock)]
#[async_trait]
pub trait WalOptionsSource: Send + Sync + Debug {
    /// Makes the source ready to allocate if what it needs is already persisted (for a Kafka pool: loads the
    /// persisted topic names when a bootstrap, possibly another process's, has completed since the source was
    /// built). An error (e.g. `TopicPoolNotReady`) when it still is not ready. By default there is nothing to load.
    async fn load_if_needed(&self) -> Result<()> {
        Ok(())
    }

    /// Options for `n` new regions (fails when, e.g., the Kafka topic pool is not ready).
    fn alloc_batch(&self, n: usize) -> Result<Vec<WalOptions>>;
}

/// A shared [`WalOptionsSource`].
pub type WalOptionsSourceRef = Arc<dyn WalOptionsSource>;

/// Every region on the local raft-engine WAL.
#[derive(Clone, Copy, Debug, Default)]
pub struct RaftEngineWalSource;

#[async_trait]
impl WalOptionsSource for RaftEngineWalSource {
    fn alloc_batch(&self, n: usize) -> Result<Vec<WalOptions>> {
        Ok(vec![WalOptions::RaftEngine; n])
    }
}

#[async_trait]
impl WalOptionsSource for crate::wal::allocator::WalOptionsAllocator {
    async fn load_if_needed(&self) -> Result<()> {
        match self {
            crate::wal::allocator::WalOptionsAllocator::Kafka(topics) if !topics.is_ready() => {
                Ok(topics.load_ready().await?)
            }
            _ => Ok(()),
        }
    }

    fn alloc_batch(&self, n: usize) -> Result<Vec<WalOptions>> {
        Ok(crate::wal::allocator::WalOptionsAllocator::alloc_batch(
            self, n,
        )?)
    }
}
