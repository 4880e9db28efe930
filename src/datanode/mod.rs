//! What a datanode opens when it starts: it reads every `DatanodeTableValue` recorded for it and turns each region
//! into a [`RegionOpenRequest`] carrying the region's encoded WAL options.

pub mod checkpoint;
pub mod log_store;
pub mod open_request;
pub mod opener;
pub mod prune_deleter;
pub mod replay;

pub use open_request::RegionOpenRequest;
pub use opener::{OpenRegions, RegionOpenError, RegionOpener, WalProviderKind};
