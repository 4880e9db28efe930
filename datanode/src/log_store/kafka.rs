//! [`KafkaLogStore`]: the log of the regions sharing one Kafka topic (partition 0), one record per entry fragment
//! (format and entry ids in [`super::record`]).
//!
//! The store talks to the partition through [`PartitionLog`]: [`RsKafkaPartition`] is rskafka's partition client
//! with a hard timeout on every call; tests use the in-memory `MemoryPartition` (feature `testing`).
//!
//! Appends are serialised per store, so a region's counters increase in offset order. A batch is produced
//! in requests of at most `max_batch_bytes`; an entry larger than one record may be is split into fragments of at
//! most `max_fragment_bytes`, each its own record, all produced in order.
//!
//! Retryability is decided here, from rskafka's error (the same rule as the topic admin: rskafka already retried
//! broken connections and leader moves until its backoff deadline, so an exhausted deadline is final) and for
//! the store's own errors (a fetch that returns nothing below the high watermark may clear up; a damaged record
//! or pruned entries never do).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use rskafka::client::Client;
use rskafka::client::partition::Compression;
use rskafka::record::Record;
use tokio::sync::Mutex;

use super::record::{
    EncodedRecord, EntrySeq, RecordDecoder, encode_entry, entry_id_of_offset, offset_of_entry_id,
};
use super::{AppendedEntry, Entry, EntryId, EntryToWrite, LogStore, RegionId};
use remote_wal::wal::config::KafkaConfig;
use remote_wal::wal::error::Result;
use remote_wal::wal::error::{
    LogEntriesPrunedSnafu, LogFetchStalledSnafu, LogProduceMismatchSnafu,
    LogRegionNotRegisteredSnafu,
};
use remote_wal::wal::kafka::partition::{KafkaPartition, guard};
pub use remote_wal::wal::kafka::partition::{call_bound, connect_client};

/// Kafka's default `max.message.bytes` of a topic: the largest record batch a broker accepts.
pub const DEFAULT_MAX_BATCH_BYTES: usize = 1_048_588;

/// Room left in a batch for Kafka's batch and record framing and the record key.
const FRAMING_BYTES: usize = 256;

/// Framing counted per record when filling a produce request.
const PER_RECORD_FRAMING: usize = 32;

/// How many consecutive empty fetches below the high watermark a read tolerates before failing.
const MAX_EMPTY_FETCHES: u32 = 3;

/// One record read back from a partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchedRecord {
    /// Its Kafka offset.
    pub offset: i64,
    /// Its key.
    pub key: Option<Vec<u8>>,
    /// Its value.
    pub value: Option<Vec<u8>>,
}

/// The calls the log store makes on partition 0 of one topic.
#[async_trait]
pub trait PartitionLog: Send + Sync + fmt::Debug {
    /// The topic.
    fn topic(&self) -> &str;

    /// Produces `records` (key, value) in order as one request; returns their offsets.
    async fn produce(&self, records: Vec<EncodedRecord>) -> Result<Vec<i64>>;

    /// Records from `offset` on, about `max_bytes` of them (at least one record batch when any), and the
    /// partition's high watermark (the next offset to be written).
    async fn fetch(&self, offset: i64, max_bytes: i32) -> Result<(Vec<FetchedRecord>, i64)>;

    /// The next offset to be written (the high watermark).
    async fn high_watermark(&self) -> Result<i64>;

    /// The earliest offset still kept (records below it were deleted or expired).
    async fn low_watermark(&self) -> Result<i64>;
}

/// A shared partition: several stores (a crashed writer's and its successor's, a reader's) on one log.
#[async_trait]
impl<P: PartitionLog + ?Sized> PartitionLog for Arc<P> {
    fn topic(&self) -> &str {
        self.as_ref().topic()
    }

    async fn produce(&self, records: Vec<EncodedRecord>) -> Result<Vec<i64>> {
        self.as_ref().produce(records).await
    }

    async fn fetch(&self, offset: i64, max_bytes: i32) -> Result<(Vec<FetchedRecord>, i64)> {
        self.as_ref().fetch(offset, max_bytes).await
    }

    async fn high_watermark(&self) -> Result<i64> {
        self.as_ref().high_watermark().await
    }

    async fn low_watermark(&self) -> Result<i64> {
        self.as_ref().low_watermark().await
    }
}

