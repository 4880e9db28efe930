//! [`MetasrvConfig`]: the TOML file a [`crate::metasrv::Metasrv`] (and `walctl`) is built from.
//!
//! ```toml
//! [metadata_store]
//! backend = "redb"                      # or "etcd", "postgres" or "memory"
//! path = "./walctl-data/metadata.redb"  # redb only
//! endpoints = ["127.0.0.1:2379"]        # etcd only
//! connect_timeout = "5s"                # etcd only
//! request_timeout = "10s"               # etcd only
//! tls = { ca = "ca.pem", cert = "client.pem", key = "client.key" }  # etcd or postgres, optional; cert/key optional
//! username = "walctl"                   # etcd only, optional: authenticate as this etcd user
//! password_file = "etcd.password"       # etcd only, with username: the password (trailing newline trimmed)
//! url = "postgres://walctl@127.0.0.1:5432/remote_wal"  # postgres only (password in password_file)
//! schema = "public"                     # postgres only
//! table = "remote_wal_kv"               # postgres only
//! key_prefix = "cluster-a/"             # optional: a namespace on a shared store
//!
//! [wal]
//! provider = "kafka"                    # or "raft_engine"
//! broker_endpoints = ["127.0.0.1:9092"]
//! num_topics = 64
//! topic_name_prefix = "greptimedb_wal_topic"
//! replication_factor = 1
//! create_topic_timeout = "30s"
//!
//! [datanodes]
//! ids = [1, 2, 3]
//! wal_dir = "./walctl-data/wal/{datanode}"  # raft-engine WAL of each datanode; {datanode} = its id
//!
//! [procedure]                           # retries of a step failing with a retryable error
//! max_retries = 10
//! retry_delay = "100ms"                 # doubles each retry
//! max_retry_delay = "10s"
//! finished_in_memory = "10m"            # then only the store holds a finished procedure (read there)
//! group_commit = true                   # batch concurrent procedures' writes into one store commit
//!
//! [server]                              # walctl serve only
//! listen = "127.0.0.1:3002"             # the HTTP API
//! advertise = "127.0.0.1:3002"          # what followers tell clients to call
//! lease_ttl = "5s"                      # leadership lease on etcd, 2–60 s
//! auth = { tokens_file = "tokens" }     # optional: bearer tokens, `SCOPE TOKEN` a line (docs/security.md)
//! tls = { cert = "server.pem", key = "server.key" }  # optional: HTTPS
//! metrics_public = false                # /metrics and the page without a token
//! header_timeout = "10s"                # a request head (and an idle keep-alive connection)
//! body_timeout = "30s"                  # a request body
//! max_connections = 1024                # past it, a connection is closed at once
//! ```
//!
//! Every table denies unknown keys. Parse errors are one line naming the file, the position and the key
//! (`metadata_store.backend`); validation errors name the key and its value. A missing section takes its default,
//! and no file at all gives the **embedded default**: redb at `./walctl-data/metadata.redb`, the raft-engine WAL,
//! datanodes `[1]`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use snafu::{IntoError, ResultExt, ensure};

use crate::error::{
    InvalidConfigSnafu, ParseConfigSnafu, ReadConfigSnafu, Result, ValidateConfigSnafu,
};
use crate::kv::etcd::security::{EtcdSecurity, EtcdTlsConfig};
use crate::wal::WalConfig;

/// Where the embedded default keeps its metadata.
pub const DEFAULT_REDB_PATH: &str = "./walctl-data/metadata.redb";

/// Everything a metasrv needs to start.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetasrvConfig {
    /// The kv backend holding table metadata, topic names and procedure state.
    pub metadata_store: MetadataStoreConfig,
    /// Which WAL new regions get (and, for Kafka, the topic pool).
    pub wal: WalConfig,
    /// The datanodes regions are placed on.
    pub datanodes: DatanodesConfig,
    /// How procedures retry failing steps.
    pub procedure: ProcedureConfig,
    /// When the leader suspects a datanode of having failed.
    pub failover: FailoverConfig,
}

/// The whole file: the metasrv's sections and `[server]`, which only `walctl serve` reads (kept out of
/// [`MetasrvConfig`], so an embedder building one in code does not name it).
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct ConfigFile {
    metadata_store: MetadataStoreConfig,
    wal: WalConfig,
    datanodes: DatanodesConfig,
    procedure: ProcedureConfig,
    failover: FailoverConfig,
    server: ServerConfig,
    datanode: Option<DatanodeConfig>,
}

/// The default `[datanode] listen`.
pub const DEFAULT_DATANODE_LISTEN: &str = "127.0.0.1:4100";

/// The default `[datanode] region_storage`.
pub const DEFAULT_REGION_STORAGE: &str = "./walctl-data/regions";

/// The default `[datanode] flush_threshold`: 64 MiB of unflushed entries per region.
pub const DEFAULT_FLUSH_THRESHOLD: u64 = 64 * 1024 * 1024;

/// The `[datanode]` section, read by `walctl datanode` only: who this datanode is, where its API listens, the
/// metasrv servers it heartbeats to, and where its regions live.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatanodeConfig {
    /// The datanode's id: one of `[datanodes] ids`.
    pub id: u64,
    /// `host:port` its API listens on.
    pub listen: String,
    /// `host:port` clients and the metasrv reach it at. Empty: the listen address.
    pub advertise: String,
    /// The `walctl serve` servers (`host:port` or URLs); it follows the leader among them.
    pub metasrv: Vec<String>,
    /// Region storage, shared by every datanode (where flushed entries go; it stands in for an object store).
    pub region_storage: String,
    /// This datanode's raft-engine WAL directory. Empty: `[datanodes] wal_dir` with `{datanode}` = its id.
    pub wal_dir: String,
    /// How often it heartbeats; its region leases last 3 intervals + 1 s.
    #[serde(with = "humantime_serde")]
    pub heartbeat_interval: Duration,
    /// Unflushed bytes per region past which a flush starts on its own (writes wait for it).
    pub flush_threshold: u64,
    /// A file holding the bearer token (a `write` one) sent with every call to `walctl serve`. Empty: none.
    pub token_file: String,
    /// A PEM file of the authority that signed the servers' certificates, for `https://` metasrv URLs. Empty: the
    /// public web authorities.
    pub ca: String,
    /// Bearer tokens this datanode's own API asks for, in the format of `[server] auth` (reads need a `read` or
    /// `write` token, writes and flushes a `write` one, `/health` is open); absent, its API is open.
    pub auth: Option<ServerAuth>,
    /// Serve this datanode's own API over TLS only with this certificate and key (as `[server] tls`); the address
    /// it registers then carries `https://`, so clients that reach it (`walctl load`, `wal flush`) use TLS and check
    /// the certificate against their `--ca`.
    pub tls: Option<ServerTls>,
}

