//! The Kafka record format of the log store: how an entry becomes one or more records, and how a sequence of
//! records (in offset order, several regions interleaved) becomes entries again.
//!
//! One record per fragment. The record's **key** is the region id in decimal text (`4398046511104`), so Kafka's
//! own tools show which region a record belongs to and a reader routes records without decoding the value. The
//! **value** is a header followed by the fragment's bytes. Format version 2 (what this build writes), 46 bytes:
//!
//! | bytes | field |
//! |---|---|
//! | 0 | format version, `2` |
//! | 1 | flags: `0` for a fragment of an entry, `1` ([`FLAG_FENCE`]) for a fence record; other bits are refused |
//! | 2..10 | region id, u64 big-endian (must equal the key) |
//! | 10..18 | region epoch, u64 big-endian: the epoch of the lease the writer held |
//! | 18..26 | writer id, u64 big-endian: who wrote it (a datanode's id and incarnation, or a random id per store) |
//! | 26..34 | counter, u64 big-endian: 1, 2, 3, … per region and writer, in offset order |
//! | 34..38 | fragment index, u32 big-endian, from 0 |
//! | 38..42 | fragment count, u32 big-endian, at least 1 |
//! | 42..46 | CRC-32 (IEEE) of the fragment's bytes |
//!
//! Format version 1 (written before region epochs existed), 30 bytes: version `1`, flags, region id, an entry
//! sequence (u64), fragment index, fragment count, CRC. It still decodes: as epoch 0, writer 0, counter = its
//! sequence.
//!
//! An entry's **entry id** is `1 + the Kafka offset of its first fragment` (so entry id 0 always means "nothing
//! written", offset 0 gives entry id 1, and reading from entry id `e` starts fetching at offset `e - 1`).
//!
//! **What tells a resent record from a new one** is its [`EntrySeq`] — (region epoch, writer id, counter) — never
//! a clock. A writer's counters only grow, and it appends one batch at a time, so within one (epoch, writer) the
//! counters follow the offsets: a record whose counter is at or below the highest counter already completed for
//! its (region, epoch, writer) is a copy a producer resent, and is skipped. A restarted writer is another writer
//! (another incarnation, or another random id), so nothing it writes can look like a copy of what an earlier run
//! wrote, however fast either wrote or however the clocks stood. (Version 1 records, whose sequences came from
//! the wall clock, keep their old rule: a sequence already completed is a copy.)
//!
//! A **fence record** marks the hand-over of a region to a new leader: flags `1`, the new region epoch, the writer
//! that appended it, counter 0, fragment 0 of 1, no bytes. It is not an entry. **Replay rule:** once a region's
//! fence record of epoch `E` has been read, every later record of that region (in offset order) whose epoch is
//! below `E` was appended by a deposed leader after the hand-over and is ignored; records before the fence are
//! kept. A reader that starts after the fence (its checkpoint lies past it) is told the epoch instead
//! ([`RecordDecoder::fence_below`]). A build from before fence records would read one as an empty entry.
//!
//! The [`RecordDecoder`] turns records back into entries, per region: fragments of one entry are collected until
//! all are there; a sequence that stops before its last fragment (the writer crashed mid-entry) is dropped when the
//! region's next entry starts (its fragment 0 arrives), or when the read ends; a copy is skipped, so each entry
//! comes out once, at the offset of its first copy.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::log_store::{Entry, EntryId, RegionId};
use remote_wal::wal::error::LogRecordCorruptSnafu;
use remote_wal::wal::error::Result;

/// The format version written in every record's header.
pub const RECORD_FORMAT_VERSION: u8 = 2;

/// Bytes of the header in front of every fragment (format version 2).
pub const HEADER_LEN: usize = 46;

/// Bytes of a format version 1 header.
pub const HEADER_LEN_V1: usize = 30;

/// The flag of a fence record.
pub const FLAG_FENCE: u8 = 0x01;

/// The Kafka record key of a region: its id in decimal text.
pub fn region_key(region_id: RegionId) -> Vec<u8> {
    region_id.to_string().into_bytes()
}

/// The entry id of an entry whose first fragment has Kafka offset `offset` (`offset + 1`; 0 is never an entry id).
pub fn entry_id_of_offset(offset: i64) -> EntryId {
    // Kafka offsets are never negative; a negative one (which no broker sends) maps to the smallest entry id.
    u64::try_from(offset).unwrap_or(0).saturating_add(1)
}

