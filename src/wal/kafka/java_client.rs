//! `[wal.security]` as a Java Kafka client's properties (`security.protocol`, `ssl.truststore.*`, `sasl.*`), for the
//! benches' anchors (`ProducerPerformance --producer.config`, `TopicCommand --command-config`, the AdminClient
//! anchor) when they run against a secure broker: they then connect exactly as remote-wal does.
//!
//! The properties hold the password (in `sasl.jaas.config`, as Java clients take it), so they are written only to a
//! file created with mode 0600 and never returned as text a caller could print: [`write_java_client_properties`].

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use super::security::{KafkaSecurityConfig, SaslMechanism};
use crate::wal::error::InvalidWalConfigSnafu;
use crate::wal::error::Result;

/// Writes the Java client properties of `security` to `path` (created or truncated, mode 0600 on Unix). An empty
/// `security` writes `security.protocol=PLAINTEXT` alone. Errors name the file, never the password.
pub fn write_java_client_properties(security: &KafkaSecurityConfig, path: &Path) -> Result<()> {
    let text = java_client_properties(security)?;
    let failed = |e: std::io::Error| {
        InvalidWalConfigSnafu {
            field: "security (Java client properties)",
            value: format!("'{}'", path.display()),
            reason: format!("cannot write the file: {e}"),
        }
        .build()
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path).map_err(failed)?;
    file.write_all(text.as_bytes()).map_err(failed)
}

/// The properties text (with the password): private, so that only a 0600 file ever holds it.
fn java_client_properties(security: &KafkaSecurityConfig) -> Result<String> {
    let loaded = security.load()?;
    let mut out = String::new();
    let _ = writeln!(out, "security.protocol={}", loaded.protocol_name());
    if let Some(tls) = &security.tls {
        let _ = writeln!(out, "ssl.truststore.type=PEM");
        let _ = writeln!(
            out,
            "ssl.truststore.location={}",
            escape_value(&tls.ca.display().to_string())
        );
        if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
            // Java's PEM key store takes the chain and the key inline.
            let read = |field: &str, path: &Path| {
                std::fs::read_to_string(path).map_err(|e| {
                    InvalidWalConfigSnafu {
                        field,
                        value: format!("'{}'", path.display()),
                        reason: format!("cannot read the file: {e}"),
                    }
                    .build()
                })
            };
            let _ = writeln!(out, "ssl.keystore.type=PEM");
            let _ = writeln!(
                out,
                "ssl.keystore.certificate.chain={}",
                escape_value(&read("security.tls.cert", cert)?)
            );
            let _ = writeln!(
                out,
                "ssl.keystore.key={}",
                escape_value(&read("security.tls.key", key)?)
            );
        }
    }
    if let Some(sasl) = &loaded.sasl {
        let module = match sasl.mechanism {
            SaslMechanism::Plain => "org.apache.kafka.common.security.plain.PlainLoginModule",
            SaslMechanism::ScramSha256 | SaslMechanism::ScramSha512 => {
                "org.apache.kafka.common.security.scram.ScramLoginModule"
            }
        };
        let _ = writeln!(out, "sasl.mechanism={}", sasl.mechanism.name());
        let jaas = format!(
            "{module} required username=\"{}\" password=\"{}\";",
            escape_jaas(&sasl.username),
            escape_jaas(sasl.password.expose())
        );
        let _ = writeln!(out, "sasl.jaas.config={}", escape_value(&jaas));
    }
    Ok(out)
}

/// A quoted JAAS option value: `\` and `"` escaped.
fn escape_jaas(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"")
}

/// A `.properties` value: `\` escaped, line breaks as `\n`, a leading space kept.
fn escape_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for (i, c) in value.chars().enumerate() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            ' ' if i == 0 => out.push_str("\\ "),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::kafka::security::{SaslSettings, TlsFiles};

    #[test]
    fn sasl_ssl_properties_trust_the_ca_and_carry_the_escaped_password_in_a_private_file() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, TEST_CA).unwrap();
        let password = dir.path().join("password");
        std::fs::write(&password, "p\"w\\d\n").unwrap();
        let security = KafkaSecurityConfig {
            tls: Some(TlsFiles {
                ca: ca.clone(),
                cert: None,
                key: None,
            }),
            sasl: Some(SaslSettings {
                mechanism: SaslMechanism::ScramSha512,
                username: "walctl".to_string(),
                password_file: password,
            }),
        };
        let out = dir.path().join("client.properties");
        write_java_client_properties(&security, &out).unwrap();
        let text = std::fs::read_to_string(&out).unwrap();
        assert!(text.contains("security.protocol=SASL_SSL\n"), "{text}");
        assert!(text.contains("sasl.mechanism=SCRAM-SHA-512\n"), "{text}");
        assert!(
            text.contains(&format!("ssl.truststore.location={}\n", ca.display())),
            "{text}"
        );
        // JAAS escapes `"` and `\` (p\"w\\d), then the properties file doubles each `\`.
        assert!(
            text.contains(r#"username="walctl" password="p\\"w\\\\d";"#),
            "{text}"
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&out).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "only the owner reads it: {mode:o}");
        }
    }

    #[test]
    fn no_security_is_plaintext() {
        let text = java_client_properties(&KafkaSecurityConfig::default()).unwrap();
        assert_eq!(text, "security.protocol=PLAINTEXT\n");
    }

    /// A self-signed authority certificate (its key was thrown away): loading only parses it.
    const TEST_CA: &str = include_str!("../../../tests/fixtures/security/ca.pem");
}
