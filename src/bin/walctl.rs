//! `walctl`: drive and inspect remote-wal's metadata machinery from the command line.
//!
//! A thin shell over [`remote_wal::metasrv::Metasrv`]: every command builds the metasrv from the config (or the
//! embedded default), starts it — which resumes any procedure an earlier, killed run left unfinished — does its
//! work, prints the result (text, or one JSON object per line with `--json`) and stops it. See `docs/walctl.md`.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Duration;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use procedures::ProcedureInfo;
use remote_wal::Result;
use remote_wal::config::MetasrvConfig;
use remote_wal::datanode::OpenRegions;
use remote_wal::metasrv::{
    BootstrapProgress, Metasrv, TableRegions, TopicsReport, parse_table_name,
};
use remote_wal::wal::WAL_OPTIONS_KEY;
use serde_json::json;

/// Hands out write-ahead-log options per region (raft-engine or a pooled Kafka topic) through persisted,
/// resumable procedures. Every command first resumes procedures an earlier, killed run left unfinished.
#[derive(Debug, Parser)]
#[command(name = "walctl", version)]
struct Cli {
    /// TOML config file (default: the embedded default — redb at ./walctl-data/metadata.redb, raft-engine WAL,
    /// datanode 1).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,

    /// Print one JSON object per line instead of text.
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create (or finish creating) the Kafka topic pool and persist its names; exits 0 when the pool is ready.
    Bootstrap,
    /// Create a table and print its id and, per region, its datanode and WAL options.
    CreateTable {
        /// `table`, `schema.table` or `catalog.schema.table` (defaults: catalog greptime, schema public).
        name: String,
        /// Number of regions.
        #[arg(long, value_name = "N")]
        regions: u32,
        /// Succeed with the existing table's id if it exists.
        #[arg(long)]
        if_not_exists: bool,
    },
    /// Print the region open requests a datanode would issue, and per-region errors.
    OpenRegions {
        /// The datanode id.
        #[arg(long, value_name = "ID")]
        datanode: u64,
    },
    /// List or show procedures.
    #[command(subcommand)]
    Procedures(ProceduresCommand),
    /// The Kafka topic pool, with the number of regions assigned to each topic.
    Topics,
}

#[derive(Debug, Subcommand)]
enum ProceduresCommand {
    /// Every procedure known (running, and finished ones still retained).
    List,
    /// One procedure.
    Show {
        /// The procedure id.
        id: String,
    },
}

fn main() -> ExitCode {
    std::panic::set_hook(Box::new(|info| {
        let message = info.to_string().replace('\n', " ");
        eprintln!("walctl: internal error: {message}");
    }));
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    init_tracing();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e.to_string()));
            ExitCode::FAILURE
        }
    }
}

/// Clap's help and version go out as clap prints them; a usage error becomes one line naming the culprit.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            }
        }
        _ => {
            let rendered = e.render().to_string();
            let text: Vec<&str> = rendered
                .lines()
                .take_while(|l| !l.starts_with("Usage:"))
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with("tip:"))
                .collect();
            eprintln!("{} (see walctl --help)", text.join(" "));
            ExitCode::from(2)
        }
    }
}

