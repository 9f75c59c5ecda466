//! `microvmclaims/<name>/exec`: runs a command in the claim's MicroVM, as `pods/exec`
//! does in a container, through the exec agent on the claim's Host (DESIGN §4); with
//! `tty`, on a terminal the agent opens over SSH (ADR 33), resized from channel 4.
//!
//! Everything that can refuse does so before the upgrade, as a `Status`: the options,
//! the handshake (`api/connect/websocket.rs`), the session cap, the claim (missing,
//! Expired), the Holder rule, the Host's agent (none registered, unreachable, refusing).
//! Only then is the connection upgraded and the session relayed (`session`).

mod portforward;
pub(in crate::resources::microvmclaims) mod session;
mod sessions;
mod target;

use std::collections::HashMap;
use std::sync::Arc;

use battery_api_machinery::params::decode_query;
use battery_api_machinery::status::ApiError;
use battery_types::channel::Protocol;
use serde::Deserialize;

pub use portforward::ClaimPortForward;
pub use sessions::{DEFAULT_MAX_SESSIONS, ExecSessions};
pub use target::{ClaimSessions, Target};

use crate::api::{RequestContext, SessionSubresource};
use crate::relay::{AgentRelay, ExecOpen};
use session::{Attached, Session};

/// `PodExecOptions`, as clients put them in the query (kube-rs starts it with `&`), and
/// what flintlock's exec takes besides: `env` (repeated `NAME=VALUE`) and `workingDir`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ExecOptions {
    command: Vec<String>,
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
    container: String,
    env: Vec<String>,
    working_dir: String,
    /// `env` as the variables it sets, read once by `parse`.
    #[serde(skip)]
    variables: HashMap<String, String>,
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
        options.attached().required()?;
        options.variables = options.environment()?;
        Ok(options)
    }

    /// `env` as the variables it sets; a later `NAME=` wins, as in a shell.
    fn environment(&self) -> Result<HashMap<String, String>, ApiError> {
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

/// The `exec` subresource of claims.
pub struct ClaimExec {
    pub claims: Arc<dyn ClaimSessions>,
    /// The live sessions, bounded, ended when their claim loses its lease.
    pub sessions: Arc<ExecSessions>,
    pub relay: Arc<AgentRelay>,
}

impl SessionSubresource for ClaimExec {
    type Options = ExecOptions;
    type Session = Session;

    fn options(query: &str) -> Result<ExecOptions, ApiError> {
        ExecOptions::parse(query)
    }

    /// The session of `options` in the claim `name`, if it may open: under the cap, the
    /// user the claim's Holder, the command started by the Host's agent.
    async fn open(
        &self,
        ctx: &RequestContext,
        name: &str,
        mut options: ExecOptions,
        protocol: Protocol,
    ) -> Result<Session, ApiError> {
        let permit = self.sessions.admit()?;
        let target = self.claims.target(ctx, name, "exec into").await?;
        let command = format!("[{}]", options.command.join(" "));
        let opened = self
            .relay
            .open(
                &target.host,
                &target.agent_address,
                ExecOpen {
                    claim: target.claim.clone(),
                    microvm_uid: target.microvm_uid,
                    command: std::mem::take(&mut options.command),
                    env: super::config::session_env(
                        &target.env,
                        std::mem::take(&mut options.variables),
                    ),
                    working_dir: std::mem::take(&mut options.working_dir),
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
                return Err(self.claims.expired_or(namespace, name, error).await);
            }
            Err(error) => return Err(error),
        };
        Ok(Session {
            protocol,
            attached: options.attached(),
            tty: options.tty,
            command,
            relay,
            guard: self.sessions.register(&target.claim.uid, permit),
        })
    }
}

#[cfg(test)]
mod tests;
