//! Table metadata (keys and values in the kv backend), the table metadata allocator, the create-table, drop-table,
//! region-migration and datanode-failover procedures and the [`DdlManager`] that runs create-table.

pub mod allocator;
pub mod context;
pub mod create_table;
pub mod datanode_failover;
pub mod datanode_manager;
pub mod ddl_manager;
pub mod drop_table;
pub mod error;
pub mod metadata_manager;
pub mod peer;
pub mod procedure_id;
pub mod region;
pub mod region_migration;
pub mod sequence;
pub mod task;
pub mod wal_source;

pub use crate::key::datanode_table::DatanodeTableValue;
pub use crate::key::table_name::TableName;
pub use allocator::{TableAllocation, TableMetadataAllocator, TableMetadataAllocatorRef};
pub use context::DdlContext;
pub use create_table::{CREATE_TABLE_TYPE_NAME, CreateTableProcedure};
pub use datanode_failover::{
    DATANODE_FAILOVER_TYPE_NAME, DatanodeFailoverProcedure, failover_procedure_id,
};
pub use datanode_manager::{
    DatanodeManager, DatanodeManagerRef, MemoryDatanodeManager, RegionCreateRequest,
};
pub use ddl_manager::DdlManager;
pub use drop_table::{DROP_TABLE_TYPE_NAME, DropTableProcedure, DropTableTask};
pub use error::Error;
pub use metadata_manager::{TableMetadata, TableMetadataManager, TableMetadataManagerRef};
pub use peer::{PeerSelector, PeerSelectorRef, RoundRobinPeerSelector};
pub use region_migration::{
    MigrationContext, REGION_MIGRATION_TYPE_NAME, RegionLeadership, RegionMigrationProcedure,
    RegionMigrationTask,
};
pub use task::CreateTableTask;
pub use wal_source::{RaftEngineWalSource, WalOptionsSource, WalOptionsSourceRef};

#[cfg(test)]
mod create_table_tests;
