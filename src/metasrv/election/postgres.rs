//! The election on PostgreSQL: one lease row per election, its expiry kept by the database's own clock.
//!
//! The row lives in `{table}_election` beside the metadata table: `(name, term, expires_at)`, `name` being the
//! election key (`{key_prefix}__metasrv/election`). The leader key itself is a pair of the metadata table under that
//! same name, whose value names the leader and its term (`{"address":…,"term":N}`).
//!
//! - **Campaign.** A candidate runs one `READ COMMITTED` transaction: lock the lease row (`FOR UPDATE`); if it is
//!   live (`expires_at > clock_timestamp()`) give up and look again a moment later. Otherwise take it: term =
//!   the larger of the row's term and the stored procedure epoch, plus one; expiry = the database's clock + the
//!   TTL; and rewrite the leader key with the new term, in the same transaction. The insert of a missing row is
//!   conditional on the row still being expired (`ON CONFLICT … DO UPDATE … WHERE expires_at <=
//!   clock_timestamp()`), so two candidates racing on an empty table cannot both win. Terms strictly increase.
//! - **Renewal.** Every third of the TTL, on a session of its own: `UPDATE … SET expires_at = clock_timestamp() +
//!   TTL WHERE name = … AND term = … AND expires_at > clock_timestamp()`. One row changed proves the term until
//!   two thirds of the TTL after the statement was sent (the database's expiry is later still: it counts from when
//!   it ran). No row: the term is over (expired, or taken over).
//! - **Fencing.** The winner fills the [`LeaderFence`] with the leader key and its value; every procedure-state
//!   write compares that pair in its own transaction. Every write of the PostgreSQL backend holds, to its commit,
//!   a shared lock on each key it compares (`crate::kv::postgres`, its `locks`), and a takeover rewrites the leader
//!   key holding that key's lock exclusively: so a write that passed its compare commits before the takeover does, and
//!   a write that runs after the takeover finds another value and is refused, however late the deposed leader
//!   sends it. A deposed leader frozen inside a transaction holds its lock at most until the server ends the
//!   idle session (`idle_in_transaction_session_timeout`, the request timeout); the takeover waits for it (bounded
//!   by a lock timeout per attempt) rather than overtaking it.
//! - **Resign.** The row's expiry is set in the past and the leader key deleted, so another candidate wins at
//!   its next look.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use crate::error::{Error, Result};
use crate::kv::PostgresKvConfig;
use crate::kv::postgres::{
    LOCK_SQL, PostgresKvBackend, TableLocks, detail, endpoint_of, identifier, leases_table,
    open_session, retryable,
};
use crate::kv::state_store::{LeaderFence, LeaderLease, PROCEDURE_PREFIX};

use super::upkeep::Upkeep;
use super::{AbortOnDrop, ELECTION_KEY, ElectionValue, LeaderInfo};

/// How long one election call (other than the campaign's wait) may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// How to reach PostgreSQL and what to campaign with.
#[derive(Clone, Debug)]
pub(super) struct PostgresElectionConfig {
    /// The metadata store's connection, schema and table.
    pub store: PostgresKvConfig,
    /// How long connecting may take.
    pub connect_timeout: Duration,
    /// The metadata store's key prefix (the election's name and leader key live under it).
    pub key_prefix: String,
    /// This server's advertised address.
    pub advertise: String,
    /// The lease's time to live.
    pub lease_ttl: Duration,
}

/// A server's participation in the election on PostgreSQL.
pub(super) struct PostgresElection {
    config: PostgresElectionConfig,
    endpoint: String,
    /// The election's name: its lease row's `name`, and the leader key in the metadata table.
    name: String,
    /// `"schema"."{table}_election"`.
    leases: String,
    /// `"schema"."table"`.
    pairs: String,
    /// The stored procedure epoch's key in the metadata table (a new term is above it).
    epoch_key: Vec<u8>,
    fence: Arc<LeaderFence>,
    /// The session of reads, campaigns and resigns (the renewal has its own).
    session: tokio::sync::Mutex<Option<Client>>,
    /// The thread the term's renewal runs on, with its session.
    upkeep: Upkeep,
}

