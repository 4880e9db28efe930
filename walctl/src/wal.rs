//! `walctl wal …`: the WAL commands (`docs/walctl.md`). `wal prune`
//! runs the WAL prune procedure on each topic of the Kafka pool (or the one named) and prints each topic's old and
//! new pruned entry id; `wal stats` prints each topic's watermarks, regions and what a replay would read.

use clap::Subcommand;
use remote_wal::metasrv::Metasrv;
use remote_wal::metasrv::wal_stats::TopicWalStats;
use remote_wal::wal::prune::PruneOutput;

use crate::output::Output;

/// The `wal` subcommands.
#[derive(Debug, Subcommand)]
pub enum WalCommand {
    /// Ask the datanodes leading a table's regions to flush them to region storage (their checkpoints follow with
    /// their next heartbeats), and print each region's flushed entry id.
    Flush {
        /// `table`, `schema.table` or `catalog.schema.table`.
        #[arg(long, value_name = "NAME")]
        table: String,
        /// Only this region number (default: every region of the table).
        #[arg(long, value_name = "N")]
        region: Option<u32>,
    },
    /// Prune the Kafka WAL: delete (or, with `prune_mode = "logical"`, only mark) the entries every region on a
    /// topic has flushed, and print each topic's old and new low watermark (pruned entry id).
    Prune {
        /// Prune only this topic (default: every topic of the pool).
        #[arg(long, value_name = "TOPIC")]
        topic: Option<String>,
    },
    /// Per topic of the Kafka pool: low and high watermark, pruned entry id, regions, and the records and bytes a
    /// replay of those regions would read.
    Stats,
}

impl WalCommand {
    /// Whether the command runs procedures (and so starts the procedure manager): only `wal prune`.
    pub fn runs_procedures(&self) -> bool {
        matches!(self, WalCommand::Prune { .. })
    }

    /// The subcommand's name as typed (`write`, `flush`, `stats`, `prune`).
    pub fn name(&self) -> &'static str {
        match self {
            WalCommand::Flush { .. } => "flush",
            WalCommand::Stats => "stats",
            WalCommand::Prune { .. } => "prune",
        }
    }
}

/// Runs `command` on a started metasrv.
pub async fn execute(
    metasrv: &Metasrv,
    command: &WalCommand,
    out: &mut Output,
) -> remote_wal::Result<()> {
    match command {
        WalCommand::Flush { .. } => Ok(()),
        WalCommand::Stats => {
            let stats = metasrv.wal_stats().await?;
            print_stats(out, &stats);
            Ok(())
        }
        WalCommand::Prune { topic } => {
            let reports = metasrv.prune_wal(topic.as_deref()).await?;
            print_prune(out, &reports);
            Ok(())
        }
    }
}

/// One line per topic: `topic T: pruned entry id A -> B (mode, R regions[, pinned by region N])`, or with
/// `--json` one object per topic (the procedure's output).
pub fn print_prune(out: &mut Output, reports: &[PruneOutput]) {
    let json = out.is_json();
    for r in reports {
        if json {
            match serde_json::to_string(r) {
                Ok(line) => out.line(&line),
                Err(e) => eprintln!("walctl: cannot serialize a result line: {e}"),
            }
            continue;
        }
        let pinned = r
            .pinned_by
            .map(|region| format!(", pinned by region {region} (no checkpoint)"))
            .unwrap_or_default();
        out.line(&format!(
            "topic {}: pruned entry id {} -> {} ({}, {} regions{pinned})",
            r.topic, r.old_pruned_entry_id, r.new_pruned_entry_id, r.mode, r.regions
        ));
    }
    if reports.is_empty() && !json {
        out.line("no topic to prune");
    }
}

