//! [`PostgresKvBackend`]: the metadata store in one PostgreSQL table, `(k bytea primary key, v bytea not null)`,
//! for deployments that keep metadata in PostgreSQL rather than etcd (`docs/metadata-store.md`).
//!
//! **Layout.** The table (`[metadata_store] schema`, `table`; `public.remote_wal_kv` by default), a small
//! `{table}_meta` table recording the layout's `schema_version` (1) and `{table}_election`, the leader election's
//! lease rows (`crate::metasrv::election`), are created if absent, under a transaction-scoped
//! advisory lock so that two processes starting together do not race on `CREATE TABLE`. A table whose recorded
//! version is not 1 is refused, naming it. `bytea` compares bytewise, so ranges order keys as etcd does.
//!
//! **Atomicity and isolation.** Reads are single statements (one snapshot each). Every call that writes runs in
//! one `READ COMMITTED` transaction that first takes advisory locks on the keys it touches — exclusive on those it
//! writes, shared on those it only reads — and reads only then (`locks`: strict two-phase locking per key, which
//! serializes conflicting writers by making them wait, never by aborting one). So a conditional write whose
//! condition another writer broke meanwhile is refused (`succeeded = false`), never applied on a stale read, and
//! nothing is ever run twice.
//!
//! **TLS.** With [`PostgresKvConfig::with_tls`] (`[metadata_store] tls = { ca, cert, key }`) every session — the
//! pool's and the leader election's — is TLS (rustls, ring): the server's certificate must chain to `ca` and name
//! the host connected to, the client certificate is presented when given, and a server that does not offer TLS is
//! refused (never a fall back to plaintext). A certificate refused on either side is not retryable.
//!
//! **Connections.** A fixed pool of `connections` clients, each used by one call at a time, connected on first
//! use and again after the connection broke. A call that gets no answer within `request_timeout` fails retryably
//! and its connection is dropped (its effect is unknown, as with etcd).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio_postgres::config::SslMode;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Row, Statement};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::kv::error::{Error, PostgresConfigSnafu, PostgresOpSnafu, Result};
use crate::kv::{
    Compare, CompareAndPutRequest, CompareAndPutResponse, KeyValue, KvBackend, PutRequest,
    RangeRequest, RangeResponse, Txn, TxnOp, TxnOpResponse, TxnResponse, check, display_key,
};

mod locks;

pub use locks::MAX_KEY_LOCKS;
pub(crate) use locks::{LOCK_SQL, LockSet, TableLocks};

/// The layout version this release writes and reads.
pub const SCHEMA_VERSION: &str = "1";

/// Operations (compares + the larger branch) one transaction may hold. PostgreSQL has no such limit; this keeps a
/// transaction's locks and its statement count bounded.
pub const MAX_TXN_OPS: usize = 4096;

/// Bytes of keys and values one request may carry: well under PostgreSQL's 1 GiB per value and per protocol
/// message.
pub const MAX_REQUEST_BYTES: usize = 256 * 1024 * 1024;

/// How to reach the PostgreSQL metadata store.
#[derive(Clone)]
pub struct PostgresKvConfig {
    /// The connection: host, port, database and user (from a `postgres://` URL or key=value string).
    pub connection: tokio_postgres::Config,
    /// The schema holding the table.
    pub schema: String,
    /// The table.
    pub table: String,
    /// Clients in the pool (calls in flight at once).
    pub connections: usize,
    /// Bound of one connection attempt.
    pub connect_timeout: Duration,
    /// Bound of one call.
    pub request_timeout: Duration,
    /// TLS for every session ([`PostgresKvConfig::with_tls`]); `None`: plaintext.
    pub tls: Option<MakeRustlsConnect>,
}