/// The Kafka offset to start fetching at to read entries from entry id `entry_id` on (entry id 0 reads from the
/// start, like entry id 1).
pub fn offset_of_entry_id(entry_id: EntryId) -> i64 {
    i64::try_from(entry_id.saturating_sub(1)).unwrap_or(i64::MAX)
}

/// Who wrote an entry and which of its entries it is: what tells a resent record from a new one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntrySeq {
    /// The region epoch of the writer's lease (0 for format version 1 records).
    pub epoch: u64,
    /// The writer (0 for format version 1 records).
    pub writer: u64,
    /// The entry's counter for its region and writer, from 1 (a version 1 record's sequence).
    pub counter: u64,
}

/// The header of one fragment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FragmentHeader {
    /// The region the entry belongs to.
    pub region_id: RegionId,
    /// Who wrote the entry and its counter.
    pub seq: EntrySeq,
    /// The fragment's index, from 0.
    pub index: u32,
    /// How many fragments the entry has (at least 1).
    pub count: u32,
    /// CRC-32 of the fragment's bytes.
    pub crc: u32,
    /// Whether it is a fence record (no entry: the region's hand-over to epoch `seq.epoch`).
    pub fence: bool,
}

impl FragmentHeader {
    fn write(&self, out: &mut Vec<u8>) {
        out.push(RECORD_FORMAT_VERSION);
        out.push(if self.fence { FLAG_FENCE } else { 0 });
        out.extend_from_slice(&self.region_id.to_be_bytes());
        out.extend_from_slice(&self.seq.epoch.to_be_bytes());
        out.extend_from_slice(&self.seq.writer.to_be_bytes());
        out.extend_from_slice(&self.seq.counter.to_be_bytes());
        out.extend_from_slice(&self.index.to_be_bytes());
        out.extend_from_slice(&self.count.to_be_bytes());
        out.extend_from_slice(&self.crc.to_be_bytes());
    }

    /// Reads the header at the start of `value` (format version 1 or 2), or says what is wrong with it.
    fn read(value: &[u8]) -> std::result::Result<(FragmentHeader, &[u8]), String> {
        let version = value.first().copied().unwrap_or(0);
        let len = match version {
            1 => HEADER_LEN_V1,
            2 => HEADER_LEN,
            _ if value.is_empty() => {
                return Err("the value is empty".to_string());
            }
            other => {
                return Err(format!(
                    "unknown record format version {other} (this build reads 1 and {RECORD_FORMAT_VERSION})"
                ));
            }
        };
        if value.len() < len {
            return Err(format!(
                "value has {} bytes, shorter than the {len}-byte header of format version {version}",
                value.len()
            ));
        }
        let (head, payload) = value.split_at(len);
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&head[at..at + 8]);
            u64::from_be_bytes(b)
        };
        let u32_at = |at: usize| {
            let mut b = [0u8; 4];
            b.copy_from_slice(&head[at..at + 4]);
            u32::from_be_bytes(b)
        };
        let header = if version == 1 {
            FragmentHeader {
                region_id: u64_at(2),
                seq: EntrySeq {
                    epoch: 0,
                    writer: 0,
                    counter: u64_at(10),
                },
                index: u32_at(18),
                count: u32_at(22),
                crc: u32_at(26),
                fence: false,
            }
        } else {
            let flags = head[1];
            if flags & !FLAG_FENCE != 0 {
                return Err(format!(
                    "unknown flags {flags:#04x} (this build knows {FLAG_FENCE:#04x}, a fence record)"
                ));
            }
            FragmentHeader {
                region_id: u64_at(2),
                seq: EntrySeq {
                    epoch: u64_at(10),
                    writer: u64_at(18),
                    counter: u64_at(26),
                },
                index: u32_at(34),
                count: u32_at(38),
                crc: u32_at(42),
                fence: flags & FLAG_FENCE != 0,
            }
        };
        if header.fence && (header.count != 1 || !payload.is_empty()) {
            return Err(format!(
                "a fence record with fragment {} of {} and {} bytes (it has fragment 0 of 1 and none)",
                header.index,
                header.count,
                payload.len()
            ));
        }
        if header.count == 0 || header.index >= header.count {
            return Err(format!(
                "fragment index {} of count {} is out of range",
                header.index, header.count
            ));
        }
        Ok((header, payload))
    }
}

