//! Fakes shared by the WAL tests: the shared fake Kafka topic admin, under the name these tests use.
#![allow(dead_code, unused_imports)]

pub use remote_wal::wal::kafka::testing::{FakeFault, FakeTopicAdmin as FakeAdmin};
