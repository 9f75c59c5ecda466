//! battery-apiserver installed into a [`ControlPlane`] as a cluster admin installs it
//! (`docs/install.md`), with the real kubectl and the objects of `deploy/`:
//!
//! 1. `battery-apiserver certs` makes the serving certificate for
//!    `battery-apiserver.battery-system.svc` (the name the aggregator verifies) and the
//!    APIService's `caBundle`;
//! 2. `kubectl apply --server-side -k e2e/install`: `deploy/base` without what needs Nodes
//!    (its StatefulSet and DaemonSet, whose containers the harness runs as processes, and
//!    its Service);
//! 3. the Secrets and the `caBundle` patch `certs` wrote, as `deploy/README.md` says for
//!    `install.yaml`: the cluster's (`secrets.yaml`) and the battery channel's
//!    (`battery-secrets.yaml`: poolmgrd's certificate and config.json, `serve`'s client
//!    certificate and token), which the harness's processes do not read but a pod would;
//! 4. the one object that differs: an `ExternalName` Service to the loopback address
//!    `serve` will listen on (ADR 30: Endpoints refuse loopback addresses, and the
//!    aggregator dials an ExternalName at the APIService's port);
//! 5. a kubeconfig with a token of the ServiceAccount `battery-system/battery-apiserver`,
//!    the identity `serve` has in its Pod.
//!
//! The caller then starts `serve` at [`Installation::address`] and waits for the
//! aggregator's own availability check ([`wait_available`]).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use tokio::process::Command;

use super::ControlPlane;

/// The APIService `deploy/base` registers.
pub const API_SERVICE: &str = "v1alpha1.battery.liquidmetal-x.dev";
/// The namespace, Service and ServiceAccount of `deploy/base`.
pub const NAMESPACE: &str = "battery-system";
pub const SERVICE: &str = "battery-apiserver";
/// The port of the APIService's Service reference: with an ExternalName the aggregator
/// dials the name at this port, so `serve` listens on it.
pub const SERVICE_PORT: u16 = 443;
/// The Secret of the serving certificate `certs` writes.
const SERVING_SECRET: &str = "battery-apiserver-serving";
/// The files of Secrets `certs` writes: the cluster's, and the battery channel's.
const SECRETS_FILE: &str = "secrets.yaml";
const BATTERY_SECRETS_FILE: &str = "battery-secrets.yaml";
/// How long the aggregator may take to change the APIService's `Available`: a change of
/// its Service is seen at once, but a server that stops answering only at its next
/// periodic check (half a minute apart), each of which may wait 5 s for an answer.
pub const AVAILABLE_TIMEOUT: Duration = Duration::from_secs(120);

/// What the installation leaves for `serve`.
pub struct Installation {
    /// Where `serve` must listen: the ExternalName's address, at the APIService's port.
    pub address: SocketAddr,
    /// The serving certificate and key `certs` made, and their CA (the `caBundle`).
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub serving_ca: PathBuf,
    /// `serve`'s `--kubeconfig`: its ServiceAccount's token.
    pub kubeconfig: PathBuf,
}

/// Installs battery-apiserver into `plane` with `battery_apiserver` (the binary) and the
/// newest kubectl as the cluster admin; files go into `dir`.
pub async fn install(plane: &ControlPlane, battery_apiserver: &Path, dir: &Path) -> Installation {
    std::fs::create_dir_all(dir).expect("create the installation's directory");
    let certs = dir.join("certs");
    run(Command::new(battery_apiserver)
        .arg("certs")
        .arg("--out")
        .arg(&certs))
    .await;
    let admin = Admin::new(plane);
    let overlay = Path::new(env!("CARGO_MANIFEST_DIR")).join("install");
    admin
        .kubectl(&["apply", "--server-side", "-k"], &overlay)
        .await;
    for secrets in [SECRETS_FILE, BATTERY_SECRETS_FILE] {
        admin
            .kubectl(&["apply", "--server-side", "-f"], &certs.join(secrets))
            .await;
    }
    admin
        .kubectl(
            &[
                "patch",
                "apiservice",
                API_SERVICE,
                "--type",
                "merge",
                "--patch-file",
            ],
            &certs.join("apiservice-ca-bundle.yaml"),
        )
        .await;

    let address = SocketAddr::new(free_loopback_ip().into(), SERVICE_PORT);
    let service = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVICE, "namespace": NAMESPACE},
        "spec": {"type": "ExternalName", "externalName": address.ip().to_string()},
    });
    let manifest = dir.join("service.json");
    std::fs::write(&manifest, service.to_string()).expect("write the Service");
    admin
        .kubectl(&["apply", "--server-side", "-f"], &manifest)
        .await;

    let (serving_cert, serving_key, serving_ca) = serving_files(&certs);
    Installation {
        address,
        serving_cert,
        serving_key,
        serving_ca,
        kubeconfig: plane.service_account_kubeconfig(NAMESPACE, SERVICE).await,
    }
}

