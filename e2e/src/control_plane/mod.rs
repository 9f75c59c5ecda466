//! A real Kubernetes control plane for the e2e suites: etcd, kube-apiserver with its
//! aggregation layer and RBAC, and (when a test asks) kube-controller-manager, all on
//! loopback. The binaries are built from their Go modules by `e2e/go/build`, once per
//! version, and cached outside the clone ([`binaries`]).
//!
//! Every [`ControlPlane`] is its own cluster in its own directory, killed when dropped, so
//! tests never see each other's objects (and each can register its own APIService).
//! [`install`] puts battery-apiserver into it as a cluster admin would.

pub mod install;
mod pki;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use tokio::process::Command;

use crate::process::Process;
pub use pki::ClusterPki;

/// How long kube-apiserver may take to answer `/readyz` (its post-start hooks: the RBAC
/// bootstrap roles, the priority levels) on a loaded 2-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the tokens the harness requests live: longer than any test.
const TOKEN_SECONDS: i64 = 24 * 3600;
/// The Service CIDR: kube-apiserver needs one, though nothing here routes to it.
const SERVICE_CIDR: &str = "10.0.0.0/24";

/// What a test wants running beside kube-apiserver.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// kube-controller-manager with the controllers that act on our resources: the
    /// namespace controller, the garbage collector, the resource quota controller, the
    /// ServiceAccount controllers (default accounts and their tokens), and the publisher
    /// of `kube-root-ca.crt` (a claim's guest's `ca.crt`).
    pub controllers: bool,
    /// etcd syncs each commit to disk, as a production cluster's does: for the bench,
    /// whose figures compare with writes through kube-apiserver. Tests' clusters live
    /// minutes, and durability across a power cut buys them nothing.
    pub durable_etcd: bool,
    /// Environment variables for `battery-apiserver serve`: test settings, such as how
    /// soon claims' ServiceAccount tokens are replaced.
    pub serve_env: &'static [(&'static str, &'static str)],
}

