//! Creating a batch of fresh topics on the real broker (`KAFKA_ENDPOINTS`) through `RsKafkaTopicAdmin`:
//! one at a time vs with bounded concurrency (16 in flight).
//!
//! Each iteration creates `TOPICS` topics with names never used before and times only the creates; the topics are
//! deleted again afterwards (untimed) so the shared broker does not accumulate thousands of topics.
//!
//! Run it in the dev profile (`cargo bench --profile dev --bench kafka_create`) unless optimised numbers are wanted:
//! the time is the broker's, the client's CPU is negligible.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use futures::StreamExt;
use futures::stream;
use remote_wal::wal::KafkaConfig;
use remote_wal::wal::kafka::admin::TopicAdmin;
use remote_wal::wal::kafka::rskafka_admin::RsKafkaTopicAdmin;
use rskafka::client::ClientBuilder;
use rskafka::client::controller::ControllerClient;

/// Topics created per iteration (64, not the pool-sized 256: at ~50 ms per create on a loaded 2-core machine, 256
/// sequential creates take ~15 s an iteration, too long for 2 × 11 iterations).
const TOPICS: usize = 64;
/// Creates in flight in the concurrent variant.
const CONCURRENCY: usize = 16;

fn fresh_names(tag: &str) -> Vec<String> {
    static BATCH: AtomicUsize = AtomicUsize::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let batch = BATCH.fetch_add(1, Ordering::Relaxed);
    (0..TOPICS)
        .map(|i| {
            format!(
                "remote_wal_bench_{tag}_{}_{nanos}_{batch}_{i}",
                std::process::id()
            )
        })
        .collect()
}

async fn delete_all(deleter: &ControllerClient, names: &[String]) {
    stream::iter(names)
        .for_each_concurrent(CONCURRENCY, |name| async move {
            if let Err(e) = deleter.delete_topic(name.as_str(), 30_000).await {
                eprintln!("could not delete bench topic {name}: {e}");
            }
        })
        .await;
}

fn bench(c: &mut Criterion) {
    let Ok(raw) = std::env::var("KAFKA_ENDPOINTS") else {
        eprintln!(
            "KAFKA_ENDPOINTS is not set: this bench needs a running Kafka broker (comma-separated host:port)"
        );
        std::process::exit(2);
    };
    let endpoints: Vec<String> = raw.split(',').map(|e| e.trim().to_string()).collect();
    let config = KafkaConfig {
        broker_endpoints: endpoints.clone(),
        max_concurrent_creates: CONCURRENCY,
        ..KafkaConfig::default()
    };
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let admin = match rt.block_on(RsKafkaTopicAdmin::connect(&config)) {
        Ok(admin) => Arc::new(admin),
        Err(e) => {
            eprintln!("Kafka at KAFKA_ENDPOINTS={endpoints:?} is unreachable: {e}");
            std::process::exit(2);
        }
    };
    let deleter = rt
        .block_on(ClientBuilder::new(endpoints).build())
        .and_then(|client| client.controller_client())
        .map(Arc::new)
        .expect("second client for deleting bench topics");

    let mut group = c.benchmark_group(format!("kafka_create_{TOPICS}_topics"));
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Elements(TOPICS as u64));

    group.bench_function("sequential", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let admin = Arc::clone(&admin);
            let deleter = Arc::clone(&deleter);
            async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let names = fresh_names("seq");
                    let start = Instant::now();
                    for name in &names {
                        admin.create_topic(name, 1, 1).await.expect("create");
                    }
                    total += start.elapsed();
                    delete_all(&deleter, &names).await;
                }
                total
            }
        })
    });

    group.bench_function(format!("concurrent_{CONCURRENCY}"), |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let admin = Arc::clone(&admin);
            let deleter = Arc::clone(&deleter);
            async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let names = fresh_names("conc");
                    let start = Instant::now();
                    stream::iter(&names)
                        .for_each_concurrent(CONCURRENCY, |name| {
                            let admin = Arc::clone(&admin);
                            async move {
                                admin.create_topic(name, 1, 1).await.expect("create");
                            }
                        })
                        .await;
                    total += start.elapsed();
                    delete_all(&deleter, &names).await;
                }
                total
            }
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    // Few resamples: the analysis is slow in the dev profile and ten samples gain nothing from more.
    config = Criterion::default().nresamples(5_000).without_plots();
    targets = bench
}
criterion_main!(benches);
