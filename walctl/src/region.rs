//! `walctl region dump --region R`: a region's entries as a datanode reopening it would see them — region storage,
//! then its WAL replayed above what storage holds (its checkpoint, its topic's pruned entry id) — read here, in
//! this process, with no lease and nothing written. A raft-engine region can be read only while its datanode is
//! stopped (the engine directory is locked by the process that opened it).

use std::path::PathBuf;

use clap::Subcommand;
use datanode::{Datanode, DatanodeOptions};
use remote_wal::config::{DatanodeConfig, MetasrvConfig};
use remote_wal::kv::redb::RedbOpenMode;
use remote_wal::metasrv::Metasrv;
use remote_wal::wal::WalConfig;
use serde::Serialize;

use crate::Failure;
use crate::load::sequence_of;
use crate::output::Output;

/// `walctl region …`.
#[derive(Debug, Subcommand)]
pub enum RegionCommand {
    /// Print a region's entries as a datanode reopening it would see them (storage plus WAL replay): entry id,
    /// the sequence number `walctl load` wrote at its start, and its size.
    Dump {
        /// The region id.
        #[arg(long, value_name = "R")]
        region: u64,
        /// Region storage (default: the config's `[datanode] region_storage`).
        #[arg(long, value_name = "DIR")]
        region_storage: Option<PathBuf>,
    },
}

/// One entry of the dump.
#[derive(Serialize)]
struct DumpedEntry {
    region_id: u64,
    entry_id: u64,
    sequence: Option<u64>,
    bytes: usize,
}

/// Runs `region dump`.
pub async fn run(
    command: &RegionCommand,
    config_path: Option<&std::path::Path>,
    out: &mut Output,
) -> Result<(), Failure> {
    let RegionCommand::Dump {
        region,
        region_storage,
    } = command;
    let (config, section) = match config_path {
        Some(path) => {
            let config = MetasrvConfig::from_file(path)?;
            let section = match region_storage {
                Some(_) => None,
                None => Some(MetasrvConfig::from_file_with_datanode(path)?.1),
            };
            (config, section)
        }
        None => (MetasrvConfig::embedded(), None),
    };
    let storage = match (region_storage, &section) {
        (Some(dir), _) => dir.clone(),
        (None, Some(s)) => PathBuf::from(&s.region_storage),
        (None, None) => PathBuf::from(remote_wal::config::DEFAULT_REGION_STORAGE),
    };
    let metasrv = Metasrv::open(config.clone(), RedbOpenMode::MustExist).await?;
    let found = metasrv
        .datanode_registry()
        .region_to_open_by_id(*region)
        .await;
    metasrv.stop().await?;
    let Some((datanode_id, mut to_open)) = found? else {
        return Err(Failure::Refused(format!(
            "region {region}: no table route names it (no such table or region)"
        )));
    };
    // A reader, not a writer: it opens the region as a datanode would and writes nothing.
    to_open.topic_region_key = true;
    let wal_dir = section
        .as_ref()
        .filter(|s| s.id == datanode_id)
        .map(|s| s.wal_dir(&config.datanodes))
        .unwrap_or_else(|| config.datanodes.wal_dir_of(datanode_id));
    let reader = Datanode::new(DatanodeOptions {
        id: datanode_id,
        address: String::new(),
        wal_dir,
        region_storage: storage,
        kafka: match &config.wal {
            WalConfig::Kafka(k) => Some(k.clone()),
            WalConfig::RaftEngine => None,
        },
        heartbeat_interval: DatanodeConfig::default().heartbeat_interval,
        flush_threshold: u64::MAX,
        partitions: None,
        topic_ids: None,
    });
    for (_, result) in reader.open_regions(vec![to_open]).await {
        result.map_err(|e| Failure::Refused(e.to_string()))?;
    }
    let entries = reader
        .region_entries(*region)
        .await
        .map_err(|e| Failure::Refused(e.to_string()))?;
    if out.is_json() {
        for e in &entries {
            out.json_line(&DumpedEntry {
                region_id: e.region_id,
                entry_id: e.entry_id,
                sequence: sequence_of(&e.data),
                bytes: e.data.len(),
            });
        }
        return Ok(());
    }
    let rows = entries
        .iter()
        .map(|e| {
            vec![
                e.entry_id.to_string(),
                sequence_of(&e.data).map_or("-".to_string(), |s| s.to_string()),
                e.data.len().to_string(),
            ]
        })
        .collect();
    out.table(&["ENTRY_ID", "SEQUENCE", "BYTES"], rows);
    out.line(&format!("region {region}: {} entries", entries.len()));
    Ok(())
}
