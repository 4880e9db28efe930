//! `walctl failover …`: automatic failover's state, and pausing it for maintenance (`docs/failover.md`).

use clap::Subcommand;
use remote_wal::metasrv::FailoverStatus;

use crate::output::Output;

/// The `failover` subcommands.
#[derive(Debug, Subcommand)]
pub enum FailoverCommand {
    /// Whether automatic failover is enabled and paused, and (from the leading server, with --server) the datanode
    /// incarnations it finds failed now.
    Status,
    /// Pause automatic failover (maintenance): failed datanodes keep their regions until `failover resume`.
    /// Persisted in the metadata store; failovers already running go on.
    Pause,
    /// Resume automatic failover.
    Resume,
}

impl FailoverCommand {
    /// The API path of the command.
    pub fn path(&self) -> &'static str {
        match self {
            FailoverCommand::Status => "/v1/failover",
            FailoverCommand::Pause => "/v1/failover/pause",
            FailoverCommand::Resume => "/v1/failover/resume",
        }
    }
}

/// `failover pause|resume`'s result: whether it changed anything.
pub fn print_toggle(out: &mut Output, command: &FailoverCommand, was_paused: bool) {
    if out.is_json() {
        out.json_line(&serde_json::json!({ "paused": matches!(command, FailoverCommand::Pause), "was_paused": was_paused }));
        return;
    }
    out.line(match (command, was_paused) {
        (FailoverCommand::Pause, false) => "automatic failover paused",
        (FailoverCommand::Pause, true) => "automatic failover was paused already",
        (_, true) => "automatic failover resumed",
        (_, false) => "automatic failover was not paused",
    });
}

/// `failover status`'s result.
pub fn print_status(out: &mut Output, status: &FailoverStatus) {
    if out.is_json() {
        out.json_line(status);
        return;
    }
    let state = match (status.enabled, status.paused) {
        (false, _) => "disabled ([failover] enabled = false)",
        (true, true) => "paused (walctl failover resume)",
        (true, false) => "enabled",
    };
    out.line(&format!("automatic failover: {state}"));
    if status.failed.is_empty() {
        out.line("failed datanodes: none");
    } else {
        let failed: Vec<String> = status
            .failed
            .iter()
            .map(|f| format!("{} (incarnation {})", f.datanode, f.incarnation))
            .collect();
        out.line(&format!("failed datanodes: {}", failed.join(", ")));
    }
    if !status.unavailable_regions.is_empty() {
        let regions: Vec<String> = status
            .unavailable_regions
            .iter()
            .map(u64::to_string)
            .collect();
        out.line(&format!(
            "unavailable regions (raft-engine WAL on a failed datanode): {}",
            regions.join(", ")
        ));
    }
}
