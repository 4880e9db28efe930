//! `[wal.security]`: TLS and SASL for every Kafka connection, and the client settings loaded from it.
//!
//! ```toml
//! [wal.security]
//! tls = { ca = "certs/ca.pem", cert = "certs/client.pem", key = "certs/client.key" }  # cert/key optional
//! sasl = { mechanism = "SCRAM-SHA-512", username = "walctl", password_file = "secrets/kafka-password" }
//! ```
//!
//! [`KafkaSecurityConfig`] holds only file names: the config can be printed, compared and stored without a secret
//! in it. [`KafkaSecurityConfig::load`] reads the files into a [`ClientSecurity`] (a rustls client config trusting
//! exactly the given authority, and the SASL credentials), which both Kafka clients use: rskafka
//! ([`ClientSecurity::apply`]) and the batch admin's own connections (`connection.rs`). The password lives in a
//! [`Password`], whose `Debug` prints `<redacted>` and which has no `Display`; errors about the password file name
//! the file, never its contents.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rskafka::client::{ClientBuilder, Credentials, SaslConfig as RsSaslConfig};
use serde::{Deserialize, Serialize};
use snafu::ensure;

use crate::wal::error::InvalidWalConfigSnafu;
use crate::wal::error::Result;

/// `[wal.security]`: how Kafka connections are protected. Both parts are optional; with neither, connections are
/// plaintext and unauthenticated (Kafka's `PLAINTEXT`); `tls` alone is `SSL`, `sasl` alone `SASL_PLAINTEXT`, both
/// `SASL_SSL`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaSecurityConfig {
    /// TLS to the brokers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsFiles>,
    /// SASL authentication after connecting (and after the TLS handshake, with `tls`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sasl: Option<SaslSettings>,
}

/// `[wal.security] tls`: PEM files.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// The certificate authorities (PEM, one or more certificates) the brokers' certificates must chain to. Only
    /// these are trusted; the system's roots are not.
    pub ca: PathBuf,
    /// This client's certificate chain (PEM), for brokers that ask for one (`ssl.client.auth`); with `key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    /// The private key (PEM: PKCS#8, PKCS#1 or SEC1) of `cert`; with `cert`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
}

/// A SASL mechanism, spelled as Kafka's `sasl.mechanism`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SaslMechanism {
    /// `PLAIN` (RFC 4616): the password travels to the broker; use it only with `tls`.
    #[serde(rename = "PLAIN")]
    Plain,
    /// `SCRAM-SHA-256` (RFC 5802, RFC 7677): the password never travels.
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    /// `SCRAM-SHA-512`: as SCRAM-SHA-256 with SHA-512.
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
}

impl SaslMechanism {
    /// The mechanism's name as Kafka spells it.
    pub fn name(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

impl fmt::Display for SaslMechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `[wal.security] sasl`: the mechanism, the user, and the file holding the password.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SaslSettings {
    /// The mechanism; the broker must offer it (`sasl.enabled.mechanisms`).
    pub mechanism: SaslMechanism,
    /// The user name.
    pub username: String,
    /// A file whose contents are the password; one trailing newline (`\n` or `\r\n`) is not part of it.
    pub password_file: PathBuf,
}

/// A password read from its file. `Debug` prints `<redacted>`; there is no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl Password {
    /// The password, for the code that hands it to a SASL client.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Password(<redacted>)")
    }
}

/// SASL credentials loaded from [`SaslSettings`].
#[derive(Clone, Debug)]
pub struct SaslCredentials {
    /// The mechanism.
    pub mechanism: SaslMechanism,
    /// The user name.
    pub username: String,
    /// The password (redacted in `Debug`).
    pub password: Password,
}

/// What a Kafka client needs to connect as `[wal.security]` says: loaded once, shared by every connection.
#[derive(Clone, Default)]
pub struct ClientSecurity {
    /// The TLS client config (trusting only `tls.ca`), when TLS is on.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// The SASL credentials, when SASL is on.
    pub sasl: Option<SaslCredentials>,
}

impl fmt::Debug for ClientSecurity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientSecurity")
            .field("tls", &self.tls.is_some())
            .field("sasl", &self.sasl)
            .finish()
    }
}

impl ClientSecurity {
    /// Whether connections are plaintext and unauthenticated.
    pub fn is_plaintext(&self) -> bool {
        self.tls.is_none() && self.sasl.is_none()
    }