/// Encodes one fragment in format version 1, as stores before region epochs wrote it (for compatibility tests).
pub fn encode_v1_fragment(
    region_id: RegionId,
    sequence: u64,
    index: u32,
    count: u32,
    chunk: &[u8],
) -> EncodedRecord {
    let mut value = Vec::with_capacity(HEADER_LEN_V1 + chunk.len());
    value.push(1);
    value.push(0);
    value.extend_from_slice(&region_id.to_be_bytes());
    value.extend_from_slice(&sequence.to_be_bytes());
    value.extend_from_slice(&index.to_be_bytes());
    value.extend_from_slice(&count.to_be_bytes());
    value.extend_from_slice(&crc32fast::hash(chunk).to_be_bytes());
    value.extend_from_slice(chunk);
    EncodedRecord {
        key: region_key(region_id),
        value,
    }
}

/// One record to produce: key and value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodedRecord {
    /// The region id in decimal text.
    pub key: Vec<u8>,
    /// Header and fragment bytes.
    pub value: Vec<u8>,
}

impl EncodedRecord {
    /// Bytes of key and value.
    pub fn len(&self) -> usize {
        self.key.len() + self.value.len()
    }

    /// Whether key and value are both empty (never, for an encoded record).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Splits one entry into records whose value holds at most `max_fragment_bytes` bytes of the entry each (at least
/// one record, also for an empty entry).
pub fn encode_entry(
    region_id: RegionId,
    seq: EntrySeq,
    data: &[u8],
    max_fragment_bytes: usize,
) -> Vec<EncodedRecord> {
    let size = max_fragment_bytes.max(1);
    let chunks: Vec<&[u8]> = if data.is_empty() {
        vec![data]
    } else {
        data.chunks(size).collect()
    };
    let count = u32::try_from(chunks.len()).unwrap_or(u32::MAX);
    let key = region_key(region_id);
    chunks
        .into_iter()
        .enumerate()
        .map(|(index, chunk)| {
            let header = FragmentHeader {
                region_id,
                seq,
                index: u32::try_from(index).unwrap_or(u32::MAX),
                count,
                crc: crc32fast::hash(chunk),
                fence: false,
            };
            let mut value = Vec::with_capacity(HEADER_LEN + chunk.len());
            header.write(&mut value);
            value.extend_from_slice(chunk);
            EncodedRecord {
                key: key.clone(),
                value,
            }
        })
        .collect()
}

/// The fence record that hands `region_id` over to region epoch `epoch`, appended by `writer` (the new leader).
pub fn encode_fence(region_id: RegionId, epoch: u64, writer: u64) -> EncodedRecord {
    let header = FragmentHeader {
        region_id,
        seq: EntrySeq {
            epoch,
            writer,
            counter: 0,
        },
        index: 0,
        count: 1,
        crc: crc32fast::hash(&[]),
        fence: true,
    };
    let mut value = Vec::with_capacity(HEADER_LEN);
    header.write(&mut value);
    EncodedRecord {
        key: region_key(region_id),
        value,
    }
}

/// An entry being reassembled.
#[derive(Debug)]
struct Partial {
    seq: EntrySeq,
    count: u32,
    first_offset: i64,
    fragments: Vec<Vec<u8>>,
}

/// What the decoder dropped, for the caller's stats and logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeStats {
    /// Records of regions the decoder was not asked for.
    pub other_regions: u64,
    /// Records skipped as duplicates of an entry already yielded.
    pub duplicates: u64,
    /// Entries dropped because their fragment sequence was torn (it stopped before the last fragment).
    pub torn_entries: u64,
    /// Records without a key or value (not written by this log store; skipped).
    pub foreign: u64,
    /// Fence records read.
    pub fences: u64,
    /// Records ignored by the replay rule: written at a lower epoch than a fence before them (a deposed leader's).
    pub fenced: u64,
}

/// Reassembles entries from records read in offset order, for a set of regions, each from its own entry id on.
///
/// Feed every record with [`RecordDecoder::push`], then call [`RecordDecoder::finish`]; entries come out per
/// region in offset order of their first fragment.
#[derive(Debug)]
pub struct RecordDecoder {
    topic: String,
    /// Per wanted region: entries with an entry id below this are not returned.
    from: BTreeMap<RegionId, EntryId>,
    partial: BTreeMap<RegionId, Partial>,
    /// Per region and (epoch, writer): the highest counter completed so far; a record at or below it is a copy.
    completed: HashMap<(RegionId, u64, u64), u64>,
    /// Format version 1 records: the sequences completed per region (their sequences came from the wall clock,
    /// so only an exact repeat is a copy).
    completed_v1: BTreeMap<RegionId, BTreeSet<u64>>,
    /// Per region: the highest fence epoch read so far (or given); a later record of a lower epoch is ignored.
    fences: HashMap<RegionId, u64>,
    out: BTreeMap<RegionId, Vec<Entry>>,
    stats: DecodeStats,
}

