//! Helpers of the log store tests: a store on an in-memory partition, entries, a topic on the real broker, and the
//! topic of the prune tests (a memory metadata store, an in-memory partition, a record deleter, one whole prune).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use procedures::testing::MatrixConfig;
use procedures::{ProcedureManager, ProcedureWithId, StateStore};

use datanode::log_store::kafka::PartitionLog;
use datanode::log_store::memory_partition::MemoryPartition;
use datanode::log_store::{
    Entry, EntryToWrite, KafkaLogStore, KafkaLogStoreConfig, RsKafkaPartition,
};
use remote_wal::key::topic_name::{TopicNameValue, topic_name_key};
use remote_wal::kv::{
    CompareAndPutRequest, CompareAndPutResponse, KeyValue, KvBackend, KvBackendRef, KvStateStore,
    KvWrapper, MemoryKvBackend, PutRequest,
};
use remote_wal::wal::KafkaConfig;
use remote_wal::wal::prune::{
    PruneMode, PruneOutput, RecordDeleter, WalPruneProcedure, prune_procedure_id,
};
use rskafka::client::Client;

use crate::support::{require_endpoints, unique};

/// A Kafka log store on a fresh in-memory partition with `max_batch_bytes` per produce request.
pub fn memory_store(max_batch_bytes: usize) -> KafkaLogStore<MemoryPartition> {
    KafkaLogStore::new(
        MemoryPartition::new("memory_topic"),
        KafkaLogStoreConfig::for_max_batch_bytes(max_batch_bytes),
    )
}

/// An entry to write.
pub fn write(region_id: u64, data: &[u8]) -> EntryToWrite {
    EntryToWrite {
        region_id,
        data: data.to_vec(),
    }
}

/// `n` bytes that differ per `seed`.
pub fn bytes(seed: u64, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64) % 251) as u8)
        .collect()
}

/// The data of entries, in order.
pub fn data(entries: &[Entry]) -> Vec<Vec<u8>> {
    entries.iter().map(|e| e.data.clone()).collect()
}

/// A Kafka config on the broker of `KAFKA_ENDPOINTS` (fails the test when unset), with short deadlines.
pub fn broker_config() -> KafkaConfig {
    let mut c = KafkaConfig {
        broker_endpoints: require_endpoints("KAFKA_ENDPOINTS", "a running Kafka broker"),
        create_topic_timeout: Duration::from_secs(10),
        ..KafkaConfig::default()
    };
    c.backoff.init = Duration::from_millis(50);
    c.backoff.max = Duration::from_millis(500);
    c.backoff.deadline = Duration::from_secs(30);
    c
}

