//! `microvmclaims/<name>/exec`: runs a command in the claim's MicroVM, as `pods/exec`
//! does in a container, through the exec agent on the claim's Host (DESIGN §4); with
//! `tty`, on a terminal the agent opens over SSH (ADR 33), resized from channel 4.
//!
//! Everything that can refuse does so before the upgrade, as a `Status`: the options,
//! the handshake, the session cap, the claim (missing, Expired), the Holder rule, the
//! Host's agent (none registered, unreachable, refusing). Only then is the connection
//! upgraded and the session relayed (`session`).

mod portforward;
mod session;
mod sessions;

use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use battery_api_machinery::params::decode_query;
use battery_api_machinery::status::ApiError;
use battery_types::channel::Protocol;
use futures::future::BoxFuture;
use http::request::Parts;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

pub use portforward::ClaimPortForward;
pub use sessions::{DEFAULT_MAX_SESSIONS, ExecSessions};

use crate::api::{Connect, RequestContext};
use crate::http::serve::BulkOutput;
use crate::relay::{AgentRelay, ClaimRef, ExecOpen};
use session::{Attached, Session};

/// The largest WebSocket message read from a client: a stdin chunk, relayed as one
/// relay message the agent accepts (its limit is 1 MiB).
const MAX_MESSAGE_BYTES: usize = 1024 * 1024 - 64;

/// `PodExecOptions`, as clients put them in the query (kube-rs starts it with `&`), and
/// what flintlock's exec takes besides: `env` (repeated `NAME=VALUE`) and `workingDir`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct ExecOptions {
    command: Vec<String>,
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
    container: String,
    env: Vec<String>,
    working_dir: String,
}

impl ExecOptions {
    fn parse(query: &str) -> Result<Self, ApiError> {
        let mut options: Self = decode_query(query)?;
        // A terminal carries stderr with stdout, as kubelet has it (kubectl asks for
        // stderr only without one).
        options.stderr &= !options.tty;
        if !options.container.is_empty() {
            return Err(ApiError::bad_request(format!(
                "a MicroVM has no containers: leave out container (given {:?})",
                options.container
            )));
        }
        if options.command.is_empty() {
            return Err(ApiError::bad_request(
                "you must specify at least one command for the exec",
            ));
        }
        if !(options.stdin || options.stdout || options.stderr) {
            return Err(ApiError::bad_request(
                "you must specify at least 1 of stdin, stdout, stderr",
            ));
        }
        options.environment()?;
        Ok(options)
    }

    /// `env` as the variables it sets; a later `NAME=` wins, as in a shell.
    fn environment(&self) -> Result<std::collections::HashMap<String, String>, ApiError> {
        self.env
            .iter()
            .map(|pair| match pair.split_once('=') {
                Some((name, value)) if !name.is_empty() && !pair.contains('\0') => {
                    Ok((name.to_owned(), value.to_owned()))
                }
                _ => Err(ApiError::bad_request(format!(
                    "env {pair:?} is not NAME=VALUE with a non-empty NAME (and no NUL)"
                ))),
            })
            .collect()
    }

    fn attached(&self) -> Attached {
        Attached {
            stdin: self.stdin,
            stdout: self.stdout,
            stderr: self.stderr,
        }
    }
}

/// The request's connection, to upgrade once the answer is `101`.
fn take_upgrade(parts: &mut Parts) -> Result<hyper::upgrade::OnUpgrade, ApiError> {
    parts
        .extensions
        .remove::<hyper::upgrade::OnUpgrade>()
        .ok_or_else(|| ApiError::bad_request("this connection cannot be upgraded to a WebSocket"))
}

/// The server's side of an upgraded connection's WebSocket, its messages bounded as the
/// agent's are.
async fn server_websocket(
    upgraded: hyper::upgrade::Upgraded,
) -> WebSocketStream<TokioIo<hyper::upgrade::Upgraded>> {
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE_BYTES))
        .max_frame_size(Some(MAX_MESSAGE_BYTES));
    WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, Some(config)).await
}

/// `protocols`' names, for a person.
fn names(protocols: &[Protocol]) -> String {
    let names: Vec<&str> = protocols.iter().map(|p| p.name()).collect();
    names.join(", ")
}

/// A WebSocket handshake we can accept.
struct Handshake {
    accept: String,
    protocol: Protocol,
}

