//! `walctl wal …`: the WAL commands. Today `wal prune [--topic T]`, which runs the WAL prune procedure on each topic
//! of the Kafka pool (or the one named) and prints each topic's old and new pruned entry id (`docs/walctl.md`).

use clap::Subcommand;
use remote_wal::metasrv::Metasrv;
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
}

/// Runs `command` on a started metasrv.
pub async fn execute(
    metasrv: &Metasrv,
    command: &WalCommand,
    out: &mut Output,
) -> remote_wal::Result<()> {
    match command {
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
