//! The conformance suite every [`KvBackend`] must pass, in the openraft shape: the implementor supplies a factory
//! of fresh stores and [`run_all`] runs every case, each on its own store (or its own key namespace).
//!
//! This is test code (only with the `testing` feature): a failed case panics with a message naming the case and
//! what differed. On a shared store each case's namespace is deleted after the case, also when it panics, so a
//! failing run leaves no keys behind.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::kv::error::Error;
use crate::kv::{
    Compare, CompareAndPutRequest, KeyValue, KvBackend, KvBackendRef, PutRequest, RangeRequest,
    Txn, TxnOp, TxnOpResponse, prefix_end, range_all,
};

/// A key prefix no other test run uses: `kvtest-{tag}-{random}/`.
pub fn unique_prefix(tag: &str) -> Vec<u8> {
    use std::hash::BuildHasher;
    let seed = (
        std::time::SystemTime::now(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
    );
    let random = std::collections::hash_map::RandomState::new().hash_one(seed);
    format!("kvtest-{tag}-{random:016x}/").into_bytes()
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// The etcd named by `ETCD_ENDPOINTS` (comma-separated `host:port`). Panics with a message saying what is missing
/// when the variable is unset or the cluster does not answer: tests needing etcd fail, they never skip.
pub async fn etcd_from_env() -> crate::kv::EtcdKvBackend {
    let endpoints = std::env::var("ETCD_ENDPOINTS").unwrap_or_default();
    let endpoints: Vec<String> = endpoints
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(String::from)
        .collect();
    assert!(
        !endpoints.is_empty(),
        "ETCD_ENDPOINTS is not set: this test needs a running etcd (comma-separated host:port; \
         run through scripts/test.sh)"
    );
    crate::kv::EtcdKvBackend::connect(crate::kv::EtcdConfig::new(endpoints.clone()))
        .await
        .unwrap_or_else(|e| {
            panic!("this test needs a running etcd at ETCD_ENDPOINTS={endpoints:?}: {e}")
        })
}

/// The PostgreSQL the test command starts (`scripts/services.sh start postgres`): `POSTGRES_URL`
/// (`postgres://postgres@127.0.0.1:PORT/remote_wal`) and `POSTGRES_PASSWORD_FILE`, in table `table` of schema
/// `public`. Panics naming what is missing or unreachable: tests needing PostgreSQL fail, they never skip.
pub async fn postgres_from_env(table: &str) -> crate::kv::PostgresKvBackend {
    crate::kv::PostgresKvBackend::connect(postgres_config_from_env(table))
        .await
        .unwrap_or_else(|e| panic!("this test needs a running PostgreSQL at POSTGRES_URL: {e}"))
}

/// The config [`postgres_from_env`] connects with.
pub fn postgres_config_from_env(table: &str) -> crate::kv::PostgresKvConfig {
    let url = std::env::var("POSTGRES_URL").unwrap_or_default();
    assert!(
        !url.is_empty(),
        "POSTGRES_URL is not set: this test needs a running PostgreSQL (postgres://user@host:port/db; run through \
         scripts/test.sh)"
    );
    let password = std::env::var("POSTGRES_PASSWORD_FILE").ok().map(|path| {
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("POSTGRES_PASSWORD_FILE={path}: {e}"))
            .trim()
            .to_string()
    });
    let mut config = crate::kv::PostgresKvConfig::from_url(&url, password.as_deref())
        .unwrap_or_else(|e| panic!("POSTGRES_URL: {e}"));
    config.table = table.to_string();
    config
}

/// [`postgres_config_from_env`] as the user `walctl_tls`, whom the test command's PostgreSQL admits only over TLS
/// with a client certificate (`scripts/services.sh start postgres`): `POSTGRES_TLS_CERTS` names the directory
/// `scripts/certs.sh` filled (`ca.pem`, `client.pem`, `client.key`, `other-ca.pem`); `ca` is the file of it to
/// trust and `client_certificate` whether to present `client.pem`. Panics naming what is missing: tests needing it
/// fail, they never skip. Returns the config (TLS not yet set up when loading it fails: then the error).
pub fn postgres_tls_config_from_env(
    table: &str,
    ca: &str,
    client_certificate: bool,
) -> crate::kv::Result<crate::kv::PostgresKvConfig> {
    let certs = std::env::var("POSTGRES_TLS_CERTS").unwrap_or_default();
    assert!(
        !certs.is_empty(),
        "POSTGRES_TLS_CERTS is not set: this test needs the test command's PostgreSQL and its certificates \
         (target/services/postgres/certs; run through scripts/test.sh)"
    );
    let certs = std::path::PathBuf::from(certs);
    let mut config = postgres_config_from_env(table);
    config.connection.user("walctl_tls");
    let (cert, key) = (certs.join("client.pem"), certs.join("client.key"));
    let client = client_certificate.then_some((cert.as_path(), key.as_path()));
    config.with_tls(&certs.join(ca), client)
}

/// The secure etcd the test command starts (`scripts/services.sh start etcd-secure`): TLS with a client
/// certificate, auth enabled. Read from the environment: `ETCD_SECURE_ENDPOINTS` (comma-separated `host:port`),
/// `ETCD_SECURE_CERTS` (the directory `scripts/certs.sh` filled: `ca.pem`, `client.pem`, `client.key`,
/// `other-ca.pem`) and `ETCD_SECURE_PASSWORD_FILE` (the `walctl` user's password). Panics naming what is missing:
/// tests needing it fail, they never skip.
#[derive(Clone, Debug)]
pub struct SecureEtcd {
    /// The endpoints, `host:port`.
    pub endpoints: Vec<String>,
    /// The certificates' directory.
    pub certs: std::path::PathBuf,
    /// The file holding the `walctl` user's password.
    pub password_file: std::path::PathBuf,
}

impl SecureEtcd {
    /// Reads the environment (see the type's documentation).
    pub fn from_env() -> Self {
        let var = |name: &str| {
            let value = std::env::var(name).unwrap_or_default();
            assert!(
                !value.trim().is_empty(),
                "{name} is not set: this test needs the secure etcd (run through scripts/test.sh, or \
                 scripts/services.sh start etcd-secure and set ETCD_SECURE_ENDPOINTS, ETCD_SECURE_CERTS and \
                 ETCD_SECURE_PASSWORD_FILE)"
            );
            value
        };
        SecureEtcd {
            endpoints: var("ETCD_SECURE_ENDPOINTS")
                .split(',')
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .map(String::from)
                .collect(),
            certs: var("ETCD_SECURE_CERTS").into(),
            password_file: var("ETCD_SECURE_PASSWORD_FILE").into(),
        }
    }

    /// TLS trusting the test authority, with the client certificate.
    pub fn tls(&self) -> crate::kv::etcd::security::EtcdTlsConfig {
        crate::kv::etcd::security::EtcdTlsConfig {
            ca: self.certs.join("ca.pem"),
            cert: Some(self.certs.join("client.pem")),
            key: Some(self.certs.join("client.key")),
        }
    }

    /// The full security settings: TLS with the client certificate, as user `walctl`.
    pub fn security(&self) -> crate::kv::etcd::EtcdSecurity {
        crate::kv::etcd::EtcdSecurity {
            tls: Some(self.tls()),
            username: Some("walctl".to_string()),
            password_file: Some(self.password_file.clone()),
        }
    }

    /// A kv configuration with [`SecureEtcd::security`].
    pub fn config(&self) -> crate::kv::EtcdConfig {
        crate::kv::EtcdConfig {
            security: self.security(),
            ..crate::kv::EtcdConfig::new(self.endpoints.clone())
        }
    }
}

/// Runs every case. `make` returns a store and the key namespace the case must stay inside: an empty namespace for
/// a fresh store nobody else uses (memory, a new redb file), a unique prefix on a shared one (etcd). With a
/// non-empty namespace the store must hold no other key starting with it.
pub async fn run_all<F, Fut>(mut make: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = (KvBackendRef, Vec<u8>)>,
{
    macro_rules! case {
        ($name:ident) => {{
            let (kv, ns) = make().await;
            tracing::info!(backend = %kv.name(), case = stringify!($name), "kv conformance case");
            isolated(kv.clone(), ns.clone(), $name(kv, Ns(ns))).await;
        }};
    }
    case!(get_and_batch_get);
    case!(range_by_prefix_and_key_range);
    case!(range_limit_and_pagination);
    case!(range_keys_only);
    case!(empty_prefix_is_every_key);
    case!(binary_keys_and_values);
    case!(put_returns_prev_kv_when_asked);
    case!(batch_put_large_and_duplicates);
    case!(batch_get_and_delete_large);
    case!(compare_and_put_absent_exact_mismatch);
    case!(compare_and_put_race_has_one_winner_per_round);
    case!(delete_range_and_batch_delete);
    case!(txn_compares_and_branches);
    case!(txn_is_atomic);
    case!(invalid_and_oversized_requests_apply_nothing);
    case!(large_values_split_by_bytes);
}

/// Runs `case`, then deletes every key under `namespace` from `kv`, whether the case passed or panicked (the panic
/// is then resumed). An empty namespace (a store of its own) is left as it is.
pub async fn isolated(kv: KvBackendRef, namespace: Vec<u8>, case: impl Future<Output = ()>) {
    use futures::FutureExt;
    let outcome = std::panic::AssertUnwindSafe(case).catch_unwind().await;
    if !namespace.is_empty() {
        let cleaned = kv
            .delete_range(&namespace, &prefix_end(&namespace), false)
            .await;
        if let Err(e) = cleaned {
            tracing::warn!(error = %e, "kv conformance: could not delete the case's namespace");
        }
    }
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// A case's key namespace.
struct Ns(Vec<u8>);

impl Ns {
    fn k(&self, suffix: impl AsRef<[u8]>) -> Vec<u8> {
        let mut key = self.0.clone();
        key.extend_from_slice(suffix.as_ref());
        key
    }

    fn kv(&self, suffix: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> KeyValue {
        KeyValue {
            key: self.k(suffix),
            value: value.as_ref().to_vec(),
        }
    }

    /// Every pair of the namespace, read back in pages of 7.
    async fn dump(&self, kv: &dyn KvBackend) -> Vec<KeyValue> {
        range_all(kv, RangeRequest::prefix(self.0.clone()), 7)
            .await
            .expect("range over the namespace")
    }
}

async fn put(kv: &dyn KvBackend, pair: KeyValue) {
    kv.put(PutRequest {
        key: pair.key,
        value: pair.value,
        prev_kv: false,
    })
    .await
    .expect("put");
}

fn keys(kvs: &[KeyValue]) -> Vec<Vec<u8>> {
    kvs.iter().map(|kv| kv.key.clone()).collect()
}

async fn get_and_batch_get(kv: KvBackendRef, ns: Ns) {
    let kv = kv.as_ref();
    assert_eq!(
        kv.get(&ns.k("missing")).await.unwrap(),
        None,
        "get of a missing key"
    );
    put(kv, ns.kv("a", "1")).await;
    put(kv, ns.kv("b", "2")).await;
    put(kv, ns.kv("c", "3")).await;
    assert_eq!(kv.get(&ns.k("b")).await.unwrap(), Some(ns.kv("b", "2")));
    let got = kv
        .batch_get(&[ns.k("c"), ns.k("missing"), ns.k("a"), ns.k("zz")])
        .await
        .unwrap();
    assert_eq!(
        got,
        vec![ns.kv("c", "3"), ns.kv("a", "1")],
        "batch_get returns the found keys in the order asked"
    );
    assert!(
        kv.batch_get(&[]).await.unwrap().is_empty(),
        "batch_get of no keys"
    );
}

async fn range_by_prefix_and_key_range(kv: KvBackendRef, ns: Ns) {
    let kv = kv.as_ref();
    for k in ["a", "ab", "abc", "b", "ba", "c"] {
        put(kv, ns.kv(k, k.to_uppercase())).await;
    }
    let r = kv.range(RangeRequest::prefix(ns.k("a"))).await.unwrap();
    assert_eq!(
        keys(&r.kvs),
        vec![ns.k("a"), ns.k("ab"), ns.k("abc")],
        "prefix 'a'"
    );
    assert_eq!(r.kvs[1].value, b"AB".to_vec(), "values come with keys");
    assert!(!r.more);
    let r = kv
        .range(RangeRequest::range(ns.k("ab"), ns.k("ba")))
        .await
        .unwrap();
    assert_eq!(
        keys(&r.kvs),
        vec![ns.k("ab"), ns.k("abc"), ns.k("b")],
        "[ab, ba) excludes its end"
    );
    let r = kv
        .range(RangeRequest::range(ns.k("b"), Vec::new()))
        .await
        .unwrap();
    assert_eq!(
        r.kvs,
        vec![ns.kv("b", "B")],
        "an empty range_end reads the single key"
    );
    let r = kv
        .range(RangeRequest::range(ns.k("bb"), Vec::new()))
        .await
        .unwrap();
    assert!(r.kvs.is_empty(), "a single missing key");
    let r = kv
        .range(RangeRequest::range(ns.k("c"), ns.k("a")))
        .await
        .unwrap();
    assert!(
        r.kvs.is_empty() && !r.more,
        "an end before the start is an empty range"
    );
    let r = kv
        .range(RangeRequest::range(ns.k("b"), ns.k("b")))
        .await
        .unwrap();
    assert!(
        r.kvs.is_empty(),
        "an end equal to the start is an empty range"
    );
    // `[0]` means every key from `key` on; the namespace is contiguous, so its own keys come first.
    let r = kv
        .range(RangeRequest::range(ns.k("ab"), vec![0]).with_limit(4))
        .await
        .unwrap();
    assert_eq!(
        keys(&r.kvs),
        vec![ns.k("ab"), ns.k("abc"), ns.k("b"), ns.k("ba")],
        "range_end [0] reads on to the end"
    );
    assert!(r.more, "'c' remains after the limit");
    let r = kv.range(RangeRequest::prefix(ns.k("x"))).await.unwrap();
    assert!(r.kvs.is_empty() && !r.more, "a prefix with no keys");
}

async fn range_limit_and_pagination(kv: KvBackendRef, ns: Ns) {
    let kv = kv.as_ref();
    let all: Vec<KeyValue> = (0..10)
        .map(|i| ns.kv(format!("p/{i:02}"), format!("v{i}")))
        .collect();
    kv.batch_put(all.clone(), false).await.unwrap();
    put(kv, ns.kv("q", "outside")).await;
    let prefix = || RangeRequest::prefix(ns.k("p/"));

    let r = kv.range(prefix()).await.unwrap();
    assert_eq!(
        (r.kvs.clone(), r.more),
        (all.clone(), false),
        "limit 0 reads everything"
    );
    let r = kv.range(prefix().with_limit(10)).await.unwrap();
    assert_eq!(
        (r.kvs.clone(), r.more),
        (all.clone(), false),
        "limit = count: no more"
    );
    let r = kv.range(prefix().with_limit(11)).await.unwrap();
    assert_eq!(
        (r.kvs.clone(), r.more),
        (all.clone(), false),
        "limit > count: no more"
    );
    let r = kv.range(prefix().with_limit(9)).await.unwrap();
    assert_eq!(
        (r.kvs.clone(), r.more),
        (all[..9].to_vec(), true),
        "limit = count - 1: more"
    );

    // Page by 4 resuming from the last key + \0: 4, 4, 2.
    let mut req = prefix().with_limit(4);
    let mut pages = Vec::new();
    loop {
        let r = kv.range(req.clone()).await.unwrap();
        pages.push(r.kvs.clone());
        if !r.more {
            break;
        }
        let mut next = r
            .kvs
            .last()
            .expect("a page with more is not empty")
            .key
            .clone();
        next.push(0);
        req.key = next;
    }
    assert_eq!(
        pages.iter().map(Vec::len).collect::<Vec<_>>(),
        vec![4, 4, 2],
        "page sizes"
    );
    assert_eq!(pages.concat(), all, "pages join up to the whole range");

    // Pages by 5: the last page is exactly full and says no more.
    let r1 = kv.range(prefix().with_limit(5)).await.unwrap();
    assert!(r1.more);
    let mut next = r1.kvs[4].key.clone();
    next.push(0);
    let r2 = kv
        .range(RangeRequest::range(next, prefix_end(&ns.k("p/"))).with_limit(5))
        .await
        .unwrap();
    assert_eq!(
        (r2.kvs, r2.more),
        (all[5..].to_vec(), false),
        "an exactly full last page"
    );

    for page in [0, 1, 3, 10, 100] {
        assert_eq!(
            range_all(kv, prefix(), page).await.unwrap(),
            all,
            "range_all by {page}"
        );
    }
    assert_eq!(
        range_all(kv, prefix().with_limit(7), 3).await.unwrap(),
        all[..7].to_vec(),
        "range_all stops at the request's limit"
    );
}

async fn range_keys_only(kv: KvBackendRef, ns: Ns) {
    let kv = kv.as_ref();
    for i in 0..5 {
        put(kv, ns.kv(format!("k{i}"), "value")).await;
    }
    let r = kv
        .range(
            RangeRequest::prefix(ns.k("k"))
                .with_keys_only()
                .with_limit(3),
        )
        .await
        .unwrap();
    assert_eq!(keys(&r.kvs), vec![ns.k("k0"), ns.k("k1"), ns.k("k2")]);
    assert!(
        r.kvs.iter().all(|kv| kv.value.is_empty()),
        "keys_only empties the values"
    );
    assert!(r.more);
}

async fn empty_prefix_is_every_key(kv: KvBackendRef, ns: Ns) {
    let kv = kv.as_ref();
    let ours: Vec<KeyValue> = ["m", "\u{7f}", "a/b"]
        .iter()
        .map(|k| ns.kv(k, *k))
        .collect();
    for pair in &ours {
        put(kv, pair.clone()).await;
    }
    let every = range_all(kv, RangeRequest::prefix(Vec::new()), 100)
        .await
        .unwrap();
    let mut sorted = ours.clone();
    sorted.sort();
    if ns.0.is_empty() {
        assert_eq!(every, sorted, "the empty prefix reads every key, in order");
    } else {
        assert!(
            every.windows(2).all(|w| w[0].key < w[1].key),
            "every key, in key order"
        );
        let mine: Vec<KeyValue> = every
            .into_iter()
            .filter(|kv| kv.key.starts_with(&ns.0))
            .collect();
        assert_eq!(
            mine, sorted,
            "the empty prefix reads every key of the namespace too"
        );
    }
    assert_eq!(prefix_end(&[]), vec![0]);
    assert_eq!(prefix_end(&[b'a', 0xff]), vec![b'b']);
    assert_eq!(prefix_end(&[0xff, 0xff]), vec![0]);
}

async fn binary_keys_and_values(kv: KvBackendRef, ns: Ns) {
    let kv = kv.as_ref();
    let pairs = vec![
        ns.kv([0x00], [0xff, 0x00, 0xff]),
        ns.kv([0x00, 0x00], b""),
        ns.kv([b'a', 0x00], [0x00]),
        ns.kv([b'a'], [0xfe]),
        ns.kv([0xff], [0x01]),
        ns.kv([0xff, 0x00], (0..=255).collect::<Vec<u8>>()),
        ns.kv([0xff, 0xff], [0xff; 3]),
        ns.kv([0xff, 0xff, 0xff], [0x00; 3]),
    ];
    for pair in pairs.iter().rev() {
        put(kv, pair.clone()).await;
    }
    let mut sorted = pairs.clone();
    sorted.sort();
    assert_eq!(
        ns.dump(kv).await,
        sorted,
        "binary keys sort bytewise, values round-trip"
    );
    assert_eq!(
        kv.get(&ns.k([0x00, 0x00])).await.unwrap(),
        Some(ns.kv([0x00, 0x00], b"")),
        "an empty value is present, not absent"
    );
    let r = kv
        .range(RangeRequest::prefix(ns.k([0xff, 0xff])))
        .await
        .unwrap();
    assert_eq!(
        keys(&r.kvs),
        vec![ns.k([0xff, 0xff]), ns.k([0xff, 0xff, 0xff])],
        "prefix ending in 0xff"
    );
    let r = kv.range(RangeRequest::prefix(ns.k([0x00]))).await.unwrap();
    assert_eq!(
        keys(&r.kvs),
        vec![ns.k([0x00]), ns.k([0x00, 0x00])],
        "prefix 0x00"
    );
    let r = kv
        .range(RangeRequest::range(ns.k([b'a']), ns.k([b'a', 0x00])))
        .await
        .unwrap();
    assert_eq!(
        keys(&r.kvs),
        vec![ns.k([b'a'])],
        "key + \\0 is the next possible key"
    );
}

async fn put_returns_prev_kv_when_asked(kv: KvBackendRef, ns: Ns) {
    let kv = kv.as_ref();
    let req = |v: &str, prev_kv| PutRequest {
        key: ns.k("k"),
        value: v.into(),
        prev_kv,
    };
    assert_eq!(
        kv.put(req("1", true)).await.unwrap(),
        None,
        "no previous pair"
    );
    assert_eq!(
        kv.put(req("2", true)).await.unwrap(),
        Some(ns.kv("k", "1")),
        "previous pair"
    );
    assert_eq!(
        kv.put(req("3", false)).await.unwrap(),
        None,
        "prev_kv not asked"
    );
    assert_eq!(kv.get(&ns.k("k")).await.unwrap(), Some(ns.kv("k", "3")));
}

async fn batch_put_large_and_duplicates(kv: KvBackendRef, ns: Ns) {
    let kv = kv.as_ref();
    let all: Vec<KeyValue> = (0..300)
        .map(|i| ns.kv(format!("b/{i:03}"), format!("v{i}")))
        .collect();
    assert!(
        kv.batch_put(all.clone(), true).await.unwrap().is_empty(),
        "no previous pairs"
    );
    assert_eq!(
        ns.dump(kv).await,
        all,
        "300 puts (more than etcd's 128 ops per txn)"
    );

    let again: Vec<KeyValue> = (150..450)
        .map(|i| ns.kv(format!("b/{i:03}"), format!("w{i}")))
        .collect();
    let prevs = kv.batch_put(again, true).await.unwrap();
    assert_eq!(
        prevs,
        all[150..].to_vec(),
        "previous pairs of the overwritten keys, in the order given"
    );
    assert!(
        kv.batch_put(Vec::new(), true).await.unwrap().is_empty(),
        "an empty batch"
    );

    let dup = vec![ns.kv("d", "first"), ns.kv("e", "x"), ns.kv("d", "last")];
    kv.batch_put(dup, false).await.unwrap();
    assert_eq!(
        kv.get(&ns.k("d")).await.unwrap(),
        Some(ns.kv("d", "last")),
        "the last put of a key wins"
    );
}

async fn batch_get_and_delete_large(kv: KvBackendRef, ns: Ns) {
    let kv = kv.as_ref();
    let all: Vec<KeyValue> = (0..260)
        .map(|i| ns.kv(format!("g/{i:03}"), format!("v{i}")))
        .collect();
    kv.batch_put(all.clone(), false).await.unwrap();
    let mut asked: Vec<Vec<u8>> = keys(&all).into_iter().rev().collect();
    asked.insert(100, ns.k("g/missing"));
    let got = kv.batch_get(&asked).await.unwrap();
    let mut expected = all.clone();
    expected.reverse();
    assert_eq!(got, expected, "260 gets, found ones in the order asked");

    let doomed: Vec<Vec<u8>> = keys(&all).into_iter().step_by(2).collect();
    let deleted = kv.batch_delete(&doomed, true).await.unwrap();
    assert_eq!(
        deleted,
        all.iter().step_by(2).cloned().collect::<Vec<_>>(),
        "130 deletes with prev_kv"
    );
    assert_eq!(
        ns.dump(kv).await,
        all.iter().skip(1).step_by(2).cloned().collect::<Vec<_>>(),
        "the other half remains"
    );
}

async fn compare_and_put_absent_exact_mismatch(kv: KvBackendRef, ns: Ns) {
    let kv = kv.as_ref();
    let cas = |expect: Option<&str>, value: &str| CompareAndPutRequest {
        key: ns.k("c"),
        expect: expect.map(Into::into),
        value: value.into(),
    };
    let r = kv.compare_and_put(cas(None, "1")).await.unwrap();
    assert!(
        r.success && r.prev_kv.is_none(),
        "expect absent on an absent key: {r:?}"
    );
    let r = kv.compare_and_put(cas(None, "x")).await.unwrap();
    assert!(!r.success, "expect absent on a present key");
    assert_eq!(
        r.prev_kv,
        Some(ns.kv("c", "1")),
        "a failed CAS reports the current pair"
    );
    let r = kv.compare_and_put(cas(Some("1"), "2")).await.unwrap();
    assert!(r.success, "expect the exact value");
    assert_eq!(r.prev_kv, Some(ns.kv("c", "1")));
    let r = kv.compare_and_put(cas(Some("1"), "3")).await.unwrap();
    assert!(!r.success, "expect a stale value");
    assert_eq!(r.prev_kv, Some(ns.kv("c", "2")));
    let r = kv.compare_and_put(cas(Some(""), "3")).await.unwrap();
    assert!(!r.success, "expect the empty value on a non-empty one");
    let r = kv
        .compare_and_put(CompareAndPutRequest {
            key: ns.k("other"),
            expect: Some("1".into()),
            value: "x".into(),
        })
        .await
        .unwrap();
    assert!(
        !r.success && r.prev_kv.is_none(),
        "expect a value on an absent key"
    );
    assert_eq!(
        kv.get(&ns.k("other")).await.unwrap(),
        None,
        "a failed CAS writes nothing"
    );
    assert_eq!(kv.get(&ns.k("c")).await.unwrap(), Some(ns.kv("c", "2")));
}

async fn compare_and_put_race_has_one_winner_per_round(kv: KvBackendRef, ns: Ns) {
    const TASKS: usize = 16;
    const ROUNDS: usize = 10;
    let key = ns.k("race");
    put(
        kv.as_ref(),
        KeyValue {
            key: key.clone(),
            value: b"round-0".to_vec(),
        },
    )
    .await;
    let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
    let wins: Arc<Vec<AtomicUsize>> = Arc::new((0..ROUNDS).map(|_| AtomicUsize::new(0)).collect());
    let mut handles = Vec::new();
    for task in 0..TASKS {
        let (kv, key, barrier, wins) = (kv.clone(), key.clone(), barrier.clone(), wins.clone());
        handles.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                barrier.wait().await;
                let r = kv
                    .compare_and_put(CompareAndPutRequest {
                        key: key.clone(),
                        expect: Some(format!("round-{round}").into_bytes()),
                        value: format!("round-{}", round + 1).into_bytes(),
                    })
                    .await
                    .expect("compare_and_put");
                if r.success {
                    wins[round].fetch_add(1, Ordering::SeqCst);
                } else {
                    let seen = r.prev_kv.expect("the key exists").value;
                    assert_eq!(
                        seen,
                        format!("round-{}", round + 1).into_bytes(),
                        "task {task} lost to the winner"
                    );
                }
                barrier.wait().await;
            }
        }));
    }
    for h in handles {
        h.await.expect("race task");
    }
    let per_round: Vec<usize> = wins.iter().map(|w| w.load(Ordering::SeqCst)).collect();
    assert_eq!(per_round, vec![1; ROUNDS], "exactly one winner per round");
    assert_eq!(
        kv.get(&key).await.unwrap().map(|kv| kv.value),
        Some(format!("round-{ROUNDS}").into_bytes())
    );
}

