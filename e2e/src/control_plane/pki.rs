//! The control plane's certificates and the admin's kubeconfig, made with rcgen: the
//! files and flags a kubeadm cluster has.
//!
//! - `ca`: kube-apiserver's serving certificate and every client certificate (the admin,
//!   test users, agents), as kubeadm's cluster CA;
//! - `front-proxy-ca`: the one client certificate the aggregator presents to aggregated
//!   servers (`front-proxy-client`), a CA apart as Kubernetes advises;
//! - `sa.key`: signs ServiceAccount tokens (`sa.pub` verifies them).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use rcgen::{KeyPair, KeyUsagePurpose, SanType};

use crate::pki::{Ca, KeyedCert, Validity, write_file};

/// The CN of the front-proxy client certificate, as kubeadm names it; kube-apiserver's
/// `--requestheader-allowed-names` lists only it.
pub const FRONT_PROXY_CN: &str = "front-proxy-client";
/// The admin's user and group: `system:masters` may do everything, whatever RBAC says.
const ADMIN: (&str, &str) = ("kubernetes-admin", "system:masters");

/// The files of one control plane's PKI, in one directory.
pub struct ClusterPki {
    dir: PathBuf,
    url: String,
}

impl ClusterPki {
    /// Makes the CAs, the certificates and the admin's kubeconfig for kube-apiserver at
    /// `url`, in `dir`.
    pub fn write(dir: &Path, url: &str) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let pki = Self {
            dir: dir.to_owned(),
            url: url.to_owned(),
        };
        let ca = Ca::new("e2e cluster CA")?;
        ca.write(&pki.file("ca.crt"), &pki.file("ca.key"))?;
        let mut serving = battery_apiserver::dev::pki::loopback_serving_params("kube-apiserver")?;
        // The first address of the Service CIDR: the `kubernetes` Service's ClusterIP.
        serving
            .subject_alt_names
            .push(SanType::IpAddress([10, 0, 0, 1].into()));
        serving.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        ca.sign(serving, "kube-apiserver")?
            .write(&pki.file("apiserver.crt"), &pki.file("apiserver.key"))?;
        ca.client(ADMIN.0, &[ADMIN.1], Validity::Current)?
            .write(&pki.file("admin.crt"), &pki.file("admin.key"))?;

        let front_proxy = Ca::new("e2e front-proxy CA")?;
        let (cert, key) = pki.front_proxy_ca();
        front_proxy.write(&cert, &key)?;
        let (cert, key) = pki.front_proxy_client();
        front_proxy
            .client(FRONT_PROXY_CN, &[], Validity::Current)?
            .write(&cert, &key)?;

        let service_accounts = KeyPair::generate().context("generating the ServiceAccount key")?;
        write_file(
            &pki.file("sa.key"),
            service_accounts.serialize_pem().as_bytes(),
            true,
        )?;
        // kube-apiserver reads the verifying key as a public key (not PKCS#8).
        write_file(
            &pki.file("sa.pub"),
            service_accounts.public_key_pem().as_bytes(),
            false,
        )?;

        let (cert, key) = pki.admin_certificate();
        pki.write_kubeconfig(
            &pki.admin_kubeconfig(),
            serde_json::json!({"client-certificate": cert, "client-key": key}),
            "default",
        )?;
        Ok(pki)
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The cluster CA: it signs kube-apiserver's serving certificate (so clients trust
    /// it) and the client certificates kube-apiserver accepts.
    pub fn ca(&self) -> PathBuf {
        self.file("ca.crt")
    }

    /// The front-proxy CA's certificate (kube-apiserver's `--requestheader-client-ca-file`,
    /// which it publishes in the ConfigMap `kube-system/extension-apiserver-authentication`)
    /// and key, to sign certificates an aggregated server must refuse.
    pub fn front_proxy_ca(&self) -> (PathBuf, PathBuf) {
        (
            self.file("front-proxy-ca.crt"),
            self.file("front-proxy-ca.key"),
        )
    }

    /// The certificate and key kube-apiserver's aggregator presents to aggregated servers
    /// (`--proxy-client-cert-file`, `--proxy-client-key-file`).
    pub fn front_proxy_client(&self) -> (PathBuf, PathBuf) {
        (
            self.file("front-proxy-client.crt"),
            self.file("front-proxy-client.key"),
        )
    }

