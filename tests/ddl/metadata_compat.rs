//! Table metadata values in shapes GreptimeDB's own tests do not cover (several regions with Kafka options, region
//! options, extra and missing fields, keys in hash-map order). These values are composed here from GreptimeDB's
//! struct definitions and serde attributes, so they show our reading of its layout; the anchor of byte
//! compatibility is `greptime_fixtures.rs`, which checks GreptimeDB's own serialised bytes.

use std::collections::BTreeMap;

use remote_wal::ddl::DatanodeTableValue;
use remote_wal::key::table_name::TableNameValue;
use remote_wal::key::topic_name::TopicNameValue;
use remote_wal::wal::{KafkaWalOptions, WalOptions};

/// GreptimeDB 1.2's bytes for `DatanodeTableValue { table_id: 1024, regions: vec![1, 2, 10], follower_regions:
/// vec![], region_info: RegionInfo { engine: "mito", region_storage_path: "greptime/public", region_options: {ttl,
/// compaction.type}, region_wal_options: {1, 2, 10 → Kafka topics} }, version: 3 }`: `follower_regions` after
/// `regions`, `RegionInfo` flattened, region numbers as string keys, each WAL option an encoded string. (Its maps
/// are hash maps, in any order; this is the order ours writes, which GreptimeDB may write too.)
const GREPTIME_VALUE: &str = concat!(
    r#"{"table_id":1024,"regions":[1,2,10],"follower_regions":[],"engine":"mito","#,
    r#""region_storage_path":"greptime/public","#,
    r#""region_options":{"compaction.type":"twcs","ttl":"7d"},"region_wal_options":{"#,
    r#""1":"{\"wal.provider\":\"kafka\",\"wal.kafka.topic\":\"greptimedb_wal_topic_0\"}","#,
    r#""2":"{\"wal.provider\":\"kafka\",\"wal.kafka.topic\":\"greptimedb_wal_topic_1\"}","#,
    r#""10":"{\"wal.provider\":\"kafka\",\"wal.kafka.topic\":\"greptimedb_wal_topic_63\"}"},"version":3}"#
);

#[test]
fn greptime_layout_decodes_and_reencodes_to_the_same_bytes() {
    let value: DatanodeTableValue = serde_json::from_str(GREPTIME_VALUE).unwrap();
    assert_eq!(value.table_id, 1024);
    assert_eq!(value.regions, vec![1, 2, 10]);
    assert_eq!(value.engine, "mito");
    assert_eq!(value.region_storage_path, "greptime/public");
    assert_eq!(value.region_options["ttl"], "7d");
    assert_eq!(value.version, 3);
    assert_eq!(
        WalOptions::decode(&value.region_wal_options[&10]).unwrap(),
        WalOptions::kafka("greptimedb_wal_topic_63")
    );
    assert_eq!(serde_json::to_string(&value).unwrap(), GREPTIME_VALUE);
}

