//! One function per subcommand; each gives the process's exit code.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use battery_sdk::types::{ClaimPhase, MicroVMClaim};
use battery_sdk::{Claim, Client, ForwardError, PortForward};
use futures::StreamExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;

use crate::cli::{
    ClaimArgs, ClaimRequest, CpArgs, ExecArgs, Location, Mapping, Output, PortForwardArgs, RunArgs,
    claim_name,
};
use crate::failure::{self, Failure};
use crate::progress::Progress;
use crate::session;

/// The client and, for messages, the API server it talks to.
pub struct Context {
    pub client: Client,
    pub server: String,
}

impl Context {
    pub(crate) fn fail(&self, error: &battery_sdk::Error) -> Failure {
        Failure::of(error, &self.server)
    }

    /// Binds a claim as `request` says, with progress while it waits.
    async fn bind(
        &self,
        request: &ClaimRequest,
        name: Option<&str>,
        labels: &[(String, String)],
    ) -> Result<Claim, Failure> {
        let mut builder = self
            .client
            .claim(&request.pool)
            .deadline(request.deadline)
            .labels(labels.iter().cloned());
        if let Some(holder) = &request.holder {
            builder = builder.holder(holder);
        }
        if let Some(name) = name {
            builder = builder.name(name);
        }
        if let Some(timeout) = request.idle_timeout {
            builder = builder.idle_timeout(timeout);
        }
        if let Some(lifetime) = request.max_lifetime {
            builder = builder.max_lifetime(lifetime);
        }
        if request.service_account_token {
            builder = builder.service_account_token();
        }
        if let Some(audience) = &request.token_audience {
            builder = builder.token_audience(audience);
        }
        if let Some(lifetime) = request.token_expiration {
            builder = builder.token_expiration(lifetime);
        }
        let progress = Progress::binding(&request.pool);
        let bound = builder.on_wait(progress.on_wait()).send().await;
        progress.done();
        bound.map_err(|e| self.fail(&e))
    }
}

pub async fn claim(cx: &Context, args: ClaimArgs) -> Result<i32, Failure> {
    let claim = cx
        .bind(&args.request, args.name.as_deref(), &args.labels)
        .await?;
    match args.output {
        None => println!(
            "microvmclaim/{} bound: {}",
            claim.name(),
            placement(claim.object())
        ),
        Some(Output::Name) => println!("microvmclaim/{}", claim.name()),
        Some(Output::Json) => {
            println!("{}", to_text(serde_json::to_string_pretty(claim.object()))?)
        }
        Some(Output::Yaml) => print!("{}", to_text(serde_norway::to_string(claim.object()))?),
    }
    let lease = claim.lease();
    let every = humantime::format_duration(lease.heartbeat_interval.to_std().unwrap_or_default());
    let expiry = humantime::format_duration(lease.expiry_threshold.to_std().unwrap_or_default());
    if !args.hold {
        eprintln!(
            "its lease expires {expiry} after the last renewal: renew it every {every} with \
             `kubectl microvm renew {}`, or claim with --hold",
            claim.name()
        );
        return Ok(0);
    }
    // Listening before saying so: a Ctrl-C right after the line would otherwise end the
    // process with the claim still held until its lease expires.
    let interrupted = session::interrupts()
        .map_err(|e| Failure::new(format!("cannot listen for Ctrl-C: {e}")))?;
    eprintln!("holding it, renewing every {every}; Ctrl-C releases it");
    tokio::select! {
        reason = claim.lost() => Err(Failure::new(format!(
            "microvmclaim/{} is lost: {reason}; claim again", claim.name()
        ))),
        () = interrupted => {
            let name = claim.name().to_owned();
            claim.release().await.map_err(|e| cx.fail(&e))?;
            eprintln!("microvmclaim/{name} released");
            Ok(0)
        }
    }
}

pub async fn exec(cx: &Context, args: ExecArgs) -> Result<i32, Failure> {
    let command = cx.client.command(
        claim_name(&args.claim),
        args.command.command.iter().cloned(),
    );
    session::attach(command, &args.command)
        .await
        .map_err(|e| cx.fail(&e))
}

