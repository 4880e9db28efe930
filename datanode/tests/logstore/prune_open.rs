//! A table created while a prune runs on its region's topic (GreptimeDB's #6500: a region could not open between
//! DeleteRecords and the watermark's advance): create table writes the region's `__topic_region` key (empty) with
//! the table, and the region is opened by the datanode runtime at every moment of the prune — before it, between
//! each two of its steps, after it. Each time the region starts at the topic's end, records that as its checkpoint
//! before its first write (what the metasrv does from its heartbeat before granting a lease), and every entry it
//! wrote is there for a later incarnation, after this prune and a second one.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datanode::checkpoint::CheckpointStore;
use datanode::log_store::kafka::PartitionLog;
use datanode::runtime::PartitionFactory;
use datanode::{Datanode, DatanodeOptions};
use procedures::testing::MatrixConfig;
use procedures::{ProcedureManager, ProcedureWithId};
use remote_wal::datanode::RegionOpenRequest;
use remote_wal::datanode::protocol::{HeartbeatResponse, RegionLease, RegionRole, RegionToOpen};
use remote_wal::key::topic_name::{TopicNameValue, topic_name_key};
use remote_wal::key::topic_region::{TopicRegionValue, topic_region_key};
use remote_wal::kv::PutRequest;
use remote_wal::wal::prune::{
    PruneMode, PruneOutput, RecordDeleter, WalPruneProcedure, prune_procedure_id,
};
use remote_wal::wal::{KafkaConfig, WAL_OPTIONS_KEY};

use crate::common::{Env, TOPIC};
use crate::prune_crash::new_env;

/// The new table's region (number 0 of table 2048).
const NEW_REGION: u64 = 2048 << 32;

/// When, relative to the prune's steps, the table is created and its region opened and written.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Moment {
    BeforeThePrune,
    AfterComputePrunable,
    AfterDeleteRecords,
    AfterThePrune,
}

struct Scenario {
    env: Env,
    storage: tempfile::TempDir,
}

impl Scenario {
    fn datanode(&self, incarnation: u64) -> Arc<Datanode> {
        let partition = self.env.partition.clone();
        let factory: PartitionFactory =
            Arc::new(move |_: &str| partition.clone() as Arc<dyn PartitionLog>);
        let dn = Datanode::new(DatanodeOptions {
            id: 1,
            address: "127.0.0.1:1".to_string(),
            wal_dir: self.storage.path().join("wal"),
            region_storage: self.storage.path().join("regions"),
            kafka: Some(KafkaConfig::default()),
            heartbeat_interval: Duration::from_millis(100),
            flush_threshold: u64::MAX,
            partitions: Some(factory),
            topic_ids: None,
        });
        dn.set_incarnation(incarnation);
        Arc::new(dn)
    }

    /// What the metasrv hands the datanode: the key's state and the topic's pruned entry id, read now.
    async fn to_open(&self) -> RegionToOpen {
        let key = self
            .env
            .watched
            .get(&topic_region_key(TOPIC, NEW_REGION))
            .await
            .unwrap();
        let checkpoint = key
            .as_ref()
            .and_then(|kv| TopicRegionValue::decode(&kv.key, &kv.value).ok())
            .and_then(|v| v.flushed_entry_id());
        let pruned = self
            .env
            .watched
            .get(&topic_name_key(TOPIC))
            .await
            .unwrap()
            .map(|kv| {
                TopicNameValue::decode(&kv.key, &kv.value)
                    .unwrap()
                    .pruned_entry_id
            })
            .unwrap_or(0);
        RegionToOpen {
            request: RegionOpenRequest {
                region_id: NEW_REGION,
                engine: "mito".to_string(),
                region_dir: "data/2048/".to_string(),
                options: [(
                    WAL_OPTIONS_KEY.to_string(),
                    format!(r#"{{"wal.provider":"kafka","wal.kafka.topic":"{TOPIC}"}}"#),
                )]
                .into(),
            },
            epoch: 0,
            topic_region_key: key.is_some(),
            checkpoint,
            pruned_entry_id: pruned,
            topic_id: None,
            expected_last_entry_id: None,
        }
    }

    /// Create table (the empty key), open the region, record its start as its checkpoint, lease it, write.
    async fn create_open_and_write(&self) {
        self.env
            .watched
            .put(PutRequest {
                key: topic_region_key(TOPIC, NEW_REGION),
                value: TopicRegionValue::default().encode(),
                prev_kv: false,
            })
            .await
            .unwrap();
        let dn = self.datanode(1);
        for (_, result) in dn.open_regions(vec![self.to_open().await]).await {
            result.unwrap();
        }
        let start = dn.regions()[0].flushed_entry_id;
        CheckpointStore::new(self.env.watched.clone())
            .start_region(TOPIC, NEW_REGION, start)
            .await
            .unwrap();
        dn.apply(
            HeartbeatResponse {
                leases: vec![RegionLease {
                    region_id: NEW_REGION,
                    role: RegionRole::Leader,
                    epoch: 0,
                    duration_ms: 60_000,
                }],
                ..HeartbeatResponse::default()
            },
            Instant::now(),
        );
        dn.write(NEW_REGION, vec![b"n1".to_vec()]).await.unwrap();
        dn.write(NEW_REGION, vec![b"n2".to_vec()]).await.unwrap();
    }
}

/// Runs `moment`'s hook inside the prune's DeleteRecords step (before or after the deletion).
struct HookedDeleter {
    inner: Arc<dyn RecordDeleter>,
    scenario: Arc<Scenario>,
    moment: Moment,
    ran: Mutex<bool>,
}

impl std::fmt::Debug for HookedDeleter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookedDeleter")
            .field("moment", &self.moment)
            .finish()
    }
}

