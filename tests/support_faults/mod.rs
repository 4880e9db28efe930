//! Test code shared by `tests/fault_schedules.rs` and `tests/bad_input.rs`: the shared fake Kafka topic admin (under
//! its old name here) and a snapshot of a kv backend's whole contents.
#![allow(dead_code, unused_imports)]

use remote_wal::kv::{KvBackend, RangeRequest, range_all};
pub use remote_wal::wal::kafka::testing::{FakeTopic, FakeTopicAdmin as FakeAdmin};

/// Every pair of a kv backend, as (key, value) in key order.
pub async fn kv_snapshot(kv: &dyn KvBackend) -> Vec<(Vec<u8>, Vec<u8>)> {
    range_all(kv, RangeRequest::prefix(Vec::<u8>::new()), 0)
        .await
        .expect("read the whole kv backend")
        .into_iter()
        .map(|kv| (kv.key, kv.value))
        .collect()
}
