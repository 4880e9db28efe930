//! [`HttpLink`]: the datanode's [`MetasrvLink`] over HTTP to `walctl serve`. It sends each call to the leader as
//! last known (or named by a follower's 503), else to the configured servers in turn, each attempt bounded; a
//! `stale_incarnation` answer becomes [`Error::StaleIncarnation`].

use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use datanode::error::{Error, Result};
use datanode::heartbeat::MetasrvLink;
use remote_wal::datanode::protocol::{
    HeartbeatRequest, HeartbeatResponse, RegisterRequest, RegisterResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The metasrv servers of one deployment, over HTTP.
pub struct HttpLink {
    servers: Vec<String>,
    leader: Mutex<Option<String>>,
    agent: ureq::Agent,
    access: crate::access::Access,
    datanode_id: u64,
}

/// `URL` without a trailing `/`, with `http://` added when no scheme is given.
pub fn base_url(url: &str) -> String {
    let url = url.trim().trim_end_matches('/');
    if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    }
}

impl HttpLink {
    /// A link to `servers`, each request bounded by `timeout`, sent with `access`'s token (`[datanode]
    /// token_file`) and checking `https://` servers against its authority (`[datanode] ca`).
    pub fn new(
        servers: &[String],
        timeout: Duration,
        datanode_id: u64,
        access: crate::access::Access,
    ) -> Self {
        HttpLink {
            servers: servers.iter().map(|s| base_url(s)).collect(),
            leader: Mutex::new(None),
            agent: access.agent(timeout, timeout),
            access,
            datanode_id,
        }
    }

    fn endpoints(&self) -> String {
        self.servers.join(",")
    }

    /// One pass: the known leader first, then every server; the first definite answer wins.
    fn call_blocking(&self, path: &str, body: &Value, incarnation: u64) -> Result<Value> {
        let known = self
            .leader
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let mut order: Vec<String> = known.into_iter().collect();
        order.extend(self.servers.iter().cloned());
        let mut tried = Vec::new();
        let mut last = String::new();
        let mut i = 0;
        while i < order.len() {
            let server = order[i].clone();
            i += 1;
            if tried.contains(&server) {
                continue;
            }
            tried.push(server.clone());
            let url = format!("{server}{path}");
            match self.access.authorize(self.agent.post(&url)).send_json(body) {
                Ok(mut response) => {
                    let status = response.status().as_u16();
                    let value: Value = response.body_mut().read_json().unwrap_or(Value::Null);
                    if (200..300).contains(&status) {
                        *self
                            .leader
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(server);
                        return Ok(value);
                    }
                    let error = &value["error"];
                    let message = error["message"]
                        .as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| format!("HTTP {status}"));
                    if error["kind"] == "stale_incarnation" {
                        return Err(Error::StaleIncarnation {
                            datanode_id: self.datanode_id,
                            incarnation,
                        });
                    }
                    if let Some(leader) = error["leader"].as_str().map(base_url)
                        && !tried.contains(&leader)
                    {
                        order.insert(i, leader);
                    }
                    let retryable = error["retryable"].as_bool().unwrap_or(status == 503);
                    // A missing, unknown or read-only token: no other server of the deployment takes it either.
                    if status == 401 || status == 403 {
                        return Err(Error::Metasrv {
                            endpoints: server,
                            detail: format!("{message} ([datanode] token_file)"),
                            retryable: false,
                        });
                    }
                    if status != 503 && !retryable {
                        return Err(Error::Metasrv {
                            endpoints: server,
                            detail: message,
                            retryable: false,
                        });
                    }
                    last = format!("{server}: {message}");
                }
                Err(e) => last = format!("{server}: {e}"),
            }
        }
        *self
            .leader
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        Err(Error::Metasrv {
            endpoints: self.endpoints(),
            detail: format!("no leader took the request (last: {last})"),
            retryable: true,
        })
    }

    async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        path: &'static str,
        request: &Req,
        incarnation: u64,
    ) -> Result<Resp> {
        let body = serde_json::to_value(request).map_err(|e| Error::Metasrv {
            endpoints: self.endpoints(),
            detail: format!("cannot encode the request: {e}"),
            retryable: false,
        })?;
        let value = tokio::task::block_in_place(|| self.call_blocking(path, &body, incarnation))?;
        serde_json::from_value(value).map_err(|e| Error::Metasrv {
            endpoints: self.endpoints(),
            detail: format!("an answer to {path} does not decode: {e}"),
            retryable: true,
        })
    }
}

#[async_trait]
impl MetasrvLink for HttpLink {
    async fn register(&self, request: &RegisterRequest) -> Result<RegisterResponse> {
        self.call("/v1/datanodes/register", request, 0).await
    }

    async fn heartbeat(&self, request: &HeartbeatRequest) -> Result<HeartbeatResponse> {
        self.call("/v1/heartbeat", request, request.incarnation)
            .await
    }
}
