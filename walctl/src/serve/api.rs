//! The HTTP API's routes and handlers (`docs/server.md`).

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use procedures::ProcedureId;
use procedures::listing::ListQuery;
use remote_wal::ddl::CreateTableTask;
use remote_wal::ddl::procedure_id::excerpt;
use remote_wal::metasrv::election::Election;
use remote_wal::metasrv::{Metasrv, parse_table_name};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::serve::error::ApiError;
use crate::serve::leadership::{BrokerCheck, Status};
use crate::serve::metrics::Metrics;

/// What every handler sees.
#[derive(Clone)]
pub struct AppState {
    /// The metasrv (its manager runs only while this server leads).
    pub metasrv: Arc<Metasrv>,
    /// The election, on etcd.
    pub election: Option<Arc<Election>>,
    /// What this server is now.
    pub status: watch::Receiver<Status>,
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// This server's advertised address.
    pub advertise: String,
    /// Permits for write requests in progress (`[server] max_pending_writes`).
    pub admission: Arc<tokio::sync::Semaphore>,
}

/// What guards the routes: the tokens (`[server] auth`), and how long a body may take to arrive.
#[derive(Clone)]
pub struct Guard {
    /// The tokens; `None`: every route open.
    pub auth: Option<Arc<crate::serve::auth::Auth>>,
    /// `[server] body_timeout`.
    pub body_timeout: std::time::Duration,
}

/// Every route. Every answer but the page's and the metrics' is JSON, errors of the router and extractors
/// included (`error::json_errors`); a request passes the token check (`serve::auth`) before its body is read,
/// within `body_timeout` and up to [`crate::serve::error::BODY_LIMIT`] bytes (`listener::read_body`).
pub fn router(state: AppState, guard: Guard) -> Router {
    let routes = Router::new()
        .route("/", get(crate::serve::page::page))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/v1/leader", get(leader))
        .route("/v1/tables", post(create_table))
        .route("/v1/procedures", get(list_procedures))
        .route(
            "/v1/procedures/{*id}",
            get(show_procedure).post(control).delete(purge),
        )
        .route("/v1/locks", get(locks))
        .route("/v1/bootstrap", post(bootstrap))
        .route("/v1/topics", get(topics))
        .route("/v1/wal/prune", post(prune_wal))
        .route("/v1/datanodes/{id}/open-requests", get(open_requests))
        .route("/v1/datanodes", get(crate::serve::datanodes::list))
        .route(
            "/v1/datanodes/register",
            post(crate::serve::datanodes::register),
        )
        .route("/v1/heartbeat", post(crate::serve::datanodes::heartbeat))
        .route(
            "/v1/tables/{*name}",
            get(crate::serve::datanodes::table).delete(drop_table),
        )
        .route("/v1/regions/{id}/migrate", post(migrate_region))
        .route("/v1/failover", get(failover_status))
        .route("/v1/failover/{action}", post(failover_toggle))
        .layer(DefaultBodyLimit::max(crate::serve::error::BODY_LIMIT))
        .with_state(state);
    // Outside the routes, so that the middleware sees a 405 with the `Allow` header the routes add.
    let mut app =
        Router::new()
            .fallback_service(routes)
            .layer(axum::middleware::from_fn_with_state(
                guard.body_timeout,
                crate::serve::listener::read_body,
            ));
    if let Some(auth) = guard.auth {
        app = app.layer(axum::middleware::from_fn_with_state(
            auth,
            crate::serve::auth::require_token,
        ));
    }
    app.layer(axum::middleware::from_fn(crate::serve::error::json_errors))
}

pub(super) type ApiResult = Result<Response, ApiError>;

/// How long a 503 `not_leader` waits for etcd to say who leads before it answers without naming the leader. Without
/// a quorum that read cannot succeed, and a refused write must not wait for it: a deposed leader answers every
/// write within this bound (`docs/ha.md`, "Failures").
pub(super) const NOT_LEADER_LOOKUP: std::time::Duration = std::time::Duration::from_secs(1);

