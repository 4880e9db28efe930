//! The page's HTML, built from [`PageData`] with `write!` and [`escape`] on every value. No script: the page
//! refreshes itself with a meta refresh.

use std::fmt::Write;
use std::time::Duration;

use procedures::listing::Cursor;
use procedures::manager::ProcedureLocks;
use procedures::{ProcedureInfo, ProcedureState};
use remote_wal::metasrv::TopicsReport;
use remote_wal::wal::prune::round::TopicOutcome;

use super::chart::{Bar, bar_chart};
use super::escape::escape;
use super::{LastPrune, Leader, PageData, ProcedureSource, WalSection};
use crate::serve::leadership::BrokerCheck;

/// At most this many unfinished or failed procedures are shown; the rest are counted and linked.
const MAX_OPEN_ROWS: usize = 300;

/// Finished (done or cancelled) procedures shown per page.
const FINISHED_PER_PAGE: usize = 25;

/// Seconds between the page's own reloads.
pub const REFRESH_SECS: u64 = 5;

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}\
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}\
table{border-collapse:collapse}th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}\
th{background:#f2f2f2}td.error{max-width:40em;white-space:pre-wrap;word-break:break-word}\
tr.stuck td{background:#fff1f0}tr.state-retrying td{background:#fffbe6}\
p.error{color:#a8071a}code{font-size:.95em}\
rect.bar{fill:#4e79a7}rect.outside-pool{fill:#e15759}text{font-size:12px;font-family:monospace}";

/// The whole page.
pub fn render(data: &PageData) -> String {
    let mut html = String::with_capacity(8 * 1024);
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"refresh\" content=\"{REFRESH_SECS}\">\n\
         <title>walctl serve {}: procedures &amp; locks</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
         <h1>Procedures &amp; Locks</h1>\n",
        escape(&data.this_server)
    );
    cluster(&mut html, data);
    procedures(&mut html, data);
    locks(&mut html, data);
    datanodes(&mut html, data);
    wal(&mut html, &data.wal, data.last_prune.as_ref(), data.now_ms);
    let _ = write!(
        html,
        "<p class=\"footer\">Read at {} ms since the Unix epoch; this page reloads every {REFRESH_SECS} s. \
         The same data as JSON: <a href=\"/v1/procedures\">/v1/procedures</a>, <a href=\"/v1/locks\">/v1/locks</a>, \
         <a href=\"/v1/topics\">/v1/topics</a>, <a href=\"/v1/leader\">/v1/leader</a>.</p>\n</body>\n</html>\n",
        data.now_ms
    );
    html
}

/// Who this server is, who leads, and whether this server is ready.
fn cluster(html: &mut String, data: &PageData) {
    html.push_str("<section id=\"cluster\">\n");
    let role = match data.status.leading {
        Some(epoch) => format!("<strong id=\"role\">leader</strong> (epoch {epoch})"),
        None => "<strong id=\"role\">follower</strong>".to_string(),
    };
    let _ = writeln!(
        html,
        "<p id=\"this-server\">This server: <code>{}</code>, {role}</p>",
        escape(&data.this_server)
    );
    match &data.leader {
        Leader::Elected { address, epoch } => {
            let _ = writeln!(
                html,
                "<p id=\"leader\">Leader: <a href=\"http://{a}/\"><code>{a}</code></a>, epoch {epoch}</p>",
                a = escape(address)
            );
        }
        Leader::None => html.push_str("<p id=\"leader\">Leader: none elected now</p>\n"),
        Leader::Unknown(reason) => {
            let _ = writeln!(
                html,
                "<p id=\"leader\" class=\"error\">Leader: unknown, the election could not be read: {}</p>",
                escape(reason)
            );
        }
    }
    let readiness = if data.status.ready() {
        "ready: writes are served here"
    } else if data.status.leading.is_none() {
        "following: writes go to the leader"
    } else if !data.status.manager_started {
        "not ready: the procedure manager is recovering"
    } else {
        "not ready: the WAL topic pool is being readied"
    };
    let _ = writeln!(html, "<p id=\"readiness\">{readiness}</p>");
    if let Some(brokers) = &data.status.brokers {
        let (class, text) = match brokers {
            BrokerCheck::Ok => (
                "",
                "checked: every pool topic is on the brokers".to_string(),
            ),
            BrokerCheck::Unchecked => (
                "",
                "unchecked yet: new regions get topics of the pool as the metadata store holds it"
                    .to_string(),
            ),
            BrokerCheck::Failed(why) => (
                " class=\"error\"",
                format!(
                    "the last check failed, retried: {}; new regions get topics of the pool as the metadata \
                     store holds it, if it holds it whole",
                    escape(why)
                ),
            ),
        };
        let _ = writeln!(html, "<p id=\"brokers\"{class}>Kafka brokers: {text}</p>");
    }
    html.push_str("</section>\n");
}

/// Where a state sorts: stuck ones (stalled, failed, retrying) first, then rolling back, running, done.
fn rank(info: &ProcedureInfo) -> u8 {
    match info.state.as_str() {
        "stalled" => 0,
        "failed" => 1,
        "retrying" => 2,
        "rolling_back" => 3,
        "running" => 4,
        _ => 5,
    }
}

/// Whether a procedure needs an operator's look.
fn is_stuck(info: &ProcedureInfo) -> bool {
    rank(info) <= 2
}

fn format_ms(ms: u64) -> String {
    if ms < 1000 {
        return format!("{ms}ms");
    }
    humantime::format_duration(Duration::from_secs(ms / 1000)).to_string()
}

/// The procedure table, stuck ones first (then by state, newest first).
fn procedures(html: &mut String, data: &PageData) {
    html.push_str("<section id=\"procedures-section\">\n<h2>Procedures</h2>\n");
    let list = match &data.procedures {
        Ok(list) => list,
        Err(reason) => {
            let _ = writeln!(
                html,
                "<p class=\"error\">The procedures could not be read: {}</p>\n</section>",
                escape(reason)
            );
            return;
        }
    };
    match data.source {
        ProcedureSource::Manager => {
            html.push_str("<p class=\"source\">Live, from this server's procedure manager.</p>\n")
        }
        ProcedureSource::Store => {
            let leader = match &data.leader {
                Leader::Elected { address, .. } if data.status.leading.is_none() => format!(
                    "; attempts, next retries and stalls are on <a href=\"http://{a}/\">the leader's page</a>",
                    a = escape(address)
                ),
                _ => String::new(),
            };
            let _ = writeln!(
                html,
                "<p class=\"source\">From the store, as the leader last wrote them{leader}.</p>"
            );
        }
    }
    let count = |state: &str| list.iter().filter(|i| i.state.as_str() == state).count();
    let stuck = list.iter().filter(|i| is_stuck(i)).count();
    let _ = writeln!(
        html,
        "<p id=\"procedure-summary\">{} procedures, {stuck} stuck ({} stalled, {} failed, {} retrying)</p>",
        list.len(),
        count("stalled"),
        count("failed"),
        count("retrying"),
    );
    if list.is_empty() {
        html.push_str("<p id=\"no-procedures\">No procedures.</p>\n</section>\n");
        return;
    }
    // Unfinished and failed procedures first (stuck ones first), up to a bound; then one page of the finished
    // ones, newest first. A manager may retain tens of thousands of finished procedures, and the page refreshes
    // every few seconds: it must not answer all of them.
    let (mut open, mut finished): (Vec<&ProcedureInfo>, Vec<&ProcedureInfo>) = list
        .iter()
        .partition(|i| !matches!(i.state, ProcedureState::Done | ProcedureState::Cancelled));
    open.sort_by(|a, b| {
        rank(a)
            .cmp(&rank(b))
            .then(b.created_at_ms.cmp(&a.created_at_ms))
            .then(a.id.as_str().cmp(b.id.as_str()))
    });
    finished
        .sort_by(|a, b| (b.created_at_ms, b.id.as_str()).cmp(&(a.created_at_ms, a.id.as_str())));
    let cursor = data.finished_after.as_deref().map(str::parse::<Cursor>);
    if let Some(Err(e)) = &cursor {
        let _ = writeln!(
            html,
            "<p class=\"error\" id=\"bad-cursor\">The page of finished procedures asked for cannot be shown ({}); \
             showing the newest.</p>",
            escape(&e.to_string())
        );
    }
    let cursor = cursor.and_then(Result::ok);
    let older: Vec<&ProcedureInfo> = finished
        .iter()
        .copied()
        .filter(|i| cursor.as_ref().is_none_or(|c| c.precedes(i)))
        .collect();
    html.push_str(
        "<table id=\"procedures\">\n<thead><tr><th>id</th><th>type</th><th>state</th><th>step</th>\
         <th>attempts</th><th>age</th><th>last error</th></tr></thead>\n<tbody>\n",
    );
    for info in open.iter().take(MAX_OPEN_ROWS) {
        procedure_row(html, info, data);
    }
    for info in older.iter().take(FINISHED_PER_PAGE) {
        procedure_row(html, info, data);
    }
    html.push_str("</tbody>\n</table>\n");
    if open.len() > MAX_OPEN_ROWS {
        let _ = writeln!(
            html,
            "<p id=\"more-open\">{} more unfinished or failed procedures are not shown: \
             <a href=\"/v1/procedures?state=stalled,failed,retrying,rolling_back,running,paused&amp;limit=1000\">\
             /v1/procedures</a> lists them a page at a time.</p>",
            open.len() - MAX_OPEN_ROWS
        );
    }
    let shown = older.len().min(FINISHED_PER_PAGE);
    let _ = write!(
        html,
        "<p id=\"finished-paging\">Finished: {} of {} shown, newest first.",
        shown,
        finished.len()
    );
    if cursor.is_some() {
        html.push_str(" <a id=\"newest-finished\" href=\"/\">Newest</a>");
    }
    if older.len() > FINISHED_PER_PAGE {
        let next = Cursor::after(older[FINISHED_PER_PAGE - 1]).to_string();
        let encoded =
            percent_encoding::utf8_percent_encode(&next, percent_encoding::NON_ALPHANUMERIC);
        let _ = write!(
            html,
            " <a id=\"older-finished\" href=\"/?after={}\">Older</a>",
            escape(&encoded.to_string())
        );
    }
    html.push_str("</p>\n</section>\n");
}

fn procedure_row(html: &mut String, info: &ProcedureInfo, data: &PageData) {
    let state = info.state.as_str();
    let stuck = if is_stuck(info) { "stuck " } else { "" };
    let id = escape(info.id.as_str());
    let parent = info
        .parent_id
        .as_ref()
        .map(|p| {
            format!(
                "<div class=\"parent\">child of <code>{}</code></div>",
                escape(p.as_str())
            )
        })
        .unwrap_or_default();
    let step = match &info.step_name {
        Some(name) => format!("{} (#{})", escape(name), info.step),
        None => format!("#{}", info.step),
    };
    // A record read from the store does not know how often its step was tried.
    let attempts = match data.source {
        ProcedureSource::Manager => info.attempt.to_string(),
        ProcedureSource::Store => "–".to_string(),
    };
    let age = format_ms(data.now_ms.saturating_sub(info.created_at_ms));
    let retry = info
        .next_retry_at_ms
        .map(|at| {
            format!(
                "<div class=\"retry\">next attempt in {}</div>",
                format_ms(at.saturating_sub(data.now_ms))
            )
        })
        .unwrap_or_default();
    let error = info
        .last_error
        .as_deref()
        .or(info.error.as_deref())
        .map(|e| escape(e).to_string())
        .unwrap_or_default();
    let _ = writeln!(
        html,
        "<tr class=\"{stuck}state-{state}\" data-id=\"{id}\" data-state=\"{state}\"><td class=\"id\"><code>{id}</code>\
         {parent}</td><td class=\"type\">{}</td><td class=\"state\">{state}</td><td class=\"step\">{step}</td>\
         <td class=\"attempts\">{attempts}</td><td class=\"age\">{age}</td><td class=\"error\">{error}{retry}</td></tr>",
        escape(&info.type_name),
    );
}

/// The datanodes of the leader's registry: address, incarnation, last heartbeat, the failure detector's phi
/// (marked when suspected), regions and leases.
fn datanodes(html: &mut String, data: &PageData) {
    html.push_str("<section id=\"datanodes-section\">\n<h2>Datanodes</h2>\n");
    failover(html, data);
    let Some(nodes) = &data.datanodes else {
        html.push_str(
            "<p id=\"datanodes-elsewhere\">Datanodes register and heartbeat with the leader; see its page.</p>\n\
             </section>\n",
        );
        return;
    };
    if nodes.is_empty() {
        html.push_str("<p id=\"no-datanodes\">No datanode has registered with this leader yet.</p>\n</section>\n");
        return;
    }
    html.push_str(
        "<table id=\"datanodes\">\n<thead><tr><th>id</th><th>address</th><th>incarnation</th>\
         <th>last heartbeat</th><th>phi</th><th>regions (leading)</th><th>leases</th></tr></thead>\n<tbody>\n",
    );
    for n in nodes {
        let leading = n
            .regions
            .iter()
            .filter(|r| r.role == remote_wal::datanode::protocol::RegionRole::Leader)
            .count();
        let age = n
            .last_heartbeat_ms
            .map_or("never".to_string(), |ms| format!("{} ago", format_ms(ms)));
        let leases = match n.leases_in_ms {
            Some(ms) => format!("{} (held back {} more)", n.leases, format_ms(ms)),
            None => n.leases.to_string(),
        };
        let phi = if n.suspected {
            format!(
                "<strong class=\"suspected\">{:.2} suspected</strong>",
                n.phi
            )
        } else {
            format!("{:.2}", n.phi)
        };
        let _ = writeln!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{phi}</td><td>{} ({leading})</td><td>{}</td></tr>",
            n.id,
            escape(&n.address),
            n.incarnation,
            escape(&age),
            n.regions.len(),
            escape(&leases)
        );
    }
    html.push_str("</tbody>\n</table>\n");
    let lost: Vec<_> = nodes.iter().flat_map(|n| &n.wal_lost).collect();
    if !lost.is_empty() {
        html.push_str("<h3>Regions whose WAL tail was lost</h3>\n<ul id=\"wal-lost\">\n");
        for l in lost {
            let _ = writeln!(html, "<li>{}</li>", escape(&l.to_string()));
        }
        html.push_str("</ul>\n");
    }
    html.push_str("</section>\n");
}

/// Automatic failover: enabled, paused or disabled; the failed datanodes; the regions that cannot lead anywhere
/// until their datanode returns.
fn failover(html: &mut String, data: &PageData) {
    let Some(status) = &data.failover else {
        return;
    };
    let status = match status {
        Ok(status) => status,
        Err(reason) => {
            let _ = writeln!(
                html,
                "<p class=\"error\" id=\"failover\">Automatic failover's state could not be read: {}</p>",
                escape(reason)
            );
            return;
        }
    };
    let state = match (status.enabled, status.paused) {
        (false, _) => "disabled ([failover] enabled = false)",
        (true, true) => "paused (walctl failover resume)",
        (true, false) => "enabled",
    };
    let failed: Vec<String> = status
        .failed
        .iter()
        .map(|f| format!("{} (incarnation {})", f.datanode, f.incarnation))
        .collect();
    let _ = writeln!(
        html,
        "<p id=\"failover\">Automatic failover: {state}; failed datanodes: {}.</p>",
        if failed.is_empty() {
            "none".to_string()
        } else {
            failed.join(", ")
        }
    );
    if !status.unavailable_regions.is_empty() {
        let regions: Vec<String> = status
            .unavailable_regions
            .iter()
            .map(u64::to_string)
            .collect();
        let _ = writeln!(
            html,
            "<p class=\"error\" id=\"unavailable-regions\">Unavailable until their datanode returns (raft-engine \
             WAL): regions {}.</p>",
            regions.join(", ")
        );
    }
}

/// Held and awaited locks (the leader only: they live in its memory).
fn locks(html: &mut String, data: &PageData) {
    html.push_str("<section id=\"locks-section\">\n<h2>Locks</h2>\n");
    let Some(locks) = &data.locks else {
        let where_ = match &data.leader {
            Leader::Elected { address, .. } => format!(
                "; see <a href=\"http://{a}/\">the leader's page</a>",
                a = escape(address)
            ),
            _ => String::new(),
        };
        let _ = writeln!(
            html,
            "<p id=\"locks-elsewhere\">Locks live in the leader's memory{where_}.</p>\n</section>"
        );
        return;
    };
    let rows: Vec<&ProcedureLocks> = locks
        .iter()
        .filter(|l| !l.held.is_empty() || l.waiting.is_some())
        .collect();
    if rows.is_empty() {
        html.push_str(
            "<p id=\"no-locks\">No procedure holds or waits for a lock.</p>\n</section>\n",
        );
        return;
    }
    html.push_str(
        "<table id=\"locks\">\n<thead><tr><th>procedure</th><th>key</th><th>mode</th><th>status</th></tr></thead>\n\
         <tbody>\n",
    );
    let mode = |exclusive: bool| if exclusive { "exclusive" } else { "shared" };
    for l in rows {
        let id = escape(l.id.as_str());
        for key in &l.held {
            let _ = writeln!(
                html,
                "<tr class=\"held\" data-id=\"{id}\"><td><code>{id}</code></td><td><code>{}</code></td>\
                 <td>{}</td><td>held</td></tr>",
                escape(&key.key),
                mode(key.exclusive)
            );
        }
        if let Some(wait) = &l.waiting {
            let blocker = if wait.blocker_holds {
                "which holds it"
            } else {
                "queued ahead"
            };
            let _ = writeln!(
                html,
                "<tr class=\"waiting\" data-id=\"{id}\"><td><code>{id}</code></td><td><code>{}</code></td>\
                 <td>{}</td><td>waiting, behind <code>{}</code> ({blocker})</td></tr>",
                escape(&wait.key),
                mode(wait.exclusive),
                escape(wait.blocked_by.as_str()),
            );
        }
    }
    html.push_str("</tbody>\n</table>\n</section>\n");
}

/// The WAL provider, and for Kafka the regions per pool topic.
fn wal(html: &mut String, wal: &WalSection, last_prune: Option<&LastPrune>, now_ms: u64) {
    html.push_str("<section id=\"wal-section\">\n<h2>WAL</h2>\n");
    match wal {
        WalSection::RaftEngine => html.push_str(
            "<p id=\"wal-provider\">Provider: raft-engine (each datanode's local log; no topic pool).</p>\n",
        ),
        WalSection::Kafka(Err(reason)) => {
            let _ = writeln!(
                html,
                "<p id=\"wal-provider\">Provider: Kafka.</p>\n\
                 <p class=\"error\">The topic pool could not be read: {}</p>",
                escape(reason)
            );
        }
        WalSection::Kafka(Ok(report)) => kafka_pool(html, report),
    }
    if matches!(wal, WalSection::Kafka(_)) {
        prune_round(html, last_prune, now_ms);
    }
    html.push_str("</section>\n");
}

/// Rows of the last prune round's "held back" table: the topics whose holding region is furthest behind.
const HELD_ROWS: usize = 10;

/// The last prune round: its counts, the [`HELD_ROWS`] topics kept longest by the region with their lowest
/// checkpoint (a stale region pins its topic), and a row per topic it skipped or failed (pruned topics are
/// otherwise only counted: a pool has up to thousands).
fn prune_round(html: &mut String, last: Option<&LastPrune>, now_ms: u64) {
    let Some(last) = last else {
        html.push_str(
            "<p id=\"last-prune\">No WAL prune round has finished in the retained records.</p>\n",
        );
        return;
    };
    let (pruned, skipped, failed) = last.round.counts();
    let _ = writeln!(
        html,
        "<p id=\"last-prune\">Last WAL prune round <code>{}</code>, {} ago ({}): {pruned} topics pruned, \
         {skipped} skipped, {failed} failed.</p>",
        escape(&last.id),
        format_ms(now_ms.saturating_sub(last.finished_at_ms)),
        last.round.mode,
    );
    let behind = last.round.most_behind(HELD_ROWS);
    if !behind.is_empty() {
        html.push_str(
            "<table id=\"prune-held\">\n<tr><th>Topic</th><th>Held back by region</th>\
             <th>Entries kept for it</th></tr>\n",
        );
        for (topic, region, kept) in behind {
            let _ = writeln!(
                html,
                "<tr><td><code>{}</code></td><td>{region}</td><td>{kept}</td></tr>",
                escape(topic)
            );
        }
        html.push_str("</table>\n");
    }
    let notable: Vec<_> = last
        .round
        .topics
        .iter()
        .filter(|t| !matches!(t.outcome, TopicOutcome::Pruned { .. }))
        .collect();
    if notable.is_empty() {
        return;
    }
    html.push_str(
        "<table id=\"prune-topics\">\n<tr><th>Topic</th><th>Result</th><th>Why</th></tr>\n",
    );
    for t in notable {
        let (result, why) = match &t.outcome {
            TopicOutcome::Skipped {
                pruned_entry_id,
                reason,
                ..
            } => (format!("skipped at {pruned_entry_id}"), reason.clone()),
            TopicOutcome::Failed {
                step,
                error,
                retryable,
            } => (
                format!(
                    "failed at {step}{}",
                    if *retryable { " (transient)" } else { "" }
                ),
                error.clone(),
            ),
            TopicOutcome::Pruned { .. } => continue,
        };
        let class = if t.failed() { " class=\"error\"" } else { "" };
        let _ = writeln!(
            html,
            "<tr{class}><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
            escape(&t.topic),
            escape(&result),
            escape(&why)
        );
    }
    html.push_str("</table>\n");
}

fn kafka_pool(html: &mut String, report: &TopicsReport) {
    let _ = writeln!(
        html,
        "<p id=\"wal-provider\">Provider: Kafka, topic pool <code>{}</code>: {} topics configured, {} persisted; \
         regions per topic: min {}, max {}, mean {:.2}.</p>",
        escape(&report.topic_name_prefix),
        report.num_topics,
        report.persisted,
        report.spread.min,
        report.spread.max,
        report.spread.mean,
    );
    let bars: Vec<Bar<'_>> = report
        .topics
        .iter()
        .map(|t| Bar {
            topic: &t.topic,
            regions: t.regions,
            outside_pool: !t.in_pool,
        })
        .collect();
    html.push_str(&bar_chart(&bars));
    html.push('\n');
    if report.topics.iter().any(|t| !t.in_pool) {
        html.push_str("<p class=\"legend\">Red bars: topics regions use that the configured pool does not contain.</p>\n");
    }
    if !report.config_drift.is_empty() {
        let _ = writeln!(
            html,
            "<p id=\"config-drift\">{} pool topics have configs that differ from <code>[wal] topic_config</code> \
             (see <a href=\"/v1/topics\">/v1/topics</a>).</p>",
            report.config_drift.len()
        );
    }
}

#[cfg(test)]
mod tests {
    use procedures::ProcedureInfo;
    use procedures::manager::ProcedureLocks;
    use remote_wal::metasrv::{RegionSpread, TopicUsage, TopicsReport};
    use serde_json::json;

    use super::render;
    use crate::serve::leadership::Status;
    use crate::serve::page::{Leader, PageData, ProcedureSource, WalSection};

    const NOW: u64 = 1_000_000;

    fn info(id: &str, state: &str, created_at_ms: u64, error: Option<&str>) -> ProcedureInfo {
        serde_json::from_value(json!({
            "id": id, "type_name": "remote_wal::CreateTable", "parent_id": null, "state": state, "step": 2,
            "output": null, "error": error, "created_at_ms": created_at_ms, "updated_at_ms": created_at_ms,
            "step_name": "allocate", "attempt": 3, "last_error": null,
        }))
        .expect("a ProcedureInfo")
    }

    fn leader_data(procedures: Vec<ProcedureInfo>, locks: Vec<ProcedureLocks>) -> PageData {
        PageData {
            this_server: "10.0.0.1:3002".to_string(),
            status: Status {
                leading: Some(7),
                manager_started: true,
                pool_ready: true,
                brokers: None,
            },
            leader: Leader::Elected {
                address: "10.0.0.1:3002".to_string(),
                epoch: 7,
            },
            procedures: Ok(procedures),
            source: ProcedureSource::Manager,
            locks: Some(locks),
            wal: WalSection::RaftEngine,
            datanodes: Some(vec![remote_wal::metasrv::datanodes::DatanodeInfo {
                id: 3,
                address: "<b>dn</b>:4100".to_string(),
                incarnation: 2,
                last_heartbeat_ms: Some(400),
                regions: Vec::new(),
                leases: 0,
                leases_in_ms: Some(1500),
                phi: 9.25,
                suspected: true,
                wal_lost: vec![remote_wal::datanode::protocol::WalLost {
                    region_id: 4398046511105,
                    topic: "<i>t</i>".to_string(),
                    checkpoint: 40,
                    expected: remote_wal::key::topic_name::TopicId(1),
                    found: None,
                }],
            }]),
            now_ms: NOW,
            finished_after: None,
            last_prune: None,
            failover: Some(Ok(remote_wal::metasrv::FailoverStatus {
                enabled: true,
                paused: false,
                failed: vec![remote_wal::metasrv::FailedDatanode {
                    datanode: 3,
                    incarnation: 2,
                }],
                unavailable_regions: vec![4398046511104],
            })),
        }
    }

    /// 20,000 finished procedures and 3 stuck ones: the page shows the stuck ones and one page of the newest
    /// finished, counts them all, and its "Older" link leads to the next page, which starts just after it.
    #[test]
    fn twenty_thousand_finished_procedures_make_a_bounded_page_with_paging() {
        let mut list: Vec<ProcedureInfo> = (0..20_000u64)
            .map(|i| info(&format!("done-{i:05}"), "done", 1000 + i, None))
            .collect();
        list.push(info("failed-old", "failed", 10, Some("boom")));
        list.push(info("stalled", "stalled", 20, Some("no loader")));
        list.push(info("running", "running", 30, None));
        let mut data = leader_data(list, Vec::new());
        let html = render(&data);
        assert!(html.len() < 64 * 1024, "the page is {} bytes", html.len());
        let rows = row_ids(&html);
        let newest: Vec<String> = (0..25u64)
            .map(|i| format!("done-{:05}", 19_999 - i))
            .collect();
        assert_eq!(rows[..3], ["stalled", "failed-old", "running"]);
        assert_eq!(rows[3..], newest[..]);
        assert!(
            html.contains("20003 procedures, 2 stuck (1 stalled, 1 failed, 0 retrying)"),
            "{html}"
        );
        assert!(
            html.contains("Finished: 25 of 20000 shown, newest first."),
            "{html}"
        );
        assert!(!html.contains("id=\"newest-finished\""), "{html}");

        let start = html.find("id=\"older-finished\" href=\"/?after=").unwrap()
            + "id=\"older-finished\" href=\"/?after=".len();
        let end = html[start..].find('"').unwrap() + start;
        assert_eq!(&html[start..end], "20975%3Adone%2D19975");
        data.finished_after = Some("20975:done-19975".to_string());
        let html = render(&data);
        let rows = row_ids(&html);
        assert_eq!(rows[3], "done-19974");
        assert_eq!(rows.len(), 3 + 25);
        assert!(html.contains("id=\"newest-finished\" href=\"/\""), "{html}");

        data.finished_after = Some("nonsense".to_string());
        let html = render(&data);
        assert!(html.contains("id=\"bad-cursor\""), "{html}");
        assert_eq!(row_ids(&html)[3], "done-19999");
    }

    #[test]
    fn datanodes_show_with_their_address_escaped_and_their_held_back_leases() {
        let html = render(&leader_data(Vec::new(), Vec::new()));
        assert!(html.contains("<table id=\"datanodes\">"), "{html}");
        assert!(html.contains("&lt;b&gt;dn&lt;/b&gt;:4100"), "{html}");
        assert!(!html.contains("<b>dn</b>"), "{html}");
        assert!(html.contains("held back"), "{html}");
        assert!(
            html.contains("<strong class=\"suspected\">9.25 suspected</strong>"),
            "{html}"
        );
        assert!(
            html.contains(
                "<li>region 4398046511105: its WAL topic &#39;&lt;i&gt;t&lt;/i&gt;&#39; is not the incarnation"
            ) && html.contains("its entries after 40 were lost"),
            "{html}"
        );
        assert!(
            html.contains(
                "<p id=\"failover\">Automatic failover: enabled; failed datanodes: 3 (incarnation 2).</p>"
            ),
            "{html}"
        );
        assert!(html.contains("WAL): regions 4398046511104.</p>"), "{html}");
    }

    #[test]
    fn the_brokers_check_shows_with_the_failure_escaped_and_not_at_all_on_raft_engine() {
        let mut data = leader_data(Vec::new(), Vec::new());
        assert!(!render(&data).contains("id=\"brokers\""));
        data.status.brokers = Some(crate::serve::leadership::BrokerCheck::Unchecked);
        assert!(
            render(&data).contains("<p id=\"brokers\">Kafka brokers: unchecked yet"),
            "{}",
            render(&data)
        );
        data.status.brokers = Some(crate::serve::leadership::BrokerCheck::Failed(
            "cannot connect to <b>broker</b>".to_string(),
        ));
        let html = render(&data);
        assert!(
            html.contains("<p id=\"brokers\" class=\"error\">Kafka brokers: the last check failed")
                && html.contains("&lt;b&gt;broker&lt;/b&gt;")
                && !html.contains("<b>broker</b>"),
            "{html}"
        );
        data.status.brokers = Some(crate::serve::leadership::BrokerCheck::Ok);
        assert!(render(&data).contains("<p id=\"brokers\">Kafka brokers: checked"));
    }

    /// The `data-id` of each procedure row, in page order.
    fn row_ids(html: &str) -> Vec<String> {
        html.split("<tr class=\"")
            .skip(1)
            .filter_map(|row| {
                let start = row.find("data-id=\"")? + "data-id=\"".len();
                let end = row[start..].find('"')? + start;
                Some(row[start..end].to_string())
            })
            .collect()
    }

    #[test]
    fn stuck_procedures_come_first_then_by_state_newest_first() {
        let html = render(&leader_data(
            vec![
                info("done-old", "done", 10, None),
                info("running", "running", 20, None),
                info("retrying", "retrying", 30, Some("broker down")),
                info("done-new", "done", 40, None),
                info("failed", "failed", 50, Some("boom")),
                info("stalled", "stalled", 60, Some("no loader")),
            ],
            vec![],
        ));
        assert_eq!(
            row_ids(&html),
            [
                "stalled", "failed", "retrying", "running", "done-new", "done-old"
            ]
        );
        assert!(
            html.contains("6 procedures, 3 stuck (1 stalled, 1 failed, 1 retrying)"),
            "{html}"
        );
        assert!(
            html.contains(
                "<tr class=\"stuck state-stalled\" data-id=\"stalled\" data-state=\"stalled\"><td class=\"id\">\
                 <code>stalled</code></td><td class=\"type\">remote_wal::CreateTable</td><td class=\"state\">stalled\
                 </td><td class=\"step\">allocate (#2)</td><td class=\"attempts\">3</td><td class=\"age\">16m 39s</td>\
                 <td class=\"error\">no loader</td></tr>"
            ),
            "{html}"
        );
        assert!(html.contains("<strong id=\"role\">leader</strong> (epoch 7)"));
        assert!(html.contains("<meta http-equiv=\"refresh\" content=\"5\">"));
        assert!(html.contains("<p id=\"no-locks\">"), "{html}");
        assert!(html.contains(
            "<p id=\"wal-provider\">Provider: raft-engine (each datanode's local log; no topic pool).</p>"
        ));
    }

    #[test]
    fn every_client_value_is_escaped() {
        let html = render(&leader_data(
            vec![info(
                "<script>alert('id')</script>",
                "failed",
                10,
                Some("table \"<img src=x onerror=alert(1)>\" & more"),
            )],
            vec![],
        ));
        assert!(!html.contains("<script"), "{html}");
        assert!(!html.contains("<img"), "{html}");
        assert!(html.contains(
            "data-id=\"&lt;script&gt;alert(&#39;id&#39;)&lt;/script&gt;\" data-state=\"failed\""
        ));
        assert!(html.contains(
            "<td class=\"error\">table &quot;&lt;img src=x onerror=alert(1)&gt;&quot; &amp; more</td>"
        ));
    }

    #[test]
    fn held_and_awaited_locks_are_listed() {
        let locks: Vec<ProcedureLocks> = serde_json::from_value(json!([
            {"id": "a", "held": [{"key": "__table_name_lock/g/p/t", "exclusive": true},
                                 {"key": "__catalog_lock/g", "exclusive": false}], "waiting": null},
            {"id": "b", "held": [], "waiting": {"key": "__table_name_lock/g/p/t", "exclusive": true,
                                                "blocked_by": "a", "blocker_holds": true}},
            {"id": "idle", "held": [], "waiting": null},
        ]))
        .expect("locks");
        let html = render(&leader_data(vec![], locks));
        assert!(html.contains(
            "<tr class=\"held\" data-id=\"a\"><td><code>a</code></td><td><code>__table_name_lock/g/p/t</code></td>\
             <td>exclusive</td><td>held</td></tr>"
        ), "{html}");
        assert!(html.contains(
            "<tr class=\"held\" data-id=\"a\"><td><code>a</code></td><td><code>__catalog_lock/g</code></td>\
             <td>shared</td><td>held</td></tr>"
        ));
        assert!(html.contains(
            "<tr class=\"waiting\" data-id=\"b\"><td><code>b</code></td><td><code>__table_name_lock/g/p/t</code>\
             </td><td>exclusive</td><td>waiting, behind <code>a</code> (which holds it)</td></tr>"
        ));
        assert!(!html.contains("data-id=\"idle\""), "{html}");
        assert!(html.contains("<p id=\"no-procedures\">No procedures.</p>"));
    }

    #[test]
    fn a_follower_names_the_leader_and_reads_from_the_store() {
        let mut data = leader_data(vec![info("p", "running", 10, None)], vec![]);
        data.status = Status::default();
        data.this_server = "10.0.0.2:3002".to_string();
        data.source = ProcedureSource::Store;
        data.locks = None;
        let html = render(&data);
        assert!(html.contains(
            "<p id=\"this-server\">This server: <code>10.0.0.2:3002</code>, <strong id=\"role\">follower</strong></p>"
        ));
        assert!(html.contains(
            "<p id=\"leader\">Leader: <a href=\"http://10.0.0.1:3002/\"><code>10.0.0.1:3002</code></a>, epoch 7</p>"
        ));
        assert!(html.contains("<p id=\"readiness\">following: writes go to the leader</p>"));
        assert!(html.contains("<td class=\"attempts\">–</td>"), "{html}");
        assert!(html.contains("<p id=\"locks-elsewhere\">Locks live in the leader's memory; see"));
    }

    #[test]
    fn the_kafka_pool_is_drawn_one_bar_per_topic_and_an_unreadable_one_says_why() {
        let mut data = leader_data(vec![], vec![]);
        let topic = |topic: &str, regions: usize| TopicUsage {
            topic: topic.to_string(),
            regions,
            persisted: true,
            in_pool: true,
        };
        data.wal = WalSection::Kafka(Ok(TopicsReport {
            topic_name_prefix: "wal".to_string(),
            num_topics: 3,
            persisted: 3,
            topics: vec![topic("wal_0", 2), topic("wal_1", 2), topic("wal_2", 1)],
            spread: RegionSpread {
                min: 1,
                max: 2,
                mean: 5.0 / 3.0,
            },
            config_drift: vec![],
        }));
        let html = render(&data);
        assert_eq!(html.matches("<rect class=\"bar\"").count(), 3, "{html}");
        assert!(html.contains("data-topic=\"wal_2\" data-regions=\"1\""));
        assert!(html.contains(
            "topic pool <code>wal</code>: 3 topics configured, 3 persisted; regions per topic: min 1, max 2, mean 1.67."
        ));
        data.wal = WalSection::Kafka(Err("brokers <down>".to_string()));
        let html = render(&data);
        assert!(html.contains("The topic pool could not be read: brokers &lt;down&gt;"));
        assert!(!html.contains("<svg"));
    }

    #[test]
    fn the_last_prune_round_counts_its_topics_and_lists_the_skipped_and_failed_ones_escaped() {
        use remote_wal::wal::prune::round::WalPruneRound;

        let mut data = leader_data(vec![], vec![]);
        data.wal = WalSection::Kafka(Err("brokers down".to_string()));
        let html = render(&data);
        assert!(html.contains("No WAL prune round has finished"), "{html}");

        let mut round = info("wal_prune_round/<x>", "done", NOW - 5_000, None);
        round.type_name = WalPruneRound::TYPE_NAME.to_string();
        round.output = Some(json!({
            "mode": "delete_records",
            "topics": [
                {"topic": "wal_0", "outcome": "pruned", "old_pruned_entry_id": 1, "new_pruned_entry_id": 9, "regions": 2,
                 "held_by": 77, "last_entry_id": 40},
                {"topic": "wal_1", "outcome": "skipped", "pruned_entry_id": 3, "regions": 1, "pinned_by": 4,
                 "reason": "region 4 has no checkpoint yet: it pins the topic"},
                {"topic": "wal_<2>", "outcome": "failed", "step": "Decide", "error": "value <script> is not JSON",
                 "retryable": false},
            ]
        }));
        let older = {
            let mut older = round.clone();
            older.id = procedures::ProcedureId::new("wal_prune_round/old");
            older.updated_at_ms = NOW - 60_000;
            older.output = Some(json!({"mode": "delete_records", "topics": []}));
            older
        };
        data.last_prune = crate::serve::page::LastPrune::newest(&[older, round]);
        let html = render(&data);
        assert!(
            html.contains("1 topics pruned, 1 skipped, 1 failed"),
            "the newest round: {html}"
        );
        assert!(html.contains("<code>wal_prune_round/&lt;x&gt;</code>, 5s ago"));
        assert!(html.contains(
            "<td>skipped at 3</td><td>region 4 has no checkpoint yet: it pins the topic</td>"
        ));
        assert!(html.contains(
            "<tr class=\"error\"><td><code>wal_&lt;2&gt;</code></td><td>failed at Decide</td>\
             <td>value &lt;script&gt; is not JSON</td></tr>"
        ));
        let held = "<tr><td><code>wal_0</code></td><td>77</td><td>31</td></tr>";
        assert_eq!(
            html.matches(held).count(),
            1,
            "a pruned topic appears once, in the held-back table: {html}"
        );
        let held_table = html.find("id=\"prune-held\"").expect("held table");
        let topics_table = html.find("id=\"prune-topics\"").expect("topics table");
        assert!(
            html.find(held).expect("held row") > held_table
                && html.find(held).expect("held row") < topics_table,
            "the pruned topic is listed only among the held-back ones: {html}"
        );
    }
}
