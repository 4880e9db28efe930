//! An embedded command that writes on an etcd or PostgreSQL store takes part in the servers' election (`docs/ha.md`): if a
//! `walctl serve` leads, the command is sent to it; otherwise the command campaigns and runs once it leads, with
//! the term's epoch fencing its writes, then resigns. Its election value carries no address, which tells other
//! commands that this leader takes no request: they wait for their turn.

use std::sync::Arc;
use std::time::Duration;

use remote_wal::config::{MetasrvConfig, ServerConfig};
use remote_wal::kv::state_store::LeaderFence;
use remote_wal::metasrv::election::{Election, ElectionConfig, ElectionStore, LeaderInfo, Term};
use tokio::time::Instant;

use crate::Failure;

/// How often a command waiting for leadership checks whether a server leads now.
const LEADER_POLL: Duration = Duration::from_millis(200);
/// How long a leading server named by the election may take to answer the command's probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Joins the election of the store `config` names, with the `[server]` section's lease TTL.
pub async fn connect(
    config: &MetasrvConfig,
    server: &ServerConfig,
    fence: Arc<LeaderFence>,
) -> Result<Election, Failure> {
    let Some(store) = ElectionStore::of(&config.metadata_store)? else {
        return Err(Failure::Refused(format!(
            "the {} metadata store holds no election",
            config.metadata_store.backend.as_str()
        )));
    };
    Ok(Election::connect(
        ElectionConfig {
            store,
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
        Some(l) => format!(
            "the server at {} (epoch {}), which did not answer",
            l.address, l.epoch
        ),
        None => "none".to_string(),
    }
}

/// Whether a server answers HTTP at `address` within [`PROBE_TIMEOUT`] (any answer: a live process).
async fn answers(address: &str) -> bool {
    let url = format!("http://{address}/v1/leader");
    tokio::task::spawn_blocking(move || {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(PROBE_TIMEOUT))
            .build()
            .new_agent();
        agent.get(&url).call().is_ok()
    })
    .await
    .unwrap_or(false)
}

/// Campaigns until this process leads or a server does, for at most `wait`.
///
/// A server the election names is sent the command only if it answers: a leader killed a moment ago stays named
/// until its lease expires, and the command would otherwise keep knocking at a dead address. Until then the
/// command reads the election again every [`LEADER_POLL`], campaigning all along, so it goes to the server that
/// leads next, or runs itself if it wins.
pub async fn join(election: &Election, wait: Duration) -> Result<Joined, Failure> {
    let deadline = Instant::now() + wait;
    let campaign = election.campaign();
    tokio::pin!(campaign);
    let mut last = None;
    loop {
        match election.leader().await {
            Ok(Some(leader)) if !leader.address.is_empty() => {
                if answers(&leader.address).await {
                    election.withdraw().await;
                    return Ok(Joined::Server(leader.address));
                }
                tracing::debug!(address = %leader.address, "the named leader does not answer; reading again");
                last = Some(leader);
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
