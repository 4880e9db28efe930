//! `walctl wal …`: the WAL commands (`docs/walctl.md`). `wal write` appends synthetic entries to a table's regions
//! through their own WALs and prints the throughput; `wal flush` records their replay checkpoints; `wal prune`
//! runs the WAL prune procedure on each topic of the Kafka pool (or the one named) and prints each topic's old and
//! new pruned entry id; `wal stats` prints each topic's watermarks, regions and what a replay would read.

use clap::Subcommand;
use remote_wal::metasrv::wal_flush::RegionFlush;
use remote_wal::metasrv::wal_stats::TopicWalStats;
use remote_wal::metasrv::wal_write::WalWriteReport;
use remote_wal::metasrv::{Metasrv, parse_table_name};
use remote_wal::wal::prune::PruneOutput;

use crate::output::Output;

/// The `wal` subcommands.
#[derive(Debug, Subcommand)]
pub enum WalCommand {
    /// Append synthetic entries spread over a table's regions, each through its own WAL (Kafka topic or its
    /// datanode's raft-engine directory), and print entries/s and MB/s.
    Write {
        /// `table`, `schema.table` or `catalog.schema.table`.
        #[arg(long, value_name = "NAME")]
        table: String,
        /// Entries to write in all (entry i goes to the table's region i mod R).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=MAX_ENTRIES))]
        entries: u64,
        /// Bytes per entry.
        #[arg(long, value_name = "BYTES", default_value_t = 1024,
              value_parser = clap::value_parser!(u64).range(1..=MAX_ENTRY_SIZE))]
        entry_size: u64,
    },
    /// Record replay checkpoints for a table's regions, as a datanode does after a flush.
    Flush {
        /// `table`, `schema.table` or `catalog.schema.table`.
        #[arg(long, value_name = "NAME")]
        table: String,
        /// Only this region number (default: every region of the table).
        #[arg(long, value_name = "N")]
        region: Option<u32>,
        /// The flushed entry id to record (default: each region's last entry id); at most the WAL's end.
        #[arg(long, value_name = "E")]
        entry_id: Option<u64>,
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
            WalCommand::Write { .. } => "write",
            WalCommand::Flush { .. } => "flush",
            WalCommand::Stats => "stats",
            WalCommand::Prune { .. } => "prune",
        }
    }
}

/// The most entries one `wal write` writes.
pub const MAX_ENTRIES: u64 = 100_000_000;

/// The largest entry `wal write` writes (64 MiB).
pub const MAX_ENTRY_SIZE: u64 = 64 * 1024 * 1024;

/// Runs `command` on a started metasrv.
pub async fn execute(
    metasrv: &Metasrv,
    command: &WalCommand,
    out: &mut Output,
) -> remote_wal::Result<()> {
    match command {
        WalCommand::Write {
            table,
            entries,
            entry_size,
        } => {
            let name = parse_table_name(table)?;
            // Bounded by MAX_ENTRY_SIZE, far below usize::MAX.
            let size = usize::try_from(*entry_size).unwrap_or(usize::MAX);
            let report = metasrv.write_wal(&name, *entries, size).await?;
            print_write(out, &report);
            Ok(())
        }
        WalCommand::Flush {
            table,
            region,
            entry_id,
        } => {
            let name = parse_table_name(table)?;
            let flushed = metasrv.flush_wal(&name, *region, *entry_id).await?;
            print_flush(out, &name.to_string(), &flushed);
            Ok(())
        }
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

/// Per region its WAL, entries and last entry id, then `wrote N entries (B bytes) to table T in S s: E entries/s,
/// M MB/s`; with `--json` the report as one object.
fn print_write(out: &mut Output, report: &WalWriteReport) {
    if out.is_json() {
        out.json_line(report);
        return;
    }
    let rows = report
        .regions
        .iter()
        .map(|r| {
            vec![
                r.region_number.to_string(),
                r.region_id.to_string(),
                r.wal.clone(),
                r.entries.to_string(),
                r.last_entry_id.to_string(),
            ]
        })
        .collect();
    out.table(
        &["REGION", "REGION_ID", "WAL", "ENTRIES", "LAST_ENTRY_ID"],
        rows,
    );
    out.line(&format!(
        "wrote {} entries ({} bytes) to table {} in {:.3} s: {:.0} entries/s, {:.2} MB/s",
        report.entries,
        report.bytes,
        report.table,
        report.seconds,
        report.entries_per_sec,
        report.mb_per_sec
    ));
}

/// Per region its WAL and checkpoint before and after; with `--json` one object per region.
fn print_flush(out: &mut Output, table: &str, flushed: &[RegionFlush]) {
    if out.is_json() {
        for r in flushed {
            out.json_line(r);
        }
        return;
    }
    let rows = flushed
        .iter()
        .map(|r| {
            vec![
                r.region_number.to_string(),
                r.region_id.to_string(),
                r.wal.clone(),
                r.old_checkpoint.to_string(),
                r.checkpoint.to_string(),
            ]
        })
        .collect();
    out.table(
        &["REGION", "REGION_ID", "WAL", "OLD_CHECKPOINT", "CHECKPOINT"],
        rows,
    );
    out.line(&format!(
        "recorded the checkpoints of {} regions of table {table}",
        flushed.len()
    ));
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
                t.replay_bytes.to_string(),
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
            "REPLAY_BYTES",
        ],
        rows,
    );
    let bytes: u64 = stats.iter().map(|t| t.replay_bytes).sum();
    out.line(&format!(
        "{} topics; a replay of their regions would read {bytes} bytes",
        stats.len()
    ));
}
