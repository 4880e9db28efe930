//! The API's error answer: `{"error":{"kind","message","retryable"}}` (plus `"leader"` on a not-leader 503) with
//! the status code its kind gives.

use axum::Json;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use remote_wal::ddl::procedure_id::excerpt;
use serde_json::json;

/// The largest request body the API reads (2 MiB); a larger one is answered 413 `payload_too_large`.
pub const BODY_LIMIT: usize = 2 * 1024 * 1024;

/// How many characters of a request's path an error answer quotes; the rest is cut (a path is the client's).
const PATH_EXCERPT: usize = 100;

/// An error answer of the HTTP API.
#[derive(Debug)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// A stable machine-readable kind (`bad_request`, `not_found`, `method_not_allowed`, `payload_too_large`,
    /// `not_registered`, `already_exists`, `conflict`, `stale_incarnation`, `not_leader`, `not_ready`, `overloaded`,
    /// `store_unavailable`, `unauthorized`, `forbidden`, `request_timeout`, `internal`).
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

    /// 404: nothing by that name (a route's action, a procedure).
    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            kind: "not_found",
            message: message.into(),
            retryable: false,
            leader: None,
        }
    }

    /// 405: the route exists but not for this method; `message` names the method, the path and the methods allowed.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::METHOD_NOT_ALLOWED,
            kind: "method_not_allowed",
            message: message.into(),
            retryable: false,
            leader: None,
        }
    }

    /// 413: the request's body is larger than the server takes ([`BODY_LIMIT`]).
    pub fn payload_too_large(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            kind: "payload_too_large",
            message: message.into(),
            retryable: false,
            leader: None,
        }
    }

    /// 401: no bearer token, or one the server does not hold (`serve::auth`).
    pub fn unauthorized(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            kind: "unauthorized",
            message: message.into(),
            retryable: false,
            leader: None,
        }
    }

    /// 403: the token is valid but its scope does not allow the request (a read token on a write).
    pub fn forbidden(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::FORBIDDEN,
            kind: "forbidden",
            message: message.into(),
            retryable: false,
            leader: None,
        }
    }

    /// 408: the request's body did not arrive within `[server] body_timeout`.
    pub fn request_timeout(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            kind: "request_timeout",
            message: message.into(),
            retryable: true,
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

    /// 429: the server takes no more write requests at once now; retryable (the answer carries `Retry-After`).
    pub fn overloaded(reason: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            kind: "overloaded",
            message: reason.into(),
            retryable: true,
            leader: None,
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

    /// An error the API classified as `status` and `kind`: retryable when the server cannot serve it now (503).
    fn classified(status: StatusCode, kind: &'static str, message: String) -> Self {
        ApiError {
            status,
            kind,
            message,
            retryable: status == StatusCode::SERVICE_UNAVAILABLE,
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

impl From<remote_wal::ddl::Error> for ApiError {
    /// As the crate's error that holds it ([`remote_wal::Error::Ddl`]).
    fn from(e: remote_wal::ddl::Error) -> Self {
        ApiError::from(remote_wal::Error::from(e))
    }
}

impl From<remote_wal::Error> for ApiError {
    /// Classifies by the error and its causes (a step's error reaches the API wrapped in the engine's): bad input
    /// 400, an unknown procedure 404, an existing table or a reused procedure id 409, a fenced or not-leading
    /// server 503, a metadata store that cannot serve now 503 `store_unavailable`, anything else 500 keeping whether
    /// it is retryable.
    fn from(e: remote_wal::Error) -> Self {
        use remote_wal::Error as E;
        let message = e.to_string().replace('\n', " ");
        let retryable = e.is_retryable();
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(current) = cause {
            if let Some(wal) = downcast::<remote_wal::Error>(current) {
                let (status, kind) = match wal {
                    E::ProcedureNotFound { .. } => (StatusCode::NOT_FOUND, "not_found"),
                    E::ProcedurePurge { .. } => (StatusCode::CONFLICT, "already_exists"),
                    E::Ddl { source } => match ddl_kind(source) {
                        Some(classified) => classified,
                        None => {
                            cause = current.source();
                            continue;
                        }
                    },
                    E::NotLeader { leader } => return ApiError::not_leader(leader.clone()),
                    E::MetasrvNotStarted { .. } => (StatusCode::SERVICE_UNAVAILABLE, "not_ready"),
                    // The metadata store cannot serve now (no quorum, a member gone, a timeout): the client retries
                    // (with its id, for a write that may have been applied).
                    E::Kv { source } if store_unavailable(source) => {
                        (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable")
                    }
                    E::Election {
                        retryable: true, ..
                    } => (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable"),
                    E::NoKafkaPool { .. } | E::DatanodeUnknown { .. } => {
                        (StatusCode::BAD_REQUEST, "bad_request")
                    }
                    E::Wal { source } => match wal_kind(source) {
                        Some(classified) => classified,
                        None => {
                            cause = current.source();
                            continue;
                        }
                    },
                    E::WalTableNotFound { .. } => (StatusCode::NOT_FOUND, "not_found"),
                    E::DatanodeNotRegistered { .. } => (StatusCode::NOT_FOUND, "not_registered"),
                    E::DatanodeStaleIncarnation { .. } | E::DatanodeRetired { .. } => {
                        (StatusCode::CONFLICT, "stale_incarnation")
                    }
                    E::DatanodeStillHeartbeating { .. } => {
                        return ApiError {
                            status: StatusCode::CONFLICT,
                            kind: "conflict",
                            message,
                            retryable: true,
                            leader: None,
                        };
                    }
                    _ => {
                        cause = current.source();
                        continue;
                    }
                };
                return ApiError::classified(status, kind, message);
            }
            // A DDL or WAL error handed to the engine by a step is its own link in the chain.
            let classified = match downcast::<remote_wal::ddl::Error>(current) {
                Some(ddl) => ddl_kind(ddl),
                None => downcast::<remote_wal::wal::Error>(current).and_then(wal_kind),
            };
            if let Some((status, kind)) = classified {
                return ApiError::classified(status, kind, message);
            }
            // A kv error the engine received from its store (a step's write) is its own link in the chain.
            if let Some(kv) = downcast::<remote_wal::kv::Error>(current)
                && store_unavailable(kv)
            {
                return ApiError {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    kind: "store_unavailable",
                    message,
                    retryable: true,
                    leader: None,
                };
            }
            if let Some(engine) = downcast::<procedures::Error>(current) {
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
                    procedures::Error::ControlUnknown { .. } => {
                        return ApiError::not_found(message);
                    }
                    procedures::Error::ProcedureRefused { refusal, .. } => {
                        let (status, kind) = match refusal {
                            procedures::Refusal::AlreadyExists => {
                                (StatusCode::CONFLICT, "already_exists")
                            }
                            procedures::Refusal::Conflict => (StatusCode::CONFLICT, "conflict"),
                            procedures::Refusal::NotFound => (StatusCode::NOT_FOUND, "not_found"),
                            _ => (StatusCode::BAD_REQUEST, "bad_request"),
                        };
                        return ApiError {
                            status,
                            kind,
                            message,
                            retryable: false,
                            leader: None,
                        };
                    }
                    procedures::Error::ControlRefused { .. }
                    | procedures::Error::ProcedureIdInUse { .. } => {
                        return ApiError {
                            status: StatusCode::CONFLICT,
                            kind: "conflict",
                            message,
                            retryable: false,
                            leader: None,
                        };
                    }
                    _ => {}
                }
            }
            cause = current.source();
        }
        ApiError::internal(message, retryable)
    }
}

/// Whether the metadata store cannot serve now (no quorum, a member gone, a timeout, a lost connection): the
/// client retries (with its id, for a write that may have been applied). Decided by the kv layer's own error.
/// How the API answers a DDL error it classifies: bad input 400, an existing table 409 `already_exists`, a
/// procedure id used by another task 409 `conflict`, an unknown table 404, a metadata store that cannot serve now
/// 503; a WAL error inside it as [`wal_kind`] says; `None` for the others (500, or a cause further down the chain).
fn ddl_kind(e: &remote_wal::ddl::Error) -> Option<(StatusCode, &'static str)> {
    use remote_wal::ddl::Error as D;
    match e {
        D::InvalidTableReference { .. }
        | D::InvalidName { .. }
        | D::InvalidCreateTable { .. }
        | D::InvalidRegionMigration { .. } => Some((StatusCode::BAD_REQUEST, "bad_request")),
        D::TableAlreadyExists { .. } => Some((StatusCode::CONFLICT, "already_exists")),
        D::CreateTableIdInUse { .. } => Some((StatusCode::CONFLICT, "conflict")),
        D::TableNotFound { .. } => Some((StatusCode::NOT_FOUND, "not_found")),
        D::Kv { source } if store_unavailable(source) => {
            Some((StatusCode::SERVICE_UNAVAILABLE, "store_unavailable"))
        }
        D::Wal { source } => wal_kind(source),
        _ => None,
    }
}

/// How the API answers a WAL error it classifies: a prune of a topic outside the pool 404, a metadata store that
/// cannot serve the WAL layer now 503; `None` for the others (500, or a cause further down the chain).
fn wal_kind(e: &remote_wal::wal::Error) -> Option<(StatusCode, &'static str)> {
    match e {
        remote_wal::wal::Error::PruneTopicUnknown { .. } => {
            Some((StatusCode::NOT_FOUND, "not_found"))
        }
        remote_wal::wal::Error::Kv { source } if store_unavailable(source) => {
            Some((StatusCode::SERVICE_UNAVAILABLE, "store_unavailable"))
        }
        _ => None,
    }
}

fn store_unavailable(e: &remote_wal::kv::Error) -> bool {
    e.is_retryable()
}

/// `e` as a `T`, also when it is a boxed `T` (a boxed source is its own link in the chain).
fn downcast<'a, T: std::error::Error + 'static>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    e.downcast_ref::<T>()
        .or_else(|| e.downcast_ref::<Box<T>>().map(|b| b.as_ref()))
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

/// Middleware making every error answer JSON of the API's shape: an answer the router or an extractor built
/// itself (404 for an unknown route, 405 for a method a route does not take, 413 for a body over [`BODY_LIMIT`],
/// a 400 of a rejected extractor) is replaced by `{"error":{"kind","message","retryable"}}`, keeping its status
/// (and a 405's `Allow` header). Answers that already are JSON, and every success, pass unchanged. A 429 gets
/// `Retry-After: 1` when it has none.
pub async fn json_errors(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = excerpt(request.uri().path(), PATH_EXCERPT);
    let mut response = next.run(request).await;
    let status = response.status();
    if status == StatusCode::TOO_MANY_REQUESTS
        && !response.headers().contains_key(header::RETRY_AFTER)
    {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    if !(status.is_client_error() || status.is_server_error()) || is_json(response.headers()) {
        return response;
    }
    let allow = response.headers().get(header::ALLOW).cloned();
    let error = match status {
        StatusCode::NOT_FOUND => ApiError::not_found(format!("no route {method} {path}")),
        StatusCode::METHOD_NOT_ALLOWED => {
            let allowed = allow
                .as_ref()
                .and_then(|a| a.to_str().ok())
                .filter(|a| !a.is_empty())
                .unwrap_or("none");
            ApiError::method_not_allowed(format!(
                "method {method} is not allowed on {path} (allowed: {allowed})"
            ))
        }
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::payload_too_large(format!(
            "the request body of {method} {path} is larger than {BODY_LIMIT} bytes, the most this server reads"
        )),
        other => {
            let text = match axum::body::to_bytes(response.into_body(), 64 * 1024).await {
                Ok(bytes) if !bytes.is_empty() => String::from_utf8_lossy(&bytes).into_owned(),
                _ => other.canonical_reason().unwrap_or("error").to_string(),
            };
            let message = format!("{method} {path}: {text}");
            if other.is_server_error() {
                ApiError::internal(message, false)
            } else {
                ApiError {
                    status: other,
                    kind: "bad_request",
                    message,
                    retryable: false,
                    leader: None,
                }
            }
        }
    };
    let mut answer = error.into_response();
    if let Some(allow) = allow {
        answer.headers_mut().insert(header::ALLOW, allow);
    }
    answer
}

/// Whether an answer's content type is JSON.
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"))
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::ApiError;

    fn classify(e: impl Into<remote_wal::Error>) -> (StatusCode, &'static str, bool) {
        let e = ApiError::from(e.into());
        (e.status, e.kind, e.retryable)
    }

    #[test]
    fn errors_map_to_statuses_through_their_causes() {
        let fenced = remote_wal::ddl::Error::CreateTable {
            table: "greptime.public.t".to_string(),
            source: Box::new(procedures::Error::Fenced { epoch: 8, own: 7 }),
        };
        assert_eq!(
            classify(fenced),
            (StatusCode::SERVICE_UNAVAILABLE, "not_leader", true)
        );
        // A prune of a topic outside the pool names a thing that does not exist: 404, not a server fault.
        let unknown_topic = || remote_wal::wal::Error::PruneTopicUnknown {
            topic: "elsewhere".to_string(),
            key: "__topic_name/kafka/elsewhere".to_string(),
        };
        assert_eq!(
            classify(unknown_topic()),
            (StatusCode::NOT_FOUND, "not_found", false)
        );
        // The same error handed to the engine by a step, as a prune round's would be.
        let in_a_step = remote_wal::ddl::Error::CreateTable {
            table: "greptime.public.t".to_string(),
            source: Box::new(unknown_topic().into()),
        };
        assert_eq!(
            classify(in_a_step),
            (StatusCode::NOT_FOUND, "not_found", false)
        );
        let exists = remote_wal::ddl::Error::TableAlreadyExists {
            table: "greptime.public.t".to_string(),
            table_id: Some(1024),
        };
        assert_eq!(
            classify(exists),
            (StatusCode::CONFLICT, "already_exists", false)
        );
        // A refusal of the procedure's first step reaches here typed, inside the create-table's error.
        let refused = remote_wal::ddl::Error::CreateTable {
            table: "greptime.public.t".to_string(),
            source: Box::new(procedures::Error::ProcedureRefused {
                id: procedures::ProcedureId::new("p"),
                refusal: procedures::Refusal::AlreadyExists,
                message: "table greptime.public.t already exists (table id 1024)".to_string(),
            }),
        };
        assert_eq!(
            classify(refused),
            (StatusCode::CONFLICT, "already_exists", false)
        );
        let invalid = remote_wal::ddl::Error::CreateTable {
            table: "greptime.public.t".to_string(),
            source: Box::new(procedures::Error::ProcedureRefused {
                id: procedures::ProcedureId::new("p"),
                refusal: procedures::Refusal::InvalidRequest,
                message: "invalid".to_string(),
            }),
        };
        assert_eq!(
            classify(invalid),
            (StatusCode::BAD_REQUEST, "bad_request", false)
        );
        let reused = remote_wal::ddl::Error::CreateTableIdInUse {
            procedure_id: "p".to_string(),
            table: "greptime.public.u".to_string(),
            existing: "table greptime.public.t, 1 region(s)".to_string(),
        };
        assert_eq!(classify(reused), (StatusCode::CONFLICT, "conflict", false));
        let unknown = remote_wal::Error::from(procedures::Error::ControlUnknown {
            action: "cancel",
            id: procedures::ProcedureId::new("nope"),
            key: "proc/nope".to_string(),
        });
        assert_eq!(
            classify(unknown),
            (StatusCode::NOT_FOUND, "not_found", false)
        );
        let missing = remote_wal::Error::ProcedureNotFound {
            id: "p".to_string(),
        };
        assert_eq!(
            classify(missing),
            (StatusCode::NOT_FOUND, "not_found", false)
        );
        let bad = remote_wal::ddl::Error::InvalidTableReference {
            name: "a..b".to_string(),
            reason: "empty part".to_string(),
        };
        assert_eq!(
            classify(bad),
            (StatusCode::BAD_REQUEST, "bad_request", false)
        );
        let not_leader = ApiError::from(remote_wal::Error::NotLeader {
            leader: Some("10.0.0.1:3002".to_string()),
        });
        assert_eq!(not_leader.leader.as_deref(), Some("10.0.0.1:3002"));
        let timeout = || remote_wal::kv::Error::EtcdTimeout {
            endpoints: "127.0.0.1:2379".to_string(),
            action: "get",
            key: "k".to_string(),
            timeout: std::time::Duration::from_secs(1),
        };
        assert_eq!(
            classify(remote_wal::Error::from(timeout())),
            (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", true)
        );
        // The same kv error reaching the API inside the engine's (a step's write failed), as the kv layer's own.
        let retryable = procedures::Error::from(timeout()).is_retryable();
        let in_engine = remote_wal::Error::from(procedures::Error::Store {
            action: "write",
            key: "proc/p".to_string(),
            source: Box::new(timeout()),
            retryable,
        });
        assert_eq!(
            classify(in_engine),
            (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", true)
        );
    }
}