impl std::fmt::Debug for PostgresKvConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The connection config may hold the password: only the endpoint is shown.
        f.debug_struct("PostgresKvConfig")
            .field("endpoint", &endpoint_of(&self.connection))
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("connections", &self.connections)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl PostgresKvConfig {
    /// A config from a `postgres://user@host:port/database` URL (or a `host=… port=…` string), with `password`
    /// when given (read from a file by the caller), in `public.remote_wal_kv`, 8 connections, 5 s to connect and
    /// 10 s per call. A URL that does not parse is an error naming `metadata_store.url` (the URL is not repeated:
    /// it may hold a password).
    pub fn from_url(url: &str, password: Option<&str>) -> Result<Self> {
        let mut connection: tokio_postgres::Config = url.parse().map_err(|e| {
            PostgresConfigSnafu {
                key: "metadata_store.url",
                reason: format!("not a PostgreSQL connection URL: {e}"),
            }
            .build()
        })?;
        if let Some(password) = password {
            connection.password(password);
        }
        if connection.get_hosts().is_empty() {
            return PostgresConfigSnafu {
                key: "metadata_store.url",
                reason: "it names no host",
            }
            .fail();
        }
        Ok(PostgresKvConfig {
            connection,
            schema: "public".to_string(),
            table: "remote_wal_kv".to_string(),
            connections: 8,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            tls: None,
        })
    }

    /// Every session over TLS: the server's certificate must chain to the PEM authority `ca` and name the host;
    /// `client` (certificate chain, private key; PEM) is presented when given. The URL's `sslmode` becomes
    /// `require` (the server must offer TLS); `sslmode=disable` is refused as contradicting it. Errors name
    /// `metadata_store.tls.*` and the file, never a line of the key.
    pub fn with_tls(
        mut self,
        ca: &std::path::Path,
        client: Option<(&std::path::Path, &std::path::Path)>,
    ) -> Result<Self> {
        if self.connection.get_ssl_mode() == SslMode::Disable {
            return PostgresConfigSnafu {
                key: "metadata_store.url",
                reason: "sslmode=disable contradicts metadata_store.tls",
            }
            .fail();
        }
        let error = |key: String, path: &std::path::Path, reason: String| {
            PostgresConfigSnafu {
                key,
                reason: format!("'{}': {reason}", path.display()),
            }
            .build()
        };
        let source = crate::tls::TlsSource {
            prefix: "metadata_store.tls",
            error: &error,
        };
        let config = source.client_config(ca, client)?;
        self.connection.ssl_mode(SslMode::Require);
        self.tls = Some(MakeRustlsConnect::new(config));
        Ok(self)
    }

    /// Refuses `sslmode=require` without [`PostgresKvConfig::with_tls`]: there would be no authority to check the
    /// server's certificate against.
    pub fn check_tls(&self) -> Result<()> {
        if self.tls.is_none() && self.connection.get_ssl_mode() == SslMode::Require {
            return PostgresConfigSnafu {
                key: "metadata_store.url",
                reason: "sslmode=require needs metadata_store.tls = { ca = … } (the authority that signed the server's certificate)",
            }
            .fail();
        }
        Ok(())
    }
}

/// `host:port/database` of a connection config (never its password).
pub(crate) fn endpoint_of(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        #[cfg(unix)]
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "?".to_string(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config.get_dbname().unwrap_or("");
    format!("{host}:{port}/{db}")
}

/// A quoted SQL identifier, refused unless it is a plain lower-case name (so it never needs escaping).
pub(crate) fn identifier(key: &str, name: &str) -> Result<String> {
    let plain = !name.is_empty()
        && name.len() <= 48
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !plain {
        return PostgresConfigSnafu {
            key,
            reason: format!(
                "'{name}' is not a plain name (lower-case letters, digits and '_', at most 48, not starting with a digit)"
            ),
        }
        .fail();
    }
    Ok(format!("\"{name}\""))
}

/// The metadata store in a PostgreSQL table.
pub struct PostgresKvBackend {
    config: PostgresKvConfig,
    endpoint: String,
    /// `"schema"."table"`.
    table: String,
    /// The key locks of `table`.
    locks: TableLocks,
    slots: Vec<tokio::sync::Mutex<Option<Conn>>>,
    next: AtomicUsize,
}

impl std::fmt::Debug for PostgresKvBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresKvBackend")
            .field("endpoint", &self.endpoint)
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

/// What went wrong inside a call, before it is turned into the crate's error.
enum Failure {
    Pg(tokio_postgres::Error),
    Timeout(Duration),
    /// The checked-out slot holds no client (not expected: checking out connects it).
    NoClient,
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Failure::Pg(e)
    }
}

/// Whether the same call may succeed later: a connection that broke or never opened, a server starting, shutting
/// down or out of connections, a serialization failure or deadlock, a lock not granted within `lock_timeout`.
/// Anything the server refused for the request itself (a permission, a constraint, bad SQL) is not.
pub(crate) fn retryable(e: &tokio_postgres::Error) -> bool {
    match e.code() {
        None => !tls_refused(e),
        Some(c) if *c == SqlState::LOCK_NOT_AVAILABLE => true,
        Some(c) => {
            let class = &c.code()[..2];
            // 08 connection exception, 53 insufficient resources, 57 operator intervention (shutdown, startup),
            // 40 transaction rollback (serialization, deadlock).
            matches!(class, "08" | "53" | "57" | "40")
        }
    }
}

/// Whether TLS itself failed: a certificate the client or the server refused, or a protocol the other side does
/// not speak — a setup mistake that a retry does not mend (a connection lost during the handshake is an I/O error,
/// not this).
fn tls_refused(e: &tokio_postgres::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.is::<rustls::Error>() {
            return true;
        }
        // An `io::Error` wrapping another hands out that error's source, not the error itself.
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && io
                .get_ref()
                .is_some_and(|inner| inner.is::<rustls::Error>())
        {
            return true;
        }
        source = s.source();
    }
    false
}

/// One line for an error of the client: its SQLSTATE and message when the server sent them.
pub(crate) fn detail(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(s) = source {
                text.push_str(": ");
                text.push_str(&s.to_string());
                source = s.source();
            }
            text.replace('\n', " ")
        }
    }
}

/// `"schema"."{table}_election"`: the leader election's lease rows (`crate::metasrv::election`), one per election
/// name: the term holding it and when it expires by the database's clock.
pub(crate) fn leases_table(config: &PostgresKvConfig) -> Result<String> {
    Ok(format!(
        "{}.{}",
        identifier("metadata_store.schema", &config.schema)?,
        identifier(
            "metadata_store.table",
            &format!("{}_election", config.table)
        )?
    ))
}

