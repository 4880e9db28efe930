//! [`Members`]: one etcd client per cluster member, and the rule for moving between them.
//!
//! A single client balancing over every member keeps sending requests to a member that went down (it fails fast,
//! so it looks least loaded) and has no notion of a member that accepts a request and never answers (blackholed, or
//! cut off in a minority). So the kv backend and the election keep a client per member and choose themselves:
//!
//! - Every call starts at the **preferred** member, the one the last successful call reached.
//! - A member that **refuses the connection** never received the request: the call moves to the next member, writes
//!   included.
//! - A member that **fails transiently** (no answer within the attempt's deadline; gRPC `Unavailable`, `Cancelled`,
//!   `Unknown`, `DeadlineExceeded`, `Aborted` or `ResourceExhausted`; a transport or I/O error) may have received the
//!   request. The next member becomes the preferred one, so the next call (a retry included) goes elsewhere. A call
//!   that may be sent twice ([`Resend::Safe`]: reads, lease calls, campaigns) moves on at once; a write
//!   ([`Resend::Never`]) returns the error, retryable, because whether it was applied is unknown and only its caller
//!   can tell (the procedure engine compares the record it finds with the one it wrote).
//! - Any other error (a refused condition is not an error; an invalid request, permission denied) is the answer.
//!
//! With a user configured ([`super::security`]), each member's client signs in before its first call, inside that
//! call's attempt: a member that refuses or does not answer the sign-in is passed over like any other, and a
//! refused sign-in (a wrong password, an unknown user) is the answer, not retryable.
//!
//! The clients are built with etcd's `require_leader` flag, so a member that lost its raft leader (partitioned into
//! a minority) refuses at once with `Unavailable` instead of holding the request until its own timeout, and with
//! HTTP/2 keep-alive pings while a request is in flight, so a connection that stopped answering is closed (failing
//! its requests) within [`PING_INTERVAL`] + [`PING_TIMEOUT`] even for a call with no deadline of its own (a
//! campaign).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use std::sync::Arc;

use etcd_client::{Client, ConnectOptions};

use super::security::{Loaded, SignIn};

/// How often an HTTP/2 ping checks a connection to a member while a request is in flight on it. Not more often
/// than etcd allows: etcd's `--grpc-keepalive-min-time` (5 s by default) makes it close a connection that pings
/// more often (after three such pings, "too many pings"), which failed every long call (a campaign) every few
/// seconds. For the same reason no ping is sent on an idle connection, which etcd counts against the client too.
pub const PING_INTERVAL: Duration = Duration::from_secs(6);
/// How long a ping may go unanswered before the connection is closed.
pub const PING_TIMEOUT: Duration = Duration::from_secs(3);

/// gRPC status codes that say the member (or the cluster through it) could not serve the request now:
/// CANCELLED, UNKNOWN (what a reset connection surfaces as), DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED,
/// UNAVAILABLE (etcd's "no leader", "leader changed", "request timed out").
const TRANSIENT_CODES: [i32; 6] = [1, 2, 4, 8, 10, 14];

/// Whether a request that may have reached a member may be sent to another one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resend {
    /// Sending it twice changes nothing more than sending it once (a read, a lease call, a campaign).
    Safe,
    /// A write: only a refused connection (the request never left) moves it.
    Never,
}

/// Why a call did not get an answer.
#[derive(Debug)]
pub enum Failure {
    /// The member answered with an error (the last member tried, when the call moved).
    Etcd {
        /// The member's endpoint.
        endpoint: String,
        /// What it answered.
        error: etcd_client::Error,
    },
    /// The member did not answer within the attempt's deadline.
    Timeout {
        /// The member's endpoint.
        endpoint: String,
        /// The deadline.
        after: Duration,
    },
}

