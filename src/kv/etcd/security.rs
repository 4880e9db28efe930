//! [`EtcdSecurity`]: TLS (a trusted authority, optionally a client certificate) and a user for every etcd
//! connection, and [`SignIn`], which authenticates a member's client before its first call.
//!
//! - **TLS**: with `tls` set, every endpoint is reached over `https://` (an endpoint without a scheme gets it; one
//!   written `http://` is refused by [`EtcdSecurity::validate`]). The server's certificate must chain to `ca` and
//!   name the endpoint's host; `cert` and `key` (both or neither) are presented when the server asks for a client
//!   certificate (etcd's `--client-cert-auth`).
//! - **User**: with `username` set, the password is read from `password_file` (one trailing newline trimmed) when
//!   connecting, and kept in a [`Secret`], whose `Debug` prints no byte of it. Each member's client authenticates
//!   before its first call (not when it is built, so a member that is down at start does not stop the others from
//!   being used), and etcd-client's automatic token refresh re-authenticates when etcd answers "invalid auth token"
//!   (a simple token expires after 5 idle minutes by default and is lost when the member restarts), then sends the
//!   request again.
//! - Files are read when connecting; an error names the file and the config key, never the password.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use serde::{Deserialize, Serialize};
use snafu::ResultExt;

use crate::kv::error::{EtcdCredentialFileSnafu, EtcdSecurityConfigSnafu, Result};

/// `[metadata_store] tls`: the authority etcd's server certificate must chain to, and the client certificate to
/// present (`cert` and `key` both or neither).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdTlsConfig {
    /// PEM file of the certificate authority (or authorities) trusted to sign etcd's server certificate.
    pub ca: PathBuf,
    /// PEM file of the client certificate (chain), for an etcd run with `--client-cert-auth`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    /// PEM file of the client certificate's private key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
}

/// How every connection to etcd is secured: TLS and a user. The default is neither (plaintext, no user).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EtcdSecurity {
    /// TLS; `None`: plaintext.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<EtcdTlsConfig>,
    /// The etcd user to authenticate as; `None`: no user (etcd's auth disabled, or the client certificate's common
    /// name taken as the user).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// The file holding the user's password (one trailing newline is trimmed). Required with `username`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
}

/// A password: its `Debug` prints `Secret(***)`, and it has no `Display`, so it cannot end up in a log line or an
/// error by formatting.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(secret: impl Into<String>) -> Self {
        Secret(secret.into())
    }

    /// The secret itself, for the one call that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// A user and its password, read from the configured file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    /// The etcd user.
    pub username: String,
    /// Its password.
    pub password: Secret,
}

/// What connecting needs, with every file read: the connect options carrying TLS, and the user to sign in as.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// The options with TLS set when configured (and the token refresh on when a user is).
    pub options: ConnectOptions,
    /// The user, if any.
    pub credentials: Option<Credentials>,
}

impl EtcdSecurity {
    /// Whether TLS is configured.
    pub fn uses_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Checks the settings without reading any file; the error names the key (under `[metadata_store]`).
    pub fn validate(&self, endpoints: &[String]) -> Result<()> {
        if let Some(tls) = &self.tls {
            snafu::ensure!(
                tls.cert.is_some() == tls.key.is_some(),
                EtcdSecurityConfigSnafu {
                    key: "metadata_store.tls",
                    reason: "cert and key go together: give both (a client certificate) or neither",
                }
            );
            for (key, path) in [
                ("metadata_store.tls.ca", Some(&tls.ca)),
                ("metadata_store.tls.cert", tls.cert.as_ref()),
                ("metadata_store.tls.key", tls.key.as_ref()),
            ] {
                snafu::ensure!(
                    path.is_none_or(|p| !p.as_os_str().is_empty()),
                    EtcdSecurityConfigSnafu {
                        key,
                        reason: "the file name is empty",
                    }
                );
            }
            if let Some(plain) = endpoints.iter().find(|e| e.trim().starts_with("http://")) {
                return EtcdSecurityConfigSnafu {
                    key: "metadata_store.endpoints",
                    reason: format!(
                        "endpoint {plain} is written http:// but tls is configured: write host:port or https://"
                    ),
                }
                .fail();
            }
        } else if let Some(tls) = endpoints.iter().find(|e| e.trim().starts_with("https://")) {
            return EtcdSecurityConfigSnafu {
                key: "metadata_store.endpoints",
                reason: format!(
                    "endpoint {tls} is written https:// but no tls is configured: add tls = {{ ca = \"…\" }}"
                ),
            }
            .fail();
        }
        match (&self.username, &self.password_file) {
            (Some(user), Some(file)) => {
                snafu::ensure!(
                    !user.is_empty(),
                    EtcdSecurityConfigSnafu {
                        key: "metadata_store.username",
                        reason: "the user name is empty",
                    }
                );
                snafu::ensure!(
                    !file.as_os_str().is_empty(),
                    EtcdSecurityConfigSnafu {
                        key: "metadata_store.password_file",
                        reason: "the file name is empty",
                    }
                );
            }
            (Some(_), None) => {
                return EtcdSecurityConfigSnafu {
                    key: "metadata_store.password_file",
                    reason: "username is set but password_file is not",
                }
                .fail();
            }
            (None, Some(_)) => {
                return EtcdSecurityConfigSnafu {
                    key: "metadata_store.username",
                    reason: "password_file is set but username is not",
                }
                .fail();
            }
            (None, None) => {}
        }
        Ok(())
    }