async fn delete_range_and_batch_delete(kv: KvBackendRef, ns: Ns) {
    let kv = kv.as_ref();
    for k in ["a", "b1", "b2", "b3", "c", "d"] {
        put(kv, ns.kv(k, k)).await;
    }
    let (n, prev) = kv
        .delete_range(&ns.k("b"), &prefix_end(&ns.k("b")), true)
        .await
        .unwrap();
    assert_eq!(n, 3, "prefix delete count");
    assert_eq!(
        prev,
        vec![ns.kv("b1", "b1"), ns.kv("b2", "b2"), ns.kv("b3", "b3")],
        "prev_kv in key order"
    );
    let (n, prev) = kv.delete_range(&ns.k("a"), &[], false).await.unwrap();
    assert_eq!((n, prev), (1, vec![]), "single-key delete without prev_kv");
    let (n, _) = kv.delete_range(&ns.k("a"), &[], true).await.unwrap();
    assert_eq!(n, 0, "deleting an absent key");
    let (n, _) = kv.delete_range(&ns.k("d"), &ns.k("c"), true).await.unwrap();
    assert_eq!(n, 0, "an end before the start deletes nothing");
    assert_eq!(ns.dump(kv).await, vec![ns.kv("c", "c"), ns.kv("d", "d")]);

    let deleted = kv
        .batch_delete(&[ns.k("d"), ns.k("zz"), ns.k("c")], true)
        .await
        .unwrap();
    assert_eq!(
        deleted,
        vec![ns.kv("d", "d"), ns.kv("c", "c")],
        "found ones, in the order given"
    );
    assert!(ns.dump(kv).await.is_empty());
    put(kv, ns.kv("e", "e")).await;
    assert!(
        kv.batch_delete(&[ns.k("e")], false)
            .await
            .unwrap()
            .is_empty(),
        "no prev_kv asked"
    );
    assert_eq!(kv.get(&ns.k("e")).await.unwrap(), None);

    if ns.0.is_empty() {
        // Only on a store of our own: `[0]` would reach keys beyond the namespace.
        put(kv, ns.kv("f", "f")).await;
        put(kv, ns.kv("g", "g")).await;
        let (n, _) = kv.delete_range(&ns.k("f"), &[0], false).await.unwrap();
        assert_eq!(n, 2, "range_end [0] deletes on to the end");
        assert!(ns.dump(kv).await.is_empty());
    }
}