impl RecordDecoder {
    /// A decoder for the regions of `from` (region id → first entry id wanted), reading `topic` (named in errors).
    pub fn new(topic: impl Into<String>, from: BTreeMap<RegionId, EntryId>) -> Self {
        let out = from.keys().map(|r| (*r, Vec::new())).collect();
        RecordDecoder {
            topic: topic.into(),
            from,
            partial: BTreeMap::new(),
            completed: HashMap::new(),
            completed_v1: BTreeMap::new(),
            fences: HashMap::new(),
            out,
            stats: DecodeStats::default(),
        }
    }

    /// Reads `region_id` as if a fence record of `epoch` came before everything it reads: records of a lower
    /// epoch are ignored. For a reader that starts after the region's latest fence record (whose epoch it knows),
    /// which it would otherwise not see.
    pub fn fence_below(mut self, region_id: RegionId, epoch: u64) -> Self {
        let fence = self.fences.entry(region_id).or_insert(0);
        *fence = (*fence).max(epoch);
        self
    }

    /// The highest fence epoch of `region_id` read or given so far (0: none).
    pub fn fence_epoch(&self, region_id: RegionId) -> u64 {
        self.fences.get(&region_id).copied().unwrap_or(0)
    }

    /// Takes one record (offset, key, value). Records of other regions are skipped by their key, without
    /// decoding the value. A damaged record of a wanted region (bad header, a key naming another region than the
    /// header, a checksum mismatch) is an error naming the topic, the offset and the region.
    pub fn push(&mut self, offset: i64, key: Option<&[u8]>, value: Option<&[u8]>) -> Result<()> {
        let (Some(key), Some(value)) = (key, value) else {
            self.stats.foreign += 1;
            return Ok(());
        };
        let Some(region_id) = std::str::from_utf8(key)
            .ok()
            .and_then(|k| k.parse::<u64>().ok())
        else {
            self.stats.foreign += 1;
            return Ok(());
        };
        if !self.from.contains_key(&region_id) {
            self.stats.other_regions += 1;
            return Ok(());
        }
        let corrupt = |reason: String| {
            LogRecordCorruptSnafu {
                topic: self.topic.clone(),
                offset,
                region_id,
                reason,
            }
            .build()
        };
        let (header, payload) = FragmentHeader::read(value).map_err(corrupt)?;
        if header.region_id != region_id {
            return Err(corrupt(format!(
                "the key names region {region_id} but the header region {}",
                header.region_id
            )));
        }
        if crc32fast::hash(payload) != header.crc {
            return Err(corrupt(format!(
                "fragment {} of {} (entry {:?}) fails its checksum",
                header.index, header.count, header.seq
            )));
        }
        let fence = self.fence_epoch(region_id);
        if header.fence {
            self.stats.fences += 1;
            if header.seq.epoch > fence {
                self.fences.insert(region_id, header.seq.epoch);
                // An entry of the deposed epoch still missing fragments never gets them: torn at the hand-over.
                if self
                    .partial
                    .get(&region_id)
                    .is_some_and(|p| p.seq.epoch < header.seq.epoch)
                {
                    self.partial.remove(&region_id);
                    self.stats.torn_entries += 1;
                }
            }
            return Ok(());
        }
        if header.seq.epoch < fence {
            self.stats.fenced += 1;
            return Ok(());
        }
        if self.is_copy(region_id, header.seq) {
            self.stats.duplicates += 1;
            return Ok(());
        }
        if let Some(p) = self.partial.get(&region_id)
            && p.seq != header.seq
        {
            if header.index != 0 {
                // A stray fragment of another entry (a resent fragment of an entry given up on): skipped, the
                // entry being collected goes on.
                self.stats.duplicates += 1;
                return Ok(());
            }
            // The region's next entry starts while the one being collected never got its last fragment: the
            // writer crashed mid-entry.
            self.partial.remove(&region_id);
            self.stats.torn_entries += 1;
        }
        let partial = match self.partial.get_mut(&region_id) {
            Some(p) => p,
            None => {
                if header.index != 0 {
                    // The entry's first fragment is not in what was read (it was torn at its head, or lies before
                    // the offset the read started at): not an entry this read can return.
                    self.stats.torn_entries += 1;
                    return Ok(());
                }
                self.partial.entry(region_id).or_insert(Partial {
                    seq: header.seq,
                    count: header.count,
                    first_offset: offset,
                    fragments: Vec::new(),
                })
            }
        };
        let expected = u32::try_from(partial.fragments.len()).unwrap_or(u32::MAX);
        if header.count != partial.count || header.index > expected {
            return Err(corrupt(format!(
                "fragment {} of {} (entry {:?}) does not follow fragment {} of {}",
                header.index,
                header.count,
                header.seq,
                expected.saturating_sub(1),
                partial.count
            )));
        }
        if header.index < expected {
            // The producer resent fragments it had already written.
            self.stats.duplicates += 1;
            return Ok(());
        }
        partial.fragments.push(payload.to_vec());
        if partial.fragments.len() == partial.count as usize {
            let done = self.partial.remove(&region_id);
            if let Some(done) = done {
                self.complete(region_id, done.seq);
                let entry_id = entry_id_of_offset(done.first_offset);
                let from = self.from.get(&region_id).copied().unwrap_or(0);
                if entry_id >= from {
                    let data = if done.fragments.len() == 1 {
                        done.fragments.into_iter().next().unwrap_or_default()
                    } else {
                        done.fragments.concat()
                    };
                    self.out.entry(region_id).or_default().push(Entry {
                        region_id,
                        entry_id,
                        data,
                    });
                }
            }
        }
        Ok(())
    }