/// Opens one session on `config`'s server, bounded by its connect timeout, with the settings every session of
/// ours runs with: a session left idle inside a transaction for longer than a call may take is ended by the
/// server (`idle_in_transaction_session_timeout`), so a client that stopped mid-transaction (a frozen or partitioned
/// process) cannot hold its key locks, and with them a leadership takeover, for longer than that; and no lock is
/// waited for longer than that either (`lock_timeout`). The error is a
/// line naming what failed and whether a retry may succeed.
pub(crate) async fn open_session(
    config: &PostgresKvConfig,
) -> std::result::Result<Client, (String, bool)> {
    let opening = async {
        // The connection task ends when the client is dropped or the connection breaks; the next call reconnects.
        let client = match &config.tls {
            Some(tls) => {
                let (client, connection) = config.connection.connect(tls.clone()).await?;
                tokio::spawn(connection);
                client
            }
            None => {
                let (client, connection) = config.connection.connect(NoTls).await?;
                tokio::spawn(connection);
                client
            }
        };
        let idle = config.request_timeout.as_millis().max(1);
        // A lock is waited for no longer than a call may take: the caller has given up by then.
        client
            .batch_execute(&format!(
                "SET idle_in_transaction_session_timeout = {idle}; SET lock_timeout = {idle}"
            ))
            .await?;
        Ok::<_, tokio_postgres::Error>(client)
    };
    match tokio::time::timeout(config.connect_timeout, opening).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err((format!("cannot connect: {}", detail(&e)), retryable(&e))),
        Err(_) => Err((
            format!(
                "cannot connect: no answer within {:?}",
                config.connect_timeout
            ),
            true,
        )),
    }
}

impl PostgresKvBackend {
    /// Connects (one client at once, the others on first use) and creates the table if absent; an unreachable
    /// server, refused credentials or a table of another layout version are errors naming the endpoint.
    pub async fn connect(config: PostgresKvConfig) -> Result<Self> {
        config.check_tls()?;
        let table = format!(
            "{}.{}",
            identifier("metadata_store.schema", &config.schema)?,
            identifier("metadata_store.table", &config.table)?
        );
        let backend = PostgresKvBackend {
            endpoint: endpoint_of(&config.connection),
            slots: (0..config.connections.max(1))
                .map(|_| tokio::sync::Mutex::new(None))
                .collect(),
            next: AtomicUsize::new(0),
            locks: TableLocks::new(&table),
            table,
            config,
        };
        backend.create_table().await?;
        Ok(backend)
    }

    /// The table and its meta table, created under an advisory lock; the recorded version checked.
    async fn create_table(&self) -> Result<()> {
        let schema = identifier("metadata_store.schema", &self.config.schema)?;
        let meta = format!(
            "{schema}.{}",
            identifier(
                "metadata_store.table",
                &format!("{}_meta", self.config.table)
            )?
        );
        let table = self.table.clone();
        let leases = leases_table(&self.config)?;
        let mut co = self.checkout("preparing the metadata table", &[]).await?;
        let outcome = self
            .bounded(async {
                let client = co.client()?;
                let tx = client.transaction().await?;
                tx.execute("SELECT pg_advisory_xact_lock(7275620937261137479)", &[])
                    .await?;
                // Created only when absent: `CREATE SCHEMA IF NOT EXISTS` needs the right to create schemas in
                // the database even when the schema exists, which a user given only its schema need not have.
                let schema_exists = tx
                    .query_opt(
                        "SELECT 1 FROM pg_namespace WHERE nspname = $1",
                        &[&self.config.schema],
                    )
                    .await?
                    .is_some();
                if !schema_exists {
                    tx.batch_execute(&format!("CREATE SCHEMA {schema}")).await?;
                }
                tx.batch_execute(&format!(
                    "CREATE TABLE IF NOT EXISTS {table} (k BYTEA PRIMARY KEY, v BYTEA NOT NULL);
                     CREATE TABLE IF NOT EXISTS {meta} (name TEXT PRIMARY KEY, value TEXT NOT NULL);
                     CREATE TABLE IF NOT EXISTS {leases} (name TEXT PRIMARY KEY, term BIGINT NOT NULL,
                         expires_at TIMESTAMPTZ NOT NULL);
                     INSERT INTO {meta} (name, value) VALUES ('schema_version', '{SCHEMA_VERSION}')
                         ON CONFLICT (name) DO NOTHING;"
                ))
                .await?;
                let row = tx
                    .query_one(
                        &format!("SELECT value FROM {meta} WHERE name = 'schema_version'"),
                        &[],
                    )
                    .await?;
                tx.commit().await?;
                Ok(row.get::<_, String>(0))
            })
            .await;
        let version = co.finish(outcome)?;
        if version != SCHEMA_VERSION {
            return PostgresConfigSnafu {
                key: self.table.clone(),
                reason: format!(
                    "its layout is version {version}; this release reads version {SCHEMA_VERSION}"
                ),
            }
            .fail();
        }
        Ok(())
    }

    /// Refuses a request of `bytes` bytes of keys and values over [`MAX_REQUEST_BYTES`], naming its first key.
    fn check_size(&self, key: &[u8], bytes: usize) -> Result<()> {
        snafu::ensure!(
            bytes <= MAX_REQUEST_BYTES,
            crate::kv::error::KvLimitSnafu {
                backend: self.name(),
                key: display_key(key),
                reason: format!(
                    "a request may carry at most {MAX_REQUEST_BYTES} bytes of keys and values, this one carries {bytes}"
                ),
            }
        );
        Ok(())
    }

