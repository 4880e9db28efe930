//! What the registry and the metasrv tell about a region's place: `region_to_open_by_id` (the datanode the route
//! names and the region's open request) and `Metasrv::table_leaders` (each region's leader datanode and the
//! address it registered).

use remote_wal::datanode::protocol::RegionToOpen;
use remote_wal::datanode::{RegionOpener, WalProviderKind};
use remote_wal::metasrv::datanodes::RegionLeader;

use super::*;

#[tokio::test]
async fn region_to_open_by_id_names_the_routes_datanode_and_its_open_request() {
    let kv = memory_kv();
    let m = raft_metasrv(&kv, vec![1, 2]).await;
    let created = create(&m, "by_id", 4).await;
    set_region_epochs(m.kv(), created.table_id, &[(1, 6), (2, 9)]).await;
    let registry = m.datanode_registry();
    registry.begin_term();

    for placed in &created.regions {
        let open = RegionOpener::new(kv.clone(), placed.datanode_id, WalProviderKind::RaftEngine)
            .open_regions()
            .await
            .unwrap();
        let request = open
            .requests
            .into_iter()
            .find(|r| r.region_id == placed.region_id)
            .expect("its datanode's opener lists it");
        let found = registry
            .region_to_open_by_id(placed.region_id)
            .await
            .unwrap();
        assert_eq!(
            found,
            Some((
                placed.datanode_id,
                RegionToOpen {
                    request,
                    epoch: [0, 6, 9, 0][placed.region_number as usize],
                    topic_region_key: false,
                    checkpoint: None,
                    pruned_entry_id: 0,
                    topic_id: None,
                    expected_last_entry_id: None,
                }
            )),
            "region {}",
            placed.region_number
        );
    }
    // Both datanodes serve the table.
    let datanodes: BTreeSet<u64> = created.regions.iter().map(|r| r.datanode_id).collect();
    assert_eq!(datanodes, [1, 2].into_iter().collect());

    // A region number the route does not have, and a table that does not exist.
    let table = u64::from(created.table_id) << 32;
    assert_eq!(
        registry.region_to_open_by_id(table | 4).await.unwrap(),
        None
    );
    let missing = u64::from(created.table_id + 1) << 32;
    assert_eq!(registry.region_to_open_by_id(missing).await.unwrap(), None);
    m.stop().await.unwrap();
}

#[tokio::test]
async fn table_leaders_names_each_regions_datanode_and_its_registered_address() {
    let kv = memory_kv();
    let m = raft_metasrv(&kv, vec![1, 2]).await;
    let created = create(&m, "leaders", 4).await;
    set_region_epochs(m.kv(), created.table_id, &[(3, 2)]).await;
    let registry = m.datanode_registry();
    registry.begin_term();

    let expected = |addresses: [Option<&str>; 2]| -> Vec<RegionLeader> {
        created
            .regions
            .iter()
            .map(|r| RegionLeader {
                region_number: r.region_number,
                region_id: r.region_id,
                datanode_id: r.datanode_id,
                address: addresses[(r.datanode_id - 1) as usize].map(str::to_string),
                epoch: if r.region_number == 3 { 2 } else { 0 },
                wal_options: r.wal_options.clone(),
            })
            .collect()
    };

    // Only datanode 1 registered so far.
    registry
        .register(&register_request(1, "dn1-a:4001", 100))
        .await
        .unwrap();
    let leaders = m.table_leaders(&table("leaders")).await.unwrap();
    assert_eq!(leaders.table, "greptime.public.leaders");
    assert_eq!(leaders.table_id, created.table_id);
    assert_eq!(leaders.regions, expected([Some("dn1-a:4001"), None]));

    // Datanode 2 registers, and datanode 1 restarts at another address: the latest registration counts.
    registry
        .register(&register_request(2, "dn2:4002", 100))
        .await
        .unwrap();
    registry
        .register(&register_request(1, "dn1-b:4011", 100))
        .await
        .unwrap();
    let leaders = m.table_leaders(&table("leaders")).await.unwrap();
    assert_eq!(
        leaders.regions,
        expected([Some("dn1-b:4011"), Some("dn2:4002")])
    );

    let err = m.table_leaders(&table("absent")).await.unwrap_err();
    assert!(err.to_string().contains("greptime.public.absent"), "{err}");
    m.stop().await.unwrap();

    // Another metasrv on the same store, never leading (nothing in memory), reads the same from the records.
    let other = Metasrv::with_parts(
        config(WalConfig::RaftEngine, vec![1, 2]),
        kv.clone(),
        None,
        Arc::new(MemoryDatanodeManager::new()),
    )
    .unwrap();
    assert_eq!(
        other.table_leaders(&table("leaders")).await.unwrap(),
        leaders
    );
}
