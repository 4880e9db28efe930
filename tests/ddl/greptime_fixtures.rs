//! Compatibility with GreptimeDB checked against GreptimeDB's own bytes: `tests/fixtures/greptimedb/values.json`
//! holds the literals its unit tests assert its encoders write (or feed its decoders), copied as they are, each
//! with the file, test and commit it comes from. Every one must decode here to what GreptimeDB's test says it
//! means, and where GreptimeDB asserts its encoder's output, ours must write the same bytes.

use std::sync::Arc;

use remote_wal::ddl::DatanodeTableValue;
use remote_wal::key::datanode_table::{datanode_table_key, parse_datanode_table_key};
use remote_wal::key::topic_region::{read_topic_regions, topic_region_key};
use remote_wal::kv::{KvBackend, MemoryKvBackend, PutRequest};
use remote_wal::wal::{KafkaWalOptions, WalOptions};
use serde_json::Value;

fn fixtures() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/greptimedb/values.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {path}: {e}"))
}

fn text<'a>(v: &'a Value, field: &str) -> &'a str {
    v[field]
        .as_str()
        .unwrap_or_else(|| panic!("fixture field '{field}' in {v}"))
}

#[test]
fn wal_options_decode_to_what_greptimedb_means_and_encode_to_its_bytes() {
    let all = fixtures();
    let encoded = all["wal_options"]["encoded"].as_array().expect("encoded");
    assert_eq!(encoded.len(), 4, "{}", all["wal_options"]["source"]);
    for case in encoded {
        let bytes = text(case, "value");
        let expected = match text(case, "provider") {
            "raft_engine" => WalOptions::RaftEngine,
            "noop" => WalOptions::Noop,
            "kafka" => WalOptions::Kafka(KafkaWalOptions {
                topic: text(case, "topic").to_string(),
                initial_pruned_entry_id: case["initial_pruned_entry_id"].as_u64(),
            }),
            other => panic!("a provider this test does not know: {other}"),
        };
        let decoded = WalOptions::decode(bytes).unwrap_or_else(|e| panic!("{bytes}: {e}"));
        assert_eq!(decoded, expected, "{bytes}");
        assert_eq!(expected.encode(), bytes, "our encoding of {expected:?}");
    }
}

#[test]
fn datanode_table_keys_and_values_read_as_greptimedb_reads_them() {
    let all = fixtures();
    let fixture = &all["datanode_table"];
    for which in ["key", "parsed_key"] {
        let key = &fixture[which];
        let (datanode, table) = (
            key["datanode_id"].as_u64().unwrap(),
            key["table_id"].as_u64().unwrap(),
        );
        let table = u32::try_from(table).expect("a table id");
        assert_eq!(datanode_table_key(datanode, table), text(key, "raw"));
        assert_eq!(
            parse_datanode_table_key(text(key, "raw").as_bytes()).unwrap(),
            (datanode, table)
        );
    }
    for bad in fixture["bad_keys"].as_array().expect("bad keys") {
        let bad = bad.as_str().expect("a key");
        assert!(parse_datanode_table_key(bad.as_bytes()).is_err(), "{bad}");
    }
    // GreptimeDB's value, and the same with every defaulted field left out: both read as the same value.
    let full: DatanodeTableValue = serde_json::from_str(text(fixture, "value")).unwrap();
    let minimal: DatanodeTableValue =
        serde_json::from_str(text(fixture, "value_with_defaults_omitted")).unwrap();
    assert_eq!(full, minimal);
    assert_eq!(full.table_id, 42);
    assert_eq!(full.regions, vec![1, 2, 3]);
    assert_eq!(full.version, 1);
    assert!(full.engine.is_empty() && full.region_storage_path.is_empty());
    assert!(full.region_options.is_empty() && full.region_wal_options.is_empty());
    // Ours writes the same fields in the same order, plus the empty follower list newer GreptimeDB releases write
    // after `regions` (which the release of this fixture reads by its serde default).
    let ours = serde_json::to_string(&full).unwrap();
    assert_eq!(
        ours.replacen(r#""follower_regions":[],"#, "", 1),
        text(fixture, "value")
    );
}

#[tokio::test]
async fn a_greptimedb_topic_region_key_reads_as_its_topic_and_region_without_a_checkpoint() {
    let all = fixtures();
    let key = &all["topic_region"]["key"];
    let (raw, topic) = (text(key, "raw"), text(key, "topic"));
    let region = key["region_id"].as_u64().unwrap();
    assert_eq!(topic_region_key(topic, region), raw.as_bytes());
    let kv = Arc::new(MemoryKvBackend::new());
    kv.put(PutRequest {
        key: raw.as_bytes().to_vec(),
        value: Vec::new(),
        prev_kv: false,
    })
    .await
    .unwrap();
    let regions = read_topic_regions(kv.as_ref(), topic).await.unwrap();
    assert_eq!(regions.keys().copied().collect::<Vec<_>>(), vec![region]);
    assert_eq!(regions[&region].checkpoint, None);
}
