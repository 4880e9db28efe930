//! `walctl --server URL[,URL…] …` (or `WALCTL_SERVER`): every command sent to the `walctl serve` that leads, and
//! its answer printed exactly as the embedded command prints its own result (`docs/server.md`).
//!
//! The client tries the servers in turn; a follower's 503 names the leader, which is tried next. A server that
//! does not answer, or answers 503 (no leader yet, not ready) or a retryable 500, is left for the next one, with a
//! growing pause after each round, until `--wait` runs out. A write is sent again with the same procedure id, so a
//! create-table retried after a failover creates the table once.

use std::time::{Duration, Instant};

use procedures::{ControlOp, HeldKey, LockWait, ProcedureId, ProcedureInfo, ProcedureLocks};
use remote_wal::metasrv::{BootstrapReport, TableRegions, TopicsReport};
use remote_wal::wal::prune::round::PruneRoundOutput;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::access::{Access, is_tls_error};
use crate::cli::{Command, ProceduresCommand};
use crate::output::{self, OpenRequests, Output};
use crate::wal::WalCommand;
use crate::{Failure, confirm_purge};

/// The first pause after a round of servers that could not take the request; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause between rounds.
const MAX_PAUSE: Duration = Duration::from_secs(1);
/// How long connecting to one server may take before the next one is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// An HTTP method the API uses.
#[derive(Clone, Copy, Debug)]
enum Method {
    Get,
    Post,
    Delete,
}

/// A client of the servers of one deployment.
pub struct Client {
    servers: Vec<String>,
    /// The leader as last named (a 503's address or the server that last answered), tried first.
    leader: Option<String>,
    agent: ureq::Agent,
    patience: Duration,
    access: Access,
}

/// `URL` without a trailing `/`, with `http://` added when no scheme is given.
fn base_url(url: &str) -> String {
    let url = url.trim().trim_end_matches('/');
    if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    }
}

impl Client {
    /// A client of `servers` (URLs or `host:port`), each request bounded by `patience` in all, with `access`'s
    /// token and authority.
    pub fn new(servers: &[String], patience: Duration, access: &Access) -> Result<Self, Failure> {
        let servers: Vec<String> = servers
            .iter()
            .filter(|s| !s.trim().is_empty())
            .map(|s| base_url(s))
            .collect();
        if servers.is_empty() {
            return Err(Failure::Refused(
                "--server (or WALCTL_SERVER) names no server".to_string(),
            ));
        }
        let agent = access.agent(CONNECT_TIMEOUT, patience.max(CONNECT_TIMEOUT));
        Ok(Client {
            servers,
            leader: None,
            agent,
            patience,
            access: access.clone(),
        })
    }

    /// Sends one request to the leader, following 503s and moving past servers that do not answer, until a
    /// definite answer or `patience` runs out. A 2xx answer's body is returned; a definite error answer becomes the
    /// error with the server's message (the text the embedded command prints).
    fn call(&mut self, method: Method, path: &str, body: Option<&Value>) -> Result<Value, Failure> {
        let deadline = Instant::now() + self.patience;
        let mut next = 0usize;
        let mut pause = FIRST_PAUSE;
        let mut last = Vec::new();
        loop {
            let (server, hinted) = match self.leader.take() {
                Some(leader) => (leader, true),
                None => {
                    let server = self.servers[next % self.servers.len()].clone();
                    next += 1;
                    (server, false)
                }
            };
            let url = format!("{server}{path}");
            let access = &self.access;
            let sent = match (method, body) {
                (Method::Get, _) => access.authorize(self.agent.get(&url)).call(),
                (Method::Delete, _) => access.authorize(self.agent.delete(&url)).call(),
                (Method::Post, Some(body)) => {
                    access.authorize(self.agent.post(&url)).send_json(body)
                }
                (Method::Post, None) => access.authorize(self.agent.post(&url)).send_empty(),
            };
            match sent {
                Ok(mut response) => {
                    let status = response.status().as_u16();
                    let value: Value = response.body_mut().read_json().unwrap_or(Value::Null);
                    if (200..300).contains(&status) {
                        self.leader = Some(server);
                        return Ok(value);
                    }
                    let error = &value["error"];
                    let message = error["message"]
                        .as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| format!("HTTP {status} from {url}"));
                    let retryable = error["retryable"].as_bool().unwrap_or(status == 503);
                    if status == 401 || status == 403 {
                        // The server names what is missing; the client names the server.
                        return Err(Failure::Refused(format!("{server}: {message}")));
                    }
                    if status == 404 && !retryable {
                        return Err(Failure::NotFound(message));
                    }
                    if status != 503 && !retryable {
                        return Err(Failure::Refused(message));
                    }
                    last.push(format!("{server}: {message}"));
                    // A follower names the leader: try it next (unless it named itself or the one just tried).
                    if let Some(leader) = error["leader"].as_str().map(base_url)
                        && leader != server
                    {
                        self.leader = Some(leader);
                        continue;
                    }
                }
                // A certificate this client does not trust: every retry would meet it again.
                Err(e) if is_tls_error(&e) => {
                    return Err(Failure::Refused(format!(
                        "{server}: TLS: {e} (--ca names the authority that signed the server's certificate)"
                    )));
                }
                Err(e) => last.push(format!("{server}: {e}")),
            }
            // A round of servers (or a hinted leader) could not take it: pause before going on.
            if hinted || next.is_multiple_of(self.servers.len()) {
                if Instant::now() + pause > deadline {
                    let tail: Vec<&str> = last
                        .iter()
                        .rev()
                        .take(self.servers.len())
                        .map(String::as_str)
                        .collect();
                    return Err(Failure::Refused(format!(
                        "no server took '{path}' within {} (--wait): {}",
                        humantime::format_duration(self.patience),
                        tail.join("; ")
                    )));
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(MAX_PAUSE);
            }
        }
    }

