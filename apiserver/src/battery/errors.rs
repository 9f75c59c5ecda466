//! What battery answered when it did not do what was asked, in our terms: the one place
//! gRPC status codes are read (`reference/battery-api.md` §3 lists which RPC answers which
//! code), and the one place they become Kubernetes `Status` errors.
//!
//! The rest of the server matches [`Failure`], never a gRPC code, and asks
//! [`BatteryError::is_definitive`] whether battery may have done the call anyway: the
//! question that decides whether a bind's lease, a claim's lease or a pool may be
//! forgotten.

use std::fmt;

use battery_api_machinery::status::{ApiError, Reason};
use battery_types::ResourceInfo;
use battery_types::validation::FieldError;
use tonic::Code;

use crate::metrics::BatteryOutcome;

/// How long a client should wait before retrying when battery is unavailable or has no
/// MicroVM to hand out.
pub const RETRY_AFTER_SECONDS: u32 = 1;

/// battery's RPCs, as named in its protos (and in metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rpc {
    CreatePool,
    UpdatePool,
    DeletePool,
    GetPool,
    ListPools,
    ClaimVm,
    Heartbeat,
    ReleaseVm,
    ListLeases,
    Subscribe,
    ListHosts,
    GetHost,
    AddHost,
    UpdateHost,
    RemoveHost,
    CordonHost,
    UncordonHost,
    HealthCheck,
}

impl Rpc {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CreatePool => "CreatePool",
            Self::UpdatePool => "UpdatePool",
            Self::DeletePool => "DeletePool",
            Self::GetPool => "GetPool",
            Self::ListPools => "ListPools",
            Self::ClaimVm => "ClaimVM",
            Self::Heartbeat => "Heartbeat",
            Self::ReleaseVm => "ReleaseVM",
            Self::ListLeases => "ListLeases",
            Self::Subscribe => "Subscribe",
            Self::ListHosts => "ListHosts",
            Self::GetHost => "GetHost",
            Self::AddHost => "AddHost",
            Self::UpdateHost => "UpdateHost",
            Self::RemoveHost => "RemoveHost",
            Self::CordonHost => "CordonHost",
            Self::UncordonHost => "UncordonHost",
            Self::HealthCheck => "Check",
        }
    }
}

/// What went wrong, as battery's semantics for the RPC give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The pool, lease or host named does not exist (any more).
    NotFound,
    /// CreatePool or AddHost of a name battery already has.
    AlreadyExists,
    /// ClaimVM: the pool has no AVAILABLE MicroVM.
    Exhausted,
    /// ClaimVM: the MicroVM was deleted under the claim, or the lease a replay found is
    /// being released. battery says retry.
    Aborted,
    /// DeletePool: MicroVMs of the pool are still leased.
    PoolHasLeases,
    /// RemoveHost: a pool names the host or MicroVMs remain on it.
    HostInUse,
    /// ClaimVM: a pre-lease hook failed and battery applied the pool's hook-failure policy.
    HookFailed,
    /// battery refused the request as invalid (unknown hosts, static addresses on a pool
    /// of several): its message is meant for the user.
    Invalid,
    /// battery refused because of the state of something else (a host unreachable, too
    /// old or unregistered): its message is meant for the user.
    Precondition,
    /// battery could not be reached, or said it is unavailable.
    Unavailable,
    /// No answer within the call's deadline.
    TimedOut,
    /// The call was cut before an answer arrived.
    Cancelled,
    /// battery refused the API server's credentials.
    Unauthenticated,
    /// battery failed part way (INTERNAL, UNKNOWN) or answered a code its API never gives.
    Failed,
}

/// A failed battery call: what failed, in which RPC. battery's own status stays inside as
/// the source, for the log; it is never shown to a client.
#[derive(Clone)]
pub struct BatteryError {
    rpc: Rpc,
    failure: Failure,
    status: tonic::Status,
}

