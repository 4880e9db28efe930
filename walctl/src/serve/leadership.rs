//! The server's life as leader or follower: campaign, lead (start the manager, ready the pool, then prune the WAL
//! every `[wal] prune_interval`) until the term is lost or the server shuts down, then stop the manager and
//! campaign again. Only the leader prunes: the periodic prune is part of leading, dropped with the term.

use std::sync::Arc;
use std::time::Duration;

use remote_wal::metasrv::Metasrv;
use remote_wal::metasrv::election::Election;
use remote_wal::wal::WalConfig;
use remote_wal::wal::prune::round::TopicOutcome;
use tokio::sync::watch;

use crate::serve::metrics::Metrics;

/// How long to wait before campaigning or starting again after an error.
const RETRY_DELAY: Duration = Duration::from_secs(1);

/// What this server is now, published to the HTTP handlers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Status {
    /// This server's epoch while it leads.
    pub leading: Option<u64>,
    /// The procedure manager runs (recovery done).
    pub manager_started: bool,
    /// New regions can get WAL options (the Kafka pool is ready, or complete in the store; always for
    /// raft-engine).
    pub pool_ready: bool,
    /// What this term's check of the Kafka brokers found (`None` for raft-engine, and while not leading).
    pub brokers: Option<BrokerCheck>,
}

/// Where this term's check of the Kafka WAL's brokers (the pool's bootstrap, retried until it completes) stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BrokerCheck {
    /// Not finished yet: the pool, if ready, is served from the metadata store.
    Unchecked,
    /// The bootstrap completed: every pool topic is on the brokers.
    Ok,
    /// The last bootstrap failed (the brokers unreachable, or a topic they refused); retried.
    Failed(String),
}

impl BrokerCheck {
    /// `unchecked`, `ok` or `failed: <why>`, as `/ready`, `/v1/leader` and the page show it.
    pub fn describe(&self) -> String {
        match self {
            BrokerCheck::Unchecked => "unchecked".to_string(),
            BrokerCheck::Ok => "ok".to_string(),
            BrokerCheck::Failed(why) => format!("failed: {why}"),
        }
    }
}

impl Status {
    /// Leads, with the manager started and the pool ready.
    pub fn ready(&self) -> bool {
        self.leading.is_some() && self.manager_started && self.pool_ready
    }
}

/// Runs the server's roles until `shutdown` turns true; returns once the manager is stopped and, on etcd, the
/// leadership resigned.
pub async fn run(
    metasrv: Arc<Metasrv>,
    election: Option<Arc<Election>>,
    status: watch::Sender<Status>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let Some(election) = election else {
        // redb or memory: this process holds the store alone, so it leads from the start.
        tokio::select! {
            _ = lead(&metasrv, &status, None, &metrics) => {}
            _ = shutdown.wait_for(|s| *s) => {}
        }
        stop(&metasrv, &status, &metrics).await;
        return;
    };
    loop {
        let campaign = tokio::select! {
            term = election.campaign() => Some(term),
            _ = shutdown.wait_for(|s| *s) => None,
        };
        let Some(campaign) = campaign else {
            election.withdraw().await;
            return;
        };
        let mut term = match campaign {
            Ok(term) => term,
            Err(e) => {
                tracing::warn!(error = %e, "campaign failed; campaigning again");
                tokio::select! {
                    _ = tokio::time::sleep(RETRY_DELAY) => continue,
                    _ = shutdown.wait_for(|s| *s) => return,
                }
            }
        };
        metrics.elections_won.inc();
        let epoch = term.epoch();
        let shutting_down = tokio::select! {
            _ = lead(&metasrv, &status, Some(epoch), &metrics) => false,
            _ = term.lost() => false,
            _ = shutdown.wait_for(|s| *s) => true,
        };
        stop(&metasrv, &status, &metrics).await;
        if !shutting_down {
            metrics.elections_lost.inc();
        }
        // Resign in both cases: on a shutdown so a follower wins at once; after a lost term so that a lease that is
        // in fact still alive (a write found the epoch superseded) does not keep this server's key in the way.
        election.resign(term).await;
        if shutting_down || *shutdown.borrow() {
            return;
        }
    }
}

/// Leads: starts the manager (recovering unfinished procedures), then readies the WAL pool, retrying each until it
/// works, then prunes the WAL periodically (or waits) forever (the caller's select ends the term).
async fn lead(
    metasrv: &Metasrv,
    status: &watch::Sender<Status>,
    term_epoch: Option<u64>,
    metrics: &Metrics,
) {
    // Leases this term grants are reckoned from here: a previous leader stopped answering before its term ended.
    metasrv.datanode_registry().begin_term();
    loop {
        match metasrv.start_procedures().await {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!(error = %e, "could not start the procedure manager; retrying");
                tokio::time::sleep(RETRY_DELAY).await;
            }
        }
    }
    let epoch = term_epoch
        .or_else(|| metasrv.procedure_manager().epoch())
        .unwrap_or(0);
    let kafka = matches!(metasrv.config().wal, WalConfig::Kafka(_));
    status.send_replace(Status {
        leading: Some(epoch),
        manager_started: true,
        pool_ready: false,
        brokers: kafka.then_some(BrokerCheck::Unchecked),
    });
    tracing::info!(epoch, "leading: the procedure manager runs");
    tokio::select! {
        () = ready_then_prune(metasrv, status, epoch, metrics) => {}
        () = fail_over_periodically(metasrv) => {}
    }
}