async fn txn_compares_and_branches(kv: KvBackendRef, ns: Ns) {
    let kv = kv.as_ref();
    put(kv, ns.kv("x", "1")).await;
    let holding = [
        Compare::ValueEquals(ns.k("x"), b"1".to_vec()),
        Compare::Absent(ns.k("nope")),
        Compare::Present(ns.k("x")),
    ];
    let failing = [
        Compare::ValueEquals(ns.k("x"), b"2".to_vec()),
        Compare::ValueEquals(ns.k("nope"), Vec::new()),
        Compare::Absent(ns.k("x")),
        Compare::Present(ns.k("nope")),
    ];
    for c in holding {
        let r = kv
            .txn(Txn {
                compare: vec![c.clone()],
                success: vec![TxnOp::Get(ns.k("x"))],
                failure: vec![],
            })
            .await
            .unwrap();
        assert!(r.succeeded, "{c:?} holds");
        assert_eq!(r.responses, vec![TxnOpResponse::Get(Some(ns.kv("x", "1")))]);
    }
    for c in failing {
        let r = kv
            .txn(Txn {
                compare: vec![c.clone()],
                success: vec![TxnOp::Put(ns.k("s"), b"s".to_vec())],
                failure: vec![TxnOp::Get(ns.k("x")), TxnOp::Get(ns.k("nope"))],
            })
            .await
            .unwrap();
        assert!(!r.succeeded, "{c:?} fails");
        assert_eq!(
            r.responses,
            vec![
                TxnOpResponse::Get(Some(ns.kv("x", "1"))),
                TxnOpResponse::Get(None)
            ],
            "the failure branch's reads"
        );
    }
    assert_eq!(kv.get(&ns.k("s")).await.unwrap(), None, "no success op ran");

    let r = kv
        .txn(Txn {
            compare: vec![],
            success: vec![
                TxnOp::Put(ns.k("y"), b"2".to_vec()),
                TxnOp::Delete(ns.k("x")),
                TxnOp::Delete(ns.k("nope")),
                TxnOp::Get(ns.k("y")),
            ],
            failure: vec![],
        })
        .await
        .unwrap();
    assert!(r.succeeded, "no compares: success");
    assert_eq!(
        r.responses,
        vec![
            TxnOpResponse::Put,
            TxnOpResponse::Delete(1),
            TxnOpResponse::Delete(0),
            TxnOpResponse::Get(Some(ns.kv("y", "2"))),
        ],
        "one response per op, reads see earlier writes of the branch"
    );
    assert_eq!(ns.dump(kv).await, vec![ns.kv("y", "2")]);

    let r = kv
        .txn(Txn {
            compare: vec![Compare::Present(ns.k("x"))],
            success: vec![],
            failure: vec![TxnOp::Put(ns.k("z"), b"3".to_vec())],
        })
        .await
        .unwrap();
    assert!(!r.succeeded);
    assert_eq!(
        r.responses,
        vec![TxnOpResponse::Put],
        "the failure branch writes too"
    );
    assert_eq!(kv.get(&ns.k("z")).await.unwrap(), Some(ns.kv("z", "3")));
}

