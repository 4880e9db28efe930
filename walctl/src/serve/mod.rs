//! `walctl serve`: a long-running metasrv with an HTTP API (`docs/server.md`).
//!
//! On etcd and PostgreSQL, every server campaigns in one election (`remote_wal::metasrv::election`); only the leader runs a
//! procedure manager, whose epoch is its term's and whose every state write is conditional on still leading
//! (`docs/ha.md`). Followers answer reads from the store and writes with 503 and the leader's address. On redb the
//! process holds the file alone and leads from the start; a second server refuses to open it.
//!
//! Every server, leader or follower, also renders the procedures page at `GET /` (`page`): who leads, the procedures
//! with stuck ones first, the locks, and the WAL pool's regions per topic.
//!
//! With `[server] auth` every request but `/health` and `/ready` needs a bearer token (`auth`), re-read on SIGHUP;
//! with `[server] tls` the API speaks HTTPS only; connections are capped and timed out (`listener`).
//!
//! SIGTERM or SIGINT: the leader's manager stops (every task joined), then it resigns and revokes its lease, the
//! HTTP server drains, exit 0.

mod api;
pub(crate) mod auth;
mod datanodes;
mod error;
mod leadership;
pub(crate) mod listener;
mod metrics;
mod page;

use std::path::Path;
use std::sync::Arc;

use remote_wal::config::MetasrvConfig;
use remote_wal::kv::redb::RedbOpenMode;
use remote_wal::kv::state_store::LeaderFence;
use remote_wal::metasrv::Metasrv;
use remote_wal::metasrv::election::{Election, ElectionConfig, ElectionStore};
use tokio::sync::watch;

use crate::Failure;

/// Runs the server until SIGTERM or SIGINT. `listen` overrides `[server] listen` (and the advertised address when
/// `advertise` is not set).
pub async fn run(config_path: Option<&Path>, listen: Option<String>) -> Result<(), Failure> {
    let (config, mut server) = match config_path {
        Some(path) => MetasrvConfig::from_file_with_server(path)?,
        None => (MetasrvConfig::embedded(), Default::default()),
    };
    if let Some(listen) = listen {
        server.listen = listen;
        server.validate()?;
    }
    let advertise = server.advertised().to_string();
    // The tokens and the certificate are read before anything is claimed: a bad file stops the start here.
    let auth = match &server.auth {
        Some(auth) => Some(Arc::new(
            auth::Auth::load(Path::new(&auth.tokens_file), server.metrics_public)
                .map_err(|e| Failure::Refused(format!("[server] auth: {e}")))?,
        )),
        None => None,
    };
    let tls = match &server.tls {
        Some(tls) => Some(
            listener::tls_config(Path::new(&tls.cert), Path::new(&tls.key))
                .map_err(|e| Failure::Refused(format!("[server] tls: {e}")))?,
        ),
        None => None,
    };
    let descriptors = listener::raise_descriptor_limit();
    tracing::debug!(?descriptors, "open descriptor limit");

    // On etcd and PostgreSQL the servers elect a leader; on redb the file's lock keeps a second server out.
    let store = ElectionStore::of(&config.metadata_store)?;
    let fence = store.is_some().then(|| Arc::new(LeaderFence::new()));
    let election = match (store, &fence) {
        (Some(store), Some(fence)) => Some(Arc::new(
            Election::connect(
                ElectionConfig {
                    store,
                    connect_timeout: config.metadata_store.connect_timeout,
                    key_prefix: config.metadata_store.key_prefix.clone(),
                    advertise: advertise.clone(),
                    lease_ttl: server.lease_ttl,
                },
                fence.clone(),
            )
            .await?,
        )),
        _ => None,
    };
    // redb: opening takes the file's lock; a second server fails here naming the path.
    let metasrv =
        Arc::new(Metasrv::open_fenced(config, RedbOpenMode::CreateIfMissing, fence).await?);

    let listener = tokio::net::TcpListener::bind(&server.listen)
        .await
        .map_err(|e| {
            Failure::Refused(format!(
                "cannot listen on {} ([server] listen or --listen): {e}",
                server.listen
            ))
        })?;
    let (status_tx, status_rx) = watch::channel(leadership::Status::default());
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let metrics = Arc::new(metrics::Metrics::new());
    metrics.observe(&metasrv);
    let roles = tokio::spawn(leadership::run(
        metasrv.clone(),
        election.clone(),
        status_tx,
        metrics.clone(),
        shutdown_rx.clone(),
    ));
    let app = api::router(
        api::AppState {
            metasrv: metasrv.clone(),
            election,
            status: status_rx,
            metrics: metrics.clone(),
            advertise: advertise.clone(),
            admission: Arc::new(tokio::sync::Semaphore::new(server.max_pending_writes)),
        },
        api::Guard {
            auth: auth.clone(),
            body_timeout: server.body_timeout,
        },
    );
    let reloads = auth.map(|auth| tokio::spawn(reload_on_sighup(auth)));
    tracing::info!(
        listen = %server.listen,
        %advertise,
        tls = server.tls.is_some(),
        auth = server.auth.is_some(),
        "serving"
    );
    // Printed for scripts and tests that start a server on port 0.
    let bound = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| server.listen.clone());
    println!("listening on {bound}");

    let options = listener::ListenOptions {
        tls,
        header_timeout: server.header_timeout,
        max_connections: server.max_connections,
        section: "[server]",
        open: metrics.http_connections.clone(),
        refused: metrics.http_connections_refused.clone(),
    };
    let http = tokio::spawn(listener::serve(listener, app, options, shutdown_rx.clone()));

    wait_for_signal().await?;
    if let Some(reloads) = reloads {
        reloads.abort();
    }
    tracing::info!("shutting down: stepping down and stopping the procedure manager");
    shutdown_tx.send_replace(true);
    if let Err(e) = roles.await {
        tracing::warn!(error = %e, "the leadership task ended abnormally");
    }
    if let Err(e) = http.await {
        tracing::warn!(error = %e, "the HTTP server task ended abnormally");
    }
    Ok(())
}

/// Re-reads the tokens file on every SIGHUP; a file that cannot be read or parsed leaves the old tokens in force
/// and is logged naming the file and the line (never a token).
pub(crate) async fn reload_on_sighup(auth: Arc<auth::Auth>) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangup = match signal(SignalKind::hangup()) {
        Ok(hangup) => hangup,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGHUP: the tokens file will not be re-read");
            return;
        }
    };
    while hangup.recv().await.is_some() {
        match auth.reload() {
            Ok(count) => tracing::info!(
                file = %auth.file().display(),
                tokens = count,
                "re-read the tokens file"
            ),
            Err(e) => tracing::error!(
                error = %e,
                "the tokens file could not be re-read; the tokens read before stay in force"
            ),
        }
    }
}

/// Waits for SIGTERM or SIGINT.
pub(crate) async fn wait_for_signal() -> Result<(), Failure> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())
        .map_err(|e| Failure::Refused(format!("cannot listen for SIGTERM: {e}")))?;
    let mut int = signal(SignalKind::interrupt())
        .map_err(|e| Failure::Refused(format!("cannot listen for SIGINT: {e}")))?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}
