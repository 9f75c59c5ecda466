//! Authentication from the client certificate the TLS layer verified against the client
//! CA: the certificate's CN is the user and its organizations the groups, as Kubernetes'
//! x509 authenticator reads them (`apiserver:pkg/authentication/request/x509/x509.go`).
//! Everyone else is `system:anonymous`.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::api::UserInfo;
use crate::serve::PeerCertificates;

const AUTHENTICATED: &str = "system:authenticated";

/// The user a verified client certificate names, or `None` if it names none.
pub fn user_from_certificate(der: &[u8]) -> Option<UserInfo> {
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())?
        .to_owned();
    if name.is_empty() {
        return None;
    }
    let mut groups: Vec<String> = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_owned))
        .collect();
    // Every authenticated user is in this group (`authenticated_group_adder.go`).
    if !groups.iter().any(|g| g == AUTHENTICATED) {
        groups.push(AUTHENTICATED.to_owned());
    }
    Some(UserInfo {
        name,
        groups,
        ..UserInfo::default()
    })
}

/// The layer: puts the request's [`UserInfo`] in its extensions.
pub async fn authenticate(mut request: Request, next: Next) -> Response {
    let user = request
        .extensions()
        .get::<PeerCertificates>()
        .and_then(|certs| certs.0.first())
        .and_then(|leaf| user_from_certificate(leaf));
    if let Some(user) = user {
        request.extensions_mut().insert(user);
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dev_certificate_authenticates_as_the_dev_service_account() {
        let dir = tempfile::tempdir().unwrap();
        let pki = crate::dev::pki::write_dev_pki(dir.path()).unwrap();
        let pem = std::fs::read(&pki.client_cert).unwrap();
        let der = x509_parser::pem::parse_x509_pem(&pem).unwrap().1.contents;
        let user = user_from_certificate(&der).unwrap();
        assert_eq!(user.name, crate::dev::pki::DEV_USER);
        assert_eq!(
            user.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:default",
                "system:authenticated"
            ]
        );
    }
}
