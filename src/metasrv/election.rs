//! [`Election`]: which `walctl serve` leads, decided by etcd's election API under a lease kept alive.
//!
//! Every server campaigns on one election key (`{key_prefix}__metasrv/election`) with a value naming its advertised
//! address. etcd makes the candidate whose key has the lowest create revision the leader; that revision is the
//! leader's **epoch**: strictly increasing across leaders, since each campaign creates a new key. The key is
//! attached to the server's lease, so etcd deletes it when the lease ends, and the [`LeaderFence`] it fills makes
//! every procedure-state write compare that key: a leader whose lease ended cannot write, even if it does not know
//! yet.
//!
//! The election keeps one etcd client per member, as the kv backend does ([`crate::kv::etcd`]): every call starts
//! at the member the last call reached and moves to the next when that member refuses the connection, so a member
//! that is down costs a refused connection, not a failed campaign or a lost keep-alive.
//!
//! The server also stops on its own before that point: a [`Term`] is lost as soon as no keep-alive was
//! acknowledged for two thirds of the TTL (the last third is the safety margin for clocks and a write in flight),
//! or when a write found the leadership gone. The server then stops its manager and campaigns again.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{
    Client, ConnectOptions, GetOptions, LeaderKey, ResignOptions, SortOrder, SortTarget,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::kv::etcd::{describe, is_connection_refused, is_retryable};
use crate::kv::state_store::{LeaderFence, LeaderLease};

/// The election's key, under the metadata store's key prefix.
pub const ELECTION_KEY: &str = "__metasrv/election";

/// How long one etcd call of the election (other than the campaign itself) may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// What a leader's election value holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElectionValue {
    /// The advertised `host:port` of the server's HTTP API.
    pub address: String,
}

/// The current leader as etcd knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LeaderInfo {
    /// Its advertised address.
    pub address: String,
    /// Its epoch (the leader key's create revision).
    pub epoch: u64,
}

/// How to reach etcd and what to campaign with.
#[derive(Clone, Debug)]
pub struct ElectionConfig {
    /// etcd endpoints, `host:port`.
    pub endpoints: Vec<String>,
    /// How long connecting may take.
    pub connect_timeout: Duration,
    /// The metadata store's key prefix (the election key lives under it).
    pub key_prefix: String,
    /// This server's advertised address.
    pub advertise: String,
    /// The lease's time to live (whole seconds, rounded up).
    pub lease_ttl: Duration,
}

/// One etcd client per member, in the configured order, and the member the last call reached.
struct Members {
    clients: Vec<Client>,
    preferred: AtomicUsize,
}

impl Members {
    /// Runs `f` on a member's client: first the member the last call reached, then, while a member refuses the
    /// connection (the request never reached it, so sending it elsewhere is safe), the next, each at most once.
    async fn call<T, F, Fut>(&self, f: F) -> std::result::Result<T, etcd_client::Error>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let n = self.clients.len();
        let start = self.preferred.load(Ordering::Relaxed);
        let mut refused = None;
        for step in 0..n {
            let i = (start + step) % n;
            match f(self.clients[i].clone()).await {
                Err(e) if is_connection_refused(&e) => refused = Some(e),
                outcome => {
                    self.preferred.store(i, Ordering::Relaxed);
                    return outcome;
                }
            }
        }
        Err(refused.unwrap_or_else(|| etcd_client::Error::InvalidArgs("no endpoints".into())))
    }
}

/// A server's participation in the election.
pub struct Election {
    members: Arc<Members>,
    config: ElectionConfig,
    name: String,
    value: Vec<u8>,
    fence: Arc<LeaderFence>,
    /// The lease of the campaign or term in progress, so a shutdown can revoke it ([`Election::withdraw`]).
    lease: std::sync::Mutex<Option<i64>>,
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.name)
            .field("endpoints", &self.config.endpoints)
            .field("advertise", &self.config.advertise)
            .finish_non_exhaustive()
    }
}

/// One period of leadership, from winning the campaign until it is lost or given up.
#[derive(Debug)]
pub struct Term {
    epoch: u64,
    leader: LeaderKey,
    lease: i64,
    lost: watch::Receiver<bool>,
    keeper: JoinHandle<()>,
}

impl Term {
    /// The epoch of this term.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Resolves once leadership can no longer be proven (a keep-alive not acknowledged in time, the lease gone, or a
    /// state write that found the leader key deleted).
    pub async fn lost(&mut self) {
        // An error means the keeper ended, which also ends the term.
        let _ = self.lost.wait_for(|lost| *lost).await;
    }

