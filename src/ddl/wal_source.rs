//! [`WalOptionsSource`]: where the create-table procedure gets the WAL options of new regions.

use std::fmt::Debug;
use std::sync::Arc;

use crate::error::Result;
use crate::wal::WalOptions;

/// Hands out WAL options for new regions. The WAL options allocator implements it; tests mock it.
#[cfg_attr(test, mockall::automock)]
pub trait WalOptionsSource: Send + Sync + Debug {
    /// Options for `n` new regions (fails when, e.g., the Kafka topic pool is not ready).
    fn alloc_batch(&self, n: usize) -> Result<Vec<WalOptions>>;
}

/// A shared [`WalOptionsSource`].
pub type WalOptionsSourceRef = Arc<dyn WalOptionsSource>;

/// Every region on the local raft-engine WAL.
#[derive(Clone, Copy, Debug, Default)]
pub struct RaftEngineWalSource;

impl WalOptionsSource for RaftEngineWalSource {
    fn alloc_batch(&self, n: usize) -> Result<Vec<WalOptions>> {
        Ok(vec![WalOptions::RaftEngine; n])
    }
}

impl WalOptionsSource for crate::wal::allocator::WalOptionsAllocator {
    fn alloc_batch(&self, n: usize) -> Result<Vec<WalOptions>> {
        crate::wal::allocator::WalOptionsAllocator::alloc_batch(self, n)
    }
}
