//! An acknowledgement with fewer offsets than records sent gives no entry ids: an error naming the topic and both
//! counts, never an entry id made up for the missing offset.

use async_trait::async_trait;
use datanode::log_store::kafka::{FetchedRecord, PartitionLog};
use datanode::log_store::memory_partition::MemoryPartition;
use datanode::log_store::record::EncodedRecord;
use datanode::log_store::{KafkaLogStore, KafkaLogStoreConfig, LogStore};
use remote_wal::wal::error::Result;

use crate::common::write;

/// A partition whose produce answers one offset short.
#[derive(Debug)]
struct ShortAck(MemoryPartition);

#[async_trait]
impl PartitionLog for ShortAck {
    fn topic(&self) -> &str {
        self.0.topic()
    }
    async fn produce(&self, records: Vec<EncodedRecord>) -> Result<Vec<i64>> {
        let mut offsets = self.0.produce(records).await?;
        offsets.pop();
        Ok(offsets)
    }
    async fn fetch(&self, offset: i64, max_bytes: i32) -> Result<(Vec<FetchedRecord>, i64)> {
        self.0.fetch(offset, max_bytes).await
    }
    async fn high_watermark(&self) -> Result<i64> {
        self.0.high_watermark().await
    }
    async fn low_watermark(&self) -> Result<i64> {
        self.0.low_watermark().await
    }
}

#[tokio::test]
async fn a_short_acknowledgement_is_an_error_naming_the_topic_and_counts() {
    let store = KafkaLogStore::new(
        ShortAck(MemoryPartition::new("short")),
        KafkaLogStoreConfig::default(),
    );
    let err = store
        .append(vec![write(1, b"a"), write(2, b"b")])
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "WAL topic 'short': 2 records produced but 1 offsets acknowledged"
    );
    assert!(!err.is_retryable());
}