pub async fn run(cx: &Context, args: RunArgs) -> Result<i32, Failure> {
    let claim = cx.bind(&args.request, None, &[]).await?;
    let command = claim.command(args.command.command.iter().cloned());
    let ended = session::attach(command, &args.command).await;
    // Released whatever happened to the command: nothing is left behind.
    let name = claim.name().to_owned();
    let released = claim.release().await;
    let code = ended.map_err(|e| cx.fail(&e))?;
    released.map_err(|e| {
        Failure::new(format!(
            "the command exited with {code} but releasing microvmclaim/{name} failed: {}; \
             release it with `kubectl microvm release {name}`",
            cx.fail(&e)
        ))
    })?;
    Ok(code)
}

pub async fn cp(cx: &Context, args: CpArgs) -> Result<i32, Failure> {
    let copy = match (Location::parse(&args.src), Location::parse(&args.dst)) {
        (Location::Local(from), Location::Guest { claim, path }) => {
            cx.client.files(claim).upload_path(from, path)
        }
        (Location::Guest { claim, path }, Location::Local(to)) => {
            cx.client.files(claim).download_path(path, to)
        }
        (Location::Local(_), Location::Local(_)) => {
            return Err(Failure::new(
                "neither SRC nor DST names a claim; write one as CLAIM:PATH, as dev-x2:/work",
            ));
        }
        (Location::Guest { .. }, Location::Guest { .. }) => {
            return Err(Failure::new(
                "both SRC and DST name a claim; copy from one to a local path, then to the other",
            ));
        }
    };
    let progress = Progress::copying(&format!("{} -> {}", args.src, args.dst));
    let copied = copy.on_progress(progress.on_copy()).send().await;
    progress.done();
    copied.map(|_| 0).map_err(|e| cx.fail(&e))
}

pub async fn port_forward(cx: &Context, args: PortForwardArgs) -> Result<i32, Failure> {
    // Caught rather than left to kill the process: as kubectl's port-forward, Ctrl-C is
    // how it ends, with 0.
    let interrupted = session::interrupts()
        .map_err(|e| Failure::new(format!("cannot listen for Ctrl-C: {e}")))?;
    tokio::select! {
        failed = forward(cx, &args) => failed,
        () = interrupted => Ok(0),
    }
}

/// Listens on each address for each mapping, says so as kubectl does, then prints each
/// connection that fails; it returns only when it cannot listen or find the claim.
async fn forward(cx: &Context, args: &PortForwardArgs) -> Result<i32, Failure> {
    let claim = claim_name(&args.claim);
    let mut forwards = Vec::new();
    for mapping in &args.ports {
        let mut local_port = mapping.local;
        for &address in &args.addresses {
            let local = SocketAddr::new(address, local_port);
            let forward = cx
                .client
                .port_forward_on(claim, mapping.remote, local)
                .await
                .map_err(|e| cannot_listen(cx, &e, local, mapping))?;
            // As kubectl: a free port, once chosen, is the same on every address.
            local_port = forward.local_addr().port();
            println!(
                "Forwarding from {} -> {}",
                forward.local_addr(),
                mapping.remote
            );
            forwards.push(forward);
        }
    }
    let mut failures = futures::stream::select_all(forwards.iter_mut().map(PortForward::errors));
    while let Some(failed) = failures.next().await {
        eprintln!("error: {}", connection_failure(cx, &failed));
    }
    // Not reached: a forward's failures end only with the forward, which lives here.
    std::future::pending().await
}

fn cannot_listen(
    cx: &Context,
    error: &battery_sdk::Error,
    local: SocketAddr,
    mapping: &Mapping,
) -> Failure {
    match error {
        battery_sdk::Error::Local { source, .. } => Failure::new(format!(
            "cannot listen on {local}: {source}; choose another local port (:{} picks a free \
             one) or --address",
            mapping.remote
        )),
        other => cx.fail(other),
    }
}

/// A failed connection in a line: the server's words for what happened in the MicroVM,
/// ours for a refusal of the SDK's.
fn connection_failure(cx: &Context, failed: &ForwardError) -> String {
    match failed
        .error
        .get_ref()
        .and_then(|e| e.downcast_ref::<battery_sdk::Error>())
    {
        Some(error) => cx.fail(error).to_string(),
        None => failure::chain(&failed.error),
    }
}

pub async fn renew(cx: &Context, claim: &str) -> Result<i32, Failure> {
    let name = claim_name(claim);
    let lease = cx.client.renew(name).await.map_err(|e| cx.fail(&e))?;
    let spec = lease.spec.unwrap_or_default();
    match (spec.renew_time, spec.lease_duration_seconds) {
        (Some(renewed), Some(seconds)) => {
            let expires = renewed.0 + Duration::from_secs(seconds.max(0).unsigned_abs().into());
            println!(
                "microvmclaim/{name} renewed: its lease expires at {expires} (in {})",
                until(expires)
            );
        }
        _ => println!("microvmclaim/{name} renewed"),
    }
    Ok(0)
}

