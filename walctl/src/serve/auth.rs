//! Bearer tokens (`[server] auth = { tokens_file = "…" }`, `docs/security.md`): the file's format, the scopes,
//! the check every request passes, and the reload on SIGHUP.
//!
//! A read (`GET`) needs a `read` or a `write` token, anything else a `write` token; `/health` and `/ready` are
//! open, `/metrics` and the page need a `read` token unless `[server] metrics_public = true`. No token, or one the
//! file does not hold: 401 `unauthorized` with `WWW-Authenticate: Bearer`; a `read` token on a write: 403
//! `forbidden`. Tokens are compared in constant time, each against every token of the file. Nothing here ever
//! writes a token (or any word of the file) to a log line or an answer.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use axum::extract::{Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::{Choice, ConstantTimeEq};

use crate::serve::error::ApiError;

/// The shortest token the file takes: a guessable one would protect nothing.
pub const MIN_TOKEN_LEN: usize = 16;

/// What a token allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Reads: every `GET`.
    Read,
    /// Reads and writes.
    Write,
}

/// The tokens of one reading of the file.
pub struct Tokens {
    entries: Vec<(Scope, Vec<u8>)>,
}

impl std::fmt::Debug for Tokens {
    /// The count only: a token is never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} tokens)", self.entries.len())
    }
}

impl Tokens {
    /// Parses the file's text; `origin` (its path) names it in errors, which name the line and never quote it.
    pub fn parse(text: &str, origin: &str) -> Result<Self, String> {
        let mut entries: Vec<(Scope, Vec<u8>, usize)> = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let number = index + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(scope), Some(token), None) = (words.next(), words.next(), words.next())
            else {
                return Err(format!(
                    "{origin} line {number}: expected 'SCOPE TOKEN' (two words: read or write, then the token)"
                ));
            };
            let scope = match scope {
                "read" => Scope::Read,
                "write" => Scope::Write,
                _ => {
                    return Err(format!(
                        "{origin} line {number}: the first word must be the scope, read or write"
                    ));
                }
            };
            if token.len() < MIN_TOKEN_LEN || !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!(
                    "{origin} line {number}: a token must be at least {MIN_TOKEN_LEN} printable ASCII characters"
                ));
            }
            if let Some((_, _, first)) = entries.iter().find(|(_, t, _)| t == token.as_bytes()) {
                return Err(format!(
                    "{origin} line {number}: the same token is already on line {first}"
                ));
            }
            entries.push((scope, token.as_bytes().to_vec(), number));
        }
        if entries.is_empty() {
            return Err(format!(
                "{origin}: holds no token (one a line as 'SCOPE TOKEN', scope read or write)"
            ));
        }
        Ok(Tokens {
            entries: entries.into_iter().map(|(s, t, _)| (s, t)).collect(),
        })
    }

    /// Reads and parses the file at `path`.
    pub fn load(path: &Path) -> Result<Self, String> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the tokens file {origin}: {e}"))?;
        Self::parse(&text, &origin)
    }

    /// How many tokens the file held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The scope of `presented`, compared in constant time against every token (the time does not tell which
    /// token, if any, matched, nor how many of its bytes a guess got right; only whether its length is one of the
    /// tokens').
    pub fn scope_of(&self, presented: &[u8]) -> Option<Scope> {
        let mut read = Choice::from(0);
        let mut write = Choice::from(0);
        for (scope, token) in &self.entries {
            let equal = token.as_slice().ct_eq(presented);
            match scope {
                Scope::Read => read |= equal,
                Scope::Write => write |= equal,
            }
        }
        if bool::from(write) {
            Some(Scope::Write)
        } else if bool::from(read) {
            Some(Scope::Read)
        } else {
            None
        }
    }
}

/// The server's tokens and what needs one.
pub struct Auth {
    file: PathBuf,
    tokens: RwLock<Arc<Tokens>>,
    metrics_public: bool,
}

impl Auth {
    /// Reads the tokens file (an error names it and the line).
    pub fn load(file: &Path, metrics_public: bool) -> Result<Self, String> {
        let tokens = Tokens::load(file)?;
        Ok(Auth {
            file: file.to_path_buf(),
            tokens: RwLock::new(Arc::new(tokens)),
            metrics_public,
        })
    }

    /// Reads the file again: the new tokens replace the old ones, or, when it cannot be read or parsed, the old
    /// ones stay and the error (naming the file and the line) is returned.
    pub fn reload(&self) -> Result<usize, String> {
        let tokens = Tokens::load(&self.file)?;
        let count = tokens.len();
        *self
            .tokens
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(tokens);
        Ok(count)
    }

    /// The file's path.
    pub fn file(&self) -> &Path {
        &self.file
    }