    /// [`Client::call`], its answer read as a `T`.
    fn call_as<T: DeserializeOwned>(
        &mut self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<T, Failure> {
        let value = self.call(method, path, body)?;
        serde_json::from_value(value).map_err(|e| {
            Failure::Refused(format!(
                "the server's answer to '{path}' is not understood: {e}"
            ))
        })
    }
}

impl Client {
    /// What the leader serves (`GET /v1/leader`'s `served`, see `crate::drift`); `None` when the server that
    /// answered does not lead or does not say.
    pub fn served(&mut self) -> Result<Option<Value>, Failure> {
        let answer = self.call(Method::Get, "/v1/leader", None)?;
        Ok(match answer["self"].as_bool() {
            Some(true) => answer.get("served").cloned(),
            _ => None,
        })
    }

    /// `GET /v1/tables/{name}`: the table's regions with their leader datanodes and addresses.
    pub fn table_leaders(
        &mut self,
        name: &str,
    ) -> Result<remote_wal::metasrv::datanodes::TableLeaders, Failure> {
        self.call_as(Method::Get, &format!("/v1/tables/{}", segment(name)), None)
    }
}

/// `id` as one path segment (procedure ids are free text).
fn segment(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Runs `command` against the servers and prints what the embedded command would.
pub fn execute(client: &mut Client, command: &Command, out: &mut Output) -> Result<(), Failure> {
    match command {
        Command::Bootstrap { recreate_missing } => {
            let path = if *recreate_missing {
                "/v1/bootstrap?recreate_missing=true"
            } else {
                "/v1/bootstrap"
            };
            let report: BootstrapReport = client.call_as(Method::Post, path, None)?;
            output::print_bootstrap(out, &report);
        }
        Command::CreateTable {
            name,
            regions,
            if_not_exists,
            id,
        } => {
            // The id is chosen here when not given, so that a retry after a failover is the same request.
            let id = id
                .clone()
                .unwrap_or_else(|| ProcedureId::random().to_string());
            let body = json!({
                "name": name,
                "regions": regions,
                "if_not_exists": if_not_exists,
                "id": id,
                "wait": true,
            });
            let table: TableRegions = client.call_as(Method::Post, "/v1/tables", Some(&body))?;
            output::print_table(out, &table);
        }
        Command::OpenRegions { datanode, replay } => {
            if *replay {
                return Err(Failure::Refused(
                    "open-regions --replay reads the WAL where walctl runs; it cannot run with --server (run it \
                     without --server on the datanode's host)"
                        .to_string(),
                ));
            }
            let open: OpenRequests = client.call_as(
                Method::Get,
                &format!("/v1/datanodes/{datanode}/open-requests"),
                None,
            )?;
            output::print_open_regions(out, *datanode, &open, None);
        }
        Command::Procedures(command) => procedures(client, command, out)?,
        Command::DropTable { name, if_exists } => {
            let table = remote_wal::metasrv::parse_table_name(name)
                .map_err(|e| Failure::Refused(e.to_string()))?;
            let path = format!(
                "/v1/tables/{}{}",
                segment(&table.to_string()),
                if *if_exists { "?if_exists=true" } else { "" }
            );
            let output: serde_json::Value = client.call_as(Method::Delete, &path, None)?;
            output::print_drop(out, &table.to_string(), &output);
        }
        Command::MigrateRegion {
            region,
            to,
            no_wait,
        } => {
            let body = json!({ "to": to, "wait": !no_wait });
            let answer: serde_json::Value = client.call_as(
                Method::Post,
                &format!("/v1/regions/{region}/migrate"),
                Some(&body),
            )?;
            output::print_migration(out, *region, *to, &answer);
        }
        Command::Failover(command @ crate::failover::FailoverCommand::Status) => {
            let status: remote_wal::metasrv::FailoverStatus =
                client.call_as(Method::Get, command.path(), None)?;
            crate::failover::print_status(out, &status);
        }
        Command::Failover(command) => {
            #[derive(serde::Deserialize)]
            struct Toggled {
                was_paused: bool,
            }
            let toggled: Toggled = client.call_as(Method::Post, command.path(), None)?;
            crate::failover::print_toggle(out, command, toggled.was_paused);
        }
        Command::Topics => {
            let report: TopicsReport = client.call_as(Method::Get, "/v1/topics", None)?;
            output::print_topics(out, &report);
        }
        Command::Wal(WalCommand::Prune { topic }) => {
            let round: PruneRoundOutput = client.call_as(
                Method::Post,
                "/v1/wal/prune",
                Some(&json!({ "topic": topic })),
            )?;
            crate::wal::print_prune(out, &round);
            if let Some(error) = crate::wal::prune_failure(&round) {
                return Err(error.into());
            }
        }
        Command::Wal(command @ WalCommand::Stats) => {
            return Err(Failure::Refused(format!(
                "wal {} reads the topics' offsets where walctl runs; it cannot run with --server (run it without \
                 --server)",
                command.name()
            )));
        }
        Command::Bench(_) => {
            return Err(Failure::Refused(
                "bench ddl measures the metasrv where walctl runs; it cannot run with --server (run it without \
                 --server)"
                    .to_string(),
            ));
        }
        // Never sent here: main runs them with a router of their own.
        Command::Load(_) | Command::Region(_) | Command::Wal(WalCommand::Flush { .. }) => {
            return Err(Failure::Refused(
                "load, region and wal flush reach the datanodes themselves".to_string(),
            ));
        }
        Command::Datanode => {
            return Err(Failure::Refused(
                "--server does not apply to datanode (its metasrv servers are [datanode] metasrv)"
                    .to_string(),
            ));
        }
        Command::Serve { .. } => {
            return Err(Failure::Refused(
                "--server does not apply to serve (a server is configured by --config and --listen)".to_string(),
            ));
        }
    }
    Ok(())
}

fn procedures(
    client: &mut Client,
    command: &ProceduresCommand,
    out: &mut Output,
) -> Result<(), Failure> {
    #[derive(serde::Deserialize)]
    struct List {
        procedures: Vec<ProcedureInfo>,
        next: Option<String>,
        matched: usize,
    }
    match command {
        ProceduresCommand::List(args) => {
            let params = [
                ("limit", &args.limit),
                ("after", &args.after),
                ("state", &args.state),
                ("type", &args.type_name),
            ];
            let query: Vec<String> = params
                .iter()
                .filter_map(|(name, value)| {
                    value.as_ref().map(|v| format!("{name}={}", segment(v)))
                })
                .collect();
            let path = if query.is_empty() {
                "/v1/procedures".to_string()
            } else {
                format!("/v1/procedures?{}", query.join("&"))
            };
            let list: List = client.call_as(Method::Get, &path, None)?;
            output::print_procedure_page(out, &list.procedures, list.next.as_deref(), list.matched);
        }
        ProceduresCommand::Show { id } => {
            let info: ProcedureInfo = client.call_as(
                Method::Get,
                &format!("/v1/procedures/{}", segment(id)),
                None,
            )?;
            output::print_procedure(out, &info);
        }
        // The server's manager knows which keys are held and awaited (the store holds only the declared ones).
        ProceduresCommand::Locks => {
            #[derive(serde::Deserialize)]
            struct Entry {
                procedure_id: ProcedureId,
                held: Vec<HeldKey>,
                waiting: Option<LockWait>,
            }
            #[derive(serde::Deserialize)]
            struct Locks {
                locks: Vec<Entry>,
            }
            let list: Locks = client.call_as(Method::Get, "/v1/locks", None)?;
            let locks: Vec<ProcedureLocks> = list
                .locks
                .into_iter()
                .map(|e| ProcedureLocks {
                    id: e.procedure_id,
                    held: e.held,
                    waiting: e.waiting,
                })
                .collect();
            output::print_live_locks(out, &locks);
        }
        ProceduresCommand::Cancel { id } => {
            control(client, Some(id), ControlOp::Cancel)?;
            output::print_control(out, Some(id), ControlOp::Cancel);
        }
        ProceduresCommand::Pause { id, .. } => {
            control(client, id.as_deref(), ControlOp::Pause)?;
            output::print_control(out, id.as_deref(), ControlOp::Pause);
        }
        ProceduresCommand::Resume { id, .. } => {
            control(client, id.as_deref(), ControlOp::Resume)?;
            output::print_control(out, id.as_deref(), ControlOp::Resume);
        }
        ProceduresCommand::Purge { id, yes } => {
            let path = format!("/v1/procedures/{}", segment(id));
            let info: ProcedureInfo = client.call_as(Method::Get, &path, None)?;
            if !*yes {
                confirm_purge(id, &crate::purge_subject(&info))?;
            }
            client.call(Method::Delete, &path, None)?;
            output::print_purged(out, id);
        }
    }
    Ok(())
}

fn control(client: &mut Client, id: Option<&str>, op: ControlOp) -> Result<(), Failure> {
    let path = match id {
        Some(id) => format!("/v1/procedures/{}/{}", segment(id), op.as_str()),
        None => format!("/v1/procedures/{}", op.as_str()),
    };
    client.call(Method::Post, &path, None)?;
    Ok(())
}
