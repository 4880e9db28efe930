//! One connection of the batch admin to one broker: TCP, then TLS and SASL as `[wal.security]` says, then framed
//! Kafka requests spoken with the `kafka-protocol` crate's encoders.
//!
//! SASL follows Kafka's protocol: SaslHandshake (v1) names the mechanism and gets the broker's list of enabled
//! mechanisms, then SaslAuthenticate (v1) requests carry the mechanism's messages, computed by `rsasl` (PLAIN,
//! SCRAM-SHA-256, SCRAM-SHA-512: the SASL crate rskafka itself uses). A SCRAM client also checks the broker's final
//! signature, so a broker that does not know the password cannot pass as one that does.
//!
//! [`open`] tells apart what may heal from what will not: no TCP connection (or no TLS/SASL answer in time) is
//! [`OpenFailure::Unreachable`]; a refused handshake or authentication is [`OpenFailure::Refused`], an error
//! naming the endpoint and the cause that is never retried.

use std::io::Cursor;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use kafka_protocol::messages::{
    ApiKey, RequestHeader, ResponseHeader, SaslAuthenticateRequest, SaslAuthenticateResponse,
    SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use rsasl::prelude::{Mechname, SASLClient, SASLConfig};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::timeout;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::security::{ClientSecurity, SaslCredentials};
use crate::wal::error::KafkaSecuritySnafu;

/// The SaslHandshake version sent (v1: the mechanism's messages go in SaslAuthenticate requests).
const SASL_HANDSHAKE_VERSION: i16 = 1;
/// The SaslAuthenticate version sent (v1: the broker's error message comes back).
const SASL_AUTHENTICATE_VERSION: i16 = 1;
/// The largest answer accepted (a Metadata answer for 10,000 topics is well under 10 MiB).
pub const MAX_RESPONSE_BYTES: usize = 64 << 20;
/// Kafka's UNSUPPORTED_SASL_MECHANISM.
const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
/// SaslAuthenticate round trips allowed (SCRAM needs two, PLAIN one).
const MAX_SASL_STEPS: usize = 8;

/// A connection to one broker, plain or TLS.
pub enum BrokerStream {
    /// Plaintext TCP.
    Plain(TcpStream),
    /// TLS over TCP.
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for BrokerStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            BrokerStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            BrokerStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for BrokerStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            BrokerStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            BrokerStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            BrokerStream::Plain(s) => Pin::new(s).poll_flush(cx),
            BrokerStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            BrokerStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            BrokerStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The longest one step of [`open`] (TCP connect, TLS handshake, SASL exchange) may take.
pub const MAX_STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// Checks `security` against `endpoints` with one connection (TCP, TLS, SASL), for clients that would retry a
/// refusal until their deadline (rskafka). Plaintext settings are not checked. The first broker that accepts ends
/// the check; a refusal is returned at once (final); when no broker can be reached the check passes, and the
/// client's own retries deal with the outage.
pub async fn check_security(
    endpoints: &[String],
    security: &ClientSecurity,
    step_timeout: Duration,
) -> crate::wal::error::Result<()> {
    if security.is_plaintext() {
        return Ok(());
    }
    for endpoint in endpoints {
        match open(endpoint, security, step_timeout).await {
            Ok(_) => return Ok(()),
            Err(OpenFailure::Refused(e)) => return Err(e),
            Err(OpenFailure::Unreachable(_)) => {}
        }
    }
    Ok(())
}

/// Why [`open`] did not give a connection.
#[derive(Debug)]
pub enum OpenFailure {
    /// No connection, or no handshake answer, within the timeout: the broker may be down or restarting.
    Unreachable(String),
    /// The broker refused the TLS handshake or the SASL authentication: final.
    Refused(crate::wal::Error),
}

/// Connects to `endpoint`, each of TCP, TLS and SASL within `step_timeout`, as `security` says.
pub async fn open(
    endpoint: &str,
    security: &ClientSecurity,
    step_timeout: Duration,
) -> Result<BrokerStream, OpenFailure> {
    let tcp = match timeout(step_timeout, TcpStream::connect(endpoint)).await {
        Ok(Ok(tcp)) => tcp,
        Ok(Err(e)) => return Err(OpenFailure::Unreachable(format!("{endpoint}: {e}"))),
        Err(_) => {
            return Err(OpenFailure::Unreachable(format!(
                "{endpoint}: no connection within {step_timeout:?}"
            )));
        }
    };
    // Requests are small and answered one at a time: send each at once.
    let _ = tcp.set_nodelay(true);
    let mut stream = match &security.tls {
        None => BrokerStream::Plain(tcp),
        Some(config) => {
            let refused = |reason: String| {
                OpenFailure::Refused(
                    KafkaSecuritySnafu {
                        endpoint,
                        stage: "TLS handshake",
                        reason,
                    }
                    .build(),
                )
            };
            let host = endpoint
                .rsplit_once(':')
                .map_or(endpoint, |(host, _)| host)
                .trim_start_matches('[')
                .trim_end_matches(']');
            let name = ServerName::try_from(host.to_string())
                .map_err(|e| refused(format!("'{host}' is not a DNS name or IP address: {e}")))?;
            let connector = TlsConnector::from(config.clone());
            match timeout(step_timeout, connector.connect(name, tcp)).await {
                Ok(Ok(tls)) => BrokerStream::Tls(Box::new(tls)),
                Ok(Err(e)) => return Err(refused(describe_tls_error(&e))),
                Err(_) => {
                    return Err(OpenFailure::Unreachable(format!(
                        "{endpoint}: no TLS handshake within {step_timeout:?}"
                    )));
                }
            }
        }
    };
    if let Some(credentials) = &security.sasl {
        match timeout(
            step_timeout,
            authenticate(&mut stream, endpoint, credentials, security.tls.is_some()),
        )
        .await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(OpenFailure::Refused(e)),
            Err(_) => {
                return Err(OpenFailure::Unreachable(format!(
                    "{endpoint}: no SASL answer within {step_timeout:?}"
                )));
            }
        }
    }
    Ok(stream)
}

/// A TLS handshake error in words, with a hint for the two common causes.
fn describe_tls_error(e: &std::io::Error) -> String {
    let hint = match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::InvalidCertificate(_)) => {
            " (the broker's certificate is not signed by security.tls.ca, or does not name this host)"
        }
        Some(_) => "",
        None => {
            " (the connection closed during the handshake: is this a TLS listener (SSL or SASL_SSL), not a \
             PLAINTEXT one?)"
        }
    };
    format!("{e}{hint}")
}