async fn txn_is_atomic(kv: KvBackendRef, ns: Ns) {
    let kv = kv.as_ref();
    put(kv, ns.kv("a", "1")).await;
    put(kv, ns.kv("b", "1")).await;
    let success: Vec<TxnOp> = (0..20)
        .map(|i| TxnOp::Put(ns.k(format!("new{i:02}")), b"x".to_vec()))
        .chain([TxnOp::Delete(ns.k("a"))])
        .collect();
    let r = kv
        .txn(Txn {
            compare: vec![
                Compare::ValueEquals(ns.k("a"), b"1".to_vec()),
                Compare::Present(ns.k("b")),
                Compare::ValueEquals(ns.k("b"), b"2".to_vec()),
            ],
            success: success.clone(),
            failure: vec![],
        })
        .await
        .unwrap();
    assert!(
        !r.succeeded && r.responses.is_empty(),
        "the last compare fails"
    );
    assert_eq!(
        ns.dump(kv).await,
        vec![ns.kv("a", "1"), ns.kv("b", "1")],
        "nothing of success applied"
    );

    let r = kv
        .txn(Txn {
            compare: vec![
                Compare::ValueEquals(ns.k("a"), b"1".to_vec()),
                Compare::Present(ns.k("b")),
            ],
            success,
            failure: vec![],
        })
        .await
        .unwrap();
    assert!(r.succeeded && r.responses.len() == 21);
    let expected: BTreeSet<Vec<u8>> = (0..20)
        .map(|i| ns.k(format!("new{i:02}")))
        .chain([ns.k("b")])
        .collect();
    assert_eq!(
        keys(&ns.dump(kv).await)
            .into_iter()
            .collect::<BTreeSet<_>>(),
        expected,
        "all of success applied"
    );
}

