//! What walctl prints on stdout: text (tables by `comfy-table`) or, with `--json`, one JSON object per line
//! serialized from the library's report types.

use std::io::Write;
use std::time::Duration;

use comfy_table::{CellAlignment, ColumnConstraint, Table};
use datanode::replay::RegionReplayOutcome;
use procedures::{HeldKey, LockWait, ProcedureEvent, ProcedureInfo};
use remote_wal::datanode::{OpenRegions, RegionOpenRequest};
use remote_wal::metasrv::{
    BootstrapReport, RegionPlacement, RegionSpread, TableRegions, TopicUsage, TopicsReport,
};
use remote_wal::wal::WAL_OPTIONS_KEY;
use remote_wal::wal::kafka::TopicConfigDrift;
use serde::Serialize;

/// Writes results to stdout; a closed pipe (`walctl ... | head`) ends output quietly.
pub struct Output {
    json: bool,
    closed: bool,
}

impl Output {
    /// Text output, or JSON lines when `json`.
    pub fn new(json: bool) -> Self {
        Output {
            json,
            closed: false,
        }
    }

    /// Whether results are printed as JSON lines (`--json`).
    pub fn is_json(&self) -> bool {
        self.json
    }

    /// One line of text.
    pub fn line(&mut self, s: &str) {
        if self.closed {
            return;
        }
        let mut stdout = std::io::stdout().lock();
        if writeln!(stdout, "{s}").is_err() {
            self.closed = true;
        }
    }

    /// One JSON object on its own line. Keys come out in sorted order (serde_json's map), which is the order
    /// walctl has always printed.
    pub fn json_line(&mut self, value: &impl Serialize) {
        match serde_json::to_value(value) {
            Ok(value) => self.line(&value.to_string()),
            // The report types hold strings, numbers and maps with string keys: they always serialize.
            Err(e) => eprintln!("walctl: cannot serialize a result line: {e}"),
        }
    }

    /// Left-aligned columns two spaces apart, no borders; trailing blanks are trimmed.
    pub fn table(&mut self, header: &[&str], rows: Vec<Vec<String>>) {
        let table = plain_table(Some(header), rows);
        for line in table.lines() {
            self.line(line.trim_end());
        }
    }
}

/// A borderless table whose columns are separated by two spaces.
fn plain_table(header: Option<&[&str]>, rows: Vec<Vec<String>>) -> Table {
    let mut table = Table::new();
    table.load_preset(comfy_table::presets::NOTHING);
    if let Some(header) = header {
        table.set_header(header.to_vec());
    }
    for row in rows {
        table.add_row(row);
    }
    let last = table.column_count().saturating_sub(1);
    for (i, column) in table.column_iter_mut().enumerate() {
        column.set_padding((0, if i == last { 0 } else { 2 }));
        column.set_cell_alignment(CellAlignment::Left);
        column.set_constraint(ColumnConstraint::ContentWidth);
    }
    table
}

