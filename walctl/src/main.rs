//! `walctl`: drive and inspect remote-wal's metadata machinery from the command line.
//!
//! A thin shell over [`remote_wal::metasrv::Metasrv`]: every command builds the metasrv from the config (or the
//! embedded default), does its work, prints the result (text, or one JSON object per line with `--json`) and stops
//! it. Only commands that run procedures (`bootstrap`, `create-table`, `procedures purge`, `wal prune`) start the
//! procedure manager, which claims the store and resumes any procedure an earlier, killed run left unfinished; the
//! read-only ones (`procedures list/show/locks`, `topics`, `open-regions`, `wal stats`) only read the store, and
//! `wal write` and `wal flush` write WAL entries and checkpoints without procedures. See `docs/walctl.md`.

// mimalloc rather than glibc's malloc: the procedure engine allocates per step and per publication, and with it a
// one-step procedure costs about a fifth less CPU; built without transparent huge pages (the workspace's `no_thp`
// feature), about a ninth less again (docs/procedures.md, "The allocator"). The library leaves the choice to the
// binary that embeds it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod access;
mod bench;
mod bench_heartbeats;
mod cli;
mod client;
mod datanode_server;
mod drift;
mod election;
mod failover;
mod load;
mod output;
mod progress;
mod region;
mod route;
mod serve;
mod wal;

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;
use std::sync::Arc;

use remote_wal::config::{MetadataBackend, MetasrvConfig};
use remote_wal::kv::redb::RedbOpenMode;
use remote_wal::kv::state_store::LeaderFence;
use remote_wal::metasrv::{Metasrv, parse_table_name};
use remote_wal::wal::WalConfig;

use crate::cli::{Cli, Command, ProceduresCommand};
use crate::output::{Output, one_line};
use crate::progress::Waiting;

fn main() -> ExitCode {
    std::panic::set_hook(Box::new(|info| {
        let message = info.to_string().replace('\n', " ");
        eprintln!("walctl: internal error: {message}");
    }));
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return cli::usage_error(e),
    };
    progress::init_tracing();
    if !cli.server.is_empty() && !cli.command.runs_against_datanodes() {
        // Client mode: plain blocking HTTP, no runtime needed.
        let result = access::Access::from_cli(cli.token_file.as_deref(), cli.ca.as_deref())
            .and_then(|access| client::Client::new(&cli.server, cli.wait, &access))
            .and_then(|mut client| {
                client::execute(&mut client, &cli.command, &mut Output::new(cli.json))
            });
        return match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {}", one_line(&e.to_string()));
                ExitCode::FAILURE
            }
        };
    }
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

/// Why a command failed: the library said so, or walctl itself refused.
#[derive(Debug)]
enum Failure {
    /// An error of the metasrv (config, store, Kafka, procedures); boxed, it is large.
    Wal(Box<remote_wal::Error>),
    /// walctl refused to go on (e.g. a purge without confirmation).
    Refused(String),
    /// A server answered that what was asked for does not exist (404), in its words.
    NotFound(String),
}

impl Failure {
    /// Whether it says that a table does not exist (a server's 404, or the store's answer embedded).
    fn is_table_not_found(&self) -> bool {
        match self {
            Failure::NotFound(_) => true,
            Failure::Wal(e) => match &**e {
                remote_wal::Error::WalTableNotFound { .. } => true,
                remote_wal::Error::Ddl { source } => {
                    matches!(**source, remote_wal::ddl::Error::TableNotFound { .. })
                }
                _ => false,
            },
            Failure::Refused(_) => false,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Wal(e) => write!(f, "{e}"),
            Failure::Refused(reason) | Failure::NotFound(reason) => f.write_str(reason),
        }
    }
}

impl From<remote_wal::Error> for Failure {
    fn from(e: remote_wal::Error) -> Self {
        Failure::Wal(Box::new(e))
    }
}

