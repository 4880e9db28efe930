//! `alloc_batch(100_000)` on a ready pool of 64 topics: the cost of handing WAL options to the regions of a large
//! create-table batch.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use remote_wal::key::topic_name::{TopicNameValue, topic_name_key};
use remote_wal::kv::{KvBackend, MemoryKvBackend, PutRequest};
use remote_wal::wal::WalOptionsAllocator;
use remote_wal::wal::kafka::testing::FakeTopicAdmin;
use remote_wal::wal::kafka::{KafkaTopicManager, RoundRobinTopicSelector, TopicPoolSpec};

fn ready_allocator(rt: &tokio::runtime::Runtime) -> WalOptionsAllocator {
    rt.block_on(async {
        let spec = TopicPoolSpec::new("bench_wal_topic", 64);
        let kv = Arc::new(MemoryKvBackend::new());
        // The pool on the (fake) brokers and its names persisted, as after a bootstrap.
        let brokers = FakeTopicAdmin::new();
        for topic in spec.topic_names() {
            brokers.create_out_of_band(&topic, 1);
            kv.put(PutRequest {
                key: topic_name_key(&topic),
                value: TopicNameValue::default().encode(),
                prev_kv: false,
            })
            .await
            .expect("put");
        }
        let manager = KafkaTopicManager::new(
            spec,
            kv,
            Arc::new(brokers),
            Arc::new(RoundRobinTopicSelector::new()),
        )
        .expect("valid spec");
        manager.load_ready().await.expect("pool is complete");
        WalOptionsAllocator::Kafka(manager)
    })
}

fn alloc_batch(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let allocator = ready_allocator(&rt);
    let mut group = c.benchmark_group("wal_alloc");
    group.sample_size(10);
    group.throughput(criterion::Throughput::Elements(100_000));
    group.bench_function("alloc_batch_100000_of_64_topics", |b| {
        b.iter(|| black_box(allocator.alloc_batch(black_box(100_000)).expect("ready")))
    });
    group.finish();
}

criterion_group!(benches, alloc_batch);
criterion_main!(benches);
