//! `walctl bench …`: load generators against the configured store and WAL. Today `bench ddl`, which creates
//! `--tables` new tables with `--concurrency` create-tables in flight and reports throughput, latency and the
//! store commits each table cost (`docs/walctl.md`).

use std::io::IsTerminal;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Args, Subcommand};
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use remote_wal::metasrv::{Metasrv, parse_table_name};
use serde::Serialize;

use crate::output::Output;

/// The `bench` subcommands.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Create N new tables named `bench_{run}_{i}` ({run} unique to this invocation) with C in flight; print
    /// tables/s, p50/p99/max latency and store commits per table. Touches no table it did not create.
    Ddl(DdlArgs),
    /// Simulate N datanodes heartbeating with R regions each against one `walctl serve` (`--server`); print
    /// heartbeats/s, p50/p99 latency and, with --server-pid, the server's CPU per heartbeat.
    Heartbeats(crate::bench_heartbeats::HeartbeatsArgs),
}

/// The arguments of `bench ddl`.
#[derive(Debug, Args)]
pub struct DdlArgs {
    /// How many tables to create (required: the benchmark writes that many tables into the store).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub tables: u32,
    /// How many create-tables are in flight at once.
    #[arg(long, value_name = "C", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub concurrency: u32,
    /// Regions per table.
    #[arg(long, value_name = "R", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub regions: u32,
    /// Turn the procedure state store's group commit off for this run (`procedure.group_commit = false`).
    #[arg(long)]
    pub no_group_commit: bool,
}

/// What `bench ddl` measured; with `--json` printed as one object.
#[derive(Debug, Serialize)]
pub struct DdlReport {
    /// The `{run}` part of the table names.
    pub run: String,
    /// Tables created.
    pub tables: u32,
    /// Create-tables in flight at once.
    pub concurrency: u32,
    /// Regions per table.
    pub regions: u32,
    /// Wall time from the first submission to the last table created, in seconds.
    pub elapsed_s: f64,
    /// `tables / elapsed_s`.
    pub tables_per_s: f64,
    /// Median create-table latency, in milliseconds.
    pub p50_ms: f64,
    /// 99th percentile create-table latency (nearest rank), in milliseconds.
    pub p99_ms: f64,
    /// Slowest create-table, in milliseconds.
    pub max_ms: f64,
    /// Store commits made while the tables were created, as counted by the kv backend.
    pub commits: u64,
    /// `commits / tables`.
    pub commits_per_table: f64,
    /// Whether the procedure state store committed with group commit (`procedure.group_commit`, off with
    /// `--no-group-commit`).
    pub group_commit: bool,
}

/// Runs `command` on a started metasrv (with the procedures of an earlier run finished).
pub async fn execute(
    metasrv: &Metasrv,
    command: &BenchCommand,
    out: &mut Output,
) -> remote_wal::Result<()> {
    match command {
        // Run by main against the servers, never on an embedded metasrv.
        BenchCommand::Heartbeats(_) => Ok(()),
        BenchCommand::Ddl(args) => {
            let report = ddl(metasrv, args, &run_id()).await?;
            print_ddl(out, &report);
            Ok(())
        }
    }
}

/// A name part no earlier invocation used: the start time in milliseconds and the process id, in hex.
fn run_id() -> String {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("{ms:x}{:x}", std::process::id())
}

/// Creates `bench_{run}_{i}` for `i` in `0..tables`, `concurrency` at a time. The first failure ends the run with
/// that error (tables created so far stay).
pub async fn ddl(metasrv: &Metasrv, args: &DdlArgs, run: &str) -> remote_wal::Result<DdlReport> {
    let names = (0..args.tables)
        .map(|i| parse_table_name(&format!("bench_{run}_{i}")))
        .collect::<remote_wal::Result<Vec<_>>>()?;
    let bar = progress_bar(args.tables);
    let commits_before = metasrv.kv_commits();
    let started = Instant::now();
    let mut creates = futures::stream::iter(names)
        .map(|name| async move {
            let began = Instant::now();
            metasrv
                .create_table_only(name, args.regions)
                .await
                .map(|_| began.elapsed())
        })
        .buffer_unordered(args.concurrency as usize);
    let mut latencies = Vec::with_capacity(args.tables as usize);
    while let Some(latency) = creates.next().await {
        latencies.push(latency?);
        if let Some(bar) = &bar {
            bar.inc(1);
        }
    }
    let elapsed = started.elapsed();
    let commits = metasrv.kv_commits() - commits_before;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    latencies.sort_unstable();
    let tables = args.tables;
    Ok(DdlReport {
        run: run.to_string(),
        tables,
        concurrency: args.concurrency,
        regions: args.regions,
        elapsed_s: elapsed.as_secs_f64(),
        tables_per_s: f64::from(tables) / elapsed.as_secs_f64().max(f64::MIN_POSITIVE),
        p50_ms: millis(percentile(&latencies, 0.50)),
        p99_ms: millis(percentile(&latencies, 0.99)),
        max_ms: millis(latencies.last().copied().unwrap_or_default()),
        commits,
        commits_per_table: commits as f64 / f64::from(tables),
        group_commit: metasrv.config().procedure.group_commit,
    })
}

/// On a terminal, a bar of tables created on stderr.
fn progress_bar(tables: u32) -> Option<ProgressBar> {
    std::io::stderr().is_terminal().then(|| {
        let bar =
            ProgressBar::with_draw_target(Some(u64::from(tables)), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template(
            "creating tables [{bar:40}] {pos}/{len} ({per_sec}, {elapsed})",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar
    })
}

/// The nearest-rank percentile `p` (0 < p ≤ 1) of `sorted`; zero when it is empty.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Three lines of text, or the report as one JSON object.
fn print_ddl(out: &mut Output, r: &DdlReport) {
    if out.is_json() {
        match serde_json::to_string(r) {
            Ok(line) => out.line(&line),
            Err(e) => eprintln!("walctl: cannot serialize a result line: {e}"),
        }
        return;
    }
    out.line(&format!(
        "created {} tables bench_{}_* ({} regions each, {} in flight) in {:.3} s: {:.1} tables/s",
        r.tables, r.run, r.regions, r.concurrency, r.elapsed_s, r.tables_per_s
    ));
    out.line(&format!(
        "latency: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        r.p50_ms, r.p99_ms, r.max_ms
    ));
    out.line(&format!(
        "store commits: {} ({:.2} per table)",
        r.commits, r.commits_per_table
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_is_the_nearest_rank() {
        let sorted: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&sorted, 0.50), Duration::from_millis(50));
        assert_eq!(percentile(&sorted, 0.99), Duration::from_millis(99));
        assert_eq!(percentile(&sorted[..1], 0.99), Duration::from_millis(1));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
    }
}
