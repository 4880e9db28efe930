//! The `__table_allocation/{procedure_id}` key: the table id, region routes and WAL options a create-table
//! procedure reserved (`crate::ddl::allocator::TableAllocation`, its value), kept until the table's metadata is
//! written. The WAL's region counts read these too, so a reserved region counts before its table exists.

/// Prefix of allocation reservations.
pub const ALLOCATION_KEY_PREFIX: &str = "__table_allocation";

/// The kv key of the allocation reserved by procedure `procedure_id`.
pub fn allocation_key(procedure_id: &str) -> String {
    format!("{ALLOCATION_KEY_PREFIX}/{procedure_id}")
}