    /// Whether the term is already lost.
    pub fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }
}

impl Election {
    /// Connects to etcd (without a per-request timeout: a campaign waits as long as another server leads).
    pub async fn connect(config: ElectionConfig, fence: Arc<LeaderFence>) -> Result<Self> {
        let name = format!("{}{ELECTION_KEY}", config.key_prefix);
        let value = serde_json::to_vec(&ElectionValue {
            address: config.advertise.clone(),
        })
        .map_err(|e| Error::Election {
            election: name.clone(),
            endpoints: config.endpoints.join(","),
            action: "encode the election value",
            detail: e.to_string(),
            retryable: false,
        })?;
        let options = ConnectOptions::new().with_connect_timeout(config.connect_timeout);
        // Connecting is lazy: a status call proves a member answers; the first that does is preferred.
        let connecting = async {
            let mut clients = Vec::with_capacity(config.endpoints.len());
            for endpoint in &config.endpoints {
                clients.push(Client::connect([endpoint], Some(options.clone())).await?);
            }
            let members = Members {
                clients,
                preferred: AtomicUsize::new(0),
            };
            members
                .call(|mut client| async move { client.status().await })
                .await?;
            Ok::<_, etcd_client::Error>(members)
        };
        let members = match tokio::time::timeout(config.connect_timeout, connecting).await {
            Ok(Ok(members)) => Arc::new(members),
            Ok(Err(e)) => {
                return Err(error(&name, &config, "connect", &e));
            }
            Err(_) => {
                return Err(Error::Election {
                    election: name,
                    endpoints: config.endpoints.join(","),
                    action: "connect",
                    detail: format!("no answer within {:?}", config.connect_timeout),
                    retryable: true,
                });
            }
        };
        Ok(Election {
            members,
            config,
            name,
            value,
            fence,
            lease: std::sync::Mutex::new(None),
        })
    }

    /// The fence this election fills while it leads.
    pub fn fence(&self) -> &Arc<LeaderFence> {
        &self.fence
    }

    /// The election key in etcd.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This server's advertised address.
    pub fn advertise(&self) -> &str {
        &self.config.advertise
    }

    fn ttl_secs(&self) -> i64 {
        let ttl = self.config.lease_ttl;
        let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
    }

    /// The leader etcd knows now (the candidate key with the lowest create revision), if any.
    pub async fn leader(&self) -> Result<Option<LeaderInfo>> {
        let prefix = format!("{}/", self.name);
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let read = self.members.call(|client| {
            let (prefix, options) = (prefix.clone(), options.clone());
            async move { client.kv_client().get(prefix, Some(options)).await }
        });
        let resp = tokio::time::timeout(CALL_TIMEOUT, read)
            .await
            .map_err(|_| self.timeout("read the leader"))?
            .map_err(|e| error(&self.name, &self.config, "read the leader", &e))?;
        let Some(kv) = resp.kvs().first() else {
            return Ok(None);
        };
        let address = serde_json::from_slice::<ElectionValue>(kv.value())
            .map(|v| v.address)
            .unwrap_or_else(|_| String::from_utf8_lossy(kv.value()).into_owned());
        Ok(Some(LeaderInfo {
            address,
            epoch: u64::try_from(kv.create_revision()).unwrap_or(0),
        }))
    }