impl Default for DatanodeConfig {
    fn default() -> Self {
        DatanodeConfig {
            id: 0,
            listen: DEFAULT_DATANODE_LISTEN.to_string(),
            advertise: String::new(),
            metasrv: Vec::new(),
            region_storage: DEFAULT_REGION_STORAGE.to_string(),
            wal_dir: String::new(),
            heartbeat_interval: Duration::from_secs(1),
            flush_threshold: DEFAULT_FLUSH_THRESHOLD,
            token_file: String::new(),
            ca: String::new(),
            auth: None,
            tls: None,
        }
    }
}

impl DatanodeConfig {
    /// The advertised address: `advertise`, or `listen` when it is empty.
    pub fn advertised(&self) -> &str {
        if self.advertise.trim().is_empty() {
            &self.listen
        } else {
            &self.advertise
        }
    }

    /// Checks the section against the metasrv's `datanodes`: the id among `[datanodes] ids`, addresses
    /// `host:port`, at least one metasrv, a heartbeat interval of 100 ms to 60 s, a flush threshold of 1 KiB at
    /// least. The error names the key and its value.
    pub fn validate(&self, datanodes: &DatanodesConfig) -> Result<()> {
        ensure!(
            datanodes.ids.contains(&self.id),
            InvalidConfigSnafu {
                key: "datanode.id",
                value: self.id.to_string(),
                reason: format!("not one of [datanodes] ids {:?}", datanodes.ids),
            }
        );
        for (key, value, may_be_empty) in [
            ("datanode.listen", &self.listen, false),
            ("datanode.advertise", &self.advertise, true),
        ] {
            if may_be_empty && value.is_empty() {
                continue;
            }
            ensure!(
                value
                    .rsplit_once(':')
                    .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok()),
                InvalidConfigSnafu {
                    key,
                    value: format!("{value:?}"),
                    reason: "expected host:port",
                }
            );
        }
        ensure!(
            !self.metasrv.is_empty(),
            InvalidConfigSnafu {
                key: "datanode.metasrv",
                value: "[]",
                reason: "name at least one walctl serve (host:port or URL)",
            }
        );
        ensure!(
            !self.region_storage.trim().is_empty(),
            InvalidConfigSnafu {
                key: "datanode.region_storage",
                value: format!("{:?}", self.region_storage),
                reason: "must name a directory",
            }
        );
        ensure!(
            (Duration::from_millis(100)..=Duration::from_secs(60))
                .contains(&self.heartbeat_interval),
            InvalidConfigSnafu {
                key: "datanode.heartbeat_interval",
                value: humantime_serde::re::humantime::format_duration(self.heartbeat_interval)
                    .to_string(),
                reason: "must be within 100ms and 60s",
            }
        );
        ensure!(
            self.flush_threshold >= 1024,
            InvalidConfigSnafu {
                key: "datanode.flush_threshold",
                value: self.flush_threshold.to_string(),
                reason: "must be at least 1024 bytes",
            }
        );
        Ok(())
    }

    /// The raft-engine WAL directory: `wal_dir`, or the metasrv's `[datanodes] wal_dir` for this id.
    pub fn wal_dir(&self, datanodes: &DatanodesConfig) -> std::path::PathBuf {
        if self.wal_dir.trim().is_empty() {
            datanodes.wal_dir_of(self.id)
        } else {
            std::path::PathBuf::from(&self.wal_dir)
        }
    }
}

/// The shortest leadership lease `[server] lease_ttl` accepts.
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(2);
/// The longest leadership lease `[server] lease_ttl` accepts.
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(60);

/// The `[server]` section, read by `walctl serve`: the HTTP API's address, the address followers hand to clients,
/// and the leadership lease on etcd.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// `host:port` the HTTP API listens on.
    pub listen: String,
    /// `host:port` clients should call to reach this server (stored in the election value; followers answer
    /// writes with the leader's). Empty: the listen address.
    pub advertise: String,
    /// How long leadership outlives the last keep-alive etcd acknowledged; 2–60 s. The leader stops writing
    /// before it runs out.
    #[serde(with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// Write requests (create and drop table, migrate region, bootstrap, prune) the server takes at once; past it a
    /// write is answered `429 overloaded` with `Retry-After`, so a burst cannot queue without bound. Datanode
    /// heartbeats, reads and procedure control are never refused this way.
    pub max_pending_writes: usize,
    /// Bearer tokens the API asks for (`docs/security.md`); absent, every route is open to whoever reaches it.
    pub auth: Option<ServerAuth>,
    /// HTTPS: the server's certificate chain and key (PEM files); absent, the API speaks plain HTTP.
    pub tls: Option<ServerTls>,
    /// Whether `GET /metrics` and the page at `/` answer without a token when `auth` is set.
    pub metrics_public: bool,
    /// How long a connection may take to send a request's head (the TLS handshake included), counted from the
    /// moment the server waits for it, so it also bounds an idle keep-alive connection; past it the connection is
    /// closed.
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// How long a request's body may take to arrive once its head is read; past it the answer is
    /// `408 request_timeout` and the connection is closed.
    #[serde(with = "humantime_serde")]
    pub body_timeout: Duration,
    /// Connections served at once; a connection past it is accepted and closed at once (not queued).
    pub max_connections: usize,
}

/// `[server] auth`: where the API's bearer tokens are.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerAuth {
    /// A file of one token a line as `SCOPE TOKEN` (`read` or `write`), `#` comments and blank lines allowed;
    /// re-read on SIGHUP.
    pub tokens_file: String,
}

/// `[server] tls`: the certificate the API presents.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerTls {
    /// The PEM certificate chain, the server's own certificate first.
    pub cert: String,
    /// The PEM private key of that certificate (PKCS#8, PKCS#1 or SEC1).
    pub key: String,
}

/// The default of [`ServerConfig::max_pending_writes`].
pub const DEFAULT_MAX_PENDING_WRITES: usize = 2048;

/// The default of [`ServerConfig::header_timeout`].
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The default of [`ServerConfig::body_timeout`].
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// The default of [`ServerConfig::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// The largest [`ServerConfig::max_connections`] taken.
pub const MAX_CONNECTIONS_LIMIT: usize = 1_000_000;

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:3002".to_string(),
            advertise: String::new(),
            lease_ttl: Duration::from_secs(5),
            max_pending_writes: DEFAULT_MAX_PENDING_WRITES,
            auth: None,
            tls: None,
            metrics_public: false,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

impl ServerConfig {
    /// The advertised address: `advertise`, or `listen` when it is empty.
    pub fn advertised(&self) -> &str {
        if self.advertise.trim().is_empty() {
            &self.listen
        } else {
            &self.advertise
        }
    }

