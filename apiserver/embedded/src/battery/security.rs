//! How the gRPC port is secured, as poolmgrd's `api_server` settings do it
//! (`docs/reference/battery-behaviour.md`, "Transport and auth"): TLS with a serving
//! certificate unless plaintext is asked for, client certificates required when a client
//! CA is given (`validate_client`), and a basic-auth token checked before every call,
//! health and reflection included.

use std::fmt;
use std::sync::Arc;

use battery_proto::poolmgr::basic_auth;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use tonic::{Request, Status};

/// The gRPC port's security. The default is plaintext without a token, which poolmgrd
/// serves only when told `tls.insecure`; `battery-apiserver embedded-battery` asks for it
/// with `--insecure` likewise.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ApiSecurity {
    /// Serve TLS; `None` serves plaintext.
    pub tls: Option<ServerTls>,
    /// `basic_auth_token`: every call must carry it.
    pub basic_auth_token: Option<String>,
}

/// A serving certificate, and the CA client certificates must chain to, if any.
#[derive(Clone, PartialEq, Eq)]
pub struct ServerTls {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    /// With it, a client without a certificate this CA signed is refused in the
    /// handshake (`validate_client` with `client_ca_file`).
    pub client_ca_pem: Option<Vec<u8>>,
}

impl fmt::Debug for ApiSecurity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiSecurity")
            .field("tls", &self.tls.as_ref().map(|t| t.client_ca_pem.is_some()))
            .field(
                "basic_auth_token",
                &self.basic_auth_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

impl ApiSecurity {
    /// The token a token file's `text` holds, as poolmgrd reads its `basic_auth_token`
    /// file: the text without a trailing newline; `None` when nothing else is there.
    pub fn token_in(text: &str) -> Option<&str> {
        basic_auth::token_in(text)
    }

    /// The server's TLS, when it serves TLS.
    pub(crate) fn server_tls(&self) -> Option<ServerTlsConfig> {
        let tls = self.tls.as_ref()?;
        let config =
            ServerTlsConfig::new().identity(Identity::from_pem(&tls.cert_pem, &tls.key_pem));
        Some(match &tls.client_ca_pem {
            Some(ca) => config.client_ca_root(Certificate::from_pem(ca)),
            None => config,
        })
    }

    /// The check run before every call: passes everything without a token.
    pub(crate) fn token_check(&self) -> TokenCheck {
        TokenCheck {
            expected: self
                .basic_auth_token
                .as_deref()
                .map(|token| Arc::from(basic_auth::encoded(token))),
        }
    }
}

/// Refuses a call without the token, UNAUTHENTICATED, with poolmgrd's two answers: one
/// when the header is missing or not the Basic scheme, another when it names a different
/// token.
#[derive(Clone)]
pub(crate) struct TokenCheck {
    expected: Option<Arc<str>>,
}

impl tonic::service::Interceptor for TokenCheck {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(expected) = &self.expected else {
            return Ok(request);
        };
        let supplied = request
            .metadata()
            .get(basic_auth::METADATA_KEY)
            .and_then(|value| value.to_str().ok())
            .and_then(basic_auth::credentials)
            .ok_or_else(|| Status::unauthenticated("missing or malformed authorization header"))?;
        if constant_time_eq(supplied.as_bytes(), expected.as_bytes()) {
            Ok(request)
        } else {
            Err(Status::unauthenticated("invalid auth token"))
        }
    }
}

/// Compares without stopping at the first difference, so the time taken does not tell
/// how much of a guess was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::service::Interceptor as _;

    fn with_header(value: Option<&str>) -> Request<()> {
        let mut request = Request::new(());
        if let Some(value) = value {
            request
                .metadata_mut()
                .insert(basic_auth::METADATA_KEY, value.parse().unwrap());
        }
        request
    }

    #[test]
    fn the_token_is_checked_as_poolmgrd_checks_it() {
        let security = ApiSecurity {
            basic_auth_token: Some("s3cret".into()),
            ..ApiSecurity::default()
        };
        let mut check = security.token_check();
        let good = basic_auth::header_value("s3cret");
        assert!(check.call(with_header(Some(&good))).is_ok());
        // The scheme's case does not matter.
        let lower = good.replacen("Basic", "basic", 1);
        assert!(check.call(with_header(Some(&lower))).is_ok());
        for refused in [
            None,
            Some("Bearer czNjcmV0"),
            Some("Basic"),
            Some(basic_auth::header_value("s3cre").as_str()),
            Some(basic_auth::header_value("s3cret\n").as_str()),
        ] {
            let status = check.call(with_header(refused)).unwrap_err();
            assert_eq!(status.code(), tonic::Code::Unauthenticated, "{refused:?}");
            assert!(!status.message().contains("czNjcmV0"), "{status:?}");
        }
    }

    #[test]
    fn without_a_token_every_call_passes() {
        let mut check = ApiSecurity::default().token_check();
        assert!(check.call(with_header(None)).is_ok());
    }

    #[test]
    fn the_token_never_prints() {
        let security = ApiSecurity {
            basic_auth_token: Some("s3cret".into()),
            ..ApiSecurity::default()
        };
        assert!(!format!("{security:?}").contains("s3cret"));
    }
}
