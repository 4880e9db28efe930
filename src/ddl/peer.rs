//! [`PeerSelector`]: on which datanodes a new table's regions go.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use snafu::ensure;

use crate::ddl::error::{NoDatanodesSnafu, Result};

/// Chooses a datanode for each region of a new table.
#[cfg_attr(test, mockall::automock)]
pub trait PeerSelector: Send + Sync + Debug {
    /// One datanode id per region, in region-number order.
    fn select(&self, num_regions: usize) -> Result<Vec<u64>>;
}

/// A shared [`PeerSelector`].
pub type PeerSelectorRef = Arc<dyn PeerSelector>;

/// Round-robin over a fixed list of datanodes: each region goes to the datanode after the previous region's,
/// continuing across tables. A new selector starts at the first datanode.
#[derive(Debug)]
pub struct RoundRobinPeerSelector {
    datanodes: Vec<u64>,
    next: AtomicUsize,
}

impl RoundRobinPeerSelector {
    /// A selector over `datanodes` (an empty list makes every selection fail).
    pub fn new(datanodes: Vec<u64>) -> Self {
        RoundRobinPeerSelector {
            datanodes,
            next: AtomicUsize::new(0),
        }
    }
}

impl PeerSelector for RoundRobinPeerSelector {
    fn select(&self, num_regions: usize) -> Result<Vec<u64>> {
        ensure!(!self.datanodes.is_empty(), NoDatanodesSnafu { num_regions });
        let first = self.next.fetch_add(num_regions, Ordering::Relaxed);
        Ok((0..num_regions)
            .map(|i| self.datanodes[first.wrapping_add(i) % self.datanodes.len()])
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_continues_across_calls() {
        let s = RoundRobinPeerSelector::new(vec![1, 2, 3]);
        assert_eq!(s.select(4).unwrap(), vec![1, 2, 3, 1]);
        assert_eq!(s.select(2).unwrap(), vec![2, 3]);
    }

    #[test]
    fn no_datanodes_is_an_error() {
        let err = RoundRobinPeerSelector::new(vec![]).select(2).unwrap_err();
        assert!(err.to_string().contains("no datanode"), "{err}");
    }
}