/// A new one-partition topic on the real broker, and a client to it.
pub async fn broker_topic(tag: &str) -> (Arc<Client>, KafkaConfig, String) {
    let config = broker_config();
    let client = datanode::log_store::kafka::connect_client(&config)
        .await
        .unwrap_or_else(|e| panic!("Kafka at {:?} is unreachable: {e}", config.broker_endpoints));
    let topic = unique(&format!("logstore_{tag}"));
    client
        .controller_client()
        .expect("controller client")
        .create_topic(&topic, 1, 1, 10_000)
        .await
        .unwrap_or_else(|e| panic!("create topic {topic}: {e}"));
    // A new topic can be missing from metadata for a moment (longer on a busy broker): wait until it is listed, so
    // the store's first call does not spend its backoff deadline on UNKNOWN_TOPIC_OR_PARTITION.
    let listed = async {
        loop {
            let topics = client.list_topics().await.expect("list topics");
            if topics.iter().any(|t| t.name == topic) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(120), listed)
        .await
        .unwrap_or_else(|_| panic!("topic {topic} was created but not listed within 120 s"));
    (client, config, topic)
}

/// A log store on `topic` of the real broker.
pub async fn broker_store(
    client: &Client,
    config: &KafkaConfig,
    topic: &str,
    store_config: KafkaLogStoreConfig,
) -> KafkaLogStore<RsKafkaPartition> {
    let partition = RsKafkaPartition::new(
        client,
        topic,
        datanode::log_store::kafka::call_bound(config),
    )
    .await
    .unwrap_or_else(|e| panic!("partition client of {topic}: {e}"));
    // A new topic's partition may have no leader yet (longer on a busy broker): wait until it answers, so the
    // test's own calls meet a ready partition. A bound on readiness, not on speed.
    let mut last = None;
    for _ in 0..4 {
        match partition.high_watermark().await {
            Ok(_) => return KafkaLogStore::new(partition, store_config),
            Err(e) => last = Some(e),
        }
    }
    panic!("partition 0 of {topic} never answered: {last:?}")
}

/// The topic of the prune tests.
pub(crate) const TOPIC: &str = "memory_topic";

/// A memory store that records every `pruned_entry_id` written to the topic's name key, in order.
#[derive(Debug)]
struct WatchedKv {
    inner: Arc<MemoryKvBackend>,
    watermarks: Arc<Mutex<Vec<u64>>>,
}

impl WatchedKv {
    fn note(&self, key: &[u8], value: &[u8]) {
        if key == topic_name_key(TOPIC).as_slice()
            && let Ok(v) = TopicNameValue::decode(key, value)
        {
            self.watermarks.lock().unwrap().push(v.pruned_entry_id);
        }
    }
}

#[async_trait]
impl KvWrapper for WatchedKv {
    fn inner(&self) -> &dyn KvBackend {
        self.inner.as_ref()
    }
    fn name(&self) -> String {
        format!("watched-{}", self.inner.name())
    }
    async fn put(&self, req: PutRequest) -> remote_wal::kv::Result<Option<KeyValue>> {
        self.note(&req.key, &req.value);
        self.inner.put(req).await
    }
    async fn batch_put(
        &self,
        kvs: Vec<KeyValue>,
        prev_kv: bool,
    ) -> remote_wal::kv::Result<Vec<KeyValue>> {
        for kv in &kvs {
            self.note(&kv.key, &kv.value);
        }
        self.inner.batch_put(kvs, prev_kv).await
    }
    async fn compare_and_put(
        &self,
        req: CompareAndPutRequest,
    ) -> remote_wal::kv::Result<CompareAndPutResponse> {
        let (key, value) = (req.key.clone(), req.value.clone());
        let response = self.inner.compare_and_put(req).await?;
        if response.success {
            self.note(&key, &value);
        }
        Ok(response)
    }
}

/// Deletes records of the in-memory partition, noting each call's offset.
#[derive(Debug)]
pub(crate) struct MemoryDeleter {
    pub(crate) partition: Arc<MemoryPartition>,
    pub(crate) calls: Mutex<Vec<i64>>,
}

#[async_trait]
impl RecordDeleter for MemoryDeleter {
    async fn delete_records_before(
        &self,
        topic: &str,
        offset: i64,
    ) -> remote_wal::wal::error::Result<()> {
        assert_eq!(topic, TOPIC);
        self.calls.lock().unwrap().push(offset);
        self.partition.delete_below(offset);
        Ok(())
    }
}

/// A topic for the prune tests: a memory metadata store (seen through [`WatchedKv`]), the procedure store on it,
/// an in-memory partition, a log store on it, and a deleter of the partition's records.
pub(crate) struct Env {
    pub(crate) kv: Arc<MemoryKvBackend>,
    pub(crate) watched: KvBackendRef,
    pub(crate) watermarks: Arc<Mutex<Vec<u64>>>,
    pub(crate) store: Arc<dyn StateStore>,
    pub(crate) partition: Arc<MemoryPartition>,
    pub(crate) log: Arc<KafkaLogStore<Arc<MemoryPartition>>>,
    pub(crate) deleter: Arc<MemoryDeleter>,
}

/// An empty pool topic [`TOPIC`] (no records, no regions, pruned entry id 0) with 1 KiB produce requests.
pub(crate) async fn prune_env() -> Env {
    let kv = Arc::new(MemoryKvBackend::new());
    let watermarks = Arc::new(Mutex::new(Vec::new()));
    let watched: KvBackendRef = Arc::new(WatchedKv {
        inner: kv.clone(),
        watermarks: watermarks.clone(),
    });
    watched
        .put(PutRequest {
            key: topic_name_key(TOPIC),
            value: TopicNameValue {
                pruned_entry_id: 0,
                topic_id: None,
            }
            .encode(),
            prev_kv: false,
        })
        .await
        .unwrap();
    let partition = Arc::new(MemoryPartition::new(TOPIC));
    Env {
        store: Arc::new(KvStateStore::new(kv.clone())),
        kv,
        watched,
        watermarks,
        deleter: Arc::new(MemoryDeleter {
            partition: partition.clone(),
            calls: Mutex::new(Vec::new()),
        }),
        log: Arc::new(shared_store(&partition)),
        partition,
    }
}

/// A log store with 1 KiB produce requests on `partition`, shared with other stores (a crashed writer's, a
/// reader's).
pub(crate) fn shared_store(
    partition: &Arc<MemoryPartition>,
) -> KafkaLogStore<Arc<MemoryPartition>> {
    KafkaLogStore::new(
        partition.clone(),
        KafkaLogStoreConfig::for_max_batch_bytes(1024),
    )
}

/// Runs one prune of the topic to its end without crashes; its report.
pub(crate) async fn prune_once(env: &Env, mode: PruneMode) -> PruneOutput {
    let manager = procedures::LocalManager::new(env.store.clone(), MatrixConfig::default().manager);
    manager
        .register_loader(
            WalPruneProcedure::TYPE_NAME,
            WalPruneProcedure::loader(env.watched.clone(), env.deleter.clone()),
        )
        .unwrap();
    manager.start().await.unwrap();
    let procedure = WalPruneProcedure::new(TOPIC, mode, env.watched.clone(), env.deleter.clone());
    let output = manager
        .submit(ProcedureWithId::new(
            prune_procedure_id(TOPIC),
            Box::new(procedure),
        ))
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    manager.stop().await.unwrap();
    serde_json::from_value(output.unwrap()).unwrap()
}