/// Sizes of [`KafkaLogStore`]'s requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KafkaLogStoreConfig {
    /// The largest produce request (record batch) the topic accepts: its `max.message.bytes`.
    pub max_batch_bytes: usize,
    /// The largest piece of an entry put in one record; larger entries are split into fragments.
    pub max_fragment_bytes: usize,
    /// Bytes asked for per fetch request.
    pub fetch_bytes: i32,
}

impl Default for KafkaLogStoreConfig {
    fn default() -> Self {
        KafkaLogStoreConfig::for_max_batch_bytes(DEFAULT_MAX_BATCH_BYTES)
    }
}

impl KafkaLogStoreConfig {
    /// The sizes for the pool topics of `config`: its `[wal] topic_config."max.message.bytes"`, or Kafka's default
    /// ([`DEFAULT_MAX_BATCH_BYTES`]) when not set. A topic created outside the pool with a lower limit refuses the
    /// larger requests (the append fails naming the topic); the pool's config check reports a pool topic whose
    /// `max.message.bytes` differs from the configured one.
    pub fn for_kafka(config: &KafkaConfig) -> Result<Self> {
        let max = remote_wal::wal::config::configured_max_message_bytes(&config.topic_config)?;
        Ok(KafkaLogStoreConfig::for_max_batch_bytes(
            max.unwrap_or(DEFAULT_MAX_BATCH_BYTES),
        ))
    }

    /// The sizes for a topic whose `max.message.bytes` is `max_batch_bytes`: fragments leave room for the
    /// record's header, key and Kafka's framing, so one fragment always fits in one request.
    pub fn for_max_batch_bytes(max_batch_bytes: usize) -> Self {
        let max_batch_bytes = max_batch_bytes.max(2 * FRAMING_BYTES);
        KafkaLogStoreConfig {
            max_batch_bytes,
            max_fragment_bytes: max_batch_bytes - FRAMING_BYTES - super::record::HEADER_LEN,
            fetch_bytes: 4 * 1024 * 1024,
        }
    }
}

/// The log of the regions whose WAL options name one Kafka topic.
#[derive(Debug)]
pub struct KafkaLogStore<P: PartitionLog> {
    partition: P,
    config: KafkaLogStoreConfig,
    /// Who this store writes as: the writer id of every record ([`super::record::EntrySeq`]).
    writer: u64,
    /// The last counter given to each region; held across a produce so counters follow offsets.
    sequences: Mutex<HashMap<RegionId, u64>>,
    /// `None`: any region may append, at epoch 0. `Some`: only the regions registered, each at its epoch.
    registered: std::sync::Mutex<Option<HashMap<RegionId, u64>>>,
}

/// A writer id no other store is likely to have: 64 random bits (std's per-process random hasher keys, hashed
/// with a process-wide counter). Never a clock: it tells writers apart, it orders nothing.
pub fn random_writer_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(NEXT.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    // 0 is the writer of format version 1 records.
    hasher.finish().max(1)
}

impl<P: PartitionLog> KafkaLogStore<P> {
    /// A store on `partition` writing as a new random writer ([`random_writer_id`]); any region may append.
    pub fn new(partition: P, config: KafkaLogStoreConfig) -> Self {
        KafkaLogStore::with_writer(partition, config, random_writer_id())
    }

    /// A store on `partition` writing as `writer` (a datanode writes as its id and incarnation, new at every
    /// start); any region may append until [`Self::restrict_to_registered`].
    pub fn with_writer(partition: P, config: KafkaLogStoreConfig, writer: u64) -> Self {
        KafkaLogStore {
            partition,
            config,
            writer: writer.max(1),
            sequences: Mutex::new(HashMap::new()),
            registered: std::sync::Mutex::new(None),
        }
    }

    fn registered(&self) -> std::sync::MutexGuard<'_, Option<HashMap<RegionId, u64>>> {
        self.registered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// From now on only registered regions may append ([`Self::register_region`]); an append of any other is
    /// refused, naming the topic and the region. A datanode's stores run this way: a region is registered only
    /// once the metasrv showed its `__topic_region` key exists, so nothing is written that a prune cannot see.
    pub fn restrict_to_registered(&self) {
        let mut registered = self.registered();
        registered.get_or_insert_with(HashMap::new);
    }

    /// Lets `region_id` append, writing `epoch` (its lease's region epoch) in its records.
    pub fn register_region(&self, region_id: RegionId, epoch: u64) {
        let mut registered = self.registered();
        registered
            .get_or_insert_with(HashMap::new)
            .insert(region_id, epoch);
    }

