//! `walctl wal prune` on the real broker (`KAFKA_ENDPOINTS`) and etcd (`ETCD_ENDPOINTS`); the test fails saying so
//! when either is unset. Two regions share a one-topic pool; their checkpoints are recorded through the library;
//! a prune deletes the records below the lower one and moves the watermark there. Then the prune is killed (-9)
//! at random moments several times while the checkpoints advance, and the end state is checked: the watermark never
//! moved backwards, never passed the lowest checkpoint, and every region still replays exactly its entries above
//! its checkpoint.

use std::collections::BTreeMap;
use std::time::Duration;

use datanode::checkpoint::CheckpointStore;
use datanode::log_store::kafka::{PartitionLog, RsKafkaPartition, call_bound, connect_client};
use datanode::log_store::{EntryToWrite, KafkaLogStore, KafkaLogStoreConfig, LogStore};
use remote_wal::config::MetasrvConfig;
use remote_wal::key::topic_name::get_topic_value;
use remote_wal::kv::redb::RedbOpenMode;
use remote_wal::metasrv::Metasrv;
use remote_wal::wal::{KafkaConfig, WalConfig};

use crate::support::{Env, kafka_etcd_config, unique, walctl_path};

/// Opens the metasrv of `config` in this process (no manager started) and runs `f` on its store.
async fn with_metasrv<T>(config: &std::path::Path, f: impl AsyncFnOnce(&Metasrv) -> T) -> T {
    let config = MetasrvConfig::from_file(config).expect("config");
    let metasrv = Metasrv::open(config, RedbOpenMode::MustExist)
        .await
        .expect("open");
    let out = f(&metasrv).await;
    metasrv.stop().await.expect("stop");
    out
}

fn kafka_of(metasrv: &Metasrv) -> KafkaConfig {
    match &metasrv.config().wal {
        WalConfig::Kafka(k) => k.clone(),
        WalConfig::RaftEngine => panic!("a Kafka config"),
    }
}