impl BatteryError {
    /// Reads battery's answer to `rpc`.
    pub(super) fn from_status(rpc: Rpc, status: tonic::Status) -> Self {
        let failure = match (status.code(), rpc) {
            (Code::NotFound, _) => Failure::NotFound,
            (Code::AlreadyExists, _) => Failure::AlreadyExists,
            (Code::ResourceExhausted, _) => Failure::Exhausted,
            (Code::Aborted, _) => Failure::Aborted,
            (Code::FailedPrecondition, Rpc::DeletePool) => Failure::PoolHasLeases,
            (Code::FailedPrecondition, Rpc::RemoveHost) => Failure::HostInUse,
            (Code::FailedPrecondition, _) => Failure::Precondition,
            (Code::InvalidArgument, _) => Failure::Invalid,
            // battery answers every failed pre-lease hook INTERNAL with this prefix (§3.1,
            // §4.3); any other INTERNAL of ClaimVM is a store failure, whose effect is unknown.
            (Code::Internal, Rpc::ClaimVm) if status.message().starts_with("pre-lease hook") => {
                Failure::HookFailed
            }
            (Code::Unavailable, _) => Failure::Unavailable,
            (Code::DeadlineExceeded, _) => Failure::TimedOut,
            (Code::Cancelled, _) => Failure::Cancelled,
            (Code::Unauthenticated | Code::PermissionDenied, _) => Failure::Unauthenticated,
            _ => Failure::Failed,
        };
        Self {
            rpc,
            failure,
            status,
        }
    }

    /// A failure found in battery's answer rather than in its status (a field it must set
    /// was missing).
    pub(super) fn malformed(rpc: Rpc, what: &'static str) -> Self {
        Self {
            rpc,
            failure: Failure::Failed,
            status: tonic::Status::internal(what),
        }
    }

    /// A call whose task ended before battery answered (the runtime stopping): battery
    /// may have done it.
    pub fn interrupted(rpc: Rpc) -> Self {
        Self {
            rpc,
            failure: Failure::Cancelled,
            status: tonic::Status::cancelled("the call's task ended before battery answered"),
        }
    }

    pub fn failure(&self) -> Failure {
        self.failure
    }

    pub fn rpc(&self) -> Rpc {
        self.rpc
    }

    /// Whether battery decided the call by its rules, so what it answered is what
    /// happened: nothing was done beyond what the answer says. Any other answer (no
    /// answer, a timeout, a cut call, a failure part way, refused credentials) leaves open
    /// that battery did the call, or will: whoever holds state about it (a bind's lease, a
    /// claim's lease, a pool being deleted) keeps it and asks again.
    pub fn is_definitive(&self) -> bool {
        match self.failure {
            Failure::NotFound
            | Failure::AlreadyExists
            | Failure::Exhausted
            | Failure::Aborted
            | Failure::PoolHasLeases
            | Failure::HostInUse
            | Failure::HookFailed
            | Failure::Invalid
            | Failure::Precondition => true,
            Failure::Unavailable
            | Failure::TimedOut
            | Failure::Cancelled
            | Failure::Unauthenticated
            | Failure::Failed => false,
        }
    }

    /// The outcome label of this failure in the battery call metrics.
    pub(super) fn outcome(&self) -> BatteryOutcome {
        match self.failure {
            _ if !self.is_definitive() => BatteryOutcome::Ambiguous,
            Failure::NotFound => BatteryOutcome::NotFound,
            Failure::Exhausted => BatteryOutcome::Exhausted,
            Failure::AlreadyExists
            | Failure::Aborted
            | Failure::PoolHasLeases
            | Failure::HostInUse
            | Failure::Precondition => BatteryOutcome::Conflict,
            Failure::Invalid => BatteryOutcome::Invalid,
            _ => BatteryOutcome::Failed,
        }
    }

    /// battery's words when it refused the request as invalid or against the state of
    /// something else: the failures whose message is meant for the user.
    pub fn refusal(&self) -> Option<&str> {
        matches!(self.failure, Failure::Invalid | Failure::Precondition)
            .then(|| self.status.message())
    }

    /// What `/readyz` says of battery when this failed its health check. battery's own
    /// words are included: neither they nor a transport error ever carry the token.
    pub fn unready_reason(&self) -> String {
        match self.failure {
            Failure::Unauthenticated => self.credentials_refused(),
            _ => format!(
                "battery is not serving: {}",
                battery_telemetry::error_chain(self)
            ),
        }
    }