/// Connect options every client of ours uses: the connect timeout and per-request timeout (if any) given,
/// `require_leader`, and HTTP/2 keep-alive pings.
pub fn connect_options(
    connect_timeout: Duration,
    request_timeout: Option<Duration>,
) -> ConnectOptions {
    let options = ConnectOptions::new()
        .with_connect_timeout(connect_timeout)
        .with_require_leader(true)
        .with_keep_alive(PING_INTERVAL, PING_TIMEOUT)
        .with_keep_alive_while_idle(false);
    match request_timeout {
        Some(timeout) => options.with_timeout(timeout),
        None => options,
    }
}

/// Builds the client of one member with `loaded`'s options (TLS included), and its [`SignIn`]. Connecting is lazy:
/// nothing is sent before the first call.
pub async fn connect_member(
    endpoint: &str,
    loaded: &Loaded,
) -> Result<(Client, Arc<SignIn>), etcd_client::Error> {
    let client = Client::connect([endpoint], Some(loaded.options.clone())).await?;
    let sign_in = SignIn::new(client.clone(), loaded.credentials.clone());
    Ok((client, sign_in))
}

/// One client per member, in the configured order, and the member calls start at.
#[derive(Debug)]
pub struct Members<C> {
    clients: Vec<C>,
    endpoints: Vec<String>,
    preferred: AtomicUsize,
    /// Each member's sign-in (empty: no user configured).
    sign_in: Vec<Arc<SignIn>>,
}

impl<C: Clone> Members<C> {
    /// The clients, one per endpoint, in the same order; the first is preferred.
    pub fn new(clients: Vec<C>, endpoints: Vec<String>) -> Self {
        Members {
            clients,
            endpoints,
            preferred: AtomicUsize::new(0),
            sign_in: Vec::new(),
        }
    }

    /// The same members, each signing in (one [`SignIn`] per member, in order) before its first call.
    pub fn with_sign_in(mut self, sign_in: Vec<Arc<SignIn>>) -> Self {
        self.sign_in = sign_in;
        self
    }

    /// The members' sign-ins, for another set of clients on the same connections (whose clones share the token).
    pub fn sign_in(&self) -> Vec<Arc<SignIn>> {
        self.sign_in.clone()
    }

    /// Signs member `i` in unless done already: whoever uses [`Members::member`] directly calls this first.
    pub async fn signed_in(&self, i: usize) -> Result<(), etcd_client::Error> {
        match self.sign_in.get(i % self.clients.len().max(1)) {
            Some(sign_in) => sign_in.ensure().await,
            None => Ok(()),
        }
    }

