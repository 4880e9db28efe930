//! The datanode routes of `walctl serve` (`docs/datanode.md`): registration and heartbeats (leader only: the
//! registry and its leases live in the leader's memory), the registry's view, and a table's region leaders.

use std::collections::BTreeSet;

use axum::Json;
use axum::extract::{Path, State};
use axum::response::IntoResponse;
use remote_wal::datanode::protocol::{HeartbeatRequest, RegisterRequest};
use remote_wal::metasrv::parse_table_name;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::serve::api::{ApiResult, AppState};
use crate::serve::error::ApiError;

/// Decodes a request body. A body that does not decode is decoded again, tracking the path, for the error to
/// name the field: heartbeats, the bulk of these requests, do not pay for the tracking.
fn body<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, ApiError> {
    if let Ok(value) = serde_json::from_slice(bytes) {
        return Ok(value);
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        ApiError::bad_request(format!("invalid {what} body at '{path}': {}", e.inner()))
    })
}

/// `POST /v1/datanodes/register`: a new incarnation for a starting datanode.
pub async fn register(State(state): State<AppState>, bytes: axum::body::Bytes) -> ApiResult {
    let request: RegisterRequest = body("registration", &bytes)?;
    state.ensure_leading().await?;
    let answer = state.metasrv.datanode_registry().register(&request).await?;
    state.metrics.datanode_registrations.inc();
    Ok(Json(answer).into_response())
}

/// `POST /v1/heartbeat`: a datanode's regions in, leases and instructions out. Answered only while this server
/// still leads in the term it started the heartbeat in.
pub async fn heartbeat(State(state): State<AppState>, bytes: axum::body::Bytes) -> ApiResult {
    let request: HeartbeatRequest = body("heartbeat", &bytes)?;
    let epoch = state.ensure_leading().await?;
    let answer = state
        .metasrv
        .datanode_registry()
        .heartbeat(&request, &BTreeSet::new())
        .await?;
    // Leases granted by a term that ended while the answer was computed are not handed out.
    if state.status().leading != Some(epoch) {
        return Err(ApiError::not_leader(None));
    }
    state.metrics.heartbeats.inc();
    Ok(Json(answer).into_response())
}

/// `GET /v1/datanodes`: the leader's registry (a follower names the leader).
pub async fn list(State(state): State<AppState>) -> ApiResult {
    state.ensure_leading().await?;
    let datanodes = state.metasrv.datanode_registry().list();
    Ok(Json(json!({ "datanodes": datanodes })).into_response())
}

/// `GET /v1/tables/{name}`: the table's regions with their leader datanodes and addresses (any server).
pub async fn table(State(state): State<AppState>, Path(name): Path<String>) -> ApiResult {
    let name = parse_table_name(&name)?;
    let leaders = state.metasrv.table_leaders(&name).await?;
    Ok(Json(leaders).into_response())
}