/// Collapses a multi-line message to one line.
pub fn one_line(s: &str) -> String {
    s.split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Warns on stderr, one line each, of pool topics whose configs differ from `[wal] topic_config` (in both output
/// modes: stdout keeps the result).
fn warn_config_drift(drift: &[TopicConfigDrift]) {
    for d in drift {
        eprintln!("warning: {d}");
    }
}

/// `walctl bootstrap`'s result.
pub fn print_bootstrap(out: &mut Output, report: &BootstrapReport) {
    warn_config_drift(&report.config_drift);
    if out.json {
        out.json_line(report);
    } else if let Some(prefix) = &report.topic_name_prefix {
        let recreated = match report.recreated_topics {
            0 => String::new(),
            n => format!(" ({n} missing on the brokers were recreated)"),
        };
        out.line(&format!(
            "Kafka topic pool '{prefix}' ready: {} topics, all on the brokers and persisted{recreated}",
            report.num_topics
        ));
    } else {
        out.line(
            "WAL provider is raft_engine: no topics to create, regions use their datanode's local WAL",
        );
    }
}

/// One region of a created table, as a JSON line.
#[derive(Serialize)]
struct RegionLine<'a> {
    table: &'a str,
    table_id: u32,
    #[serde(flatten)]
    region: &'a RegionPlacement,
}

/// `walctl create-table`'s result.
pub fn print_table(out: &mut Output, table: &TableRegions) {
    if out.json {
        for region in &table.regions {
            out.json_line(&RegionLine {
                table: &table.table,
                table_id: table.table_id,
                region,
            });
        }
        return;
    }
    out.line(&format!(
        "table {} id {} with {} regions",
        table.table,
        table.table_id,
        table.regions.len()
    ));
    let rows = table
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
    out.table(&["REGION", "REGION_ID", "DATANODE", "WAL_OPTIONS"], rows);
}

/// One open request or one per-region error of `walctl open-regions`, as a JSON line.
#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum OpenLine<'a> {
    Request {
        datanode_id: u64,
        region_id: u64,
        engine: &'a str,
        region_dir: &'a str,
        wal_options: Option<&'a String>,
        options: &'a std::collections::BTreeMap<String, String>,
        /// With `--replay`: entries replayed.
        #[serde(skip_serializing_if = "Option::is_none")]
        entries_replayed: Option<u64>,
        /// With `--replay`: their bytes.
        #[serde(skip_serializing_if = "Option::is_none")]
        bytes_replayed: Option<u64>,
        /// With `--replay`: why the region's WAL could not be replayed.
        #[serde(skip_serializing_if = "Option::is_none")]
        replay_error: Option<String>,
    },
    Error {
        datanode_id: u64,
        key: &'a str,
        region_id: Option<u64>,
        error: String,
    },
}

/// A region (or record) that cannot be opened, its error as text: what `open-regions` prints, from the store
/// (embedded) or from a server's answer (`--server`).
#[derive(Debug, serde::Deserialize)]
pub struct OpenError {
    /// The datanode table key of the record.
    pub key: String,
    /// The region, when the record decoded far enough to name it.
    pub region_id: Option<u64>,
    /// What is wrong.
    pub error: String,
}

/// What `open-regions` prints: the open requests of a datanode and the regions that cannot be opened.
#[derive(Debug, serde::Deserialize)]
pub struct OpenRequests {
    /// One request per openable region.
    pub requests: Vec<RegionOpenRequest>,
    /// One error per region (or record) that cannot be opened.
    pub errors: Vec<OpenError>,
}

impl From<&OpenRegions> for OpenRequests {
    fn from(open: &OpenRegions) -> Self {
        OpenRequests {
            requests: open.requests.clone(),
            errors: open
                .errors
                .iter()
                .map(|e| OpenError {
                    key: e.key.clone(),
                    region_id: e.region_id,
                    error: e.error.to_string(),
                })
                .collect(),
        }
    }
}

/// `walctl open-regions`'s result; with `--replay`, each region's replay outcome and the time the replay took.
pub fn print_open_regions(
    out: &mut Output,
    datanode_id: u64,
    open: &OpenRequests,
    replayed: Option<&(Vec<RegionReplayOutcome>, Duration)>,
) {
    let outcome = |region_id: u64| {
        replayed.and_then(|(list, _)| list.iter().find(|o| o.region_id == region_id))
    };
    if out.json {
        for r in &open.requests {
            let o = outcome(r.region_id);
            out.json_line(&OpenLine::Request {
                datanode_id,
                region_id: r.region_id,
                engine: &r.engine,
                region_dir: &r.region_dir,
                wal_options: r.options.get(WAL_OPTIONS_KEY),
                options: &r.options,
                entries_replayed: o.map(|o| o.entries_replayed),
                bytes_replayed: o.map(|o| o.bytes_replayed),
                replay_error: o.and_then(|o| o.error.as_ref().map(|e| one_line(&e.to_string()))),
            });
        }
        for e in &open.errors {
            out.json_line(&OpenLine::Error {
                datanode_id,
                key: &e.key,
                region_id: e.region_id,
                error: one_line(&e.error),
            });
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
            let mut row = vec![
                r.region_id.to_string(),
                r.engine.clone(),
                r.region_dir.clone(),
                r.options.get(WAL_OPTIONS_KEY).cloned().unwrap_or_default(),
            ];
            if replayed.is_some() {
                let o = outcome(r.region_id);
                row.push(o.map_or(String::new(), |o| o.entries_replayed.to_string()));
                row.push(o.map_or(String::new(), |o| o.bytes_replayed.to_string()));
            }
            row
        })
        .collect();
    if !rows.is_empty() {
        let mut header = vec!["REGION_ID", "ENGINE", "REGION_DIR", "WAL_OPTIONS"];
        if replayed.is_some() {
            header.extend(["ENTRIES_REPLAYED", "BYTES_REPLAYED"]);
        }
        out.table(&header, rows);
    }
    if let Some((list, took)) = replayed {
        let entries: u64 = list.iter().map(|o| o.entries_replayed).sum();
        let bytes: u64 = list.iter().map(|o| o.bytes_replayed).sum();
        out.line(&format!(
            "replayed {entries} entries ({bytes} bytes) of {} regions in {} ms",
            list.len(),
            took.as_millis()
        ));
        for o in list {
            if let Some(e) = &o.error {
                out.line(&format!("error: {}", one_line(&e.to_string())));
            }
        }
    }
    for e in &open.errors {
        let region = e
            .region_id
            .map(|r| format!(" region {r}"))
            .unwrap_or_default();
        out.line(&format!("error: {}{region}: {}", e.key, one_line(&e.error)));
    }
}

