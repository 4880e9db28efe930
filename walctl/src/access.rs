//! How walctl reaches a `walctl serve` that asks for a token or speaks HTTPS (`docs/security.md`, "HTTP"): the
//! bearer token (`--token-file FILE` or `WALCTL_TOKEN`; a datanode's `[datanode] token_file`) and the authority
//! its certificate is checked against (`--ca FILE`; `[datanode] ca`). The token is sent as
//! `Authorization: Bearer TOKEN` and never printed: errors name the file, not what it holds.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::Failure;

/// The environment variable holding the token itself (`--token-file` wins over it).
pub const TOKEN_ENV: &str = "WALCTL_TOKEN";

/// A token and a trusted authority, either of them optional.
#[derive(Clone, Default)]
pub struct Access {
    /// `Bearer TOKEN`, the header's value.
    authorization: Option<String>,
    /// The authority's certificates (DER), when one is named.
    ca: Option<Arc<Vec<ureq::tls::Certificate<'static>>>>,
}

impl std::fmt::Debug for Access {
    /// Whether there is a token, never the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("token", &self.authorization.is_some())
            .field("ca", &self.ca.is_some())
            .finish()
    }
}

impl Access {
    /// The client's: `--token-file`, else `WALCTL_TOKEN`; `--ca`.
    pub fn from_cli(token_file: Option<&Path>, ca: Option<&Path>) -> Result<Self, Failure> {
        let token = match token_file {
            Some(path) => Some(read_token(path, "--token-file")?),
            None => match std::env::var(TOKEN_ENV) {
                Ok(token) if !token.trim().is_empty() => {
                    let token = token.trim().to_string();
                    check_token(&token, TOKEN_ENV)?;
                    Some(token)
                }
                _ => None,
            },
        };
        let ca = ca.map(|path| read_ca(path, "--ca")).transpose()?;
        Ok(Access {
            authorization: token.map(|t| format!("Bearer {t}")),
            ca: ca.map(Arc::new),
        })
    }

    /// A datanode's: `[datanode] token_file` and `ca` (empty: none).
    pub fn from_files(token_file: &str, ca: &str) -> Result<Self, Failure> {
        let token = (!token_file.trim().is_empty())
            .then(|| read_token(Path::new(token_file), "[datanode] token_file"))
            .transpose()?;
        let ca = (!ca.trim().is_empty())
            .then(|| read_ca(Path::new(ca), "[datanode] ca"))
            .transpose()?;
        Ok(Access {
            authorization: token.map(|t| format!("Bearer {t}")),
            ca: ca.map(Arc::new),
        })
    }

    /// An agent with these settings, `connect` bounding each connection and `global` each request (no status is
    /// an error: the caller reads the API's error answers).
    pub fn agent(&self, connect: Duration, global: Duration) -> ureq::Agent {
        let mut tls = ureq::tls::TlsConfig::builder().provider(ureq::tls::TlsProvider::Rustls);
        if let Some(ca) = &self.ca {
            tls = tls.root_certs(ureq::tls::RootCerts::Specific(ca.clone()));
        }
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(connect))
            .timeout_global(Some(global))
            .tls_config(tls.build())
            .build()
            .new_agent()
    }

    /// `request` with the `Authorization` header, when there is a token.
    pub fn authorize<B>(&self, request: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.authorization {
            Some(value) => request.header("Authorization", value),
            None => request,
        }
    }
}

/// The token of `path`: its first line that is neither blank nor a `#` comment, either the token alone or a
/// `SCOPE TOKEN` line as in the server's tokens file.
fn read_token(path: &Path, setting: &str) -> Result<String, Failure> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Failure::Refused(format!(
            "cannot read the token file {} ({setting}): {e}",
            path.display()
        ))
    })?;
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .ok_or_else(|| {
            Failure::Refused(format!(
                "the token file {} ({setting}) holds no token",
                path.display()
            ))
        })?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let token = match words.as_slice() {
        [token] => *token,
        ["read" | "write", token] => *token,
        _ => {
            return Err(Failure::Refused(format!(
                "the token file {} ({setting}): its first line must be the token alone or 'SCOPE TOKEN'",
                path.display()
            )));
        }
    };
    check_token(token, &format!("the token file {}", path.display()))?;
    Ok(token.to_string())
}

/// A token goes into a header: printable ASCII only.
fn check_token(token: &str, origin: &str) -> Result<(), Failure> {
    if token.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(())
    } else {
        Err(Failure::Refused(format!(
            "{origin}: a token is printable ASCII without spaces"
        )))
    }
}

/// The PEM certificates of `path`.
fn read_ca(path: &Path, setting: &str) -> Result<Vec<ureq::tls::Certificate<'static>>, Failure> {
    let bytes = std::fs::read(path).map_err(|e| {
        Failure::Refused(format!(
            "cannot read the authority {} ({setting}): {e}",
            path.display()
        ))
    })?;
    let certs: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&bytes)
        .filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(cert)) => Some(Ok(cert)),
            Ok(_) => None,
            Err(e) => Some(Err(e)),
        })
        .collect::<Result<_, _>>()
        .map_err(|e| {
            Failure::Refused(format!(
                "the authority {} ({setting}) is not PEM: {e}",
                path.display()
            ))
        })?;
    if certs.is_empty() {
        return Err(Failure::Refused(format!(
            "the authority {} ({setting}) holds no PEM certificate",
            path.display()
        )));
    }
    Ok(certs)
}

/// Whether `error` is the TLS layer's (an untrusted certificate, a name mismatch, a handshake failure): no other
/// server of the same deployment would answer otherwise, so the client stops at once.
pub fn is_tls_error(error: &ureq::Error) -> bool {
    match error {
        ureq::Error::Tls(_) | ureq::Error::Rustls(_) => true,
        ureq::Error::Io(e) => e
            .get_ref()
            .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some()),
        _ => false,
    }
}
