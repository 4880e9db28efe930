//! [`DdlContext`]: what DDL procedures use to do their work.

use crate::ddl::allocator::TableMetadataAllocatorRef;
use crate::ddl::datanode_manager::DatanodeManagerRef;
use crate::ddl::metadata_manager::TableMetadataManagerRef;

/// The services DDL procedures run against. Cheap to clone.
#[derive(Clone, Debug)]
pub struct DdlContext {
    /// Table metadata in the kv backend.
    pub metadata: TableMetadataManagerRef,
    /// Table ids, placement and WAL options.
    pub allocator: TableMetadataAllocatorRef,
    /// The datanodes.
    pub datanodes: DatanodeManagerRef,
}
