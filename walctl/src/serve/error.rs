//! The API's error answer: `{"error":{"kind","message","retryable"}}` (plus `"leader"` on a not-leader 503) with
//! the status code its kind gives.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answer of the HTTP API.
#[derive(Debug)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// A stable machine-readable kind (`bad_request`, `not_found`, `already_exists`, `not_leader`, `not_ready`,
    /// `internal`).
    pub kind: &'static str,
    /// What went wrong, for people; names the field, table, procedure id or leader concerned.
    pub message: String,
    /// Whether sending the same request again (to the leader) may succeed.
    pub retryable: bool,
    /// On `not_leader`: the leader's advertised address, when one is elected.
    pub leader: Option<String>,
}

impl ApiError {
    /// 400: the request is malformed; `message` names the field.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "bad_request",
            message: message.into(),
            retryable: false,
            leader: None,
        }
    }

    /// 503: this server does not lead; writes go to `leader`.
    pub fn not_leader(leader: Option<String>) -> Self {
        let message = remote_wal::Error::NotLeader {
            leader: leader.clone(),
        }
        .to_string();
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "not_leader",
            message,
            retryable: true,
            leader,
        }
    }

    /// 503: this server leads but cannot serve the request yet (`reason`).
    pub fn not_ready(reason: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "not_ready",
            message: reason.into(),
            retryable: true,
            leader: None,
        }
    }

    /// 500: anything else.
    pub fn internal(message: impl Into<String>, retryable: bool) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "internal",
            message: message.into(),
            retryable,
            leader: None,
        }
    }
}

impl From<remote_wal::Error> for ApiError {
    /// Classifies by the error and its causes (a step's error reaches the API wrapped in the engine's): bad input
    /// 400, an unknown procedure 404, an existing table or a reused procedure id 409, a fenced or not-leading
    /// server 503, anything else 500 keeping whether it is retryable.
    fn from(e: remote_wal::Error) -> Self {
        use remote_wal::Error as E;
        let message = e.to_string().replace('\n', " ");
        let retryable = e.is_retryable();
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(current) = cause {
            if let Some(wal) = current.downcast_ref::<remote_wal::Error>() {
                let (status, kind) = match wal {
                    E::InvalidTableReference { .. }
                    | E::InvalidName { .. }
                    | E::InvalidCreateTable { .. } => (StatusCode::BAD_REQUEST, "bad_request"),
                    E::ProcedureNotFound { .. } => (StatusCode::NOT_FOUND, "not_found"),
                    E::TableAlreadyExists { .. } | E::ProcedurePurge { .. } => {
                        (StatusCode::CONFLICT, "already_exists")
                    }
                    E::NotLeader { leader } => return ApiError::not_leader(leader.clone()),
                    E::MetasrvNotStarted { .. } => (StatusCode::SERVICE_UNAVAILABLE, "not_ready"),
                    E::NoKafkaPool { .. } => (StatusCode::BAD_REQUEST, "bad_request"),
                    _ => {
                        cause = current.source();
                        continue;
                    }
                };
                return ApiError {
                    status,
                    kind,
                    message,
                    retryable: status == StatusCode::SERVICE_UNAVAILABLE,
                    leader: None,
                };
            }
            if let Some(engine) = current.downcast_ref::<procedures::Error>() {
                match engine {
                    procedures::Error::Fenced { .. } => {
                        return ApiError {
                            status: StatusCode::SERVICE_UNAVAILABLE,
                            kind: "not_leader",
                            message,
                            retryable: true,
                            leader: None,
                        };
                    }
                    procedures::Error::ManagerNotRunning { .. } => {
                        return ApiError::not_ready(message);
                    }
                    _ => {}
                }
            }
            cause = current.source();
        }
        ApiError::internal(message, retryable)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut error = json!({
            "kind": self.kind,
            "message": self.message,
            "retryable": self.retryable,
        });
        if let Some(leader) = &self.leader {
            error["leader"] = json!(leader);
        }
        (self.status, Json(json!({ "error": error }))).into_response()
    }
}