/// One row per topic; with `--json` one object per topic.
fn print_stats(out: &mut Output, stats: &[TopicWalStats]) {
    if out.is_json() {
        for t in stats {
            out.json_line(t);
        }
        return;
    }
    let rows = stats
        .iter()
        .map(|t| {
            vec![
                t.topic.clone(),
                t.low_watermark.to_string(),
                t.high_watermark.to_string(),
                t.pruned_entry_id.to_string(),
                t.regions.to_string(),
                t.replay_from.map_or("-".to_string(), |f| f.to_string()),
                t.replay_records.to_string(),
            ]
        })
        .collect();
    out.table(
        &[
            "TOPIC",
            "LOW_WATERMARK",
            "HIGH_WATERMARK",
            "PRUNED_ENTRY_ID",
            "REGIONS",
            "REPLAY_FROM",
            "REPLAY_RECORDS",
        ],
        rows,
    );
    let records: u64 = stats.iter().map(|t| t.replay_records).sum();
    out.line(&format!(
        "{} topics; a replay of their regions would read {records} records",
        stats.len()
    ));
}

/// `wal flush`: each region's leader datanode flushes it; one line (or JSON object) per region.
///
/// A region whose datanode answers "not leader" (it is reopening the region, its lease is being renewed, it is
/// restarting) is asked again, its leader read anew, until `wait` runs out.
pub fn flush(
    router: &mut crate::route::Router,
    table: &str,
    region: Option<u32>,
    wait: std::time::Duration,
    access: &crate::access::Access,
    out: &mut Output,
) -> Result<(), crate::Failure> {
    let deadline = std::time::Instant::now() + wait;
    let mut leaders = router.table(table)?;
    let numbers: Vec<u32> = leaders
        .regions
        .iter()
        .filter(|r| region.is_none_or(|n| n == r.region_number))
        .map(|r| r.region_number)
        .collect();
    if numbers.is_empty() {
        return Err(crate::Failure::Refused(format!(
            "wal flush: table {} has no region {}",
            leaders.table,
            region.map_or(String::new(), |n| n.to_string())
        )));
    }
    // `--ca` too: a datanode serving TLS registers an `https://` address.
    let agent = access.agent(
        std::time::Duration::from_secs(2),
        std::time::Duration::from_secs(60),
    );
    for number in numbers {
        let (r, value) = loop {
            let Some(r) = leaders
                .regions
                .iter()
                .find(|r| r.region_number == number)
                .cloned()
            else {
                return Err(crate::Failure::Refused(format!(
                    "wal flush: table {} no longer has region {number}",
                    leaders.table
                )));
            };
            match flush_one(&agent, access, &r)? {
                Some(value) => break (r, value),
                None if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(200));
                    leaders = router.table(table)?;
                }
                None => {
                    return Err(crate::Failure::Refused(format!(
                        "wal flush: region {} on datanode {}: no datanode leading it took the flush within {} \
                         (--wait)",
                        r.region_id,
                        r.datanode_id,
                        humantime::format_duration(wait)
                    )));
                }
            }
        };
        if out.is_json() {
            out.json_line(&value);
        } else {
            out.line(&format!(
                "region {} (number {}) on datanode {}: flushed up to entry id {} ({} entries written)",
                r.region_id, r.region_number, r.datanode_id, value["flushed_entry_id"], value["entries"]
            ));
        }
    }
    Ok(())
}

/// Asks the region's leader datanode to flush it: its answer, `None` when it is not (yet) the leader or did not
/// answer, an error for a definite refusal.
fn flush_one(
    agent: &ureq::Agent,
    access: &crate::access::Access,
    r: &remote_wal::metasrv::datanodes::RegionLeader,
) -> Result<Option<serde_json::Value>, crate::Failure> {
    let Some(address) = &r.address else {
        return Ok(None);
    };
    let url = format!(
        "{}/v1/regions/{}/flush",
        crate::datanode_server::link::base_url(address),
        r.region_id
    );
    let Ok(mut response) = access.authorize(agent.post(&url)).send_empty() else {
        return Ok(None);
    };
    let status = response.status().as_u16();
    let value: serde_json::Value = response
        .body_mut()
        .read_json()
        .unwrap_or(serde_json::Value::Null);
    if status == 200 {
        return Ok(Some(value));
    }
    if value["error"]["retryable"]
        .as_bool()
        .unwrap_or(status == 503)
    {
        return Ok(None);
    }
    Err(crate::Failure::Refused(format!(
        "wal flush: region {}: {}",
        r.region_id,
        value["error"]["message"].as_str().unwrap_or("no message")
    )))
}