async fn invalid_and_oversized_requests_apply_nothing(kv: KvBackendRef, ns: Ns) {
    let kv = kv.as_ref();
    let err = kv
        .put(PutRequest {
            key: Vec::new(),
            value: b"v".to_vec(),
            prev_kv: false,
        })
        .await
        .expect_err("an empty key is refused");
    assert!(matches!(err, Error::KvInvalidRequest { .. }), "{err}");

    let err = kv
        .txn(Txn {
            compare: vec![],
            success: vec![
                TxnOp::Put(ns.k("first"), b"1".to_vec()),
                TxnOp::Put(ns.k("twice"), b"1".to_vec()),
                TxnOp::Delete(ns.k("twice")),
            ],
            failure: vec![],
        })
        .await
        .expect_err("a key written twice in a branch is refused");
    assert!(matches!(err, Error::KvInvalidRequest { .. }), "{err}");
    assert!(
        err.to_string().contains("twice"),
        "the error names the key: {err}"
    );
    assert!(
        ns.dump(kv).await.is_empty(),
        "a refused txn applies nothing"
    );

    let max = kv.max_txn_ops();
    if max < 100_000 {
        let success: Vec<TxnOp> = (0..max)
            .map(|i| TxnOp::Put(ns.k(format!("t{i:05}")), vec![1]))
            .collect();
        let err = kv
            .txn(Txn {
                compare: vec![Compare::Absent(ns.k("t"))],
                success,
                failure: vec![],
            })
            .await
            .expect_err("a txn over the op limit is refused");
        assert!(matches!(err, Error::KvLimit { .. }), "{err}");
        assert!(
            err.to_string().contains(&max.to_string()),
            "the error names the limit: {err}"
        );
        assert!(
            ns.dump(kv).await.is_empty(),
            "a refused txn applies nothing"
        );
        let success: Vec<TxnOp> = (0..max - 1)
            .map(|i| TxnOp::Put(ns.k(format!("t{i:05}")), vec![1]))
            .collect();
        let r = kv
            .txn(Txn {
                compare: vec![Compare::Absent(ns.k("t"))],
                success,
                failure: vec![],
            })
            .await
            .expect("a txn at the op limit runs");
        assert!(r.succeeded);
        assert_eq!(ns.dump(kv).await.len(), max - 1);
    }
}

