//! TLS to the PostgreSQL metadata store (`[metadata_store] tls`), against the test command's cluster, which admits
//! the user `walctl_tls` only over TLS with a client certificate (`POSTGRES_TLS_CERTS`; the tests fail when it is
//! unset). The conformance suite over TLS is in `conformance.rs`; here: what is refused, and how it reads.

use std::time::Duration;

use remote_wal::kv::conformance::{postgres_config_from_env, postgres_tls_config_from_env};
use remote_wal::kv::{KvBackend, PostgresKvBackend, PostgresKvConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn password() -> String {
    let path = std::env::var("POSTGRES_PASSWORD_FILE").expect("POSTGRES_PASSWORD_FILE is not set");
    std::fs::read_to_string(path).unwrap().trim().to_string()
}

/// A server certificate signed by an authority the client was not told to trust is refused by the client: the
/// error names the endpoint and the certificate, is not retryable (a retry meets the same certificate), and the
/// password is not in it.
#[tokio::test]
async fn an_untrusted_server_certificate_is_refused_naming_the_endpoint() {
    let config = postgres_tls_config_from_env("tls_untrusted", "other-ca.pem", true).unwrap();
    let err = PostgresKvBackend::connect(config).await.unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with("PostgreSQL at 127.0.0.1:"), "{text}");
    assert!(text.contains("certificate"), "{text}");
    assert!(!err.is_retryable(), "{text}");
    assert!(!text.contains(&password()), "{text}");
}

/// The server asks for a client certificate; without one it refuses the session, and the error says so.
#[tokio::test]
async fn a_session_without_a_client_certificate_is_refused_by_the_server() {
    let config = postgres_tls_config_from_env("tls_no_client", "ca.pem", false).unwrap();
    let err = PostgresKvBackend::connect(config).await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("client certificate"), "{text}");
    assert!(!err.is_retryable(), "{text}");
}

/// With the certificate, the same user's calls work: the server admits `walctl_tls` over TLS only, so a plaintext
/// session would have been refused.
#[tokio::test]
async fn with_the_client_certificate_calls_run_over_tls() {
    let config = postgres_tls_config_from_env("tls_ok", "ca.pem", true).unwrap();
    assert!(format!("{config:?}").contains("tls: true"));
    let kv = PostgresKvBackend::connect(config).await.unwrap();
    let key = remote_wal::kv::conformance::unique_prefix("tls");
    kv.put(remote_wal::kv::PutRequest {
        key: key.clone(),
        value: b"v".to_vec(),
        prev_kv: false,
    })
    .await
    .unwrap();
    assert_eq!(
        kv.get(&key).await.unwrap().map(|p| p.value),
        Some(b"v".to_vec())
    );
    // The same user without TLS: the server's rule for it refuses a session that is not encrypted.
    let mut plain = postgres_config_from_env("tls_ok");
    plain.connection.user("walctl_tls");
    let err = PostgresKvBackend::connect(plain)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("no encryption"), "{err}");
}

/// A server that does not offer TLS is refused: the client sends its TLS request, reads the refusal and stops,
/// and nothing else — no startup message naming the user, no password exchange — crosses the connection in
/// plaintext.
#[tokio::test]
async fn a_server_without_tls_is_refused_never_fallen_back_to_plaintext() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = [0u8; 8];
        socket.read_exact(&mut request).await.unwrap();
        // PostgreSQL's SSLRequest: length 8, code 80877103.
        assert_eq!(request, [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]);
        socket.write_all(b"N").await.unwrap();
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), socket.read_to_end(&mut rest)).await;
        rest
    });
    let mut config = postgres_tls_config_from_env("tls_refused", "ca.pem", true).unwrap();
    config.connection = format!("postgres://walctl_tls@127.0.0.1:{port}/remote_wal")
        .parse()
        .unwrap();
    config = config
        .with_tls(
            &std::path::PathBuf::from(std::env::var("POSTGRES_TLS_CERTS").unwrap()).join("ca.pem"),
            None,
        )
        .unwrap();
    let err = PostgresKvBackend::connect(config)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("PostgreSQL at 127.0.0.1:{port}")),
        "{err}"
    );
    assert!(err.contains("TLS"), "{err}");
    let after_refusal = server.await.unwrap();
    assert!(
        after_refusal.is_empty(),
        "{} bytes sent in plaintext after the server refused TLS",
        after_refusal.len()
    );
}

/// `sslmode=require` with no authority, or `sslmode=disable` with one, is a mistake in the settings: refused
/// before any connection, naming `metadata_store.url`.
#[tokio::test]
async fn contradicting_sslmode_settings_are_refused_naming_the_url() {
    let url = "postgres://walctl@127.0.0.1:1/remote_wal";
    let require = PostgresKvConfig::from_url(&format!("{url}?sslmode=require"), None).unwrap();
    let err = PostgresKvBackend::connect(require)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("metadata_store.url") && err.contains("sslmode=require"),
        "{err}"
    );
    let certs = std::path::PathBuf::from(std::env::var("POSTGRES_TLS_CERTS").unwrap_or_default());
    let disable = PostgresKvConfig::from_url(&format!("{url}?sslmode=disable"), None).unwrap();
    let err = disable
        .with_tls(&certs.join("ca.pem"), None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("metadata_store.url") && err.contains("sslmode=disable"),
        "{err}"
    );
}

/// A key file that holds no key is named, and no line of it is quoted.
#[tokio::test]
async fn a_bad_key_file_is_named_and_not_quoted() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("client.key");
    std::fs::write(&key, "secret-line-4711\n").unwrap();
    let certs = std::path::PathBuf::from(std::env::var("POSTGRES_TLS_CERTS").unwrap_or_default());
    let config =
        PostgresKvConfig::from_url("postgres://walctl@127.0.0.1:1/remote_wal", None).unwrap();
    let err = config
        .with_tls(
            &certs.join("ca.pem"),
            Some((certs.join("client.pem").as_path(), key.as_path())),
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("metadata_store.tls.key") && err.contains("client.key"),
        "{err}"
    );
    assert!(!err.contains("secret-line-4711"), "{err}");
}
