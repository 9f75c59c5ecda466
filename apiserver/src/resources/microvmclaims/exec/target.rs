//! What exec and port-forward share below them: the one question they ask of the claims
//! before a session opens (may this user act on this claim, and where is its MicroVM;
//! `access.rs` answers it), and its answer, where a claim's session goes.

use std::sync::Arc;

use battery_api_machinery::status::ApiError;
use futures::future::BoxFuture;

use crate::api::RequestContext;
use crate::relay::ClaimRef;
use crate::resources::microvmclaims::config::ClaimEnv;

/// Where a claim's session goes.
pub struct Target {
    pub(in crate::resources::microvmclaims) claim: ClaimRef,
    pub(in crate::resources::microvmclaims) host: String,
    pub(in crate::resources::microvmclaims) agent_address: String,
    pub(in crate::resources::microvmclaims) microvm_uid: String,
    /// The claim's own env, under each session's.
    pub(in crate::resources::microvmclaims) env: Arc<ClaimEnv>,
    /// Whether its lease was taken as live from the record, without asking battery.
    pub(in crate::resources::microvmclaims) followed: bool,
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