impl From<remote_wal::ddl::Error> for Failure {
    fn from(e: remote_wal::ddl::Error) -> Self {
        Failure::Wal(Box::new(e.into()))
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    if let Command::Serve { listen } = &cli.command {
        return serve::run(cli.config.as_deref(), listen.clone()).await;
    }
    if let Command::Datanode = &cli.command {
        return datanode_server::run(cli.config.as_deref()).await;
    }
    if cli.command.runs_against_datanodes() {
        return against_datanodes(&cli).await;
    }
    let mut config = match &cli.config {
        Some(path) => MetasrvConfig::from_file(path)?,
        None => MetasrvConfig::embedded(),
    };
    if let Command::Bench(bench::BenchCommand::Ddl(args)) = &cli.command
        && args.no_group_commit
    {
        config.procedure.group_commit = false;
    }
    // Only a command that creates metadata may create a missing redb file; the others need it to exist.
    let mode = if cli.command.creates_metadata() {
        RedbOpenMode::CreateIfMissing
    } else {
        RedbOpenMode::MustExist
    };
    let mut out = Output::new(cli.json);
    // On etcd and PostgreSQL, a command that claims the store joins the servers' election rather than fencing
    // whoever leads.
    if matches!(
        config.metadata_store.backend,
        MetadataBackend::Etcd | MetadataBackend::Postgres
    ) && cli.command.claims_store()
        && let Some(path) = &cli.config
    {
        let (_, server) = MetasrvConfig::from_file_with_server(path)?;
        let fence = Arc::new(LeaderFence::new());
        let election = election::connect(&config, &server, fence.clone()).await?;
        return match election::join(&election, cli.wait).await? {
            // The load generator measures a metasrv of its own; beside a leading server it would fence it.
            election::Joined::Server(address) if matches!(cli.command, Command::Bench(_)) => {
                Err(Failure::Refused(format!(
                    "bench ddl runs a procedure manager of its own, and the server at {address} leads this store: it \
                     cannot run beside a leading server (stop the servers, or run it on another store)"
                )))
            }
            election::Joined::Server(address) => tokio::task::block_in_place(|| {
                let access =
                    access::Access::from_cli(cli.token_file.as_deref(), cli.ca.as_deref())?;
                let mut client =
                    client::Client::new(std::slice::from_ref(&address), cli.wait, &access)?;
                // The server runs the command with its own config: refused when that is not this command's.
                if let Some(theirs) = client.served()? {
                    let found = drift::differences(&drift::served(&config), &theirs);
                    if !found.is_empty() {
                        return Err(Failure::Refused(format!(
                            "the server at {address} leads this store and would run this command with its own \
                             config, which differs from {}: {}; run the command with that server's config, or with \
                             --server {address} to use it knowingly",
                            path.display(),
                            found.join("; ")
                        )));
                    }
                }
                client::execute(&mut client, &cli.command, &mut out)
            }),
            election::Joined::Term(term) => {
                let result = async {
                    let metasrv = Metasrv::open_fenced(config, mode, Some(fence)).await?;
                    let result = execute(&metasrv, &cli.command, &mut out).await;
                    let stopped = metasrv.stop().await;
                    result?;
                    Ok::<(), Failure>(stopped?)
                }
                .await;
                election.resign(term).await;
                result
            }
        };
    }
    let metasrv = Metasrv::open(config, mode).await?;
    let result = execute(&metasrv, &cli.command, &mut out).await;
    let stopped = metasrv.stop().await;
    result?;
    Ok(stopped?)
}

/// `load`, `region dump`, `wal flush`: commands that reach datanodes.
async fn against_datanodes(cli: &Cli) -> Result<(), Failure> {
    let mut out = Output::new(cli.json);
    if let Command::Region(command) = &cli.command {
        return region::run(command, cli.config.as_deref(), &mut out).await;
    }
    let access = access::Access::from_cli(cli.token_file.as_deref(), cli.ca.as_deref())?;
    if let Command::Bench(bench::BenchCommand::Heartbeats(args)) = &cli.command {
        return tokio::task::block_in_place(|| {
            bench_heartbeats::run(args, &cli.server, &access, &mut out)
        });
    }
    let mut router =
        route::Router::new(&cli.server, cli.config.as_deref(), cli.wait, &access).await?;
    let result = tokio::task::block_in_place(|| match &cli.command {
        Command::Load(args) => load::run(args, router, &access, &mut out).map(Some),
        Command::Wal(wal::WalCommand::Flush { table, region }) => {
            wal::flush(&mut router, table, *region, cli.wait, &access, &mut out)
                .map(|()| Some(router))
        }
        _ => Ok(Some(router)),
    });
    match result {
        Ok(Some(router)) => router.close().await,
        Ok(None) => Ok(()),
        Err(e) => Err(e),
    }
}

/// What a command that needs the Kafka pool waits for, or `None` for raft-engine.
fn kafka_wait(metasrv: &Metasrv) -> Option<String> {
    match &metasrv.config().wal {
        WalConfig::Kafka(kafka) => Some(format!(
            "Kafka at {} (topic pool '{}' of {} topics)",
            kafka.broker_endpoints.join(","),
            kafka.topic_name_prefix,
            kafka.num_topics
        )),
        WalConfig::RaftEngine => None,
    }
}

/// What finishing the procedures of an earlier run waits for.
fn recovered_wait(metasrv: &Metasrv) -> String {
    match kafka_wait(metasrv) {
        Some(kafka) => {
            format!("procedures left unfinished by an earlier run to finish, using {kafka}")
        }
        None => "procedures left unfinished by an earlier run to finish".to_string(),
    }
}

async fn execute(metasrv: &Metasrv, command: &Command, out: &mut Output) -> Result<(), Failure> {
    match command {
        Command::Bootstrap { recreate_missing } => bootstrap(metasrv, *recreate_missing, out).await,
        Command::CreateTable {
            name,
            regions,
            if_not_exists,
            id,
        } => {
            let name = parse_table_name(name)?;
            // Refused before anything is opened or claimed, with the text a server gives (`--server`).
            if let Some(id) = id {
                remote_wal::ddl::procedure_id::validate_procedure_id(&name, id)?;
            }
            match kafka_wait(metasrv) {
                Some(what) => Waiting::new(what).run(metasrv.start()).await?,
                None => metasrv.start().await?,
            }
            finish_recovered(metasrv).await?;
            let table = metasrv
                .create_table_with_id(name, *regions, *if_not_exists, id.as_deref())
                .await?;
            output::print_table(out, &table);
            Ok(())
        }
        // Read-only commands only read the store: no epoch claimed, nothing resumed, nothing written.
        Command::OpenRegions { datanode, replay } => {
            let open = metasrv.open_regions(*datanode).await?;
            let replayed = if *replay {
                let started = std::time::Instant::now();
                let kafka = match &metasrv.config().wal {
                    WalConfig::Kafka(k) => Some(k),
                    WalConfig::RaftEngine => None,
                };
                let dir = metasrv.config().datanodes.wal_dir_of(*datanode);
                let outcomes = datanode::replay::replay_open_requests(
                    &open.requests,
                    metasrv.kv(),
                    kafka,
                    &dir,
                )
                .await;
                Some((outcomes, started.elapsed()))
            } else {
                None
            };
            output::print_open_regions(out, *datanode, &(&open).into(), replayed.as_ref());
            Ok(())
        }
        Command::Procedures(ProceduresCommand::List(args)) => {
            let query = args.query().map_err(|e| Failure::Refused(e.to_string()))?;
            let page = procedures::listing::page(metasrv.stored_procedures().await?, &query);
            output::print_procedure_page(
                out,
                &page.procedures,
                page.next.map(|c| c.to_string()).as_deref(),
                page.matched,
            );
            Ok(())
        }
        Command::Procedures(ProceduresCommand::Show { id }) => {
            let info = metasrv.stored_procedure(id).await?;
            output::print_procedure(out, &info);
            Ok(())
        }
        Command::Procedures(ProceduresCommand::Locks) => {
            let list = metasrv.stored_procedures().await?;
            output::print_locks(out, &list);
            Ok(())
        }
        // Control commands write one request into the store without starting a manager here (no epoch claimed,
        // so a manager running elsewhere is not fenced; it honours the request, or the next one to start does).
        Command::Procedures(ProceduresCommand::Cancel { id }) => {
            metasrv
                .control_procedure(Some(id), procedures::ControlOp::Cancel)
                .await?;
            output::print_control(out, Some(id), procedures::ControlOp::Cancel);
            Ok(())
        }
        Command::Procedures(ProceduresCommand::Pause { id, .. }) => {
            metasrv
                .control_procedure(id.as_deref(), procedures::ControlOp::Pause)
                .await?;
            output::print_control(out, id.as_deref(), procedures::ControlOp::Pause);
            Ok(())
        }
        Command::Procedures(ProceduresCommand::Resume { id, .. }) => {
            metasrv
                .control_procedure(id.as_deref(), procedures::ControlOp::Resume)
                .await?;
            output::print_control(out, id.as_deref(), procedures::ControlOp::Resume);
            Ok(())
        }
        Command::Procedures(ProceduresCommand::Purge { id, yes }) => {
            metasrv.start_procedures().await?;
            let info = metasrv.procedure(id).await?;
            if !*yes {
                confirm_purge(id, &purge_subject(&info))?;
            }
            metasrv.purge_procedure(id).await?;
            output::print_purged(out, id);
            Ok(())
        }
        // Handled by `run` before a metasrv is opened.
        Command::Serve { .. } | Command::Datanode | Command::Load(_) | Command::Region(_) => Ok(()),
        // Writing entries, recording checkpoints and reading watermarks need no procedure: no manager is started
        // (a running `walctl serve` is not fenced).
        Command::Wal(command) if !command.runs_procedures() => {
            wal::execute(metasrv, command, out).await?;
            Ok(())
        }
        Command::Wal(command) => {
            match kafka_wait(metasrv) {
                Some(what) => Waiting::new(what).run(metasrv.start()).await?,
                None => metasrv.start().await?,
            }
            finish_recovered(metasrv).await?;
            wal::execute(metasrv, command, out).await?;
            Ok(())
        }
        Command::Bench(command) => {
            match kafka_wait(metasrv) {
                Some(what) => Waiting::new(what).run(metasrv.start()).await?,
                None => metasrv.start().await?,
            }
            finish_recovered(metasrv).await?;
            bench::execute(metasrv, command, out).await?;
            Ok(())
        }
        Command::DropTable { name, if_exists } => {
            let table = parse_table_name(name)?;
            match kafka_wait(metasrv) {
                Some(what) => Waiting::new(what).run(metasrv.start()).await?,
                None => metasrv.start().await?,
            }
            finish_recovered(metasrv).await?;
            let output = metasrv.drop_table(table.clone(), *if_exists).await?;
            output::print_drop(out, &table.to_string(), &output);
            Ok(())
        }
        // Regions move as datanodes heartbeat to the leader: an embedded manager hears no heartbeat.
        Command::MigrateRegion { region, .. } => Err(Failure::Refused(format!(
            "migrate-region of region {region} runs on the leading walctl serve, where datanodes heartbeat: pass \
             --server, or run it on etcd or PostgreSQL beside a leading server (no server leads this store)"
        ))),
        Command::Failover(failover::FailoverCommand::Status) => {
            failover::print_status(out, &metasrv.failover_status().await?);
            Ok(())
        }
        Command::Failover(command @ failover::FailoverCommand::Pause) => {
            let was = metasrv.pause_failover().await?;
            failover::print_toggle(out, command, was);
            Ok(())
        }
        Command::Failover(command @ failover::FailoverCommand::Resume) => {
            let was = metasrv.resume_failover().await?;
            failover::print_toggle(out, command, was);
            Ok(())
        }
        Command::Topics => {
            let topics = metasrv.topics().await?;
            output::print_topics(out, &topics);
            Ok(())
        }
    }
}

/// How the purge confirmation names procedure `info`.
fn purge_subject(info: &procedures::ProcedureInfo) -> String {
    format!(
        "procedure {} ({}, {}{})",
        info.id,
        info.type_name,
        info.state,
        info.error
            .as_deref()
            .map(|e| format!(": {}", one_line(e)))
            .unwrap_or_default()
    )
}

/// Asks on the terminal before a purge; without a terminal on stdin it refuses (pass `--yes`).
fn confirm_purge(id: &str, what: &str) -> Result<(), Failure> {
    if !std::io::stdin().is_terminal() {
        return Err(Failure::Refused(format!(
            "refusing to purge procedure '{id}' without confirmation: stdin is not a terminal (pass --yes)"
        )));
    }
    eprint!("purge {what} from the state store? [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    if let Err(e) = std::io::stdin().lock().read_line(&mut answer) {
        return Err(Failure::Refused(format!(
            "cannot read the confirmation to purge procedure '{id}': {e}"
        )));
    }
    match answer.trim() {
        "y" | "Y" | "yes" | "YES" | "Yes" => Ok(()),
        _ => Err(Failure::Refused(format!(
            "procedure '{id}' not purged: not confirmed"
        ))),
    }
}

/// Lets the procedures an earlier, killed run left unfinished complete before a command whose output depends on
/// them; one that fails is reported as a warning (it stays visible in `walctl procedures list`).
async fn finish_recovered(metasrv: &Metasrv) -> Result<(), Failure> {
    let finished = Waiting::new(recovered_wait(metasrv))
        .run(metasrv.finish_recovered())
        .await?;
    for info in finished {
        match &info.error {
            Some(error) if info.state == procedures::ProcedureState::Failed => tracing::warn!(
                "procedure {} ({}) left unfinished by an earlier run failed: {}",
                info.id,
                info.type_name,
                one_line(error)
            ),
            _ => tracing::info!(
                "procedure {} ({}) left unfinished by an earlier run: {}",
                info.id,
                info.type_name,
                info.state
            ),
        }
    }
    Ok(())
}

async fn bootstrap(
    metasrv: &Metasrv,
    recreate_missing: bool,
    out: &mut Output,
) -> Result<(), Failure> {
    let report = match kafka_wait(metasrv) {
        Some(what) => {
            let waiting = Waiting::new(what);
            waiting
                .run(metasrv.bootstrap_with(recreate_missing, |p| waiting.bootstrap_progress(p)))
                .await
        }
        None => metasrv.bootstrap_with(recreate_missing, |_| {}).await,
    }?;
    output::print_bootstrap(out, &report);
    // The bootstrap started the manager, which resumed what an earlier, killed run left unfinished: let those
    // procedures finish too rather than stop them half-way when this process exits.
    finish_recovered(metasrv).await
}