    /// Campaigns until this server leads, and returns the term: grants a lease, keeps it alive, and waits in
    /// etcd's campaign. The fence holds the term's leadership when this returns. Cancel-safe: dropping the future
    /// stops the keep-alive, and the lease (so the candidate key) ends within the TTL.
    pub async fn campaign(&self) -> Result<Term> {
        let ttl = self.ttl_secs();
        let grant = self
            .members
            .call(|client| async move { client.lease_client().grant(ttl, None).await });
        let lease = tokio::time::timeout(CALL_TIMEOUT, grant)
            .await
            .map_err(|_| self.timeout("grant the lease"))?
            .map_err(|e| error(&self.name, &self.config, "grant the lease", &e))?
            .id();
        *self.lease.lock().unwrap_or_else(|e| e.into_inner()) = Some(lease);
        let keep_alive = self
            .members
            .call(|client| async move { client.lease_client().keep_alive(lease).await });
        let (keeper, stream) = tokio::time::timeout(CALL_TIMEOUT, keep_alive)
            .await
            .map_err(|_| self.timeout("keep the lease alive"))?
            .map_err(|e| error(&self.name, &self.config, "keep the lease alive", &e))?;
        let (lost_tx, mut lost) = watch::channel(false);
        let keeper = KeepAlive {
            members: self.members.clone(),
            lease,
            keeper,
            stream,
            ttl: self.config.lease_ttl,
            fence: self.fence.clone(),
            lost: lost_tx,
        };
        let keeper = tokio::spawn(keeper.run());
        // The keeper task ends the lease's upkeep when the campaign is dropped or fails.
        let guard = AbortOnDrop(Some(keeper));

        let campaign = self.members.call(|client| {
            let (name, value) = (self.name.clone(), self.value.clone());
            async move { client.election_client().campaign(name, value, lease).await }
        });
        let resp = tokio::select! {
            resp = campaign => resp.map_err(|e| error(&self.name, &self.config, "campaign", &e))?,
            _ = lost.wait_for(|lost| *lost) => {
                return Err(Error::Election {
                    election: self.name.clone(),
                    endpoints: self.config.endpoints.join(","),
                    action: "campaign",
                    detail: "the lease could not be kept alive while waiting for leadership".to_string(),
                    retryable: true,
                });
            }
        };
        let leader = resp.leader().cloned().ok_or_else(|| Error::Election {
            election: self.name.clone(),
            endpoints: self.config.endpoints.join(","),
            action: "campaign",
            detail: "etcd answered the campaign without a leader key".to_string(),
            retryable: true,
        })?;
        let epoch = u64::try_from(leader.rev()).unwrap_or(0);
        let key = leader
            .key()
            .strip_prefix(self.config.key_prefix.as_bytes())
            .unwrap_or(leader.key())
            .to_vec();
        self.fence.set(LeaderLease {
            epoch,
            key,
            value: self.value.clone(),
        });
        if *lost.borrow() {
            // Lost while etcd answered: the keeper cleared the fence before it was set; clear it again.
            self.fence.clear();
        }
        let keeper = guard.defuse();
        tracing::info!(election = %self.name, epoch, address = %self.config.advertise, "won the election");
        Ok(Term {
            epoch,
            leader,
            lease,
            lost,
            keeper,
        })
    }

    /// Gives the term up: the fence is cleared first (no write of this server passes after that), then the
    /// leader key is resigned and the lease revoked so another server wins at once. Best effort on etcd: a
    /// failure is logged; the lease then ends within its TTL.
    pub async fn resign(&self, term: Term) {
        self.fence.clear();
        term.keeper.abort();
        let options = ResignOptions::new().with_leader(term.leader.clone());
        let resign = self.members.call(|client| {
            let options = options.clone();
            async move { client.election_client().resign(Some(options)).await }
        });
        match tokio::time::timeout(CALL_TIMEOUT, resign).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(election = %self.name, error = %describe(&e), "resigning failed")
            }
            Err(_) => tracing::warn!(election = %self.name, "resigning timed out"),
        }
        self.revoke(term.lease).await;
        tracing::info!(election = %self.name, epoch = term.epoch, "resigned");
    }

    /// Withdraws from a campaign given up (the server shuts down while it follows): revokes the campaign's lease,
    /// so its candidate key leaves the queue now rather than when the lease would expire. Best effort.
    pub async fn withdraw(&self) {
        let lease = self.lease.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(lease) = lease {
            self.revoke(lease).await;
        }
    }

    async fn revoke(&self, lease: i64) {
        {
            let mut current = self.lease.lock().unwrap_or_else(|e| e.into_inner());
            if *current == Some(lease) {
                *current = None;
            }
        }
        let revoke = self
            .members
            .call(|client| async move { client.lease_client().revoke(lease).await });
        match tokio::time::timeout(CALL_TIMEOUT, revoke).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(election = %self.name, error = %describe(&e), "revoking the lease failed")
            }
            Err(_) => tracing::warn!(election = %self.name, "revoking the lease timed out"),
        }
    }

    fn timeout(&self, action: &'static str) -> Error {
        Error::Election {
            election: self.name.clone(),
            endpoints: self.config.endpoints.join(","),
            action,
            detail: format!("no answer within {CALL_TIMEOUT:?}"),
            retryable: true,
        }
    }
}

fn error(
    name: &str,
    config: &ElectionConfig,
    action: &'static str,
    e: &etcd_client::Error,
) -> Error {
    Error::Election {
        election: name.to_string(),
        endpoints: config.endpoints.join(","),
        action,
        detail: describe(e),
        retryable: is_retryable(e),
    }
}