/// SaslHandshake, then SaslAuthenticate round trips until the mechanism is done.
async fn authenticate(
    stream: &mut BrokerStream,
    endpoint: &str,
    credentials: &SaslCredentials,
    over_tls: bool,
) -> crate::wal::error::Result<()> {
    let mechanism = credentials.mechanism.name();
    let stage = format!(
        "SASL authentication ({mechanism} as user '{}')",
        credentials.username
    );
    let refused = |reason: String| {
        KafkaSecuritySnafu {
            endpoint,
            stage: stage.clone(),
            reason,
        }
        .build()
    };
    let not_a_sasl_listener = |reason: String| {
        let hint = if over_tls {
            "is this a SASL listener?"
        } else {
            "is this a SASL_PLAINTEXT listener, not an SSL or SASL_SSL one (then set security.tls)?"
        };
        refused(format!("{reason} ({hint})"))
    };
    let handshake: SaslHandshakeResponse = exchange(
        stream,
        0,
        &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(mechanism)),
        ApiKey::SaslHandshake,
        SASL_HANDSHAKE_VERSION,
    )
    .await
    .map_err(|(reason, _)| not_a_sasl_listener(reason))?;
    match handshake.error_code {
        0 => {}
        UNSUPPORTED_SASL_MECHANISM => {
            let offered: Vec<&str> = handshake.mechanisms.iter().map(|m| m.as_str()).collect();
            return Err(refused(format!(
                "the broker does not offer {mechanism}; it offers [{}]",
                offered.join(", ")
            )));
        }
        code => return Err(refused(error_name(code))),
    }
    let config = SASLConfig::with_credentials(
        None,
        credentials.username.clone(),
        credentials.password.expose().to_string(),
    )
    .map_err(|e| refused(format!("cannot set up the SASL client: {e}")))?;
    let name = Mechname::parse(mechanism.as_bytes())
        .map_err(|e| refused(format!("bad mechanism name: {e}")))?;
    let mut session = SASLClient::new(config)
        .start_suggested(&[name])
        .map_err(|e| refused(format!("cannot start {mechanism}: {e}")))?;
    let mut received: Option<Vec<u8>> = None;
    for step in 0..MAX_SASL_STEPS {
        let mut out = Cursor::new(Vec::new());
        let state = session
            .step(received.as_deref(), &mut out)
            .map_err(|e| refused(format!("the broker's answer does not verify: {e}")))?;
        if state.has_sent_message() {
            let request =
                SaslAuthenticateRequest::default().with_auth_bytes(out.into_inner().into());
            let answer: SaslAuthenticateResponse = exchange(
                stream,
                i32::try_from(step + 1).unwrap_or(i32::MAX),
                &request,
                ApiKey::SaslAuthenticate,
                SASL_AUTHENTICATE_VERSION,
            )
            .await
            .map_err(|(reason, _)| refused(reason))?;
            if answer.error_code != 0 {
                let message = answer
                    .error_message
                    .as_ref()
                    .map_or("no message", |m| m.as_str());
                return Err(refused(format!(
                    "{}: {message}",
                    error_name(answer.error_code)
                )));
            }
            received = Some(answer.auth_bytes.to_vec());
        }
        if state.is_finished() {
            return Ok(());
        }
    }
    Err(refused(format!(
        "not finished after {MAX_SASL_STEPS} round trips"
    )))
}