    fn credentials_refused(&self) -> String {
        format!(
            "battery refused the API server's credentials ({}): check --battery-token-file \
             and --battery-client-cert-file against poolmgrd's api_server settings",
            self.status.message()
        )
    }

    /// The error a client sees for this failure of an operation on the object `name` of
    /// `info`. battery's message is shown only where it is meant for the user; the status
    /// goes to the log as the error's source.
    pub fn into_api_error(self, info: &ResourceInfo, name: &str) -> ApiError {
        let error = match self.failure {
            Failure::NotFound => ApiError::not_found(info, name),
            Failure::AlreadyExists => ApiError::already_exists(info, name),
            // battery checks what our validation cannot (hosts, static addresses): report it
            // as the spec being invalid, in battery's words.
            Failure::Invalid => ApiError::invalid(
                info,
                name,
                &[FieldError::invalid(
                    "spec",
                    serde_json::Value::Null,
                    self.refusal().unwrap_or_default(),
                )],
            ),
            Failure::Precondition => {
                ApiError::conflict(info, name, self.refusal().unwrap_or_default())
            }
            Failure::PoolHasLeases => {
                ApiError::conflict(info, name, "MicroVMs of the pool are still leased")
            }
            Failure::HostInUse => ApiError::conflict(
                info,
                name,
                "a Pool still places MicroVMs on the Host, or MicroVMs remain on it",
            ),
            Failure::Aborted => ApiError::conflict(
                info,
                name,
                "battery aborted the operation because a MicroVM changed under it; retry",
            ),
            Failure::Exhausted => ApiError::too_many_requests(
                "battery has no MicroVM available; retry later",
                RETRY_AFTER_SECONDS,
            ),
            Failure::HookFailed => ApiError::new(
                Reason::InternalError,
                "a pre-lease hook of the pool failed in the MicroVM; battery applied the pool's hook failure policy",
            ),
            Failure::Unavailable => ApiError::service_unavailable("battery is unavailable")
                .with_retry_after(RETRY_AFTER_SECONDS),
            Failure::TimedOut => ApiError::timeout("battery did not answer in time"),
            // Not the client's doing, and mended only by an operator's fix of the token or
            // certificate files, which are read again when they change.
            Failure::Unauthenticated => ApiError::service_unavailable(self.credentials_refused())
                .with_retry_after(RETRY_AFTER_SECONDS),
            Failure::Cancelled | Failure::Failed => ApiError::new(
                Reason::InternalError,
                "battery failed to complete the request; the cause is in the API server's log",
            ),
        };
        error.with_source(self)
    }
}

impl fmt::Debug for BatteryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatteryError")
            .field("rpc", &self.rpc)
            .field("failure", &self.failure)
            .field("code", &self.status.code())
            .field("message", &self.status.message())
            .finish()
    }
}

impl fmt::Display for BatteryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "battery's {} answered {:?}: {}",
            self.rpc.as_str(),
            self.status.code(),
            self.status.message()
        )
    }
}

impl std::error::Error for BatteryError {
    /// What tonic knows beneath battery's status: a refused handshake, a closed socket.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use battery_types::{HasResourceInfo, Pool};
    use http::StatusCode;

    fn error(rpc: Rpc, code: Code, message: &str) -> BatteryError {
        BatteryError::from_status(rpc, tonic::Status::new(code, message))
    }

    #[test]
    fn every_code_maps_to_the_status_a_client_expects() {
        let info = &Pool::INFO;
        let cases = [
            (Code::NotFound, StatusCode::NOT_FOUND),
            (Code::AlreadyExists, StatusCode::CONFLICT),
            (Code::InvalidArgument, StatusCode::UNPROCESSABLE_ENTITY),
            (Code::FailedPrecondition, StatusCode::CONFLICT),
            (Code::Aborted, StatusCode::CONFLICT),
            (Code::ResourceExhausted, StatusCode::TOO_MANY_REQUESTS),
            (Code::Unavailable, StatusCode::SERVICE_UNAVAILABLE),
            (Code::DeadlineExceeded, StatusCode::GATEWAY_TIMEOUT),
            (Code::Internal, StatusCode::INTERNAL_SERVER_ERROR),
            (Code::Unauthenticated, StatusCode::SERVICE_UNAVAILABLE),
            (Code::Unknown, StatusCode::INTERNAL_SERVER_ERROR),
            (Code::Cancelled, StatusCode::INTERNAL_SERVER_ERROR),
        ];
        for (code, want) in cases {
            let error = error(Rpc::GetPool, code, "why").into_api_error(info, "p");
            assert_eq!(error.code(), want, "{code:?}");
        }
    }