#[test]
fn prune_deletes_below_the_lowest_checkpoint_and_survives_kill_9() {
    let env = Env::new();
    let prefix = unique("walctl_prune");
    let config = kafka_etcd_config(&env, &prefix, 1, &[1]);
    env.json(Some(&config), &["bootstrap"]);
    let created = env.json(
        Some(&config),
        &["create-table", "public.pruned", "--regions", "2"],
    );
    let regions: Vec<u64> = created
        .iter()
        .map(|r| r["region_id"].as_u64().expect("region_id"))
        .collect();
    assert_eq!(regions.len(), 2);
    let topic = format!("{prefix}_0");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");

    // Each region starts (checkpoint = the topic's end) before writing, then writes 5 entries; region 0 flushes
    // up to entry 6, region 1 up to entry 4.
    let (checkpoints, kafka) = rt.block_on(with_metasrv(&config, async |m: &Metasrv| {
        let kafka = kafka_of(m);
        let client = connect_client(&kafka).await.expect("connect");
        let partition = RsKafkaPartition::new(&client, &topic, call_bound(&kafka))
            .await
            .expect("partition");
        let store = KafkaLogStore::new(partition, KafkaLogStoreConfig::default());
        let checkpoints = CheckpointStore::new(m.kv().clone());
        for region in &regions {
            datanode::checkpoint::start_kafka_region(&store, &checkpoints, *region)
                .await
                .expect("start");
        }
        let entries = (0..10)
            .map(|i| EntryToWrite {
                region_id: regions[i % 2],
                data: vec![7; 100],
            })
            .collect();
        store.append(entries).await.expect("append");
        checkpoints
            .record_flushed(&topic, regions[0], 6)
            .await
            .expect("flush");
        checkpoints
            .record_flushed(&topic, regions[1], 4)
            .await
            .expect("flush");
        (
            BTreeMap::from([(regions[0], 6u64), (regions[1], 4u64)]),
            kafka,
        )
    }));

    let pruned = env.json(Some(&config), &["wal", "prune"]);
    assert_eq!(pruned.len(), 1, "{pruned:?}");
    assert_eq!(pruned[0]["topic"], topic.as_str());
    assert_eq!(pruned[0]["old_pruned_entry_id"], 0);
    assert_eq!(pruned[0]["new_pruned_entry_id"], 4);
    let low = rt.block_on(async {
        let client = connect_client(&kafka).await.expect("connect");
        RsKafkaPartition::new(&client, &topic, call_bound(&kafka))
            .await
            .expect("partition")
            .low_watermark()
            .await
            .expect("low")
    });
    assert_eq!(low, 4, "entries 1..=4 (offsets 0..=3) deleted");

    // Kill -9 at random moments while the checkpoints advance by one entry each round.
    let mut checkpoints = checkpoints;
    let mut last_watermark = 4;
    for round in 0..4u64 {
        for (region, flushed) in checkpoints.iter_mut() {
            *flushed = (*flushed + 1).min(10);
            let (region, flushed) = (*region, *flushed);
            let topic = topic.clone();
            rt.block_on(with_metasrv(&config, async move |m: &Metasrv| {
                CheckpointStore::new(m.kv().clone())
                    .record_flushed(&topic, region, flushed)
                    .await
                    .expect("flush");
            }));
        }
        let mut child = std::process::Command::new(walctl_path())
            .current_dir(env.dir.path())
            .arg("--config")
            .arg(&config)
            .args(["wal", "prune"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn");
        // A different moment each round: 0, 150, 300, 450 ms after the start.
        std::thread::sleep(Duration::from_millis(150 * round));
        let _ = child.kill();
        let _ = child.wait();
        let watermark = rt.block_on(with_metasrv(&config, async |m: &Metasrv| {
            get_topic_value(m.kv().as_ref(), &topic)
                .await
                .expect("read")
                .expect("key")
                .pruned_entry_id
        }));
        let lowest = *checkpoints.values().min().expect("regions");
        assert!(
            watermark >= last_watermark,
            "round {round}: {watermark} < {last_watermark}"
        );
        assert!(watermark <= lowest, "round {round}: {watermark} > {lowest}");
        last_watermark = watermark;
    }
    // A run to the end finishes what a killed one left and prunes to the lowest checkpoint.
    let pruned = env.json(Some(&config), &["wal", "prune", "--topic", &topic]);
    let lowest = *checkpoints.values().min().expect("regions");
    assert_eq!(
        pruned.last().expect("a line")["new_pruned_entry_id"],
        lowest
    );
    let opened = env.json(
        Some(&config),
        &["open-regions", "--datanode", "1", "--replay"],
    );
    for line in &opened {
        let region = line["region_id"].as_u64().expect("region_id");
        assert!(line.get("replay_error").is_none(), "{line}");
        // Region 0 wrote entries 1, 3, 5, 7, 9; region 1 wrote 2, 4, 6, 8, 10.
        let first = if region == regions[0] { 1 } else { 2 };
        let wanted = (first..=10)
            .step_by(2)
            .filter(|id| *id > checkpoints[&region])
            .count() as u64;
        assert_eq!(line["entries_replayed"].as_u64(), Some(wanted), "{line}");
    }
}

/// A pool of three topics, a region on each: every region writes 4 entries and flushes 3; the middle topic's region
/// key is then damaged. `wal prune` prunes the other two, reports the damaged one as failed naming its key, and
/// exits non-zero. After the table is dropped, the next prune frees every topic: each is pruned to its end, on the
/// broker too.
#[test]
fn a_damaged_topic_fails_alone_and_a_drop_frees_every_topic_to_its_end() {
    let env = Env::new();
    let prefix = unique("walctl_round");
    let config = kafka_etcd_config(&env, &prefix, 3, &[1]);
    env.json(Some(&config), &["bootstrap"]);
    env.json(
        Some(&config),
        &["create-table", "public.rounded", "--regions", "3"],
    );
    let topics: Vec<String> = (0..3).map(|i| format!("{prefix}_{i}")).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (kafka, damaged_key) = rt.block_on(with_metasrv(&config, async |m: &Metasrv| {
        let kafka = kafka_of(m);
        let client = connect_client(&kafka).await.expect("connect");
        let checkpoints = CheckpointStore::new(m.kv().clone());
        let mut damaged_key = String::new();
        for (i, topic) in topics.iter().enumerate() {
            let on_topic =
                remote_wal::key::topic_region::read_topic_regions(m.kv().as_ref(), topic)
                    .await
                    .expect("read keys");
            let region = *on_topic.keys().next().expect("one region per topic");
            let partition = RsKafkaPartition::new(&client, topic, call_bound(&kafka))
                .await
                .expect("partition");
            let store = KafkaLogStore::new(partition, KafkaLogStoreConfig::default());
            datanode::checkpoint::start_kafka_region(&store, &checkpoints, region)
                .await
                .expect("start");
            let entries = (0..4)
                .map(|_| EntryToWrite {
                    region_id: region,
                    data: vec![1; 10],
                })
                .collect();
            store.append(entries).await.expect("append");
            checkpoints
                .record_flushed(topic, region, 3)
                .await
                .expect("flush");
            if i == 1 {
                let key = remote_wal::key::topic_region::topic_region_key(topic, region);
                damaged_key = String::from_utf8_lossy(&key).into_owned();
                m.kv()
                    .put(remote_wal::kv::PutRequest {
                        key,
                        value: b"{damaged".to_vec(),
                        prev_kv: false,
                    })
                    .await
                    .expect("damage");
            }
        }
        (kafka, damaged_key)
    }));

    let out = env
        .walctl_with(&config)
        .args(["wal", "prune"])
        .output()
        .expect("run wal prune");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a failed topic fails the command: {stdout}"
    );
    for topic in [&topics[0], &topics[2]] {
        assert!(
            stdout.contains(&format!(
                "topic {topic}: pruned entry id 0 -> 3 (delete_records, 1 regions)"
            )),
            "{stdout}"
        );
    }
    let failed = stdout
        .lines()
        .find(|l| l.starts_with(&format!("topic {}: failed at Decide: ", topics[1])))
        .unwrap_or_else(|| panic!("the damaged topic's line: {stdout}"));
    assert!(failed.contains(&damaged_key), "names the key: {failed}");
    assert!(
        stdout.contains("3 topics: 2 pruned, 0 skipped, 1 failed"),
        "{stdout}"
    );
    assert!(
        stderr.contains(&format!("1 of 3 topics failed ({})", topics[1])),
        "{stderr}"
    );

    env.json(Some(&config), &["drop-table", "public.rounded"]);
    let pruned = env.json(Some(&config), &["wal", "prune"]);
    assert_eq!(pruned.len(), 3, "{pruned:?}");
    for (line, topic) in pruned.iter().zip(&topics) {
        assert_eq!(line["topic"], topic.as_str(), "{line}");
        assert_eq!(line["outcome"], "pruned", "{line}");
        // Each topic holds its region's 4 entries: the end is entry 4.
        assert_eq!(line["new_pruned_entry_id"], 4, "{line}");
        assert_eq!(line["regions"], 0, "{line}");
    }
    rt.block_on(async {
        let client = connect_client(&kafka).await.expect("connect");
        for topic in &topics {
            let partition = RsKafkaPartition::new(&client, topic, call_bound(&kafka))
                .await
                .expect("partition");
            assert_eq!(partition.low_watermark().await.expect("low"), 4, "{topic}");
        }
    });
}