#[async_trait]
impl RecordDeleter for HookedDeleter {
    async fn delete_records_before(
        &self,
        topic: &str,
        offset: i64,
    ) -> remote_wal::wal::error::Result<()> {
        let first = !std::mem::replace(&mut *self.ran.lock().unwrap(), true);
        if first && self.moment == Moment::AfterComputePrunable {
            self.scenario.create_open_and_write().await;
        }
        self.inner.delete_records_before(topic, offset).await?;
        if first && self.moment == Moment::AfterDeleteRecords {
            self.scenario.create_open_and_write().await;
        }
        Ok(())
    }
}

async fn prune(scenario: &Arc<Scenario>, deleter: Arc<dyn RecordDeleter>) -> PruneOutput {
    let env = &scenario.env;
    let manager = procedures::LocalManager::new(env.store.clone(), MatrixConfig::default().manager);
    manager
        .register_loader(
            WalPruneProcedure::TYPE_NAME,
            WalPruneProcedure::loader(env.watched.clone(), deleter.clone()),
        )
        .unwrap();
    manager.start().await.unwrap();
    let procedure = WalPruneProcedure::new(
        TOPIC,
        PruneMode::DeleteRecords,
        env.watched.clone(),
        deleter,
    );
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

#[tokio::test]
async fn a_table_created_at_any_moment_of_a_prune_opens_and_keeps_its_entries() {
    for moment in [
        Moment::BeforeThePrune,
        Moment::AfterComputePrunable,
        Moment::AfterDeleteRecords,
        Moment::AfterThePrune,
    ] {
        let scenario = Arc::new(Scenario {
            env: new_env(false).await,
            storage: tempfile::tempdir().unwrap(),
        });
        if moment == Moment::BeforeThePrune {
            scenario.create_open_and_write().await;
        }
        let deleter: Arc<dyn RecordDeleter> = Arc::new(HookedDeleter {
            inner: scenario.env.deleter.clone(),
            scenario: scenario.clone(),
            moment,
            ran: Mutex::new(false),
        });
        let first = prune(&scenario, deleter.clone()).await;
        assert!(first.new_pruned_entry_id > 0, "{moment:?}: {first:?}");
        if moment == Moment::AfterThePrune {
            scenario.create_open_and_write().await;
        }
        // The old regions flush everything; a second prune is bounded by the new region's checkpoint.
        let end = scenario.env.partition.high_watermark().await.unwrap() as u64;
        let checkpoints = CheckpointStore::new(scenario.env.watched.clone());
        for region in [1, 2, 3] {
            checkpoints
                .record_flushed(TOPIC, region, end)
                .await
                .unwrap();
        }
        let second = prune(&scenario, deleter).await;
        let start = checkpoints.get(TOPIC, NEW_REGION).await.unwrap();
        let start = start.and_then(|v| v.flushed_entry_id()).unwrap();
        assert!(
            second.new_pruned_entry_id <= start,
            "{moment:?}: pruned past the new region's checkpoint {start}: {second:?}"
        );
        // A later incarnation opening the region sees both entries.
        let reader = scenario.datanode(2);
        for (_, result) in reader.open_regions(vec![scenario.to_open().await]).await {
            result.unwrap_or_else(|e| panic!("{moment:?}: {e}"));
        }
        let entries: Vec<Vec<u8>> = reader
            .region_entries(NEW_REGION)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.data)
            .collect();
        assert_eq!(entries, vec![b"n1".to_vec(), b"n2".to_vec()], "{moment:?}");
    }
}
