//! The server's own connection loop, in place of `axum::serve`, so that a slow or hostile client cannot hold the
//! server (`docs/security.md`, "HTTP"):
//!
//! - at most `[server] max_connections` connections are served at once; one past it is accepted and closed at once
//!   (never queued in the kernel's backlog or in a task);
//! - a request's head must arrive within `[server] header_timeout` of the moment the connection waits for it
//!   (hyper's header read timeout: a fresh connection, an idle keep-alive one, one dripping a header a byte at a
//!   time), the TLS handshake within the same bound;
//! - its body within `[server] body_timeout` ([`read_body`]), up to [`BODY_LIMIT`] bytes;
//! - with `[server] tls`, every connection speaks TLS (rustls, ring); a plain HTTP request on that port is answered
//!   with a 400 telling to call `https://`.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;

use crate::serve::error::{ApiError, BODY_LIMIT};

/// How one listener serves its connections.
#[derive(Clone)]
pub struct ListenOptions {
    /// TLS, when configured.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// The bound on a request head (and the TLS handshake).
    pub header_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
    /// Which setting names these values in messages (`[server]` or `[datanode]`).
    pub section: &'static str,
    /// Connections open now, kept up to date here.
    pub open: Gauge,
    /// Connections closed at once past the cap, counted here.
    pub refused: Counter,
}

/// The first byte of a TLS connection: a handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// The longest request head read from a plain HTTP client on a TLS port before it is answered.
const PLAIN_HEAD_LIMIT: usize = 8 * 1024;

/// Builds the TLS config of `cert` (a PEM chain) and `key` (a PEM private key); the error names the file and why.
pub fn tls_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("cannot read the certificate {}: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("the certificate {} is not PEM: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "the certificate {} holds no PEM certificate",
            cert.display()
        ));
    }
    let private = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("cannot read a PEM private key from {}: {e}", key.display()))?;
    // ring, the provider every TLS connection of the project uses (rustls marks it deprecated only for lacking
    // post-quantum key exchange, which needs aws-lc-rs and a much larger build).
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|e| {
            format!(
                "the key {} does not go with the certificate {}: {e}",
                key.display(),
                cert.display()
            )
        })?;
    Ok(Arc::new(config))
}

/// Serves `app` on `listener` until `shutdown` turns true, then lets the connections finish their requests.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    options: ListenOptions,
    mut shutdown: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(options.max_connections));
    let mut refused: u64 = 0;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stopped(&mut shutdown) => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors (or a connection reset before it was accepted): the server goes on; the pause
                // keeps a full descriptor table from spinning this loop.
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            // Closed at once: a queued connection would hold a descriptor and wait for nothing.
            options.refused.inc();
            refused += 1;
            if refused.is_power_of_two() {
                tracing::info!(
                    max_connections = options.max_connections,
                    refused,
                    "a connection past {} max_connections was closed",
                    options.section
                );
            }
            drop(stream);
            continue;
        };
        let options = options.clone();
        let app = app.clone();
        let shutdown = shutdown.clone();
        options.open.inc();
        tokio::spawn(async move {
            connection(stream, peer, app, &options, shutdown).await;
            options.open.dec();
            drop(permit);
        });
    }
    // Drain: the connections close once their requests are answered (each saw the shutdown).
    let all = u32::try_from(options.max_connections).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(Duration::from_secs(30), permits.acquire_many(all)).await;
}

/// Returns once `shutdown` turns true (or its sender is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}

/// One connection: TLS when configured, then HTTP/1.1 with the header read timeout.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    app: Router,
    options: &ListenOptions,
    shutdown: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let Some(tls) = &options.tls else {
        return http(stream, peer, app, options.header_timeout, shutdown).await;
    };
    let mut first = [0u8; 1];
    match tokio::time::timeout(options.header_timeout, stream.peek(&mut first)).await {
        Ok(Ok(1)) if first[0] == TLS_HANDSHAKE => {}
        Ok(Ok(1)) => return plain_on_tls(stream, options.header_timeout).await,
        _ => return,
    }
    let accepted = tokio::time::timeout(
        options.header_timeout,
        TlsAcceptor::from(tls.clone()).accept(stream),
    )
    .await;
    match accepted {
        Ok(Ok(stream)) => http(stream, peer, app, options.header_timeout, shutdown).await,
        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
    }
}

/// HTTP/1.1 on `io` until the client closes, a timeout closes it, or the server shuts down.
async fn http<I>(
    io: I,
    peer: SocketAddr,
    app: Router,
    header_timeout: Duration,
    mut shutdown: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = TowerToHyperService::new(app);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .keep_alive(true);
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    let served = tokio::select! {
        served = connection.as_mut() => served,
        () = stopped(&mut shutdown) => {
            connection.as_mut().graceful_shutdown();
            connection.as_mut().await
        }
    };
    if let Err(e) = served {
        tracing::debug!(%peer, error = %e, "connection closed");
    }
}

/// A plain HTTP request on the TLS port: its head is read (so the answer is not lost to a reset), then a 400
/// saying to call `https://` is written and the connection closed.
async fn plain_on_tls(mut stream: TcpStream, header_timeout: Duration) {
    let address = stream
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "this server".to_string());
    let read_head = async {
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while head.len() < PLAIN_HEAD_LIMIT && !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        true
    };
    if !matches!(
        tokio::time::timeout(header_timeout, read_head).await,
        Ok(true)
    ) {
        return;
    }
    let body = serde_json::json!({
        "error": {
            "kind": "bad_request",
            "message": format!(
                "{address} speaks HTTPS only: call https://{address} (the request came as plain HTTP)"
            ),
            "retryable": false,
        }
    })
    .to_string();
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let write = async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(header_timeout, write).await;
}

/// Middleware: reads the request's body within `body_timeout` (408 `request_timeout` past it, the connection
/// closed) and up to [`BODY_LIMIT`] bytes (413 past it), and hands it on buffered.
pub async fn read_body(
    State(body_timeout): State<Duration>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    let read = async {
        let mut stream = body.into_data_stream();
        let mut bytes = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| Some(e.to_string()))?;
            if bytes.len() + chunk.len() > BODY_LIMIT {
                return Err(None::<String>);
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    };
    match tokio::time::timeout(body_timeout, read).await {
        Ok(Ok(bytes)) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        // The error middleware words it (413 `payload_too_large`, naming the limit).
        Ok(Err(None)) => StatusCode::PAYLOAD_TOO_LARGE.into_response(),
        Ok(Err(Some(e))) => {
            ApiError::bad_request(format!("reading the request body failed: {e}")).into_response()
        }
        Err(_) => {
            let mut response = ApiError::request_timeout(format!(
                "the request body did not arrive within {} ([server] body_timeout)",
                humantime::format_duration(body_timeout)
            ))
            .into_response();
            response.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
            response
        }
    }
}

/// Raises this process's soft limit of open descriptors to its hard limit, so that `max_connections` (and not the
/// descriptor table) bounds the connections, with room left for the metadata store's and Kafka's; returns the
/// limit in force.
pub fn raise_descriptor_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed, which lives on this stack frame.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return None;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                return Some(raised.rlim_cur);
            }
        }
    }
    Some(limit.rlim_cur)
}