pub async fn release(cx: &Context, claim: &str) -> Result<i32, Failure> {
    let name = claim_name(claim);
    cx.client.release(name).await.map_err(|e| cx.fail(&e))?;
    println!("microvmclaim/{name} released");
    Ok(0)
}

pub async fn list(cx: &Context) -> Result<i32, Failure> {
    let claims = cx.client.list().await.map_err(|e| cx.fail(&e))?;
    if claims.is_empty() {
        eprintln!("No claims in this namespace.");
        return Ok(0);
    }
    let mut rows =
        vec![["NAME", "POOL", "PHASE", "HOST", "HOLDER", "EXPIRES", "AGE"].map(String::from)];
    for claim in &claims {
        let status = claim.status.clone().unwrap_or_default();
        let phase = status.phase.as_ref().map_or("Pending", ClaimPhase::as_str);
        let expires = match (&status.phase, &status.lease_expires_at) {
            (Some(ClaimPhase::Bound), Some(at)) => format!("in {}", until(at.0)),
            _ => "-".to_owned(),
        };
        rows.push([
            claim.metadata.name.clone().unwrap_or_default(),
            claim.spec.pool_ref.name.clone(),
            phase.to_owned(),
            status.host.map_or_else(|| "-".to_owned(), |h| h.node_name),
            claim.spec.service_account_name.clone(),
            expires,
            age_of(&claim.metadata),
        ]);
    }
    print!("{}", table(&rows));
    Ok(0)
}

/// Where the claim's MicroVM is, for the line `claim` prints.
fn placement(claim: &MicroVMClaim) -> String {
    let status = claim.status.clone().unwrap_or_default();
    let vm = status.micro_vm.map_or_else(|| "?".to_owned(), |vm| vm.uid);
    let host = status.host.map_or_else(|| "?".to_owned(), |h| h.node_name);
    format!("MicroVM {vm} on Host {host}")
}

fn to_text<E: std::fmt::Display>(text: Result<String, E>) -> Result<String, Failure> {
    text.map_err(|e| Failure::new(format!("cannot print the claim: {e}")))
}

/// Columns padded as kubectl pads them: three spaces between.
pub(crate) fn table<const N: usize>(rows: &[[String; N]]) -> String {
    let widths: Vec<usize> = (0..N)
        .map(|column| rows.iter().map(|row| row[column].len()).max().unwrap_or(0))
        .collect();
    let mut text = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:width$}"))
            .collect();
        text.push_str(line.join("   ").trim_end());
        text.push('\n');
    }
    text
}

/// The time until `at`, rounded to the second (zero when past).
fn until(at: Timestamp) -> String {
    let now = Timestamp::try_from(SystemTime::now()).unwrap_or(at);
    let seconds = (at.as_second() - now.as_second()).max(0);
    humantime::format_duration(Duration::from_secs(seconds.unsigned_abs())).to_string()
}

/// An object's age, as the AGE column shows it; `-` when it has no creation time.
pub(crate) fn age_of(metadata: &ObjectMeta) -> String {
    metadata
        .creation_timestamp
        .as_ref()
        .map_or_else(|| "-".to_owned(), |t| age(t.0))
}

/// An age as kubectl shows it: `45s`, `12m`, `5h`, `3d`.
fn age(since: Timestamp) -> String {
    let now = Timestamp::try_from(SystemTime::now()).unwrap_or(since);
    let seconds = (now.as_second() - since.as_second()).max(0);
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 120 * 60 => format!("{}m", s / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_padded_like_kubectls() {
        let rows = [
            ["NAME", "PHASE"].map(String::from),
            ["dev-x2", "Bound"].map(String::from),
        ];
        assert_eq!(table(&rows), "NAME     PHASE\ndev-x2   Bound\n");
    }

    #[test]
    fn ages_are_short() {
        let now = Timestamp::now();
        assert_eq!(age(now - Duration::from_secs(30)), "30s");
        assert_eq!(age(now - Duration::from_secs(600)), "10m");
        assert_eq!(age(now - Duration::from_secs(5 * 3600)), "5h");
        assert_eq!(age(now - Duration::from_secs(3 * 86400)), "3d");
    }
}
