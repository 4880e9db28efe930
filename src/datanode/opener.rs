//! [`RegionOpener`]: scans `__dn_table/{datanode_id}/` page by page and builds one [`RegionOpenRequest`] per
//! region; a damaged record costs only the regions it describes.

use std::fmt;

use snafu::IntoError;

use crate::datanode::open_request::RegionOpenRequest;
use crate::ddl::error::InvalidDatanodeTableKeySnafu;
use crate::ddl::region::{region_dir, region_id};
use crate::error::{
    DecodeDatanodeTableValueSnafu, Error, MissingRegionWalOptionsSnafu, Result,
    WalProviderMismatchSnafu,
};
use crate::key::datanode_table::{
    DatanodeTableValue, datanode_table_prefix, parse_datanode_table_key,
};
use crate::kv::{KeyValue, KvBackendRef, RangeRequest};
use crate::wal::{WAL_OPTIONS_KEY, WalOptions};

/// Pairs read per range request when none is given.
pub const DEFAULT_PAGE_SIZE: usize = 1024;

/// The WAL provider a datanode is configured for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WalProviderKind {
    /// The local raft-engine WAL.
    RaftEngine,
    /// Kafka topics.
    Kafka,
}

impl WalProviderKind {
    /// The provider's name as encoded in WAL options: `raft_engine` or `kafka`.
    pub fn as_str(self) -> &'static str {
        match self {
            WalProviderKind::RaftEngine => "raft_engine",
            WalProviderKind::Kafka => "kafka",
        }
    }

    /// The provider a datanode must be configured for to open a region with `options`; `None` for
    /// [`WalOptions::Noop`]: such a region writes no WAL, so any datanode opens it whatever its own provider.
    pub fn of(options: &WalOptions) -> Option<Self> {
        match options {
            WalOptions::RaftEngine => Some(WalProviderKind::RaftEngine),
            WalOptions::Kafka(_) => Some(WalProviderKind::Kafka),
            WalOptions::Noop => None,
        }
    }
}

impl fmt::Display for WalProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why one region (or a whole record, when `region_id` is `None`) cannot be opened.
#[derive(Debug)]
pub struct RegionOpenError {
    /// The datanode table key of the record.
    pub key: String,
    /// The region, when the record decoded far enough to name it.
    pub region_id: Option<u64>,
    /// What is wrong; its message names the key (and the region).
    pub error: Error,
}

/// Everything a datanode should open, and what it cannot.
#[derive(Debug, Default)]
pub struct OpenRegions {
    /// One request per openable region, in key then region-number order.
    pub requests: Vec<RegionOpenRequest>,
    /// One error per region that cannot be opened (per record, when the record itself does not decode).
    pub errors: Vec<RegionOpenError>,
}

/// Builds the open requests of one datanode from the kv backend.
#[derive(Debug, Clone)]
pub struct RegionOpener {
    kv: KvBackendRef,
    datanode_id: u64,
    expected: WalProviderKind,
    page_size: usize,
}

impl RegionOpener {
    /// An opener for `datanode_id`, configured for the WAL provider `expected`.
    pub fn new(kv: KvBackendRef, datanode_id: u64, expected: WalProviderKind) -> Self {
        RegionOpener {
            kv,
            datanode_id,
            expected,
            page_size: DEFAULT_PAGE_SIZE,
        }
    }

    /// Reads `page_size` pairs per range request (at least 1).
    pub fn with_page_size(mut self, page_size: usize) -> Self {
        self.page_size = page_size.max(1);
        self
    }

    /// Scans every record of the datanode, page by page. A kv failure fails the whole call (nothing can be
    /// trusted then); a damaged record or WAL option only adds errors for its regions.
    pub async fn open_regions(&self) -> Result<OpenRegions> {
        Ok(self.decode(&self.scan().await?))
    }

