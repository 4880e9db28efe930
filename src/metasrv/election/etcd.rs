//! The election on etcd: etcd's election API under a lease kept alive.
//!
//! Every server campaigns on one election key (`{key_prefix}__metasrv/election`) with a value naming its advertised
//! address. etcd makes the candidate whose key has the lowest create revision the leader; that revision is the
//! leader's **epoch**: strictly increasing across leaders, since each campaign creates a new key. The key is
//! attached to the server's lease, so etcd deletes it when the lease ends, and the [`LeaderFence`] it fills makes
//! every procedure-state write compare that key: a leader whose lease ended cannot write, even if it does not know
//! yet.
//!
//! The election keeps one etcd client per member, as the kv backend does, and moves between them by the same rules
//! ([`crate::kv::etcd::members`]): a member that refuses, fails transiently or does not answer within a third of the
//! TTL is passed over. The lease's upkeep has clients of its own, on a thread of its own ([`super::upkeep`]): its
//! connections and tasks share nothing with request work, so load on the server cannot delay a keep-alive. It
//! keeps a keep-alive stream open on two members at once: a member that dies, hangs or loses its quorum leaves the
//! other stream proving the lease while a replacement opens on the next member.
//!
//! The server also stops on its own before that point: a term is lost as soon as no keep-alive was
//! acknowledged for two thirds of the TTL (the last third is the safety margin for clocks and a write in flight),
//! or when a write found the leadership gone. The server then stops its manager and campaigns again. The first
//! bound is kept by the fence itself ([`LeaderFence::set_proven_until`]): every acknowledged keep-alive moves it
//! on, and from that instant on no write is sent, whether or not the upkeep has yet noticed that it passed.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, GetOptions, LeaderKey, ResignOptions, SortOrder, SortTarget};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::kv::etcd::describe;
use crate::kv::etcd::members::{self, Failure, Members, Resend};
use crate::kv::state_store::{LeaderFence, LeaderLease};

use super::upkeep::Upkeep;
use super::{AbortOnDrop, ELECTION_KEY, ElectionValue, LeaderInfo};

/// Keep-alives per TTL on each lane (see [`KeepAlive`]).
const CADENCE_PER_TTL: u32 = 6;

/// How many times per cadence a member whose keep-alive stream failed may be tried again. While etcd has no raft
/// leader every member answers "no leader" at once; the keep-alive that saves the term is the first one sent after
/// it has one, so retries come a quarter of a cadence apart (a CI run lost a 5 s term by 10 ms when a refused member
/// waited a whole cadence).
const RETRIES_PER_CADENCE: u32 = 4;

/// How long one etcd call of the election (other than the campaign itself) may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// How to reach etcd and what to campaign with.
#[derive(Clone, Debug)]
pub(super) struct EtcdElectionConfig {
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
    /// TLS and the user every election connection uses (the metadata store's).
    pub security: crate::kv::etcd::EtcdSecurity,
}

/// A server's participation in the election on etcd.
pub(super) struct EtcdElection {
    /// Clients for reading the leader, granting, campaigning, resigning and revoking.
    members: Arc<Members<Client>>,
    /// The lease upkeep's own clients (their own connections, driven on the upkeep's thread).
    keepers: Arc<Members<Client>>,
    /// The thread the lease's upkeep runs on.
    upkeep: Upkeep,
    config: EtcdElectionConfig,
    name: String,
    value: Vec<u8>,
    fence: Arc<LeaderFence>,
    /// The lease of the campaign or term in progress, so a shutdown can revoke it ([`EtcdElection::withdraw`]).
    lease: std::sync::Mutex<Option<i64>>,
}

impl std::fmt::Debug for EtcdElection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdElection")
            .field("name", &self.name)
            .field("endpoints", &self.config.endpoints)
            .field("advertise", &self.config.advertise)
            .finish_non_exhaustive()
    }
}

/// One period of leadership on etcd, from winning the campaign until it is lost or given up.
#[derive(Debug)]
pub(super) struct EtcdTerm {
    epoch: u64,
    leader: LeaderKey,
    lease: i64,
    lost: watch::Receiver<bool>,
    keeper: JoinHandle<()>,
}