/// Aborts the task it holds when dropped, unless defused.
struct AbortOnDrop(Option<JoinHandle<()>>);

impl AbortOnDrop {
    fn defuse(mut self) -> JoinHandle<()> {
        match self.0.take() {
            Some(handle) => handle,
            // Built with Some and defused once: unreachable, but a finished task is a safe answer.
            None => tokio::spawn(async {}),
        }
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(handle) = self.0.take() {
            handle.abort();
        }
    }
}

/// The lease's upkeep: a keep-alive every third of the TTL, and the term declared lost when none was
/// acknowledged for two thirds of it.
struct KeepAlive {
    members: Arc<Members>,
    lease: i64,
    keeper: etcd_client::LeaseKeeper,
    stream: etcd_client::LeaseKeepAliveStream,
    ttl: Duration,
    fence: Arc<LeaderFence>,
    lost: watch::Sender<bool>,
}

impl KeepAlive {
    async fn run(mut self) {
        let interval = self.ttl / 3;
        // Proven alive until: the send time of the last acknowledged keep-alive plus two thirds of the TTL.
        let margin = self.ttl * 2 / 3;
        let mut valid_until = Instant::now() + margin;
        let mut fence = self.fence.subscribe();
        let mut had_lease = fence.borrow().is_some();
        loop {
            let sent = Instant::now();
            let acked = async {
                self.keeper.keep_alive().await?;
                self.stream.message().await
            };
            let outcome = tokio::select! {
                outcome = tokio::time::timeout(interval, acked) => outcome,
                _ = tokio::time::sleep_until(valid_until) => {
                    self.lose("no keep-alive acknowledged within two thirds of the lease TTL");
                    return;
                }
            };
            match outcome {
                Ok(Ok(Some(resp))) if resp.ttl() > 0 => {
                    valid_until = sent + margin;
                }
                Ok(Ok(Some(_))) => {
                    self.lose("etcd says the lease expired");
                    return;
                }
                Ok(Ok(None)) => {
                    self.lose("the keep-alive stream ended");
                    return;
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %describe(&e), "a lease keep-alive failed; retrying");
                    if !self.reopen_before(valid_until).await {
                        return;
                    }
                }
                Err(_) => {
                    tracing::warn!("a lease keep-alive was not answered in time; retrying");
                    // A late answer to this request must not be taken for the answer to the next one (it would
                    // prove the lease alive from a later send time than etcd saw): start a fresh stream.
                    if !self.reopen_before(valid_until).await {
                        return;
                    }
                }
            }
            // Wait for the next round, or notice a write that found the leadership gone.
            let next = sent + interval;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(next) => break,
                    _ = tokio::time::sleep_until(valid_until) => {
                        self.lose("no keep-alive acknowledged within two thirds of the lease TTL");
                        return;
                    }
                    changed = fence.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        let has = fence.borrow_and_update().is_some();
                        if had_lease && !has {
                            self.lose("a state write found the leadership gone");
                            return;
                        }
                        had_lease = has;
                    }
                }
            }
        }
    }

    /// [`KeepAlive::reopen`], unless the lease stops being proven first: then the term is lost (the deadline holds
    /// while the stream is being replaced too, so a member that is slow to answer cannot stretch the term past two
    /// thirds of the TTL) and this returns false.
    async fn reopen_before(&mut self, valid_until: Instant) -> bool {
        let expired = tokio::select! {
            _ = self.reopen() => false,
            _ = tokio::time::sleep_until(valid_until) => true,
        };
        if expired {
            self.lose("no keep-alive acknowledged within two thirds of the lease TTL");
        }
        !expired
    }

    /// Replaces the keep-alive stream, dropping answers still in flight on the old one. Best effort: on failure the
    /// old stream stays, and the next round tries again (the deadline ends the term if none succeeds).
    async fn reopen(&mut self) {
        let interval = self.ttl / 3;
        let lease = self.lease;
        let reopen = self
            .members
            .call(|client| async move { client.lease_client().keep_alive(lease).await });
        match tokio::time::timeout(interval, reopen).await {
            Ok(Ok((keeper, stream))) => {
                self.keeper = keeper;
                self.stream = stream;
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %describe(&e), "reopening the lease keep-alive failed")
            }
            Err(_) => tracing::warn!("reopening the lease keep-alive timed out"),
        }
    }

    fn lose(&self, reason: &str) {
        self.fence.clear();
        tracing::warn!(reason, "leadership can no longer be proven; stepping down");
        self.lost.send_replace(true);
    }
}
