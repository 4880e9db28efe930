//! A model-based test of the record decoder: random interleavings of regions' appends, entries split into
//! fragments, resent batches (producer retries) and torn entries (a writer crashing mid-entry), written to an
//! in-memory partition; what the log store reads back is compared with a simple model: per region, every entry
//! that was appended whole, exactly once, in order, with the entry id of its first copy's first fragment.

use std::collections::BTreeMap;

use datanode::log_store::memory_partition::MemoryPartition;
use datanode::log_store::record::{EncodedRecord, EntrySeq, encode_entry};
use datanode::log_store::{KafkaLogStore, KafkaLogStoreConfig, LogStore};
use proptest::prelude::*;

use crate::common::bytes;

/// Bytes per fragment in this test: small, so most entries have several.
const FRAGMENT: usize = 40;

#[derive(Clone, Debug)]
enum Op {
    /// Region writes entries of these sizes in one batch.
    Append { region: u64, sizes: Vec<usize> },
    /// The region's last batch is written again (a retried produce).
    Resend { region: u64 },
    /// The region starts an entry of `size` bytes and crashes after `keep` of its fragments.
    Torn {
        region: u64,
        size: usize,
        keep: usize,
    },
    /// Two regions (never the same) write one entry each, their fragments alternating record by record.
    Interleaved {
        a: u64,
        b: u64,
        size_a: usize,
        size_b: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let region = 1u64..5;
    prop_oneof![
        4 => (region.clone(), prop::collection::vec(0usize..200, 1..4))
            .prop_map(|(region, sizes)| Op::Append { region, sizes }),
        1 => region.clone().prop_map(|region| Op::Resend { region }),
        1 => (region.clone(), 41usize..200, 1usize..5)
            .prop_map(|(region, size, keep)| Op::Torn { region, size, keep }),
        1 => (region.clone(), region, 0usize..200, 0usize..200)
            .prop_map(|(a, b, size_a, size_b)| Op::Interleaved { a, b, size_a, size_b }),
    ]
}

/// One entry the model expects.
#[derive(Clone, Debug)]
struct Expected {
    entry_id: u64,
    data: Vec<u8>,
    /// Whether its batch was written again later.
    resent: bool,
}

struct World {
    partition: MemoryPartition,
    model: BTreeMap<u64, Vec<Expected>>,
    /// Each region's last batch and the model indices of its entries.
    last_batch: BTreeMap<u64, (Vec<EncodedRecord>, Vec<usize>)>,
    sequence: u64,
    seed: u64,
}

impl World {
    fn push(&self, records: &[EncodedRecord]) -> Vec<i64> {
        self.partition.push_raw(
            records
                .iter()
                .map(|r| (Some(r.key.clone()), Some(r.value.clone())))
                .collect(),
        )
    }

    fn entry(&mut self, region: u64, size: usize) -> (Vec<u8>, Vec<EncodedRecord>) {
        self.sequence += 1;
        self.seed += 1;
        let data = bytes(self.seed, size);
        let seq = EntrySeq {
            epoch: 1,
            writer: 7,
            counter: self.sequence,
        };
        let records = encode_entry(region, seq, &data, FRAGMENT);
        (data, records)
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::Append { region, sizes } => {
                let mut batch = Vec::new();
                let mut firsts = Vec::new();
                for size in sizes {
                    let (data, records) = self.entry(region, size);
                    firsts.push((batch.len(), data));
                    batch.extend(records);
                }
                let offsets = self.push(&batch);
                let list = self.model.entry(region).or_default();
                let mut indices = Vec::new();
                for (first, data) in firsts {
                    indices.push(list.len());
                    list.push(Expected {
                        entry_id: offsets[first] as u64 + 1,
                        data,
                        resent: false,
                    });
                }
                self.last_batch.insert(region, (batch, indices));
            }
            Op::Resend { region } => {
                if let Some((batch, indices)) = self.last_batch.get(&region).cloned() {
                    self.push(&batch);
                    for i in indices {
                        self.model.entry(region).or_default()[i].resent = true;
                    }
                }
            }
            Op::Torn { region, size, keep } => {
                let (_, records) = self.entry(region, size);
                let keep = keep.min(records.len() - 1);
                if keep > 0 {
                    self.push(&records[..keep]);
                }
                self.last_batch.remove(&region);
            }
            Op::Interleaved {
                a,
                b,
                size_a,
                size_b,
            } => {
                let (data_a, ra) = self.entry(a, size_a);
                let (data_b, rb) = self.entry(b, size_b);
                let mut first = BTreeMap::new();
                let (mut ia, mut ib) = (ra.into_iter(), rb.into_iter());
                loop {
                    let (na, nb) = (ia.next(), ib.next());
                    if na.is_none() && nb.is_none() {
                        break;
                    }
                    for (region, record) in [(a, na), (b, nb)] {
                        if let Some(record) = record {
                            let offset = self.push(std::slice::from_ref(&record))[0];
                            first.entry(region).or_insert(offset);
                        }
                    }
                }
                for (region, data) in [(a, data_a), (b, data_b)] {
                    let entry_id = first[&region] as u64 + 1;
                    self.model.entry(region).or_default().push(Expected {
                        entry_id,
                        data,
                        resent: false,
                    });
                    self.last_batch.remove(&region);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn the_decoder_returns_every_whole_entry_once_in_order(
        ops in prop::collection::vec(op(), 1..40),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 4),
    ) {
        // Whether a region's picked entry had its batch resent is recorded for the failure message.
        let ops: Vec<Op> = ops
            .into_iter()
            .filter(|op| !matches!(op, Op::Interleaved { a, b, .. } if a == b))
            .collect();
        let mut world = World {
            partition: MemoryPartition::new("model"),
            model: BTreeMap::new(),
            last_batch: BTreeMap::new(),
            sequence: 0,
            seed: 0,
        };
        for op in ops {
            world.apply(op);
        }
        let World { partition, model, .. } = world;
        let store = KafkaLogStore::new(partition, KafkaLogStoreConfig::for_max_batch_bytes(1024));
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let regions = [1u64, 2, 3, 4];

        // Everything, in one pass for all regions.
        let all = rt
            .block_on(store.read_regions(&regions.iter().map(|r| (*r, 0)).collect()))
            .unwrap();
        for region in regions {
            let want: Vec<(u64, Vec<u8>)> = model
                .get(&region)
                .map(|l| l.iter().map(|e| (e.entry_id, e.data.clone())).collect())
                .unwrap_or_default();
            let got: Vec<(u64, Vec<u8>)> =
                all[&region].iter().map(|e| (e.entry_id, e.data.clone())).collect();
            prop_assert_eq!(got, want, "region {}", region);
        }

        // From an entry id of each region on (a checkpoint), also when its batch was resent after it: the copies
        // after the checkpoint are duplicates, not entries to replay.
        for (region, pick) in regions.iter().zip(&picks) {
            let Some(list) = model.get(region).filter(|l| !l.is_empty()) else { continue };
            let from = &list[pick.index(list.len())];
            let got: Vec<u64> = rt
                .block_on(store.read(*region, from.entry_id))
                .unwrap()
                .iter()
                .map(|e| e.entry_id)
                .collect();
            let want: Vec<u64> =
                list.iter().map(|e| e.entry_id).filter(|id| *id >= from.entry_id).collect();
            prop_assert_eq!(
                got,
                want,
                "region {} from {} (its batch resent: {})",
                region,
                from.entry_id,
                from.resent
            );
        }
    }
}