    /// Kafka's name of the protocol these settings speak: `PLAINTEXT`, `SSL`, `SASL_PLAINTEXT` or `SASL_SSL`.
    pub fn protocol_name(&self) -> &'static str {
        match (self.tls.is_some(), self.sasl.is_some()) {
            (false, false) => "PLAINTEXT",
            (true, false) => "SSL",
            (false, true) => "SASL_PLAINTEXT",
            (true, true) => "SASL_SSL",
        }
    }

    /// `builder` with these settings' TLS config and SASL credentials.
    pub fn apply(&self, mut builder: ClientBuilder) -> ClientBuilder {
        if let Some(tls) = &self.tls {
            builder = builder.tls_config(Arc::clone(tls));
        }
        if let Some(sasl) = &self.sasl {
            let credentials =
                Credentials::new(sasl.username.clone(), sasl.password.expose().to_string());
            builder = builder.sasl_config(match sasl.mechanism {
                SaslMechanism::Plain => RsSaslConfig::Plain(credentials),
                SaslMechanism::ScramSha256 => RsSaslConfig::ScramSha256(credentials),
                SaslMechanism::ScramSha512 => RsSaslConfig::ScramSha512(credentials),
            });
        }
        builder
    }
}

impl KafkaSecurityConfig {
    /// Whether nothing is configured (plaintext, unauthenticated).
    pub fn is_empty(&self) -> bool {
        self.tls.is_none() && self.sasl.is_none()
    }

    /// Checks the shape without reading any file: `tls.cert` and `tls.key` together, non-empty names.
    pub fn validate(&self) -> Result<()> {
        if let Some(tls) = &self.tls {
            non_empty_path("security.tls.ca", &tls.ca)?;
            match (&tls.cert, &tls.key) {
                (Some(cert), Some(key)) => {
                    non_empty_path("security.tls.cert", cert)?;
                    non_empty_path("security.tls.key", key)?;
                }
                (None, None) => {}
                (Some(cert), None) => {
                    return InvalidWalConfigSnafu {
                        field: "security.tls.cert",
                        value: cert.display().to_string(),
                        reason: "a client certificate needs its key: set security.tls.key too",
                    }
                    .fail();
                }
                (None, Some(key)) => {
                    return InvalidWalConfigSnafu {
                        field: "security.tls.key",
                        value: key.display().to_string(),
                        reason: "a client key needs its certificate: set security.tls.cert too",
                    }
                    .fail();
                }
            }
        }
        if let Some(sasl) = &self.sasl {
            ensure!(
                !sasl.username.trim().is_empty(),
                InvalidWalConfigSnafu {
                    field: "security.sasl.username",
                    value: format!("{:?}", sasl.username),
                    reason: "must not be empty",
                }
            );
            non_empty_path("security.sasl.password_file", &sasl.password_file)?;
        }
        Ok(())
    }

    /// Reads the files into the settings every connection uses. Errors name the field and the file, never a
    /// file's contents.
    pub fn load(&self) -> Result<ClientSecurity> {
        self.validate()?;
        let tls = self.tls.as_ref().map(load_tls).transpose()?.map(Arc::new);
        let sasl = self
            .sasl
            .as_ref()
            .map(|sasl| {
                Ok::<_, crate::wal::Error>(SaslCredentials {
                    mechanism: sasl.mechanism,
                    username: sasl.username.clone(),
                    password: read_password(&sasl.password_file)?,
                })
            })
            .transpose()?;
        Ok(ClientSecurity { tls, sasl })
    }
}

impl KafkaSecurityConfig {
    /// The `[wal.security]` table of the TOML file `path` (a whole walctl config, or a file holding only that
    /// table); other keys are not read. A file without the table gives no security. For the benches, which take
    /// their security settings from a file named in the environment.
    pub fn from_toml_file(path: &Path) -> Result<Self> {
        let bad = |reason: String| file_error("security", path, reason);
        let text =
            std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read the file: {e}")))?;
        let table: toml::Table = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let Some(security) = table.get("wal").and_then(|wal| wal.get("security")) else {
            return Ok(Self::default());
        };
        let security: Self = security
            .clone()
            .try_into()
            .map_err(|e: toml::de::Error| bad(e.to_string()))?;
        security.validate()?;
        Ok(security)
    }
}

fn non_empty_path(field: &str, path: &Path) -> Result<()> {
    ensure!(
        !path.as_os_str().is_empty(),
        InvalidWalConfigSnafu {
            field,
            value: "\"\"",
            reason: "a file name is needed",
        }
    );
    Ok(())
}