impl EtcdTerm {
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

impl EtcdElection {
    /// Connects to etcd (without a per-request timeout: a campaign waits as long as another server leads).
    pub async fn connect(config: EtcdElectionConfig, fence: Arc<LeaderFence>) -> Result<Self> {
        let name = format!("{}{ELECTION_KEY}", config.key_prefix);
        let value = serde_json::to_vec(&ElectionValue {
            address: config.advertise.clone(),
            term: None,
        })
        .map_err(|e| Error::Election {
            store: "etcd",
            election: name.clone(),
            endpoints: config.endpoints.join(","),
            action: "encode the election value",
            detail: e.to_string(),
            retryable: false,
        })?;
        let loaded = config
            .security
            .load(
                &config.endpoints,
                members::connect_options(config.connect_timeout, None),
            )
            .map_err(|e| Error::Election {
                store: "etcd",
                election: name.clone(),
                endpoints: config.endpoints.join(","),
                action: "read the etcd security settings",
                detail: e.to_string(),
                retryable: false,
            })?;
        let upkeep = Upkeep::start(&name).map_err(|e| Error::Election {
            store: "etcd",
            election: name.clone(),
            endpoints: config.endpoints.join(","),
            action: "start the lease upkeep's thread",
            detail: e.to_string(),
            retryable: false,
        })?;
        let attempt = attempt_timeout(config.lease_ttl);
        // Connecting is lazy: a status call proves a member answers; the first that does is preferred.
        let connecting = async {
            let mut clients = Vec::with_capacity(config.endpoints.len());
            let mut keepers = Vec::with_capacity(config.endpoints.len());
            let mut sign_in = Vec::with_capacity(config.endpoints.len());
            let mut keepers_sign_in = Vec::with_capacity(config.endpoints.len());
            for endpoint in &config.endpoints {
                let (client, signing) = members::connect_member(endpoint, &loaded).await?;
                clients.push(client);
                sign_in.push(signing);
                // The upkeep's own connections sign in on their own (a token belongs to its client). They are
                // made on the upkeep's thread, so their I/O is driven there.
                let (endpoint, loading) = (endpoint.clone(), loaded.clone());
                let (keeper, signing) = upkeep
                    .spawn(async move { members::connect_member(&endpoint, &loading).await })
                    .await
                    .map_err(|e| {
                        etcd_client::Error::Internal(format!("the lease upkeep's thread: {e}"))
                    })??;
                keepers.push(keeper);
                keepers_sign_in.push(signing);
            }
            let members = Members::new(clients, config.endpoints.clone()).with_sign_in(sign_in);
            let keepers =
                Members::new(keepers, config.endpoints.clone()).with_sign_in(keepers_sign_in);
            let status = members
                .call(attempt, Resend::Safe, |mut client| async move {
                    client.status().await
                })
                .await;
            keepers.prefer(members.preferred());
            Ok::<_, etcd_client::Error>((status, members, keepers))
        };
        let (members, keepers) =
            match tokio::time::timeout(config.connect_timeout, connecting).await {
                Ok(Ok((Ok(_), members, keepers))) => (Arc::new(members), Arc::new(keepers)),
                Ok(Ok((Err(failure), _, _))) => {
                    let hint = match &failure {
                        Failure::Etcd { error, .. } => {
                            members::connect_hint(error, config.security.uses_tls())
                        }
                        Failure::Timeout { .. } => None,
                    };
                    let mut err = failure_error(&name, "connect", failure);
                    if let (Error::Election { detail, .. }, Some(hint)) = (&mut err, hint) {
                        detail.push_str("; ");
                        detail.push_str(hint);
                    }
                    return Err(err);
                }
                Ok(Err(e)) => {
                    return Err(error(&name, &config, "connect", &e));
                }
                Err(_) => {
                    return Err(Error::Election {
                        store: "etcd",
                        election: name,
                        endpoints: config.endpoints.join(","),
                        action: "connect",
                        detail: format!("no answer within {:?}", config.connect_timeout),
                        retryable: true,
                    });
                }
            };
        Ok(EtcdElection {
            members,
            keepers,
            upkeep,
            config,
            name,
            value,
            fence,
            lease: std::sync::Mutex::new(None),
        })
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

    /// Runs one election call that may be sent to several members ([`Resend::Safe`]) under [`CALL_TIMEOUT`].
    async fn call<T, F, Fut>(&self, action: &'static str, f: F) -> Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let attempt = attempt_timeout(self.config.lease_ttl);
        match tokio::time::timeout(CALL_TIMEOUT, self.members.call(attempt, Resend::Safe, f)).await
        {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(failure)) => Err(failure_error(&self.name, action, failure)),
            Err(_) => Err(self.timeout(action)),
        }
    }