    /// The statement writing one pair whether or not its key exists.
    fn upsert(&self) -> String {
        format!(
            "INSERT INTO {} (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v",
            self.table
        )
    }

    /// The `"schema"."table"` the pairs live in.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The advisory locks (`pg_advisory_xact_lock`) a writer of `key` takes, in this order: the table's lock
    /// (shared) and the key's (exclusive; shared to only read it in a transaction that must hold it). Anything else
    /// that writes the table must take them too, or the backend's transactions are not isolated from it.
    pub fn lock_ids(&self, key: &[u8]) -> (i64, i64) {
        (self.locks.all(), self.locks.key(key))
    }

    /// A client of the pool for one call (a free one if there is one, else the next in turn), connected first if
    /// it is not.
    async fn checkout(&self, action: &'static str, key: &[u8]) -> Result<Checkout<'_>> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        let free = self.slots.iter().find_map(|s| s.try_lock().ok());
        let guard = match free {
            Some(g) => g,
            None => self.slots[i].lock().await,
        };
        let mut checkout = Checkout {
            guard,
            backend: self,
            action,
            key: display_key(key),
        };
        if checkout.guard.as_ref().is_none_or(|c| c.client.is_closed()) {
            *checkout.guard = None;
            let client = match open_session(&self.config).await {
                Ok(client) => client,
                Err((detail, retryable)) => return Err(checkout.error(detail, retryable)),
            };
            *checkout.guard = Some(Conn {
                client,
                statements: HashMap::new(),
                in_transaction: false,
            });
        }
        if let Some(conn) = checkout.guard.as_mut()
            && conn.in_transaction
        {
            // A call dropped between its BEGIN and its COMMIT: end that transaction before anything else runs.
            match tokio::time::timeout(
                self.config.request_timeout,
                conn.client.batch_execute("ROLLBACK"),
            )
            .await
            {
                Ok(Ok(())) => conn.in_transaction = false,
                _ => *checkout.guard = None,
            }
            if checkout.guard.is_none() {
                return Err(checkout.error(
                    "the connection was left in a transaction and could not end it".to_string(),
                    true,
                ));
            }
        }
        Ok(checkout)
    }

    /// The rows of `sql`, a statement whose one parameter is `keys` (`k = ANY($1)`).
    async fn by_keys(
        &self,
        action: &'static str,
        sql: &str,
        first: &[u8],
        keys: &[Vec<u8>],
    ) -> Result<Vec<Row>> {
        let mut co = self.checkout(action, first).await?;
        let outcome = self
            .bounded(async {
                let statement = co.statement(sql).await?;
                Ok(co.client()?.query(&statement, &[&keys]).await?)
            })
            .await;
        co.finish(outcome)
    }

    /// The rows of one statement run in a transaction holding `locks` ([`pipelined`]: one round trip).
    async fn locked_query(
        &self,
        action: &'static str,
        first: &[u8],
        locks: &LockSet,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>> {
        let mut co = self.checkout(action, first).await?;
        let outcome = self
            .bounded(async {
                let lock = co.statement(LOCK_SQL).await?;
                let statement = co.statement(sql).await?;
                co.in_transaction(true);
                let client = co.client()?;
                let outcome = pipelined(client, &lock, locks, async {
                    client.query(&statement, params).await
                })
                .await;
                co.in_transaction(false);
                outcome
            })
            .await;
        co.finish(outcome)
    }

    /// `work` bounded by the request timeout.
    async fn bounded<T>(
        &self,
        work: impl std::future::Future<Output = std::result::Result<T, Failure>>,
    ) -> std::result::Result<T, Failure> {
        match tokio::time::timeout(self.config.request_timeout, work).await {
            Ok(outcome) => outcome,
            Err(_) => Err(Failure::Timeout(self.config.request_timeout)),
        }
    }
}

/// How many prepared statements a connection keeps (ranges with different limits are different statements).
const STATEMENTS_KEPT: usize = 64;

/// One pooled connection and the statements prepared on it.
struct Conn {
    client: Client,
    statements: HashMap<String, Statement>,
    /// A pipelined transaction began on it and its call did not see it end (the call was dropped mid-way): the
    /// next user rolls it back first.
    in_transaction: bool,
}

/// A client checked out of the pool for one call.
struct Checkout<'a> {
    guard: tokio::sync::MutexGuard<'a, Option<Conn>>,
    backend: &'a PostgresKvBackend,
    action: &'static str,
    key: String,
}

