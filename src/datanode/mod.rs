//! What the metasrv knows of datanodes, shared with the datanode package: what a datanode opens when it starts (every
//! `DatanodeTableValue` recorded for it, one [`RegionOpenRequest`] per region with its encoded WAL options). The
//! datanode runtime itself (log stores, replay, checkpoints, region storage, leases, the write path) is the
//! `datanode` package of the workspace, which depends on this crate and never the other way round.

pub mod open_request;
pub mod opener;
pub mod protocol;

pub use open_request::RegionOpenRequest;
pub use opener::{OpenRegions, RegionOpenError, RegionOpener, WalProviderKind};