fn one_line(s: &str) -> String {
    s.split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Logs go to stderr at `warn` unless `RUST_LOG` says otherwise. rskafka's own per-attempt connection warnings
/// are left out by default: a failed connection ends in one error naming the brokers anyway.
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,rskafka=error"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

async fn run(cli: Cli) -> Result<()> {
    let config = match &cli.config {
        Some(path) => MetasrvConfig::from_file(path)?,
        None => MetasrvConfig::embedded(),
    };
    let metasrv = Metasrv::new(config).await?;
    let mut out = Output::new(cli.json);
    let result = execute(&metasrv, &cli.command, &mut out).await;
    let stopped = metasrv.stop().await;
    result?;
    stopped
}

async fn execute(metasrv: &Metasrv, command: &Command, out: &mut Output) -> Result<()> {
    match command {
        Command::Bootstrap => bootstrap(metasrv, out).await,
        Command::CreateTable {
            name,
            regions,
            if_not_exists,
        } => {
            let name = parse_table_name(name)?;
            metasrv.start().await?;
            let table = metasrv.create_table(name, *regions, *if_not_exists).await?;
            print_table(out, &table);
            Ok(())
        }
        Command::OpenRegions { datanode } => {
            metasrv.start_procedures().await?;
            let open = metasrv.open_regions(*datanode).await?;
            print_open_regions(out, *datanode, &open);
            Ok(())
        }
        Command::Procedures(ProceduresCommand::List) => {
            metasrv.start_procedures().await?;
            let list = metasrv.list_procedures().await?;
            print_procedures(out, &list);
            Ok(())
        }
        Command::Procedures(ProceduresCommand::Show { id }) => {
            metasrv.start_procedures().await?;
            let info = metasrv.procedure(id).await?;
            print_procedure(out, &info);
            Ok(())
        }
        Command::Topics => {
            metasrv.start_procedures().await?;
            let topics = metasrv.topics().await?;
            print_topics(out, &topics);
            Ok(())
        }
    }
}

async fn bootstrap(metasrv: &Metasrv, out: &mut Output) -> Result<()> {
    // The bar goes to stderr, only for text output on a terminal.
    let bar: Mutex<Option<ProgressBar>> = Mutex::new(None);
    let show_bar = !out.json && std::io::stderr().is_terminal();
    let report = metasrv
        .bootstrap(|p: BootstrapProgress| {
            if !show_bar {
                return;
            }
            let mut guard = bar.lock().unwrap_or_else(|e| e.into_inner());
            let bar = guard.get_or_insert_with(|| new_bar(p.wanted as u64));
            bar.set_position(p.on_broker as u64);
            bar.set_message(format!("{} persisted", p.persisted));
        })
        .await;
    if let Some(bar) = bar.lock().unwrap_or_else(|e| e.into_inner()).take() {
        bar.finish_and_clear();
    }
    let report = report?;
    if out.json {
        out.json_line(json!({
            "provider": report.provider,
            "topic_name_prefix": report.topic_name_prefix,
            "num_topics": report.num_topics,
            "ready": report.ready,
        }));
    } else if let Some(prefix) = &report.topic_name_prefix {
        out.line(&format!(
            "Kafka topic pool '{prefix}' ready: {} topics, all on the brokers and persisted",
            report.num_topics
        ));
    } else {
        out.line("WAL provider is raft_engine: no topics to create, regions use their datanode's local WAL");
    }
    Ok(())
}

fn new_bar(len: u64) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(
        "{spinner} creating topics [{bar:40}] {pos}/{len} on the brokers, {msg} ({elapsed})",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

fn print_table(out: &mut Output, table: &TableRegions) {
    if out.json {
        for r in &table.regions {
            out.json_line(json!({
                "table": table.table,
                "table_id": table.table_id,
                "region_number": r.region_number,
                "region_id": r.region_id,
                "datanode_id": r.datanode_id,
                "wal_options": r.wal_options,
            }));
        }
        return;
    }
    out.line(&format!(
        "table {} id {} with {} regions",
        table.table,
        table.table_id,
        table.regions.len()
    ));
    let rows: Vec<Vec<String>> = table
        .regions
        .iter()
        .map(|r| {
            vec![
                r.region_number.to_string(),
                r.region_id.to_string(),
                r.datanode_id.to_string(),
                r.wal_options.clone(),
            ]
        })
        .collect();
    out.table(&["REGION", "REGION_ID", "DATANODE", "WAL_OPTIONS"], &rows);
}

fn print_open_regions(out: &mut Output, datanode_id: u64, open: &OpenRegions) {
    if out.json {
        for r in &open.requests {
            out.json_line(json!({
                "kind": "request",
                "datanode_id": datanode_id,
                "region_id": r.region_id,
                "engine": r.engine,
                "region_dir": r.region_dir,
                "wal_options": r.options.get(WAL_OPTIONS_KEY),
                "options": r.options,
            }));
        }
        for e in &open.errors {
            out.json_line(json!({
                "kind": "error",
                "datanode_id": datanode_id,
                "key": e.key,
                "region_id": e.region_id,
                "error": one_line(&e.error.to_string()),
            }));
        }
        return;
    }
    out.line(&format!(
        "datanode {datanode_id}: {} regions to open, {} errors",
        open.requests.len(),
        open.errors.len()
    ));
    let rows: Vec<Vec<String>> = open
        .requests
        .iter()
        .map(|r| {
            vec![
                r.region_id.to_string(),
                r.engine.clone(),
                r.region_dir.clone(),
                r.options.get(WAL_OPTIONS_KEY).cloned().unwrap_or_default(),
            ]
        })
        .collect();
    if !rows.is_empty() {
        out.table(&["REGION_ID", "ENGINE", "REGION_DIR", "WAL_OPTIONS"], &rows);
    }
    for e in &open.errors {
        let region = e
            .region_id
            .map(|r| format!(" region {r}"))
            .unwrap_or_default();
        out.line(&format!(
            "error: {}{region}: {}",
            e.key,
            one_line(&e.error.to_string())
        ));
    }
}

fn age_ms(info: &ProcedureInfo) -> u64 {
    procedures::record::now_ms().saturating_sub(info.created_at_ms)
}

fn format_age(ms: u64) -> String {
    humantime_serde::re::humantime::format_duration(Duration::from_secs(ms / 1000)).to_string()
}

fn procedure_json(info: &ProcedureInfo) -> serde_json::Value {
    json!({
        "id": info.id.as_str(),
        "type": info.type_name,
        "parent_id": info.parent_id.as_ref().map(|p| p.as_str()),
        "state": info.state.as_str(),
        "step": info.step,
        "created_at_ms": info.created_at_ms,
        "updated_at_ms": info.updated_at_ms,
        "age_ms": age_ms(info),
        "error": info.error,
        "output": info.output,
    })
}

fn print_procedures(out: &mut Output, list: &[ProcedureInfo]) {
    if out.json {
        for info in list {
            out.json_line(procedure_json(info));
        }
        return;
    }
    if list.is_empty() {
        out.line("no procedures");
        return;
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|p| {
            vec![
                p.id.to_string(),
                p.type_name.clone(),
                p.state.to_string(),
                p.step.to_string(),
                format_age(age_ms(p)),
                p.error.as_deref().map(one_line).unwrap_or_default(),
            ]
        })
        .collect();
    out.table(&["ID", "TYPE", "STATE", "STEP", "AGE", "ERROR"], &rows);
}

fn print_procedure(out: &mut Output, info: &ProcedureInfo) {
    if out.json {
        out.json_line(procedure_json(info));
        return;
    }
    let fields = [
        ("id", info.id.to_string()),
        ("type", info.type_name.clone()),
        (
            "parent",
            info.parent_id
                .as_ref()
                .map(|p| p.to_string())
                .unwrap_or_else(|| "-".to_string()),
        ),
        ("state", info.state.to_string()),
        ("step", info.step.to_string()),
        ("age", format_age(age_ms(info))),
        (
            "output",
            info.output
                .as_ref()
                .map(|o| o.to_string())
                .unwrap_or_else(|| "-".to_string()),
        ),
        (
            "error",
            info.error
                .as_deref()
                .map(one_line)
                .unwrap_or_else(|| "-".to_string()),
        ),
    ];
    for (k, v) in fields {
        out.line(&format!("{k:<7} {v}"));
    }
}

fn print_topics(out: &mut Output, report: &TopicsReport) {
    if out.json {
        for t in &report.topics {
            out.json_line(json!({
                "topic": t.topic,
                "regions": t.regions,
                "persisted": t.persisted,
                "in_pool": t.in_pool,
            }));
        }
        return;
    }
    let regions: usize = report.topics.iter().map(|t| t.regions).sum();
    let ready = if report.persisted == report.num_topics {
        "ready".to_string()
    } else {
        format!(
            "NOT ready ({} of {} persisted; run walctl bootstrap)",
            report.persisted, report.num_topics
        )
    };
    out.line(&format!(
        "Kafka topic pool '{}': {} topics, {ready}; {regions} regions assigned",
        report.topic_name_prefix, report.num_topics
    ));
    let rows: Vec<Vec<String>> = report
        .topics
        .iter()
        .map(|t| {
            let mut note = Vec::new();
            if !t.persisted {
                note.push("not persisted");
            }
            if !t.in_pool {
                note.push("outside the configured pool");
            }
            vec![t.topic.clone(), t.regions.to_string(), note.join(", ")]
        })
        .collect();
    out.table(&["TOPIC", "REGIONS", "NOTE"], &rows);
}

/// Writes results to stdout; a closed pipe (`walctl ... | head`) ends output quietly.
struct Output {
    json: bool,
    closed: bool,
}

impl Output {
    fn new(json: bool) -> Self {
        Output {
            json,
            closed: false,
        }
    }

    fn line(&mut self, s: &str) {
        if self.closed {
            return;
        }
        let mut stdout = std::io::stdout().lock();
        if writeln!(stdout, "{s}").is_err() {
            self.closed = true;
        }
    }

    fn json_line(&mut self, value: serde_json::Value) {
        self.line(&value.to_string());
    }

    /// Left-aligned columns; the last one is not padded.
    fn table(&mut self, header: &[&str], rows: &[Vec<String>]) {
        let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
        for row in rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let render = |cells: Vec<&str>| -> String {
            let last = cells.len().saturating_sub(1);
            cells
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    if i == last {
                        c.to_string()
                    } else {
                        format!("{c:<width$}", width = widths[i])
                    }
                })
                .collect::<Vec<_>>()
                .join("  ")
                .trim_end()
                .to_string()
        };
        self.line(&render(header.to_vec()));
        for row in rows {
            self.line(&render(row.iter().map(String::as_str).collect()));
        }
    }
}
