//! The WAL of each region of a table, and the log stores that reach them: what `Metasrv::write_wal` and
//! `Metasrv::flush_wal` share. A Kafka region's WAL is its topic (one [`KafkaLogStore`] per topic, on one client);
//! a raft-engine region's is its datanode's engine directory (one [`RaftEngineLogStore`] per datanode).

use std::collections::BTreeMap;
use std::sync::Arc;

use rskafka::client::Client;
use snafu::IntoError;

use super::{Metasrv, RegionPlacement, TableRegions};
use crate::datanode::log_store::{
    KafkaLogStore, KafkaLogStoreConfig, RaftEngineLogStore, RegionId, RsKafkaPartition,
};
use crate::ddl::TableName;
use crate::error::{
    NoKafkaPoolSnafu, Result, WalRegionNotFoundSnafu, WalRegionSnafu, WalTableNotFoundSnafu,
};
use crate::wal::{WAL_OPTIONS_KEY, WalConfig, WalOptions};

/// Where one region's WAL is.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum RegionWal {
    /// A topic of the Kafka pool.
    Kafka {
        /// The topic.
        topic: String,
    },
    /// The engine directory of the region's datanode.
    RaftEngine {
        /// The datanode.
        datanode_id: u64,
    },
    /// No WAL: nothing is written or flushed for the region.
    Noop,
}

/// A region of a table and its WAL.
#[derive(Clone, Debug)]
pub(crate) struct TableWalRegion {
    /// Where the region lives.
    pub placement: RegionPlacement,
    /// Its WAL.
    pub wal: RegionWal,
}

/// The log stores a command opened, by WAL; a Kafka client is connected on first need.
#[derive(Default)]
pub(crate) struct WalStores {
    client: Option<Arc<Client>>,
    kafka: BTreeMap<String, Arc<KafkaLogStore<RsKafkaPartition>>>,
    raft_engine: BTreeMap<u64, RaftEngineLogStore>,
}

impl Metasrv {
    /// Table `name`'s regions with their WALs; `operation` names the command in the errors (a missing table, a
    /// region whose recorded WAL options do not decode).
    pub(crate) async fn table_wal(
        &self,
        operation: &str,
        name: &TableName,
    ) -> Result<(TableRegions, Vec<TableWalRegion>)> {
        let Some(table_id) = self.table_id(name).await? else {
            return WalTableNotFoundSnafu {
                operation,
                table: name.to_string(),
            }
            .fail();
        };
        let table = self.table_regions(name, table_id).await?;
        let mut regions = Vec::with_capacity(table.regions.len());
        for placement in &table.regions {
            let options = if placement.wal_options.is_empty() {
                Ok(WalOptions::RaftEngine)
            } else {
                WalOptions::decode(&placement.wal_options)
            };
            let wal = match options {
                Ok(WalOptions::Kafka(k)) => RegionWal::Kafka { topic: k.topic },
                Ok(WalOptions::RaftEngine) => RegionWal::RaftEngine {
                    datanode_id: placement.datanode_id,
                },
                Ok(WalOptions::Noop) => RegionWal::Noop,
                Err(e) => {
                    return Err(WalRegionSnafu {
                        operation,
                        table: table.table.clone(),
                        region_id: placement.region_id,
                        wal: format!("{WAL_OPTIONS_KEY} '{}'", placement.wal_options),
                    }
                    .into_error(e));
                }
            };
            regions.push(TableWalRegion {
                placement: placement.clone(),
                wal,
            });
        }
        Ok((table, regions))
    }

    /// How a region's WAL is named in messages: `topic 'T'`, `raft-engine 'DIR'` or `noop`.
    pub(crate) fn describe_wal(&self, wal: &RegionWal) -> String {
        match wal {
            RegionWal::Kafka { topic } => format!("topic '{topic}'"),
            RegionWal::RaftEngine { datanode_id } => format!(
                "raft-engine '{}'",
                self.config.datanodes.wal_dir_of(*datanode_id).display()
            ),
            RegionWal::Noop => "noop".to_string(),
        }
    }

    /// The error of `operation` on `region_id` of `table`, caused by `source`.
    pub(crate) fn wal_region_error(
        &self,
        operation: &str,
        table: &str,
        region_id: RegionId,
        wal: &RegionWal,
        source: crate::Error,
    ) -> crate::Error {
        WalRegionSnafu {
            operation,
            table,
            region_id,
            wal: self.describe_wal(wal),
        }
        .into_error(source)
    }

    /// The Kafka log store of `topic`, opened (and the client connected) on first use.
    pub(crate) async fn kafka_store(
        &self,
        stores: &mut WalStores,
        operation: &str,
        topic: &str,
    ) -> Result<Arc<KafkaLogStore<RsKafkaPartition>>> {
        if let Some(store) = stores.kafka.get(topic) {
            return Ok(store.clone());
        }
        let WalConfig::Kafka(kafka) = &self.config.wal else {
            return NoKafkaPoolSnafu { operation }.fail();
        };
        let client = match &stores.client {
            Some(client) => client.clone(),
            None => {
                let client = crate::datanode::log_store::kafka::connect_client(kafka).await?;
                stores.client = Some(client.clone());
                client
            }
        };
        let bound = crate::datanode::log_store::kafka::call_bound(kafka);
        let partition = RsKafkaPartition::new(&client, topic, bound).await?;
        let store = Arc::new(KafkaLogStore::new(
            partition,
            KafkaLogStoreConfig::for_kafka(kafka)?,
        ));
        stores.kafka.insert(topic.to_string(), store.clone());
        Ok(store)
    }

    /// The raft-engine log store of `datanode_id` (its `[datanodes] wal_dir`), opened on first use.
    pub(crate) async fn raft_engine_store(
        &self,
        stores: &mut WalStores,
        datanode_id: u64,
    ) -> Result<RaftEngineLogStore> {
        if let Some(store) = stores.raft_engine.get(&datanode_id) {
            return Ok(store.clone());
        }
        let dir = self.config.datanodes.wal_dir_of(datanode_id);
        let store = RaftEngineLogStore::open(&dir).await?;
        stores.raft_engine.insert(datanode_id, store.clone());
        Ok(store)
    }
}

/// The regions of `regions` numbered `region_number`, or all of them; an unknown number is an error naming the
/// table and its region numbers.
pub(crate) fn select_regions(
    operation: &str,
    table: &str,
    regions: Vec<TableWalRegion>,
    region_number: Option<u32>,
) -> Result<Vec<TableWalRegion>> {
    let Some(number) = region_number else {
        return Ok(regions);
    };
    let all = regions
        .iter()
        .map(|r| r.placement.region_number.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let selected: Vec<TableWalRegion> = regions
        .into_iter()
        .filter(|r| r.placement.region_number == number)
        .collect();
    snafu::ensure!(
        !selected.is_empty(),
        WalRegionNotFoundSnafu {
            operation,
            table,
            region_number: number,
            regions: all,
        }
    );
    Ok(selected)
}