impl AppState {
    /// A permit for one write request, held while it is handled; none left: `429 overloaded` (with `Retry-After`,
    /// added by `error::json_errors`), retryable.
    pub(super) fn admit(&self) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
        Arc::clone(&self.admission)
            .try_acquire_owned()
            .map_err(|_| {
                ApiError::overloaded(
                    "this server is handling as many write requests as it takes at once ([server] \
                 max_pending_writes); retry after a moment",
                )
            })
    }

    pub(super) fn status(&self) -> Status {
        self.status.borrow().clone()
    }

    /// The current leader's address and epoch (etcd: as the election says; otherwise this server once started).
    pub(super) async fn leader(&self) -> Result<(Option<String>, Option<u64>), ApiError> {
        match &self.election {
            Some(election) => {
                let leader = election.leader().await?;
                Ok((
                    leader.as_ref().map(|l| l.address.clone()),
                    leader.map(|l| l.epoch),
                ))
            }
            None => {
                let status = self.status();
                Ok((
                    status.leading.map(|_| self.advertise.clone()),
                    status.leading,
                ))
            }
        }
    }

    /// The 503 of a follower: names the leader, or says why it could not be read (within [`NOT_LEADER_LOOKUP`]).
    async fn not_leader(&self) -> ApiError {
        let reason = match tokio::time::timeout(NOT_LEADER_LOOKUP, self.leader()).await {
            Ok(Ok((leader, _))) => return ApiError::not_leader(leader),
            Ok(Err(e)) => e.message,
            Err(_) => format!(
                "the metadata store did not answer within {}",
                humantime::format_duration(NOT_LEADER_LOOKUP)
            ),
        };
        let mut error = ApiError::not_leader(None);
        error.message =
            format!("this server is not the leader, and the leader could not be read: {reason}");
        error
    }

    /// Refuses a request unless this server leads (its manager may still be recovering); returns the term's epoch.
    pub(super) async fn ensure_leading(&self) -> Result<u64, ApiError> {
        match self.status().leading {
            Some(epoch) => Ok(epoch),
            None => {
                self.metrics.not_leader_answers.inc();
                Err(self.not_leader().await)
            }
        }
    }

    /// Refuses a write unless this server leads with the manager started (a follower never queues one).
    async fn ensure_leader(&self) -> Result<Status, ApiError> {
        let status = self.status();
        if status.leading.is_none() {
            self.metrics.not_leader_answers.inc();
            return Err(self.not_leader().await);
        }
        if !status.manager_started {
            return Err(ApiError::not_ready(
                "this server leads but its procedure manager is still recovering",
            ));
        }
        Ok(status)
    }
}

async fn health() -> Response {
    Json(json!({ "status": "ok" })).into_response()
}

async fn ready(State(state): State<AppState>) -> ApiResult {
    let status = state.status();
    if status.ready() {
        let mut out = json!({ "ready": true, "epoch": status.leading });
        if let Some(brokers) = &status.brokers {
            out["brokers"] = json!(brokers.describe());
        }
        return Ok(Json(out).into_response());
    }
    if status.leading.is_none() {
        return Err(state.not_leader().await);
    }
    if !status.manager_started {
        return Err(ApiError::not_ready(
            "the procedure manager is still recovering",
        ));
    }
    Err(pool_not_ready(&status))
}

/// The 503 of a leader whose WAL pool is not ready, with what its last bootstrap met.
fn pool_not_ready(status: &Status) -> ApiError {
    match &status.brokers {
        Some(check @ BrokerCheck::Failed(_)) => ApiError::not_ready(format!(
            "the WAL topic pool is not ready yet (brokers: {})",
            check.describe()
        )),
        _ => ApiError::not_ready("the WAL topic pool is not ready yet"),
    }
}