impl Handshake {
    /// The handshake's answer, with the best of `served` the client offered.
    fn of(headers: &HeaderMap, served: &[Protocol]) -> Result<Self, ApiError> {
        let has_token = |name: header::HeaderName, token: &str| {
            headers.get_all(name).iter().any(|value| {
                value
                    .to_str()
                    .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
            })
        };
        let key = headers.get(header::SEC_WEBSOCKET_KEY);
        let (true, Some(key)) = (has_token(header::UPGRADE, "websocket"), key) else {
            return Err(ApiError::bad_request(format!(
                "this needs a WebSocket upgrade ({}); SPDY is not served",
                names(served)
            )));
        };
        if headers.get(header::SEC_WEBSOCKET_VERSION) != Some(&HeaderValue::from_static("13")) {
            return Err(ApiError::bad_request("this needs WebSocket version 13"));
        }
        let offered: Vec<&str> = headers
            .get_all(header::SEC_WEBSOCKET_PROTOCOL)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect();
        let protocol = served
            .iter()
            .copied()
            .find(|p| offered.contains(&p.name()))
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "none of the offered WebSocket subprotocols ({}) is served: offer {}",
                    offered.join(", "),
                    names(served)
                ))
            })?;
        Ok(Self {
            accept: derive_accept_key(key.as_bytes()),
            protocol,
        })
    }

    fn response(&self) -> Result<Response, ApiError> {
        let accept = HeaderValue::from_str(&self.accept).map_err(ApiError::internal)?;
        Ok((
            StatusCode::SWITCHING_PROTOCOLS,
            [
                (header::CONNECTION, HeaderValue::from_static("Upgrade")),
                (header::UPGRADE, HeaderValue::from_static("websocket")),
                (header::SEC_WEBSOCKET_ACCEPT, accept),
                (
                    header::SEC_WEBSOCKET_PROTOCOL,
                    HeaderValue::from_static(self.protocol.name()),
                ),
            ],
        )
            .into_response())
    }
}

/// Where a claim's session goes.
pub struct Target {
    pub(super) claim: ClaimRef,
    pub(super) host: String,
    pub(super) agent_address: String,
    pub(super) microvm_uid: String,
    /// The claim's own env, under each session's.
    pub(super) env: Arc<super::config::ClaimEnv>,
    /// Whether its lease was taken as live from the record, without asking battery.
    pub(super) followed: bool,
}

/// The one question exec and port-forward ask of the claims before a session opens: may
/// this user act on this claim, and where is its MicroVM (`access.rs` answers it).
pub trait ClaimSessions: Send + Sync + 'static {
    /// The claim's MicroVM and its Host's agent, if `ctx` may `act` on it ("exec into").
    fn target<'a>(
        &'a self,
        ctx: &'a RequestContext,
        name: &'a str,
        act: &'a str,
    ) -> BoxFuture<'a, Result<Target, ApiError>>;

    /// What to answer when the agent could not open a session to a claim whose lease was
    /// taken as live from its record ([`Target::followed`]): the claim's expiry if
    /// battery no longer has the lease (its MicroVM is gone), else the agent's `error`.
    fn expired_or<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        error: ApiError,
    ) -> BoxFuture<'a, ApiError>;
}

/// The `exec` subresource of claims.
pub struct ClaimExec {
    pub claims: Arc<dyn ClaimSessions>,
    /// The live sessions, bounded, ended when their claim loses its lease.
    pub sessions: Arc<ExecSessions>,
    pub relay: Arc<AgentRelay>,
}

impl Connect for Arc<ClaimExec> {
    fn connect(
        &self,
        ctx: RequestContext,
        name: String,
        mut parts: Parts,
    ) -> BoxFuture<'static, Result<Response, ApiError>> {
        let exec = self.clone();
        Box::pin(async move {
            let options = ExecOptions::parse(parts.uri.query().unwrap_or_default())?;
            let handshake = Handshake::of(&parts.headers, &Protocol::ALL)?;
            let upgrade = take_upgrade(&mut parts)?;
            let bulk = parts.extensions.remove::<BulkOutput>();
            let sessions = &exec.sessions;
            let permit = sessions.admit()?;
            let target = exec.claims.target(&ctx, &name, "exec into").await?;
            let command = format!("[{}]", options.command.join(" "));
            let opened = exec
                .relay
                .open(
                    &target.host,
                    &target.agent_address,
                    ExecOpen {
                        claim: target.claim.clone(),
                        microvm_uid: target.microvm_uid,
                        command: options.command.clone(),
                        env: super::config::session_env(&target.env, options.environment()?),
                        working_dir: options.working_dir.clone(),
                        stdin: options.stdin,
                        stdout: options.stdout,
                        stderr: options.stderr,
                        tty: options.tty,
                    },
                )
                .await;
            let relay = match opened {
                Ok(relay) => relay,
                Err(error) if target.followed => {
                    let namespace = target.claim.namespace.as_str();
                    return Err(exec.claims.expired_or(namespace, &name, error).await);
                }
                Err(error) => return Err(error),
            };
            let session = Session {
                protocol: handshake.protocol,
                attached: options.attached(),
                tty: options.tty,
                command,
                relay,
                guard: sessions.register(&target.claim.uid, permit),
            };
            let response = handshake.response()?;
            tokio::spawn(async move {
                match upgrade.await {
                    Ok(upgraded) => {
                        if let Some(bulk) = bulk {
                            bulk.enable();
                        }
                        session.run(server_websocket(upgraded).await).await;
                    }
                    // Dropping the session ends the command the agent started.
                    Err(error) => tracing::debug!(%error, "an exec upgrade did not complete"),
                }
            });
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests;
