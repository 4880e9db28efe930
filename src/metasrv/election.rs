//! [`Election`]: which `walctl serve` (or embedded command) leads a shared metadata store.
//!
//! Two stores hold an election, each by its own means, behind the same calls:
//!
//! - **etcd** (`election/etcd.rs`): etcd's election API. A candidate key per server, attached to a lease kept alive; the
//!   leader is the key with the lowest create revision, which is its epoch. etcd deletes the key when the lease
//!   ends.
//! - **PostgreSQL** (`election/postgres.rs`): one lease row (holder's term, expiry by the database's own clock), taken over
//!   only after it expired, renewed within the term; the term is the epoch. The takeover rewrites the leader key in
//!   the metadata table in the same transaction.
//!
//! Either way the winner fills a [`LeaderFence`] with the leader key and its value, and every procedure-state
//! write compares that key in its own transaction: a leader superseded, or whose lease ended, cannot write, even
//! if it does not know yet (`docs/ha.md` argues both).
//!
//! A [`Term`] is lost as soon as no renewal was acknowledged for two thirds of the TTL (the last third is the
//! safety margin for clocks and a write in flight), or when a write found the leadership gone. The server then
//! stops its manager and campaigns again.

mod etcd;
mod postgres;
mod upkeep;

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

use crate::config::{MetadataBackend, MetadataStoreConfig};
use crate::error::Result;
use crate::kv::PostgresKvConfig;
use crate::kv::etcd::EtcdSecurity;
use crate::kv::state_store::LeaderFence;

/// The election's key, under the metadata store's key prefix.
pub const ELECTION_KEY: &str = "__metasrv/election";

/// What a leader's election value holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElectionValue {
    /// The advertised `host:port` of the server's HTTP API (empty for an embedded command).
    pub address: String,
    /// On PostgreSQL, the term the value belongs to, so each term's leader key differs from every other's (on
    /// etcd the key itself differs per lease; absent there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<u64>,
}

/// The current leader as the store knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LeaderInfo {
    /// Its advertised address.
    pub address: String,
    /// Its epoch (etcd: the leader key's create revision; PostgreSQL: the lease row's term).
    pub epoch: u64,
}

/// Where the election is held.
#[derive(Clone, Debug)]
pub enum ElectionStore {
    /// etcd's election API on these members.
    Etcd {
        /// etcd endpoints, `host:port`.
        endpoints: Vec<String>,
        /// TLS and the user every election connection uses (the metadata store's).
        security: EtcdSecurity,
    },
    /// A lease row beside the metadata table the config names.
    Postgres(Box<PostgresKvConfig>),
}

impl ElectionStore {
    /// Where the election of the metadata store `store` names is held: etcd's or PostgreSQL's; `None` on redb and
    /// memory, which one process holds alone. The PostgreSQL password file is read now.
    pub fn of(store: &MetadataStoreConfig) -> Result<Option<ElectionStore>> {
        Ok(match store.backend {
            MetadataBackend::Etcd => Some(ElectionStore::Etcd {
                endpoints: store.endpoints.clone(),
                security: store.etcd_security(),
            }),
            MetadataBackend::Postgres => Some(ElectionStore::Postgres(Box::new(store.postgres()?))),
            MetadataBackend::Redb | MetadataBackend::Memory => None,
        })
    }
}

/// How to reach the store and what to campaign with.
#[derive(Clone, Debug)]
pub struct ElectionConfig {
    /// The store holding the election.
    pub store: ElectionStore,
    /// How long connecting may take.
    pub connect_timeout: Duration,
    /// The metadata store's key prefix (the election key lives under it).
    pub key_prefix: String,
    /// This server's advertised address.
    pub advertise: String,
    /// The lease's time to live (whole seconds on etcd, rounded up).
    pub lease_ttl: Duration,
}

/// A server's participation in the election.
#[derive(Debug)]
pub struct Election {
    inner: Inner,
    fence: Arc<LeaderFence>,
}

#[derive(Debug)]
enum Inner {
    Etcd(Box<etcd::EtcdElection>),
    Postgres(Box<postgres::PostgresElection>),
}

/// One period of leadership, from winning the campaign until it is lost or given up.
#[derive(Debug)]
pub struct Term {
    inner: TermInner,
}

#[derive(Debug)]
enum TermInner {
    Etcd(etcd::EtcdTerm),
    Postgres(postgres::PostgresTerm),
}

