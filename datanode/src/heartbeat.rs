//! The datanode's side of the heartbeat protocol: [`MetasrvLink`] (how a datanode reaches the metasrv leader —
//! HTTP in `walctl datanode`, anything in an embedding database) and [`run`], which registers the datanode and then
//! heartbeats every interval, applying each answer's leases from the moment its heartbeat was sent.
//!
//! A heartbeat that gets no answer within one interval is given up (the next one follows); the regions keep the
//! leases they have until those run out. An answer that the incarnation is stale stops the datanode: it serves no
//! region from then on, and [`run`] returns that error.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use remote_wal::datanode::protocol::{
    HeartbeatRequest, HeartbeatResponse, RegisterRequest, RegisterResponse,
};
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::runtime::Datanode;

/// How a datanode reaches the metasrv leader.
#[async_trait]
pub trait MetasrvLink: Send + Sync {
    /// Registers; the answer carries the new incarnation.
    async fn register(&self, request: &RegisterRequest) -> Result<RegisterResponse>;

    /// Sends a heartbeat. A stale incarnation answers [`Error::StaleIncarnation`].
    async fn heartbeat(&self, request: &HeartbeatRequest) -> Result<HeartbeatResponse>;
}

/// Registers `datanode` (retrying every interval while the metasrv refuses or cannot be reached, until
/// `shutdown`), sets its incarnation, and returns it.
pub async fn register(
    datanode: &Datanode,
    link: &dyn MetasrvLink,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<u64> {
    let options = datanode.options();
    let request = RegisterRequest {
        datanode_id: options.id,
        address: options.address.clone(),
        heartbeat_interval_ms: u64::try_from(options.heartbeat_interval.as_millis())
            .unwrap_or(u64::MAX),
    };
    let mut attempts = 0u32;
    loop {
        match link.register(&request).await {
            Ok(answer) => {
                datanode.set_incarnation(answer.incarnation);
                tracing::info!(
                    datanode = options.id,
                    incarnation = answer.incarnation,
                    "registered"
                );
                return Ok(answer.incarnation);
            }
            Err(e) if e.is_retryable() => {
                attempts += 1;
                if attempts == 1 || attempts.is_multiple_of(10) {
                    tracing::info!(datanode = options.id, error = %e, "registration not accepted yet; retrying");
                }
            }
            Err(e) => return Err(e),
        }
        tokio::select! {
            _ = tokio::time::sleep(options.heartbeat_interval) => {}
            _ = shutdown.changed() => {
                return Err(Error::Metasrv {
                    endpoints: String::new(),
                    detail: "stopped before registering".to_string(),
                    retryable: false,
                });
            }
        }
    }
}

/// Heartbeats every interval until `shutdown` (returns `Ok`) or the incarnation is found stale (stops the
/// datanode and returns the error).
pub async fn run(
    datanode: Arc<Datanode>,
    link: Arc<dyn MetasrvLink>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<()> {
    let interval = datanode.options().heartbeat_interval;
    let mut failures = 0u32;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return Ok(()),
        }
        if *shutdown.borrow() {
            return Ok(());
        }
        datanode.reopen_poisoned().await;
        let request = datanode.heartbeat_request();
        let sent_at = Instant::now();
        match tokio::time::timeout(
            interval.max(Duration::from_millis(100)),
            link.heartbeat(&request),
        )
        .await
        {
            Ok(Ok(response)) => {
                if failures > 0 {
                    tracing::info!(after = failures, "heartbeats answered again");
                }
                failures = 0;
                datanode.dropped_reported(&request.dropped);
                datanode.apply(response, sent_at);
            }
            Ok(Err(e @ Error::StaleIncarnation { .. })) => {
                datanode.stop();
                tracing::error!(error = %e, "this datanode incarnation is stale: stopped serving");
                return Err(e);
            }
            Ok(Err(e)) => {
                failures += 1;
                note_failure(failures, &e.to_string());
            }
            Err(_) => {
                failures += 1;
                note_failure(failures, "no answer within one heartbeat interval");
            }
        }
    }
}

/// A failed heartbeat: its regions' leases run on; after three in a row it is worth a warning.
fn note_failure(failures: u32, what: &str) {
    if failures == 3 {
        tracing::warn!(
            failures,
            error = what,
            "heartbeats fail; leases will run out"
        );
    } else {
        tracing::info!(failures, error = what, "heartbeat failed");
    }
}
