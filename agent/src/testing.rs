//! Certificates for tests of the relay's mTLS (feature `test-util`): one CA per trust
//! domain, and the serving and client certificates it signs. The agent's tests and the
//! API server's exec tests build the same trust domains.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    SanType,
};

/// A signed certificate and its key, both PEM.
pub struct Signed {
    pub cert: String,
    pub key: String,
}

/// A CA, self-signed, that signs the certificates of one trust domain.
pub struct Ca {
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let pem = params.self_signed(&key).expect("CA certificate").pem();
        Self {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate of `params` for `purpose`, with a new key.
    pub fn sign(&self, mut params: CertificateParams, purpose: ExtendedKeyUsagePurpose) -> Signed {
        params.extended_key_usages = vec![purpose];
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("signed");
        Signed {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    /// A serving certificate for `localhost` and 127.0.0.1.
    pub fn loopback_server(&self) -> Signed {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        params
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        self.sign(params, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// An agent's serving certificate for the Host `name`.
    pub fn serving(&self, name: &str) -> Signed {
        let params = CertificateParams::new(vec![name.to_owned()]).expect("params");
        self.sign(params, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate for `cn`.
    pub fn client(&self, cn: &str) -> Signed {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, cn);
        self.sign(params, ExtendedKeyUsagePurpose::ClientAuth)
    }
}