    /// Stops `region_id` from appending (with [`Self::restrict_to_registered`]).
    pub fn unregister_region(&self, region_id: RegionId) {
        let mut registered = self.registered();
        if let Some(map) = registered.as_mut() {
            map.remove(&region_id);
        }
    }

    /// The writer id of this store's records.
    pub fn writer(&self) -> u64 {
        self.writer
    }

    /// The epoch `region_id` writes at, or the error refusing it.
    fn epoch_of(&self, region_id: RegionId) -> Result<u64> {
        let registered = self.registered();
        match registered.as_ref() {
            None => Ok(0),
            Some(map) => map.get(&region_id).copied().ok_or_else(|| {
                LogRegionNotRegisteredSnafu {
                    topic: self.partition.topic().to_string(),
                    region_id,
                }
                .build()
            }),
        }
    }

    /// The partition it writes to.
    pub fn partition(&self) -> &P {
        &self.partition
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        self.partition.topic()
    }

    /// The entry id of the topic's end: every entry written so far has an id at or below it, every later one
    /// above it. A new region starts here (its checkpoint), so nothing of other regions before it is its to
    /// replay.
    pub async fn end_entry_id(&self) -> Result<EntryId> {
        let high = self.partition.high_watermark().await?;
        Ok(u64::try_from(high).unwrap_or(0))
    }

    /// Reads `from`'s regions in one pass over the topic, from the lowest entry id asked for to the high
    /// watermark at the time of the call; returns the entries and how many records and bytes were fetched.
    pub async fn read_regions_counted(
        &self,
        from: &BTreeMap<RegionId, EntryId>,
    ) -> Result<(BTreeMap<RegionId, Vec<Entry>>, ReadCounts)> {
        self.read_regions_fenced(from, &BTreeMap::new()).await
    }