async fn large_values_split_by_bytes(kv: KvBackendRef, ns: Ns) {
    let kv = kv.as_ref();
    let max = kv.max_request_bytes();
    if max > 64 << 20 {
        // Unbounded stores: a few large values still round-trip.
        let big = ns.kv("big", vec![7u8; 3 << 20]);
        put(kv, big.clone()).await;
        assert_eq!(kv.get(&big.key).await.unwrap(), Some(big));
        return;
    }
    let value = vec![0xabu8; max / 3];
    let all: Vec<KeyValue> = (0..5).map(|i| ns.kv(format!("v{i}"), &value)).collect();
    kv.batch_put(all.clone(), false)
        .await
        .expect("a batch over the byte limit is split");
    assert_eq!(ns.dump(kv).await, all, "every value of the split batch");

    let too_big = ns.kv("huge", vec![1u8; max + 1]);
    let err = kv
        .put(PutRequest {
            key: too_big.key.clone(),
            value: too_big.value.clone(),
            prev_kv: false,
        })
        .await
        .expect_err("a value over the byte limit is refused");
    assert!(matches!(err, Error::KvLimit { .. }), "{err}");
    assert!(
        err.to_string().contains("huge"),
        "the error names the key: {err}"
    );
    let err = kv
        .batch_put(vec![ns.kv("fine", "1"), too_big], false)
        .await
        .expect_err("a batch holding a value over the byte limit is refused");
    assert!(matches!(err, Error::KvLimit { .. }), "{err}");
    assert_eq!(
        kv.get(&ns.k("fine")).await.unwrap(),
        None,
        "nothing of the refused batch applied"
    );
}

