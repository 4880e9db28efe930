//! The procedures page at `GET /`: server-rendered HTML in the manner of HBase's "Procedures & Locks" — who leads
//! and at which epoch, every unfinished or failed procedure (stuck ones first, up to 300) and a page of the
//! latest finished ones (`?after=` for older) with its state, step, attempts, age and last error, the
//! locks held and awaited, the datanodes with their leases, and the WAL: the provider, and for Kafka the regions per
//! pool topic as an SVG bar chart and the last prune round's result (the topics it skipped or failed, and why).
//!
//! Gathering ([`PageData::gather`]) and rendering ([`render::render`]) are apart, so the rendering is a pure
//! function of what was read. Each section that cannot be read says why in its place; the page itself always
//! answers 200. Every value is HTML-escaped ([`escape::escape`]): procedure ids, type names and errors come from
//! clients and stores.

mod chart;
mod escape;
mod render;

use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use procedures::manager::ProcedureLocks;
use procedures::{ProcedureInfo, ProcedureState};
use remote_wal::metasrv::TopicsReport;
use remote_wal::wal::WalConfig;
use remote_wal::wal::prune::round::{PruneRoundOutput, WalPruneRound};

use crate::serve::api::AppState;
use crate::serve::leadership::Status;

/// How long the page waits for the topic pool's report (it asks the brokers for topic configs) before showing the
/// section as unavailable: a page must answer while Kafka does not.
const TOPICS_TIMEOUT: Duration = Duration::from_secs(3);

/// Who leads, as this server could read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Leader {
    /// A server leads: its advertised address and epoch.
    Elected {
        /// The leader's advertised address.
        address: String,
        /// Its fencing epoch.
        epoch: u64,
    },
    /// No server leads now.
    None,
    /// The election could not be read (etcd unreachable); the reason.
    Unknown(String),
}

/// Where the procedure list came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcedureSource {
    /// The running manager of this server (the leader): live states, attempts, next retries.
    Manager,
    /// The records in the store, as the leader last wrote them (a follower, or a leader still recovering).
    Store,
}

/// The WAL section's content.
#[derive(Clone, Debug)]
pub enum WalSection {
    /// raft-engine: local to each datanode, no pool.
    RaftEngine,
    /// Kafka: the pool's report, or why it could not be read.
    Kafka(Result<TopicsReport, String>),
}

/// Everything the page shows, read once per request.
#[derive(Clone, Debug)]
pub struct PageData {
    /// This server's advertised address.
    pub this_server: String,
    /// What this server is now (leading with which epoch, manager started, pool ready).
    pub status: Status,
    /// Who leads.
    pub leader: Leader,
    /// The procedures, or why they could not be read.
    pub procedures: Result<Vec<ProcedureInfo>, String>,
    /// Where `procedures` came from.
    pub source: ProcedureSource,
    /// The locks each procedure holds or waits for; `None` off the leader (locks live in its memory).
    pub locks: Option<Vec<ProcedureLocks>>,
    /// The WAL provider and, for Kafka, the pool.
    pub wal: WalSection,
    /// The datanodes registered with this leader's term; `None` off the leader (the registry lives in its
    /// memory).
    pub datanodes: Option<Vec<remote_wal::metasrv::datanodes::DatanodeInfo>>,
    /// When the page was read (ms since the Unix epoch); ages are counted to it.
    pub now_ms: u64,
    /// `?after=`: the page of finished procedures starts after this cursor (`procedures::listing::Cursor`).
    pub finished_after: Option<String>,
    /// Automatic failover's state (the leader only), or why it could not be read.
    pub failover: Option<Result<remote_wal::metasrv::FailoverStatus, String>>,
    /// The newest finished WAL prune round among `procedures`, with its output.
    pub last_prune: Option<LastPrune>,
}

/// The newest finished WAL prune round: when it finished and each topic's result.
#[derive(Clone, Debug)]
pub struct LastPrune {
    /// The round's procedure id.
    pub id: String,
    /// When it finished (ms since the Unix epoch).
    pub finished_at_ms: u64,
    /// Its output.
    pub round: PruneRoundOutput,
}

impl LastPrune {
    /// The newest done [`WalPruneRound`] of `procedures` whose output reads as a round's report.
    pub fn newest(procedures: &[ProcedureInfo]) -> Option<LastPrune> {
        procedures
            .iter()
            .filter(|p| p.type_name == WalPruneRound::TYPE_NAME && p.state == ProcedureState::Done)
            .filter_map(|p| {
                let round = serde_json::from_value(p.output.clone()?).ok()?;
                Some(LastPrune {
                    id: p.id.to_string(),
                    finished_at_ms: p.updated_at_ms,
                    round,
                })
            })
            .max_by_key(|p| p.finished_at_ms)
    }
}

/// The page's query: `after`, the cursor of the finished procedures' page. Anything else is ignored (the page
/// always answers).
#[derive(Debug, Default, serde::Deserialize)]
pub struct PageQuery {
    /// The cursor of the finished procedures' page.
    pub after: Option<String>,
}

impl PageData {
    /// Reads what the page shows from the server's state; a part that cannot be read is kept as its error text.
    pub async fn gather(state: &AppState, query: PageQuery) -> PageData {
        let status = state.status.borrow().clone();
        let leader = match state.leader().await {
            Ok((Some(address), Some(epoch))) => Leader::Elected { address, epoch },
            Ok(_) => Leader::None,
            Err(e) => Leader::Unknown(e.message),
        };
        let metasrv = &state.metasrv;
        let (procedures, source) = if metasrv.is_started() {
            (
                metasrv.list_procedures().await.map_err(|e| e.to_string()),
                ProcedureSource::Manager,
            )
        } else {
            (
                metasrv.stored_procedures().await.map_err(|e| e.to_string()),
                ProcedureSource::Store,
            )
        };
        let locks = (status.leading.is_some() && metasrv.is_started()).then(|| metasrv.locks());
        let wal = match &metasrv.config().wal {
            WalConfig::RaftEngine => WalSection::RaftEngine,
            WalConfig::Kafka(_) => WalSection::Kafka(
                match tokio::time::timeout(TOPICS_TIMEOUT, metasrv.topics()).await {
                    Ok(Ok(report)) => Ok(report),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err(format!(
                        "the topic pool's report did not come within {}",
                        humantime::format_duration(TOPICS_TIMEOUT)
                    )),
                },
            ),
        };
        let datanodes = status
            .leading
            .is_some()
            .then(|| metasrv.datanode_registry().list());
        let failover = match status.leading {
            Some(_) => Some(metasrv.failover_status().await.map_err(|e| e.to_string())),
            None => None,
        };
        let last_prune = procedures
            .as_ref()
            .ok()
            .and_then(|list| LastPrune::newest(list));
        PageData {
            last_prune,
            datanodes,
            this_server: state.advertise.clone(),
            status,
            leader,
            procedures,
            source,
            locks,
            wal,
            now_ms: procedures::record::now_ms(),
            finished_after: query.after,
            failover,
        }
    }
}

/// `GET /`: the page, always 200 (a section that cannot be read says so).
pub async fn page(
    State(state): State<AppState>,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> Response {
    let query = query.map(|Query(q)| q).unwrap_or_default();
    let data = PageData::gather(&state, query).await;
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        render::render(&data),
    )
        .into_response()
}