/// A running control plane, killed when dropped.
pub struct ControlPlane {
    etcd: Process,
    apiserver: Process,
    controller_manager: Option<Process>,
    pki: ClusterPki,
    url: String,
    /// etcd's client URL (`http://127.0.0.1:PORT`).
    etcd_url: String,
    dir: PathBuf,
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver (and kube-controller-manager with
    /// [`Options::controllers`]) with their files in `dir`, and waits until kube-apiserver
    /// is ready. Panics with the logs when one exits or is not ready in time.
    pub async fn start(dir: &Path, options: Options) -> Self {
        std::fs::create_dir_all(dir).expect("create the control plane's directory");
        let bin = binaries();
        let api_port = battery_telemetry::free_loopback_address().port();
        let url = format!("https://127.0.0.1:{api_port}");
        let pki = ClusterPki::write(&dir.join("pki"), &url).expect("the control plane's PKI");

        let etcd_client = format!("http://{}", battery_telemetry::free_loopback_address());
        let etcd_peer = format!("http://{}", battery_telemetry::free_loopback_address());
        let mut etcd = Command::new(bin.join("etcd"));
        etcd.arg("--data-dir")
            .arg(dir.join("etcd"))
            .args(["--listen-client-urls", &etcd_client])
            .args(["--advertise-client-urls", &etcd_client])
            .args(["--listen-peer-urls", &etcd_peer])
            .args(["--initial-advertise-peer-urls", &etcd_peer])
            .args(["--initial-cluster", &format!("default={etcd_peer}")])
            .args(["--log-level", "warn"]);
        if !options.durable_etcd {
            etcd.arg("--unsafe-no-fsync");
        }
        let etcd = Process::spawn(etcd, &dir.join("etcd.log"));

        let mut apiserver = Command::new(bin.join("kube-apiserver"));
        apiserver
            .args(["--etcd-servers", &etcd_client])
            .args(["--bind-address", "127.0.0.1", "--secure-port"])
            .arg(api_port.to_string())
            .arg("--cert-dir")
            .arg(dir.join("kube-apiserver"))
            .args(["--service-cluster-ip-range", SERVICE_CIDR])
            .args(["--authorization-mode", "RBAC"])
            // The `kubernetes` Service's endpoints would be 127.0.0.1, which Endpoints
            // refuse: nothing here reaches kube-apiserver through that Service.
            .args(["--endpoint-reconciler-type", "none"])
            .args(["--service-account-issuer", &url])
            .args(pki.apiserver_args());
        let apiserver = Process::spawn(apiserver, &dir.join("kube-apiserver.log"));

        let mut plane = Self {
            etcd,
            apiserver,
            controller_manager: None,
            pki,
            url,
            etcd_url: etcd_client,
            dir: dir.to_owned(),
        };
        plane.wait_ready().await;
        if options.controllers {
            plane.start_controller_manager();
        }
        plane
    }

    fn start_controller_manager(&mut self) {
        let mut command = Command::new(binaries().join("kube-controller-manager"));
        let admin = self.pki.admin_kubeconfig();
        command
            .arg("--kubeconfig")
            .arg(&admin)
            .arg("--authentication-kubeconfig")
            .arg(&admin)
            .arg("--authorization-kubeconfig")
            .arg(&admin)
            .args(self.pki.controller_manager_args())
            // Each controller acts as its own ServiceAccount, with the bootstrap RBAC
            // roles a cluster gives it: what it may do here is what it may do there.
            .args(["--use-service-account-credentials", "--leader-elect=false"])
            .args(["--bind-address", "127.0.0.1", "--secure-port", "0"])
            .args(["--resource-quota-sync-period", "5s"])
            .args([
                "--controllers",
                "namespace-controller,garbage-collector-controller,resourcequota-controller,\
                 clusterrole-aggregation-controller,\
                 serviceaccount-controller,serviceaccount-token-controller,\
                 root-ca-cert-publisher",
            ]);
        self.controller_manager = Some(Process::spawn(
            command,
            &self.dir.join("kube-controller-manager.log"),
        ));
    }

    /// Waits until `/readyz` answers 200, panicking with the logs when etcd or
    /// kube-apiserver exits first or it takes too long.
    async fn wait_ready(&mut self) {
        let client = crate::kube_client(&self.pki.admin_kubeconfig()).await;
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            self.etcd.assert_running();
            self.apiserver.assert_running();
            let request = http::Request::get("/readyz")
                .body(Vec::new())
                .expect("a request");
            let last = match client.request_text(request).await {
                Ok(text) if text.trim() == "ok" => return,
                Ok(text) => text,
                Err(error) => error.to_string(),
            };
            assert!(
                tokio::time::Instant::now() < deadline,
                "kube-apiserver was not ready within {READY_TIMEOUT:?} ({last}); its log:\n{}",
                self.apiserver.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// etcd and kube-apiserver, by name: for a benchmark's account of who spent what.
    pub fn processes(&self) -> [(&'static str, &Process); 2] {
        [("etcd", &self.etcd), ("kube-apiserver", &self.apiserver)]
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// etcd's client URL, `http://127.0.0.1:PORT`, where it also serves its `/metrics`.
    pub fn etcd_url(&self) -> &str {
        &self.etcd_url
    }

    /// The cluster's certificates (its CA signs the serving certificate and users'
    /// client certificates, as kubeadm's `ca` does).
    pub fn pki(&self) -> &ClusterPki {
        &self.pki
    }

    /// The kubeconfig of a cluster admin (a client certificate in `system:masters`).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.pki.admin_kubeconfig()
    }

    /// A kube-rs client as the cluster admin.
    pub async fn admin(&self) -> kube::Client {
        crate::kube_client(&self.admin_kubeconfig()).await
    }

    /// A kubeconfig (in this control plane's directory) for the ServiceAccount
    /// `namespace/name`, with a token from its `token` subresource as a Pod's projected
    /// token is: the account is made when missing.
    pub async fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> PathBuf {
        let token = self.service_account_token(namespace, name).await;
        let path = self.dir.join(format!("{namespace}-{name}.kubeconfig"));
        self.pki
            .write_kubeconfig(&path, serde_json::json!({ "token": token }), namespace)
            .expect("write a ServiceAccount's kubeconfig");
        path
    }

    /// A token of the ServiceAccount `namespace/name`, made when missing.
    pub async fn service_account_token(&self, namespace: &str, name: &str) -> String {
        let accounts: Api<ServiceAccount> = Api::namespaced(self.admin().await, namespace);
        let account = ServiceAccount {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        };
        match accounts.create(&PostParams::default(), &account).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => panic!("create the ServiceAccount {namespace}/{name}: {error}"),
        }
        let request = TokenRequest {
            spec: TokenRequestSpec {
                expiration_seconds: Some(TOKEN_SECONDS),
                ..Default::default()
            },
            ..Default::default()
        };
        let answered: TokenRequest = accounts
            .create_subresource("token", name, &PostParams::default(), &request)
            .await
            .unwrap_or_else(|e| panic!("a token for {namespace}/{name}: {e}"));
        answered
            .status
            .map(|status| status.token)
            .expect("a TokenRequest answers a token")
    }
}

/// The directory of etcd, kube-apiserver and kube-controller-manager (and of the others
/// `e2e/go/build` makes: client-go-e2e, agent-sandbox-controller and its CRDs), built by
/// it on first use (it prints the directory; later runs only find it).
pub fn binaries() -> &'static Path {
    static BINARIES: OnceLock<PathBuf> = OnceLock::new();
    BINARIES.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("go/build");
        let output = std::process::Command::new(&script)
            .stderr(std::process::Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
        assert!(
            output.status.success(),
            "{} failed: the control plane could not be built (Go and the Go module proxy are needed)",
            script.display()
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        let dir = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
        assert!(
            dir.join("kube-apiserver").is_file(),
            "{} printed {stdout:?}, which holds no kube-apiserver",
            script.display()
        );
        dir
    })
}