    /// How many members there are.
    pub fn len(&self) -> usize {
        self.clients.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    /// The member calls start at now.
    pub fn preferred(&self) -> usize {
        self.preferred.load(Ordering::Relaxed) % self.len().max(1)
    }

    /// Member `i`'s client and endpoint.
    pub fn member(&self, i: usize) -> (C, &str) {
        let i = i % self.clients.len().max(1);
        (self.clients[i].clone(), self.endpoints[i].as_str())
    }

    /// Prefers `i` from now on.
    pub fn prefer(&self, i: usize) {
        self.preferred.store(i, Ordering::Relaxed);
    }

    /// Member `i` failed: unless another call already moved on, the next member becomes the preferred one.
    pub fn pass_over(&self, i: usize) {
        let next = (i + 1) % self.clients.len().max(1);
        let _ = self
            .preferred
            .compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Runs `f` on members by the rules in the module documentation, each attempt under `attempt`; at most one
    /// attempt per member.
    pub async fn call<T, F, Fut>(
        &self,
        attempt: Duration,
        resend: Resend,
        f: F,
    ) -> Result<T, Failure>
    where
        F: Fn(C) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let n = self.clients.len();
        let start = self.preferred();
        let mut last = None;
        for step in 0..n {
            let i = (start + step) % n;
            let endpoint = self.endpoints[i].clone();
            let client = self.clients[i].clone();
            let signed_in = async {
                self.signed_in(i).await?;
                f(client).await
            };
            let failure = match tokio::time::timeout(attempt, signed_in).await {
                Ok(Ok(out)) => {
                    self.prefer(i);
                    return Ok(out);
                }
                Ok(Err(error))
                    if is_connection_refused(&error) || tls_refusal(&error).is_some() =>
                {
                    last = Some(Failure::Etcd { endpoint, error });
                    continue;
                }
                Ok(Err(error)) if is_transient(&error) => Failure::Etcd { endpoint, error },
                Ok(Err(error)) => return Err(Failure::Etcd { endpoint, error }),
                Err(_) => Failure::Timeout {
                    endpoint,
                    after: attempt,
                },
            };
            self.pass_over(i);
            if resend == Resend::Never {
                return Err(failure);
            }
            last = Some(failure);
        }
        Err(last.unwrap_or(Failure::Etcd {
            endpoint: String::new(),
            error: etcd_client::Error::InvalidArgs("no endpoints".into()),
        }))
    }
}

/// Whether `e` is a member refusing the connection: the request was never sent to it.
pub fn is_connection_refused(e: &etcd_client::Error) -> bool {
    use std::error::Error as _;
    let mut cause: Option<&(dyn std::error::Error + 'static)> = match e {
        etcd_client::Error::GRpcStatus(status) => status.source(),
        other => other.source(),
    };
    while let Some(c) = cause {
        if c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        cause = c.source();
    }
    false
}

/// What a failed TLS handshake with a member means, when `e` is one: the request was never sent (like a refused
/// connection, the call moves to the next member), and trying again changes nothing until the configuration or
/// the certificates do (not retryable).
pub fn tls_refusal(e: &etcd_client::Error) -> Option<&'static str> {
    use std::error::Error as _;
    let mut text = e.to_string();
    let mut cause: Option<&(dyn std::error::Error + 'static)> = match e {
        etcd_client::Error::GRpcStatus(status) => {
            text.push_str(status.message());
            status.source()
        }
        other => other.source(),
    };
    while let Some(c) = cause {
        text.push(' ');
        text.push_str(&c.to_string());
        cause = c.source();
    }
    if text.contains("invalid peer certificate") {
        Some(
            "TLS handshake failed: the server's certificate is not signed by an authority in metadata_store.tls.ca \
             or does not name the endpoint's host",
        )
    } else if text.contains("received fatal alert") {
        Some(
            "TLS handshake failed: the server refused it (it wants a client certificate its authority signed: check \
             metadata_store.tls.cert and key)",
        )
    } else if text.contains("tls handshake eof")
        || text.contains("corrupt message")
        || text.contains("InvalidContentType")
    {
        Some(
            "TLS handshake failed: the server closed the connection during the handshake (does it serve TLS on this \
             port? without TLS, remove metadata_store.tls)",
        )
    } else {
        None
    }
}

/// A hint for a connection that failed without a word from etcd when connecting (`tls`: whether TLS is
/// configured): TLS 1.3 finishes the client's side of the handshake before the server checks the client certificate,
/// so a refused one may show as a closed or reset connection only; and a TLS-only server closes a plaintext client's
/// connection at once.
pub fn connect_hint(e: &etcd_client::Error, tls: bool) -> Option<&'static str> {
    let etcd_answered = match e {
        etcd_client::Error::GRpcStatus(status) => status.message().contains("etcdserver"),
        _ => false,
    };
    if etcd_answered || tls_refusal(e).is_some() || !is_transient(e) || is_connection_refused(e) {
        return None;
    }
    Some(if tls {
        "with TLS, a connection closed or reset at once usually means the server wants a client certificate its \
         authority signed (metadata_store.tls.cert and key) or does not serve TLS on this port"
    } else {
        "a connection closed at once may mean the server serves TLS only (configure metadata_store.tls)"
    })
}

