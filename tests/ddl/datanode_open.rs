//! What a datanode opens: requests built from its `__dn_table/{datanode_id}/` records, page by page, with damaged
//! records and WAL options reported per region while the rest still opens.

use std::collections::BTreeMap;
use std::sync::Arc;

use remote_wal::datanode::{RegionOpener, WalProviderKind};
use remote_wal::ddl::DatanodeTableValue;
use remote_wal::ddl::region::region_id;
use remote_wal::key::datanode_table::datanode_table_key;
use remote_wal::kv::{KvBackendRef, MemoryKvBackend, PutRequest};
use remote_wal::wal::WalOptions;

async fn put(kv: &KvBackendRef, key: String, value: Vec<u8>) {
    kv.put(PutRequest {
        key: key.into_bytes(),
        value,
        prev_kv: false,
    })
    .await
    .unwrap();
}

fn value(table_id: u32, regions: &[u32], wal: impl Fn(u32) -> String) -> DatanodeTableValue {
    DatanodeTableValue {
        table_id,
        regions: regions.to_vec(),
        engine: "mito".into(),
        region_storage_path: "greptime/public".into(),
        region_options: BTreeMap::from([("ttl".into(), "7d".into())]),
        region_wal_options: regions.iter().map(|&r| (r, wal(r))).collect(),
        version: 0,
    }
}

fn kafka(r: u32) -> String {
    WalOptions::kafka(format!("greptimedb_wal_topic_{r}")).encode()
}

#[tokio::test]
async fn builds_one_request_per_region_with_the_recorded_wal_options() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    put(
        &kv,
        datanode_table_key(1, 1024),
        serde_json::to_vec(&value(1024, &[0, 2], kafka)).unwrap(),
    )
    .await;
    // Another datanode's record is not read.
    put(
        &kv,
        datanode_table_key(11, 1024),
        serde_json::to_vec(&value(1024, &[1], kafka)).unwrap(),
    )
    .await;
    let open = RegionOpener::new(kv, 1, WalProviderKind::Kafka)
        .open_regions()
        .await
        .unwrap();
    assert!(open.errors.is_empty(), "{:?}", open.errors);
    let ids: Vec<u64> = open.requests.iter().map(|r| r.region_id).collect();
    assert_eq!(ids, vec![region_id(1024, 0), region_id(1024, 2)]);
    let r = &open.requests[1];
    assert_eq!(r.engine, "mito");
    assert_eq!(r.region_dir, "data/greptime/public/1024/1024_0000000002/");
    assert_eq!(r.options["ttl"], "7d");
    assert_eq!(
        r.options["wal_options"],
        r#"{"wal.provider":"kafka","wal.kafka.topic":"greptimedb_wal_topic_2"}"#
    );
}

#[tokio::test]
async fn a_corrupt_record_and_a_corrupt_wal_option_do_not_stop_the_others() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    put(
        &kv,
        datanode_table_key(1, 1024),
        serde_json::to_vec(&value(1024, &[0, 1], kafka)).unwrap(),
    )
    .await;
    put(
        &kv,
        datanode_table_key(1, 1025),
        b"{\"table_id\":1025,\"regions\":[0".to_vec(),
    )
    .await;
    let one_bad = value(1026, &[0, 1, 2], |r| {
        if r == 1 {
            "{\"wal.provider\":".into()
        } else {
            kafka(r)
        }
    });
    put(
        &kv,
        datanode_table_key(1, 1026),
        serde_json::to_vec(&one_bad).unwrap(),
    )
    .await;

    let open = RegionOpener::new(kv, 1, WalProviderKind::Kafka)
        .with_page_size(1)
        .open_regions()
        .await
        .unwrap();
    let ids: Vec<u64> = open.requests.iter().map(|r| r.region_id).collect();
    assert_eq!(
        ids,
        vec![
            region_id(1024, 0),
            region_id(1024, 1),
            region_id(1026, 0),
            region_id(1026, 2)
        ]
    );
    assert_eq!(open.errors.len(), 2, "{:?}", open.errors);

    let record = &open.errors[0];
    assert_eq!(record.key, "__dn_table/1/1025");
    assert_eq!(record.region_id, None);
    assert!(
        record.error.to_string().contains("__dn_table/1/1025"),
        "{}",
        record.error
    );

    let region = &open.errors[1];
    assert_eq!(region.key, "__dn_table/1/1026");
    assert_eq!(region.region_id, Some(region_id(1026, 1)));
    let msg = region.error.to_string();
    assert!(
        msg.contains("__dn_table/1/1026") && msg.contains("region 1 "),
        "{msg}"
    );
    assert!(
        msg.contains("{\"wal.provider\":"),
        "the bad options are quoted: {msg}"
    );
}

#[tokio::test]
async fn a_provider_mismatch_is_a_clear_per_region_error() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let mixed = value(1024, &[0, 1], |r| {
        if r == 0 {
            WalOptions::RaftEngine.encode()
        } else {
            kafka(r)
        }
    });
    put(
        &kv,
        datanode_table_key(1, 1024),
        serde_json::to_vec(&mixed).unwrap(),
    )
    .await;

    let on_kafka = RegionOpener::new(kv.clone(), 1, WalProviderKind::Kafka)
        .open_regions()
        .await
        .unwrap();
    assert_eq!(on_kafka.requests.len(), 1);
    assert_eq!(on_kafka.requests[0].region_id, region_id(1024, 1));
    let msg = on_kafka.errors[0].error.to_string();
    assert!(
        msg.contains("'raft_engine'")
            && msg.contains("configured for 'kafka'")
            && msg.contains("region 0 "),
        "{msg}"
    );

    let on_raft = RegionOpener::new(kv, 1, WalProviderKind::RaftEngine)
        .open_regions()
        .await
        .unwrap();
    assert_eq!(on_raft.requests.len(), 1);
    assert_eq!(on_raft.requests[0].region_id, region_id(1024, 0));
    let msg = on_raft.errors[0].error.to_string();
    assert!(
        msg.contains("'kafka'") && msg.contains("configured for 'raft_engine'"),
        "{msg}"
    );
}

