//! `walctl datanode`: a datanode process (`docs/datanode.md`). It registers with the `walctl serve` leader (a new
//! incarnation), heartbeats every `[datanode] heartbeat_interval`, opens the regions the metasrv gives it (each
//! replayed from region storage and its WAL), takes writes for the regions it holds a lease on, and serves its
//! HTTP API until SIGTERM/SIGINT. Told its incarnation is stale, it stops serving and exits non-zero.
//!
//! Its calls to `walctl serve` carry `[datanode] token_file`'s token and check `https://` servers against
//! `[datanode] ca`; its own API asks for `[datanode] auth`'s tokens when set (re-read on SIGHUP), and bounds
//! connections as the server's does (`docs/security.md`).

mod api;
pub mod link;

use std::path::Path;
use std::sync::Arc;

use datanode::{Datanode, DatanodeOptions};
use remote_wal::config::MetasrvConfig;
use remote_wal::wal::WalConfig;
use tokio::sync::watch;

use crate::Failure;

/// Runs the datanode of the config file's `[datanode]` section until SIGTERM or SIGINT.
pub async fn run(config_path: Option<&Path>) -> Result<(), Failure> {
    let Some(path) = config_path else {
        return Err(Failure::Refused(
            "walctl datanode needs --config FILE with a [datanode] section".to_string(),
        ));
    };
    let (config, section) = MetasrvConfig::from_file_with_datanode(path)?;
    // With TLS the registered address says so: clients reach it by `https://` and check its certificate.
    let address = match &section.tls {
        Some(_) => format!("https://{}", section.advertised()),
        None => section.advertised().to_string(),
    };
    let tls = match &section.tls {
        Some(tls) => Some(
            crate::serve::listener::tls_config(Path::new(&tls.cert), Path::new(&tls.key))
                .map_err(|e| Failure::Refused(format!("[datanode] tls: {e}")))?,
        ),
        None => None,
    };
    let options = DatanodeOptions {
        id: section.id,
        address,
        wal_dir: section.wal_dir(&config.datanodes),
        region_storage: section.region_storage.clone().into(),
        kafka: match &config.wal {
            WalConfig::Kafka(kafka) => Some(kafka.clone()),
            WalConfig::RaftEngine => None,
        },
        heartbeat_interval: section.heartbeat_interval,
        flush_threshold: section.flush_threshold,
        partitions: None,
        topic_ids: None,
    };
    let listener = tokio::net::TcpListener::bind(&section.listen)
        .await
        .map_err(|e| {
            Failure::Refused(format!(
                "cannot listen on {} ([datanode] listen): {e}",
                section.listen
            ))
        })?;
    let access = crate::access::Access::from_files(&section.token_file, &section.ca)?;
    let auth = match &section.auth {
        Some(auth) => Some(Arc::new(
            crate::serve::auth::Auth::load(Path::new(&auth.tokens_file), false)
                .map_err(|e| Failure::Refused(format!("[datanode] auth: {e}")))?,
        )),
        None => None,
    };
    let datanode = Arc::new(Datanode::new(options));
    let link: Arc<dyn datanode::heartbeat::MetasrvLink> = Arc::new(link::HttpLink::new(
        &section.metasrv,
        section
            .heartbeat_interval
            .max(std::time::Duration::from_millis(500)),
        section.id,
        access,
    ));
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let mut app = api::router(datanode.clone());
    let mut reloads = None;
    if let Some(auth) = auth {
        reloads = Some(tokio::spawn(crate::serve::reload_on_sighup(auth.clone())));
        app = app.layer(axum::middleware::from_fn_with_state(
            auth,
            crate::serve::auth::require_token,
        ));
    }
    let bound = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| section.listen.clone());
    println!("listening on {bound}");
    // The server's connection loop: the same connection cap and header timeout (their defaults).
    let options = crate::serve::listener::ListenOptions {
        tls,
        header_timeout: remote_wal::config::DEFAULT_HEADER_TIMEOUT,
        max_connections: remote_wal::config::DEFAULT_MAX_CONNECTIONS,
        section: "[datanode]",
        open: Default::default(),
        refused: Default::default(),
    };
    let http = tokio::spawn(crate::serve::listener::serve(
        listener,
        app,
        options,
        shutdown_rx.clone(),
    ));

    let mut registering = shutdown_rx.clone();
    let heartbeats = {
        let datanode = datanode.clone();
        let shutdown = shutdown_rx.clone();
        tokio::spawn(async move {
            datanode::heartbeat::register(&datanode, link.as_ref(), &mut registering).await?;
            datanode::heartbeat::run(datanode, link, shutdown).await
        })
    };
    let outcome = tokio::select! {
        signal = crate::serve::wait_for_signal() => { signal?; None }
        done = heartbeats => Some(done),
    };
    datanode.stop();
    if let Some(reloads) = reloads {
        reloads.abort();
    }
    shutdown_tx.send_replace(true);
    let _ = http.await;
    match outcome {
        None | Some(Ok(Ok(()))) => Ok(()),
        Some(Ok(Err(e))) => Err(Failure::Refused(e.to_string())),
        Some(Err(e)) => Err(Failure::Refused(format!(
            "the heartbeat task ended abnormally: {e}"
        ))),
    }
}