impl Checkout<'_> {
    /// Marks (or clears) that a pipelined transaction is open on the connection.
    fn in_transaction(&mut self, open: bool) {
        if let Some(conn) = self.guard.as_mut() {
            conn.in_transaction = open;
        }
    }

    fn client(&mut self) -> std::result::Result<&mut Client, Failure> {
        self.guard
            .as_mut()
            .map(|c| &mut c.client)
            .ok_or(Failure::NoClient)
    }

    /// `sql` prepared on this connection (once: kept while the connection lives), so a call sends one round trip
    /// per statement instead of a prepare and an execute.
    async fn statement(&mut self, sql: &str) -> std::result::Result<Statement, Failure> {
        let conn = self.guard.as_mut().ok_or(Failure::NoClient)?;
        if let Some(statement) = conn.statements.get(sql) {
            return Ok(statement.clone());
        }
        let statement = conn.client.prepare(sql).await?;
        if conn.statements.len() >= STATEMENTS_KEPT {
            conn.statements.clear();
        }
        conn.statements.insert(sql.to_string(), statement.clone());
        Ok(statement)
    }

    fn error(&self, detail: String, retryable: bool) -> Error {
        PostgresOpSnafu {
            endpoint: self.backend.endpoint.clone(),
            action: self.action,
            key: self.key.clone(),
            detail,
            retryable,
        }
        .build()
    }

    /// The call's outcome as the crate's error; a broken or timed-out connection is dropped (its next user
    /// connects again).
    fn finish<T>(mut self, outcome: std::result::Result<T, Failure>) -> Result<T> {
        match outcome {
            Ok(value) => Ok(value),
            Err(Failure::Pg(e)) => {
                if e.code().is_none() {
                    *self.guard = None;
                }
                Err(self.error(detail(&e), retryable(&e)))
            }
            Err(Failure::Timeout(after)) => {
                *self.guard = None;
                Err(self.error(
                    format!("no answer within {after:?} (its effect is unknown)"),
                    true,
                ))
            }
            Err(Failure::NoClient) => Err(self.error("no connection".to_string(), true)),
        }
    }
}

/// Runs `work` in one transaction holding `locks`, pipelined with its `BEGIN`, the lock statement and its `COMMIT`:
/// the four go out at once, so the call waits one round trip. `work` must send every statement when it is first
/// polled (a join of them), or a statement would go out after the `COMMIT`. When any part fails, the `COMMIT`
/// ends the transaction with nothing applied (PostgreSQL answers a `COMMIT` of a failed transaction with a
/// rollback) and the first error is returned.
async fn pipelined<T>(
    client: &Client,
    lock: &Statement,
    locks: &LockSet,
    work: impl std::future::Future<Output = std::result::Result<T, tokio_postgres::Error>>,
) -> std::result::Result<T, Failure> {
    let (begun, locked, done, committed) = tokio::join!(
        client.batch_execute("BEGIN"),
        async { client.execute(lock, &[&locks.ids, &locks.exclusive]).await },
        work,
        client.batch_execute("COMMIT"),
    );
    begun?;
    locked?;
    let value = done?;
    committed?;
    Ok(value)
}

/// Opens a transaction holding `locks` and runs `read` in it, the three pipelined; the reads see every write of
/// the locked keys committed before. On failure the transaction is rolled back. Ended by [`commit_with`].
async fn begin_locked<T>(
    client: &Client,
    lock: &Statement,
    locks: &LockSet,
    read: impl std::future::Future<Output = std::result::Result<T, tokio_postgres::Error>>,
) -> std::result::Result<T, tokio_postgres::Error> {
    let (begun, locked, read) = tokio::join!(
        client.batch_execute("BEGIN"),
        async { client.execute(lock, &[&locks.ids, &locks.exclusive]).await },
        read,
    );
    match begun.and(locked.map(|_| ())).and(read) {
        Ok(value) => Ok(value),
        Err(e) => {
            // Ends the transaction (a no-op outside one); the error that matters is `e`.
            let _ = client.batch_execute("ROLLBACK").await;
            Err(e)
        }
    }
}

/// Sends `writes` (every statement on the first poll) and `COMMIT` at once: a write that fails aborts the
/// transaction and the `COMMIT` then ends it with nothing applied.
async fn commit_with<T>(
    client: &Client,
    writes: impl std::future::Future<Output = std::result::Result<T, tokio_postgres::Error>>,
) -> std::result::Result<T, tokio_postgres::Error> {
    let (written, committed) = tokio::join!(writes, client.batch_execute("COMMIT"));
    let value = written?;
    committed?;
    Ok(value)
}

fn pair(row: &Row) -> KeyValue {
    KeyValue {
        key: row.get(0),
        value: row.get(1),
    }
}

/// The `WHERE` clause of a range, with its parameters: `None` when the range covers nothing.
fn range_clause(key: &[u8], range_end: &[u8]) -> Option<(String, Vec<Vec<u8>>)> {
    if range_end.is_empty() {
        Some(("k = $1".to_string(), vec![key.to_vec()]))
    } else if range_end == [0] {
        Some(("k >= $1".to_string(), vec![key.to_vec()]))
    } else if range_end <= key {
        None
    } else {
        Some((
            "k >= $1 AND k < $2".to_string(),
            vec![key.to_vec(), range_end.to_vec()],
        ))
    }
}

fn params(values: &[Vec<u8>]) -> Vec<&(dyn ToSql + Sync)> {
    values.iter().map(|v| v as &(dyn ToSql + Sync)).collect()
}

#[async_trait]
impl KvBackend for PostgresKvBackend {
    fn name(&self) -> String {
        format!("postgres:{}", self.endpoint)
    }

    fn max_txn_ops(&self) -> usize {
        MAX_TXN_OPS
    }