    /// [`Self::read_regions_counted`], reading each region of `fence_below` as if a fence record of its epoch came
    /// before what is read (records of a lower epoch are ignored: [`RecordDecoder::fence_below`]).
    pub async fn read_regions_fenced(
        &self,
        from: &BTreeMap<RegionId, EntryId>,
        fence_below: &BTreeMap<RegionId, u64>,
    ) -> Result<(BTreeMap<RegionId, Vec<Entry>>, ReadCounts)> {
        let topic = self.topic().to_string();
        let mut counts = ReadCounts::default();
        let Some(lowest) = from.values().min().copied() else {
            return Ok((BTreeMap::new(), counts));
        };
        let end = self.partition.high_watermark().await?;
        let mut offset = offset_of_entry_id(lowest);
        let mut decoder = RecordDecoder::new(topic.clone(), from.clone());
        for (region_id, epoch) in fence_below {
            decoder = decoder.fence_below(*region_id, *epoch);
        }
        if offset < end {
            let earliest = self.partition.low_watermark().await?;
            if offset >= earliest {
                // Look back over one produce request: the request holding a region's checkpoint entry is read
                // too (its entries are not returned), so a resent copy of it after the checkpoint is known as a
                // duplicate. A request's records are contiguous and at most `resend_window` many.
                offset = offset.saturating_sub(self.resend_window()).max(earliest);
            } else {
                let (region_id, from_id) = from
                    .iter()
                    .min_by_key(|(_, f)| **f)
                    .map(|(r, f)| (*r, *f))
                    .unwrap_or((0, lowest));
                return LogEntriesPrunedSnafu {
                    topic,
                    region_id,
                    from: from_id,
                    earliest: entry_id_of_offset(earliest),
                }
                .fail();
            }
        }
        let first_needed = offset_of_entry_id(lowest);
        let mut empty = 0;
        'fetch: while offset < end {
            let (records, _high) = match self.partition.fetch(offset, self.config.fetch_bytes).await
            {
                Ok(fetched) => fetched,
                Err(error) => {
                    // A prune may have deleted records after the low watermark was read: Kafka then refuses a
                    // fetch below its new first offset. Below the first entry a region needs (the look-back),
                    // the read goes on from there; at or above it, the region's entries are gone.
                    let earliest = match self.partition.low_watermark().await {
                        Ok(earliest) if earliest > offset => earliest,
                        _ => return Err(error),
                    };
                    if earliest <= first_needed {
                        offset = earliest;
                        continue;
                    }
                    let (region_id, from_id) = from
                        .iter()
                        .min_by_key(|(_, f)| **f)
                        .map(|(r, f)| (*r, *f))
                        .unwrap_or((0, lowest));
                    return LogEntriesPrunedSnafu {
                        topic,
                        region_id,
                        from: from_id,
                        earliest: entry_id_of_offset(earliest),
                    }
                    .fail();
                }
            };
            counts.fetches += 1;
            if records.is_empty() {
                empty += 1;
                if empty >= MAX_EMPTY_FETCHES {
                    return LogFetchStalledSnafu {
                        topic,
                        offset,
                        end,
                        attempts: empty,
                    }
                    .fail();
                }
                continue;
            }
            empty = 0;
            for record in records {
                if record.offset >= end {
                    break 'fetch;
                }
                if record.offset < offset {
                    // A fetch may start at the beginning of the batch holding `offset`.
                    continue;
                }
                counts.records += 1;
                counts.bytes += (record.key.as_ref().map_or(0, Vec::len)
                    + record.value.as_ref().map_or(0, Vec::len))
                    as u64;
                decoder.push(
                    record.offset,
                    record.key.as_deref(),
                    record.value.as_deref(),
                )?;
                offset = record.offset + 1;
            }
        }
        let (entries, stats) = decoder.finish();
        counts.duplicates = stats.duplicates;
        counts.torn_entries = stats.torn_entries;
        counts.fences = stats.fences;
        counts.fenced = stats.fenced;
        Ok((entries, counts))
    }

    /// The most records one produce request can hold: each record takes at least its header, a one-byte key
    /// and its framing.
    fn resend_window(&self) -> i64 {
        let smallest = super::record::HEADER_LEN + 1 + PER_RECORD_FRAMING;
        i64::try_from(self.config.max_batch_bytes / smallest).unwrap_or(i64::MAX)
    }

    /// Appends the fence record handing `region_id` over to region epoch `epoch` (written as this store's writer)
    /// and returns its entry id: `1 +` its offset `F`. From then on a replay that reads past `F` ignores the
    /// region's records of a lower epoch, wherever a deposed leader's late append lands after it. Refused, like an
    /// entry, for a region this store does not let append.
    pub async fn append_fence(&self, region_id: RegionId, epoch: u64) -> Result<EntryId> {
        self.epoch_of(region_id)?;
        // Serialised with appends, like every record of this store.
        let _sequences = self.sequences.lock().await;
        let offsets = self
            .partition
            .produce(vec![super::record::encode_fence(
                region_id,
                epoch,
                self.writer,
            )])
            .await?;
        snafu::ensure!(
            offsets.len() == 1,
            LogProduceMismatchSnafu {
                topic: self.topic(),
                sent: 1usize,
                acknowledged: offsets.len(),
            }
        );
        Ok(entry_id_of_offset(offsets[0]))
    }

    /// The next counter of `region_id` for this writer: 1, 2, 3, …
    fn next_counter(sequences: &mut HashMap<RegionId, u64>, region_id: RegionId) -> u64 {
        let counter = sequences.entry(region_id).or_insert(0);
        *counter = counter.saturating_add(1);
        *counter
    }
}

/// What one read pass over a topic cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadCounts {
    /// Fetch requests sent.
    pub fetches: u64,
    /// Records read (of every region on the topic).
    pub records: u64,
    /// Key and value bytes read.
    pub bytes: u64,
    /// Records skipped as duplicates of an entry already read.
    pub duplicates: u64,
    /// Entries dropped because their fragments stop before the last one.
    pub torn_entries: u64,
    /// Fence records read.
    pub fences: u64,
    /// Records ignored because a fence of a higher epoch came before them (a deposed leader's late appends).
    pub fenced: u64,
}

