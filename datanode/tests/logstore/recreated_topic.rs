//! On the real broker (`KAFKA_ENDPOINTS`; the test fails when it is unset): a region's topic deleted and created
//! again under the same name is another incarnation, with another id and positions from 0. A datanode that reads
//! the id from the brokers (Metadata, as `walctl datanode` does) refuses to replay the region from its old
//! checkpoint and names both ids; the region it opened before reported the first id in its heartbeat.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use datanode::error::Error;
use datanode::log_store::KafkaLogStoreConfig;
use datanode::log_store::LogStore;
use datanode::{Datanode, DatanodeOptions};
use remote_wal::datanode::RegionOpenRequest;
use remote_wal::datanode::protocol::{HeartbeatResponse, RegionLease, RegionRole, RegionToOpen};
use remote_wal::wal::{WAL_OPTIONS_KEY, WalOptions};

use crate::common::{broker_store, broker_topic, write};

const REGION: u64 = (77 << 32) | 1;

fn datanode(config: &remote_wal::wal::KafkaConfig, storage: &std::path::Path) -> Arc<Datanode> {
    let dn = Datanode::new(DatanodeOptions {
        id: 1,
        address: "127.0.0.1:1".to_string(),
        wal_dir: storage.join("wal"),
        region_storage: storage.join("regions"),
        kafka: Some(config.clone()),
        heartbeat_interval: Duration::from_millis(100),
        flush_threshold: u64::MAX,
        partitions: None,
        topic_ids: None,
    });
    dn.set_incarnation(1);
    Arc::new(dn)
}

fn to_open(topic: &str, checkpoint: Option<u64>) -> RegionToOpen {
    RegionToOpen {
        request: RegionOpenRequest {
            region_id: REGION,
            engine: "mito".to_string(),
            region_dir: format!("data/{REGION}"),
            options: BTreeMap::from([(
                WAL_OPTIONS_KEY.to_string(),
                WalOptions::kafka(topic).encode(),
            )]),
        },
        epoch: 0,
        topic_region_key: true,
        checkpoint,
        pruned_entry_id: 0,
        topic_id: None,
        expected_last_entry_id: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_recreated_under_its_name_is_not_replayed_from_the_old_checkpoint() {
    let (client, config, topic) = broker_topic("recreated").await;
    let storage = tempfile::tempdir().unwrap();
    let dn = datanode(&config, storage.path());
    for (id, result) in dn.open_regions(vec![to_open(&topic, None)]).await {
        result.unwrap_or_else(|e| panic!("open {id}: {e}"));
    }
    let first_id = dn.heartbeat_request().regions[0]
        .topic_id
        .expect("the brokers give the topic an id");
    dn.apply(
        HeartbeatResponse {
            leases: vec![RegionLease {
                region_id: REGION,
                role: RegionRole::Leader,
                epoch: 0,
                duration_ms: 60_000,
            }],
            ..HeartbeatResponse::default()
        },
        Instant::now(),
    );
    for i in 0..5u8 {
        dn.write(REGION, vec![vec![i]]).await.unwrap();
    }
    let flushed = dn.flush(REGION).await.unwrap().flushed_entry_id;
    assert_eq!(flushed, 5);
    drop(dn);

    // Deleted and created again out of band; another region writes to the new incarnation.
    let controller = client.controller_client().expect("controller client");
    controller
        .delete_topic(topic.clone(), 10_000)
        .await
        .unwrap_or_else(|e| panic!("delete topic {topic}: {e}"));
    let mut created = false;
    for _ in 0..120 {
        // Until the deletion completes, creating the name again is refused.
        if controller.create_topic(&topic, 1, 1, 10_000).await.is_ok() {
            created = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(created, "topic {topic} could not be created again");
    let store = broker_store(&client, &config, &topic, KafkaLogStoreConfig::default()).await;
    store
        .append(vec![write(REGION + 1, b"a"), write(REGION + 1, b"b")])
        .await
        .unwrap();

    let dn = datanode(&config, storage.path());
    let open = RegionToOpen {
        topic_id: Some(first_id),
        ..to_open(&topic, Some(flushed))
    };
    let results = dn.open_regions(vec![open]).await;
    let lost = match &results[..] {
        [(_, Err(Error::WalTailLost { lost }))] => lost.clone(),
        other => panic!("expected the region refused as lost, got {other:?}"),
    };
    assert_eq!(lost.expected, first_id);
    let second_id = lost.found.expect("the new topic is listed with an id");
    assert_ne!(second_id, first_id);
    assert_eq!(dn.heartbeat_request().wal_lost, vec![lost.clone()]);
    eprintln!("recreated topic: {lost}");
}