impl std::fmt::Debug for PostgresElection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresElection")
            .field("name", &self.name)
            .field("endpoint", &self.endpoint)
            .field("advertise", &self.config.advertise)
            .finish_non_exhaustive()
    }
}

/// One period of leadership on PostgreSQL.
#[derive(Debug)]
pub(super) struct PostgresTerm {
    term: u64,
    value: Vec<u8>,
    lost: watch::Receiver<bool>,
    keeper: JoinHandle<()>,
}

impl PostgresTerm {
    pub fn epoch(&self) -> u64 {
        self.term
    }

    pub async fn lost(&mut self) {
        // An error means the keeper ended, which also ends the term.
        let _ = self.lost.wait_for(|lost| *lost).await;
    }

    pub fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }
}

/// What one look at the lease row found.
enum Attempt {
    /// This candidate took the row: its term, its leader value, and when the takeover was sent.
    Won {
        term: u64,
        value: Vec<u8>,
        sent: Instant,
    },
    /// The row is live (another leader), or a deposed leader's write still holds the leader key.
    Held,
}

impl PostgresElection {
    /// Prepares the tables (the metadata store's own layout, with the lease table) and opens a session.
    pub async fn connect(config: PostgresElectionConfig, fence: Arc<LeaderFence>) -> Result<Self> {
        let mut store = config.store.clone();
        store.connect_timeout = config.connect_timeout;
        store.connections = 1;
        // The backend creates the layout (the lease table with it) and checks its version.
        drop(PostgresKvBackend::connect(store).await?);
        let name = format!("{}{ELECTION_KEY}", config.key_prefix);
        let election = PostgresElection {
            endpoint: endpoint_of(&config.store.connection),
            leases: leases_table(&config.store)?,
            pairs: format!(
                "{}.{}",
                identifier("metadata_store.schema", &config.store.schema)?,
                identifier("metadata_store.table", &config.store.table)?
            ),
            epoch_key: format!(
                "{}{PROCEDURE_PREFIX}{}",
                config.key_prefix,
                procedures::record::EPOCH_KEY
            )
            .into_bytes(),
            upkeep: Upkeep::start(&name).map_err(|e| Error::Election {
                store: "postgres",
                election: name.clone(),
                endpoints: endpoint_of(&config.store.connection),
                action: "start the lease upkeep's thread",
                detail: e.to_string(),
                retryable: false,
            })?,
            name,
            config,
            fence,
            session: tokio::sync::Mutex::new(None),
        };
        Ok(election)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn advertise(&self) -> &str {
        &self.config.advertise
    }

    fn ttl_millis(&self) -> u128 {
        self.config.lease_ttl.as_millis().max(1)
    }

    fn error(&self, action: &'static str, detail: String, retryable: bool) -> Error {
        Error::Election {
            election: self.name.clone(),
            store: "PostgreSQL",
            endpoints: self.endpoint.clone(),
            action,
            detail,
            retryable,
        }
    }

    /// Runs `work` on the election's session (opened first if it is not), bounded by `limit`; on an error or a
    /// timeout the session is dropped (a transaction it was in is then ended by the server).
    async fn on_session<T, F>(&self, action: &'static str, limit: Duration, work: F) -> Result<T>
    where
        F: AsyncFnOnce(&mut Client) -> std::result::Result<T, tokio_postgres::Error>,
    {
        let mut session = self.session.lock().await;
        if session.as_ref().is_none_or(Client::is_closed) {
            *session = None;
            let client = open_session(&self.config.store)
                .await
                .map_err(|(detail, retryable)| self.error(action, detail, retryable))?;
            *session = Some(client);
        }
        let Some(client) = session.as_mut() else {
            return Err(self.error(action, "no session".to_string(), true));
        };
        match tokio::time::timeout(limit, work(client)).await {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(e)) => {
                *session = None;
                Err(self.error(action, detail(&e), retryable(&e)))
            }
            Err(_) => {
                *session = None;
                Err(self.error(action, format!("no answer within {limit:?}"), true))
            }
        }
    }

    /// The leader the lease row names while it is live, if any.
    pub async fn leader(&self) -> Result<Option<LeaderInfo>> {
        let sql = format!(
            "SELECT l.term, p.v FROM {} l LEFT JOIN {} p ON p.k = $2 \
             WHERE l.name = $1 AND l.expires_at > clock_timestamp()",
            self.leases, self.pairs
        );
        let (name, key) = (self.name.as_str(), self.name.as_bytes());
        let row = self
            .on_session("read the leader", CALL_TIMEOUT, async |client| {
                client.query_opt(&sql, &[&name, &key]).await
            })
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let term: i64 = row.get(0);
        let value: Option<Vec<u8>> = row.get(1);
        let address = value
            .as_deref()
            .and_then(|v| serde_json::from_slice::<ElectionValue>(v).ok())
            .map(|v| v.address)
            .unwrap_or_default();
        Ok(Some(LeaderInfo {
            address,
            epoch: u64::try_from(term).unwrap_or(0),
        }))
    }

    /// How long a candidate waits between looks at a live lease row.
    fn poll(&self) -> Duration {
        (self.config.lease_ttl / 10).clamp(Duration::from_millis(100), Duration::from_millis(500))
    }

    /// Looks at the lease row until this server takes it, and returns the term. Cancel-safe: a look is one
    /// transaction, and a dropped one is rolled back by the server when its session goes.
    pub async fn campaign(&self) -> Result<PostgresTerm> {
        loop {
            match self.attempt().await? {
                Attempt::Won { term, value, sent } => return Ok(self.lead(term, value, sent)),
                Attempt::Held => tokio::time::sleep(self.poll()).await,
            }
        }
    }

    /// One look: takes the lease row if it is free (absent or expired by the database's clock).
    async fn attempt(&self) -> Result<Attempt> {
        let ttl = self.ttl_millis();
        // A takeover waits this long at most for a deposed leader's write holding the leader key.
        let lock_wait = (self.config.lease_ttl / 3).as_millis().max(1);
        let lock = format!(
            "SELECT term, expires_at > clock_timestamp() FROM {} WHERE name = $1 FOR UPDATE",
            self.leases
        );
        let epoch = format!("SELECT v FROM {} WHERE k = $1", self.pairs);
        let take = format!(
            "INSERT INTO {leases} (name, term, expires_at) \
             VALUES ($1, $2, clock_timestamp() + interval '{ttl} milliseconds') \
             ON CONFLICT (name) DO UPDATE SET term = EXCLUDED.term, expires_at = EXCLUDED.expires_at \
             WHERE {leases}.expires_at <= clock_timestamp() RETURNING term",
            leases = self.leases
        );
        let key_write = format!(
            "INSERT INTO {} (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v",
            self.pairs
        );
        let (name, key, epoch_key) = (
            self.name.as_str(),
            self.name.as_bytes(),
            self.epoch_key.as_slice(),
        );
        // The leader key is written as every writer of the pairs table writes: holding its key lock, exclusive,
        // which waits for every transaction that compared the old value (each holds it shared) to end.
        let key_locks = TableLocks::new(&self.pairs).of([key], []);
        let advertise = self.config.advertise.clone();
        let limit = CALL_TIMEOUT + self.config.lease_ttl / 3;
        let outcome = self
            .on_session("campaign", limit, async |client| {
                let tx = client.transaction().await?;
                tx.batch_execute(&format!("SET LOCAL lock_timeout = {lock_wait}"))
                    .await?;
                let taking = async {
                    let row = tx.query_opt(&lock, &[&name]).await?;
                    let previous = match row {
                        Some(row) if row.get::<_, bool>(1) => {
                            return Ok::<_, tokio_postgres::Error>(None);
                        }
                        Some(row) => row.get::<_, i64>(0),
                        None => 0,
                    };
                    let stored = tx
                        .query_opt(&epoch, &[&epoch_key])
                        .await?
                        .and_then(|r| {
                            std::str::from_utf8(&r.get::<_, Vec<u8>>(0))
                                .ok()
                                .and_then(|t| t.trim().parse::<i64>().ok())
                        })
                        .unwrap_or(0);
                    let term = previous.max(stored).saturating_add(1);
                    let sent = Instant::now();
                    let taken = tx.query_opt(&take, &[&name, &term]).await?;
                    if taken.is_none() {
                        // Another candidate created the row meanwhile and holds it.
                        return Ok(None);
                    }
                    let value = serde_json::to_vec(&ElectionValue {
                        address: advertise.clone(),
                        term: Some(u64::try_from(term).unwrap_or(0)),
                    })
                    .unwrap_or_default();
                    tx.execute(LOCK_SQL, &[&key_locks.ids, &key_locks.exclusive])
                        .await?;
                    tx.execute(&key_write, &[&key, &value]).await?;
                    Ok(Some((term, value, sent)))
                };
                match taking.await {
                    Ok(Some(won)) => {
                        tx.commit().await?;
                        Ok(Some(won))
                    }
                    // Rolled back when `tx` is dropped.
                    Ok(None) => Ok(None),
                    Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                        // A deposed leader's write still holds the leader key (or another candidate the row):
                        // this look yields to it.
                        Ok(None)
                    }
                    Err(e) => Err(e),
                }
            })
            .await;
        match outcome {
            Ok(Some((term, value, sent))) => Ok(Attempt::Won {
                term: u64::try_from(term).unwrap_or(0),
                value,
                sent,
            }),
            Ok(None) => Ok(Attempt::Held),
            Err(e) => Err(e),
        }
    }

