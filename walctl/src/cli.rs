//! The command line: arguments (clap derive) and how usage errors are reported.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Parser, Subcommand};

/// Hands out write-ahead-log options per region (raft-engine or a pooled Kafka topic) through persisted,
/// resumable procedures. A command that changes metadata (run here, not through `--server`) first resumes what an
/// earlier, killed run left unfinished.
#[derive(Debug, Parser)]
#[command(name = "walctl", version)]
pub struct Cli {
    /// TOML config file (default: the embedded default — redb at ./walctl-data/metadata.redb, raft-engine WAL,
    /// datanode 1).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Print one JSON object per line instead of text.
    #[arg(long, global = true)]
    pub json: bool,

    /// Send the command to the `walctl serve` that leads, among these servers (`URL` or `host:port`, comma
    /// separated), and print its answer as the command prints its own result. Without it, the command runs here.
    #[arg(
        long,
        global = true,
        env = "WALCTL_SERVER",
        value_name = "URL[,URL...]",
        value_delimiter = ','
    )]
    pub server: Vec<String>,

    /// A file holding the bearer token sent to `walctl serve` with --server (the token alone, or a `SCOPE TOKEN`
    /// line); without it, the token in the environment variable WALCTL_TOKEN, if set.
    #[arg(long, global = true, value_name = "FILE")]
    pub token_file: Option<PathBuf>,

    /// A PEM file of the authority that signed the servers' certificates, for `https://` servers.
    #[arg(long, global = true, value_name = "FILE")]
    pub ca: Option<PathBuf>,

    /// How long to look for a leader that takes the request with --server (servers down, an election under way),
    /// and how long a command that writes on etcd waits for its turn to lead, before giving up.
    #[arg(long, global = true, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    pub wait: std::time::Duration,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create (or finish creating) the Kafka topic pool and persist its names; exits 0 when the pool is ready.
    /// A pool topic gone from the brokers, or deleted and created again, fails it naming the topic and its regions.
    Bootstrap {
        /// Create the lost topics anew and record their new topic ids (what their regions wrote there is lost).
        #[arg(long)]
        recreate_missing: bool,
    },
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
        /// A procedure id of your choosing, the request's idempotency key: running the same command again with
        /// the same id (after a timeout or a lost reply) prints the same table instead of "already exists". At
        /// most 128 bytes of printable text.
        #[arg(long, value_name = "ID")]
        id: Option<String>,
    },
    /// Drop a table: its metadata goes, its regions close on the datanodes, and its hold on the WAL's topics with
    /// them (see `docs/drop-table.md`).
    DropTable {
        /// `table`, `schema.table` or `catalog.schema.table`.
        name: String,
        /// Succeed if it does not exist.
        #[arg(long)]
        if_exists: bool,
    },
    /// Move a region's leadership to another datanode (a region on a Kafka WAL): its route names the target at
    /// a new epoch, the old leader closes it, and the target opens and leads it once the old lease ran out. Runs
    /// on the leading `walctl serve` (where datanodes heartbeat): with --server, or on etcd beside a leading
    /// server.
    MigrateRegion {
        /// The region id: (table_id << 32) | region_number.
        #[arg(long, value_name = "ID")]
        region: u64,
        /// The datanode it is to lead on.
        #[arg(long, value_name = "DATANODE")]
        to: u64,
        /// Return once the migration is stored, with its procedure id, instead of once the target leads.
        #[arg(long)]
        no_wait: bool,
    },
    /// Automatic failover: `failover status|pause|resume` (see `docs/failover.md`).
    #[command(subcommand)]
    Failover(crate::failover::FailoverCommand),
    /// Print the region open requests a datanode would issue, and per-region errors.
    OpenRegions {
        /// The datanode id.
        #[arg(long, value_name = "ID")]
        datanode: u64,
        /// Also replay each region's WAL after its checkpoint (regions sharing a Kafka topic in one read of it)
        /// and print the entries and bytes replayed per region and the total time.
        #[arg(long)]
        replay: bool,
    },
    /// List, show, purge procedures, or list their lock keys.
    #[command(subcommand)]
    Procedures(ProceduresCommand),
    /// The Kafka topic pool, with the number of regions assigned to each topic.
    Topics,
    /// The WAL: `wal flush`, `wal prune`, `wal stats` (see `docs/walctl.md`).
    #[command(subcommand)]
    Wal(crate::wal::WalCommand),
    /// Write entries to a table's regions through their leader datanodes; print entries/s, MB/s, p50/p99.
    Load(crate::load::LoadArgs),
    /// A region's entries: `region dump --region R` (see `docs/walctl.md`).
    #[command(subcommand)]
    Region(crate::region::RegionCommand),
    /// Load generators: `bench ddl --tables N [--concurrency C] [--regions R]`, and `bench heartbeats
    /// --datanodes N --regions R` against a server (see `docs/walctl.md`).
    #[command(subcommand)]
    Bench(crate::bench::BenchCommand),
    /// Run a datanode (the config file's `[datanode]` section) until SIGTERM/SIGINT: it registers with the
    /// `walctl serve` leader, heartbeats, opens the regions the metasrv gives it and takes their writes.
    Datanode,
    /// Run as a long-lived server with an HTTP API until SIGTERM/SIGINT; on etcd, servers elect one leader.
    Serve {
        /// `host:port` to listen on (overrides `[server] listen`).
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
    },
}

