//! The datanode's HTTP API (`docs/datanode.md`): writes, flushes, the regions' state, health.
//!
//! `POST /v1/regions/{region_id}/write` takes a batch of entries as `application/octet-stream`, each entry a u32
//! big-endian length followed by its bytes, and answers `{"entry_ids":[…]}` once they are durable in the region's
//! WAL (before its lease's deadline). Errors are `{"error":{"kind","message","retryable"}}`: `not_leader` (503;
//! the region is not open here, or has no lease), `outcome_unknown` (500; the entries may or may not be written),
//! `bad_request` (400), `internal` (500).

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use datanode::Datanode;
use datanode::error::Error;
use serde_json::json;

/// The largest write batch accepted, in bytes.
pub const MAX_WRITE_BYTES: usize = 64 * 1024 * 1024;

/// Every route.
pub fn router(datanode: Arc<Datanode>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/regions", get(regions))
        .route("/v1/regions/{id}/write", post(write))
        .route("/v1/regions/{id}/flush", post(flush))
        .layer(DefaultBodyLimit::max(MAX_WRITE_BYTES))
        .with_state(datanode)
}

fn error(status: StatusCode, kind: &str, message: String, retryable: bool) -> Response {
    let body = json!({"error": {"kind": kind, "message": message, "retryable": retryable}});
    (status, Json(body)).into_response()
}

fn from_error(e: &Error) -> Response {
    let message = e.to_string().replace('\n', " ");
    match e {
        Error::RegionNotOpen { leader, .. } | Error::NotLeader { leader, .. } => {
            let mut body =
                json!({"error": {"kind": "not_leader", "message": message, "retryable": true}});
            if let Some(leader) = leader {
                body["error"]["leader"] = json!(leader);
            }
            (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
        }
        Error::RegionDropped { .. } => error(StatusCode::GONE, "region_dropped", message, false),
        Error::OutcomeUnknown { .. } => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "outcome_unknown",
            message,
            false,
        ),
        _ => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            message,
            e.is_retryable(),
        ),
    }
}

fn region_id(id: &str) -> Result<u64, Box<Response>> {
    id.parse().map_err(|_| {
        Box::new(error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("region id: '{id}' is not a number"),
            false,
        ))
    })
}

/// Splits a write body into entries: u32 big-endian length, then that many bytes, to the end.
pub fn decode_batch(body: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let mut entries = Vec::new();
    let mut at = 0usize;
    while at < body.len() {
        let head = body.get(at..at + 4).ok_or_else(|| {
            format!(
                "entry {} has a length cut short at byte {at}",
                entries.len()
            )
        })?;
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let data = body.get(at + 4..at + 4 + len).ok_or_else(|| {
            format!(
                "entry {} says {len} bytes but the body ends {} bytes later",
                entries.len(),
                body.len() - at - 4
            )
        })?;
        entries.push(data.to_vec());
        at += 4 + len;
    }
    if entries.is_empty() {
        return Err("the batch holds no entry".to_string());
    }
    Ok(entries)
}

async fn health() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

async fn regions(State(datanode): State<Arc<Datanode>>) -> Response {
    Json(json!({
        "datanode_id": datanode.options().id,
        "incarnation": datanode.incarnation(),
        "regions": datanode.regions(),
    }))
    .into_response()
}

async fn write(
    State(datanode): State<Arc<Datanode>>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let region_id = match region_id(&id) {
        Ok(id) => id,
        Err(r) => return *r,
    };
    let entries = match decode_batch(&body) {
        Ok(entries) => entries,
        Err(reason) => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("region {region_id}: invalid write body: {reason}"),
                false,
            );
        }
    };
    match datanode.write(region_id, entries).await {
        Ok(ids) => Json(json!({"entry_ids": ids})).into_response(),
        Err(e) => from_error(&e),
    }
}

async fn flush(State(datanode): State<Arc<Datanode>>, Path(id): Path<String>) -> Response {
    let region_id = match region_id(&id) {
        Ok(id) => id,
        Err(r) => return *r,
    };
    match datanode.flush(region_id).await {
        Ok(report) => Json(report).into_response(),
        Err(e) => from_error(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::decode_batch;

    #[test]
    fn batches_split_into_entries_and_a_cut_one_is_named() {
        let mut body = Vec::new();
        for e in [&b"ab"[..], b"", b"xyz"] {
            body.extend_from_slice(&(e.len() as u32).to_be_bytes());
            body.extend_from_slice(e);
        }
        assert_eq!(
            decode_batch(&body).unwrap(),
            vec![b"ab".to_vec(), vec![], b"xyz".to_vec()]
        );
        body.pop();
        assert_eq!(
            decode_batch(&body).unwrap_err(),
            "entry 2 says 3 bytes but the body ends 2 bytes later"
        );
    }
}
