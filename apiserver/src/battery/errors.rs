//! battery's gRPC status codes as Kubernetes `Status` errors: the one place they are
//! mapped (`reference/battery-api.md` §3 lists which RPC answers which code).

use battery_api_machinery::status::{ApiError, Reason};
use battery_types::ResourceInfo;
use battery_types::validation::FieldError;
use tonic::Code;

/// How long a client should wait before retrying when battery is unavailable or has no
/// MicroVM to hand out.
pub const RETRY_AFTER_SECONDS: u32 = 1;

/// The error a client sees when battery answered `status` to an operation on the object
/// `name` of `info`.
pub fn to_api_error(status: tonic::Status, info: &ResourceInfo, name: &str) -> ApiError {
    let message = status.message().to_owned();
    let error = match status.code() {
        Code::NotFound => ApiError::not_found(info, name),
        Code::AlreadyExists => ApiError::already_exists(info, name),
        // battery checks what our validation cannot (hosts, static addresses): report it
        // as the spec being invalid, in battery's words.
        Code::InvalidArgument => ApiError::invalid(
            info,
            name,
            &[FieldError::invalid(
                "spec",
                serde_json::Value::Null,
                message,
            )],
        ),
        Code::FailedPrecondition | Code::Aborted => ApiError::conflict(info, name, message),
        Code::ResourceExhausted => ApiError::too_many_requests(message, RETRY_AFTER_SECONDS),
        Code::Unavailable => {
            ApiError::service_unavailable(format!("battery is unavailable: {message}"))
                .with_retry_after(RETRY_AFTER_SECONDS)
        }
        Code::DeadlineExceeded => {
            ApiError::timeout(format!("battery did not answer in time: {message}"))
        }
        Code::Unauthenticated | Code::PermissionDenied => ApiError::new(
            Reason::InternalError,
            "battery refused the API server's credentials".to_owned(),
        ),
        _ => ApiError::new(Reason::InternalError, format!("battery: {message}")),
    };
    error.with_source(status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use battery_types::{HasResourceInfo, Pool};
    use http::StatusCode;

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
            (Code::Unauthenticated, StatusCode::INTERNAL_SERVER_ERROR),
            (Code::Unknown, StatusCode::INTERNAL_SERVER_ERROR),
        ];
        for (code, want) in cases {
            let error = to_api_error(tonic::Status::new(code, "why"), info, "p");
            assert_eq!(error.code(), want, "{code:?}");
        }
    }

    #[test]
    fn not_found_names_our_object_and_retryable_codes_say_when() {
        let info = &Pool::INFO;
        let error = to_api_error(
            tonic::Status::not_found("pool default/p not found"),
            info,
            "p",
        );
        assert_eq!(
            error.message(),
            "pools.battery.liquidmetal-x.dev \"p\" not found"
        );
        let busy = to_api_error(tonic::Status::unavailable("connect refused"), info, "p");
        assert_eq!(busy.retry_after_seconds(), Some(RETRY_AFTER_SECONDS));
        let exhausted = to_api_error(tonic::Status::resource_exhausted("no vm"), info, "p");
        assert_eq!(exhausted.retry_after_seconds(), Some(RETRY_AFTER_SECONDS));
    }
}
