//! Every metadata key the metasrv writes, each with its one codec: the key's layout, building it, parsing it back
//! (naming the key when it does not parse), and its value's bytes. Everything that reads or writes one of these
//! keys — the DDL procedures, the WAL allocator and prune, `wal stats`, the datanode side — goes through here, so
//! a layout lives in one place. The layouts are GreptimeDB's where it has the same key (`docs/metadata-store.md`).
//!
//! | key | module |
//! |---|---|
//! | `__table_name/{catalog}/{schema}/{table}` | [`table_name`] |
//! | `__table_info/{table_id}` | [`table_info`] |
//! | `__table_route/{table_id}` | [`table_route`] |
//! | `__dn_table/{datanode_id}/{table_id}` | [`datanode_table`] |
//! | `__table_allocation/{procedure_id}` | [`table_allocation`] |
//! | `__topic_name/kafka/{topic}` | [`topic_name`] |
//! | `__topic_region/{topic}/{region_id}` | [`topic_region`] |
//! | `__region_drop/{region_id}` | [`region_drop`] |
//!
//! Keys that belong to one mechanism stay with it: the procedure engine's records (`procedures`) and the table-id
//! sequence (`crate::ddl::sequence`).

pub mod datanode_table;
pub mod region_drop;
pub mod table_allocation;
pub mod table_info;
pub mod table_name;
pub mod table_route;
pub mod topic_name;
pub mod topic_region;