async fn metrics(State(state): State<AppState>) -> ApiResult {
    state
        .metrics
        .leader
        .set(i64::from(state.status().leading.is_some()));
    let text = state
        .metrics
        .render(&state.metasrv)
        .await
        .map_err(|e| ApiError::internal(format!("encoding the metrics failed: {e}"), false))?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

async fn leader(State(state): State<AppState>) -> ApiResult {
    let (leader, epoch) = state.leader().await?;
    let own = state.status().leading;
    let is_self = own.is_some() && own == epoch;
    let mut out = json!({ "leader": leader, "epoch": epoch, "self": is_self });
    // Only the leader checks the brokers; a follower's view of them would be the leader's, which it does not have.
    if is_self && let Some(brokers) = &state.status().brokers {
        out["brokers"] = json!(brokers.describe());
    }
    // What an embedded command sent here compares its own config with (`crate::drift`).
    if is_self {
        out["served"] = crate::drift::served(state.metasrv.config());
    }
    Ok(Json(out).into_response())
}

/// The body of `POST /v1/tables`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateTableBody {
    name: String,
    regions: u32,
    #[serde(default)]
    if_not_exists: bool,
    #[serde(default)]
    id: Option<String>,
    #[serde(default = "default_wait")]
    wait: bool,
}

fn default_wait() -> bool {
    true
}

async fn create_table(State(state): State<AppState>, body: axum::body::Bytes) -> ApiResult {
    let _permit = state.admit()?;
    let body: CreateTableBody = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid create-table body: {e}")))?;
    let name = parse_table_name(&body.name)?;
    // The library's checks, so that the 400 says what the embedded command says (and quotes an id cut).
    remote_wal::ddl::CreateTableTask::new(name.clone(), body.regions).validate_num_regions()?;
    if let Some(id) = &body.id {
        remote_wal::ddl::procedure_id::validate_procedure_id(&name, id)?;
    }
    state.ensure_leader().await?;
    let status = state.status();
    if !status.pool_ready {
        return Err(pool_not_ready(&status));
    }
    let id = body.id.unwrap_or_else(|| ProcedureId::random().to_string());
    if body.wait {
        // No existence pre-check: the procedure's first step refuses a table that exists (409, no record left),
        // and an id used for another request is refused naming the difference (409); both typed, mapped by kind.
        let table = state
            .metasrv
            .create_table_with_id(name, body.regions, body.if_not_exists, Some(&id))
            .await?;
        let mut out = serde_json::to_value(&table)
            .map_err(|e| ApiError::internal(format!("encoding the table failed: {e}"), false))?;
        out["procedure_id"] = json!(id);
        return Ok(Json(out).into_response());
    }
    // A fast answer for the common mistake (the procedure would refuse it anyway, after the 202): an existing
    // table is 409 unless the request asks for it anyway or retries a procedure id that exists.
    if !body.if_not_exists
        && let Some(table_id) = state.metasrv.table_id(&name).await?
        && !procedure_exists(&state.metasrv, &id).await?
    {
        return Err(remote_wal::ddl::Error::TableAlreadyExists {
            table: name.to_string(),
            table_id: Some(table_id),
        }
        .into());
    }
    // 202 promises the procedure is stored (a leader killed right after still leaves it for the next one to
    // finish) and runs this request: the submission returns once the record is written, or, for an id that names
    // an existing procedure, once its record is found to hold this very request (another one is a 409 here).
    let mut task = CreateTableTask::new(name, body.regions);
    task.if_not_exists = body.if_not_exists;
    let (_, mut watcher) = state
        .metasrv
        .ddl()
        .submit_create_table(task, Some(ProcedureId::new(&id)))
        .await?;
    // The procedure goes on in the background; its outcome is the procedure's state.
    tokio::spawn(async move {
        if let Err(e) = watcher.wait().await {
            tracing::info!(error = %e, "create table (submitted without waiting) did not create it");
        }
    });
    Ok((StatusCode::ACCEPTED, Json(json!({ "procedure_id": id }))).into_response())
}

