//! The stand-in's certificates and kubeconfigs, all made with rcgen and kept in one
//! directory, so that a second start (or a test) finds and reuses them.
//!
//! Three CAs, as a kubeadm cluster has them: `serving-ca` (the stand-in's and
//! battery-apiserver's serving certificates; it is the APIService's `caBundle`),
//! `client-ca` (users' client certificates) and `front-proxy-ca` (the one certificate
//! the aggregator presents to aggregated servers). Tests that need certificates of
//! other CAs, or expired ones, make them with [`Ca`] too.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, Result};
use battery_apiserver::serve::RequestClientCertificate;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::ClientCertVerifier;

/// The user of `kubeconfig`: a ServiceAccount, like battery-apiserver dev's user, so the
/// same person may claim with themself as Holder and then exec.
pub const KUBECTL_USER: &str = "system:serviceaccount:default:dev";
/// The groups Kubernetes gives that ServiceAccount (the certificate's organizations).
pub const KUBECTL_GROUPS: &[&str] = &["system:serviceaccounts", "system:serviceaccounts:default"];
/// The user battery-apiserver runs as in a cluster: its ServiceAccount, which the
/// bearer token of `apiserver.kubeconfig` stands for.
pub const APISERVER_USER: &str = "system:serviceaccount:battery-system:battery-apiserver";
/// The CN of the front-proxy client certificate, as kubeadm names it; the ConfigMap's
/// `requestheader-allowed-names` lists only it.
pub const FRONT_PROXY_CN: &str = "front-proxy-client";

/// The names of the files in the stand-in's directory.
#[derive(Debug, Clone)]
pub struct Layout {
    dir: PathBuf,
}

