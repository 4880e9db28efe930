//! Upgrades: the kv a format-1 release leaves behind when it is killed after any persisted step of a topic
//! bootstrap or a create-table (`tests/fixtures/format1/*.json`, written by `examples/format1_fixtures.rs` with that
//! release and kept as data) must be recovered to completion by this release, as the next `walctl` command does.
//!
//! Also F1 of the reliability issue: a create-table record at step 1 in state `allocate` on a bootstrapped pool is
//! finished by the next start, however that start readies the pool.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::support::kv_keys;
use procedures::ProcedureState;
use remote_wal::config::{DatanodesConfig, MetadataBackend, MetadataStoreConfig, MetasrvConfig};
use remote_wal::ddl::{MemoryDatanodeManager, TableMetadataManager, TableName};
use remote_wal::kv::{KvBackendRef, MemoryKvBackend, PutRequest};
use remote_wal::metasrv::{Metasrv, parse_table_name};
use remote_wal::wal::kafka::testing::FakeTopicAdmin;
use remote_wal::wal::{KafkaConfig, WalConfig, WalOptions};
use serde_json::Value;

const RECORD_PREFIX: &str = "__procedure__/proc/";

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format1")
}

/// Every fixture file, by name.
fn fixtures() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(fixture_dir()).expect("the fixture directory") {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let text = std::fs::read_to_string(&path).unwrap();
            let value: Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            out.push((
                path.file_name().unwrap().to_string_lossy().to_string(),
                value,
            ));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn config(fixture: &Value) -> MetasrvConfig {
    let pool = &fixture["pool"];
    MetasrvConfig {
        metadata_store: MetadataStoreConfig {
            backend: MetadataBackend::Memory,
            ..Default::default()
        },
        wal: WalConfig::Kafka(KafkaConfig {
            num_topics: pool["num_topics"].as_u64().unwrap() as usize,
            topic_name_prefix: pool["topic_name_prefix"].as_str().unwrap().to_string(),
            max_concurrent_creates: 1,
            ..Default::default()
        }),
        datanodes: DatanodesConfig {
            ids: fixture["datanodes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .collect(),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A fresh memory kv holding exactly the fixture's pairs.
async fn load(fixture: &Value) -> KvBackendRef {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    for pair in fixture["kv"].as_array().unwrap() {
        kv.put(PutRequest {
            key: pair["key"].as_str().unwrap().as_bytes().to_vec(),
            value: pair["value"].as_str().unwrap().as_bytes().to_vec(),
            prev_kv: false,
        })
        .await
        .unwrap();
    }
    kv
}

/// The brokers as the killed run left them: every topic its bootstrap record says it created.
fn brokers(fixture: &Value) -> Arc<FakeTopicAdmin> {
    let admin = Arc::new(FakeTopicAdmin::new());
    for pair in fixture["kv"].as_array().unwrap() {
        let key = pair["key"].as_str().unwrap();
        if !key.starts_with(&format!("{RECORD_PREFIX}topic_bootstrap/")) {
            continue;
        }
        let record: Value = serde_json::from_str(pair["value"].as_str().unwrap()).unwrap();
        for topic in record["data"]["created"].as_array().unwrap() {
            admin.create_out_of_band(topic.as_str().unwrap(), 1);
        }
    }
    admin
}

/// What the next writing walctl command does (start the procedures, finish the recovered ones), then checks that every
/// procedure finished done, the pool is complete, the fixture's table (for a create-table) exists with its
/// regions on pool topics, no allocation reservation is left, and a new table can be created.
async fn recover_and_check(name: &str, fixture: &Value, kv: KvBackendRef) {
    let admin = brokers(fixture);
    let metasrv = Metasrv::with_parts(
        config(fixture),
        kv.clone(),
        Some(admin.clone()),
        Arc::new(MemoryDatanodeManager::new()),
    )
    .unwrap();
    metasrv.start_procedures().await.unwrap();
    let recovered = metasrv.finish_recovered().await.unwrap();
    for info in &recovered {
        assert_eq!(
            info.state,
            ProcedureState::Done,
            "{name}: procedure {} ({}) ended {:?}: {:?}",
            info.id,
            info.type_name,
            info.state,
            info.error
        );
    }

    let pool = &fixture["pool"];
    let prefix = pool["topic_name_prefix"].as_str().unwrap();
    let num_topics = pool["num_topics"].as_u64().unwrap() as usize;
    let pool_topics: BTreeSet<String> = (0..num_topics).map(|i| format!("{prefix}_{i}")).collect();
    let metadata = TableMetadataManager::new(kv.clone());
    if fixture["type_name"] == "remote_wal::CreateTable" {
        let table_name = parse_table_name(fixture["table"]["name"].as_str().unwrap()).unwrap();
        let table_id = metadata
            .table_id(&table_name)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{name}: the table was not created"));
        let table = metasrv.table_regions(&table_name, table_id).await.unwrap();
        assert_eq!(
            table.regions.len() as u64,
            fixture["table"]["regions"].as_u64().unwrap(),
            "{name}: {table:?}"
        );
        for region in &table.regions {
            match WalOptions::decode(&region.wal_options).unwrap() {
                WalOptions::Kafka(k) => assert!(pool_topics.contains(&k.topic), "{name}: {k:?}"),
                other => panic!("{name}: region on {other:?}"),
            }
        }
    } else {
        let report = metasrv.topics().await.unwrap();
        assert_eq!(report.persisted, num_topics, "{name}: {report:?}");
        assert_eq!(
            admin.topics().keys().cloned().collect::<BTreeSet<_>>(),
            pool_topics,
            "{name}"
        );
    }
    assert_eq!(
        kv_keys(kv.as_ref(), "__table_allocation/").await,
        Vec::<String>::new(),
        "{name}: a reservation outlived its procedure"
    );

    // The store is fully usable afterwards.
    metasrv.start().await.unwrap();
    let after = metasrv
        .create_table(
            TableName::new("greptime", "public", "after_upgrade"),
            2,
            false,
        )
        .await
        .unwrap_or_else(|e| panic!("{name}: a new table after recovery: {e}"));
    assert_eq!(after.regions.len(), 2);
    metasrv.stop().await.unwrap();
}

#[tokio::test]
async fn every_format1_fixture_recovers_to_completion() {
    let fixtures = fixtures();
    let kinds: BTreeSet<&str> = fixtures
        .iter()
        .map(|(_, f)| f["type_name"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        BTreeSet::from(["remote_wal::CreateTable", "remote_wal::TopicBootstrap"]),
        "fixtures of both procedures are expected in {}",
        fixture_dir().display()
    );
    assert!(fixtures.len() >= 8, "{} fixtures", fixtures.len());
    for (name, fixture) in &fixtures {
        assert_eq!(fixture["format"], 1, "{name}");
        let kv = load(fixture).await;
        recover_and_check(name, fixture, kv).await;
    }
}

/// F1: the record the reliability issue describes — a create-table at step 1, state `allocate`, allocation null,
/// on a bootstrapped pool — planted from the format-1 submission record, is finished (the table created) by the
/// next start that only starts the procedures (what any writing command does first), not failed because the pool
/// was not loaded yet.
#[tokio::test]
async fn a_create_table_planted_at_allocate_is_finished_by_the_next_start() {
    let (name, mut fixture) = fixtures()
        .into_iter()
        .find(|(name, _)| name.starts_with("create_table_step0_"))
        .expect("the create-table submission fixture");
    let id = fixture["procedure_id"].as_str().unwrap().to_string();
    let record_key = format!("{RECORD_PREFIX}{id}");
    let mut planted = false;
    for pair in fixture["kv"].as_array_mut().unwrap() {
        if pair["key"] == record_key.as_str() {
            let mut record: Value = serde_json::from_str(pair["value"].as_str().unwrap()).unwrap();
            record["step"] = 1.into();
            record["data"]["state"] = "allocate".into();
            assert!(record["data"]["allocation"].is_null());
            pair["value"] = record.to_string().into();
            planted = true;
        }
    }
    assert!(planted, "{name} holds the record {record_key}");
    let kv = load(&fixture).await;
    recover_and_check("planted allocate record", &fixture, kv).await;
}