    /// Starts rotating the front-proxy CA as an operator must for no request to fail.
    /// kube-apiserver reloads its front-proxy files when they change and publishes the CA
    /// in the ConfigMap `kube-system/extension-apiserver-authentication`, which aggregated
    /// servers (ours) follow; so they must trust the new CA before kube-apiserver presents
    /// a certificate of it. The steps, the later two on the rotation returned:
    ///
    /// 1. here: a new CA, trusted beside the old one (the CA file holds both), and a client
    ///    certificate of it beside the one in use (`next_client`); then wait until the
    ///    ConfigMap names both and the aggregated servers took it;
    /// 2. `switch_client`: kube-apiserver presents the new certificate;
    /// 3. `drop_old_ca`: the CA file holds the new CA alone.
    ///
    /// kube-apiserver only ever adds to the ConfigMap (it merges its CAs into what is
    /// there), so the old CA leaves it, and aggregated servers stop trusting it, only once
    /// the ConfigMap is deleted and kube-apiserver writes it again.
    pub fn rotate_front_proxy(&self) -> Result<FrontProxyRotation<'_>> {
        let rotation = FrontProxyRotation {
            pki: self,
            ca: Ca::new("e2e front-proxy CA (rotated)")?,
        };
        let (cert, key) = rotation.next_client();
        rotation
            .ca
            .client(FRONT_PROXY_CN, &[], Validity::Current)?
            .write(&cert, &key)?;
        let (ca, _) = self.front_proxy_ca();
        let old =
            std::fs::read_to_string(&ca).with_context(|| format!("reading {}", ca.display()))?;
        let both = format!("{}\n{}", old.trim_end(), rotation.ca.pem());
        write_file(&ca, both.as_bytes(), false)?;
        Ok(rotation)
    }

    fn admin_certificate(&self) -> (PathBuf, PathBuf) {
        (self.file("admin.crt"), self.file("admin.key"))
    }

    /// The admin's kubeconfig.
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.file("admin.kubeconfig")
    }

    /// A client certificate for the user `cn` in `groups` (at most two), signed by the
    /// cluster CA, written into the PKI's directory as `<file>.crt/.key`.
    pub fn client_certificate(&self, file: &str, cn: &str, groups: &[&str]) -> (PathBuf, PathBuf) {
        let (cert, key) = (
            self.file(&format!("{file}.crt")),
            self.file(&format!("{file}.key")),
        );
        Ca::load(&self.ca(), &self.file("ca.key"))
            .and_then(|ca| ca.client(cn, groups, Validity::Current))
            .and_then(|pair: KeyedCert| pair.write(&cert, &key))
            .unwrap_or_else(|e| panic!("a client certificate for {cn}: {e:#}"));
        (cert, key)
    }

    /// A kubeconfig (JSON, which is YAML too) for `user` (kubeconfig `user` fields) of
    /// this cluster, in `namespace`.
    pub fn write_kubeconfig(
        &self,
        path: &Path,
        user: serde_json::Value,
        namespace: &str,
    ) -> Result<()> {
        let config = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "e2e", "cluster": {"server": self.url, "certificate-authority": self.ca()}}],
            "users": [{"name": "user", "user": user}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "user", "namespace": namespace}}],
            "current-context": "e2e",
        });
        write_file(
            path,
            serde_json::to_string_pretty(&config)?.as_bytes(),
            true,
        )
    }

    /// kube-apiserver's flags for these files: serving, client CA, the front proxy (the
    /// `--requestheader-*` flags and its client certificate) and ServiceAccount tokens.
    pub fn apiserver_args(&self) -> Vec<std::ffi::OsString> {
        let file = |name: &str| self.file(name).into_os_string();
        let mut args: Vec<std::ffi::OsString> = Vec::new();
        let mut flag = |name: &str, value: std::ffi::OsString| {
            args.push(format!("--{name}").into());
            args.push(value);
        };
        flag("tls-cert-file", file("apiserver.crt"));
        flag("tls-private-key-file", file("apiserver.key"));
        flag("client-ca-file", file("ca.crt"));
        flag("requestheader-client-ca-file", file("front-proxy-ca.crt"));
        flag("requestheader-allowed-names", FRONT_PROXY_CN.into());
        flag("requestheader-username-headers", "X-Remote-User".into());
        flag("requestheader-uid-headers", "X-Remote-Uid".into());
        flag("requestheader-group-headers", "X-Remote-Group".into());
        flag(
            "requestheader-extra-headers-prefix",
            "X-Remote-Extra-".into(),
        );
        flag("proxy-client-cert-file", file("front-proxy-client.crt"));
        flag("proxy-client-key-file", file("front-proxy-client.key"));
        flag("service-account-key-file", file("sa.pub"));
        flag("service-account-signing-key-file", file("sa.key"));
        args
    }

    /// kube-controller-manager's flags for these files: it signs nothing but needs the
    /// ServiceAccount key and the CA it puts in `kube-root-ca.crt`.
    pub fn controller_manager_args(&self) -> Vec<std::ffi::OsString> {
        vec![
            "--service-account-private-key-file".into(),
            self.file("sa.key").into_os_string(),
            "--root-ca-file".into(),
            self.ca().into_os_string(),
        ]
    }
}

/// A rotation of the front-proxy CA under way, begun by [`ClusterPki::rotate_front_proxy`].
pub struct FrontProxyRotation<'a> {
    pki: &'a ClusterPki,
    ca: Ca,
}

impl FrontProxyRotation<'_> {
    /// The new CA, PEM.
    pub fn ca_pem(&self) -> &str {
        self.ca.pem()
    }

    /// The new CA's client certificate and key, until [`Self::switch_client`] moves them
    /// into kube-apiserver's files.
    pub fn next_client(&self) -> (PathBuf, PathBuf) {
        (
            self.pki.file("front-proxy-client.next.crt"),
            self.pki.file("front-proxy-client.next.key"),
        )
    }

    /// Makes kube-apiserver present the new CA's certificate: each file is replaced whole
    /// (a rename), and kube-apiserver keeps the old pair until the two match again.
    pub fn switch_client(&self) -> Result<()> {
        let (next_cert, next_key) = self.next_client();
        let (cert, key) = self.pki.front_proxy_client();
        for (from, to) in [(next_cert, cert), (next_key, key)] {
            std::fs::rename(&from, &to)
                .with_context(|| format!("renaming {} to {}", from.display(), to.display()))?;
        }
        Ok(())
    }

    /// Leaves the new CA alone in kube-apiserver's CA file (and its key beside it).
    pub fn drop_old_ca(&self) -> Result<()> {
        let (cert, key) = self.pki.front_proxy_ca();
        self.ca.write(&cert, &key)
    }
}