/// `GET /v1/failover`: enabled, paused, and the datanode incarnations this server (leading) finds failed.
async fn failover_status(State(state): State<AppState>) -> ApiResult {
    Ok(Json(state.metasrv.failover_status().await?).into_response())
}

/// `POST /v1/failover/pause|resume` (the leader only): `{"paused": bool, "was_paused": bool}`.
async fn failover_toggle(State(state): State<AppState>, Path(action): Path<String>) -> ApiResult {
    let pause = match action.as_str() {
        "pause" => true,
        "resume" => false,
        other => {
            return Err(ApiError::not_found(format!(
                "no failover action '{}': the actions are pause and resume",
                excerpt(other, 40)
            )));
        }
    };
    state.ensure_leader().await?;
    let was_paused = if pause {
        state.metasrv.pause_failover().await?
    } else {
        state.metasrv.resume_failover().await?
    };
    Ok(Json(json!({ "paused": pause, "was_paused": was_paused })).into_response())
}

/// `DELETE /v1/tables/{name}[?if_exists=true]` (the leader only): drops the table and answers
/// `{"table_id","dropped","regions"}` once its metadata is gone and no datanode leads its regions; an unknown
/// table is a 404 (no record left), or `"dropped": false` with `if_exists`.
async fn drop_table(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult {
    let _permit = state.admit()?;
    let name = parse_table_name(&name)?;
    let if_exists = match params.get("if_exists").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "if_exists: '{}' is not true or false",
                excerpt(other, 20)
            )));
        }
    };
    state.ensure_leader().await?;
    let output = state.metasrv.drop_table(name, if_exists).await?;
    Ok(Json(output).into_response())
}

/// The body of `POST /v1/regions/{id}/migrate`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MigrateBody {
    /// The datanode the region is to lead on.
    to: u64,
    /// Answer once the region leads there (default), or 202 once the procedure is stored.
    #[serde(default = "default_wait")]
    wait: bool,
}

/// `POST /v1/regions/{id}/migrate` `{"to": D, "wait": true}`: moves the region's leadership to datanode `D` with
/// a `RegionMigration` procedure (the leader only). With `wait`, answers the procedure's output once `D` leads
/// the region (`{"region_id","from","to","epoch","procedure_id"}`); without, 202 `{"procedure_id"}` once it is
/// stored. A refused request (unknown region or datanode, a raft-engine region) is a 400 in both modes and leaves
/// no record.
async fn migrate_region(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult {
    let _permit = state.admit()?;
    let region_id: u64 = id.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "region id '{}' is not a number ((table_id << 32) | region_number)",
            excerpt(&id, 40)
        ))
    })?;
    let body: MigrateBody = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid migrate body: {e}")))?;
    state.ensure_leader().await?;
    state
        .metasrv
        .check_region_migration(region_id, body.to)
        .await?;
    let (procedure_id, mut watcher) = state
        .metasrv
        .submit_region_migration(region_id, body.to)
        .await?;
    if body.wait {
        let output = watcher.wait().await.map_err(remote_wal::Error::from)?;
        let mut out = output.unwrap_or_else(|| json!({}));
        out["procedure_id"] = json!(procedure_id.to_string());
        return Ok(Json(out).into_response());
    }
    tokio::spawn(async move {
        if let Err(e) = watcher.wait().await {
            tracing::info!(error = %e, "region migration (submitted without waiting) did not finish");
        }
    });
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "procedure_id": procedure_id.to_string() })),
    )
        .into_response())
}

