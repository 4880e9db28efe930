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