/// Kafka's name of error `code`.
fn error_name(code: i16) -> String {
    rskafka::client::error::ProtocolError::new(code)
        .map_or_else(|| format!("error code {code}"), |e| format!("{e:?}"))
}

/// Writes one framed request and reads its framed answer. The error says why and whether a retry may help.
pub async fn exchange<Req, Resp, S>(
    stream: &mut S,
    correlation_id: i32,
    request: &Req,
    api: ApiKey,
    version: i16,
) -> Result<Resp, (String, bool)>
where
    Req: Encodable + HeaderVersion,
    Resp: Decodable + HeaderVersion,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let header = RequestHeader::default()
        .with_request_api_key(api as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str("remote-wal")));
    let mut body = Vec::new();
    header
        .encode(&mut body, Req::header_version(version))
        .and_then(|()| request.encode(&mut body, version))
        .map_err(|e| (format!("cannot encode the request: {e}"), false))?;
    let len = u32::try_from(body.len()).map_err(|_| {
        (
            format!("request of {} bytes is too large", body.len()),
            false,
        )
    })?;
    let mut frame = Vec::with_capacity(body.len() + 4);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&body);
    // A connection that breaks mid-request may heal: retryable.
    stream
        .write_all(&frame)
        .await
        .map_err(|e| (format!("cannot send: {e}"), true))?;
    stream
        .flush()
        .await
        .map_err(|e| (format!("cannot send: {e}"), true))?;
    let mut len = [0u8; 4];
    stream
        .read_exact(&mut len)
        .await
        .map_err(|e| (format!("cannot read the answer: {e}"), true))?;
    let len = usize::try_from(u32::from_be_bytes(len)).unwrap_or(usize::MAX);
    if len > MAX_RESPONSE_BYTES {
        return Err((
            format!(
                "the answer claims {len} bytes (over {MAX_RESPONSE_BYTES}); is this a Kafka broker, and does it \
                 speak this protocol (PLAINTEXT or TLS)?"
            ),
            false,
        ));
    }
    let mut answer = vec![0u8; len];
    stream
        .read_exact(&mut answer)
        .await
        .map_err(|e| (format!("cannot read the answer: {e}"), true))?;
    let mut buf = answer.as_slice();
    let header = ResponseHeader::decode(&mut buf, Resp::header_version(version))
        .map_err(|e| (format!("cannot decode the answer's header: {e}"), false))?;
    if header.correlation_id != correlation_id {
        return Err((
            format!(
                "the answer is for request {}, not {correlation_id}",
                header.correlation_id
            ),
            false,
        ));
    }
    Resp::decode(&mut buf, version).map_err(|e| (format!("cannot decode the answer: {e}"), false))
}
