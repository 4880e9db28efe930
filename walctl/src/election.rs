//! An embedded command that writes on an etcd store takes part in the servers' election (`docs/ha.md`): if a
//! `walctl serve` leads, the command is sent to it; otherwise the command campaigns and runs once it leads, with
//! the term's epoch fencing its writes, then resigns. Its election value carries no address, which tells other
//! commands that this leader takes no request: they wait for their turn.

use std::sync::Arc;
use std::time::Duration;

use remote_wal::config::{MetasrvConfig, ServerConfig};
use remote_wal::kv::state_store::LeaderFence;
use remote_wal::metasrv::election::{Election, ElectionConfig, LeaderInfo, Term};
use tokio::time::Instant;

use crate::Failure;

/// How often a command waiting for leadership checks whether a server leads now.
const LEADER_POLL: Duration = Duration::from_millis(200);

/// Joins the election of the store `config` names, with the `[server]` section's lease TTL.
pub async fn connect(
    config: &MetasrvConfig,
    server: &ServerConfig,
    fence: Arc<LeaderFence>,
) -> Result<Election, Failure> {
    Ok(Election::connect(
        ElectionConfig {
            endpoints: config.metadata_store.endpoints.clone(),
            connect_timeout: config.metadata_store.connect_timeout,
            key_prefix: config.metadata_store.key_prefix.clone(),
            advertise: String::new(),
            lease_ttl: server.lease_ttl,
        },
        fence,
    )
    .await?)
}

/// Where the command runs.
pub enum Joined {
    /// A server leads, at this advertised address: send the command there.
    Server(String),
    /// This process leads: run the command here, then resign the term.
    Term(Term),
}

/// Who leads, for an error.
fn describe(leader: Option<&LeaderInfo>) -> String {
    match leader {
        Some(l) if l.address.is_empty() => {
            format!("another walctl command (epoch {})", l.epoch)
        }
        Some(l) => format!("the server at {} (epoch {})", l.address, l.epoch),
        None => "none".to_string(),
    }
}

/// Campaigns until this process leads or a server does, for at most `wait`.
pub async fn join(election: &Election, wait: Duration) -> Result<Joined, Failure> {
    let deadline = Instant::now() + wait;
    let campaign = election.campaign();
    tokio::pin!(campaign);
    let mut last = None;
    loop {
        match election.leader().await {
            Ok(Some(leader)) if !leader.address.is_empty() => {
                election.withdraw().await;
                return Ok(Joined::Server(leader.address));
            }
            Ok(leader) => last = leader,
            Err(e) => tracing::debug!(error = %e, "reading the leader failed; campaigning on"),
        }
        tokio::select! {
            term = &mut campaign => return Ok(Joined::Term(term?)),
            _ = tokio::time::sleep(LEADER_POLL) => {}
        }
        if Instant::now() >= deadline {
            election.withdraw().await;
            return Err(Failure::Refused(format!(
                "this command did not become the leader within {} (--wait); the leader is {}",
                humantime::format_duration(wait),
                describe(last.as_ref())
            )));
        }
    }
}
