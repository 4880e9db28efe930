//! `walctl open-regions --replay` on the embedded default (raft-engine WAL in `./walctl-data/wal/{datanode}`):
//! each region reports the entries and bytes of its WAL, in text and JSON.

use datanode::log_store::{EntryToWrite, LogStore, RaftEngineLogStore};

use crate::support::Env;

#[test]
fn replay_reports_each_regions_entries_and_bytes() {
    let env = Env::new();
    let created = env.json(None, &["create-table", "public.replayed", "--regions", "3"]);
    let ids: Vec<u64> = created
        .iter()
        .map(|r| r["region_id"].as_u64().expect("region_id"))
        .collect();

    // Before anything is written: every region replays nothing, and no WAL directory is created.
    let opened = env.json(None, &["open-regions", "--datanode", "1", "--replay"]);
    assert_eq!(opened.len(), 3);
    for line in &opened {
        assert_eq!(line["entries_replayed"].as_u64(), Some(0), "{line}");
        assert_eq!(line["bytes_replayed"].as_u64(), Some(0), "{line}");
    }
    let wal_dir = env.dir.path().join("walctl-data/wal/1");
    assert!(
        !wal_dir.exists(),
        "a read-only replay creates no WAL directory"
    );

    // The datanode writes: region 0 two entries, region 2 one.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let store = RaftEngineLogStore::open(&wal_dir)
            .await
            .expect("open the WAL");
        let entry = |region_id: u64, n: usize| EntryToWrite {
            region_id,
            data: vec![7; n],
        };
        store
            .append(vec![
                entry(ids[0], 100),
                entry(ids[2], 30),
                entry(ids[0], 50),
            ])
            .await
            .expect("append");
    });

    let opened = env.json(None, &["open-regions", "--datanode", "1", "--replay"]);
    let by_region = |id: u64| {
        opened
            .iter()
            .find(|l| l["region_id"].as_u64() == Some(id))
            .unwrap_or_else(|| panic!("region {id} in {opened:?}"))
    };
    assert_eq!(by_region(ids[0])["entries_replayed"].as_u64(), Some(2));
    assert_eq!(by_region(ids[0])["bytes_replayed"].as_u64(), Some(150));
    assert_eq!(by_region(ids[1])["entries_replayed"].as_u64(), Some(0));
    assert_eq!(by_region(ids[2])["entries_replayed"].as_u64(), Some(1));
    assert_eq!(by_region(ids[2])["bytes_replayed"].as_u64(), Some(30));
    assert_eq!(
        by_region(ids[0])["kind"],
        "request",
        "the fields open-regions --json has stay"
    );
    assert!(by_region(ids[0])["region_dir"].is_string());

    let text = env.ok(None, &["open-regions", "--datanode", "1", "--replay"]);
    assert!(text.contains("ENTRIES_REPLAYED"), "{text}");
    assert!(
        text.contains("replayed 3 entries (180 bytes) of 3 regions in "),
        "{text}"
    );
    // Without --replay the JSON has no replay fields.
    let plain = env.json(None, &["open-regions", "--datanode", "1"]);
    assert!(plain[0].get("entries_replayed").is_none(), "{:?}", plain[0]);
}
