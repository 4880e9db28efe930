//! [`EtcdKvBackend`]: the metadata store on an etcd cluster (v3 API, over `etcd-client`).
//!
//! - A client per member; calls start at the member the last one reached and move between members by the rules
//!   of [`members`]: a member that refuses, fails transiently or does not answer a point request within
//!   `member_timeout` is passed over (a read goes to the next member at once; a write fails retryably, since it may
//!   have been applied, and its retry starts at the next member). A connection is proven at
//!   [`EtcdKvBackend::connect`] with a status call under the connect timeout, so an unreachable cluster is
//!   reported, naming the endpoints, instead of hanging.
//! - etcd's limits (`--max-txn-ops`, 128 by default; `--max-request-bytes`, 1.5 MiB by default) are honoured on
//!   the client: `batch_get`, `batch_put` and `batch_delete` are split into several transactions (each atomic,
//!   the batch as a whole then is not); a [`Txn`] or a single value over the limits is refused before anything is
//!   sent.
//! - Point reads (`get`, and `batch_get` up to one request's limits) that callers make while another is in flight
//!   wait for it and then go out together, as one read-only transaction: every etcd read is a linearizable request
//!   whose cost is mostly per request. A queued read is sent after it was queued, so it still sees every write
//!   answered before it; a queued caller waits at most twice the request timeout; a shared read that fails leaves
//!   each caller its own error (a timeout naming its key, any other error by reading alone).
//! - `Compare::Absent` / `Present` compare the key's create revision with 0; `ValueEquals` compares the value
//!   (which fails on an absent key, as etcd does).

pub mod members;
mod point_reads;
pub mod security;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare as EtcdCompare, CompareOp, DeleteOptions, GetOptions, KvClient, PutOptions,
    Txn as EtcdTxn, TxnOp as EtcdTxnOp, TxnOpResponse as EtcdTxnOpResponse,
};
use serde::{Deserialize, Serialize};
use snafu::{IntoError, ensure};

pub(crate) use self::members::is_transient as is_retryable;
use self::members::{Failure, Members, Resend};
use self::point_reads::{PointReads, Reader, Values};
pub use self::security::EtcdSecurity;
use crate::kv::error::{
    EtcdConfigSnafu, EtcdConnectSnafu, EtcdConnectTimeoutSnafu, EtcdOpSnafu, EtcdTimeoutSnafu,
    KvLimitSnafu, Result,
};
use crate::kv::{
    Compare, CompareAndPutRequest, CompareAndPutResponse, KeyValue, KvBackend, PutRequest,
    RangeRequest, RangeResponse, Txn, TxnOp, TxnOpResponse, TxnResponse, check, display_key,
};

/// etcd's default `--max-txn-ops`.
pub const DEFAULT_MAX_TXN_OPS: usize = 128;

/// etcd's default `--max-request-bytes` (1.5 MiB) less 32 KiB of headroom for the protobuf framing of up to
/// [`DEFAULT_MAX_TXN_OPS`] ops, since the client counts only key and value bytes.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1536 * 1024 - 32 * 1024;

/// The largest response the client accepts (a range of many large values).
/// Transactions a writer keeps in flight at once on etcd ([`KvBackend::max_txns_in_flight`]).
pub const ETCD_TXNS_IN_FLIGHT: usize = 8;

const MAX_RESPONSE_BYTES: usize = 512 << 20;

/// How to reach etcd and what it accepts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EtcdConfig {
    /// `host:port` (or `http://host:port`) of the cluster's members.
    pub endpoints: Vec<String>,
    /// How long [`EtcdKvBackend::connect`] may take to reach a member.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long any one call may take.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// How long one member may take to answer a point request (a read, a write, a transaction) before the call
    /// gives up on it and the next call starts at the next member; a read moves on at once. Ranges are given the
    /// whole `request_timeout` (a large one may take long); a connection that stops answering pings is closed
    /// sooner anyway. See `docs/ha.md`.
    #[serde(with = "humantime_serde")]
    pub member_timeout: Duration,
    /// The cluster's `--max-txn-ops`.
    pub max_txn_ops: usize,
    /// The most key and value bytes sent in one request (the cluster's `--max-request-bytes` less headroom).
    pub max_request_bytes: usize,
    /// TLS and the user every connection uses ([`security`]); default: plaintext, no user.
    pub security: EtcdSecurity,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: vec!["127.0.0.1:2379".to_string()],
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            member_timeout: Duration::from_secs(2),
            max_txn_ops: DEFAULT_MAX_TXN_OPS,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            security: EtcdSecurity::default(),
        }
    }
}