    /// `listen` and `advertise` are `host:port` (a port given), `lease_ttl` within 2–60 s, `max_pending_writes`
    /// at least 1.
    pub fn validate(&self) -> Result<()> {
        for (key, value, may_be_empty) in [
            ("server.listen", &self.listen, false),
            ("server.advertise", &self.advertise, true),
        ] {
            if may_be_empty && value.is_empty() {
                continue;
            }
            let port = value.rsplit_once(':').map(|(_, port)| port);
            ensure!(
                value
                    .rsplit_once(':')
                    .is_some_and(|(host, _)| !host.is_empty())
                    && port.is_some_and(|p| p.parse::<u16>().is_ok()),
                InvalidConfigSnafu {
                    key,
                    value: format!("{value:?}"),
                    reason: "expected host:port",
                }
            );
        }
        ensure!(
            (MIN_LEASE_TTL..=MAX_LEASE_TTL).contains(&self.lease_ttl),
            InvalidConfigSnafu {
                key: "server.lease_ttl",
                value: humantime_serde::re::humantime::format_duration(self.lease_ttl).to_string(),
                reason: "must be within 2s and 60s",
            }
        );
        ensure!(
            self.max_pending_writes >= 1,
            InvalidConfigSnafu {
                key: "server.max_pending_writes",
                value: self.max_pending_writes.to_string(),
                reason: "must be at least 1",
            }
        );
        ensure!(
            (1..=MAX_CONNECTIONS_LIMIT).contains(&self.max_connections),
            InvalidConfigSnafu {
                key: "server.max_connections",
                value: self.max_connections.to_string(),
                reason: format!("must be within 1 and {MAX_CONNECTIONS_LIMIT}"),
            }
        );
        for (key, value) in [
            ("server.header_timeout", self.header_timeout),
            ("server.body_timeout", self.body_timeout),
        ] {
            ensure!(
                (Duration::from_millis(100)..=Duration::from_secs(3600)).contains(&value),
                InvalidConfigSnafu {
                    key,
                    value: humantime_serde::re::humantime::format_duration(value).to_string(),
                    reason: "must be within 100ms and 1h",
                }
            );
        }
        if let Some(auth) = &self.auth {
            ensure!(
                !auth.tokens_file.trim().is_empty(),
                InvalidConfigSnafu {
                    key: "server.auth.tokens_file",
                    value: "\"\"",
                    reason: "must name a file",
                }
            );
        }
        if let Some(tls) = &self.tls {
            for (key, value) in [("server.tls.cert", &tls.cert), ("server.tls.key", &tls.key)] {
                ensure!(
                    !value.trim().is_empty(),
                    InvalidConfigSnafu {
                        key,
                        value: "\"\"",
                        reason: "must name a PEM file",
                    }
                );
            }
        }
        Ok(())
    }
}

/// The `[procedure]` section: retries of a procedure step that failed with a retryable error (a broker or the
/// metadata store unreachable; non-retryable errors fail the procedure at once), how long a finished procedure
/// stays in the manager's memory, and how procedure state is committed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProcedureConfig {
    /// Retries after the first attempt; 0 = fail at the first error.
    pub max_retries: usize,
    /// Delay before the first retry; it doubles each time.
    #[serde(with = "humantime_serde")]
    pub retry_delay: Duration,
    /// Longest delay between two attempts.
    #[serde(with = "humantime_serde")]
    pub max_retry_delay: Duration,
    /// How long a finished procedure stays in the procedure manager's memory
    /// ([`procedures::ManagerConfig::finished_in_memory`]); afterwards it is read from its record in the store,
    /// which stays for the retention period. `"0s"`: it leaves memory at the next check.
    #[serde(with = "humantime_serde")]
    pub finished_in_memory: Duration,
    /// Group commit of the procedure state store (on by default): the writes of concurrent procedures that arrive
    /// while a commit is in flight go into the next commit together
    /// ([`crate::kv::KvStateStore::with_group_commit`]). Off, every write commits alone (for comparison).
    pub group_commit: bool,
}

impl Default for ProcedureConfig {
    fn default() -> Self {
        let retry = procedures::RetryPolicy::default();
        ProcedureConfig {
            max_retries: retry.max_retries,
            retry_delay: retry.initial_delay,
            max_retry_delay: retry.max_delay,
            finished_in_memory: procedures::ManagerConfig::default().finished_in_memory,
            group_commit: true,
        }
    }
}

impl ProcedureConfig {
    /// The manager config these settings give.
    pub fn manager_config(&self) -> procedures::ManagerConfig {
        let mut config = procedures::ManagerConfig::default();
        config.step_retry.max_retries = self.max_retries;
        config.step_retry.initial_delay = self.retry_delay;
        config.step_retry.max_delay = self.max_retry_delay;
        config.finished_in_memory = self.finished_in_memory;
        config
    }

    /// Delays positive, the longest at least the first.
    pub fn validate(&self) -> Result<()> {
        ensure!(
            !self.retry_delay.is_zero(),
            InvalidConfigSnafu {
                key: "procedure.retry_delay",
                value: "0s",
                reason: "must be positive",
            }
        );
        ensure!(
            self.max_retry_delay >= self.retry_delay,
            InvalidConfigSnafu {
                key: "procedure.max_retry_delay",
                value: humantime_serde::re::humantime::format_duration(self.max_retry_delay)
                    .to_string(),
                reason: "must be at least procedure.retry_delay",
            }
        );
        Ok(())
    }
}

/// Which kv backend holds the metadata.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetadataBackend {
    /// An embedded redb file (one process at a time).
    #[default]
    Redb,
    /// An etcd cluster.
    Etcd,
    /// A PostgreSQL database (one table; `docs/metadata-store.md`).
    Postgres,
    /// In memory: gone when the process exits (tests and demos).
    Memory,
}

impl MetadataBackend {
    /// The name as written in the file.
    pub fn as_str(&self) -> &'static str {
        match self {
            MetadataBackend::Redb => "redb",
            MetadataBackend::Etcd => "etcd",
            MetadataBackend::Postgres => "postgres",
            MetadataBackend::Memory => "memory",
        }
    }
}

/// The `[metadata_store]` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetadataStoreConfig {
    /// The backend.
    pub backend: MetadataBackend,
    /// The redb file (created with its parent directories when missing).
    pub path: PathBuf,
    /// etcd endpoints, `host:port` each.
    pub endpoints: Vec<String>,
    /// etcd: how long connecting may take.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// etcd: how long one request may take.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// etcd: how long one member may take to answer a point request before the call passes it over (a read goes
    /// to the next member at once; a write fails retryably and its retry starts at the next member).
    #[serde(with = "humantime_serde")]
    pub member_timeout: Duration,
    /// Every key this metasrv reads or writes starts with this prefix (default: none), so several metasrvs can
    /// share one etcd cluster without seeing each other's tables, topic names or procedures.
    pub key_prefix: String,
    /// etcd and postgres: TLS for every connection (`{ ca, cert, key }`, cert and key both or neither); absent:
    /// plaintext (on postgres, a URL with `sslmode=require` then is refused: there is no authority to check).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<EtcdTlsConfig>,
    /// etcd: the user every connection authenticates as; absent: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// etcd: the file holding `username`'s password; postgres: the file holding the URL's user's password (one
    /// trailing newline trimmed); read when connecting.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// postgres: `postgres://user@host:port/database` (the password goes in `password_file`, not here).
    pub url: String,
    /// postgres: the schema of the table.
    pub schema: String,
    /// postgres: the table holding the pairs (and `{table}_meta`, its layout version).
    pub table: String,
}