    /// The datanode's `__dn_table` records as stored, every page of them.
    pub async fn scan(&self) -> Result<Vec<KeyValue>> {
        let mut out = Vec::new();
        let mut req = RangeRequest::prefix(datanode_table_prefix(self.datanode_id))
            .with_limit(self.page_size);
        loop {
            let resp = self.kv.range(req.clone()).await?;
            let more = resp.more;
            let next = resp.kvs.last().map(|last| {
                let mut next = last.key.clone();
                next.push(0);
                next
            });
            out.extend(resp.kvs);
            match next {
                Some(next) if more => req.key = next,
                _ => return Ok(out),
            }
        }
    }

    /// The open requests (and errors) of records [`RegionOpener::scan`] read.
    pub fn decode(&self, kvs: &[KeyValue]) -> OpenRegions {
        let mut out = OpenRegions::default();
        for kv in kvs {
            self.open_record(kv, &mut out);
        }
        out
    }

    /// The requests (or errors) of one record.
    fn open_record(&self, kv: &KeyValue, out: &mut OpenRegions) {
        let key = String::from_utf8_lossy(&kv.key).to_string();
        let whole_record_error = |error: Error, out: &mut OpenRegions| {
            out.errors.push(RegionOpenError {
                key: key.clone(),
                region_id: None,
                error,
            })
        };
        let table_id = match parse_datanode_table_key(&kv.key) {
            Ok((dn, table_id)) if dn == self.datanode_id => table_id,
            Ok((dn, _)) => {
                let error = InvalidDatanodeTableKeySnafu {
                    key: key.clone(),
                    reason: format!("it belongs to datanode {dn}, not {}", self.datanode_id),
                }
                .build();
                return whole_record_error(error.into(), out);
            }
            Err(error) => return whole_record_error(error.into(), out),
        };
        let value: DatanodeTableValue = match serde_json::from_slice(&kv.value) {
            Ok(value) => value,
            Err(source) => {
                let error = DecodeDatanodeTableValueSnafu { key: key.clone() }.into_error(source);
                return whole_record_error(error, out);
            }
        };
        if value.table_id != table_id {
            let error = InvalidDatanodeTableKeySnafu {
                key: key.clone(),
                reason: format!("its value names table {}", value.table_id),
            }
            .build();
            return whole_record_error(error.into(), out);
        }
        for &number in &value.regions {
            let id = region_id(table_id, number);
            match self.region_request(&key, &value, number) {
                Ok(request) => out.requests.push(request),
                Err(error) => out.errors.push(RegionOpenError {
                    key: key.clone(),
                    region_id: Some(id),
                    error,
                }),
            }
        }
    }

    /// The request of one region, with its WAL options validated.
    fn region_request(
        &self,
        key: &str,
        value: &DatanodeTableValue,
        number: u32,
    ) -> Result<RegionOpenRequest> {
        let id = region_id(value.table_id, number);
        let mut options = value.region_options.clone();
        match value.region_wal_options.get(&number) {
            Some(encoded) => {
                let wal =
                    WalOptions::decode(encoded).map_err(|source| Error::RegionWalOptions {
                        key: key.to_string(),
                        region_number: number,
                        region_id: id,
                        source: Box::new(source),
                    })?;
                // A noop region needs no WAL of the datanode's: it opens on any datanode, its options passed on
                // as recorded so the engine knows to write no WAL.
                if let Some(found) = WalProviderKind::of(&wal) {
                    snafu::ensure!(
                        found == self.expected,
                        WalProviderMismatchSnafu {
                            key,
                            region_number: number,
                            region_id: id,
                            expected: self.expected.as_str(),
                            found: found.as_str(),
                        }
                    );
                }
                options.insert(WAL_OPTIONS_KEY.to_string(), encoded.clone());
            }
            // No recorded options: the region uses the datanode's own WAL, which only raft-engine can be.
            None => snafu::ensure!(
                self.expected == WalProviderKind::RaftEngine,
                MissingRegionWalOptionsSnafu {
                    key,
                    region_number: number,
                    region_id: id,
                    expected: self.expected.as_str(),
                }
            ),
        }
        Ok(RegionOpenRequest {
            region_id: id,
            engine: value.engine.clone(),
            region_dir: region_dir(&value.region_storage_path, value.table_id, number),
            options,
        })
    }
}
