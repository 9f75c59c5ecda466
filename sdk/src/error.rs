//! What can go wrong, worded so the caller knows what to do next.

use std::time::Duration;

use kube::core::Status;

/// An error of the SDK. Each variant says what failed; where the server refused, the
/// variant is named for its reason and [`Error::Api`] keeps anything else.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The Pool had no MicroVM free before the claim's deadline; try again after
    /// `retry_after`, or grow the Pool.
    #[error("pool {pool} has no MicroVM available; retry in {retry_after:?} or grow the pool")]
    PoolExhausted {
        /// The Pool claimed from.
        pool: String,
        /// When the server last advised to come back.
        retry_after: Duration,
    },
    /// There is no Pool of that name in the namespace.
    #[error("pool {pool} does not exist in this namespace; create it or claim from another")]
    PoolNotFound {
        /// The Pool claimed from.
        pool: String,
    },
    /// The Pool is being deleted and leases nothing new.
    #[error("pool {pool} is being deleted; claim from another pool")]
    PoolDeleting {
        /// The Pool claimed from.
        pool: String,
    },
    /// There is no claim of that name in the namespace.
    #[error(
        "microvmclaim {name} does not exist in this namespace; list them with `kubectl get microvmclaims`"
    )]
    ClaimNotFound {
        /// The claim asked for.
        name: String,
    },
    /// Only the claim's Holder may renew its lease or exec into it.
    #[error("not the Holder of this claim: {message}")]
    NotHolder {
        /// The server's message, naming the user and the Holder.
        message: String,
    },
    /// The claim's Host is not ready, so its MicroVM cannot be reached now.
    #[error("the claim's Host is not ready: {message}")]
    HostNotReady {
        /// The server's message, saying why.
        message: String,
    },
    /// The claim's lease is over (expired, or the claim was deleted): claim again.
    #[error("the claim's lease is lost: {0}")]
    LeaseLost(LostReason),
    /// No Holder was given and the client's user is not known to be a ServiceAccount of
    /// its namespace.
    #[error("no Holder: the client's user is not a ServiceAccount, so name one with .holder(..)")]
    HolderUnknown,
    /// Another claim of that name exists and is not ours.
    #[error("a claim named {name} already exists and is not this one; choose another name")]
    NameTaken {
        /// The name asked for.
        name: String,
    },
    /// The exec session ended without the command's exit status (the connection broke).
    #[error("the exec session ended without an exit status; the command may still run")]
    ExecIncomplete,
    /// The exec session failed.
    #[error("the exec session failed")]
    Exec(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Reading the command's output failed.
    #[error("reading the command's output failed")]
    Output(#[source] std::io::Error),
    /// The guest lacks a tool that copying files needs.
    #[error(
        "the MicroVM has no {tool}, which copying files needs; install {} in its guest image",
        package_of(tool)
    )]
    GuestToolMissing {
        /// The missing command, as `tar` or `sha256sum`.
        tool: String,
    },
    /// The guest could not write or read the path: full, read-only, missing, not a file.
    #[error("copying {path} failed in the MicroVM: {message}")]
    GuestFailed {
        /// The guest path.
        path: String,
        /// What the guest said (its stderr) and its exit code.
        message: String,
    },
    /// The guest holds something other than what was sent, or sent less than it said:
    /// nothing short is taken for whole.
    #[error("copying {path} was not verified: {message}; copy it again")]
    Unverified {
        /// The guest path.
        path: String,
        /// How the two ends disagree.
        message: String,
    },
    /// Reading or writing on this side of a copy failed.
    #[error("{what} failed")]
    Local {
        /// What was being done, naming the local path.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The server's exec protocol (`v4.channel.k8s.io`) cannot send end of file, which
    /// an upload needs.
    #[error(
        "the API server's exec cannot end stdin (it speaks v4.channel.k8s.io); copying into \
         the MicroVM needs v5.channel.k8s.io"
    )]
    StdinCannotEnd,
    /// Any other failure of the API or the connection.
    #[error("the Kubernetes API call failed")]
    Api(#[source] kube::Error),
}

/// Why a claim's lease is over, as [`crate::Claim::lost`] reports it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LostReason {
    /// battery let the lease expire.
    #[error("the lease expired: {0}")]
    Expired(String),
    /// Someone deleted the claim.
    #[error("the claim was deleted")]
    Deleted,
    /// Renewals kept failing until the lease's expiry passed.
    #[error("renewal kept failing until the lease expired: {0}")]
    RenewalFailing(String),
    /// The claim went unused (no exec, terminal, port-forward or file copy) for its idle
    /// timeout, and its MicroVM went back to the Pool; the server's words.
    #[error("the claim was idle for its idle timeout: {0}")]
    IdleTimeout(String),
    /// The claim reached its maximum lifetime, and its MicroVM went back to the Pool;
    /// the server's words.
    #[error("the claim reached its maximum lifetime: {0}")]
    MaxLifetimeReached(String),
}

