//! The datanode's side of the heartbeat protocol: [`MetasrvLink`] (how a datanode reaches the metasrv leader —
//! HTTP in `walctl datanode`, anything in an embedding database) and [`run`], which registers the datanode and then
//! heartbeats every interval, applying each answer's leases from the moment its heartbeat was sent.
//!
//! A region opened or closed is reported at once rather than at the next interval, and an answer may ask for the
//! next heartbeat sooner (a region handed over to this datanode waits for its old holder).
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
/// datanode and returns the error). A heartbeat goes out sooner when the datanode has news (a region opened or
/// closed: [`Datanode::report_wanted`]) or the last answer asked for one sooner
/// ([`HeartbeatResponse::heartbeat_in_ms`]), never closer than [`MIN_HEARTBEAT_GAP`] to the one before.
pub async fn run(
    datanode: Arc<Datanode>,
    link: Arc<dyn MetasrvLink>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<()> {
    let interval = datanode.options().heartbeat_interval;
    let gap = MIN_HEARTBEAT_GAP.min(interval);
    let mut failures = 0u32;
    // The regular schedule, which early heartbeats do not move (the metasrv's failure detector measures it).
    let mut regular = tokio::time::Instant::now();
    // An earlier heartbeat the last answer asked for.
    let mut asked: Option<tokio::time::Instant> = None;
    let mut last_sent: Option<tokio::time::Instant> = None;
    loop {
        let wake = asked.map_or(regular, |a| a.min(regular));
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            _ = datanode.report_wanted() => {}
            _ = shutdown.changed() => return Ok(()),
        }
        if *shutdown.borrow() {
            return Ok(());
        }
        if let Some(last) = last_sent {
            tokio::time::sleep_until(last + gap).await;
        }
        datanode.reopen_poisoned().await;
        let now = tokio::time::Instant::now();
        let early = now < regular;
        if !early {
            regular = now + interval;
        }
        asked = None;
        let request = datanode.heartbeat_request_early(early);
        let sent_at = Instant::now();
        let sent = tokio::time::Instant::from_std(sent_at);
        last_sent = Some(sent);
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
                if let Some(ms) = response.heartbeat_in_ms {
                    asked = Some(sent + Duration::from_millis(ms));
                }
                datanode.dropped_reported(&request.dropped);
                datanode.closed_reported(&request.closed);
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

/// The least time between two heartbeats of one datanode, however much news it has.
pub const MIN_HEARTBEAT_GAP: Duration = Duration::from_millis(20);

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
