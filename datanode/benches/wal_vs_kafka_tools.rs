//! Our Kafka log store against Kafka's own performance tools, on one broker (`KAFKA_ENDPOINTS`; start one of the
//! bench's own with `scripts/services.sh start kafka wal-kafka`), 1 KiB entries, every figure from the same run:
//!
//! ```sh
//! KAFKA_ENDPOINTS=$(scripts/services.sh endpoint kafka wal-kafka) cargo bench --bench wal_vs_kafka_tools
//! ```
//!
//! - **append**: `KafkaLogStore::append` of `BENCH_ENTRIES` entries (default 100,000) to a fresh topic, in calls of
//!   1 MiB, against `org.apache.kafka.tools.ProducerPerformance --producer-props acks=all` producing as many 1 KiB
//!   records to another fresh topic (from the jars `scripts/services.sh install` puts in `target/kafka-libs`, or
//!   `KAFKA_LIBS`);
//! - **replay**: `replay_topic` of the one region of the first topic against
//!   `org.apache.kafka.tools.ConsumerPerformance` reading the anchor's topic to its end;
//! - **1 vs 16 regions**: the same bytes written by 1 region and by 16 regions on two more topics, each replayed in
//!   one pass, five times alternately (the order swapped every round); the medians are compared;
//! - **raft-engine**: append and replay of the same entries in a temporary directory.
//!
//! It prints one table with entries/s, MB/s and the ratios ours / anchor (goal ≥ 0.7) and 16 / 1 regions (goal
//! ≤ 1.5). Not part of the test command; the numbers are figures of one run, not assertions.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use datanode::log_store::kafka::{RsKafkaPartition, call_bound, connect_client};
use datanode::log_store::{
    EntryToWrite, KafkaLogStore, KafkaLogStoreConfig, LogStore, RaftEngineLogStore,
};
use datanode::replay::replay_topic;
use remote_wal::kv::KvBackendRef;
use remote_wal::kv::memory::MemoryKvBackend;
use remote_wal::wal::KafkaConfig;
use rskafka::client::Client;

const ENTRY: usize = 1024;
const BATCH_BYTES: usize = 1024 * 1024;