    /// The leader etcd knows now (the candidate key with the lowest create revision), if any.
    pub async fn leader(&self) -> Result<Option<LeaderInfo>> {
        let prefix = format!("{}/", self.name);
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let resp = self
            .call("read the leader", |client| {
                let (prefix, options) = (prefix.clone(), options.clone());
                async move { client.kv_client().get(prefix, Some(options)).await }
            })
            .await?;
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
    ///
    /// The lease is proven from the moment the grant was **sent**: etcd starts the TTL when it grants, which is
    /// after the send, so counting from the send never credits the lease with time etcd did not give it.
    pub async fn campaign(&self) -> Result<EtcdTerm> {
        let ttl = self.ttl_secs();
        let grant_sent = Instant::now();
        let lease = self
            .call("grant the lease", |client| async move {
                client.lease_client().grant(ttl, None).await
            })
            .await?
            .id();
        *self.lease.lock().unwrap_or_else(|e| e.into_inner()) = Some(lease);
        let (lost_tx, mut lost) = watch::channel(false);
        let keeper = KeepAlive {
            members: self.keepers.clone(),
            lease,
            ttl: self.config.lease_ttl,
            fence: self.fence.clone(),
            lost: lost_tx,
        };
        let keeper = self.upkeep.spawn(keeper.run(grant_sent));
        // The keeper task ends the lease's upkeep when the campaign is dropped or fails.
        let guard = AbortOnDrop(Some(keeper));

        let resp = tokio::select! {
            resp = self.campaign_on_members(lease) => resp?,
            _ = lost.wait_for(|lost| *lost) => {
                return Err(Error::Election {
                    store: "etcd",
                    election: self.name.clone(),
                    endpoints: self.config.endpoints.join(","),
                    action: "campaign",
                    detail: "the lease could not be kept alive while waiting for leadership".to_string(),
                    retryable: true,
                });
            }
        };
        let leader = resp.leader().cloned().ok_or_else(|| Error::Election {
            store: "etcd",
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
        // Proven from the grant's send for two thirds of the TTL, or as far as a later acknowledged keep-alive
        // carries it: the upkeep moves the bound on from its start, so while the campaign waited too.
        self.fence.set_proven_until(
            LeaderLease {
                epoch,
                key,
                value: self.value.clone(),
            },
            (grant_sent + self.config.lease_ttl * 2 / 3).into_std(),
        );
        if *lost.borrow() {
            // Lost while etcd answered: the keeper cleared the fence before it was set; clear it again.
            self.fence.clear();
        }
        let keeper = guard.defuse();
        tracing::info!(election = %self.name, epoch, address = %self.config.advertise, "won the election");
        Ok(EtcdTerm {
            epoch,
            leader,
            lease,
            lost,
            keeper,
        })
    }

    /// etcd's campaign for `lease` on the preferred member; when that member fails (refuses, breaks the connection,
    /// or answers `Unavailable` because it lost its quorum) the campaign starts again on the next one, each member
    /// tried at most once. The campaign itself has no deadline (it waits while another server leads); a member that
    /// goes silent is noticed by the connection's pings, which close it and fail the call.
    ///
    /// One campaign at a time, never two on different members: etcd ends a campaign whose caller went away by
    /// resigning its candidate key, so a second campaign dropped after the first won would delete the winner's key.
    /// A campaign that failed may have left the key or resigned it; the next one creates it or finds it (same
    /// lease, same key) either way.
    async fn campaign_on_members(&self, lease: i64) -> Result<etcd_client::CampaignResponse> {
        let n = self.members.len();
        let start = self.members.preferred();
        let mut last = None;
        for step in 0..n {
            let i = (start + step) % n;
            let (client, endpoint) = self.members.member(i);
            let (name, value) = (self.name.clone(), self.value.clone());
            let campaign = async {
                self.members.signed_in(i).await?;
                client.election_client().campaign(name, value, lease).await
            };
            match campaign.await {
                Ok(resp) => {
                    self.members.prefer(i);
                    return Ok(resp);
                }
                Err(e) if members::is_transient(&e) || members::is_connection_refused(&e) => {
                    tracing::debug!(election = %self.name, %endpoint, error = %describe(&e), "campaign moves on");
                    self.members.pass_over(i);
                    last = Some(e);
                }
                Err(e) => return Err(error(&self.name, &self.config, "campaign", &e)),
            }
        }
        let e = last.unwrap_or_else(|| etcd_client::Error::InvalidArgs("no endpoints".into()));
        Err(error(&self.name, &self.config, "campaign", &e))
    }

    /// Gives the term up: the fence is cleared first (no write of this server passes after that), then the
    /// leader key is resigned and the lease revoked so another server wins at once. Best effort on etcd: a
    /// failure is logged; the lease then ends within its TTL.
    pub async fn resign(&self, term: EtcdTerm) {
        // The upkeep is stopped (and joined) before the fence is cleared, so it does not take the cleared fence for
        // a write that found the leadership gone.
        term.keeper.abort();
        let _ = term.keeper.await;
        self.fence.clear();
        let options = ResignOptions::new().with_leader(term.leader.clone());
        let resigned = self
            .call("resign", |client| {
                let options = options.clone();
                async move { client.election_client().resign(Some(options)).await }
            })
            .await;
        if let Err(e) = resigned {
            tracing::warn!(election = %self.name, error = %e, "resigning failed");
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
        let revoked = self
            .call("revoke the lease", |client| async move {
                client.lease_client().revoke(lease).await
            })
            .await;
        if let Err(e) = revoked {
            tracing::warn!(election = %self.name, error = %e, "revoking the lease failed");
        }
    }

    fn timeout(&self, action: &'static str) -> Error {
        Error::Election {
            store: "etcd",
            election: self.name.clone(),
            endpoints: self.config.endpoints.join(","),
            action,
            detail: format!("no answer within {CALL_TIMEOUT:?}"),
            retryable: true,
        }
    }
}

/// How long one member may take to answer an election call before the next is tried: a third of the TTL, between
/// 250 ms and 1 s.
fn attempt_timeout(ttl: Duration) -> Duration {
    (ttl / 3).clamp(Duration::from_millis(250), Duration::from_secs(1))
}

fn error(
    name: &str,
    config: &EtcdElectionConfig,
    action: &'static str,
    e: &etcd_client::Error,
) -> Error {
    Error::Election {
        store: "etcd",
        election: name.to_string(),
        endpoints: config.endpoints.join(","),
        action,
        detail: describe(e),
        retryable: members::is_transient(e) || members::is_connection_refused(e),
    }
}

fn failure_error(name: &str, action: &'static str, failure: Failure) -> Error {
    match failure {
        Failure::Etcd { endpoint, error: e } => Error::Election {
            store: "etcd",
            election: name.to_string(),
            endpoints: endpoint,
            action,
            detail: describe(&e),
            retryable: members::is_transient(&e) || members::is_connection_refused(&e),
        },
        Failure::Timeout { endpoint, after } => Error::Election {
            store: "etcd",
            election: name.to_string(),
            endpoints: endpoint,
            action,
            detail: format!("no answer within {after:?}"),
            retryable: true,
        },
    }
}

/// What a keep-alive lane reports to the upkeep.
#[derive(Debug)]
enum LaneEvent {
    /// A keep-alive sent at `sent` was acknowledged with the lease alive.
    Acked { sent: Instant },
    /// etcd says the lease is gone.
    Expired,
    /// The lane on `member` stopped (its member failed, hung or closed the stream).
    Ended { member: usize, reason: String },
}

/// The lease's upkeep: keep-alive streams on two members at once ("lanes"), a keep-alive on each every sixth of
/// the TTL, and the term declared lost when none was acknowledged for two thirds of it.
///
/// Why a sixth: when etcd's raft leader dies, a keep-alive sent to a member just then hangs until the member gives
/// up on the dead leader, and none is renewed until etcd elects another (an election timeout, 1 s by default, and
/// a round or two). The term survives that only if an acknowledged keep-alive is sent after the new raft leader
/// is up and before the term's bound: at most one cadence after the last acknowledged one plus two thirds of the
/// TTL. At a third of the TTL, a 4 s lease lost its term to a raft leader's kill in 2 of 2 runs; at a sixth, the
/// default 5 s lease keeps it (`serve::partition`).
struct KeepAlive {
    members: Arc<Members<Client>>,
    lease: i64,
    ttl: Duration,
    fence: Arc<LeaderFence>,
    lost: watch::Sender<bool>,
}

impl KeepAlive {
    /// Runs until the term is lost (or the task is aborted). `granted`: when the lease's grant was sent.
    async fn run(self, granted: Instant) {
        let interval = self.ttl / CADENCE_PER_TTL;
        // Proven alive until: the send time of the last acknowledged keep-alive (at first: of the grant) plus two
        // thirds of the TTL.
        let margin = self.ttl * 2 / 3;
        let mut valid_until = granted + margin;
        let mut fence = self.fence.subscribe();
        let mut had_lease = fence.borrow().is_some();
        let n = self.members.len();
        let want = n.min(2);
        let (events_tx, mut events) = mpsc::unbounded_channel();
        // The lanes running: (member, task); and when each member's last lane started, so a member that fails at
        // once is tried again no sooner than a retry gap later: short enough that the first keep-alive after etcd
        // elects a new raft leader is sent within it, long enough not to spin on a member that refuses at once.
        let retry_gap = interval / RETRIES_PER_CADENCE;
        let mut lanes: Vec<(usize, AbortOnDrop)> = Vec::new();
        let mut started: Vec<Option<Instant>> = vec![None; n];
        let mut next_member = self.members.preferred();
        let mut top_up = tokio::time::interval(retry_gap);
        top_up.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Keep `want` lanes on distinct members, starting from the member after the last one tried.
            let now = Instant::now();
            for _ in 0..n {
                if lanes.len() >= want {
                    break;
                }
                let member = next_member % n;
                next_member = (member + 1) % n;
                let busy = lanes.iter().any(|(m, _)| *m == member);
                let recent = started[member].is_some_and(|at| now < at + retry_gap);
                if busy || recent {
                    continue;
                }
                started[member] = Some(now);
                let lane = lane(
                    Arc::clone(&self.members),
                    member,
                    self.lease,
                    interval,
                    events_tx.clone(),
                );
                lanes.push((member, AbortOnDrop(Some(tokio::spawn(lane)))));
            }
            tokio::select! {
                event = events.recv() => match event {
                    Some(LaneEvent::Acked { sent }) => {
                        valid_until = valid_until.max(sent + margin);
                        self.fence.extend(valid_until.into_std());
                    }
                    Some(LaneEvent::Expired) => {
                        self.lose("etcd says the lease expired");
                        return;
                    }
                    Some(LaneEvent::Ended { member, reason }) => {
                        tracing::info!(lease = self.lease, member = %self.members.member(member).1, %reason,
                            "a lease keep-alive stream ended; another member takes over");
                        lanes.retain(|(m, _)| *m != member);
                        self.members.pass_over(member);
                    }
                    // The sender is held here: never.
                    None => return,
                },
                _ = tokio::time::sleep_until(valid_until) => {
                    self.lose("no keep-alive acknowledged within two thirds of the lease TTL");
                    return;
                }
                _ = top_up.tick() => {}
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

    fn lose(&self, reason: &str) {
        self.fence.clear();
        tracing::warn!(reason, "leadership can no longer be proven; stepping down");
        self.lost.send_replace(true);
    }
}

/// One keep-alive stream on `member`: a keep-alive every `interval`, each answer awaited (at most `interval`)
/// before the next is sent, so an answer always belongs to the last send. Opening the stream is itself a
/// keep-alive. Ends, saying why, on the first failure or late answer: the upkeep opens another lane elsewhere.
async fn lane(
    members: Arc<Members<Client>>,
    member: usize,
    lease: i64,
    interval: Duration,
    events: mpsc::UnboundedSender<LaneEvent>,
) {
    let end = |reason: String| {
        let _ = events.send(LaneEvent::Ended { member, reason });
    };
    let sent = Instant::now();
    let (client, _) = members.member(member);
    let opened = tokio::time::timeout(interval, async {
        members.signed_in(member).await?;
        client.lease_client().keep_alive(lease).await
    })
    .await;
    let (mut keeper, mut stream) = match opened {
        Ok(Ok(pair)) => pair,
        Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) => {
            // The opening keep-alive was answered with no TTL: the lease is gone.
            let _ = events.send(LaneEvent::Expired);
            return;
        }
        Ok(Err(e)) => return end(describe(&e)),
        Err(_) => return end(format!("no keep-alive stream within {interval:?}")),
    };
    if events.send(LaneEvent::Acked { sent }).is_err() {
        return;
    }
    let mut sent = sent;
    loop {
        tokio::time::sleep_until(sent + interval).await;
        sent = Instant::now();
        let answered = tokio::time::timeout(interval, async {
            keeper.keep_alive().await?;
            stream.message().await
        })
        .await;
        match answered {
            Ok(Ok(Some(resp))) if resp.ttl() > 0 => {
                if events.send(LaneEvent::Acked { sent }).is_err() {
                    return;
                }
            }
            Ok(Ok(Some(_))) => {
                let _ = events.send(LaneEvent::Expired);
                return;
            }
            Ok(Ok(None)) => return end("the stream ended".to_string()),
            Ok(Err(e)) => return end(describe(&e)),
            Err(_) => return end(format!("a keep-alive was not answered within {interval:?}")),
        }
    }
}