#[async_trait]
impl<P: PartitionLog> LogStore for KafkaLogStore<P> {
    async fn append(&self, entries: Vec<EntryToWrite>) -> Result<Vec<AppendedEntry>> {
        let mut epochs = HashMap::new();
        for entry in &entries {
            if let std::collections::hash_map::Entry::Vacant(slot) = epochs.entry(entry.region_id) {
                slot.insert(self.epoch_of(entry.region_id)?);
            }
        }
        let mut sequences = self.sequences.lock().await;
        // Records of every entry, and for each entry the index of its first record.
        let mut records = Vec::new();
        let mut firsts = Vec::with_capacity(entries.len());
        for entry in &entries {
            let seq = EntrySeq {
                epoch: epochs.get(&entry.region_id).copied().unwrap_or(0),
                writer: self.writer,
                counter: Self::next_counter(&mut sequences, entry.region_id),
            };
            firsts.push(records.len());
            records.extend(encode_entry(
                entry.region_id,
                seq,
                &entry.data,
                self.config.max_fragment_bytes,
            ));
        }
        let sent = records.len();
        let mut offsets = Vec::with_capacity(sent);
        let mut batch = Vec::new();
        let mut batch_bytes = FRAMING_BYTES;
        for record in records {
            let size = record.len() + PER_RECORD_FRAMING;
            if !batch.is_empty() && batch_bytes + size > self.config.max_batch_bytes {
                offsets.extend(self.partition.produce(std::mem::take(&mut batch)).await?);
                batch_bytes = FRAMING_BYTES;
            }
            batch_bytes += size;
            batch.push(record);
        }
        if !batch.is_empty() {
            offsets.extend(self.partition.produce(batch).await?);
        }
        // An entry id comes from its first record's offset: without one offset per record, none can be given.
        snafu::ensure!(
            offsets.len() == sent,
            LogProduceMismatchSnafu {
                topic: self.topic(),
                sent,
                acknowledged: offsets.len(),
            }
        );
        Ok(entries
            .iter()
            .zip(firsts)
            .map(|(entry, first)| AppendedEntry {
                region_id: entry.region_id,
                entry_id: entry_id_of_offset(offsets[first]),
            })
            .collect())
    }

    async fn read_regions(
        &self,
        from: &BTreeMap<RegionId, EntryId>,
    ) -> Result<BTreeMap<RegionId, Vec<Entry>>> {
        Ok(self.read_regions_counted(from).await?.0)
    }

    async fn last_entry_id(&self, _region_id: RegionId) -> Result<EntryId> {
        self.end_entry_id().await
    }
}

/// Partition 0 of a topic through rskafka, every call bounded by a timeout: the library's [`KafkaPartition`] (offsets,
/// watermarks, DeleteRecords) with produce and fetch.
#[derive(Debug)]
pub struct RsKafkaPartition {
    inner: KafkaPartition,
}

impl RsKafkaPartition {
    /// The partition client of `topic` on `client`; every call (this one too) is bounded by `bound`.
    pub async fn new(client: &Client, topic: &str, bound: Duration) -> Result<Self> {
        Ok(RsKafkaPartition {
            inner: KafkaPartition::new(client, topic, bound).await?,
        })
    }

    /// Deletes the partition's records below `offset` (Kafka's DeleteRecords).
    pub async fn delete_records_before(&self, offset: i64) -> Result<()> {
        self.inner.delete_records_before(offset).await
    }
}

fn now_timestamp() -> chrono::DateTime<chrono::Utc> {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    chrono::DateTime::from_timestamp_millis(millis).unwrap_or_default()
}

#[async_trait]
impl PartitionLog for RsKafkaPartition {
    fn topic(&self) -> &str {
        self.inner.topic()
    }

    async fn produce(&self, records: Vec<EncodedRecord>) -> Result<Vec<i64>> {
        let n = records.len();
        let timestamp = now_timestamp();
        let records = records
            .into_iter()
            .map(|r| Record {
                key: Some(r.key),
                value: Some(r.value),
                headers: BTreeMap::new(),
                timestamp,
            })
            .collect();
        guard(
            self.inner.topic(),
            &format!("produce {n} records"),
            self.inner.bound(),
            self.inner
                .client()
                .produce(records, Compression::NoCompression),
        )
        .await
    }

    async fn fetch(&self, offset: i64, max_bytes: i32) -> Result<(Vec<FetchedRecord>, i64)> {
        let (records, high) = guard(
            self.inner.topic(),
            &format!("fetch from offset {offset}"),
            self.inner.bound(),
            self.inner
                .client()
                .fetch_records(offset, 1..max_bytes.max(2), 0),
        )
        .await?;
        let records = records
            .into_iter()
            .map(|r| FetchedRecord {
                offset: r.offset,
                key: r.record.key,
                value: r.record.value,
            })
            .collect();
        Ok((records, high))
    }

    async fn high_watermark(&self) -> Result<i64> {
        self.inner.high_watermark().await
    }

    async fn low_watermark(&self) -> Result<i64> {
        self.inner.low_watermark().await
    }
}