fn age_ms(info: &ProcedureInfo) -> u64 {
    procedures::record::now_ms().saturating_sub(info.created_at_ms)
}

fn format_age(ms: u64) -> String {
    humantime::format_duration(Duration::from_secs(ms / 1000)).to_string()
}

/// A procedure as a JSON line: its info, with the type under `type`, the state as its name and the age added. The
/// introspection fields follow: what the record holds (step name, declared lock keys; events only for `show`) and
/// the live fields of a running manager, which a read of the store cannot know (`attempt` 0, the others null or
/// empty).
#[derive(Serialize)]
struct ProcedureLine<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    type_name: &'a str,
    parent_id: Option<&'a str>,
    state: &'a str,
    step: u64,
    created_at_ms: u64,
    updated_at_ms: u64,
    age_ms: u64,
    error: Option<&'a str>,
    output: Option<&'a serde_json::Value>,
    step_name: Option<&'a str>,
    attempt: u32,
    last_error: Option<&'a str>,
    next_retry_at_ms: Option<u64>,
    step_ms: Option<u64>,
    total_ms: u64,
    lock_keys: &'a [HeldKey],
    locks_held: &'a [HeldKey],
    lock_wait: Option<&'a LockWait>,
    #[serde(skip_serializing_if = "Option::is_none")]
    events: Option<&'a [ProcedureEvent]>,
}

impl<'a> From<&'a ProcedureInfo> for ProcedureLine<'a> {
    fn from(info: &'a ProcedureInfo) -> Self {
        let now = procedures::record::now_ms();
        ProcedureLine {
            id: info.id.as_str(),
            type_name: &info.type_name,
            parent_id: info.parent_id.as_ref().map(|p| p.as_str()),
            state: info.state.as_str(),
            step: info.step,
            created_at_ms: info.created_at_ms,
            updated_at_ms: info.updated_at_ms,
            age_ms: age_ms(info),
            error: info.error.as_deref(),
            output: info.output.as_ref(),
            step_name: info.step_name.as_deref(),
            attempt: info.attempt,
            last_error: info.last_error.as_deref(),
            next_retry_at_ms: info.next_retry_at_ms,
            step_ms: info.step_ms(now),
            total_ms: info.total_ms(now),
            lock_keys: &info.lock_keys,
            locks_held: &info.locks_held,
            lock_wait: info.lock_wait.as_ref(),
            events: None,
        }
    }
}

/// `walctl drop-table`'s result: the procedure's output (`{"table_id","dropped","regions"}`).
pub fn print_drop(out: &mut Output, table: &str, output: &serde_json::Value) {
    if out.json {
        out.json_line(output);
        return;
    }
    match (output["dropped"].as_bool(), output["table_id"].as_u64()) {
        (Some(true), Some(id)) => out.line(&format!(
            "table {table} id {id} dropped ({} regions)",
            output["regions"].as_u64().unwrap_or(0)
        )),
        _ => out.line(&format!("table {table} does not exist; nothing dropped")),
    }
}