impl Layout {
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_owned(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The CA of both serving certificates (the APIService's `caBundle`).
    pub fn serving_ca(&self) -> PathBuf {
        self.file("serving-ca.crt")
    }
    pub fn serving_ca_key(&self) -> PathBuf {
        self.file("serving-ca.key")
    }
    /// The CA of users' client certificates (`client-ca-file`).
    pub fn client_ca(&self) -> PathBuf {
        self.file("client-ca.crt")
    }
    pub fn client_ca_key(&self) -> PathBuf {
        self.file("client-ca.key")
    }
    /// The CA of the front-proxy client certificate (`requestheader-client-ca-file`).
    pub fn front_proxy_ca(&self) -> PathBuf {
        self.file("front-proxy-ca.crt")
    }
    pub fn front_proxy_ca_key(&self) -> PathBuf {
        self.file("front-proxy-ca.key")
    }
    /// The certificate and key the stand-in presents to the backend.
    pub fn front_proxy_client(&self) -> (PathBuf, PathBuf) {
        (
            self.file("front-proxy-client.crt"),
            self.file("front-proxy-client.key"),
        )
    }
    /// kubectl's client certificate and key.
    pub fn kubectl(&self) -> (PathBuf, PathBuf) {
        (self.file("kubectl.crt"), self.file("kubectl.key"))
    }
    /// battery-apiserver's serving certificate and key.
    pub fn apiserver_serving(&self) -> (PathBuf, PathBuf) {
        (self.file("apiserver.crt"), self.file("apiserver.key"))
    }
    /// The stand-in's own serving certificate and key.
    pub fn stand_in_serving(&self) -> (PathBuf, PathBuf) {
        (self.file("stand-in.crt"), self.file("stand-in.key"))
    }
    /// For kubectl: the kubectl certificate.
    pub fn kubeconfig(&self) -> PathBuf {
        self.file("kubeconfig")
    }
    /// For battery-apiserver's `--kubeconfig`: a bearer token.
    pub fn apiserver_kubeconfig(&self) -> PathBuf {
        self.file("apiserver.kubeconfig")
    }
    /// The default policy, written when `--policy` is not given.
    pub fn policy(&self) -> PathBuf {
        self.file("policy.json")
    }
}

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

    pub fn read(cert: &Path, key: &Path) -> Result<Self> {
        Ok(Self {
            cert: read(cert)?,
            key: read(key)?,
        })
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

    /// The CA in `cert`/`key` when both exist, else a new one written there.
    pub fn load_or_create(cert: &Path, key: &Path, cn: &str) -> Result<Self> {
        if cert.is_file() && key.is_file() {
            return Self::load(cert, key);
        }
        let ca = Self::new(cn)?;
        ca.write(cert, key)?;
        Ok(ca)
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

    /// A serving certificate for loopback: `localhost`, 127.0.0.1 and ::1.
    pub fn serving(&self, cn: &str) -> Result<KeyedCert> {
        let mut params = battery_apiserver::dev::pki::loopback_serving_params(cn)?;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
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

/// Makes every certificate `layout` names that is not there yet; keeps the others.
pub fn ensure(layout: &Layout) -> Result<()> {
    std::fs::create_dir_all(layout.dir())
        .with_context(|| format!("creating {}", layout.dir().display()))?;
    let serving_ca = Ca::load_or_create(
        &layout.serving_ca(),
        &layout.serving_ca_key(),
        "aggregator-stand-in serving CA",
    )?;
    ensure_leaf(layout.stand_in_serving(), || {
        serving_ca.serving("aggregator-stand-in")
    })?;
    ensure_leaf(layout.apiserver_serving(), || {
        serving_ca.serving("battery-apiserver")
    })?;
    let client_ca = Ca::load_or_create(
        &layout.client_ca(),
        &layout.client_ca_key(),
        "aggregator-stand-in client CA",
    )?;
    ensure_leaf(layout.kubectl(), || {
        client_ca.client(KUBECTL_USER, KUBECTL_GROUPS, Validity::Current)
    })?;
    let front_proxy_ca = Ca::load_or_create(
        &layout.front_proxy_ca(),
        &layout.front_proxy_ca_key(),
        "aggregator-stand-in front-proxy CA",
    )?;
    ensure_leaf(layout.front_proxy_client(), || {
        front_proxy_ca.client(FRONT_PROXY_CN, &[], Validity::Current)
    })?;
    Ok(())
}

/// Replaces the front-proxy CA and its client certificate with new ones, as a cluster
/// operator rotating them would. Returns the new CA's PEM.
pub fn rotate_front_proxy(layout: &Layout) -> Result<String> {
    let ca = Ca::new("aggregator-stand-in front-proxy CA (rotated)")?;
    let (cert, key) = layout.front_proxy_client();
    // The client first: a reader that sees the new CA then finds a certificate it signs.
    ca.client(FRONT_PROXY_CN, &[], Validity::Current)?
        .write(&cert, &key)?;
    ca.write(&layout.front_proxy_ca(), &layout.front_proxy_ca_key())?;
    Ok(ca.pem().to_owned())
}

fn ensure_leaf(
    (cert, key): (PathBuf, PathBuf),
    make: impl FnOnce() -> Result<KeyedCert>,
) -> Result<()> {
    if cert.is_file() && key.is_file() {
        return Ok(());
    }
    make()?.write(&cert, &key)
}

/// A kubeconfig (JSON, which is YAML too) for one user of the stand-in at `url`.
pub fn write_kubeconfig(path: &Path, url: &str, ca: &Path, user: serde_json::Value) -> Result<()> {
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "stand-in", "cluster": {"server": url, "certificate-authority": ca}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "user", "namespace": "default"}}],
        "current-context": "stand-in",
    });
    let text = serde_json::to_string_pretty(&config)?;
    write_file(path, text.as_bytes(), true)
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

/// A server configuration with `cert`/`key`, ALPN `h2` and `http/1.1`, that asks for a
/// client certificate and takes any ([`RequestClientCertificate`]: the server decides, in
/// `Front::authenticate`, what a certificate is worth).
pub fn server_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(Arc::new(RequestClientCertificate::default()))
        .with_single_cert(certificates(cert)?, private_key(key)?)
        .with_context(|| format!("the serving certificate {}", cert.display()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// A verifier of client certificates signed by the CAs in `ca`, battery-apiserver's own
/// (the check happens when the caller asks, not in the handshake; see
/// [`RequestClientCertificate`]).
pub fn client_verifier(ca: &Path) -> Result<Arc<dyn ClientCertVerifier>> {
    let pem = std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?;
    Ok(battery_apiserver::http::authn::verifier(
        &pem,
        &ca.display().to_string(),
    )?)
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
