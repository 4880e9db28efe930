//! Bootstrap of a 256-topic pool on the real broker (`KAFKA_ENDPOINTS`), with bounded concurrent creates (16 in
//! flight, the config default) versus one at a time. Not a criterion bench: each run creates 256 topics on the
//! shared broker, so a criterion sample set (10 samples × 2 modes) would create 5,120 topics. It runs `ROUNDS`
//! rounds of each mode, interleaved, and prints every time and the ratio of the medians.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use procedures::{Context, Procedure, ProcedureId, Status};
use remote_wal::kv::MemoryKvBackend;
use remote_wal::wal::KafkaConfig;
use remote_wal::wal::kafka::TopicPoolSpec;
use remote_wal::wal::kafka::bootstrap::TopicBootstrapProcedure;
use remote_wal::wal::kafka::rskafka_admin::RsKafkaTopicAdmin;

const TOPICS: usize = 256;
const ROUNDS: usize = 2;

/// The pool size: [`TOPICS`], or 16 in a smoke run.
fn topics() -> usize {
    if smoke() { 16 } else { TOPICS }
}

fn endpoints() -> Vec<String> {
    let raw = std::env::var("KAFKA_ENDPOINTS").unwrap_or_default();
    let endpoints: Vec<String> = raw
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(String::from)
        .collect();
    assert!(
        !endpoints.is_empty(),
        "KAFKA_ENDPOINTS is not set: this bench needs a running Kafka broker (comma-separated host:port)"
    );
    endpoints
}

async fn bootstrap_once(concurrency: usize) -> Duration {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_nanos();
    let mut config = KafkaConfig {
        broker_endpoints: endpoints(),
        num_topics: topics(),
        topic_name_prefix: format!("rw_bench_boot_c{concurrency}_{nanos}"),
        max_concurrent_creates: concurrency,
        ..KafkaConfig::default()
    };
    config.backoff.init = Duration::from_millis(20);
    config.backoff.max = Duration::from_millis(200);
    let admin = Arc::new(
        RsKafkaTopicAdmin::connect(&config)
            .await
            .expect("Kafka at KAFKA_ENDPOINTS is unreachable"),
    );
    let mut procedure = TopicBootstrapProcedure::new(
        TopicPoolSpec::from_config(&config),
        Arc::new(MemoryKvBackend::new()),
        admin,
    )
    .expect("valid spec");
    let ctx = Context::new(ProcedureId::new("bench"));
    let started = Instant::now();
    loop {
        match procedure.execute(&ctx).await.expect("bootstrap") {
            Status::Done { .. } => return started.elapsed(),
            Status::Executing { .. } => {}
            other => panic!("unexpected status {other:?}"),
        }
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    let mid = v.len() / 2;
    if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2
    } else {
        v[mid]
    }
}

/// Whether this run is `cargo test --benches` (the test command runs every bench once, at its smallest, so a
/// broken bench fails CI) rather than `cargo bench`, which passes `--bench`.
fn smoke() -> bool {
    !std::env::args().any(|a| a == "--bench")
}

fn main() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (mut seq, mut conc) = (Vec::new(), Vec::new());
    let rounds = if smoke() { 1 } else { ROUNDS };
    for round in 0..rounds {
        let s = rt.block_on(bootstrap_once(1));
        let c = rt.block_on(bootstrap_once(16));
        println!(
            "round {round}: {} topics sequential {s:?}, 16 concurrent {c:?}",
            topics()
        );
        seq.push(s);
        conc.push(c);
    }
    let (s, c) = (median(seq), median(conc));
    println!(
        "bootstrap of {} topics: sequential {s:?}, bounded-concurrent (16) {c:?}, ratio {:.2}x",
        topics(),
        s.as_secs_f64() / c.as_secs_f64()
    );
}