impl MetadataStoreConfig {
    /// The PostgreSQL store's connection settings (`url`, `password_file` read now, `schema`, `table`, the
    /// timeouts); an unreadable password file or a bad URL is an error naming its key.
    pub fn postgres(&self) -> crate::error::Result<crate::kv::PostgresKvConfig> {
        let password = match &self.password_file {
            Some(path) => Some(read_password_file(path)?),
            None => None,
        };
        let mut pg = crate::kv::PostgresKvConfig::from_url(&self.url, password.as_deref())?;
        pg.schema = self.schema.clone();
        pg.table = self.table.clone();
        pg.connect_timeout = self.connect_timeout;
        pg.request_timeout = self.request_timeout;
        match &self.tls {
            Some(tls) => {
                let client = tls.cert.as_deref().zip(tls.key.as_deref());
                Ok(pg.with_tls(&tls.ca, client)?)
            }
            None => Ok(pg),
        }
    }

    /// The etcd security settings (`tls`, `username`, `password_file`) as the etcd clients take them.
    pub fn etcd_security(&self) -> EtcdSecurity {
        EtcdSecurity {
            tls: self.tls.clone(),
            username: self.username.clone(),
            password_file: self.password_file.clone(),
        }
    }
}

impl Default for MetadataStoreConfig {
    fn default() -> Self {
        MetadataStoreConfig {
            backend: MetadataBackend::Redb,
            path: PathBuf::from(DEFAULT_REDB_PATH),
            endpoints: vec!["127.0.0.1:2379".to_string()],
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            member_timeout: Duration::from_secs(2),
            key_prefix: String::new(),
            tls: None,
            username: None,
            password_file: None,
            url: String::new(),
            schema: "public".to_string(),
            table: "remote_wal_kv".to_string(),
        }
    }
}

/// Where a datanode's raft-engine WAL lives when none is configured; `{datanode}` is replaced by its id.
pub const DEFAULT_WAL_DIR: &str = "./walctl-data/wal/{datanode}";

/// The placeholder of `[datanodes] wal_dir` replaced by a datanode's id.
pub const DATANODE_PLACEHOLDER: &str = "{datanode}";

/// The `[failover]` section: when the leader suspects a datanode.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FailoverConfig {
    /// Whether a suspected datanode's regions move to others (the failover procedure). The detector runs either
    /// way and its suspicion is shown.
    pub enabled: bool,
    /// The phi at and above which a datanode is suspected.
    pub phi_threshold: f64,
    /// A pause this long beyond the usual interval is not suspicious.
    #[serde(with = "humantime_serde")]
    pub acceptable_pause: Duration,
    /// The least standard deviation of the intervals the model uses.
    #[serde(with = "humantime_serde")]
    pub min_std: Duration,
}

impl Default for FailoverConfig {
    fn default() -> Self {
        FailoverConfig {
            enabled: true,
            phi_threshold: 8.0,
            acceptable_pause: Duration::from_secs(3),
            min_std: Duration::from_millis(100),
        }
    }
}

impl FailoverConfig {
    /// Checks the detector's values; the error names the key and its value.
    pub fn validate(&self) -> Result<()> {
        ensure!(
            self.phi_threshold.is_finite() && (1.0..=100.0).contains(&self.phi_threshold),
            InvalidConfigSnafu {
                key: "failover.phi_threshold",
                value: self.phi_threshold.to_string(),
                reason: "must be within 1 and 100",
            }
        );
        ensure!(
            self.acceptable_pause <= Duration::from_secs(600),
            InvalidConfigSnafu {
                key: "failover.acceptable_pause",
                value: humantime_serde::re::humantime::format_duration(self.acceptable_pause)
                    .to_string(),
                reason: "must be at most 10m",
            }
        );
        ensure!(
            (Duration::from_millis(1)..=Duration::from_secs(60)).contains(&self.min_std),
            InvalidConfigSnafu {
                key: "failover.min_std",
                value: humantime_serde::re::humantime::format_duration(self.min_std).to_string(),
                reason: "must be within 1ms and 60s",
            }
        );
        Ok(())
    }
}

/// The `[datanodes]` section.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatanodesConfig {
    /// The datanode ids regions are placed on, round-robin in this order.
    pub ids: Vec<u64>,
    /// The raft-engine WAL directory of each datanode, `{datanode}` standing for its id (one engine directory
    /// per datanode). Default [`DEFAULT_WAL_DIR`].
    pub wal_dir: String,
}

impl Default for DatanodesConfig {
    fn default() -> Self {
        DatanodesConfig {
            ids: vec![1],
            wal_dir: DEFAULT_WAL_DIR.to_string(),
        }
    }
}

impl MetasrvConfig {
    /// The embedded default: redb at [`DEFAULT_REDB_PATH`], raft-engine WAL, datanode 1.
    pub fn embedded() -> Self {
        MetasrvConfig::default()
    }

