//! Writes the format-1 upgrade fixtures: the raw kv pairs a metasrv leaves behind when it is killed right after
//! each persisted step of a Kafka pool bootstrap and of a create-table, as this release writes them.
//!
//! Run once per format (`cargo run --example format1_fixtures -- tests/fixtures/format1`) and commit the files as
//! data: `tests/upgrade_format1.rs` recovers each of them to completion with the code of every later release.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use remote_wal::config::{DatanodesConfig, MetadataBackend, MetadataStoreConfig, MetasrvConfig};
use remote_wal::ddl::MemoryDatanodeManager;
use remote_wal::ddl::TableName;
use remote_wal::kv::{
    CompareAndPutRequest, CompareAndPutResponse, KeyValue, KvBackend, KvBackendRef,
    MemoryKvBackend, PutRequest, RangeRequest, RangeResponse, Txn, TxnResponse,
};
use remote_wal::metasrv::Metasrv;
use remote_wal::wal::kafka::testing::FakeTopicAdmin;
use remote_wal::wal::{KafkaConfig, WalConfig};
use serde_json::{Value, json};

/// The pool every fixture uses.
const PREFIX: &str = "format1_pool";
const NUM_TOPICS: usize = 3;
const DATANODES: [u64; 2] = [1, 2];
const TABLE: &str = "format1_table";
const REGIONS: u32 = 4;
const RECORD_PREFIX: &str = "__procedure__/proc/";

/// A memory kv that copies all of itself after every change.
#[derive(Debug, Default)]
struct SnapshotKv {
    inner: MemoryKvBackend,
    snapshots: Mutex<Vec<Vec<KeyValue>>>,
}

impl SnapshotKv {
    async fn snap(&self) -> remote_wal::kv::Result<()> {
        let all = self.inner.range(RangeRequest::prefix(Vec::new())).await?;
        self.snapshots.lock().unwrap().push(all.kvs);
        Ok(())
    }
}

#[async_trait]
impl KvBackend for SnapshotKv {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn max_txn_ops(&self) -> usize {
        self.inner.max_txn_ops()
    }
    fn max_request_bytes(&self) -> usize {
        self.inner.max_request_bytes()
    }
    async fn get(&self, key: &[u8]) -> remote_wal::kv::Result<Option<KeyValue>> {
        self.inner.get(key).await
    }
    async fn batch_get(&self, keys: &[Vec<u8>]) -> remote_wal::kv::Result<Vec<KeyValue>> {
        self.inner.batch_get(keys).await
    }
    async fn range(&self, req: RangeRequest) -> remote_wal::kv::Result<RangeResponse> {
        self.inner.range(req).await
    }
    async fn put(&self, req: PutRequest) -> remote_wal::kv::Result<Option<KeyValue>> {
        let r = self.inner.put(req).await?;
        self.snap().await?;
        Ok(r)
    }
    async fn batch_put(
        &self,
        kvs: Vec<KeyValue>,
        prev_kv: bool,
    ) -> remote_wal::kv::Result<Vec<KeyValue>> {
        let r = self.inner.batch_put(kvs, prev_kv).await?;
        self.snap().await?;
        Ok(r)
    }
    async fn compare_and_put(
        &self,
        req: CompareAndPutRequest,
    ) -> remote_wal::kv::Result<CompareAndPutResponse> {
        let r = self.inner.compare_and_put(req).await?;
        self.snap().await?;
        Ok(r)
    }
    async fn delete_range(
        &self,
        key: &[u8],
        range_end: &[u8],
        prev_kv: bool,
    ) -> remote_wal::kv::Result<(u64, Vec<KeyValue>)> {
        let r = self.inner.delete_range(key, range_end, prev_kv).await?;
        self.snap().await?;
        Ok(r)
    }
    async fn batch_delete(
        &self,
        keys: &[Vec<u8>],
        prev_kv: bool,
    ) -> remote_wal::kv::Result<Vec<KeyValue>> {
        let r = self.inner.batch_delete(keys, prev_kv).await?;
        self.snap().await?;
        Ok(r)
    }
    async fn txn(&self, txn: Txn) -> remote_wal::kv::Result<TxnResponse> {
        let r = self.inner.txn(txn).await?;
        self.snap().await?;
        Ok(r)
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).expect("every key and value this release writes is UTF-8")
}