/// How often the leader looks for failed datanodes to fail over: the suspicion is read from memory, so often
/// enough that the check adds little to the detector's own time.
const FAILOVER_CHECK: std::time::Duration = std::time::Duration::from_millis(100);

/// Every [`FAILOVER_CHECK`], fails over the datanodes the registry finds failed (`Metasrv::
/// fail_over_failed_datanodes`; a failover already submitted is not started again). Never returns.
async fn fail_over_periodically(metasrv: &Metasrv) {
    let mut ticks = tokio::time::interval(FAILOVER_CHECK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match metasrv.fail_over_failed_datanodes().await {
            Ok(submitted) => {
                for id in submitted {
                    tracing::info!(procedure_id = %id, "a datanode failed: its regions move to live datanodes");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not fail over the failed datanodes; trying again")
            }
        }
    }
}

/// Readies the WAL pool, retrying until it works, then prunes the WAL periodically. Never returns.
///
/// A Kafka pool the store holds whole was made usable by the manager's start without asking the brokers: the
/// server is ready for DDL at once, and the bootstrap below (the same procedure, through the same fenced manager,
/// as for a pool not persisted yet) checks the brokers meanwhile; its outcome is [`Status::brokers`]. A pool not
/// persisted yet is ready only once the bootstrap completes. Each failed attempt logs one warning and waits
/// [`RETRY_DELAY`] (besides the brokers' own deadline inside the attempt).
async fn ready_then_prune(
    metasrv: &Metasrv,
    status: &watch::Sender<Status>,
    epoch: u64,
    metrics: &Metrics,
) {
    let kafka = matches!(metasrv.config().wal, WalConfig::Kafka(_));
    if kafka {
        metrics.wal_brokers_unchecked.set(1);
    }
    if kafka && metasrv.is_wal_ready() {
        status.send_modify(|s| s.pool_ready = true);
        tracing::info!(
            epoch,
            "ready: the WAL topic pool is served from the metadata store while its brokers are checked"
        );
    }
    loop {
        let check = match metasrv.bootstrap(|_| {}).await {
            Ok(report) if report.ready => break,
            Ok(_) => {
                tracing::warn!("the WAL pool is not ready yet; retrying");
                "the bootstrap finished but the pool is not ready".to_string()
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not ready the WAL pool; retrying");
                e.to_string()
            }
        };
        // A check that reached the brokers and found a topic missing makes the pool not ready; one that could not
        // reach them leaves a pool the store holds whole ready.
        let pool_ready = metasrv.is_wal_ready();
        status.send_modify(|s| {
            s.pool_ready = pool_ready;
            s.brokers = kafka.then_some(BrokerCheck::Failed(check));
        });
        tokio::time::sleep(RETRY_DELAY).await;
    }
    let was_ready = status.borrow().pool_ready;
    status.send_modify(|s| {
        s.pool_ready = true;
        s.brokers = kafka.then_some(BrokerCheck::Ok);
    });
    metrics.wal_brokers_unchecked.set(0);
    if was_ready {
        tracing::info!(epoch, "the WAL topic pool's brokers are checked");
    } else {
        tracing::info!(epoch, "ready");
    }
    prune_periodically(metasrv, metrics).await
}

/// Every `[wal] prune_interval` (a Kafka WAL with a non-zero interval; else it only waits), runs one WAL prune
/// round over every topic of the pool; a topic that failed, or a round that could not run, is logged and counted,
/// and the next round runs at the next tick. Never returns.
async fn prune_periodically(metasrv: &Metasrv, metrics: &Metrics) {
    let interval = match &metasrv.config().wal {
        WalConfig::Kafka(kafka) if !kafka.prune_interval.is_zero() => kafka.prune_interval,
        _ => return std::future::pending::<()>().await,
    };
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match metasrv.prune_wal(None).await {
            Ok(round) => {
                for topic in &round.topics {
                    match &topic.outcome {
                        TopicOutcome::Pruned {
                            old_pruned_entry_id,
                            new_pruned_entry_id,
                            ..
                        } => tracing::info!(
                            topic = %topic.topic,
                            old = old_pruned_entry_id,
                            new = new_pruned_entry_id,
                            "periodic WAL prune"
                        ),
                        TopicOutcome::Skipped { reason, .. } => {
                            tracing::info!(topic = %topic.topic, reason = %reason, "periodic WAL prune skipped the topic")
                        }
                        TopicOutcome::Failed { step, error, .. } => tracing::warn!(
                            topic = %topic.topic,
                            step = %step,
                            error = %error,
                            "periodic WAL prune failed on the topic; the next round tries it again"
                        ),
                    }
                }
                let (pruned, _, failed) = round.counts();
                metrics.wal_prunes.inc_by(pruned as u64);
                metrics.wal_prune_topic_failures.inc_by(failed as u64);
            }
            Err(e) => {
                metrics.wal_prune_failures.inc();
                tracing::warn!(error = %e, "periodic WAL prune failed; trying again next interval");
            }
        }
    }
}

async fn stop(metasrv: &Metasrv, status: &watch::Sender<Status>, metrics: &Metrics) {
    status.send_replace(Status::default());
    metasrv.datanode_registry().end_term();
    metrics.leader.set(0);
    metrics.wal_brokers_unchecked.set(0);
    if let Err(e) = metasrv.stop().await {
        tracing::warn!(error = %e, "stopping the procedure manager failed");
    }
}