    /// Reads, parses and validates a TOML file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).context(ReadConfigSnafu {
            path: path.display().to_string(),
        })?;
        Self::from_toml_str(&text, &path.display().to_string())
    }

    /// [`MetasrvConfig::from_file`], also returning the file's `[server]` section (its defaults when absent),
    /// validated.
    pub fn from_file_with_server(path: &Path) -> Result<(Self, ServerConfig)> {
        let text = std::fs::read_to_string(path).context(ReadConfigSnafu {
            path: path.display().to_string(),
        })?;
        Self::from_toml_str_with_server(&text, &path.display().to_string())
    }

    /// [`MetasrvConfig::from_file`], also returning the file's `[datanode]` section, validated (an error naming the
    /// file when it is missing).
    pub fn from_file_with_datanode(path: &Path) -> Result<(Self, DatanodeConfig)> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).context(ReadConfigSnafu {
            path: origin.clone(),
        })?;
        let (config, _, datanode) = Self::parse_sections(&text, &origin)?;
        let datanode = datanode.ok_or_else(|| {
            InvalidConfigSnafu {
                key: "datanode",
                value: "(absent)",
                reason: "walctl datanode needs a [datanode] section (id, listen, metasrv, region_storage)",
            }
            .build()
        });
        let datanode = datanode.context(ValidateConfigSnafu {
            origin: origin.clone(),
        })?;
        datanode
            .validate(&config.datanodes)
            .context(ValidateConfigSnafu { origin })?;
        Ok((config, datanode))
    }

    /// Parses and validates a TOML document; `origin` names it in errors (a file path).
    ///
    /// A parse error names the position (from the TOML error's span) and the dotted key (from
    /// `serde_path_to_error`'s path, e.g. `wal.backoff.deadline`, inside inline tables too).
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self> {
        Ok(Self::from_toml_str_with_server(text, origin)?.0)
    }

    /// [`MetasrvConfig::from_toml_str`], also returning the `[server]` section, validated.
    pub fn from_toml_str_with_server(text: &str, origin: &str) -> Result<(Self, ServerConfig)> {
        let (config, server, _) = Self::parse_sections(text, origin)?;
        Ok((config, server))
    }

    /// Every section of the file, the metasrv's and `[server]` validated (`[datanode]` is validated by whoever
    /// reads it).
    fn parse_sections(
        text: &str,
        origin: &str,
    ) -> Result<(Self, ServerConfig, Option<DatanodeConfig>)> {
        let document = toml::Deserializer::parse(text)
            .map_err(|source| parse_error(text, origin, String::new(), source))?;
        let file: ConfigFile = serde_path_to_error::deserialize(document).map_err(|err| {
            let path = err.path();
            let key = if path.iter().next().is_some() {
                path.to_string()
            } else {
                String::new()
            };
            parse_error(text, origin, key, err.into_inner())
        })?;
        let config = MetasrvConfig {
            metadata_store: file.metadata_store,
            wal: file.wal,
            datanodes: file.datanodes,
            procedure: file.procedure,
            failover: file.failover,
        };
        config.validate().context(ValidateConfigSnafu { origin })?;
        file.server
            .validate()
            .context(ValidateConfigSnafu { origin })?;
        Ok((config, file.server, file.datanode))
    }

    /// Checks every value: the WAL section ([`WalConfig::validate`]), the metadata store and the datanodes. The
    /// error names the key and its value.
    pub fn validate(&self) -> Result<()> {
        self.metadata_store.validate()?;
        self.wal.validate()?;
        self.datanodes.validate()?;
        self.procedure.validate()?;
        self.failover.validate()
    }

    /// The TOML text of this config (what `examples/` hold).
    pub fn to_toml_string(&self) -> String {
        // Every field is a plain string, number, list or table: serialising cannot fail.
        toml::to_string(self).unwrap_or_default()
    }
}

impl MetadataStoreConfig {
    /// `connect_timeout` and `request_timeout` positive (the networked backends use them).
    fn validate_timeouts(&self) -> Result<()> {
        for (key, value) in [
            ("metadata_store.connect_timeout", self.connect_timeout),
            ("metadata_store.request_timeout", self.request_timeout),
        ] {
            ensure!(
                !value.is_zero(),
                InvalidConfigSnafu {
                    key,
                    value: "0s",
                    reason: "must be positive",
                }
            );
        }
        Ok(())
    }

    /// Checks the values the chosen backend uses.
    pub fn validate(&self) -> Result<()> {
        match self.backend {
            MetadataBackend::Redb => ensure!(
                !self.path.as_os_str().is_empty(),
                InvalidConfigSnafu {
                    key: "metadata_store.path",
                    value: "\"\"",
                    reason: "the redb backend needs a file path",
                }
            ),
            MetadataBackend::Etcd => {
                ensure!(
                    !self.endpoints.is_empty(),
                    InvalidConfigSnafu {
                        key: "metadata_store.endpoints",
                        value: "[]",
                        reason: "the etcd backend needs at least one endpoint",
                    }
                );
                ensure!(
                    self.endpoints.iter().all(|e| !e.trim().is_empty()),
                    InvalidConfigSnafu {
                        key: "metadata_store.endpoints",
                        value: format!("{:?}", self.endpoints),
                        reason: "an endpoint is empty",
                    }
                );
                self.etcd_security().validate(&self.endpoints)?;
                self.validate_timeouts()?;
            }
            MetadataBackend::Postgres => {
                ensure!(
                    !self.url.trim().is_empty(),
                    InvalidConfigSnafu {
                        key: "metadata_store.url",
                        value: "\"\"",
                        reason: "the postgres backend needs a URL, e.g. postgres://walctl@127.0.0.1:5432/remote_wal",
                    }
                );
                let pg = crate::kv::PostgresKvConfig::from_url(&self.url, None)?;
                if let Some(tls) = &self.tls {
                    ensure!(
                        tls.cert.is_some() == tls.key.is_some(),
                        crate::kv::error::PostgresConfigSnafu {
                            key: "metadata_store.tls",
                            reason: "cert and key go together: give both (a client certificate) or neither",
                        }
                    );
                }
                if self.tls.is_none() {
                    pg.check_tls()?;
                } else if pg.connection.get_ssl_mode() == tokio_postgres::config::SslMode::Disable {
                    return Err(crate::kv::error::PostgresConfigSnafu {
                        key: "metadata_store.url",
                        reason: "sslmode=disable contradicts metadata_store.tls",
                    }
                    .build()
                    .into());
                }
                ensure!(
                    self.username.is_none(),
                    InvalidConfigSnafu {
                        key: "metadata_store.username",
                        value: self.username.clone().unwrap_or_default(),
                        reason: "on postgres the user is the URL's (postgres://USER@host:port/database)",
                    }
                );
                self.validate_timeouts()?;
            }
            MetadataBackend::Memory => {}
        }
        Ok(())
    }
}

impl DatanodesConfig {
    /// Non-empty, no id twice.
    pub fn validate(&self) -> Result<()> {
        ensure!(
            !self.ids.is_empty(),
            InvalidConfigSnafu {
                key: "datanodes.ids",
                value: "[]",
                reason: "regions need at least one datanode",
            }
        );
        let mut seen = BTreeSet::new();
        for id in &self.ids {
            ensure!(
                seen.insert(*id),
                InvalidConfigSnafu {
                    key: "datanodes.ids",
                    value: format!("{:?}", self.ids),
                    reason: format!("datanode {id} is listed twice"),
                }
            );
        }
        ensure!(
            !self.wal_dir.trim().is_empty(),
            InvalidConfigSnafu {
                key: "datanodes.wal_dir",
                value: "\"\"",
                reason: "each datanode needs a raft-engine WAL directory",
            }
        );
        let without = self.wal_dir.replace(DATANODE_PLACEHOLDER, "");
        ensure!(
            !without.contains('{') && !without.contains('}'),
            InvalidConfigSnafu {
                key: "datanodes.wal_dir",
                value: format!("{:?}", self.wal_dir),
                reason: "the only placeholder is {datanode}",
            }
        );
        ensure!(
            self.ids.len() < 2 || self.wal_dir.contains(DATANODE_PLACEHOLDER),
            InvalidConfigSnafu {
                key: "datanodes.wal_dir",
                value: format!("{:?}", self.wal_dir),
                reason: "must contain {datanode}: each datanode needs a directory of its own",
            }
        );
        Ok(())
    }