    #[test]
    fn only_answers_battery_decided_are_definitive() {
        let ambiguous = [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::Cancelled,
            Code::Unknown,
            Code::Internal,
            Code::Unauthenticated,
            Code::DataLoss,
        ];
        for code in ambiguous {
            assert!(
                !error(Rpc::ClaimVm, code, "lost").is_definitive(),
                "{code:?}"
            );
        }
        let decided = [
            Code::NotFound,
            Code::ResourceExhausted,
            Code::Aborted,
            Code::InvalidArgument,
            Code::FailedPrecondition,
        ];
        for code in decided {
            assert!(error(Rpc::ClaimVm, code, "no").is_definitive(), "{code:?}");
        }
        // A failed hook is battery's decision; any other INTERNAL is not.
        let hook = error(
            Rpc::ClaimVm,
            Code::Internal,
            "pre-lease hook: exit status 1",
        );
        assert_eq!(hook.failure(), Failure::HookFailed);
        assert!(hook.is_definitive());
        assert!(!error(Rpc::ClaimVm, Code::Internal, "database is locked").is_definitive());
    }

    #[test]
    fn failed_precondition_reads_by_rpc() {
        let code = Code::FailedPrecondition;
        assert_eq!(
            error(Rpc::DeletePool, code, "").failure(),
            Failure::PoolHasLeases
        );
        assert_eq!(
            error(Rpc::RemoveHost, code, "").failure(),
            Failure::HostInUse
        );
        assert_eq!(
            error(Rpc::AddHost, code, "").failure(),
            Failure::Precondition
        );
    }

    #[test]
    fn not_found_names_our_object_and_retryable_failures_say_when() {
        let info = &Pool::INFO;
        let error_for =
            |code, message| error(Rpc::GetPool, code, message).into_api_error(info, "p");
        assert_eq!(
            error_for(Code::NotFound, "pool default/p not found").message(),
            "pools.battery.liquidmetal-x.dev \"p\" not found"
        );
        let busy = error_for(Code::Unavailable, "connect refused");
        assert_eq!(busy.retry_after_seconds(), Some(RETRY_AFTER_SECONDS));
        let exhausted = error_for(Code::ResourceExhausted, "no vm");
        assert_eq!(exhausted.retry_after_seconds(), Some(RETRY_AFTER_SECONDS));
    }

    #[test]
    fn battery_words_reach_the_client_only_when_meant_for_it() {
        let info = &Pool::INFO;
        let internal = error(
            Rpc::ClaimVm,
            Code::Internal,
            "sqlite: disk I/O error at /var/lib",
        )
        .into_api_error(info, "p");
        assert!(
            !internal.message().contains("sqlite"),
            "{}",
            internal.message()
        );
        let unknown = error(Rpc::GetPool, Code::Unknown, "secret detail").into_api_error(info, "p");
        assert!(
            !unknown.message().contains("secret"),
            "{}",
            unknown.message()
        );
        let unavailable =
            error(Rpc::GetPool, Code::Unavailable, "dns error: 10.0.0.7").into_api_error(info, "p");
        assert!(!unavailable.message().contains("10.0.0.7"));
        let invalid = error(
            Rpc::CreatePool,
            Code::InvalidArgument,
            "unknown hosts [h9]; add them with HostAdmin.AddHost first",
        )
        .into_api_error(info, "p");
        assert!(
            invalid.message().contains("unknown hosts [h9]"),
            "{}",
            invalid.message()
        );
    }
}