/// Whether procedure `id` is known to the running manager or stored; an error reading the store is returned (a
/// retry decides), never taken for "unknown".
async fn procedure_exists(metasrv: &Metasrv, id: &str) -> Result<bool, ApiError> {
    match metasrv.procedure(id).await {
        Ok(_) => return Ok(true),
        Err(
            remote_wal::Error::ProcedureNotFound { .. }
            | remote_wal::Error::MetasrvNotStarted { .. },
        ) => {}
        Err(e) => return Err(e.into()),
    }
    match metasrv.stored_procedure(id).await {
        Ok(_) => Ok(true),
        Err(remote_wal::Error::ProcedureNotFound { .. }) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// `GET /v1/procedures?limit=&after=&state=&type=`: one page, newest first (`procedures::listing`), with the
/// cursor of the next page and the per-state counts of every match.
async fn list_procedures(
    State(state): State<AppState>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult {
    let query = list_query(&params)?;
    // The leader answers from its manager (live); a follower from the store (what the leader last wrote).
    let list = if state.metasrv.is_started() {
        state.metasrv.list_procedures().await?
    } else {
        state.metasrv.stored_procedures().await?
    };
    let page = procedures::listing::page(list, &query);
    Ok(Json(json!({
        "procedures": page.procedures,
        "next": page.next.map(|c| c.to_string()),
        "matched": page.matched,
        "counts": page.counts,
    }))
    .into_response())
}

/// The listing's query parameters; an unknown one is refused (a misspelt filter must not list everything).
fn list_query(params: &HashMap<String, String>) -> Result<ListQuery, ApiError> {
    const KNOWN: [&str; 4] = ["limit", "after", "state", "type"];
    if let Some(unknown) = params.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(ApiError::bad_request(format!(
            "unknown query parameter '{}'; the parameters are {}",
            excerpt(unknown, 40),
            KNOWN.join(", ")
        )));
    }
    let get = |name: &str| params.get(name).map(String::as_str);
    ListQuery::parse(get("limit"), get("after"), get("state"), get("type"))
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

/// The longest procedure id a path may name, in bytes: ids the engine makes (a pool's bootstrap, a child of a
/// child) run longer than a client's ([`remote_wal::ddl::procedure_id::MAX_PROCEDURE_ID_BYTES`]), never this long.
const MAX_PATH_ID_BYTES: usize = 1024;

/// How many characters of a refused path value an answer quotes.
const PATH_EXCERPT_CHARS: usize = 64;

/// A procedure id taken from a path: refused (400, quoting an excerpt, never the whole value) when longer than
/// [`MAX_PATH_ID_BYTES`] or not printable, so no answer or log line echoes a client's megabyte.
fn path_id(id: &str) -> Result<&str, ApiError> {
    let printable = !id
        .chars()
        .any(|c| c.is_control() || remote_wal::ddl::procedure_id::is_bidi_control(c));
    if id.len() > MAX_PATH_ID_BYTES || !printable {
        return Err(ApiError::bad_request(format!(
            "procedure id '{}': not a procedure id (at most {MAX_PATH_ID_BYTES} bytes of printable text)",
            excerpt(id, PATH_EXCERPT_CHARS)
        )));
    }
    Ok(id)
}

async fn show_procedure(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let id = path_id(&id)?;
    let info = if state.metasrv.is_started() {
        match state.metasrv.procedure(id).await {
            Ok(info) => info,
            Err(remote_wal::Error::ProcedureNotFound { .. }) => {
                state.metasrv.stored_procedure(id).await?
            }
            Err(e) => return Err(e.into()),
        }
    } else {
        state.metasrv.stored_procedure(id).await?
    };
    Ok(Json(info).into_response())
}

async fn locks(State(state): State<AppState>) -> ApiResult {
    state.ensure_leader().await?;
    let locks: Vec<Value> = state
        .metasrv
        .locks()
        .into_iter()
        .map(|l| {
            json!({
                "procedure_id": l.id.to_string(),
                "held": l.held.iter().map(|k| json!({"key": k.key, "exclusive": k.exclusive})).collect::<Vec<_>>(),
                "waiting": l.waiting.map(|w| json!({
                    "key": w.key,
                    "exclusive": w.exclusive,
                    "blocked_by": w.blocked_by.to_string(),
                    "blocker_holds": w.blocker_holds,
                })),
            })
        })
        .collect();
    Ok(Json(json!({ "locks": locks })).into_response())
}

/// `POST /v1/bootstrap[?recreate_missing=true]`.
#[derive(Debug, Default, serde::Deserialize)]
struct BootstrapQuery {
    /// Create lost pool topics anew (`walctl bootstrap --recreate-missing`).
    #[serde(default)]
    recreate_missing: bool,
}

async fn bootstrap(
    State(state): State<AppState>,
    Query(query): Query<BootstrapQuery>,
) -> ApiResult {
    let _permit = state.admit()?;
    state.ensure_leader().await?;
    let report = state
        .metasrv
        .bootstrap_with(query.recreate_missing, |_| {})
        .await?;
    Ok(Json(report).into_response())
}

async fn topics(State(state): State<AppState>) -> ApiResult {
    let report = state.metasrv.topics().await?;
    Ok(Json(report).into_response())
}

async fn open_requests(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let datanode: u64 = id.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "datanode id: '{}' is not a number",
            excerpt(&id, PATH_EXCERPT_CHARS)
        ))
    })?;
    let open = state.metasrv.open_regions(datanode).await?;
    let errors: Vec<Value> = open
        .errors
        .iter()
        .map(|e| json!({"key": e.key, "region_id": e.region_id, "error": e.error.to_string()}))
        .collect();
    Ok(
        Json(json!({"datanode_id": datanode, "requests": open.requests, "errors": errors}))
            .into_response(),
    )
}