    /// Fills the fence and starts the term's renewal.
    fn lead(&self, term: u64, value: Vec<u8>, sent: Instant) -> PostgresTerm {
        let (lost_tx, lost) = watch::channel(false);
        let keeper = Renewal {
            store: self.config.store.clone(),
            name: self.name.clone(),
            leases: self.leases.clone(),
            term,
            ttl: self.config.lease_ttl,
            fence: self.fence.clone(),
            lost: lost_tx,
        };
        let proven = (sent + self.config.lease_ttl * 2 / 3).into_std();
        let keeper = AbortOnDrop(Some(self.upkeep.spawn(keeper.run(sent))));
        self.fence.set_proven_until(
            LeaderLease {
                epoch: term,
                key: ELECTION_KEY.as_bytes().to_vec(),
                value: value.clone(),
            },
            proven,
        );
        tracing::info!(election = %self.name, epoch = term, address = %self.config.advertise, "won the election");
        PostgresTerm {
            term,
            value,
            lost,
            keeper: keeper.defuse(),
        }
    }

    /// Gives the term up: the renewal stops and the fence is cleared, then the row's expiry is set in the past
    /// and the leader key deleted (if it is still this term's). Best effort: a failure is logged; the row then
    /// expires within the TTL.
    pub async fn resign(&self, term: PostgresTerm) {
        term.keeper.abort();
        let _ = term.keeper.await;
        self.fence.clear();
        let expire = format!(
            "UPDATE {} SET expires_at = '-infinity' WHERE name = $1 AND term = $2",
            self.leases
        );
        let delete = format!("DELETE FROM {} WHERE k = $1 AND v = $2", self.pairs);
        let (name, key, value) = (self.name.as_str(), self.name.as_bytes(), &term.value);
        let number = i64::try_from(term.term).unwrap_or(i64::MAX);
        let key_locks = TableLocks::new(&self.pairs).of([key], []);
        let resigned = self
            .on_session("resign", CALL_TIMEOUT, async |client| {
                let tx = client.transaction().await?;
                tx.execute(&expire, &[&name, &number]).await?;
                tx.execute(LOCK_SQL, &[&key_locks.ids, &key_locks.exclusive])
                    .await?;
                tx.execute(&delete, &[&key, value]).await?;
                tx.commit().await
            })
            .await;
        if let Err(e) = resigned {
            tracing::warn!(election = %self.name, error = %e, "resigning failed");
        }
        tracing::info!(election = %self.name, epoch = term.term, "resigned");
    }

