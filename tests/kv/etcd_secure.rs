//! The etcd backend over the secure etcd the test command starts (TLS, client certificates required, auth enabled
//! with users root and walctl; `ETCD_SECURE_*`): the conformance suite passes, an expired auth token is refreshed,
//! and each refusal (a wrong password, an unknown user, an untrusted server certificate, no client certificate,
//! TLS against a plaintext etcd) is one error naming the endpoint and the cause, in bounded time; the refused
//! credentials and the untrusted certificate are not retryable.

use std::sync::Arc;
use std::time::Duration;

use remote_wal::kv::Error;
use remote_wal::kv::conformance::{SecureEtcd, run_all, unique_prefix};
use remote_wal::kv::etcd::EtcdSecurity;
use remote_wal::kv::etcd::security::EtcdTlsConfig;
use remote_wal::kv::{EtcdConfig, EtcdKvBackend, KvBackend, KvBackendRef, PutRequest};

/// Guards against a hang: the call under test must end on its own configured timeout, well before this one.
async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("the call ended on its own timeout")
}

/// The secure etcd's configuration with `security`, short timeouts.
fn config(etcd: &SecureEtcd, security: EtcdSecurity) -> EtcdConfig {
    EtcdConfig {
        connect_timeout: Duration::from_secs(3),
        request_timeout: Duration::from_secs(3),
        security,
        ..EtcdConfig::new(etcd.endpoints.clone())
    }
}

/// Connecting with `config` fails: the error names the endpoint, says `cause` and is not retryable.
async fn refused(config: EtcdConfig, cause: &str) -> Error {
    let err = failed(config, cause).await;
    assert!(!err.is_retryable(), "not retryable: {err}");
    err
}

/// Connecting with `config` fails: the error names the endpoint and says `cause`.
async fn failed(config: EtcdConfig, cause: &str) -> Error {
    let endpoint = config.endpoints[0].clone();
    let err = bounded(EtcdKvBackend::connect(config))
        .await
        .expect_err("connecting must be refused");
    let shown = err.to_string();
    assert!(shown.contains(&endpoint), "names the endpoint: {shown}");
    assert!(
        shown.to_lowercase().contains(&cause.to_lowercase()),
        "says {cause:?}: {shown}"
    );
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_secure_etcd_conforms() {
    let etcd = SecureEtcd::from_env();
    let kv: KvBackendRef = Arc::new(
        bounded(EtcdKvBackend::connect(etcd.config()))
            .await
            .unwrap_or_else(|e| panic!("the secure etcd at {:?}: {e}", etcd.endpoints)),
    );
    let run = unique_prefix("secure-conformance");
    let n = std::sync::atomic::AtomicUsize::new(0);
    run_all(|| {
        let kv = kv.clone();
        let ns = [
            run.clone(),
            format!("{}/", n.fetch_add(1, std::sync::atomic::Ordering::SeqCst)).into_bytes(),
        ]
        .concat();
        async move { (kv, ns) }
    })
    .await;
    kv.delete_range(&run, &remote_wal::kv::prefix_end(&run), false)
        .await
        .unwrap();
}

#[tokio::test]
async fn an_expired_auth_token_is_refreshed() {
    let etcd = SecureEtcd::from_env();
    let kv = bounded(EtcdKvBackend::connect(etcd.config()))
        .await
        .unwrap();
    let key = [unique_prefix("token"), b"k".to_vec()].concat();
    kv.put(PutRequest {
        key: key.clone(),
        value: b"before".to_vec(),
        prev_kv: false,
    })
    .await
    .unwrap();
    // A plain client with the same user and no refresh, to prove the token did expire meanwhile.
    let password = std::fs::read_to_string(&etcd.password_file).unwrap();
    let tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(
            std::fs::read(etcd.certs.join("ca.pem")).unwrap(),
        ))
        .identity(etcd_client::Identity::from_pem(
            std::fs::read(etcd.certs.join("client.pem")).unwrap(),
            std::fs::read(etcd.certs.join("client.key")).unwrap(),
        ));
    let mut plain = etcd_client::Client::connect(
        &etcd.endpoints,
        Some(
            etcd_client::ConnectOptions::new()
                .with_tls(tls)
                .with_user("walctl", password.trim_end()),
        ),
    )
    .await
    .unwrap();
    // The secure etcd's tokens expire after 5 idle seconds (`--auth-token-ttl 5`).
    tokio::time::sleep(Duration::from_secs(7)).await;
    let stale = plain
        .get(key.clone(), None)
        .await
        .expect_err("the token expired");
    assert!(stale.to_string().contains("invalid auth token"), "{stale}");
    let value = bounded(kv.get(&key)).await.unwrap().map(|kv| kv.value);
    assert_eq!(value.as_deref(), Some(&b"before"[..]));
    kv.delete_range(&key, &[], false).await.unwrap();
}