#[tokio::main]
async fn main() {
    let out: PathBuf = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "tests/fixtures/format1".to_string())
        .into();
    std::fs::create_dir_all(&out).expect("create the fixture directory");

    let kafka = KafkaConfig {
        num_topics: NUM_TOPICS,
        topic_name_prefix: PREFIX.to_string(),
        max_concurrent_creates: 1,
        ..Default::default()
    };
    let config = MetasrvConfig {
        metadata_store: MetadataStoreConfig {
            backend: MetadataBackend::Memory,
            ..Default::default()
        },
        wal: WalConfig::Kafka(kafka),
        datanodes: DatanodesConfig {
            ids: DATANODES.to_vec(),
            ..Default::default()
        },
        ..Default::default()
    };
    let kv = Arc::new(SnapshotKv::default());
    let metasrv = Metasrv::with_parts(
        config,
        kv.clone() as KvBackendRef,
        Some(Arc::new(FakeTopicAdmin::new())),
        Arc::new(MemoryDatanodeManager::new()),
    )
    .expect("build the metasrv");
    metasrv.start().await.expect("bootstrap the pool");
    metasrv
        .create_table(TableName::new("greptime", "public", TABLE), REGIONS, false)
        .await
        .expect("create the table");
    metasrv.stop().await.expect("stop");

    // The first snapshot holding each (procedure, step) record: the kv as a kill right after that write leaves it.
    let snapshots = kv.snapshots.lock().unwrap().clone();
    let mut seen: BTreeMap<(String, u64), ()> = BTreeMap::new();
    let mut written = 0;
    for snapshot in snapshots {
        for pair in &snapshot {
            let key = text(&pair.key);
            let Some(id) = key.strip_prefix(RECORD_PREFIX) else {
                continue;
            };
            let record: Value = serde_json::from_slice(&pair.value).expect("a procedure record");
            let step = record["step"].as_u64().expect("a step");
            if seen.insert((id.to_string(), step), ()).is_some() {
                continue;
            }
            let type_name = record["type_name"].as_str().expect("a type name");
            let kind = match type_name {
                "remote_wal::CreateTable" => "create_table",
                _ => "topic_bootstrap",
            };
            // Create-table data names its next step `state`, bootstrap data `step`.
            let data = &record["data"];
            let state = data["state"]
                .as_str()
                .or(data["step"].as_str())
                .expect("a data state");
            let status = record["state"].as_str().expect("a procedure state");
            let name = format!("{kind}_step{step}_{status}_{state}.json");
            let fixture = json!({
                "format": 1,
                "description": format!(
                    "the kv after the write of record step {step} ({status}, data state {state}) of {type_name} \
                     procedure {id}, as the format-1 release wrote it"
                ),
                "procedure_id": id,
                "type_name": type_name,
                "step": step,
                "pool": { "topic_name_prefix": PREFIX, "num_topics": NUM_TOPICS },
                "datanodes": DATANODES,
                "table": { "name": format!("greptime.public.{TABLE}"), "regions": REGIONS },
                "kv": snapshot
                    .iter()
                    .map(|kv| json!({ "key": text(&kv.key), "value": text(&kv.value) }))
                    .collect::<Vec<_>>(),
            });
            let body = serde_json::to_string_pretty(&fixture).expect("encode");
            std::fs::write(out.join(&name), body + "\n").expect("write a fixture");
            println!("{name}");
            written += 1;
        }
    }
    println!("{written} fixtures in {}", out.display());
}