    fn max_request_bytes(&self) -> usize {
        MAX_REQUEST_BYTES
    }

    fn max_txns_in_flight(&self) -> usize {
        self.slots.len()
    }

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>> {
        let sql = format!("SELECT k, v FROM {} WHERE k = $1", self.table);
        let mut co = self.checkout("get", key).await?;
        let outcome = self
            .bounded(async {
                let statement = co.statement(&sql).await?;
                let row = co.client()?.query_opt(&statement, &[&key]).await?;
                Ok(row.as_ref().map(pair))
            })
            .await;
        co.finish(outcome)
    }

    async fn batch_get(&self, keys: &[Vec<u8>]) -> Result<Vec<KeyValue>> {
        let Some(first) = keys.first() else {
            return Ok(Vec::new());
        };
        let sql = format!("SELECT k, v FROM {} WHERE k = ANY($1)", self.table);
        let found = self.by_keys("batch_get", &sql, first, keys).await?;
        Ok(in_order(keys, found.iter().map(pair)))
    }

    async fn range(&self, req: RangeRequest) -> Result<RangeResponse> {
        let Some((clause, values)) = range_clause(&req.key, &req.range_end) else {
            return Ok(RangeResponse::default());
        };
        let value = if req.keys_only { "''::bytea" } else { "v" };
        let limit = match req.limit {
            0 => String::new(),
            n => format!(" LIMIT {}", n.saturating_add(1)),
        };
        let sql = format!(
            "SELECT k, {value} FROM {} WHERE {clause} ORDER BY k{limit}",
            self.table
        );
        let mut co = self.checkout("range", &req.key).await?;
        let outcome = self
            .bounded(async {
                let statement = co.statement(&sql).await?;
                Ok(co.client()?.query(&statement, &params(&values)).await?)
            })
            .await;
        let rows = co.finish(outcome)?;
        let mut kvs: Vec<KeyValue> = rows.iter().map(pair).collect();
        let more = req.limit > 0 && kvs.len() > req.limit;
        if req.limit > 0 {
            kvs.truncate(req.limit);
        }
        Ok(RangeResponse { kvs, more })
    }

    async fn put(&self, req: PutRequest) -> Result<Option<KeyValue>> {
        check::key(&self.name(), &req.key)?;
        self.check_size(&req.key, req.key.len() + req.value.len())?;
        let select = format!("SELECT k, v FROM {} WHERE k = $1", self.table);
        let upsert = self.upsert();
        let locks = self.locks.of([req.key.as_slice()], []);
        let mut co = self.checkout("put", &req.key).await?;
        let outcome = self
            .bounded(async {
                let lock = co.statement(LOCK_SQL).await?;
                let (select, upsert) = (co.statement(&select).await?, co.statement(&upsert).await?);
                co.in_transaction(true);
                let client = co.client()?;
                let outcome = pipelined(client, &lock, &locks, async {
                    let (prev, put) = tokio::join!(
                        async {
                            if req.prev_kv {
                                client.query_opt(&select, &[&req.key]).await
                            } else {
                                Ok(None)
                            }
                        },
                        async { client.execute(&upsert, &[&req.key, &req.value]).await }
                    );
                    put?;
                    Ok(prev?.as_ref().map(pair))
                })
                .await;
                co.in_transaction(false);
                outcome
            })
            .await;
        co.finish(outcome)
    }

    async fn batch_put(&self, kvs: Vec<KeyValue>, prev_kv: bool) -> Result<Vec<KeyValue>> {
        let kvs = check::dedup_puts(&self.name(), kvs)?;
        let bytes: usize = kvs.iter().map(|kv| kv.key.len() + kv.value.len()).sum();
        if let Some(first) = kvs.first() {
            self.check_size(&first.key, bytes)?;
        }
        let Some(first) = kvs.first().map(|kv| kv.key.clone()) else {
            return Ok(Vec::new());
        };
        let keys: Vec<Vec<u8>> = kvs.iter().map(|kv| kv.key.clone()).collect();
        let values: Vec<Vec<u8>> = kvs.into_iter().map(|kv| kv.value).collect();
        let select = format!("SELECT k, v FROM {} WHERE k = ANY($1)", self.table);
        let upsert = format!(
            "INSERT INTO {} (k, v) SELECT * FROM UNNEST($1::bytea[], $2::bytea[]) \
             ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v",
            self.table
        );
        let locks = self.locks.of(keys.iter().map(Vec::as_slice), []);
        let mut co = self.checkout("batch_put", &first).await?;
        let outcome = self
            .bounded(async {
                let lock = co.statement(LOCK_SQL).await?;
                let (select, upsert) = (co.statement(&select).await?, co.statement(&upsert).await?);
                co.in_transaction(true);
                let client = co.client()?;
                let outcome = pipelined(client, &lock, &locks, async {
                    let (prevs, put) = tokio::join!(
                        async {
                            if prev_kv {
                                client.query(&select, &[&keys]).await
                            } else {
                                Ok(Vec::new())
                            }
                        },
                        async { client.execute(&upsert, &[&keys, &values]).await }
                    );
                    put?;
                    prevs
                })
                .await;
                co.in_transaction(false);
                outcome
            })
            .await;
        let prevs = co.finish(outcome)?;
        // In the order the puts were given, as the other backends answer.
        Ok(in_order(&keys, prevs.iter().map(pair)))
    }