impl EtcdConfig {
    /// The default configuration for these endpoints.
    pub fn new(endpoints: impl IntoIterator<Item = impl Into<String>>) -> Self {
        EtcdConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            ..Default::default()
        }
    }
}

/// A [`KvBackend`] on etcd.
#[derive(Clone)]
pub struct EtcdKvBackend {
    /// One client per endpoint (a member each), in the configured order, and the member calls start at (see
    /// [`members`]).
    members: Arc<Members<KvClient>>,
    /// The same members' full clients, for watches ([`KvBackend::watch_prefix`]).
    clients: Arc<Members<Client>>,
    config: EtcdConfig,
    endpoints: String,
    /// The point reads in flight and queued: concurrent ones share a request.
    reads: Arc<PointReads>,
}

impl std::fmt::Debug for EtcdKvBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdKvBackend")
            .field("config", &self.config)
            .finish()
    }
}

impl EtcdKvBackend {
    /// Connects and checks that a member answers within `config.connect_timeout`.
    pub async fn connect(config: EtcdConfig) -> Result<Self> {
        ensure!(
            !config.endpoints.is_empty(),
            EtcdConfigSnafu {
                reason: "no endpoints given",
            }
        );
        ensure!(
            config.max_txn_ops >= 2 && config.max_request_bytes > 0,
            EtcdConfigSnafu {
                reason: format!(
                    "max_txn_ops must be at least 2 and max_request_bytes positive (got {} and {})",
                    config.max_txn_ops, config.max_request_bytes
                ),
            }
        );
        ensure!(
            !config.member_timeout.is_zero() && !config.request_timeout.is_zero(),
            EtcdConfigSnafu {
                reason: "request_timeout and member_timeout must be positive",
            }
        );
        let endpoints = config.endpoints.join(",");
        let loaded = config.security.load(
            &config.endpoints,
            members::connect_options(config.connect_timeout, Some(config.request_timeout)),
        )?;
        // One client per member rather than one balancing over all (see `members`).
        let connecting = async {
            let mut clients = Vec::with_capacity(config.endpoints.len());
            let mut sign_in = Vec::with_capacity(config.endpoints.len());
            for endpoint in &config.endpoints {
                let (client, signing) = members::connect_member(endpoint, &loaded).await?;
                clients.push(client);
                sign_in.push(signing);
            }
            // Connecting is lazy: a status call (after signing in, with a user) proves a member answers; the first
            // that does is preferred.
            let members = Members::new(clients, config.endpoints.clone()).with_sign_in(sign_in);
            let status = members
                .call(config.connect_timeout, Resend::Safe, |mut c| async move {
                    c.status().await
                })
                .await;
            Ok::<_, etcd_client::Error>((status, members))
        };
        let (clients, preferred) =
            match tokio::time::timeout(config.connect_timeout, connecting).await {
                Ok(Ok((Ok(_), members))) => {
                    let preferred = members.preferred();
                    (members, preferred)
                }
                Err(_) | Ok(Ok((Err(Failure::Timeout { .. }), _))) => {
                    return EtcdConnectTimeoutSnafu {
                        endpoints,
                        timeout: config.connect_timeout,
                    }
                    .fail();
                }
                Ok(Err(source)) => {
                    return Err(EtcdConnectSnafu {
                        endpoints,
                        detail: describe(&source),
                        retryable: is_retryable(&source),
                    }
                    .into_error(source));
                }
                Ok(Ok((Err(Failure::Etcd { endpoint, error }), _))) => {
                    // The member whose answer this is (the last one tried when every member failed).
                    let mut detail = describe(&error);
                    if let Some(hint) = members::connect_hint(&error, config.security.uses_tls()) {
                        detail = format!("{detail}; {hint}");
                    }
                    return Err(EtcdConnectSnafu {
                        endpoints: endpoint,
                        detail,
                        retryable: is_retryable(&error),
                    }
                    .into_error(error));
                }
            };
        let kv_clients = (0..clients.len())
            .map(|i| {
                clients
                    .member(i)
                    .0
                    .kv_client()
                    .max_decoding_message_size(MAX_RESPONSE_BYTES)
            })
            .collect();
        let members =
            Members::new(kv_clients, config.endpoints.clone()).with_sign_in(clients.sign_in());
        members.prefer(preferred);
        let clients = Arc::new(clients);
        let reads = PointReads::new(point_reads::Limits {
            max_keys: config.max_txn_ops,
            max_bytes: config.max_request_bytes,
            request_timeout: config.request_timeout,
            endpoints: endpoints.clone(),
        });
        Ok(EtcdKvBackend {
            members: Arc::new(members),
            clients,
            config,
            endpoints,
            reads,
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// Runs one etcd call, `f` on a member's client, by the rules of [`members`]: a point request gives each member
    /// `member_timeout`, a range the whole `request_timeout`; `resend` says whether a request that may have
    /// reached a member may go to the next one.
    async fn call<T, F, Fut>(
        &self,
        action: &'static str,
        key: &[u8],
        resend: Resend,
        f: F,
    ) -> Result<T>
    where
        F: Fn(KvClient) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let attempt = if action == "range" {
            self.config.request_timeout
        } else {
            self.config.member_timeout.min(self.config.request_timeout)
        };
        let whole = self.config.request_timeout;
        let outcome = tokio::time::timeout(whole, self.members.call(attempt, resend, f))
            .await
            .unwrap_or_else(|_| {
                Err(Failure::Timeout {
                    endpoint: self.endpoints.clone(),
                    after: whole,
                })
            });
        match outcome {
            Ok(out) => Ok(out),
            Err(Failure::Timeout { endpoint, after }) => EtcdTimeoutSnafu {
                endpoints: endpoint,
                action,
                key: display_key(key),
                timeout: after,
            }
            .fail(),
            Err(Failure::Etcd { endpoint, error }) => Err(EtcdOpSnafu {
                endpoints: endpoint,
                action,
                key: display_key(key),
                detail: describe(&error),
                retryable: is_retryable(&error),
            }
            .into_error(error)),
        }
    }

    /// Runs one etcd transaction of `ops` with no compares and returns its op responses.
    async fn plain_txn(
        &self,
        action: &'static str,
        key: &[u8],
        resend: Resend,
        ops: Vec<EtcdTxnOp>,
    ) -> Result<Vec<EtcdTxnOpResponse>> {
        let txn = EtcdTxn::new().and_then(ops);
        let resp = self
            .call(action, key, resend, |mut kv| {
                let txn = txn.clone();
                async move { kv.txn(txn).await }
            })
            .await?;
        Ok(resp.op_responses())
    }

    /// Refuses a single pair over the byte limit.
    fn check_size(&self, key: &[u8], bytes: usize) -> Result<()> {
        let max = self.config.max_request_bytes;
        ensure!(
            bytes <= max,
            KvLimitSnafu {
                backend: self.name(),
                key: display_key(key),
                reason: format!(
                    "a request may carry at most {max} bytes of keys and values, this one carries {bytes}"
                ),
            }
        );
        Ok(())
    }

    /// Splits items into chunks of at most `max_txn_ops` items and `max_request_bytes` bytes (an item over the byte
    /// limit must have been refused before).
    fn chunks<T>(&self, items: Vec<T>, size: impl Fn(&T) -> usize) -> Vec<Vec<T>> {
        let mut chunks = Vec::new();
        let mut chunk = Vec::new();
        let mut bytes = 0;
        for item in items {
            let n = size(&item);
            if !chunk.is_empty()
                && (chunk.len() == self.config.max_txn_ops
                    || bytes + n > self.config.max_request_bytes)
            {
                chunks.push(std::mem::take(&mut chunk));
                bytes = 0;
            }
            bytes += n;
            chunk.push(item);
        }
        if !chunk.is_empty() {
            chunks.push(chunk);
        }
        chunks
    }
}

/// etcd refuses an empty start key; no key is empty, so `\0`, the least key, starts the same range.
fn etcd_start(key: Vec<u8>) -> Vec<u8> {
    if key.is_empty() { vec![0] } else { key }
}

fn to_kv(kv: &etcd_client::KeyValue) -> KeyValue {
    KeyValue {
        key: kv.key().to_vec(),
        value: kv.value().to_vec(),
    }
}

fn to_compare(c: Compare) -> EtcdCompare {
    match c {
        Compare::ValueEquals(k, v) => EtcdCompare::value(k, CompareOp::Equal, v),
        Compare::Absent(k) => EtcdCompare::create_revision(k, CompareOp::Equal, 0),
        Compare::Present(k) => EtcdCompare::create_revision(k, CompareOp::Greater, 0),
    }
}

fn to_op(op: TxnOp) -> EtcdTxnOp {
    match op {
        TxnOp::Put(k, v) => EtcdTxnOp::put(k, v, None),
        TxnOp::Get(k) => EtcdTxnOp::get(k, None),
        TxnOp::Delete(k) => EtcdTxnOp::delete(k, None),
    }
}

fn from_op_response(resp: EtcdTxnOpResponse) -> TxnOpResponse {
    match resp {
        EtcdTxnOpResponse::Put(_) => TxnOpResponse::Put,
        EtcdTxnOpResponse::Get(get) => TxnOpResponse::Get(get.kvs().first().map(to_kv)),
        EtcdTxnOpResponse::Delete(del) => TxnOpResponse::Delete(del.deleted().max(0) as u64),
        // Nested transactions are never sent.
        EtcdTxnOpResponse::Txn(_) => TxnOpResponse::Put,
    }
}

/// A one-line account of an etcd client error for people: the gRPC status and its message, then the innermost
/// cause (e.g. `unavailable: tcp connect error (Connection refused (os error 111))`), instead of the client's
/// nested debug output.
pub fn describe(e: &etcd_client::Error) -> String {
    use std::error::Error as _;
    let refusal = members::tls_refusal(e);
    let head = match e {
        etcd_client::Error::GRpcStatus(status) if let Some(what) = refusal => {
            format!("{what}: {}", status.message())
        }
        other if let Some(what) = refusal => format!("{what}: {other}"),
        etcd_client::Error::GRpcStatus(status) => {
            let code = format!("{:?}", status.code());
            let mut words = String::new();
            for (i, c) in code.chars().enumerate() {
                if c.is_ascii_uppercase() && i > 0 {
                    words.push(' ');
                }
                words.push(c.to_ascii_lowercase());
            }
            if status.message().is_empty() {
                words
            } else {
                format!("{words}: {}", status.message())
            }
        }
        other => other.to_string(),
    };
    let mut innermost = None;
    let mut cause = match e {
        etcd_client::Error::GRpcStatus(status) => status.source(),
        other => other.source(),
    };
    while let Some(c) = cause {
        innermost = Some(c);
        cause = c.source();
    }
    match innermost {
        Some(c) if !head.contains(&c.to_string()) => format!("{head} ({c})"),
        _ => head,
    }
}

/// One read request: a range of one key, or a read-only transaction of one get per key.
#[async_trait]
impl Reader for EtcdKvBackend {
    async fn read(&self, action: &'static str, keys: &[Vec<u8>]) -> Result<Values> {
        if let [key] = keys {
            let resp = self
                .call(action, key, Resend::Safe, |mut kv| async move {
                    kv.get(key.as_slice(), None).await
                })
                .await?;
            return Ok(vec![resp.kvs().first().map(to_kv)]);
        }
        let first = keys.first().map(Vec::as_slice).unwrap_or_default();
        let ops = keys
            .iter()
            .map(|k| EtcdTxnOp::get(k.clone(), None))
            .collect();
        let mut values = Vec::with_capacity(keys.len());
        for resp in self.plain_txn(action, first, Resend::Safe, ops).await? {
            if let EtcdTxnOpResponse::Get(get) = resp {
                values.push(get.kvs().first().map(to_kv));
            }
        }
        Ok(values)
    }
}

#[async_trait]
impl KvBackend for EtcdKvBackend {
    fn name(&self) -> String {
        format!("etcd:{}", self.endpoints)
    }

    fn max_txn_ops(&self) -> usize {
        self.config.max_txn_ops
    }

    fn max_request_bytes(&self) -> usize {
        self.config.max_request_bytes
    }

    /// etcd orders concurrent txns in its raft log and makes them durable together, so a writer gains by keeping
    /// several in flight.
    fn max_txns_in_flight(&self) -> usize {
        ETCD_TXNS_IN_FLIGHT
    }

    /// An etcd watch on the prefix, on the member calls start at; when it fails or is cancelled (the member lost
    /// its quorum, went away, or its connection went silent) it is set up again on the next member a second later.
    /// The counter is raised after every response carrying events, and each time the watch is (re)established,
    /// since changes made while it was down are not replayed.
    fn watch_prefix(&self, prefix: &[u8]) -> Option<tokio::sync::watch::Receiver<u64>> {
        let (tx, rx) = tokio::sync::watch::channel(0u64);
        let clients = Arc::clone(&self.clients);
        let prefix = prefix.to_vec();
        tokio::spawn(async move {
            let mut member = clients.preferred();
            loop {
                let (client, endpoint) = clients.member(member);
                let watched = async {
                    clients.signed_in(member).await?;
                    let mut stream = client
                        .watch_client()
                        .watch(
                            prefix.clone(),
                            Some(etcd_client::WatchOptions::new().with_prefix()),
                        )
                        .await?;
                    tx.send_modify(|n| *n += 1);
                    while let Some(resp) = stream.message().await? {
                        if resp.canceled() {
                            break;
                        }
                        if !resp.events().is_empty() {
                            tx.send_modify(|n| *n += 1);
                        }
                    }
                    Ok::<(), etcd_client::Error>(())
                };
                tokio::select! {
                    ended = watched => {
                        if let Err(e) = ended {
                            tracing::debug!(%endpoint, error = %describe(&e), "an etcd watch ended; setting it up again");
                        }
                    }
                    () = tx.closed() => return,
                }
                member = (member + 1) % clients.len().max(1);
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    () = tx.closed() => return,
                }
            }
        });
        Some(rx)
    }

    /// Shares its request with the point reads other callers make at the same time (see the module
    /// documentation).
    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>> {
        if key.is_empty() {
            return Ok(None);
        }
        let values = self.reads.read(self, "get", vec![key.to_vec()]).await?;
        Ok(values.into_iter().next().flatten())
    }

    /// Each request's worth of keys shares its request with the point reads other callers make at the same time
    /// (see the module documentation).
    async fn batch_get(&self, keys: &[Vec<u8>]) -> Result<Vec<KeyValue>> {
        let mut out = Vec::new();
        let keys: Vec<Vec<u8>> = keys.iter().filter(|k| !k.is_empty()).cloned().collect();
        for chunk in self.chunks(keys, Vec::len) {
            let values = self.reads.read(self, "batch_get", chunk).await?;
            out.extend(values.into_iter().flatten());
        }
        Ok(out)
    }

    async fn range(&self, mut req: RangeRequest) -> Result<RangeResponse> {
        if check::span(&req.key, &req.range_end).is_none()
            || (req.key.is_empty() && req.range_end.is_empty())
        {
            return Ok(RangeResponse::default());
        }
        req.key = etcd_start(req.key);
        let mut options = GetOptions::new();
        if !req.range_end.is_empty() {
            options = options.with_range(req.range_end.clone());
        }
        if req.limit > 0 {
            options = options.with_limit(i64::try_from(req.limit).unwrap_or(i64::MAX));
        }
        if req.keys_only {
            options = options.with_keys_only();
        }
        let resp = self
            .call("range", &req.key, Resend::Safe, |mut kv| {
                let (key, options) = (req.key.clone(), options.clone());
                async move { kv.get(key, Some(options)).await }
            })
            .await?;
        Ok(RangeResponse {
            kvs: resp.kvs().iter().map(to_kv).collect(),
            more: resp.more(),
        })
    }

    async fn put(&self, req: PutRequest) -> Result<Option<KeyValue>> {
        check::key(&self.name(), &req.key)?;
        self.check_size(&req.key, req.key.len() + req.value.len())?;
        let options = req.prev_kv.then(|| PutOptions::new().with_prev_key());
        let resp = self
            .call("put", &req.key, Resend::Never, |mut kv| {
                let (key, value, options) = (req.key.clone(), req.value.clone(), options.clone());
                async move { kv.put(key, value, options).await }
            })
            .await?;
        Ok(resp.prev_key().filter(|_| req.prev_kv).map(to_kv))
    }

    async fn batch_put(&self, kvs: Vec<KeyValue>, prev_kv: bool) -> Result<Vec<KeyValue>> {
        let kvs = check::dedup_puts(&self.name(), kvs)?;
        for kv in &kvs {
            self.check_size(&kv.key, kv.key.len() + kv.value.len())?;
        }
        let mut prevs = Vec::new();
        for chunk in self.chunks(kvs, |kv| kv.key.len() + kv.value.len()) {
            let first = chunk[0].key.clone();
            let ops = chunk
                .into_iter()
                .map(|kv| {
                    EtcdTxnOp::put(
                        kv.key,
                        kv.value,
                        prev_kv.then(|| PutOptions::new().with_prev_key()),
                    )
                })
                .collect();
            for resp in self
                .plain_txn("batch_put", &first, Resend::Never, ops)
                .await?
            {
                if let EtcdTxnOpResponse::Put(put) = resp
                    && prev_kv
                {
                    prevs.extend(put.prev_key().map(to_kv));
                }
            }
        }
        Ok(prevs)
    }

    async fn compare_and_put(&self, req: CompareAndPutRequest) -> Result<CompareAndPutResponse> {
        check::key(&self.name(), &req.key)?;
        let bytes = req.key.len() * 3 + req.value.len() + req.expect.as_ref().map_or(0, Vec::len);
        self.check_size(&req.key, bytes)?;
        let compare = match req.expect {
            None => to_compare(Compare::Absent(req.key.clone())),
            Some(v) => to_compare(Compare::ValueEquals(req.key.clone(), v)),
        };
        let txn = EtcdTxn::new()
            .when(vec![compare])
            .and_then(vec![EtcdTxnOp::put(
                req.key.clone(),
                req.value,
                Some(PutOptions::new().with_prev_key()),
            )])
            .or_else(vec![EtcdTxnOp::get(req.key.clone(), None)]);
        let resp = self
            .call("compare_and_put", &req.key, Resend::Never, |mut kv| {
                let txn = txn.clone();
                async move { kv.txn(txn).await }
            })
            .await?;
        let prev_kv = resp.op_responses().into_iter().find_map(|r| match r {
            EtcdTxnOpResponse::Put(put) => put.prev_key().map(to_kv),
            EtcdTxnOpResponse::Get(get) => get.kvs().first().map(to_kv),
            _ => None,
        });
        Ok(CompareAndPutResponse {
            success: resp.succeeded(),
            prev_kv,
        })
    }

    async fn delete_range(
        &self,
        key: &[u8],
        range_end: &[u8],
        prev_kv: bool,
    ) -> Result<(u64, Vec<KeyValue>)> {
        if check::span(key, range_end).is_none() || (key.is_empty() && range_end.is_empty()) {
            return Ok((0, Vec::new()));
        }
        let start = etcd_start(key.to_vec());
        let key = start.as_slice();
        let mut options = DeleteOptions::new();
        if !range_end.is_empty() {
            options = options.with_range(range_end);
        }
        if prev_kv {
            options = options.with_prev_key();
        }
        let resp = self
            .call("delete_range", key, Resend::Never, |mut kv| {
                let options = options.clone();
                async move { kv.delete(key, Some(options)).await }
            })
            .await?;
        Ok((
            resp.deleted().max(0) as u64,
            resp.prev_kvs().iter().map(to_kv).collect(),
        ))
    }

    async fn batch_delete(&self, keys: &[Vec<u8>], prev_kv: bool) -> Result<Vec<KeyValue>> {
        // etcd refuses a key deleted twice in one transaction; deleting it once has the same effect.
        let mut seen = std::collections::HashSet::new();
        let keys: Vec<Vec<u8>> = keys
            .iter()
            .filter(|k| !k.is_empty() && seen.insert(*k))
            .cloned()
            .collect();
        let mut prevs = Vec::new();
        for chunk in self.chunks(keys, Vec::len) {
            let first = chunk[0].clone();
            let ops = chunk
                .into_iter()
                .map(|k| {
                    EtcdTxnOp::delete(k, prev_kv.then(|| DeleteOptions::new().with_prev_key()))
                })
                .collect();
            for resp in self
                .plain_txn("batch_delete", &first, Resend::Never, ops)
                .await?
            {
                if let EtcdTxnOpResponse::Delete(del) = resp {
                    prevs.extend(del.prev_kvs().iter().map(to_kv));
                }
            }
        }
        Ok(prevs)
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        check::txn(
            &self.name(),
            &txn,
            self.config.max_txn_ops,
            self.config.max_request_bytes,
        )?;
        let first = txn.first_key().to_vec();
        // A transaction of reads only may be sent to another member after one that may have received it.
        let resend = if txn
            .success
            .iter()
            .chain(&txn.failure)
            .all(|op| matches!(op, TxnOp::Get(_)))
        {
            Resend::Safe
        } else {
            Resend::Never
        };
        let etcd_txn = EtcdTxn::new()
            .when(txn.compare.into_iter().map(to_compare).collect::<Vec<_>>())
            .and_then(txn.success.into_iter().map(to_op).collect::<Vec<_>>())
            .or_else(txn.failure.into_iter().map(to_op).collect::<Vec<_>>());
        let resp = self
            .call("txn", &first, resend, |mut kv| {
                let txn = etcd_txn.clone();
                async move { kv.txn(txn).await }
            })
            .await?;
        Ok(TxnResponse {
            succeeded: resp.succeeded(),
            responses: resp
                .op_responses()
                .into_iter()
                .map(from_op_response)
                .collect(),
        })
    }
}
