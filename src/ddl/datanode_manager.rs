//! [`DatanodeManager`]: how the metasrv asks datanodes to create regions, and [`MemoryDatanodeManager`], an
//! in-memory fleet of datanodes for tests, benchmarks and the CLI. Its fault injection
//! (`MemoryDatanodeManager::fail_next`) exists only with the `testing` feature.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::ddl::error::{RegionExistsWithDifferentOptionsSnafu, Result};

/// Asks one datanode to create one region.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionCreateRequest {
    /// `(table_id << 32) | region_number`.
    pub region_id: u64,
    /// The storage engine.
    pub engine: String,
    /// The region's directory.
    pub region_dir: String,
    /// The region's options, including `wal_options` (the encoded WAL options).
    pub options: BTreeMap<String, String>,
}

/// Talks to datanodes.
#[cfg_attr(test, mockall::automock)]
#[async_trait]
pub trait DatanodeManager: Send + Sync + Debug {
    /// Creates a region on `datanode_id`. A region that exists with exactly this request counts as created; one
    /// that exists with other options is an error. An unreachable datanode is a retryable error.
    async fn create_region(&self, datanode_id: u64, request: RegionCreateRequest) -> Result<()>;

    /// Whether [`DatanodeManager::drop_region`] is implemented. A create-table rollback (after a failure, or a
    /// cancel) drops the regions it created only when it is; otherwise the rollback fails, naming the regions it
    /// leaves on the datanodes. Default: `false`.
    fn can_drop_regions(&self) -> bool {
        false
    }

    /// Drops region `region_id` on `datanode_id`, closing it first; a region that does not exist counts as dropped
    /// (so a rollback can run again). An unreachable datanode is a retryable error. The default refuses (see
    /// [`DatanodeManager::can_drop_regions`]).
    async fn drop_region(&self, datanode_id: u64, region_id: u64) -> Result<()> {
        crate::ddl::error::DatanodeUnavailableSnafu {
            datanode_id,
            action: format!("dropping region {region_id}"),
            reason: "this datanode manager cannot drop regions",
        }
        .fail()
    }
}

/// A shared [`DatanodeManager`].
pub type DatanodeManagerRef = Arc<dyn DatanodeManager>;

/// Datanodes in memory: records every region created on each, and how many times each region was created (a
/// repeated identical request is accepted but not counted as a creation).
#[derive(Debug, Default)]
pub struct MemoryDatanodeManager {
    inner: Mutex<MemoryDatanodes>,
}

#[derive(Debug, Default)]
struct MemoryDatanodes {
    regions: BTreeMap<u64, BTreeMap<u64, RegionCreateRequest>>,
    creations: BTreeMap<u64, usize>,
    drops: BTreeMap<u64, usize>,
    calls: usize,
    #[cfg(any(test, feature = "testing"))]
    unavailable: BTreeMap<u64, usize>,
}

impl MemoryDatanodeManager {
    /// No regions anywhere.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, MemoryDatanodes> {
        // Every change is complete before the lock is released, so a poisoned lock still holds a consistent state.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every region, by datanode id then region id.
    pub fn regions(&self) -> BTreeMap<u64, BTreeMap<u64, RegionCreateRequest>> {
        self.lock().regions.clone()
    }

    /// How many times each region was actually created (not counting accepted repeats).
    pub fn creations(&self) -> BTreeMap<u64, usize> {
        self.lock().creations.clone()
    }

    /// How many `create_region` calls arrived (including repeats and refused ones).
    pub fn calls(&self) -> usize {
        self.lock().calls
    }

    /// How many times each region was actually dropped (a drop of an absent region is not counted).
    pub fn drops(&self) -> BTreeMap<u64, usize> {
        self.lock().drops.clone()
    }

    /// Makes the next `times` calls to `datanode_id` fail as unavailable (retryable). Fault injection for tests:
    /// only with the `testing` feature.
    #[cfg(any(test, feature = "testing"))]
    pub fn fail_next(&self, datanode_id: u64, times: usize) {
        self.lock().unavailable.insert(datanode_id, times);
    }
}

