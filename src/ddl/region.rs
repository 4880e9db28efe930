//! Region ids and directories.

/// The id of region `region_number` of table `table_id`: `(table_id << 32) | region_number`.
pub fn region_id(table_id: u32, region_number: u32) -> u64 {
    (u64::from(table_id) << 32) | u64::from(region_number)
}

/// The table id of a region id.
pub fn region_table_id(region_id: u64) -> u32 {
    (region_id >> 32) as u32
}

/// The region number of a region id.
pub fn region_number(region_id: u64) -> u32 {
    (region_id & u64::from(u32::MAX)) as u32
}

/// The storage path of a schema's regions: `{catalog}/{schema}`.
pub fn region_storage_path(catalog: &str, schema: &str) -> String {
    format!("{catalog}/{schema}")
}

/// The directory of one region: `data/{storage_path}/{table_id}/{table_id}_{region_number:010}/`.
pub fn region_dir(storage_path: &str, table_id: u32, region_number: u32) -> String {
    format!("data/{storage_path}/{table_id}/{table_id}_{region_number:010}/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_id_packs_table_and_number() {
        let id = region_id(1024, 3);
        assert_eq!(id, (1024u64 << 32) | 3);
        assert_eq!(region_table_id(id), 1024);
        assert_eq!(region_number(id), 3);
        assert_eq!(region_id(u32::MAX, u32::MAX), u64::MAX);
    }

    #[test]
    fn region_dir_layout() {
        assert_eq!(
            region_dir(&region_storage_path("greptime", "public"), 1024, 7),
            "data/greptime/public/1024/1024_0000000007/"
        );
    }
}