/// What to install in a guest image for `tool`.
fn package_of(tool: &str) -> &'static str {
    match tool {
        "tar" => "tar (or busybox)",
        "sh" => "a POSIX shell (dash or busybox)",
        _ => "coreutils (or busybox)",
    }
}

/// The server's Status of a failed call, if it answered one.
pub(crate) fn status(error: &kube::Error) -> Option<&Status> {
    match error {
        kube::Error::Api(status) => Some(status),
        _ => None,
    }
}

/// What a write to an exec session that has ended fails with: its stdin's, and its
/// terminal's resizes.
pub(crate) fn session_ended() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the exec session has ended")
}

/// `Retry-After` as the Status carries it (`details.retryAfterSeconds`).
pub(crate) fn retry_after(status: &Status) -> Option<Duration> {
    status
        .details
        .as_ref()
        .map(|d| d.retry_after_seconds)
        .filter(|s| *s > 0)
        .map(|s| Duration::from_secs(u64::from(s)))
}

impl Error {
    /// Maps a failure of a call on claims to the variant its Status names; `pool` is the
    /// Pool the claim is of, for the Pool's reasons.
    pub(crate) fn from_claims(error: kube::Error, pool: &str) -> Self {
        let Some(status) = self::status(&error) else {
            return Self::Api(error);
        };
        let pool = pool.to_owned();
        let kind = status.details.as_ref().map(|d| d.kind.as_str());
        match (status.code, status.reason.as_str()) {
            (404, "NotFound") if kind == Some("pools") => Self::PoolNotFound { pool },
            (404, "NotFound") if kind == Some("microvmclaims") => Self::ClaimNotFound {
                name: status
                    .details
                    .as_ref()
                    .map(|d| d.name.clone())
                    .unwrap_or_default(),
            },
            (409, "PoolDeleting") => Self::PoolDeleting { pool },
            (403, _) if status.message.contains("only its Holder") => Self::NotHolder {
                message: status.message.clone(),
            },
            (503, _) if status.message.contains("is not ready") => Self::HostNotReady {
                message: status.message.clone(),
            },
            (410, _) => Self::LeaseLost(LostReason::Expired(status.message.clone())),
            (409, _) if status.message.contains("has expired") => {
                Self::LeaseLost(LostReason::Expired(status.message.clone()))
            }
            _ => Self::Api(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::core::response::StatusDetails;

    use super::*;

    fn api(code: u16, reason: &str, message: &str, kind: &str) -> kube::Error {
        kube::Error::Api(Box::new(Status {
            code,
            reason: reason.to_owned(),
            message: message.to_owned(),
            details: Some(StatusDetails {
                name: String::new(),
                group: String::new(),
                kind: kind.to_owned(),
                uid: String::new(),
                causes: Vec::new(),
                retry_after_seconds: 2,
            }),
            ..Status::default()
        }))
    }

    #[test]
    fn statuses_map_to_what_to_do() {
        let mapped = |e| Error::from_claims(e, "p").to_string();
        assert_eq!(
            mapped(api(404, "NotFound", "pools \"p\" not found", "pools")),
            "pool p does not exist in this namespace; create it or claim from another"
        );
        assert_eq!(
            mapped(api(
                409,
                "PoolDeleting",
                "pool default/p is being deleted",
                ""
            )),
            "pool p is being deleted; claim from another pool"
        );
        assert!(matches!(
            Error::from_claims(api(403, "Forbidden", "x: only its Holder y may", ""), "p"),
            Error::NotHolder { .. }
        ));
        assert!(matches!(
            Error::from_claims(
                api(
                    503,
                    "ServiceUnavailable",
                    "its Host h is not ready: KVM",
                    ""
                ),
                "p"
            ),
            Error::HostNotReady { .. }
        ));
        assert!(matches!(
            Error::from_claims(api(410, "Gone", "the lease has expired", ""), "p"),
            Error::LeaseLost(LostReason::Expired(_))
        ));
        // A claim that is not found is not a missing Pool.
        assert!(matches!(
            Error::from_claims(api(404, "NotFound", "not found", "microvmclaims"), "p"),
            Error::ClaimNotFound { .. }
        ));
        assert!(matches!(
            Error::from_claims(api(404, "NotFound", "not found", "hosts"), "p"),
            Error::Api(_)
        ));
    }

    #[test]
    fn retry_after_comes_from_the_status_details() {
        let error = api(429, "TooManyRequests", "retry later", "");
        assert_eq!(
            retry_after(status(&error).unwrap()),
            Some(Duration::from_secs(2))
        );
    }
}
