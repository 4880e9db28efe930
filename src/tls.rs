//! A rustls client config from PEM files: the one way the Kafka clients and the PostgreSQL metadata store build
//! their TLS (etcd's gRPC client takes the PEM bytes itself).
//!
//! Only the named authority is trusted (never the system's roots), the server's certificate must name the host
//! connected to, and a client certificate is presented when one is given. The crypto provider is ring, set on the
//! config itself, so no process-wide default provider is needed. Errors name the setting and the file, never a
//! line of a key file.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Where the files come from, for errors: `prefix` is the dotted setting holding `ca`, `cert` and `key` (e.g.
/// `security.tls` or `metadata_store.tls`); `error` builds the caller's error from the full setting name, the file
/// and the reason.
pub(crate) struct TlsSource<'a, E = crate::Error> {
    /// The dotted setting, without `.ca` / `.cert` / `.key`.
    pub prefix: &'a str,
    /// Builds the error for `(setting, file, reason)`.
    pub error: &'a dyn Fn(String, &Path, String) -> E,
}

impl<E> TlsSource<'_, E> {
    fn fail(&self, part: &str, path: &Path, reason: impl Into<String>) -> E {
        let setting = if part.is_empty() {
            self.prefix.to_string()
        } else {
            format!("{}.{part}", self.prefix)
        };
        (self.error)(setting, path, reason.into())
    }

    fn read(&self, part: &str, path: &Path) -> std::result::Result<Vec<u8>, E> {
        std::fs::read(path).map_err(|e| self.fail(part, path, format!("cannot read the file: {e}")))
    }

    fn certificates(
        &self,
        part: &str,
        path: &Path,
    ) -> std::result::Result<Vec<CertificateDer<'static>>, E> {
        let pem = self.read(part, path)?;
        let certs = CertificateDer::pem_slice_iter(&pem)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| self.fail(part, path, format!("not PEM certificates: {e}")))?;
        if certs.is_empty() {
            return Err(self.fail(
                part,
                path,
                "no certificate in the file (expected PEM '-----BEGIN CERTIFICATE-----')",
            ));
        }
        Ok(certs)
    }

    /// The client config trusting only `ca`, presenting `client` (certificate chain, key) when given.
    pub fn client_config(
        &self,
        ca: &Path,
        client: Option<(&Path, &Path)>,
    ) -> std::result::Result<rustls::ClientConfig, E> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in self.certificates("ca", ca)? {
            roots.add(cert).map_err(|e| {
                self.fail("ca", ca, format!("not a usable authority certificate: {e}"))
            })?;
        }
        // ring, as rskafka's `transport-tls` builds on it (rustls marks it deprecated only for lacking post-quantum
        // key exchange, which needs aws-lc-rs and a much larger build).
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| self.fail("", ca, e.to_string()))?
            .with_root_certificates(roots);
        let Some((cert, key)) = client else {
            return Ok(builder.with_no_client_auth());
        };
        let chain = self.certificates("cert", cert)?;
        let pem = self.read("key", key)?;
        // The PEM error is not quoted: it may carry a line of the key file.
        let private = PrivateKeyDer::from_pem_slice(&pem).map_err(|_| {
            self.fail(
                "key",
                key,
                "no PEM private key (PKCS#8, PKCS#1 or SEC1) in the file",
            )
        })?;
        builder.with_client_auth_cert(chain, private).map_err(|e| {
            self.fail(
                "key",
                key,
                format!("does not fit {}.cert: {e}", self.prefix),
            )
        })
    }
}