/// `POST /v1/procedures/{id}/cancel|pause|resume`, and `POST /v1/procedures/pause|resume` for every procedure.
/// The leader applies it through its manager (a write fenced by its epoch); a follower answers 503.
async fn control(State(state): State<AppState>, Path(path): Path<String>) -> ApiResult {
    let (id, action) = match path.rsplit_once('/') {
        Some((id, action)) if !id.is_empty() => (Some(id), action),
        Some((_, action)) => (None, action),
        None => (None, path.as_str()),
    };
    let op = match action {
        "cancel" => procedures::ControlOp::Cancel,
        "pause" => procedures::ControlOp::Pause,
        "resume" => procedures::ControlOp::Resume,
        _ => {
            return Err(ApiError::not_found(format!(
                "no procedure action '{}' (cancel, pause or resume)",
                excerpt(action, PATH_EXCERPT_CHARS)
            )));
        }
    };
    let id = id.map(path_id).transpose()?;
    state.ensure_leader().await?;
    state.metasrv.control_procedure(id, op).await?;
    Ok(Json(json!({ "requested": op.as_str(), "id": id })).into_response())
}

/// `DELETE /v1/procedures/{id}`: purges a finished, failed or damaged procedure's record (the leader only).
async fn purge(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let id = path_id(&id)?;
    state.ensure_leader().await?;
    state.metasrv.purge_procedure(id).await?;
    Ok(Json(json!({ "purged": id })).into_response())
}

/// The body of `POST /v1/wal/prune`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PruneBody {
    #[serde(default)]
    topic: Option<String>,
}

/// `POST /v1/wal/prune` `{"topic": null | "T"}`: runs one WAL prune round (the leader only) and answers its output,
/// `{"mode", "topics": [...]}` with each topic's result (a round whose topics failed is still a `200`: the answer
/// says which and why).
async fn prune_wal(State(state): State<AppState>, body: axum::body::Bytes) -> ApiResult {
    let _permit = state.admit()?;
    let body: PruneBody = if body.is_empty() {
        PruneBody::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("invalid wal prune body: {e}")))?
    };
    if body.topic.as_deref().is_some_and(|t| t.trim().is_empty()) {
        return Err(ApiError::bad_request("topic: must not be empty"));
    }
    state.ensure_leader().await?;
    let round = state.metasrv.prune_wal(body.topic.as_deref()).await?;
    Ok(Json(round).into_response())
}