    /// The raft-engine WAL directory of `datanode_id`: `wal_dir` with `{datanode}` replaced by the id.
    pub fn wal_dir_of(&self, datanode_id: u64) -> PathBuf {
        PathBuf::from(
            self.wal_dir
                .replace(DATANODE_PLACEHOLDER, &datanode_id.to_string()),
        )
    }
}

/// The error of a document that does not parse into a [`MetasrvConfig`]: the position of the TOML error's span
/// in `text`, the dotted `key` concerned (empty when none) and TOML's own message.
fn parse_error(text: &str, origin: &str, key: String, source: toml::de::Error) -> crate::Error {
    let location = source
        .span()
        .map(|span| line_and_column(text, span.start))
        .unwrap_or_default();
    let message = source.message().trim().to_string();
    ParseConfigSnafu {
        origin,
        location,
        key,
        message,
    }
    .into_error(source)
}

/// `line L, column C` (both from 1, the column in characters) of byte `offset` of `text`.
fn line_and_column(text: &str, offset: usize) -> String {
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit('\n')
        .next()
        .map_or(0, |last| last.chars().count())
        + 1;
    format!("line {line}, column {column}")
}

/// The password in `path`, one trailing newline trimmed; an error names the file (never its content).
fn read_password_file(path: &std::path::Path) -> Result<String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        crate::kv::error::PostgresConfigSnafu {
            key: "metadata_store.password_file",
            reason: format!("cannot read {}: {e}", path.display()),
        }
        .build()
    })?;
    Ok(text
        .strip_suffix('\n')
        .map(|t| t.strip_suffix('\r').unwrap_or(t))
        .unwrap_or(&text)
        .to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::KafkaConfig;

    fn parse(text: &str) -> Result<MetasrvConfig> {
        MetasrvConfig::from_toml_str(text, "test.toml")
    }

    fn parse_err(text: &str) -> String {
        let err = parse(text).unwrap_err().to_string();
        assert!(!err.contains('\n'), "errors are one line: {err:?}");
        assert!(err.contains("test.toml"), "errors name the file: {err}");
        err
    }

    #[test]
    fn embedded_default_is_redb_raft_engine_datanode_1() {
        let c = MetasrvConfig::embedded();
        assert_eq!(c.metadata_store.backend, MetadataBackend::Redb);
        assert_eq!(c.metadata_store.path, PathBuf::from(DEFAULT_REDB_PATH));
        assert_eq!(c.wal, WalConfig::RaftEngine);
        assert_eq!(c.datanodes.ids, vec![1]);
        c.validate().unwrap();
        // An empty file is the embedded default too.
        assert_eq!(parse("").unwrap(), c);
    }

    #[test]
    fn the_issue_layout_parses() {
        let c = parse(
            r#"
            [metadata_store]
            backend = "etcd"
            path = "./walctl-data/metadata.redb"
            endpoints = ["127.0.0.1:2379"]
            [wal]
            provider = "kafka"
            broker_endpoints = ["127.0.0.1:9092"]
            num_topics = 64
            topic_name_prefix = "greptimedb_wal_topic"
            replication_factor = 1
            create_topic_timeout = "30s"
            [datanodes]
            ids = [1, 2, 3]
            "#,
        )
        .unwrap();
        assert_eq!(c.metadata_store.backend, MetadataBackend::Etcd);
        assert_eq!(c.metadata_store.endpoints, vec!["127.0.0.1:2379"]);
        let WalConfig::Kafka(k) = &c.wal else {
            panic!("expected kafka: {:?}", c.wal)
        };
        assert_eq!(k.broker_endpoints, vec!["127.0.0.1:9092"]);
        assert_eq!(k.num_topics, 64);
        assert_eq!(k.create_topic_timeout, Duration::from_secs(30));
        assert_eq!(c.datanodes.ids, vec![1, 2, 3]);
    }

    #[test]
    fn round_trips_through_toml() {
        let c = MetasrvConfig {
            metadata_store: MetadataStoreConfig {
                backend: MetadataBackend::Etcd,
                endpoints: vec!["a:1".into(), "b:2".into()],
                request_timeout: Duration::from_millis(1500),
                ..Default::default()
            },
            wal: WalConfig::Kafka(KafkaConfig {
                num_topics: 7,
                ..Default::default()
            }),
            datanodes: DatanodesConfig {
                ids: vec![4, 2],
                wal_dir: "/var/wal/dn-{datanode}".to_string(),
            },
            procedure: ProcedureConfig {
                max_retries: 3,
                retry_delay: Duration::from_millis(10),
                max_retry_delay: Duration::from_secs(1),
                finished_in_memory: Duration::from_secs(90),
                group_commit: false,
            },
            failover: FailoverConfig {
                enabled: false,
                phi_threshold: 12.5,
                acceptable_pause: Duration::from_millis(2500),
                min_std: Duration::from_millis(50),
            },
        };
        assert_eq!(parse(&c.to_toml_string()).unwrap(), c);
        let e = MetasrvConfig::embedded();
        assert_eq!(parse(&e.to_toml_string()).unwrap(), e);
    }

    #[test]
    fn finished_in_memory_defaults_to_ten_minutes_and_reaches_the_manager() {
        let c = MetasrvConfig::embedded();
        assert_eq!(c.procedure.finished_in_memory, Duration::from_secs(600));
        assert_eq!(
            c.procedure.manager_config().finished_in_memory,
            Duration::from_secs(600)
        );
        let c = parse("[procedure]\nfinished_in_memory = \"30s\"\n").unwrap();
        assert_eq!(
            c.procedure.manager_config().finished_in_memory,
            Duration::from_secs(30)
        );
        let err = parse_err("[procedure]\nfinished_in_memory = \"soon\"\n");
        assert!(err.contains("procedure.finished_in_memory"), "{err}");
    }

    #[test]
    fn unknown_top_level_section_names_it() {
        let err = parse_err("[metadata]\nbackend = \"redb\"\n");
        assert!(err.contains("metadata"), "{err}");
        assert!(err.contains("line 1"), "{err}");
    }

    #[test]
    fn unknown_key_in_a_section_names_the_key_and_line() {
        let err = parse_err("[metadata_store]\nbackend = \"redb\"\npaht = \"x.redb\"\n");
        assert!(err.contains("paht"), "{err}");
        assert!(err.contains("line 3"), "{err}");
        assert!(err.contains("metadata_store.paht"), "{err}");
    }

    #[test]
    fn unknown_key_in_wal_names_the_key() {
        let err = parse_err("[wal]\nprovider = \"kafka\"\nnum_topicz = 3\n");
        assert!(err.contains("num_topicz"), "{err}");
        assert!(err.contains("wal"), "{err}");
        let err = parse_err("[wal]\nprovider = \"raft_engine\"\nbroker_endpoints = []\n");
        assert!(err.contains("broker_endpoints"), "{err}");
    }

    #[test]
    fn bad_values_name_the_key() {
        let err = parse_err("[metadata_store]\nbackend = \"mysql\"\n");
        assert!(err.contains("metadata_store.backend"), "{err}");
        assert!(err.contains("mysql"), "{err}");

        let err = parse_err("[datanodes]\nids = [1, \"two\"]\n");
        assert!(err.contains("datanodes.ids"), "{err}");

        let err = parse_err("[metadata_store]\nbackend = \"etcd\"\nrequest_timeout = \"soon\"\n");
        assert!(err.contains("metadata_store.request_timeout"), "{err}");

        let err = parse_err("[wal]\nprovider = \"pulsar\"\n");
        assert!(err.contains("pulsar"), "{err}");
        assert!(err.contains("wal"), "{err}");

        let err = parse_err("[wal]\nprovider = \"kafka\"\nnum_topics = \"many\"\n");
        assert!(err.contains("wal"), "{err}");
        assert!(err.contains("key `wal.num_topics`"), "{err}");
    }

    #[test]
    fn bad_values_in_inline_tables_name_the_inner_key() {
        let err = parse_err("wal = { provider = \"kafka\", num_topics = \"many\" }\n");
        assert!(err.contains("key `wal.num_topics`"), "{err}");

        let err = parse_err(
            "[wal]\nprovider = \"kafka\"\nbackoff = { init = \"1s\", deadline = \"soon\" }\n",
        );
        assert!(err.contains("key `wal.backoff.deadline`"), "{err}");

        let err = parse_err("[metadata_store]\nbackend = \"redb\"\npath = 3\n");
        assert!(err.contains("key `metadata_store.path`"), "{err}");
    }

    #[test]
    fn etcd_tls_and_user_parse_and_bad_combinations_name_the_key() {
        let c = parse(
            "[metadata_store]\nbackend = \"etcd\"\nendpoints = [\"127.0.0.1:2379\"]\n\
             tls = { ca = \"ca.pem\", cert = \"client.pem\", key = \"client.key\" }\n\
             username = \"walctl\"\npassword_file = \"etcd.password\"\n",
        )
        .unwrap();
        let security = c.metadata_store.etcd_security();
        let tls = security.tls.clone().unwrap();
        assert_eq!(tls.ca, PathBuf::from("ca.pem"));
        assert_eq!(tls.key, Some(PathBuf::from("client.key")));
        assert_eq!(security.username.as_deref(), Some("walctl"));
        assert_eq!(security.password_file, Some(PathBuf::from("etcd.password")));
        // Round trip: the written file keeps the settings.
        let again = MetasrvConfig::from_toml_str(&c.to_toml_string(), "again").unwrap();
        assert_eq!(again.metadata_store.etcd_security(), security);

        let err = parse_err(
            "[metadata_store]\nbackend = \"etcd\"\ntls = { ca = \"ca.pem\", cert = \"client.pem\" }\n",
        );
        assert!(err.contains("metadata_store.tls"), "{err}");
        let err = parse_err("[metadata_store]\nbackend = \"etcd\"\nusername = \"walctl\"\n");
        assert!(err.contains("metadata_store.password_file"), "{err}");
        let err = parse_err(
            "[metadata_store]\nbackend = \"etcd\"\ntls = { ca = \"ca.pem\", crt = \"x\" }\n",
        );
        assert!(err.contains("metadata_store.tls.crt"), "{err}");
    }

    #[test]
    fn invalid_toml_names_the_line() {
        let err = parse_err("[datanodes]\nids = [1, 2\n");
        assert!(err.contains("line"), "{err}");
    }

    #[test]
    fn validation_names_the_key() {
        let err = parse_err("[datanodes]\nids = []\n");
        assert!(err.contains("datanodes.ids"), "{err}");
        let err = parse_err("[datanodes]\nids = [1, 2, 1]\n");
        assert!(err.contains("datanodes.ids"), "{err}");
        assert!(err.contains("datanode 1 is listed twice"), "{err}");
        let err = parse_err("[metadata_store]\nbackend = \"etcd\"\nendpoints = []\n");
        assert!(err.contains("metadata_store.endpoints"), "{err}");
        let err = parse_err("[metadata_store]\nbackend = \"redb\"\npath = \"\"\n");
        assert!(err.contains("metadata_store.path"), "{err}");
        let err = parse_err("[wal]\nprovider = \"kafka\"\nnum_topics = 0\n");
        assert!(err.contains("num_topics"), "{err}");
        let err = parse_err("[wal]\nprovider = \"kafka\"\ntopic_name_prefix = \"__x\"\n");
        assert!(err.contains("topic_name_prefix"), "{err}");
        let err = parse_err("[procedure]\nretry_delay = \"0s\"\n");
        assert!(err.contains("procedure.retry_delay"), "{err}");
        let err = parse_err("[procedure]\nretry_delay = \"2s\"\nmax_retry_delay = \"1s\"\n");
        assert!(err.contains("procedure.max_retry_delay"), "{err}");
    }

    #[test]
    fn group_commit_is_on_by_default_and_can_be_turned_off() {
        assert!(MetasrvConfig::embedded().procedure.group_commit);
        assert!(
            parse("[procedure]\nmax_retries = 2\n")
                .unwrap()
                .procedure
                .group_commit
        );
        let off = parse("[procedure]\ngroup_commit = false\n").unwrap();
        assert!(!off.procedure.group_commit);
        assert_eq!(
            off.procedure.max_retries,
            ProcedureConfig::default().max_retries
        );
        let err = parse_err("[procedure]\ngroup_commit = \"no\"\n");
        assert!(err.contains("procedure.group_commit"), "{err}");
    }

    #[test]
    fn wal_dir_defaults_per_datanode_and_is_validated() {
        let c = MetasrvConfig::embedded();
        assert_eq!(c.datanodes.wal_dir, DEFAULT_WAL_DIR);
        assert_eq!(
            c.datanodes.wal_dir_of(7),
            PathBuf::from("./walctl-data/wal/7")
        );
        let c = parse("[datanodes]\nids = [1, 2]\nwal_dir = \"/data/wal-{datanode}\"\n").unwrap();
        assert_eq!(c.datanodes.wal_dir_of(2), PathBuf::from("/data/wal-2"));
        // One datanode may use a fixed directory.
        parse("[datanodes]\nids = [1]\nwal_dir = \"/data/wal\"\n").unwrap();

        let err = parse_err("[datanodes]\nwal_dir = \"\"\n");
        assert!(err.contains("datanodes.wal_dir"), "{err}");
        let err = parse_err("[datanodes]\nids = [1, 2]\nwal_dir = \"/data/wal\"\n");
        assert!(err.contains("datanodes.wal_dir"), "{err}");
        assert!(err.contains("must contain {datanode}"), "{err}");
        let err = parse_err("[datanodes]\nwal_dir = \"/data/{node}\"\n");
        assert!(err.contains("the only placeholder is {datanode}"), "{err}");
    }

    #[test]
    fn server_section_is_checked_and_defaults_stay_out_of_the_text() {
        let with_server = |text: &str| MetasrvConfig::from_toml_str_with_server(text, "test.toml");
        let (_, server) = with_server(
            "[server]\nlisten = \"0.0.0.0:4000\"\nadvertise = \"10.0.0.5:4000\"\nlease_ttl = \"3s\"\n",
        )
        .unwrap();
        assert_eq!(server.lease_ttl, Duration::from_secs(3));
        assert_eq!(server.advertised(), "10.0.0.5:4000");
        let (_, server) = with_server("[server]\nlisten = \"127.0.0.1:4001\"\n").unwrap();
        assert_eq!(server.advertised(), "127.0.0.1:4001");
        let (_, server) = with_server("").unwrap();
        assert_eq!(server, ServerConfig::default());
        // The metasrv's own parse accepts (and ignores) the section.
        assert!(parse("[server]\nlease_ttl = \"3s\"\n").is_ok());
        for (toml, key) in [
            ("[server]\nlease_ttl = \"1s\"\n", "server.lease_ttl"),
            ("[server]\nlease_ttl = \"61s\"\n", "server.lease_ttl"),
            ("[server]\nlisten = \"nohost\"\n", "server.listen"),
            ("[server]\nlisten = \":80\"\n", "server.listen"),
            ("[server]\nadvertise = \"h:notaport\"\n", "server.advertise"),
            ("[server]\nmax_connections = 0\n", "server.max_connections"),
            (
                "[server]\nmax_connections = 1000001\n",
                "server.max_connections",
            ),
            (
                "[server]\nheader_timeout = \"10ms\"\n",
                "server.header_timeout",
            ),
            ("[server]\nbody_timeout = \"2h\"\n", "server.body_timeout"),
            (
                "[server]\nauth = { tokens_file = \"\" }\n",
                "server.auth.tokens_file",
            ),
            (
                "[server]\ntls = { cert = \"c.pem\", key = \" \" }\n",
                "server.tls.key",
            ),
            ("[server]\nauth = { tokens = \"t\" }\n", "server.auth"),
        ] {
            let err = parse_err(toml);
            assert!(err.contains(key), "{toml}: {err}");
        }
        let (_, server) = with_server(
            "[server]\nauth = { tokens_file = \"tokens\" }\ntls = { cert = \"c.pem\", key = \"k.pem\" }\n\
             metrics_public = true\nheader_timeout = \"5s\"\nbody_timeout = \"7s\"\nmax_connections = 64\n",
        )
        .unwrap();
        assert_eq!(
            server.auth.as_ref().map(|a| a.tokens_file.as_str()),
            Some("tokens")
        );
        assert_eq!(server.tls.as_ref().map(|t| t.key.as_str()), Some("k.pem"));
        assert!(server.metrics_public);
        assert_eq!(server.header_timeout, Duration::from_secs(5));
        assert_eq!(server.body_timeout, Duration::from_secs(7));
        assert_eq!(server.max_connections, 64);
    }

    #[test]
    fn memory_backend_ignores_path_and_endpoints() {
        let c =
            parse("[metadata_store]\nbackend = \"memory\"\npath = \"\"\nendpoints = []\n").unwrap();
        assert_eq!(c.metadata_store.backend, MetadataBackend::Memory);
    }

    #[test]
    fn missing_file_is_an_error_naming_it() {
        let err = MetasrvConfig::from_file(Path::new("/nonexistent/walctl.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/walctl.toml"), "{err}");
    }

    #[test]
    fn examples_parse_and_validate() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
        let embedded = MetasrvConfig::from_file(&dir.join("embedded.toml")).unwrap();
        assert_eq!(embedded, MetasrvConfig::embedded());
        let kafka = MetasrvConfig::from_file(&dir.join("kafka-etcd.toml")).unwrap();
        assert_eq!(kafka.metadata_store.backend, MetadataBackend::Etcd);
        assert!(matches!(kafka.wal, WalConfig::Kafka(_)));
    }

    #[test]
    fn a_postgres_store_needs_a_url_and_takes_no_etcd_user() {
        let c = MetasrvConfig::from_toml_str(
            "[metadata_store]\nbackend = \"postgres\"\nurl = \"postgres://walctl@127.0.0.1:5432/meta\"\n\
             password_file = \"pg.password\"\ntable = \"meta_kv\"\n",
            "pg.toml",
        )
        .unwrap();
        assert_eq!(c.metadata_store.backend, MetadataBackend::Postgres);
        assert_eq!(c.metadata_store.table, "meta_kv");
        assert_eq!(c.metadata_store.schema, "public");
        let err = parse_err("[metadata_store]\nbackend = \"postgres\"\n");
        assert!(err.contains("metadata_store.url"), "{err}");
        let err = parse_err(
            "[metadata_store]\nbackend = \"postgres\"\nurl = \"postgres://a@h/db\"\nusername = \"x\"\n",
        );
        assert!(err.contains("metadata_store.username"), "{err}");
    }

    #[test]
    fn postgres_tls_settings_that_contradict_are_refused_by_key() {
        let pg = |url: &str, tls: &str| {
            format!("[metadata_store]\nbackend = \"postgres\"\nurl = \"{url}\"\n{tls}")
        };
        let tls = "tls = { ca = \"ca.pem\", cert = \"c.pem\", key = \"c.key\" }\n";
        let c = MetasrvConfig::from_toml_str(&pg("postgres://a@h/db", tls), "pg.toml").unwrap();
        assert_eq!(c.metadata_store.tls.unwrap().ca, PathBuf::from("ca.pem"));
        let err = parse_err(&pg(
            "postgres://a@h/db",
            "tls = { ca = \"ca.pem\", cert = \"c.pem\" }\n",
        ));
        assert!(
            err.contains("metadata_store.tls") && err.contains("cert and key"),
            "{err}"
        );
        let err = parse_err(&pg("postgres://a@h/db?sslmode=require", ""));
        assert!(
            err.contains("metadata_store.url") && err.contains("sslmode=require"),
            "{err}"
        );
        let err = parse_err(&pg("postgres://a@h/db?sslmode=disable", tls));
        assert!(
            err.contains("metadata_store.url") && err.contains("sslmode=disable"),
            "{err}"
        );
    }
}