#[test]
fn our_values_are_what_greptime_writes() {
    let value = DatanodeTableValue {
        table_id: 42,
        regions: vec![1, 2, 3],
        engine: String::new(),
        region_storage_path: String::new(),
        region_options: BTreeMap::new(),
        region_wal_options: BTreeMap::new(),
        version: 1,
    };
    assert_eq!(
        serde_json::to_string(&value).unwrap(),
        r#"{"table_id":42,"regions":[1,2,3],"follower_regions":[],"engine":"","region_storage_path":"","region_options":{},"region_wal_options":{},"version":1}"#
    );
    let raft = DatanodeTableValue {
        region_wal_options: BTreeMap::from([(1, WalOptions::RaftEngine.encode())]),
        ..value
    };
    assert!(
        serde_json::to_string(&raft)
            .unwrap()
            .contains(r#""region_wal_options":{"1":"{\"wal.provider\":\"raft_engine\"}"}"#)
    );
}

#[test]
fn values_written_before_follower_regions_existed_still_decode() {
    // The same value as GreptimeDB wrote it before it added `follower_regions`.
    let older = GREPTIME_VALUE.replace(r#""follower_regions":[],"#, "");
    assert!(!older.contains("follower_regions"));
    let old: DatanodeTableValue = serde_json::from_str(&older).unwrap();
    let new: DatanodeTableValue = serde_json::from_str(GREPTIME_VALUE).unwrap();
    assert_eq!(old, new);
    // Re-encoding writes the current layout.
    assert_eq!(serde_json::to_string(&old).unwrap(), GREPTIME_VALUE);
}

#[test]
fn greptime_wal_options_of_every_provider_decode() {
    // A table whose regions GreptimeDB gave one of each: raft-engine, Kafka with the pruned-entry hint, noop.
    let value = concat!(
        r#"{"table_id":1030,"regions":[0,1,2],"follower_regions":[],"engine":"mito","#,
        r#""region_storage_path":"greptime/public","region_options":{},"region_wal_options":{"#,
        r#""0":"{\"wal.provider\":\"raft_engine\"}","#,
        r#""1":"{\"wal.provider\":\"kafka\",\"wal.kafka.topic\":\"greptimedb_wal_topic_5\",\"wal.kafka.initial_pruned_entry_id\":311}","#,
        r#""2":"{\"wal.provider\":\"noop\"}"},"version":0}"#
    );
    let value: DatanodeTableValue = serde_json::from_str(value).unwrap();
    let decoded: Vec<WalOptions> = value
        .region_wal_options
        .values()
        .map(|encoded| WalOptions::decode(encoded).unwrap())
        .collect();
    assert_eq!(
        decoded,
        vec![
            WalOptions::RaftEngine,
            WalOptions::Kafka(KafkaWalOptions {
                topic: "greptimedb_wal_topic_5".to_string(),
                initial_pruned_entry_id: Some(311),
            }),
            WalOptions::Noop,
        ]
    );
    // Each re-encodes to GreptimeDB's bytes.
    for (number, options) in [0u32, 1, 2].into_iter().zip(&decoded) {
        assert_eq!(options.encode(), value.region_wal_options[&number]);
    }
}

#[test]
fn topic_name_values_are_greptime_bytes() {
    // GreptimeDB 1.2's `TopicNameValue { pruned_entry_id: 0 }`, and one a prune has advanced.
    assert_eq!(
        TopicNameValue::default().encode(),
        br#"{"pruned_entry_id":0}"#
    );
    let pruned = TopicNameValue::decode(
        b"__topic_name/kafka/greptimedb_wal_topic_0",
        br#"{"pruned_entry_id":4096}"#,
    )
    .unwrap();
    assert_eq!(pruned.pruned_entry_id, 4096);
    assert_eq!(pruned.encode(), br#"{"pruned_entry_id":4096}"#);
}

#[test]
fn unknown_and_missing_optional_fields_are_tolerated() {
    let with_extra = concat!(
        r#"{"table_id":7,"regions":[0],"follower_regions":[],"engine":"mito","region_storage_path":"a/b","#,
        r#""region_options":{},"region_wal_options":{"0":"{\"wal.provider\":\"raft_engine\"}"},"#,
        r#""version":0,"added_later":{"x":[1,2]}}"#
    );
    let value: DatanodeTableValue = serde_json::from_str(with_extra).unwrap();
    assert_eq!(value.table_id, 7);
    assert_eq!(
        value.region_wal_options[&0],
        r#"{"wal.provider":"raft_engine"}"#
    );

    let minimal: DatanodeTableValue =
        serde_json::from_str(r#"{"table_id":42,"regions":[1,2,3],"version":1}"#).unwrap();
    assert_eq!(minimal.regions, vec![1, 2, 3]);
    assert!(minimal.region_wal_options.is_empty());
}

#[test]
fn region_wal_options_in_any_key_order_decode_to_the_same_value() {
    // GreptimeDB writes a hash map: keys come in any order.
    let shuffled = concat!(
        r#"{"table_id":1024,"regions":[10,2,1],"engine":"mito","region_storage_path":"greptime/public","#,
        r#""region_options":{"ttl":"7d","compaction.type":"twcs"},"region_wal_options":{"#,
        r#""10":"{\"wal.provider\":\"kafka\",\"wal.kafka.topic\":\"greptimedb_wal_topic_63\"}","#,
        r#""2":"{\"wal.provider\":\"kafka\",\"wal.kafka.topic\":\"greptimedb_wal_topic_1\"}","#,
        r#""1":"{\"wal.provider\":\"kafka\",\"wal.kafka.topic\":\"greptimedb_wal_topic_0\"}"},"version":3}"#
    );
    let a: DatanodeTableValue = serde_json::from_str(shuffled).unwrap();
    let b: DatanodeTableValue = serde_json::from_str(GREPTIME_VALUE).unwrap();
    assert_eq!(a.region_wal_options, b.region_wal_options);
    assert_eq!(a.region_options, b.region_options);
}

#[test]
fn a_non_numeric_region_key_is_an_error() {
    let bad = r#"{"table_id":1,"regions":[0],"region_wal_options":{"zero":"{}"},"version":0}"#;
    assert!(serde_json::from_str::<DatanodeTableValue>(bad).is_err());
}

#[test]
fn table_name_value_layout() {
    let v: TableNameValue = serde_json::from_str(r#"{"table_id":1025}"#).unwrap();
    assert_eq!(v.table_id, 1025);
    assert_eq!(serde_json::to_string(&v).unwrap(), r#"{"table_id":1025}"#);
}