/// Whether an etcd client error says the member or the cluster could not serve the request now (so it may clear up
/// on retry, or on another member): see the module documentation. A refused TLS handshake ([`tls_refusal`]) is not.
pub fn is_transient(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    if tls_refusal(e).is_some() {
        return false;
    }
    match e {
        E::GRpcStatus(status) => is_transient_code(i32::from(status.code())),
        E::TransportError(_) | E::IoError(_) => true,
        _ => false,
    }
}

/// Whether a gRPC status code is one of [`TRANSIENT_CODES`].
fn is_transient_code(code: i32) -> bool {
    TRANSIENT_CODES.contains(&code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_faults_are_transient_and_request_faults_are_not() {
        // CANCELLED, UNKNOWN, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, UNAVAILABLE.
        for code in [1, 2, 4, 8, 10, 14] {
            assert!(is_transient_code(code), "{code}");
        }
        // INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED, FAILED_PRECONDITION, OUT_OF_RANGE, UNAUTHENTICATED.
        for code in [3, 5, 7, 9, 11, 16] {
            assert!(!is_transient_code(code), "{code}");
        }
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(is_transient(&etcd_client::Error::IoError(reset)));
        assert!(!is_transient(&etcd_client::Error::InvalidArgs(
            "bad".into()
        )));
    }

    /// A fake member: answers, fails with `code`, or never answers.
    #[derive(Clone, Copy, Debug)]
    enum Fake {
        Answers,
        /// Fails transiently (a reset connection).
        Resets,
        /// Refuses the request (an invalid argument).
        Refuses,
        Hangs,
    }

    async fn run(fake: Fake) -> Result<usize, etcd_client::Error> {
        match fake {
            Fake::Answers => Ok(1),
            Fake::Resets => Err(etcd_client::Error::IoError(std::io::Error::from(
                std::io::ErrorKind::ConnectionReset,
            ))),
            Fake::Refuses => Err(etcd_client::Error::InvalidArgs("bad".into())),
            Fake::Hangs => std::future::pending().await,
        }
    }

    fn members(fakes: &[Fake]) -> Members<Fake> {
        Members::new(
            fakes.to_vec(),
            (0..fakes.len()).map(|i| format!("m{i}")).collect(),
        )
    }

    #[tokio::test]
    async fn a_read_moves_past_a_hung_member_and_prefers_the_one_that_answered() {
        let m = members(&[Fake::Hangs, Fake::Resets, Fake::Answers]);
        let out = m.call(Duration::from_millis(50), Resend::Safe, run).await;
        assert_eq!(out.ok(), Some(1));
        assert_eq!(m.preferred(), 2);
    }

    #[tokio::test]
    async fn a_write_on_a_hung_member_fails_retryably_and_the_next_call_starts_elsewhere() {
        let m = members(&[Fake::Hangs, Fake::Answers, Fake::Answers]);
        let out = m.call(Duration::from_millis(50), Resend::Never, run).await;
        match out {
            Err(Failure::Timeout { endpoint, .. }) => assert_eq!(endpoint, "m0"),
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert_eq!(m.preferred(), 1);
        let again = m.call(Duration::from_millis(50), Resend::Never, run).await;
        assert_eq!(again.ok(), Some(1));
    }

    #[tokio::test]
    async fn a_request_error_is_the_answer_and_keeps_the_member() {
        let m = members(&[Fake::Refuses, Fake::Answers]);
        let out = m.call(Duration::from_millis(50), Resend::Safe, run).await;
        assert!(matches!(out, Err(Failure::Etcd { ref endpoint, .. }) if endpoint == "m0"));
        assert_eq!(m.preferred(), 0);
    }

    #[tokio::test]
    async fn every_member_failing_returns_the_last_failure() {
        let m = members(&[Fake::Hangs, Fake::Resets]);
        let out = m.call(Duration::from_millis(50), Resend::Safe, run).await;
        match out {
            Err(Failure::Etcd { endpoint, error }) => {
                assert_eq!(endpoint, "m1");
                assert!(is_transient(&error));
            }
            other => panic!("expected the last member's error, got {other:?}"),
        }
    }
}