#[tokio::test]
async fn missing_wal_options_fall_back_to_raft_engine_only() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let mut v = value(1024, &[0], kafka);
    v.region_wal_options.clear();
    put(
        &kv,
        datanode_table_key(1, 1024),
        serde_json::to_vec(&v).unwrap(),
    )
    .await;

    let on_raft = RegionOpener::new(kv.clone(), 1, WalProviderKind::RaftEngine)
        .open_regions()
        .await
        .unwrap();
    assert!(on_raft.errors.is_empty());
    assert!(!on_raft.requests[0].options.contains_key("wal_options"));

    let on_kafka = RegionOpener::new(kv, 1, WalProviderKind::Kafka)
        .open_regions()
        .await
        .unwrap();
    assert!(on_kafka.requests.is_empty());
    let msg = on_kafka.errors[0].error.to_string();
    assert!(
        msg.contains("no WAL options") && msg.contains("__dn_table/1/1024"),
        "{msg}"
    );
}

#[tokio::test]
async fn a_malformed_key_or_a_value_of_another_table_is_reported() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    put(
        &kv,
        "__dn_table/1/notanumber".to_string(),
        serde_json::to_vec(&value(5, &[0], kafka)).unwrap(),
    )
    .await;
    put(
        &kv,
        datanode_table_key(1, 6),
        serde_json::to_vec(&value(7, &[0], kafka)).unwrap(),
    )
    .await;
    let open = RegionOpener::new(kv, 1, WalProviderKind::Kafka)
        .open_regions()
        .await
        .unwrap();
    assert!(open.requests.is_empty());
    assert_eq!(open.errors.len(), 2);
    assert!(open.errors[0].error.to_string().contains("__dn_table/1/6"));
    assert!(open.errors[0].error.to_string().contains("table 7"));
    assert!(
        open.errors[1]
            .error
            .to_string()
            .contains("__dn_table/1/notanumber")
    );
}

#[tokio::test]
async fn pagination_returns_every_region_whatever_the_page_size() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    for t in 0..50u32 {
        let regions: Vec<u32> = (0..(t % 4 + 1)).collect();
        put(
            &kv,
            datanode_table_key(3, 1024 + t),
            serde_json::to_vec(&value(1024 + t, &regions, kafka)).unwrap(),
        )
        .await;
    }
    let all = RegionOpener::new(kv.clone(), 3, WalProviderKind::Kafka)
        .open_regions()
        .await
        .unwrap();
    assert_eq!(
        all.requests.len(),
        (0..50u32).map(|t| (t % 4 + 1) as usize).sum::<usize>()
    );
    for page in [1, 7, 50, 51] {
        let paged = RegionOpener::new(kv.clone(), 3, WalProviderKind::Kafka)
            .with_page_size(page)
            .open_regions()
            .await
            .unwrap();
        assert_eq!(paged.requests, all.requests, "page size {page}");
    }
}

#[tokio::test]
async fn a_noop_region_opens_on_any_datanode_with_its_options_as_recorded() {
    // As GreptimeDB 1.2 writes it: region 0 on Kafka (with the pruned-entry hint), region 1 without a WAL.
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let hinted = r#"{"wal.provider":"kafka","wal.kafka.topic":"greptimedb_wal_topic_0","wal.kafka.initial_pruned_entry_id":9}"#;
    let noop = r#"{"wal.provider":"noop"}"#;
    let greptime_value = concat!(
        r#"{"table_id":1024,"regions":[0,1],"follower_regions":[],"engine":"mito","#,
        r#""region_storage_path":"greptime/public","region_options":{},"region_wal_options":{"#,
        r#""0":"{\"wal.provider\":\"kafka\",\"wal.kafka.topic\":\"greptimedb_wal_topic_0\","#,
        r#"\"wal.kafka.initial_pruned_entry_id\":9}","1":"{\"wal.provider\":\"noop\"}"},"version":0}"#
    );
    put(
        &kv,
        datanode_table_key(1, 1024),
        greptime_value.as_bytes().to_vec(),
    )
    .await;

    let on_kafka = RegionOpener::new(kv.clone(), 1, WalProviderKind::Kafka)
        .open_regions()
        .await
        .unwrap();
    assert!(on_kafka.errors.is_empty(), "{:?}", on_kafka.errors);
    let options: Vec<(u64, &str)> = on_kafka
        .requests
        .iter()
        .map(|r| (r.region_id, r.options["wal_options"].as_str()))
        .collect();
    assert_eq!(
        options,
        vec![(region_id(1024, 0), hinted), (region_id(1024, 1), noop)]
    );

    // On a raft-engine datanode the Kafka region is a mismatch; the noop one still opens.
    let on_raft = RegionOpener::new(kv, 1, WalProviderKind::RaftEngine)
        .open_regions()
        .await
        .unwrap();
    let opened: Vec<u64> = on_raft.requests.iter().map(|r| r.region_id).collect();
    assert_eq!(opened, vec![region_id(1024, 1)]);
    assert_eq!(on_raft.requests[0].options["wal_options"], noop);
    assert_eq!(on_raft.errors.len(), 1);
    assert_eq!(
        on_raft.errors[0].error.to_string(),
        "datanode table key '__dn_table/1/1024', region 0 (region id 4398046511104): WAL provider is 'kafka' \
         but this datanode is configured for 'raft_engine'"
    );
}