fn entries() -> usize {
    std::env::var("BENCH_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke() { 1_000 } else { 100_000 })
}

fn kafka_libs() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    std::env::var("KAFKA_LIBS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("../target/kafka-libs"))
}

/// Runs a Kafka tool class with the jars on the classpath; returns its stdout.
fn tool(class: &str, args: &[String]) -> String {
    let classpath = format!("{}/*", kafka_libs().display());
    let out = Command::new("java")
        .arg("-cp")
        .arg(&classpath)
        .arg(class)
        .args(args)
        .output()
        .expect("run java (a JRE is needed)");
    assert!(
        out.status.success(),
        "{class} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn create_topic(client: &Client, topic: &str) {
    client
        .controller_client()
        .expect("controller client")
        .create_topic(topic, 1, 1, 10_000)
        .await
        .unwrap_or_else(|e| panic!("create topic {topic}: {e}"));
    loop {
        let topics = client.list_topics().await.expect("list topics");
        if topics.iter().any(|t| t.name == topic) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn store(
    client: &Client,
    config: &KafkaConfig,
    topic: &str,
) -> KafkaLogStore<RsKafkaPartition> {
    create_topic(client, topic).await;
    let partition = RsKafkaPartition::new(client, topic, call_bound(config))
        .await
        .expect("partition");
    KafkaLogStore::new(partition, KafkaLogStoreConfig::default())
}

/// Appends `n` entries spread over `regions` regions in 1 MiB calls; the time taken.
async fn append(store: &dyn LogStore, n: usize, regions: u64) -> Duration {
    let per_call = BATCH_BYTES / ENTRY;
    let started = Instant::now();
    let mut i = 0;
    while i < n {
        let batch = (i..(i + per_call).min(n))
            .map(|j| EntryToWrite {
                region_id: 1 + j as u64 % regions,
                data: vec![(j % 251) as u8; ENTRY],
            })
            .collect();
        store.append(batch).await.expect("append");
        i += per_call;
    }
    started.elapsed()
}

/// How many times the 1-region and the 16-region topics are each replayed.
const REPLAY_ROUNDS: usize = 5;

/// The median of `times` (the upper one of an even count).
fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times.get(times.len() / 2).copied().unwrap_or_default()
}

/// Replays `regions` regions of `store` in one pass; the time taken and the entries replayed.
async fn replay(
    store: &KafkaLogStore<RsKafkaPartition>,
    kv: &KvBackendRef,
    regions: u64,
) -> (Duration, u64) {
    let ids: Vec<u64> = (1..=regions).collect();
    let started = Instant::now();
    let replayed = replay_topic(store, kv, &ids).await.expect("replay");
    let elapsed = started.elapsed();
    (
        elapsed,
        replayed.regions.values().map(|r| r.entries_replayed).sum(),
    )
}

/// The last `records/sec` figure ProducerPerformance prints (its summary line).
fn producer_rate(out: &str) -> f64 {
    let line = out
        .lines()
        .rev()
        .find(|l| l.contains("records sent"))
        .unwrap_or_else(|| panic!("no summary in ProducerPerformance's output: {out}"));
    let before = line
        .split(" records/sec")
        .next()
        .and_then(|s| s.rsplit(',').next())
        .map(str::trim)
        .unwrap_or_default();
    before
        .parse()
        .unwrap_or_else(|_| panic!("no rate in {line:?}"))
}

/// ConsumerPerformance's `nMsg.sec` (the 6th column of its CSV line).
fn consumer_rate(out: &str) -> f64 {
    let line = out
        .lines()
        .rev()
        .find(|l| l.split(',').count() >= 6 && !l.starts_with("start.time"))
        .unwrap_or_else(|| panic!("no result line in ConsumerPerformance's output: {out}"));
    line.split(',')
        .nth(5)
        .map(str::trim)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no nMsg.sec in {line:?}"))
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64().max(1e-9)
}

fn row(what: &str, per_sec: f64, anchor: Option<f64>) {
    let mb = per_sec * ENTRY as f64 / 1e6;
    match anchor {
        Some(a) => println!(
            "| {what} | {per_sec:.0} | {mb:.1} | {a:.0} | {:.2} |",
            per_sec / a
        ),
        None => println!("| {what} | {per_sec:.0} | {mb:.1} | | |"),
    }
}

/// Whether this run is `cargo test --benches` (the test command runs every bench once, at its smallest, so a
/// broken bench fails CI) rather than `cargo bench`, which passes `--bench`.
fn smoke() -> bool {
    !std::env::args().any(|a| a == "--bench")
}

fn main() {
    let brokers: Vec<String> = std::env::var("KAFKA_ENDPOINTS")
        .expect("set KAFKA_ENDPOINTS to a broker of this bench's own")
        .split(',')
        .map(str::to_string)
        .collect();
    let n = entries();
    let run = format!("{:x}", std::process::id());
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let config = KafkaConfig {
        broker_endpoints: brokers.clone(),
        ..KafkaConfig::default()
    };
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());

    let (ours_append, ours_replay, one, sixteen, client) = rt.block_on(async {
        let client = connect_client(&config).await.expect("connect");
        let ours = store(&client, &config, &format!("bench_wal_ours_{run}")).await;
        let append_time = append(&ours, n, 1).await;
        let (replay_time, replayed) = replay(&ours, &kv, 1).await;
        assert_eq!(replayed, n as u64, "every entry replayed");
        let one_store = store(&client, &config, &format!("bench_wal_one_{run}")).await;
        append(&one_store, n, 1).await;
        let sixteen_store = store(&client, &config, &format!("bench_wal_sixteen_{run}")).await;
        append(&sixteen_store, n, 16).await;
        // Replays only read, so each topic is replayed REPLAY_ROUNDS times, the two alternating and the order
        // swapped every round: the medians compare like with like on a machine whose load changes meanwhile.
        let (mut ones, mut sixteens) = (Vec::new(), Vec::new());
        for round in 0..REPLAY_ROUNDS {
            for sixteen_now in [round % 2 == 1, round % 2 == 0] {
                if sixteen_now {
                    let (took, replayed) = replay(&sixteen_store, &kv, 16).await;
                    assert_eq!(replayed, n as u64, "every entry replayed over 16 regions");
                    sixteens.push(took);
                } else {
                    let (took, replayed) = replay(&one_store, &kv, 1).await;
                    assert_eq!(replayed, n as u64, "every entry replayed by 1 region");
                    ones.push(took);
                }
            }
        }
        (
            append_time,
            replay_time,
            median(ones),
            median(sixteens),
            client,
        )
    });

    let anchor_topic = format!("bench_wal_anchor_{run}");
    rt.block_on(create_topic(&client, &anchor_topic));
    let bootstrap = brokers.join(",");
    let produced = tool(
        "org.apache.kafka.tools.ProducerPerformance",
        &[
            "--topic".into(),
            anchor_topic.clone(),
            "--num-records".into(),
            n.to_string(),
            "--record-size".into(),
            ENTRY.to_string(),
            "--throughput".into(),
            "-1".into(),
            "--producer-props".into(),
            "acks=all".into(),
            format!("bootstrap.servers={bootstrap}"),
        ],
    );
    let consumed = tool(
        "org.apache.kafka.tools.ConsumerPerformance",
        &[
            "--bootstrap-server".into(),
            bootstrap,
            "--topic".into(),
            anchor_topic,
            "--messages".into(),
            n.to_string(),
            "--timeout".into(),
            "60000".into(),
        ],
    );
    let anchor_produce = producer_rate(&produced);
    let anchor_consume = consumer_rate(&consumed);

    let (raft_append, raft_replay) = rt.block_on(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let raft = RaftEngineLogStore::open(&dir.path().join("wal"))
            .await
            .expect("open raft-engine");
        let appended = append(&raft, n, 1).await;
        let started = Instant::now();
        let read = raft.read(1, 0).await.expect("read");
        assert_eq!(read.len(), n);
        (appended, started.elapsed())
    });

    println!(
        "{n} entries of {ENTRY} bytes, one broker at {}",
        brokers.join(",")
    );
    println!("| what | entries/s | MB/s | anchor entries/s | ratio |");
    println!("|---|---|---|---|---|");
    row(
        "Kafka append (ours vs ProducerPerformance acks=all)",
        rate(n, ours_append),
        Some(anchor_produce),
    );
    row(
        "Kafka replay (ours vs ConsumerPerformance)",
        rate(n, ours_replay),
        Some(anchor_consume),
    );
    row("replay, 1 region (median of 5)", rate(n, one), None);
    row(
        "replay, 16 regions sharing the topic (median of 5)",
        rate(n, sixteen),
        None,
    );
    println!(
        "| 16 regions / 1 region replay time | | | | {:.2} |",
        sixteen.as_secs_f64() / one.as_secs_f64().max(1e-9)
    );
    row("raft-engine append", rate(n, raft_append), None);
    row("raft-engine replay", rate(n, raft_replay), None);
}