/// An error naming `field` and `path`, with `reason`.
fn file_error(field: &str, path: &Path, reason: impl Into<String>) -> crate::wal::Error {
    InvalidWalConfigSnafu {
        field,
        value: format!("'{}'", path.display()),
        reason: reason.into(),
    }
    .build()
}

fn read_file(field: &str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| file_error(field, path, format!("cannot read the file: {e}")))
}

/// The password in `path`, without one trailing newline. An empty password is refused.
fn read_password(path: &Path) -> Result<Password> {
    let field = "security.sasl.password_file";
    let bytes = read_file(field, path)?;
    // Not `from_utf8(..)?`-with-the-error: the error would quote bytes of the password.
    let mut text = String::from_utf8(bytes)
        .map_err(|_| file_error(field, path, "the password is not UTF-8"))?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    if text.is_empty() {
        return Err(file_error(field, path, "the file holds no password"));
    }
    Ok(Password(text))
}

/// The rustls client config of `files`: trusts only `files.ca`, presents `cert`/`key` when set.
fn load_tls(files: &TlsFiles) -> Result<rustls::ClientConfig> {
    let error = |field: String, path: &Path, reason: String| file_error(&field, path, reason);
    let source = crate::tls::TlsSource {
        prefix: "security.tls",
        error: &error,
    };
    let client = match (&files.cert, &files.key) {
        (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
        _ => None,
    };
    source.client_config(&files.ca, client)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sasl(dir: &Path, contents: &str) -> KafkaSecurityConfig {
        let file = dir.join("password");
        std::fs::write(&file, contents).unwrap();
        KafkaSecurityConfig {
            tls: None,
            sasl: Some(SaslSettings {
                mechanism: SaslMechanism::ScramSha256,
                username: "walctl".to_string(),
                password_file: file,
            }),
        }
    }

    #[test]
    fn the_password_loses_one_trailing_newline_and_never_shows_in_debug() {
        let dir = tempfile::tempdir().unwrap();
        for (contents, expected) in [
            ("s3cret-pw\n", "s3cret-pw"),
            ("s3cret-pw\r\n", "s3cret-pw"),
            ("s3cret-pw", "s3cret-pw"),
            ("s3cret-pw\n\n", "s3cret-pw\n"),
        ] {
            let loaded = sasl(dir.path(), contents).load().unwrap();
            let credentials = loaded.sasl.clone().unwrap();
            assert_eq!(credentials.password.expose(), expected);
            let debug = format!("{loaded:?} {credentials:?}");
            assert!(!debug.contains("s3cret"), "{debug}");
            assert!(debug.contains("<redacted>"), "{debug}");
        }
    }

    #[test]
    fn an_empty_or_missing_password_file_is_named_without_its_contents() {
        let dir = tempfile::tempdir().unwrap();
        let err = sasl(dir.path(), "\n").load().unwrap_err().to_string();
        assert!(err.contains("security.sasl.password_file"), "{err}");
        assert!(err.contains("no password"), "{err}");
        let mut config = sasl(dir.path(), "x");
        if let Some(s) = config.sasl.as_mut() {
            s.password_file = dir.path().join("missing");
        }
        let err = config.load().unwrap_err().to_string();
        assert!(err.contains("missing"), "{err}");
        assert!(err.contains("cannot read"), "{err}");
    }

    #[test]
    fn a_certificate_without_its_key_is_refused_by_name() {
        let config = KafkaSecurityConfig {
            tls: Some(TlsFiles {
                ca: "ca.pem".into(),
                cert: Some("client.pem".into()),
                key: None,
            }),
            sasl: None,
        };
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("security.tls.cert"), "{err}");
        assert!(err.contains("security.tls.key"), "{err}");
    }

    #[test]
    fn a_ca_file_without_certificates_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "not a certificate\n").unwrap();
        let config = KafkaSecurityConfig {
            tls: Some(TlsFiles {
                ca: ca.clone(),
                cert: None,
                key: None,
            }),
            sasl: None,
        };
        let err = config.load().unwrap_err().to_string();
        assert!(err.contains("security.tls.ca"), "{err}");
        assert!(err.contains("no certificate"), "{err}");
    }

    #[test]
    fn protocol_names_follow_kafka() {
        let mut security = ClientSecurity::default();
        assert_eq!(security.protocol_name(), "PLAINTEXT");
        security.sasl = Some(SaslCredentials {
            mechanism: SaslMechanism::Plain,
            username: "u".to_string(),
            password: Password("p".to_string()),
        });
        assert_eq!(security.protocol_name(), "SASL_PLAINTEXT");
    }
}