    /// Validates, reads the files and adds TLS (and the token refresh, with a user) to `options`.
    pub fn load(&self, endpoints: &[String], options: ConnectOptions) -> Result<Loaded> {
        self.validate(endpoints)?;
        let options = match &self.tls {
            None => options,
            Some(tls) => {
                let ca = read("metadata_store.tls.ca", &tls.ca)?;
                let mut config = TlsOptions::new().ca_certificate(Certificate::from_pem(ca));
                if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
                    let cert = read("metadata_store.tls.cert", cert)?;
                    let key = read("metadata_store.tls.key", key)?;
                    config = config.identity(Identity::from_pem(cert, key));
                }
                options.with_tls(config)
            }
        };
        let credentials = match (&self.username, &self.password_file) {
            (Some(username), Some(file)) => {
                let bytes = read("metadata_store.password_file", file)?;
                let mut password = String::from_utf8(bytes).ok().ok_or_else(|| {
                    EtcdSecurityConfigSnafu {
                        key: "metadata_store.password_file",
                        reason: format!("{} is not UTF-8 text", file.display()),
                    }
                    .build()
                })?;
                if password.ends_with('\n') {
                    password.pop();
                    if password.ends_with('\r') {
                        password.pop();
                    }
                }
                snafu::ensure!(
                    !password.is_empty(),
                    EtcdSecurityConfigSnafu {
                        key: "metadata_store.password_file",
                        reason: format!("{} is empty", file.display()),
                    }
                );
                Some(Credentials {
                    username: username.clone(),
                    password: Secret(password),
                })
            }
            _ => None,
        };
        let options = if credentials.is_some() {
            options.with_auto_token_refresh(true)
        } else {
            options
        };
        Ok(Loaded {
            options,
            credentials,
        })
    }
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).context(EtcdCredentialFileSnafu {
        key,
        path: path.to_path_buf(),
    })
}

/// Authenticates one member's client, once, before its first call; later expiries are etcd-client's automatic
/// token refresh's (see the module documentation). Without credentials it does nothing.
pub struct SignIn {
    /// The member's client: its clones (the kv client taken from it included) share the token it gets.
    client: Client,
    credentials: Option<Credentials>,
    done: tokio::sync::OnceCell<()>,
}

impl std::fmt::Debug for SignIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignIn")
            .field("credentials", &self.credentials)
            .field("done", &self.done.initialized())
            .finish_non_exhaustive()
    }
}

impl SignIn {
    /// Signs `client` in as `credentials` at its first call.
    pub fn new(client: Client, credentials: Option<Credentials>) -> Arc<Self> {
        Arc::new(SignIn {
            client,
            credentials,
            done: tokio::sync::OnceCell::new(),
        })
    }

    /// Authenticates unless done already (or no user is configured). Concurrent callers wait for one attempt; a
    /// failed (or cancelled) attempt leaves the next call to try again.
    pub async fn ensure(&self) -> std::result::Result<(), etcd_client::Error> {
        let Some(credentials) = &self.credentials else {
            return Ok(());
        };
        self.done
            .get_or_try_init(|| async {
                let mut client = self.client.clone();
                client
                    .update_user(Some((
                        credentials.username.clone(),
                        credentials.password.expose().to_string(),
                    )))
                    .await
            })
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoints() -> Vec<String> {
        vec!["127.0.0.1:2379".to_string()]
    }

    #[test]
    fn a_secret_never_shows_in_debug_output() {
        let credentials = Credentials {
            username: "walctl".into(),
            password: Secret::new("hunter2-very-secret"),
        };
        let shown = format!("{credentials:?} {:#?}", credentials);
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("walctl") && shown.contains("***"), "{shown}");
    }

    #[test]
    fn the_password_file_loses_one_trailing_newline_and_the_error_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("password");
        std::fs::write(&file, "s3cret pass\n").unwrap();
        let security = EtcdSecurity {
            username: Some("walctl".into()),
            password_file: Some(file.clone()),
            ..Default::default()
        };
        let loaded = security.load(&endpoints(), ConnectOptions::new()).unwrap();
        let credentials = loaded.credentials.clone().unwrap();
        assert_eq!(credentials.password.expose(), "s3cret pass");
        assert!(!format!("{loaded:?}").contains("s3cret"));

        std::fs::remove_file(&file).unwrap();
        let err = security
            .load(&endpoints(), ConnectOptions::new())
            .unwrap_err()
            .to_string();
        assert!(err.contains("metadata_store.password_file"), "{err}");
        assert!(err.contains(&file.display().to_string()), "{err}");
    }

    #[test]
    fn half_a_client_certificate_or_a_user_without_password_is_refused_by_key() {
        let cert_only = EtcdSecurity {
            tls: Some(EtcdTlsConfig {
                ca: "ca.pem".into(),
                cert: Some("client.pem".into()),
                key: None,
            }),
            ..Default::default()
        };
        let err = cert_only.validate(&endpoints()).unwrap_err().to_string();
        assert!(err.contains("metadata_store.tls"), "{err}");
        let user_only = EtcdSecurity {
            username: Some("walctl".into()),
            ..Default::default()
        };
        let err = user_only.validate(&endpoints()).unwrap_err().to_string();
        assert!(err.contains("metadata_store.password_file"), "{err}");
        let tls = EtcdSecurity {
            tls: Some(EtcdTlsConfig {
                ca: "ca.pem".into(),
                cert: None,
                key: None,
            }),
            ..Default::default()
        };
        let err = tls
            .validate(&["http://127.0.0.1:2379".to_string()])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("metadata_store.endpoints") && err.contains("http://"),
            "{err}"
        );
        let err = EtcdSecurity::default()
            .validate(&["https://127.0.0.1:2379".to_string()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("https://"), "{err}");
    }
}