impl Command {
    /// Whether the command talks to datanodes (resolving region leaders through `--server` or the store) rather
    /// than running as a metasrv command.
    pub fn runs_against_datanodes(&self) -> bool {
        matches!(
            self,
            Command::Load(_)
                | Command::Region(_)
                | Command::Bench(crate::bench::BenchCommand::Heartbeats(_))
                | Command::Wal(crate::wal::WalCommand::Flush { .. })
        )
    }

    /// Whether the command may write the first metadata there is, and so create a missing metadata file.
    pub fn creates_metadata(&self) -> bool {
        matches!(
            self,
            Command::Bootstrap { .. } | Command::CreateTable { .. } | Command::Bench(_)
        )
    }

    /// Whether the command starts the procedure manager, claiming the store (on etcd: it joins the election).
    pub fn claims_store(&self) -> bool {
        match self {
            // `bench ddl` starts the manager to create its tables: like create-table it must not fence a leader.
            Command::Bootstrap { .. }
            | Command::CreateTable { .. }
            | Command::DropTable { .. }
            | Command::MigrateRegion { .. }
            | Command::Bench(_)
            | Command::Procedures(ProceduresCommand::Purge { .. }) => true,
            // `wal write|flush|stats` act on the regions' WALs and checkpoints without the procedure manager.
            Command::Wal(command) => command.runs_procedures(),
            _ => false,
        }
    }
}

/// `walctl procedures list`'s page and filters (`procedures::listing`).
#[derive(Debug, Default, clap::Args)]
pub struct ListArgs {
    /// At most this many procedures (1 to 1000; 100 when not given).
    #[arg(long, value_name = "N")]
    pub limit: Option<String>,
    /// Start after this cursor: the one the previous page printed.
    #[arg(long, value_name = "CURSOR")]
    pub after: Option<String>,
    /// Only procedures in these states, separated by commas (running, retrying, rolling_back, done, failed,
    /// stalled, paused, cancelled).
    #[arg(long, value_name = "STATES")]
    pub state: Option<String>,
    /// Only procedures of this type (e.g. remote_wal::CreateTable).
    #[arg(long = "type", value_name = "TYPE")]
    pub type_name: Option<String>,
}

impl ListArgs {
    /// The query these flags ask for; a bad value is refused naming its flag's field.
    pub fn query(
        &self,
    ) -> Result<procedures::listing::ListQuery, procedures::listing::ListQueryError> {
        procedures::listing::ListQuery::parse(
            self.limit.as_deref(),
            self.after.as_deref(),
            self.state.as_deref(),
            self.type_name.as_deref(),
        )
    }
}