#[tokio::test]
async fn a_write_the_user_may_not_make_is_refused_naming_the_key_not_retryable() {
    let etcd = SecureEtcd::from_env();
    // The secure etcd's `reader` user may read every key and write none; its password lies beside walctl's.
    let password_file = etcd.password_file.with_file_name("reader.password");
    let security = EtcdSecurity {
        username: Some("reader".to_string()),
        password_file: Some(password_file),
        ..etcd.security()
    };
    let kv = bounded(EtcdKvBackend::connect(config(&etcd, security)))
        .await
        .unwrap();
    let key = [unique_prefix("denied"), b"k".to_vec()].concat();
    assert_eq!(
        bounded(kv.get(&key)).await.unwrap(),
        None,
        "reading is allowed"
    );
    let err = bounded(kv.put(PutRequest {
        key: key.clone(),
        value: b"v".to_vec(),
        prev_kv: false,
    }))
    .await
    .expect_err("writing is not");
    let shown = err.to_string();
    assert!(
        shown.contains(&etcd.endpoints[0]),
        "names the endpoint: {shown}"
    );
    assert!(shown.contains("permission denied"), "says why: {shown}");
    assert!(
        shown.contains(&String::from_utf8_lossy(&key).to_string()),
        "names the key: {shown}"
    );
    assert!(!err.is_retryable(), "not retryable: {shown}");
}

#[tokio::test]
async fn a_wrong_password_is_refused_naming_the_endpoint() {
    let etcd = SecureEtcd::from_env();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("password");
    std::fs::write(&file, "not-the-password\n").unwrap();
    let security = EtcdSecurity {
        password_file: Some(file),
        ..etcd.security()
    };
    let err = refused(config(&etcd, security), "authentication failed").await;
    assert!(!err.to_string().contains("not-the-password"), "{err}");
}

#[tokio::test]
async fn an_unknown_user_is_refused_naming_the_endpoint() {
    let etcd = SecureEtcd::from_env();
    let security = EtcdSecurity {
        username: Some("nobody".to_string()),
        ..etcd.security()
    };
    refused(config(&etcd, security), "authentication failed").await;
}

#[tokio::test]
async fn an_untrusted_server_certificate_is_refused_naming_the_endpoint() {
    let etcd = SecureEtcd::from_env();
    let security = EtcdSecurity {
        tls: Some(EtcdTlsConfig {
            ca: etcd.certs.join("other-ca.pem"),
            ..etcd.tls()
        }),
        ..etcd.security()
    };
    refused(config(&etcd, security), "certificate").await;
}

#[tokio::test]
async fn no_client_certificate_is_refused_naming_the_endpoint() {
    let etcd = SecureEtcd::from_env();
    let security = EtcdSecurity {
        tls: Some(EtcdTlsConfig {
            cert: None,
            key: None,
            ..etcd.tls()
        }),
        ..etcd.security()
    };
    // TLS 1.3: the server checks the client certificate after the client finished its side of the handshake, so
    // the refusal arrives as the server's alert, or as the connection closed or reset when the alert is lost to the
    // race; either way the error names the client certificate.
    failed(config(&etcd, security), "client certificate").await;
}

#[tokio::test]
async fn tls_against_a_plaintext_etcd_is_refused_naming_the_endpoint() {
    let etcd = SecureEtcd::from_env();
    let plain = std::env::var("ETCD_ENDPOINTS").unwrap_or_default();
    let plain = plain
        .split(',')
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    assert!(
        !plain.is_empty(),
        "ETCD_ENDPOINTS is not set: this test needs the plaintext etcd too"
    );
    let config = EtcdConfig {
        connect_timeout: Duration::from_secs(3),
        request_timeout: Duration::from_secs(3),
        security: etcd.security(),
        ..EtcdConfig::new([plain])
    };
    // The plaintext etcd closes or resets the connection on the TLS hello.
    failed(config, "serve TLS on this port").await;
}

#[tokio::test]
async fn a_plaintext_client_against_the_secure_etcd_fails_naming_the_endpoint() {
    let etcd = SecureEtcd::from_env();
    // The TLS-only etcd closes the connection on the plaintext HTTP/2 preface.
    failed(
        config(&etcd, EtcdSecurity::default()),
        "configure metadata_store.tls",
    )
    .await;
}

/// Each member signs in before its first call, not when its client is built: a member that is down when connecting
/// does not stop the others from being used.
#[tokio::test]
async fn a_member_down_at_start_does_not_stop_signing_in_to_the_others() {
    let etcd = SecureEtcd::from_env();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = listener.local_addr().unwrap().to_string();
    drop(listener);
    let config = EtcdConfig {
        endpoints: vec![closed, etcd.endpoints[0].clone()],
        ..config(&etcd, etcd.security())
    };
    let kv = bounded(EtcdKvBackend::connect(config)).await.unwrap();
    let key = [unique_prefix("down-at-start"), b"k".to_vec()].concat();
    bounded(kv.put(PutRequest {
        key: key.clone(),
        value: b"v".to_vec(),
        prev_kv: false,
    }))
    .await
    .unwrap();
    let value = bounded(kv.get(&key)).await.unwrap().map(|kv| kv.value);
    assert_eq!(value.as_deref(), Some(&b"v"[..]));
    kv.delete_range(&key, &[], false).await.unwrap();
}
