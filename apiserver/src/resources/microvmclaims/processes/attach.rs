//! `microvmprocesses/<name>/attach`: the process's output from its start (what its agent
//! retained) and then live, and its end, on kube's channel protocol as `pods/attach`
//! serves a container's; stdin when it was started with it. Leaving ends the attach,
//! not the process. Only its claim's Holder may; it counts against the exec session cap
//! and ends when its claim does.

use std::sync::Arc;

use axum::response::Response;
use battery_api_machinery::params::decode_query;
use battery_api_machinery::status::ApiError;
use battery_types::channel::Protocol;
use futures::future::BoxFuture;
use http::request::Parts;
use serde::Deserialize;

use super::storage::ProcessStorage;
use crate::api::connect::websocket;
use crate::api::{Connect, RequestContext};
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

/// The `attach` subresource of processes.
pub struct ProcessAttach {
    pub processes: Arc<ProcessStorage>,
    pub sessions: Arc<ExecSessions>,
}

impl Connect for Arc<ProcessAttach> {
    fn connect(
        &self,
        ctx: RequestContext,
        name: String,
        parts: Parts,
    ) -> BoxFuture<'static, Result<Response, ApiError>> {
        let attach = self.clone();
        Box::pin(async move {
            let options: AttachOptions = decode_query(parts.uri.query().unwrap_or_default())?;
            if options.tty {
                return Err(ApiError::bad_request(
                    "a process has no terminal: attach without tty",
                ));
            }
            if !(options.stdin || options.stdout || options.stderr) {
                return Err(ApiError::bad_request(
                    "you must specify at least 1 of stdin, stdout, stderr",
                ));
            }
            websocket::accept(parts, &Protocol::ALL, |protocol| async move {
                attach.open(&ctx, &name, options, protocol).await
            })
            .await
        })
    }
}

impl ProcessAttach {
    async fn open(
        &self,
        ctx: &RequestContext,
        name: &str,
        options: AttachOptions,
        protocol: Protocol,
    ) -> Result<Session, ApiError> {
        let permit = self.sessions.admit()?;
        let namespace = ctx.namespace.as_deref().unwrap_or_default();
        let process = self.processes.one(namespace, name).await?;
        let target = self
            .processes
            .target(ctx, &process, "attach to a process in")
            .await?;
        if options.stdin && !process.spec.stdin {
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
                [options.stdin, options.stdout, options.stderr],
            )
            .await?;
        Ok(Session {
            protocol,
            attached: Attached {
                stdin: options.stdin,
                stdout: options.stdout,
                stderr: options.stderr,
            },
            tty: false,
            command: format!("[{}]", process.spec.command.join(" ")),
            relay,
            guard: self.sessions.register(&target.claim.uid, permit),
        })
    }
}