    /// Whether an entry of `region_id` with `seq` was already completed (this record is a resent copy).
    fn is_copy(&self, region_id: RegionId, seq: EntrySeq) -> bool {
        if seq.writer == 0 && seq.epoch == 0 {
            return self
                .completed_v1
                .get(&region_id)
                .is_some_and(|done| done.contains(&seq.counter));
        }
        self.completed
            .get(&(region_id, seq.epoch, seq.writer))
            .is_some_and(|highest| seq.counter <= *highest)
    }

    /// Records that the entry `seq` of `region_id` is complete.
    fn complete(&mut self, region_id: RegionId, seq: EntrySeq) {
        if seq.writer == 0 && seq.epoch == 0 {
            self.completed_v1
                .entry(region_id)
                .or_default()
                .insert(seq.counter);
            return;
        }
        let highest = self
            .completed
            .entry((region_id, seq.epoch, seq.writer))
            .or_insert(0);
        *highest = (*highest).max(seq.counter);
    }

    /// Ends the read: entries still missing fragments are dropped as torn. Returns every wanted region's entries
    /// (an empty list for a region with none) and what was skipped.
    pub fn finish(mut self) -> (BTreeMap<RegionId, Vec<Entry>>, DecodeStats) {
        self.stats.torn_entries += self.partial.len() as u64;
        (self.out, self.stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(counter: u64) -> EntrySeq {
        EntrySeq {
            epoch: 1,
            writer: 9,
            counter,
        }
    }

    fn decode(
        records: &[(i64, EncodedRecord)],
        regions: &[(u64, u64)],
    ) -> BTreeMap<u64, Vec<Entry>> {
        let mut d = RecordDecoder::new("t", regions.iter().copied().collect());
        for (offset, r) in records {
            d.push(*offset, Some(&r.key), Some(&r.value)).unwrap();
        }
        d.finish().0
    }

    #[test]
    fn offset_zero_is_entry_id_one_and_back() {
        assert_eq!(entry_id_of_offset(0), 1);
        assert_eq!(offset_of_entry_id(1), 0);
        assert_eq!(offset_of_entry_id(0), 0);
        assert_eq!(offset_of_entry_id(entry_id_of_offset(41)), 41);
    }

    #[test]
    fn a_large_entry_round_trips_through_fragments() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        let records = encode_entry(7, seq(1), &data, 64);
        assert_eq!(records.len(), 16);
        let with_offsets: Vec<_> = records
            .into_iter()
            .enumerate()
            .map(|(i, r)| (i as i64, r))
            .collect();
        let out = decode(&with_offsets, &[(7, 0)]);
        assert_eq!(out[&7].len(), 1);
        assert_eq!(out[&7][0].data, data);
        assert_eq!(out[&7][0].entry_id, 1);
    }

    #[test]
    fn a_bad_checksum_names_topic_offset_and_region() {
        let mut r = encode_entry(7, seq(1), b"hello", 64).remove(0);
        let last = r.value.len() - 1;
        r.value[last] ^= 1;
        let mut d = RecordDecoder::new("topic_a", [(7, 0)].into_iter().collect());
        let err = d
            .push(12, Some(&r.key), Some(&r.value))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("topic_a") && err.contains("offset 12") && err.contains("region 7"),
            "{err}"
        );
        assert!(err.contains("checksum"), "{err}");
    }
}
