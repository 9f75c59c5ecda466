//! A connection's client certificate chain, and what it proves under a trust.
//!
//! A TLS connection presents one chain for its whole life, so the verdict on it (does it
//! chain to the requestheader CA with an allowed CN; to the client CA, and naming whom)
//! is reached once per connection and trust, not per request (ADR 0028). It is reached
//! again when the trust is swapped (a rotated CA) or once a certificate of the chain
//! expires, so every request still gets the answer a fresh verification would give.

use std::sync::{Arc, Mutex, PoisonError, Weak};

use rustls::pki_types::{CertificateDer, UnixTime};

use super::trust::Trust;
use super::x509::{self, user_from_certificate};
use crate::auth::UserInfo;

/// The client certificate chain a connection presented, whose key the client proved it
/// holds (leaf first). Every request on that connection carries it as an extension.
#[derive(Clone, Debug)]
pub struct PeerCertificates {
    chain: Arc<[CertificateDer<'static>]>,
    /// The last verdict, shared by the connection's requests.
    verdict: Arc<Mutex<Option<Arc<Verdict>>>>,
}

/// What a chain proves under one trust, until `until`.
#[derive(Debug)]
pub(super) struct Verdict {
    /// The trust it was reached under; held weakly, so a swapped trust is freed, and
    /// its address cannot be reused while this is held.
    trust: Weak<Trust>,
    /// The first moment a certificate of the chain is expired.
    until: Option<UnixTime>,
    /// `None` without a front proxy; else whether the chain is one allowed to speak for
    /// others.
    pub front_proxy: Option<Result<(), String>>,
    /// `None` without a client CA; else the user the chain names, if it names one.
    pub client: Option<Result<Option<UserInfo>, String>>,
}

impl PeerCertificates {
    pub fn new(chain: &[CertificateDer<'static>]) -> Self {
        Self {
            chain: chain.into(),
            verdict: Arc::default(),
        }
    }

    /// What the chain proves under `trust` now: the cached verdict while it still holds.
    pub(super) fn verdict(&self, trust: &Arc<Trust>, now: UnixTime) -> Arc<Verdict> {
        let mut cached = self.verdict.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(verdict) = cached.as_ref().filter(|v| v.holds(trust, now)) {
            return verdict.clone();
        }
        let verdict = Arc::new(Verdict::reach(trust, &self.chain, now));
        *cached = Some(verdict.clone());
        verdict
    }
}

impl Verdict {
    fn reach(trust: &Arc<Trust>, chain: &[CertificateDer<'static>], now: UnixTime) -> Self {
        // No certificate proves nothing and refutes nothing: the request is judged by its
        // other credentials.
        let judged = !chain.is_empty();
        let front_proxy = (trust.front_proxy.as_ref())
            .filter(|_| judged)
            .map(|front| front.vouches(chain, now));
        let client = (trust.client_ca.as_ref())
            .filter(|_| judged)
            .map(|client_ca| {
                x509::verify(client_ca, chain, now)
                    .map(|()| chain.first().and_then(|leaf| user_from_certificate(leaf)))
                    .map_err(|why| format!("client certificate: {why}"))
            });
        Self {
            trust: Arc::downgrade(trust),
            until: x509::expiry(chain),
            front_proxy,
            client,
        }
    }

    fn holds(&self, trust: &Arc<Trust>, now: UnixTime) -> bool {
        std::ptr::eq(self.trust.as_ptr(), Arc::as_ptr(trust))
            && self.until.is_some_and(|until| now < until)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rustls::pki_types::pem::PemObject as _;

    use super::*;
    use crate::dev::pki::{ca_params, client_params, self_signed_ca, sign};
    use crate::http::authn::TrustConfig;

    /// A CA's PEM, a client certificate it signed for `alice`, and the second that
    /// certificate's notAfter names.
    fn ca_and_client() -> (String, CertificateDer<'static>, u64) {
        let (ca_pem, _, ca) = self_signed_ca(ca_params("a test CA")).unwrap();
        let mut params = client_params("alice", &["team"]).unwrap();
        params.not_after = rcgen::date_time_ymd(2099, 1, 1);
        let not_after = u64::try_from(params.not_after.unix_timestamp()).unwrap();
        let (cert, _) = sign("client", params, &ca).unwrap();
        let leaf = CertificateDer::from_pem_slice(cert.as_bytes()).unwrap();
        (ca_pem, leaf, not_after)
    }

    fn trusting(ca_pem: &str) -> Arc<Trust> {
        Arc::new(
            Trust::new(&TrustConfig {
                client_ca: Some(ca_pem.as_bytes().to_vec()),
                request_header: None,
            })
            .unwrap(),
        )
    }

    fn at(seconds: u64) -> UnixTime {
        UnixTime::since_unix_epoch(Duration::from_secs(seconds))
    }

    fn user(verdict: &Verdict) -> Result<Option<String>, String> {
        let client = verdict.client.clone().expect("a client CA is trusted");
        client.map(|user| user.map(|user| user.name))
    }

    #[test]
    fn a_chain_is_verified_once_per_trust_until_it_expires() {
        let (ca_pem, leaf, not_after) = ca_and_client();
        let peer = PeerCertificates::new(&[leaf]);
        let trust = trusting(&ca_pem);

        let first = peer.verdict(&trust, at(not_after - 3600));
        assert_eq!(user(&first), Ok(Some("alice".to_owned())));
        let again = peer.verdict(&trust, at(not_after - 60));
        assert!(Arc::ptr_eq(&first, &again), "reused");
        // webpki accepts it through its notAfter second; the verdict holds as long.
        assert!(Arc::ptr_eq(&first, &peer.verdict(&trust, at(not_after))));

        // Past notAfter it is judged again, and refused as expired.
        let expired = peer.verdict(&trust, at(not_after + 1));
        assert!(!Arc::ptr_eq(&first, &expired));
        let refused = user(&expired).unwrap_err();
        assert!(refused.contains("expired"), "{refused}");
    }

    #[test]
    fn a_swapped_trust_judges_the_chain_again() {
        let (ca_pem, leaf, _) = ca_and_client();
        let peer = PeerCertificates::new(&[leaf]);
        let now = UnixTime::now();
        let trusted = trusting(&ca_pem);
        assert_eq!(
            user(&peer.verdict(&trusted, now)),
            Ok(Some("alice".to_owned()))
        );

        // The client CA rotated: the same connection's chain no longer names anyone.
        let (rotated_pem, _, _) = ca_and_client();
        let refused = user(&peer.verdict(&trusting(&rotated_pem), now)).unwrap_err();
        assert!(refused.starts_with("client certificate: "), "{refused}");
        // Back under the first CA it is a new trust: judged again, not remembered.
        let back = trusting(&ca_pem);
        assert_eq!(
            user(&peer.verdict(&back, now)),
            Ok(Some("alice".to_owned()))
        );
    }

    #[test]
    fn no_certificate_is_judged_by_the_other_credentials() {
        let (ca_pem, _, _) = ca_and_client();
        let verdict = PeerCertificates::new(&[]).verdict(&trusting(&ca_pem), UnixTime::now());
        assert!(verdict.client.is_none() && verdict.front_proxy.is_none());
    }
}