/// Waits until the APIService's `Available` condition is `status` (the aggregator's own
/// check of `serve`), panicking with the condition when it is not within
/// [`AVAILABLE_TIMEOUT`].
pub async fn wait_available(plane: &ControlPlane, status: &str) -> APIService {
    let services: kube::Api<APIService> = kube::Api::all(plane.admin().await);
    let what = format!("the APIService {API_SERVICE} to be Available={status}");
    crate::eventually(AVAILABLE_TIMEOUT, &what, async || {
        let service = services.get(API_SERVICE).await.map_err(|e| e.to_string())?;
        let available = service
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Available"));
        match available {
            Some(condition) if condition.status == status => Ok(service),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

/// Waits until kube-apiserver's aggregated discovery (`/apis` as an
/// `APIGroupDiscoveryList`, what kubectl reads) lists our resources, its OpenAPI v3 root
/// our group-version, and its `/openapi/v2` our kinds. The aggregator fetches our
/// discovery and OpenAPI documents on its own schedule after the APIService turns
/// Available; until then kubectl finds no kind of ours ("no matches for kind") and
/// `kubectl explain` no resource ("couldn't find resource").
pub async fn wait_discovered(plane: &ControlPlane) {
    let client = plane.admin().await;
    let group_version = format!("\"apis/{}\"", battery_types::API_VERSION);
    let claim_definition = "\"dev.liquidmetal-x.battery.v1alpha1.MicroVMClaim\"";
    for (path, needle) in [
        ("/openapi/v3", group_version.as_str()),
        ("/openapi/v2", claim_definition),
    ] {
        let what = format!("{needle} in kube-apiserver's {path}");
        crate::eventually(AVAILABLE_TIMEOUT, &what, async || {
            let request = http::Request::get(path)
                .header(http::header::ACCEPT, "application/json")
                .body(Vec::new())
                .expect("a request");
            let document = client
                .request_text(request)
                .await
                .map_err(|e| e.to_string())?;
            if document.contains(needle) {
                Ok(())
            } else {
                Err("not merged yet".to_owned())
            }
        })
        .await;
    }
    crate::eventually(
        AVAILABLE_TIMEOUT,
        "our resources in aggregated discovery",
        async || {
            let request = http::Request::get("/apis")
                .header(
                    http::header::ACCEPT,
                    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
                )
                .body(Vec::new())
                .expect("a request");
            let list: serde_json::Value =
                client.request(request).await.map_err(|e| e.to_string())?;
            let ours = list["items"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|group| group["metadata"]["name"] == battery_types::GROUP);
            let resources = ours.and_then(|group| group["versions"][0]["resources"].as_array());
            match resources {
                Some(resources) if !resources.is_empty() => Ok(()),
                _ => Err(format!("{ours:?}")),
            }
        },
    )
    .await;
}

/// The serving certificate, key and CA out of the Secret `certs` wrote for the Pod,
/// written as files for `serve` and for tests that dial it.
fn serving_files(certs: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let path = certs.join(SECRETS_FILE);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let secret = serde_norway::Deserializer::from_str(&text)
        .filter_map(|document| serde::Deserialize::deserialize(document).ok())
        .find(|secret: &Secret| secret.metadata.name.as_deref() == Some(SERVING_SECRET))
        .unwrap_or_else(|| panic!("no Secret {SERVING_SECRET} in {}", path.display()));
    let data = secret.data.unwrap_or_default();
    let write = |key: &str| {
        let file = certs.join(format!("serving-{key}"));
        let value = data
            .get(key)
            .unwrap_or_else(|| panic!("the Secret {SERVING_SECRET} has no {key}"));
        std::fs::write(&file, &value.0).unwrap_or_else(|e| panic!("write {}: {e}", file.display()));
        file
    };
    (write("tls.crt"), write("tls.key"), write("ca.crt"))
}

/// A loopback address no one listens on at [`SERVICE_PORT`], other than 127.0.0.1, so
/// that each test's `serve` has its own while every APIService names port 443.
pub fn free_loopback_ip() -> Ipv4Addr {
    loop {
        let random = uuid::Uuid::new_v4().into_bytes();
        let ip = Ipv4Addr::new(127, random[0] | 0x40, random[1], random[2].max(1));
        if std::net::TcpListener::bind((ip, SERVICE_PORT)).is_ok() {
            return ip;
        }
    }
}

/// The cluster admin at a kubectl: the newest release the suites cover.
pub(crate) struct Admin {
    kubeconfig: PathBuf,
    kubectl: &'static Path,
}

impl Admin {
    pub(crate) fn new(plane: &ControlPlane) -> Self {
        Self {
            kubeconfig: plane.admin_kubeconfig(),
            kubectl: crate::apiserver::kubectl_paths()
                .last()
                .expect("a kubectl release"),
        }
    }

    /// `kubectl <args> <file>` as the admin; panics with its output when it fails.
    pub(crate) async fn kubectl(&self, args: &[&str], file: &Path) -> String {
        run(Command::new(self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .arg(file))
        .await
    }
}

/// Runs `command` to its end; panics with its output when it fails.
async fn run(command: &mut Command) -> String {
    let line = format!("{:?}", command.as_std());
    let output = command
        .kill_on_drop(true)
        .output()
        .await
        .unwrap_or_else(|e| panic!("run {line}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{line} failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}