/// `walctl procedures ...`.
#[derive(Debug, Subcommand)]
pub enum ProceduresCommand {
    /// The procedures known (running, and finished ones still retained), newest first, a page at a time.
    List(ListArgs),
    /// One procedure: its state, step, attempts, errors, timing, lock keys and event history.
    Show {
        /// The procedure id.
        id: String,
    },
    /// The lock keys of unfinished procedures, read from the store; with --server, the keys held and awaited in
    /// the leading server's manager (and who blocks each waiting procedure).
    Locks,
    /// Cancel a procedure: its manager interrupts the step in progress (or the wait for a retry or a lock) as soon
    /// as it reads the request, rolls back from the last persisted state if it can and ends `cancelled`. Writes a
    /// request a running manager picks up; see docs/walctl.md.
    Cancel {
        /// The procedure id.
        id: String,
    },
    /// Pause a procedure (or every one with --all): the step in progress is interrupted (run again on resume); it
    /// runs no step, keeps its locks, stays paused across restarts.
    Pause {
        /// The procedure id.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        id: Option<String>,
        /// Every procedure of the store.
        #[arg(long)]
        all: bool,
    },
    /// Resume a paused procedure (or withdraw `pause --all` with --all).
    Resume {
        /// The procedure id.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        id: Option<String>,
        /// Every procedure of the store.
        #[arg(long)]
        all: bool,
    },
    /// Remove a finished, failed or damaged procedure's record from the state store (asks first).
    Purge {
        /// The procedure id.
        id: String,
        /// Do not ask; required when stdin is not a terminal.
        #[arg(long)]
        yes: bool,
    },
}

/// Clap's help and version go out as clap prints them; a usage error becomes one line naming the culprit, built
/// from the error's kind and context (never from its rendered text). Exit 2 for usage errors.
pub fn usage_error(e: clap::Error) -> ExitCode {
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
            eprintln!("error: {} (see walctl --help)", usage_message(&e));
            ExitCode::from(2)
        }
    }
}

/// One context value as text (a list joined by commas).
fn context(e: &clap::Error, kind: ContextKind) -> Option<String> {
    match e.get(kind)? {
        ContextValue::String(s) => Some(s.clone()),
        ContextValue::Strings(v) => Some(v.join(", ")),
        ContextValue::StyledStr(s) => Some(s.to_string()),
        ContextValue::StyledStrs(v) => Some(
            v.iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        ),
        ContextValue::Number(n) => Some(n.to_string()),
        ContextValue::Bool(b) => Some(b.to_string()),
        ContextValue::None => None,
        _ => None,
    }
}

/// The one-line message of a usage error.
fn usage_message(e: &clap::Error) -> String {
    let arg = context(e, ContextKind::InvalidArg);
    let value = context(e, ContextKind::InvalidValue);
    let cause = std::error::Error::source(e).map(|s| s.to_string());
    let message = match (e.kind(), arg, value) {
        (ErrorKind::MissingRequiredArgument, Some(arg), _) => {
            format!("the following required arguments were not provided: {arg}")
        }
        (ErrorKind::InvalidSubcommand, _, _) => format!(
            "unrecognized subcommand '{}'",
            context(e, ContextKind::InvalidSubcommand).unwrap_or_default()
        ),
        (ErrorKind::UnknownArgument, Some(arg), _) => format!("unexpected argument '{arg}' found"),
        (ErrorKind::InvalidValue | ErrorKind::ValueValidation, Some(arg), Some(value)) => {
            match &cause {
                Some(cause) => format!("invalid value '{value}' for '{arg}': {cause}"),
                None => format!("invalid value '{value}' for '{arg}'"),
            }
        }
        (ErrorKind::ArgumentConflict, Some(arg), _) => {
            format!("the argument '{arg}' cannot be used here")
        }
        (ErrorKind::NoEquals, Some(arg), _) => format!("'{arg}' needs a value after '='"),
        (ErrorKind::TooManyValues | ErrorKind::WrongNumberOfValues, Some(arg), _) => {
            format!("wrong number of values for '{arg}'")
        }
        (ErrorKind::MissingSubcommand, _, _) => "a subcommand is required".to_string(),
        (kind, arg, value) => {
            let mut message = kind.as_str().unwrap_or("invalid arguments").to_string();
            if let Some(arg) = arg {
                message.push_str(&format!(": '{arg}'"));
            }
            if let Some(value) = value {
                message.push_str(&format!(" value '{value}'"));
            }
            if let Some(cause) = &cause {
                message.push_str(&format!(": {cause}"));
            }
            message
        }
    };
    message.replace('\n', " ")
}