impl Term {
    /// The epoch of this term.
    pub fn epoch(&self) -> u64 {
        match &self.inner {
            TermInner::Etcd(t) => t.epoch(),
            TermInner::Postgres(t) => t.epoch(),
        }
    }

    /// Resolves once leadership can no longer be proven (a renewal not acknowledged in time, the lease gone, or a
    /// state write that found the leader key changed or deleted).
    pub async fn lost(&mut self) {
        match &mut self.inner {
            TermInner::Etcd(t) => t.lost().await,
            TermInner::Postgres(t) => t.lost().await,
        }
    }

    /// Whether the term is already lost.
    pub fn is_lost(&self) -> bool {
        match &self.inner {
            TermInner::Etcd(t) => t.is_lost(),
            TermInner::Postgres(t) => t.is_lost(),
        }
    }
}

impl Election {
    /// Connects to the store (without a per-request timeout on the campaign: it waits as long as another server
    /// leads).
    pub async fn connect(config: ElectionConfig, fence: Arc<LeaderFence>) -> Result<Self> {
        let inner = match config.store {
            ElectionStore::Etcd {
                endpoints,
                security,
            } => Inner::Etcd(Box::new(
                etcd::EtcdElection::connect(
                    etcd::EtcdElectionConfig {
                        endpoints,
                        connect_timeout: config.connect_timeout,
                        key_prefix: config.key_prefix,
                        advertise: config.advertise,
                        lease_ttl: config.lease_ttl,
                        security,
                    },
                    fence.clone(),
                )
                .await?,
            )),
            ElectionStore::Postgres(store) => Inner::Postgres(Box::new(
                postgres::PostgresElection::connect(
                    postgres::PostgresElectionConfig {
                        store: *store,
                        connect_timeout: config.connect_timeout,
                        key_prefix: config.key_prefix,
                        advertise: config.advertise,
                        lease_ttl: config.lease_ttl,
                    },
                    fence.clone(),
                )
                .await?,
            )),
        };
        Ok(Election { inner, fence })
    }

    /// The fence this election fills while it leads.
    pub fn fence(&self) -> &Arc<LeaderFence> {
        &self.fence
    }

    /// The election's name: its key (etcd) or its lease row (PostgreSQL).
    pub fn name(&self) -> &str {
        match &self.inner {
            Inner::Etcd(e) => e.name(),
            Inner::Postgres(e) => e.name(),
        }
    }

    /// This server's advertised address.
    pub fn advertise(&self) -> &str {
        match &self.inner {
            Inner::Etcd(e) => e.advertise(),
            Inner::Postgres(e) => e.advertise(),
        }
    }

    /// The leader the store knows now, if any.
    pub async fn leader(&self) -> Result<Option<LeaderInfo>> {
        match &self.inner {
            Inner::Etcd(e) => e.leader().await,
            Inner::Postgres(e) => e.leader().await,
        }
    }

    /// Campaigns until this server leads, and returns the term. The fence holds the term's leadership when this
    /// returns. Cancel-safe: dropping the future stops the lease's upkeep.
    pub async fn campaign(&self) -> Result<Term> {
        let inner = match &self.inner {
            Inner::Etcd(e) => TermInner::Etcd(e.campaign().await?),
            Inner::Postgres(e) => TermInner::Postgres(e.campaign().await?),
        };
        Ok(Term { inner })
    }

    /// Gives the term up: the fence is cleared first (no write of this server passes after that), then the
    /// leadership is released so another server wins at once. Best effort: a failure is logged; the lease then
    /// ends within its TTL.
    pub async fn resign(&self, term: Term) {
        match (&self.inner, term.inner) {
            (Inner::Etcd(e), TermInner::Etcd(t)) => e.resign(t).await,
            (Inner::Postgres(e), TermInner::Postgres(t)) => e.resign(t).await,
            // A term of another election: this one cannot release it; its lease ends within the TTL.
            _ => self.fence.clear(),
        }
    }

    /// Withdraws from a campaign given up (the server shuts down while it follows), so its candidacy leaves at
    /// once rather than when its lease would expire. Best effort.
    pub async fn withdraw(&self) {
        match &self.inner {
            Inner::Etcd(e) => e.withdraw().await,
            Inner::Postgres(e) => e.withdraw(),
        }
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