/// `walctl migrate-region`'s result: the procedure's output (`{"region_id","from","to","epoch","procedure_id"}`),
/// or, without waiting, `{"procedure_id"}`.
pub fn print_migration(out: &mut Output, region: u64, to: u64, answer: &serde_json::Value) {
    if out.json {
        out.json_line(answer);
        return;
    }
    let id = answer["procedure_id"].as_str().unwrap_or("-");
    match (answer["from"].as_u64(), answer["epoch"].as_u64()) {
        (Some(from), Some(epoch)) if from == to => out.line(&format!(
            "region {region}: already on datanode {to} (epoch {epoch}); procedure {id}"
        )),
        (Some(from), Some(epoch)) => out.line(&format!(
            "region {region}: moved from datanode {from} to datanode {to}, leading at epoch {epoch}; procedure {id}"
        )),
        _ => out.line(&format!(
            "region {region}: migration to datanode {to} submitted; procedure {id} (walctl procedures show {id})"
        )),
    }
}

/// `walctl procedures list`'s page: the procedures, then, when more matched than shown, how many and the command
/// for the next page (as JSON, a last line `{"next": CURSOR, "matched": N}`).
pub fn print_procedure_page(
    out: &mut Output,
    list: &[ProcedureInfo],
    next: Option<&str>,
    matched: usize,
) {
    print_procedures(out, list);
    let Some(next) = next else {
        return;
    };
    if out.json {
        out.json_line(&serde_json::json!({ "next": next, "matched": matched }));
    } else {
        out.line(&format!(
            "{} of {matched} shown, newest first; the next page: --after '{}'",
            list.len(),
            next.replace('\'', "'\\''")
        ));
    }
}

/// Procedures as a table (or one JSON line each).
pub fn print_procedures(out: &mut Output, list: &[ProcedureInfo]) {
    if out.json {
        for info in list {
            out.json_line(&ProcedureLine::from(info));
        }
        return;
    }
    if list.is_empty() {
        out.line("no procedures");
        return;
    }
    let rows = list
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
    out.table(&["ID", "TYPE", "STATE", "STEP", "AGE", "ERROR"], rows);
}