#[async_trait]
impl DatanodeManager for MemoryDatanodeManager {
    async fn create_region(&self, datanode_id: u64, request: RegionCreateRequest) -> Result<()> {
        let mut inner = self.lock();
        inner.calls += 1;
        #[cfg(any(test, feature = "testing"))]
        if let Some(left) = inner.unavailable.get_mut(&datanode_id)
            && *left > 0
        {
            *left -= 1;
            return crate::ddl::error::DatanodeUnavailableSnafu {
                datanode_id,
                action: format!("creating region {}", request.region_id),
                reason: "injected unavailability",
            }
            .fail();
        }
        let regions = inner.regions.entry(datanode_id).or_default();
        match regions.get(&request.region_id) {
            Some(existing) if *existing == request => Ok(()),
            Some(existing) => RegionExistsWithDifferentOptionsSnafu {
                region_id: request.region_id,
                datanode_id,
                existing: format!("{existing:?}"),
                requested: format!("{request:?}"),
            }
            .fail(),
            None => {
                let region_id = request.region_id;
                regions.insert(region_id, request);
                *inner.creations.entry(region_id).or_default() += 1;
                Ok(())
            }
        }
    }

    fn can_drop_regions(&self) -> bool {
        true
    }

    async fn drop_region(&self, datanode_id: u64, region_id: u64) -> Result<()> {
        let mut inner = self.lock();
        inner.calls += 1;
        #[cfg(any(test, feature = "testing"))]
        if let Some(left) = inner.unavailable.get_mut(&datanode_id)
            && *left > 0
        {
            *left -= 1;
            return crate::ddl::error::DatanodeUnavailableSnafu {
                datanode_id,
                action: format!("dropping region {region_id}"),
                reason: "injected unavailability",
            }
            .fail();
        }
        let dropped = inner
            .regions
            .get_mut(&datanode_id)
            .and_then(|regions| regions.remove(&region_id))
            .is_some();
        if inner
            .regions
            .get(&datanode_id)
            .is_some_and(|r| r.is_empty())
        {
            inner.regions.remove(&datanode_id);
        }
        if dropped {
            *inner.drops.entry(region_id).or_default() += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(region_id: u64, wal: &str) -> RegionCreateRequest {
        RegionCreateRequest {
            region_id,
            engine: "mito".into(),
            region_dir: format!("data/r{region_id}/"),
            options: BTreeMap::from([("wal_options".into(), wal.into())]),
        }
    }

    #[tokio::test]
    async fn same_request_twice_is_one_creation() {
        let m = MemoryDatanodeManager::new();
        m.create_region(1, req(7, "a")).await.unwrap();
        m.create_region(1, req(7, "a")).await.unwrap();
        assert_eq!(m.creations(), BTreeMap::from([(7, 1)]));
        assert_eq!(m.calls(), 2);
        assert_eq!(m.regions()[&1][&7], req(7, "a"));
    }

    #[tokio::test]
    async fn a_dropped_region_is_gone_and_dropping_it_again_is_fine() {
        let m = MemoryDatanodeManager::new();
        m.create_region(1, req(7, "a")).await.unwrap();
        m.create_region(1, req(8, "a")).await.unwrap();
        m.drop_region(1, 7).await.unwrap();
        m.drop_region(1, 7).await.unwrap();
        assert_eq!(m.drops(), BTreeMap::from([(7, 1)]));
        assert_eq!(m.regions()[&1].keys().copied().collect::<Vec<_>>(), [8]);
        m.drop_region(1, 8).await.unwrap();
        assert!(m.regions().is_empty(), "no datanode left without regions");
        // Recreated after a drop: the same request creates it again.
        m.create_region(1, req(7, "a")).await.unwrap();
        assert_eq!(m.creations()[&7], 2);
    }

    #[tokio::test]
    async fn different_options_are_refused() {
        let m = MemoryDatanodeManager::new();
        m.create_region(1, req(7, "a")).await.unwrap();
        let err = m.create_region(1, req(7, "b")).await.unwrap_err();
        assert!(!err.is_retryable());
        assert!(err.to_string().contains("region 7"), "{err}");
        assert_eq!(m.regions()[&1][&7], req(7, "a"));
    }

    #[tokio::test]
    async fn injected_unavailability_is_retryable() {
        let m = MemoryDatanodeManager::new();
        m.fail_next(2, 1);
        let err = m.create_region(2, req(7, "a")).await.unwrap_err();
        assert!(
            err.is_retryable() && err.to_string().contains("datanode 2"),
            "{err}"
        );
        m.create_region(2, req(7, "a")).await.unwrap();
    }
}
