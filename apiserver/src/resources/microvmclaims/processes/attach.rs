//! `microvmprocesses/<name>/attach`: the process's output from its start (what its agent
//! retained) and then live, and its end, on kube's channel protocol as `pods/attach`
//! serves a container's; stdin when it was started with it. Leaving ends the attach,
//! not the process. Only its claim's Holder may; it counts against the exec session cap
//! and ends when its claim does.

use std::sync::Arc;

use battery_api_machinery::params::decode_query;
use battery_api_machinery::status::ApiError;
use battery_types::channel::Protocol;
use serde::Deserialize;

use super::storage::ProcessStorage;
use crate::api::{RequestContext, SessionSubresource};
use crate::resources::microvmclaims::exec::ExecSessions;
use crate::resources::microvmclaims::exec::session::{Attached, Session};

/// `PodAttachOptions`, as clients put them in the query.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct AttachOptions {
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
}

impl AttachOptions {
    /// The streams `query` attaches.
    fn parse(query: &str) -> Result<Attached, ApiError> {
        let options: Self = decode_query(query)?;
        if options.tty {
            return Err(ApiError::bad_request(
                "a process has no terminal: attach without tty",
            ));
        }
        Attached {
            stdin: options.stdin,
            stdout: options.stdout,
            stderr: options.stderr,
        }
        .required()
    }
}

/// The `attach` subresource of processes.
pub struct ProcessAttach {
    pub processes: Arc<ProcessStorage>,
    pub sessions: Arc<ExecSessions>,
}

impl SessionSubresource for ProcessAttach {
    type Options = Attached;
    type Session = Session;

    fn options(query: &str) -> Result<Attached, ApiError> {
        AttachOptions::parse(query)
    }

    async fn open(
        &self,
        ctx: &RequestContext,
        name: &str,
        attached: Attached,
        protocol: Protocol,
    ) -> Result<Session, ApiError> {
        let permit = self.sessions.admit()?;
        let namespace = ctx.namespace.as_deref().unwrap_or_default();
        let process = self.processes.one(namespace, name).await?;
        let target = self
            .processes
            .target(ctx, &process, "attach to a process in")
            .await?;
        if attached.stdin && !process.spec.stdin {
            return Err(ApiError::bad_request(format!(
                "process {name} was started without stdin: attach without it, or start one \
                 with spec.stdin"
            )));
        }
        let relay = self
            .processes
            .index
            .relay()
            .attach_process(
                &target.host,
                &target.agent_address,
                (namespace, name),
                [attached.stdin, attached.stdout, attached.stderr],
            )
            .await?;
        Ok(Session {
            protocol,
            attached,
            tty: false,
            command: format!("[{}]", process.spec.command.join(" ")),
            relay,
            guard: self.sessions.register(&target.claim.uid, permit),
        })
    }
}