/// `walctl procedures show`'s result.
pub fn print_procedure(out: &mut Output, info: &ProcedureInfo) {
    if out.json {
        let mut line = ProcedureLine::from(info);
        line.events = Some(&info.events);
        out.json_line(&line);
        return;
    }
    let now = procedures::record::now_ms();
    let dash = || "-".to_string();
    let ms = |ms: u64| humantime::format_duration(Duration::from_millis(ms)).to_string();
    let keys = |keys: &[HeldKey]| {
        if keys.is_empty() {
            return dash();
        }
        keys.iter()
            .map(|k| format!("{} ({})", k.key, mode(k.exclusive)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let fields = vec![
        vec!["id".to_string(), info.id.to_string()],
        vec!["type".to_string(), info.type_name.clone()],
        vec![
            "parent".to_string(),
            info.parent_id
                .as_ref()
                .map(|p| p.to_string())
                .unwrap_or_else(dash),
        ],
        vec!["state".to_string(), info.state.to_string()],
        vec!["step".to_string(), info.step.to_string()],
        vec!["age".to_string(), format_age(age_ms(info))],
        vec![
            "output".to_string(),
            info.output
                .as_ref()
                .map(|o| o.to_string())
                .unwrap_or_else(dash),
        ],
        vec![
            "error".to_string(),
            info.error.as_deref().map(one_line).unwrap_or_else(dash),
        ],
        vec![
            "step name".to_string(),
            info.step_name.clone().unwrap_or_else(dash),
        ],
        vec![
            "attempt".to_string(),
            match info.attempt {
                0 => dash(),
                n => n.to_string(),
            },
        ],
        vec![
            "last error".to_string(),
            info.last_error
                .as_deref()
                .map(one_line)
                .unwrap_or_else(dash),
        ],
        vec![
            "next retry".to_string(),
            info.next_retry_at_ms
                .map(|at| format!("in {}", ms(at.saturating_sub(now))))
                .unwrap_or_else(dash),
        ],
        vec![
            "in step".to_string(),
            info.step_ms(now).map(ms).unwrap_or_else(dash),
        ],
        vec!["total".to_string(), ms(info.total_ms(now))],
        vec!["lock keys".to_string(), keys(&info.lock_keys)],
        vec!["locks held".to_string(), keys(&info.locks_held)],
        vec![
            "waiting for".to_string(),
            info.lock_wait
                .as_ref()
                .map(|w| {
                    format!(
                        "lock '{}' ({}), in its way: {}",
                        w.key,
                        mode(w.exclusive),
                        w.blocked_by
                    )
                })
                .unwrap_or_else(dash),
        ],
    ];
    let table = plain_table(None, fields);
    for line in table.lines() {
        out.line(line.trim_end());
    }
    out.line("");
    if info.events.is_empty() {
        out.line("no events recorded");
        return;
    }
    let rows = info
        .events
        .iter()
        .map(|e| {
            vec![
                humantime::format_rfc3339_millis(
                    std::time::UNIX_EPOCH + Duration::from_millis(e.at_ms),
                )
                .to_string(),
                one_line(&e.kind.to_string()),
            ]
        })
        .collect();
    out.table(&["AT", "EVENT"], rows);
}

fn mode(exclusive: bool) -> &'static str {
    if exclusive { "exclusive" } else { "shared" }
}

/// One declared lock key of `walctl procedures locks`.
#[derive(Serialize)]
struct LockLine<'a> {
    id: &'a str,
    state: &'a str,
    key: &'a str,
    exclusive: bool,
    /// Always `"declared"` here: held or awaited is known only to the running manager.
    status: &'static str,
}

/// What `walctl procedures locks` says about where its answer comes from.
pub const LOCKS_SOURCE_NOTE: &str = "lock keys declared by unfinished procedures, as their records hold them; \
    which keys are held and which are awaited (and by whom) is live state of the running procedure manager, never \
    written to the store (`walctl --server URL procedures locks` asks a running server for it)";

/// `walctl procedures locks`'s result: the lock keys every unfinished procedure declares.
pub fn print_locks(out: &mut Output, list: &[ProcedureInfo]) {
    let unfinished = list.iter().filter(|p| !p.state.is_finished());
    if out.json {
        for info in unfinished {
            for k in &info.lock_keys {
                out.json_line(&LockLine {
                    id: info.id.as_str(),
                    state: info.state.as_str(),
                    key: &k.key,
                    exclusive: k.exclusive,
                    status: "declared",
                });
            }
        }
        return;
    }
    out.line(&format!("# {LOCKS_SOURCE_NOTE}"));
    let rows: Vec<Vec<String>> = unfinished
        .flat_map(|info| {
            info.lock_keys.iter().map(move |k| {
                vec![
                    k.key.clone(),
                    mode(k.exclusive).to_string(),
                    info.id.to_string(),
                    info.state.to_string(),
                ]
            })
        })
        .collect();
    if rows.is_empty() {
        out.line("no unfinished procedure declares a lock key");
        return;
    }
    out.table(&["KEY", "MODE", "PROCEDURE", "STATE"], rows);
}

/// One held or awaited lock key of `walctl --server … procedures locks`.
#[derive(Serialize)]
struct LiveLockLine<'a> {
    id: &'a str,
    key: &'a str,
    exclusive: bool,
    /// `"held"` or `"awaited"`.
    status: &'static str,
    /// For an awaited key: the procedure in its way (`null` for a held key).
    blocked_by: Option<&'a str>,
    /// For an awaited key: whether `blocked_by` holds the key (`false`: it is queued ahead); `null` for a held key.
    blocker_holds: Option<bool>,
}

/// What `walctl --server … procedures locks` says about where its answer comes from.
pub const LIVE_LOCKS_SOURCE_NOTE: &str =
    "lock keys held and awaited now, as the procedure manager of the leading server sees them";

