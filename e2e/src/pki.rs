//! Certificates for the tests, made with rcgen: the control plane's CAs and the
//! certificates signed by them ([`crate::control_plane`]), and the certificates the
//! attack table forges (other CAs, expired ones). Also the rustls client configuration
//! the hand-written clients use.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, Result};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A certificate and its key, PEM.
#[derive(Debug, Clone)]
pub struct KeyedCert {
    pub cert: String,
    pub key: String,
}

impl KeyedCert {
    /// Writes both (the key readable by its owner only).
    pub fn write(&self, cert: &Path, key: &Path) -> Result<()> {
        write_file(cert, self.cert.as_bytes(), false)?;
        write_file(key, self.key.as_bytes(), true)
    }
}

/// How long a leaf certificate is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// rcgen's default: from 1975 to 4096.
    Current,
    /// Expired in 2001: for the tests that a stale certificate is refused.
    Expired,
}

/// A CA that signs: made here, or read back from its PEM files.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl Ca {
    /// A new self-signed CA named `cn`.
    pub fn new(cn: &str) -> Result<Self> {
        let key = KeyPair::generate().context("generating a CA key")?;
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let pem = params
            .self_signed(&key)
            .with_context(|| format!("signing the CA {cn}"))?
            .pem();
        Ok(Self {
            issuer: Issuer::new(params, key),
            pem,
        })
    }

    /// A CA from its certificate and key files.
    pub fn load(cert: &Path, key: &Path) -> Result<Self> {
        let pem = read(cert)?;
        let key = KeyPair::from_pem(&read(key)?)
            .with_context(|| format!("parsing the key {}", key.display()))?;
        let issuer = Issuer::from_ca_cert_pem(&pem, key)
            .with_context(|| format!("parsing the CA {}", cert.display()))?;
        Ok(Self { issuer, pem })
    }

    pub fn pem(&self) -> &str {
        &self.pem
    }

    pub fn write(&self, cert: &Path, key: &Path) -> Result<()> {
        KeyedCert {
            cert: self.pem.clone(),
            key: self.issuer.key().serialize_pem(),
        }
        .write(cert, key)
    }

    /// A client certificate as Kubernetes reads one: CN the user, O its groups (at most
    /// two, see `client_params`).
    pub fn client(&self, cn: &str, groups: &[&str], validity: Validity) -> Result<KeyedCert> {
        let mut params = battery_apiserver::dev::pki::client_params(cn, groups)
            .with_context(|| format!("a certificate for {cn} in the groups {groups:?}"))?;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        if validity == Validity::Expired {
            params.not_before = rcgen::date_time_ymd(2000, 1, 1);
            params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        }
        self.sign(params, cn)
    }

    pub fn sign(&self, params: CertificateParams, cn: &str) -> Result<KeyedCert> {
        let key = KeyPair::generate().context("generating a key")?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .with_context(|| format!("signing the certificate of {cn}"))?;
        Ok(KeyedCert {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}

/// A rustls client configuration that trusts the CAs in `roots`, presents `identity`
/// (certificate and key files) when given, and offers `alpn`.
pub fn client_config(
    roots: &[&Path],
    identity: Option<(&Path, &Path)>,
    alpn: &[&[u8]],
) -> Result<rustls::ClientConfig> {
    let mut store = rustls::RootCertStore::empty();
    for path in roots {
        for cert in certificates(path)? {
            store
                .add(cert)
                .with_context(|| format!("adding {} to the roots", path.display()))?;
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(store);
    let mut config = match identity {
        Some((cert, key)) => {
            builder.with_client_auth_cert(certificates(cert)?, private_key(key)?)?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// The one crypto provider everything here uses (the workspace's rustls has `ring`).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in a PEM file.
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing {}", path.display()))?;
    anyhow::ensure!(!certs.is_empty(), "{} holds no certificate", path.display());
    Ok(certs)
}

pub fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path)
        .with_context(|| format!("reading the key {}", path.display()))
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// Writes through a temporary file and a rename, so that a reader (battery-apiserver
/// reloading its files, a test) never sees half a file.
pub(crate) fn write_file(path: &Path, contents: &[u8], private: bool) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let temporary = path.with_file_name(format!(".{name}.{}", uuid::Uuid::new_v4().simple()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(&temporary)
        .with_context(|| format!("creating {}", temporary.display()))?;
    file.write_all(contents)
        .with_context(|| format!("writing {}", temporary.display()))?;
    std::fs::rename(&temporary, path)
        .with_context(|| format!("renaming {} to {}", temporary.display(), path.display()))
}

/// A client certificate signed by `ca`, written into `dir` as `<cn>[-expired]-<8 hex>.crt`
/// and `.key` (the CN made file-name safe): for the attack table, with a CA of its own.
pub fn write_client(
    ca: &Ca,
    dir: &Path,
    cn: &str,
    groups: &[&str],
    validity: Validity,
) -> (PathBuf, PathBuf) {
    let stem: String = cn
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let stem = match validity {
        Validity::Current => stem,
        Validity::Expired => format!("{stem}-expired"),
    };
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let cert = dir.join(format!("{stem}-{}.crt", &suffix[..8]));
    let key = cert.with_extension("key");
    ca.client(cn, groups, validity)
        .and_then(|pair| pair.write(&cert, &key))
        .expect("write a client certificate");
    (cert, key)
}
