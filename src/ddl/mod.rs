//! Table metadata, the table metadata allocator, the create-table procedure and the `DdlManager`.
