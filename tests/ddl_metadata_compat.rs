//! Byte-compatibility of table metadata values with GreptimeDB's metasrv: values written by either side read on the
//! other.

use std::collections::BTreeMap;

use remote_wal::ddl::DatanodeTableValue;
use remote_wal::ddl::table_name::TableNameValue;
use remote_wal::wal::WalOptions;

/// A value laid out as GreptimeDB writes it (fields in its order, region numbers as string keys, the WAL options
/// as an encoded string inside the JSON), written by hand.
const GREPTIME_VALUE: &str = concat!(
    r#"{"table_id":1024,"regions":[1,2,10],"engine":"mito","region_storage_path":"greptime/public","#,
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
        r#"{"table_id":42,"regions":[1,2,3],"engine":"","region_storage_path":"","region_options":{},"region_wal_options":{},"version":1}"#
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