#[cfg(test)]
mod isolation_tests {
    use futures::FutureExt;

    use super::*;
    use crate::kv::MemoryKvBackend;

    async fn keys_under(kv: &KvBackendRef, prefix: &[u8]) -> usize {
        range_all(kv.as_ref(), RangeRequest::prefix(prefix.to_vec()), 0)
            .await
            .unwrap()
            .len()
    }

    #[tokio::test]
    async fn a_failing_case_still_deletes_its_namespace_and_only_it() {
        let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
        kv.put(PutRequest {
            key: b"other/k".to_vec(),
            value: b"v".to_vec(),
            prev_kv: false,
        })
        .await
        .unwrap();
        let ns = b"case/0/".to_vec();
        let writer = kv.clone();
        let case = async move {
            writer
                .put(PutRequest {
                    key: b"case/0/a".to_vec(),
                    value: b"1".to_vec(),
                    prev_kv: false,
                })
                .await
                .unwrap();
            panic!("the case fails after writing");
        };
        let outcome = std::panic::AssertUnwindSafe(isolated(kv.clone(), ns.clone(), case))
            .catch_unwind()
            .await;
        assert!(outcome.is_err(), "the case's panic is resumed");
        assert_eq!(keys_under(&kv, &ns).await, 0, "the namespace is empty");
        assert_eq!(keys_under(&kv, b"other/").await, 1, "other keys are kept");
    }
}