    /// A candidate on PostgreSQL holds nothing while it waits: nothing to withdraw.
    pub fn withdraw(&self) {}
}

/// The term's renewal, on a session of its own, on the upkeep's thread.
struct Renewal {
    store: PostgresKvConfig,
    name: String,
    leases: String,
    term: u64,
    ttl: Duration,
    fence: Arc<LeaderFence>,
    lost: watch::Sender<bool>,
}

/// What one renewal found.
enum Renewed {
    /// The row still holds this term, renewed from the database's clock.
    Yes,
    /// The row holds another term, or this one expired: the term is over.
    Gone,
}

impl Renewal {
    /// Runs until the term is lost (or the task is aborted). `granted`: when the takeover was sent.
    async fn run(self, granted: Instant) {
        let interval = self.ttl / 3;
        let margin = self.ttl * 2 / 3;
        let mut valid_until = granted + margin;
        let mut fence = self.fence.subscribe();
        let mut had_lease = fence.borrow().is_some();
        let mut session: Option<Client> = None;
        let mut next = granted + interval;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(valid_until) => {
                    self.lose("no renewal acknowledged within two thirds of the lease TTL");
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
                _ = tokio::time::sleep_until(next) => {
                    let sent = Instant::now();
                    next = sent + interval;
                    match tokio::time::timeout(interval, self.renew(&mut session)).await {
                        Ok(Ok(Renewed::Yes)) => {
                            valid_until = valid_until.max(sent + margin);
                            self.fence.extend(valid_until.into_std());
                        }
                        Ok(Ok(Renewed::Gone)) => {
                            self.lose("the lease row expired or holds another term");
                            return;
                        }
                        Ok(Err(reason)) => {
                            session = None;
                            tracing::info!(election = %self.name, term = self.term, %reason,
                                "a lease renewal failed; trying again");
                        }
                        Err(_) => {
                            session = None;
                            tracing::info!(election = %self.name, term = self.term,
                                "a lease renewal was not answered within a third of the TTL; trying again");
                        }
                    }
                }
            }
        }
    }

    async fn renew(&self, session: &mut Option<Client>) -> std::result::Result<Renewed, String> {
        if session.as_ref().is_none_or(Client::is_closed) {
            *session = Some(open_session(&self.store).await.map_err(|(d, _)| d)?);
        }
        let Some(client) = session.as_ref() else {
            return Err("no session".to_string());
        };
        let ttl = self.ttl.as_millis().max(1);
        let sql = format!(
            "UPDATE {} SET expires_at = clock_timestamp() + interval '{ttl} milliseconds' \
             WHERE name = $1 AND term = $2 AND expires_at > clock_timestamp()",
            self.leases
        );
        let term = i64::try_from(self.term).unwrap_or(i64::MAX);
        match client.execute(&sql, &[&self.name, &term]).await {
            Ok(1) => Ok(Renewed::Yes),
            Ok(_) => Ok(Renewed::Gone),
            Err(e) => Err(detail(&e)),
        }
    }

    fn lose(&self, reason: &str) {
        self.fence.clear();
        tracing::warn!(election = %self.name, term = self.term, reason,
            "leadership can no longer be proven; stepping down");
        self.lost.send_replace(true);
    }
}