    async fn compare_and_put(&self, req: CompareAndPutRequest) -> Result<CompareAndPutResponse> {
        check::key(&self.name(), &req.key)?;
        self.check_size(&req.key, req.key.len() * 2 + req.value.len())?;
        let select = format!("SELECT v FROM {} WHERE k = $1", self.table);
        let upsert = self.upsert();
        let locks = self.locks.of([req.key.as_slice()], []);
        let mut co = self.checkout("compare_and_put", &req.key).await?;
        let outcome = self
            .bounded(async {
                let lock = co.statement(LOCK_SQL).await?;
                let (select, upsert) = (co.statement(&select).await?, co.statement(&upsert).await?);
                co.in_transaction(true);
                let client = co.client()?;
                let decided = async {
                    let prev: Option<Vec<u8>> = begin_locked(client, &lock, &locks, async {
                        client.query_opt(&select, &[&req.key]).await
                    })
                    .await?
                    .map(|r| r.get(0));
                    let success = prev == req.expect;
                    commit_with(client, async {
                        if success {
                            client.execute(&upsert, &[&req.key, &req.value]).await?;
                        }
                        Ok(())
                    })
                    .await?;
                    Ok::<_, tokio_postgres::Error>((success, prev))
                }
                .await;
                co.in_transaction(false);
                Ok(decided?)
            })
            .await;
        let (success, prev) = co.finish(outcome)?;
        Ok(CompareAndPutResponse {
            success,
            prev_kv: prev.map(|value| KeyValue {
                key: req.key,
                value,
            }),
        })
    }

    async fn delete_range(
        &self,
        key: &[u8],
        range_end: &[u8],
        prev_kv: bool,
    ) -> Result<(u64, Vec<KeyValue>)> {
        let Some((clause, values)) = range_clause(key, range_end) else {
            return Ok((0, Vec::new()));
        };
        let sql = format!("DELETE FROM {} WHERE {clause} RETURNING k, v", self.table);
        // Its keys are not known before it runs: it waits for every writer in flight and holds the others off
        // while it deletes.
        let locks = self.locks.whole_table();
        let rows = self
            .locked_query("delete_range", key, &locks, &sql, &params(&values))
            .await?;
        let mut deleted: Vec<KeyValue> = rows.iter().map(pair).collect();
        deleted.sort();
        let n = deleted.len() as u64;
        Ok((n, if prev_kv { deleted } else { Vec::new() }))
    }

    async fn batch_delete(&self, keys: &[Vec<u8>], prev_kv: bool) -> Result<Vec<KeyValue>> {
        let Some(first) = keys.first() else {
            return Ok(Vec::new());
        };
        let sql = format!(
            "DELETE FROM {} WHERE k = ANY($1) RETURNING k, v",
            self.table
        );
        let locks = self.locks.of(keys.iter().map(Vec::as_slice), []);
        let rows = self
            .locked_query("batch_delete", first, &locks, &sql, &[&keys])
            .await?;
        if !prev_kv {
            return Ok(Vec::new());
        }
        Ok(in_order(keys, rows.iter().map(pair)))
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        check::txn(
            &self.name(),
            &txn,
            self.max_txn_ops(),
            self.max_request_bytes(),
        )?;
        let first = txn.first_key().to_vec();
        let select = format!("SELECT k, v FROM {} WHERE k = ANY($1)", self.table);
        let upsert = format!(
            "INSERT INTO {} (k, v) SELECT * FROM UNNEST($1::bytea[], $2::bytea[]) \
             ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v",
            self.table
        );
        let delete = format!("DELETE FROM {} WHERE k = ANY($1)", self.table);
        // Every key the transaction compares or may read or delete is read in one statement, once its locks are
        // granted: exclusive on every key either branch writes, shared on the keys it only compares or gets (so
        // no transaction can change them before this one commits: a write that passed its compare commits before
        // any change of a key it compared, which is what makes the leader key a fence). The branch is then worked
        // out in memory in op order and written in at most two statements (its puts, its deletes), so a
        // transaction costs the same few round trips whatever its size.
        let written: Vec<&[u8]> = txn
            .success
            .iter()
            .chain(&txn.failure)
            .filter(|op| matches!(op, TxnOp::Put(..) | TxnOp::Delete(_)))
            .map(TxnOp::key)
            .collect();
        let mut read: Vec<Vec<u8>> = txn.compare.iter().map(|c| c.key().to_vec()).collect();
        for op in txn.success.iter().chain(&txn.failure) {
            if matches!(op, TxnOp::Get(_) | TxnOp::Delete(_)) {
                read.push(op.key().to_vec());
            }
        }
        read.sort();
        read.dedup();
        let locks = self
            .locks
            .of(written.iter().copied(), read.iter().map(Vec::as_slice));
        let mut co = self.checkout("txn", &first).await?;
        let outcome = self
            .bounded(async {
                let lock = co.statement(LOCK_SQL).await?;
                let select = co.statement(&select).await?;
                let upsert = co.statement(&upsert).await?;
                let delete = co.statement(&delete).await?;
                co.in_transaction(true);
                let client = co.client()?;
                // Two round trips: BEGIN, the locks and the read go out together, then the writes with COMMIT.
                let outcome = async {
                    let rows = begin_locked(client, &lock, &locks, async {
                        if read.is_empty() {
                            Ok(Vec::new())
                        } else {
                            client.query(&select, &[&read]).await
                        }
                    })
                    .await?;
                    let current: HashMap<Vec<u8>, Vec<u8>> = rows
                        .iter()
                        .map(|r| (r.get::<_, Vec<u8>>(0), r.get::<_, Vec<u8>>(1)))
                        .collect();
                    let plan = plan_branch(&txn, &current);
                    commit_with(client, async {
                        let (put, deleted) = tokio::join!(
                            async {
                                if plan.put_keys.is_empty() {
                                    Ok(0)
                                } else {
                                    client
                                        .execute(&upsert, &[&plan.put_keys, &plan.put_values])
                                        .await
                                }
                            },
                            async {
                                if plan.deleted.is_empty() {
                                    Ok(0)
                                } else {
                                    client.execute(&delete, &[&plan.deleted]).await
                                }
                            }
                        );
                        put.and(deleted)
                    })
                    .await?;
                    Ok::<_, tokio_postgres::Error>(plan.response)
                }
                .await;
                co.in_transaction(false);
                Ok(outcome?)
            })
            .await;
        // Every way out ended the transaction (COMMIT, or ROLLBACK after a failed read); a timeout did not, and
        // `finish` drops that connection.
        co.finish(outcome)
    }
}