/// `walctl --server … procedures locks`'s result: every key a procedure of the server's manager holds, and the key
/// each waiting procedure awaits with the procedure in its way.
pub fn print_live_locks(out: &mut Output, locks: &[procedures::ProcedureLocks]) {
    if out.json {
        for l in locks {
            for k in &l.held {
                out.json_line(&LiveLockLine {
                    id: l.id.as_str(),
                    key: &k.key,
                    exclusive: k.exclusive,
                    status: "held",
                    blocked_by: None,
                    blocker_holds: None,
                });
            }
            if let Some(w) = &l.waiting {
                out.json_line(&LiveLockLine {
                    id: l.id.as_str(),
                    key: &w.key,
                    exclusive: w.exclusive,
                    status: "awaited",
                    blocked_by: Some(w.blocked_by.as_str()),
                    blocker_holds: Some(w.blocker_holds),
                });
            }
        }
        return;
    }
    out.line(&format!("# {LIVE_LOCKS_SOURCE_NOTE}"));
    let mut rows: Vec<Vec<String>> = Vec::new();
    for l in locks {
        for k in &l.held {
            rows.push(vec![
                k.key.clone(),
                mode(k.exclusive).to_string(),
                l.id.to_string(),
                "held".to_string(),
                String::new(),
            ]);
        }
        if let Some(w) = &l.waiting {
            let how = if w.blocker_holds {
                "holds it"
            } else {
                "queued ahead"
            };
            rows.push(vec![
                w.key.clone(),
                mode(w.exclusive).to_string(),
                l.id.to_string(),
                "awaited".to_string(),
                format!("{} ({how})", w.blocked_by),
            ]);
        }
    }
    if rows.is_empty() {
        out.line("no procedure holds or awaits a lock key");
        return;
    }
    out.table(&["KEY", "MODE", "PROCEDURE", "STATUS", "BLOCKED BY"], rows);
}

/// A control request written: `{"requested":"cancel","id":"…"}` (`"id":null` for every procedure).
pub fn print_control(out: &mut Output, id: Option<&str>, op: procedures::ControlOp) {
    #[derive(Serialize)]
    struct Requested<'a> {
        requested: &'a str,
        id: Option<&'a str>,
    }
    if out.json {
        out.json_line(&Requested {
            requested: op.as_str(),
            id,
        });
        return;
    }
    let what = match id {
        Some(id) => format!("procedure {id}"),
        None => "every procedure".to_string(),
    };
    let when = match op {
        procedures::ControlOp::Cancel => {
            "its manager stops it, interrupting the step in progress, and rolls it back if it can"
        }
        procedures::ControlOp::Pause => {
            "its manager pauses it, interrupting the step in progress (run again on resume)"
        }
        procedures::ControlOp::Resume => "its manager resumes it",
    };
    out.line(&format!(
        "{} of {what} requested: {when} (a manager running now, or the next one to start)",
        op.as_str()
    ));
}

/// `walctl procedures purge`'s result.
pub fn print_purged(out: &mut Output, id: &str) {
    #[derive(Serialize)]
    struct Purged<'a> {
        purged: &'a str,
    }
    if out.json {
        out.json_line(&Purged { purged: id });
    } else {
        out.line(&format!("procedure {id} purged from the state store"));
    }
}

/// One topic's JSON line of `walctl topics`: the topic's own fields and the pool's spread.
#[derive(Serialize)]
struct TopicLine<'a> {
    #[serde(flatten)]
    topic: &'a TopicUsage,
    /// The pool's regions per topic (the same on every line).
    pool_spread: &'a RegionSpread,
}

/// `walctl topics`'s result.
pub fn print_topics(out: &mut Output, report: &TopicsReport) {
    warn_config_drift(&report.config_drift);
    if out.json {
        for t in &report.topics {
            out.json_line(&TopicLine {
                topic: t,
                pool_spread: &report.spread,
            });
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
    let spread = &report.spread;
    out.line(&format!(
        "Regions per pool topic: min {}, max {}, mean {:.2}",
        spread.min, spread.max, spread.mean
    ));
    let rows = report
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
    out.table(&["TOPIC", "REGIONS", "NOTE"], rows);
}