    fn current(&self) -> Arc<Tokens> {
        self.tokens
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The scope `method path` needs; `None`: open to all.
    pub fn needed(&self, method: &Method, path: &str) -> Option<Scope> {
        match path {
            "/health" | "/ready" => None,
            "/metrics" | "/" if self.metrics_public && *method == Method::GET => None,
            _ if *method == Method::GET || *method == Method::HEAD => Some(Scope::Read),
            _ => Some(Scope::Write),
        }
    }
}

/// Middleware: lets a request through when its bearer token has the scope its route needs, else answers 401 or
/// 403 (never reading its body).
pub async fn require_token(
    State(auth): State<Arc<Auth>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(needed) = auth.needed(request.method(), request.uri().path()) else {
        return next.run(request).await;
    };
    match refusal(&auth, &request, needed) {
        None => next.run(request).await,
        Some(mut refused) => {
            if carries_body(&request) {
                // The body is not read, so the connection cannot carry another request: the server closes it
                // after this answer, and says so, or a client would send its next request on it and see the
                // connection drop.
                refused.headers_mut().insert(
                    header::CONNECTION,
                    header::HeaderValue::from_static("close"),
                );
            }
            refused
        }
    }
}

/// Whether the request says a body follows (a length above 0, or a chunked body).
fn carries_body(request: &Request) -> bool {
    let headers = request.headers();
    let length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    length.is_some_and(|n| n > 0) || headers.contains_key(header::TRANSFER_ENCODING)
}

/// The 401 or 403 for a request that needs `needed`, or `None` when its token has that scope.
fn refusal(auth: &Auth, request: &Request, needed: Scope) -> Option<Response> {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| bearer(v.as_bytes()));
    let Some(presented) = presented else {
        return Some(unauthorized(
            "this request needs a bearer token (Authorization: Bearer TOKEN): walctl takes it from --token-file \
             or WALCTL_TOKEN",
            false,
        ));
    };
    match auth.current().scope_of(presented) {
        None => Some(unauthorized(
            "the bearer token is not one of this server's tokens ([server] auth tokens_file)",
            true,
        )),
        Some(scope) if scope < needed => Some(
            ApiError::forbidden(format!(
                "{} {} needs a write token; this one is a read token",
                request.method(),
                remote_wal::ddl::procedure_id::excerpt(request.uri().path(), 100)
            ))
            .into_response(),
        ),
        Some(_) => None,
    }
}

/// The token of an `Authorization: Bearer TOKEN` value (the scheme's case ignored).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let scheme = value.get(..7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = value.get(7..)?.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// A 401 with `WWW-Authenticate: Bearer` (and `error="invalid_token"` when a token was sent).
fn unauthorized(message: &str, invalid: bool) -> Response {
    let mut response = ApiError::unauthorized(message).into_response();
    let challenge = if invalid {
        "Bearer realm=\"walctl\", error=\"invalid_token\""
    } else {
        "Bearer realm=\"walctl\""
    };
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static(challenge),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::{Scope, Tokens, bearer};

    const READ: &str = "r-0123456789abcdef";
    const WRITE: &str = "w-0123456789abcdef";

    #[test]
    fn tokens_parse_with_comments_and_scopes() {
        let text = format!("# operators\n\nread {READ}\n  write   {WRITE}  \n");
        let tokens = Tokens::parse(&text, "tokens").expect("parses");
        assert_eq!(tokens.len(), 2);
        assert_eq!(tokens.scope_of(READ.as_bytes()), Some(Scope::Read));
        assert_eq!(tokens.scope_of(WRITE.as_bytes()), Some(Scope::Write));
        assert_eq!(tokens.scope_of(b"w-0123456789abcdeX"), None);
        assert_eq!(tokens.scope_of(b"w-0123456789abcde"), None);
        assert_eq!(tokens.scope_of(b""), None);
    }

    #[test]
    fn errors_name_the_file_and_line_never_the_token() {
        let cases = [
            (format!("read {READ}\nadmin {WRITE}\n"), "tokens line 2"),
            (format!("{WRITE}\n"), "tokens line 1"),
            (format!("read {READ} extra\n"), "tokens line 1"),
            ("read short-token\n".to_string(), "tokens line 1"),
            (format!("read {READ}\nwrite {READ}\n"), "tokens line 2"),
            ("# nothing\n".to_string(), "tokens: holds no token"),
        ];
        for (text, expected) in cases {
            let error = Tokens::parse(&text, "tokens").expect_err("refused");
            assert!(error.starts_with(expected), "{error}");
            for word in [READ, WRITE, "short-token", "admin", "extra"] {
                assert!(!error.contains(word), "{error} quotes the file");
            }
        }
    }

    #[test]
    fn bearer_takes_the_token_of_the_scheme() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer  abc "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bearer "), None);
        assert_eq!(bearer(b"Bear"), None);
    }
}