/// What a transaction's branch does, worked out from the values it read: whether its compares held, each op's
/// response in op order, and the writes to make (each key at most once per branch, as `check::txn` ensures).
struct BranchPlan {
    response: TxnResponse,
    put_keys: Vec<Vec<u8>>,
    put_values: Vec<Vec<u8>>,
    deleted: Vec<Vec<u8>>,
}

fn plan_branch(txn: &Txn, current: &HashMap<Vec<u8>, Vec<u8>>) -> BranchPlan {
    let succeeded = txn.compare.iter().all(|c| match c {
        Compare::ValueEquals(k, v) => current.get(k) == Some(v),
        Compare::Absent(k) => !current.contains_key(k),
        Compare::Present(k) => current.contains_key(k),
    });
    let ops = if succeeded {
        &txn.success
    } else {
        &txn.failure
    };
    // What each key holds as the branch goes: `None` once deleted by it.
    let mut written: HashMap<&[u8], Option<&Vec<u8>>> = HashMap::new();
    let now =
        |k: &Vec<u8>, written: &HashMap<&[u8], Option<&Vec<u8>>>| match written.get(k.as_slice()) {
            Some(v) => v.cloned(),
            None => current.get(k).cloned(),
        };
    let mut plan = BranchPlan {
        response: TxnResponse {
            succeeded,
            responses: Vec::with_capacity(ops.len()),
        },
        put_keys: Vec::new(),
        put_values: Vec::new(),
        deleted: Vec::new(),
    };
    for op in ops {
        let response = match op {
            TxnOp::Put(k, v) => {
                written.insert(k, Some(v));
                plan.put_keys.push(k.clone());
                plan.put_values.push(v.clone());
                TxnOpResponse::Put
            }
            TxnOp::Get(k) => TxnOpResponse::Get(now(k, &written).map(|value| KeyValue {
                key: k.clone(),
                value,
            })),
            TxnOp::Delete(k) => {
                let existed = now(k, &written).is_some();
                written.insert(k, None);
                plan.deleted.push(k.clone());
                TxnOpResponse::Delete(u64::from(existed))
            }
        };
        plan.response.responses.push(response);
    }
    plan
}

/// The pairs found for `keys`, in the order of `keys`.
fn in_order(keys: &[Vec<u8>], found: impl Iterator<Item = KeyValue>) -> Vec<KeyValue> {
    let mut by_key: HashMap<Vec<u8>, Vec<u8>> = found.map(|kv| (kv.key, kv.value)).collect();
    keys.iter()
        .filter_map(|k| {
            by_key.remove(k).map(|value| KeyValue {
                key: k.clone(),
                value,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_need_quoting_are_refused_by_their_setting() {
        assert_eq!(
            identifier("t", "remote_wal_kv").unwrap(),
            "\"remote_wal_kv\""
        );
        for bad in [
            "",
            "Kv",
            "a-b",
            "1kv",
            "kv\"; DROP TABLE x; --",
            &"x".repeat(49),
        ] {
            let err = identifier("metadata_store.table", bad)
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("PostgreSQL metadata store: metadata_store.table: '"),
                "{err}"
            );
        }
    }

    #[test]
    fn a_url_is_parsed_and_its_password_never_shown() {
        let config =
            PostgresKvConfig::from_url("postgres://walctl@127.0.0.1:5433/meta", Some("s3cret"))
                .unwrap();
        assert_eq!(endpoint_of(&config.connection), "127.0.0.1:5433/meta");
        assert!(!format!("{config:?}").contains("s3cret"));
        let err = PostgresKvConfig::from_url("postgres://u:s3cret@[::1", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("metadata_store.url"), "{err}");
        assert!(!err.contains("s3cret"), "{err}");
    }
}
