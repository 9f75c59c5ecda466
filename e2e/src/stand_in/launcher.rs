//! [`StandIn`]: the `aggregator-stand-in` binary, started for a test.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::process::Command;

use super::pki::{self, Ca, Layout, Validity};
use super::{FORWARDING_PREFIX, SERVING_PREFIX};
use crate::process::Process;

/// The binary, as cargo names it, and its package.
const BINARY: &str = "aggregator-stand-in";
const PACKAGE: &str = "battery-e2e";

/// A running `aggregator-stand-in`, killed when dropped. Its log is `DIR/stand-in.log`.
pub struct StandIn {
    process: Process,
    url: String,
    layout: Layout,
    policy: PathBuf,
}

impl StandIn {
    /// Starts the stand-in on a free loopback port with its PKI in `dir` (made, or
    /// reused) and `policy` (default: the default policy in `dir/policy.json`). Panics
    /// with its log when it does not serve within a minute.
    pub async fn start(dir: &Path, policy: Option<&Path>) -> Self {
        std::fs::create_dir_all(dir).expect("create the stand-in's directory");
        let mut command = Command::new(binary());
        command
            .arg("--dir")
            .arg(dir)
            .args(["--listen", "127.0.0.1:0"]);
        if let Some(policy) = policy {
            command.arg("--policy").arg(policy);
        }
        let (process, url) =
            Process::start(command, &dir.join("stand-in.log"), SERVING_PREFIX).await;
        let layout = Layout::new(dir);
        Self {
            process,
            url,
            policy: policy.map_or_else(|| layout.policy(), Path::to_owned),
            layout,
        }
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn dir(&self) -> &Path {
        self.layout.dir()
    }

    /// For kubectl: the `system:serviceaccount:default:dev` certificate, namespace `default`.
    pub fn kubeconfig(&self) -> PathBuf {
        self.layout.kubeconfig()
    }

    /// For battery-apiserver's `--kubeconfig`: the bearer token of its ServiceAccount.
    pub fn apiserver_kubeconfig(&self) -> PathBuf {
        self.layout.apiserver_kubeconfig()
    }

    /// battery-apiserver's serving certificate (signed by [`Self::serving_ca`]).
    pub fn apiserver_cert(&self) -> PathBuf {
        self.layout.apiserver_serving().0
    }

    pub fn apiserver_key(&self) -> PathBuf {
        self.layout.apiserver_serving().1
    }

    /// The CA of both serving certificates: the APIService's `caBundle`.
    pub fn serving_ca(&self) -> PathBuf {
        self.layout.serving_ca()
    }

    /// The CA of users' client certificates.
    pub fn client_ca(&self) -> PathBuf {
        self.layout.client_ca()
    }

    /// The front-proxy CA (after a rotation: the new one).
    pub fn front_proxy_ca(&self) -> PathBuf {
        self.layout.front_proxy_ca()
    }

    /// The front-proxy client certificate and key the stand-in forwards with.
    pub fn front_proxy_client(&self) -> (PathBuf, PathBuf) {
        self.layout.front_proxy_client()
    }

    /// The policy file in use; edit it and the stand-in follows.
    pub fn policy_path(&self) -> &Path {
        &self.policy
    }

    /// Rewrites the policy file through `edit` (its JSON); the stand-in follows at once.
    pub fn edit_policy(&self, edit: impl FnOnce(&mut serde_json::Value)) {
        let path = &self.policy;
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let mut policy: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
        edit(&mut policy);
        // The stand-in notices a new modification time or size; make sure one changes
        // even on a file system with coarse timestamps.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let text = serde_json::to_vec_pretty(&policy).expect("a policy serializes");
        std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    /// The file layout of its directory.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Tells it where battery-apiserver is, and waits until it says it forwards there.
    pub async fn set_backend(&self, url: &str) {
        let from = self.process.printed();
        self.process.write_line(url).await;
        let wanted = format!("{FORWARDING_PREFIX}{url}");
        self.process.announced(&wanted, from).await;
    }

    /// A client certificate for `cn` with the organizations `groups`, signed by the
    /// stand-in's client CA, written into its directory: (certificate, key).
    pub fn client_certificate(&self, cn: &str, groups: &[&str]) -> (PathBuf, PathBuf) {
        let ca = Ca::load(&self.layout.client_ca(), &self.layout.client_ca_key())
            .expect("read the stand-in's client CA");
        write_client(&ca, self.dir(), cn, groups, Validity::Current)
    }

    /// Rotates the front-proxy CA and client certificate (`POST /stand-in/rotate-front-proxy`
    /// as the kubectl user) and returns the new ConfigMap.
    pub async fn rotate_front_proxy(&self) -> serde_json::Value {
        let (cert, key) = self.layout.kubectl();
        let config = pki::client_config(&[&self.serving_ca()], Some((&cert, &key)), &[b"http/1.1"])
            .expect("a TLS client for the stand-in");
        let authority = self.url.trim_start_matches("https://").to_owned();
        let tcp = tokio::net::TcpStream::connect(&authority)
            .await
            .expect("connect to the stand-in");
        tcp.set_nodelay(true)
            .expect("TCP_NODELAY on the stand-in connection");
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(
                rustls::pki_types::ServerName::try_from("127.0.0.1").expect("an IP address"),
                tcp,
            )
            .await
            .expect("TLS with the stand-in");
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .expect("HTTP with the stand-in");
        tokio::spawn(connection);
        let request = http::Request::post(super::front::ROTATE_PATH)
            .header(http::header::HOST, authority)
            .body(axum::body::Body::empty())
            .expect("a request");
        let response = sender.send_request(request).await.expect("rotate");
        let status = response.status();
        let body = axum::body::to_bytes(axum::body::Body::new(response.into_body()), usize::MAX)
            .await
            .expect("read the rotated ConfigMap");
        assert_eq!(
            status,
            http::StatusCode::OK,
            "rotate: {}",
            String::from_utf8_lossy(&body)
        );
        serde_json::from_slice(&body).expect("the rotated ConfigMap is JSON")
    }
}

/// A client certificate signed by `ca`, written into `dir` as `<cn>[-expired].crt/.key`
/// (the CN made file-name safe): for the attack tables, with a CA of the test's own.
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

fn binary() -> &'static Path {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| crate::apiserver::target_binary(PACKAGE, BINARY))
}
