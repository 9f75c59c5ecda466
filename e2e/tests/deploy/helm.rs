//! The Helm chart (`deploy/charts/battery-apiserver`), with the helm `e2e/go/build` makes
//! from helm's Go module. Rendered, it is the kustomize install with each overlay's
//! certificates, its values reach the objects they are for, and values outside its schema
//! are refused naming them. Installed into a real control plane ([`ControlPlane`]) with
//! `helm install`, as `docs/install.md` says, it registers an APIService that turns
//! Available, its shipped `battery-holder` role lets a Holder bind a claim, `helm upgrade`
//! with a changed value changes the release, and `helm uninstall` leaves no APIService and
//! no RBAC object behind.
//!
//! There are no kubelets in that control plane, as for the kustomize install
//! (`e2e/install/`): the post-renderer plugin `helm-plugins/battery-e2e-cluster` drops the
//! StatefulSet and the DaemonSet and makes the Service an ExternalName to the loopback
//! address `serve` listens on (ADR 30). The StatefulSet's two containers run as processes
//! instead, with the args the chart renders for them and the files of the Secrets the
//! cluster holds, projected where their mounts put them: poolmgrd's by the embedded
//! battery, set up as poolmgrd's `config.json` says, and `serve`'s by `serve`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use battery_apiserver::certs;
use battery_e2e::control_plane::install::{
    self as cluster_install, API_SERVICE, SERVICE_PORT, free_loopback_ip,
};
use battery_e2e::control_plane::{ControlPlane, Options};
use battery_e2e::eventually;
use battery_e2e::process::Process;
use battery_types::{ClaimPhase, MicroVMClaim, Pool};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding, RoleRef, Subject};
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::api::{Api, DeleteParams, DynamicObject, ObjectMeta, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use super::support::*;

/// The release's namespace, as docs/install.md installs it.
const NAMESPACE: &str = "battery-system";
/// The release.
const RELEASE: &str = "battery-apiserver";
/// The namespace of the test's Pool, its Holder and its claim.
const TEAM: &str = "team-a";
/// The Holder: a ServiceAccount of [`TEAM`] bound to `battery-holder` alone.
const HOLDER: &str = "runner";
/// The post-renderer plugin, in `helm-plugins/` beside this file.
const POST_RENDERER: &str = "battery-e2e-cluster";
/// What `battery-apiserver serve` and `embedded-battery` print once they serve.
const SERVE_SERVING_PREFIX: &str = "battery-apiserver serve: serving ";
const BATTERY_SERVING_PREFIX: &str = "embedded battery serving battery's gRPC API on ";
/// How long a new binding takes to reach RBAC's informers, and the Pool to fill, on a
/// loaded 2-core machine.
const WAIT: Duration = Duration::from_secs(60);

/// An object's (kind, namespace, name).
fn key_of(object: &Value) -> (String, String, String) {
    let text = |value: &Value| value.as_str().unwrap_or_default().to_owned();
    (
        text(&object["kind"]),
        text(&object["metadata"]["namespace"]),
        text(&object["metadata"]["name"]),
    )
}

/// The objects of `install`, as (kind, namespace, name).
fn keys(install: &Install) -> BTreeSet<(String, String, String)> {
    install.objects.iter().map(key_of).collect()
}

/// `objects` by (kind, namespace, name), to compare two renderings object by object.
fn by_key(objects: &[Value]) -> BTreeMap<(String, String, String), Value> {
    objects.iter().map(|o| (key_of(o), o.clone())).collect()
}

/// Asserts that two renderings hold the same objects, field for field.
fn assert_same_objects(chart: &[Value], kustomized: &[Value], what: &str) {
    let (chart, kustomized) = (by_key(chart), by_key(kustomized));
    assert_eq!(
        chart.keys().collect::<Vec<_>>(),
        kustomized.keys().collect::<Vec<_>>(),
        "{what}: the objects"
    );
    for (key, object) in &chart {
        assert_eq!(object, &kustomized[key], "{what}: {key:?}");
    }
}

#[test]
fn the_chart_with_cert_manager_is_the_cert_manager_overlay() {
    let (chart, others) = helm_template(&[
        "--set",
        "certificates.source=certManager",
        "--set",
        "namespace.create=true",
    ]);
    let mut chart_objects = chart.objects.clone();
    chart_objects.extend(others.into_values().flatten());
    let overlay = documents(&kustomize(&repo().join("deploy/overlays/cert-manager")));
    assert_same_objects(&chart_objects, &overlay, "deploy/overlays/cert-manager");
}

#[test]
fn the_chart_with_the_secrets_certs_writes_is_the_self_signed_overlay() {
    let (_scratch, overlay) = self_signed_install();
    let serving: Secret = overlay.one(certs::SERVING_SECRET);
    let ca = serving
        .data
        .unwrap()
        .remove("ca.crt")
        .expect("the serving CA");
    let ca_bundle = format!("certificates.caBundle={}", base64(&ca.0));
    let (chart, others) = helm_template(&["--set", &ca_bundle, "--set", "namespace.create=true"]);
    assert!(others.is_empty(), "{others:?}");
    // The overlay adds the Secrets; the chart mounts them.
    let kustomized: Vec<Value> = overlay
        .objects
        .iter()
        .filter(|o| o["kind"] != "Secret")
        .cloned()
        .collect();
    assert_same_objects(&chart.objects, &kustomized, "deploy/overlays/self-signed");
}

/// The chart's defaults install in any namespace, and Helm makes the namespace itself
/// (`--create-namespace`): the chart makes no Namespace unless asked.
#[test]
fn the_chart_installs_into_the_release_namespace() {
    let output = {
        let mut command = std::process::Command::new(helm_binary());
        command
            .args(["template", "battery", "--namespace", "infra"])
            .arg(chart());
        command.output().expect("helm template")
    };
    assert!(output.status.success(), "{output:?}");
    let install = Install {
        objects: documents(std::str::from_utf8(&output.stdout).unwrap()),
    };
    assert!(validate(&install.objects).is_empty());
    assert!(
        install.all::<Namespace>().is_empty(),
        "a Namespace by default"
    );
    for (kind, namespace, name) in keys(&install) {
        let cluster_scoped = matches!(
            kind.as_str(),
            "ClusterRole" | "ClusterRoleBinding" | "APIService"
        );
        match (cluster_scoped, namespace.as_str()) {
            (true, "") | (false, "infra") => {}
            (false, "kube-system") => assert_eq!(kind, "RoleBinding"),
            _ => panic!("{kind} {name} in {namespace:?}"),
        }
    }
    // The Service the APIService names is the release's, and every subject of a binding
    // is the release's ServiceAccount or the agents' group.
    let api_service: APIService = install.one(certs::API_SERVICE);
    let service = api_service.spec.unwrap().service.unwrap();
    assert_eq!(service.namespace.as_deref(), Some("infra"));
    install.one::<Service>(service.name.as_deref().unwrap());
    for object in &install.objects {
        for subject in object["subjects"].as_array().into_iter().flatten() {
            if subject["kind"] == "ServiceAccount" {
                assert_eq!(subject["namespace"], "infra", "{object:#}");
            }
        }
    }
}

#[test]
fn values_reach_the_objects_they_are_for() {
    let digest = format!("sha256:{}", "ab".repeat(32));
    let (install, others) = helm_template(&[
        "--set",
        "terminals.enabled=true",
        "--set",
        "terminals.sshCA.secretName=ssh-ca",
        "--set",
        "terminals.sshCA.key=id_ed25519",
        "--set",
        "batteryChannel.token.secretName=poolmgrd-token",
        "--set",
        "batteryChannel.token.key=basic-auth",
        "--set",
        "poolmgrd.config.secretName=poolmgrd-config",
        "--set",
        "poolmgrd.config.key=poolmgrd.json",
        "--set",
        "poolmgrd.logLevel=warn",
        "--set",
        &format!("apiserver.image.digest={digest}"),
        "--set",
        "agent.image.tag=0.2.0",
        "--set",
        "apiserver.extraArgs={--bind-wait=10s,--max-watches=2000}",
        "--set",
        "apiserver.guestApiServer=[fd00::1]:6443",
        "--set",
        "apiserver.persistence.size=20Gi",
        "--set",
        "apiserver.persistence.storageClassName=fast",
        "--set",
        "apiserver.podDisruptionBudget.enabled=false",
        "--set-json",
        r#"agent.nodeSelector={"node-role.example.com/microvm":"yes"}"#,
        "--set-json",
        r#"agent.tolerations=[{"key":"dedicated","operator":"Equal","value":"microvm","effect":"NoExecute"}]"#,
        "--set",
        "apiserver.resources.limits.memory=1Gi",
    ]);
    assert!(others.is_empty(), "{others:?}");
    let (pod, args) = serve_args_in(&install);
    let apiserver = container(&pod, "apiserver");

    // Terminals: the SSH CA's key, from the Secret and key asked for.
    let ssh_key = args
        .agent_ssh_ca_key_file
        .as_ref()
        .expect("--agent-ssh-ca-key-file with terminals on");
    let (volume, mount) = volume_of(&pod, apiserver, ssh_key);
    let source = volume.secret.as_ref().expect("a Secret");
    assert_eq!(source.secret_name.as_deref(), Some("ssh-ca"));
    let path = ssh_key.strip_prefix(&mount).unwrap().display().to_string();
    let items = source.items.as_ref().expect("the key projected");
    assert!(
        items
            .iter()
            .any(|i| i.key == "id_ed25519" && i.path == path)
    );

    // The token and poolmgrd's config.json, from the Secrets and keys asked for.
    for (file, secret, key) in [
        (
            args.battery_token_file.clone().unwrap(),
            "poolmgrd-token",
            "basic-auth",
        ),
        (
            PathBuf::from(poolmgrd_flag(container(&pod, "battery"), "config")),
            "poolmgrd-config",
            "poolmgrd.json",
        ),
    ] {
        let owner = if secret == "poolmgrd-token" {
            apiserver
        } else {
            container(&pod, "battery")
        };
        let (volume, mount) = volume_of(&pod, owner, &file);
        let source = volume.secret.as_ref().expect("a Secret");
        assert_eq!(source.secret_name.as_deref(), Some(secret));
        let path = file.strip_prefix(&mount).unwrap().display().to_string();
        assert!(
            source
                .items
                .iter()
                .flatten()
                .any(|i| i.key == key && i.path == path),
            "{secret}: {:?}",
            source.items
        );
    }
    assert_eq!(
        poolmgrd_flag(container(&pod, "battery"), "log-level"),
        "warn"
    );

    // Images: a digest pins ours (beside the appVersion's tag); a tag replaces that.
    assert_eq!(
        apiserver.image.as_deref(),
        Some(format!("ghcr.io/liquidmetal-dev/battery-apiserver:0.1.0@{digest}").as_str())
    );
    let (agent_pod, _) = agent_cli_in(&install);
    assert_eq!(
        container(&agent_pod, "agent").image.as_deref(),
        Some("ghcr.io/liquidmetal-dev/battery-agent:0.2.0")
    );
    // A map merges with the default (set a key to null to drop it); a list replaces it.
    let selector = agent_pod.node_selector.clone().unwrap();
    assert_eq!(
        selector
            .get("node-role.example.com/microvm")
            .map(String::as_str),
        Some("yes")
    );
    assert_eq!(selector.get(HOST_LABEL).map(String::as_str), Some("true"));
    let tolerations = agent_pod.tolerations.unwrap();
    assert_eq!(tolerations.len(), 1);
    assert_eq!(tolerations[0].key.as_deref(), Some("dedicated"));
    assert_eq!(tolerations[0].effect.as_deref(), Some("NoExecute"));

    // serve's own flags parse (serve_args_in), with the extra ones.
    assert_eq!(*args.requests.bind_wait, Duration::from_secs(10));
    assert_eq!(args.max_watches, 2000);
    let guest_api = args.guest_api_server.as_ref().expect("--guest-api-server");
    assert_eq!((guest_api.host.as_str(), guest_api.port), ("fd00::1", 6443));
    let memory = apiserver
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get("memory"))
        .map(|q| q.0.as_str());
    assert_eq!(memory, Some("1Gi"));
    let set: k8s_openapi::api::apps::v1::StatefulSet = install.one("battery-apiserver");
    let claim = &set.spec.unwrap().volume_claim_templates.unwrap()[0];
    let claim_spec = claim.spec.as_ref().unwrap();
    assert_eq!(claim_spec.storage_class_name.as_deref(), Some("fast"));
    assert_eq!(
        claim_spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .map(|q| q.0.as_str()),
        Some("20Gi")
    );
    assert!(install.all::<PodDisruptionBudget>().is_empty());

    // By default: no terminals, the Secrets of the kustomize install.
    let (defaults, _) = helm_template(&[]);
    let (_, args) = serve_args_in(&defaults);
    assert_eq!(args.agent_ssh_ca_key_file, None);
    defaults.one::<PodDisruptionBudget>("battery-apiserver");
    let (agent_pod, _) = agent_cli_in(&defaults);
    assert_eq!(
        agent_pod
            .node_selector
            .as_ref()
            .and_then(|s| s.get(HOST_LABEL))
            .map(String::as_str),
        Some("true")
    );
    assert!(
        defaults.all::<DaemonSet>().len() == 1,
        "the agent is installed"
    );
}

#[test]
fn the_service_monitor_scrapes_the_server_over_verified_tls_as_an_account_allowed_metrics() {
    let (install, mut others) = helm_template(&[
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.serviceMonitor.labels.release=prometheus",
    ]);
    let monitors = others.remove("ServiceMonitor").expect("a ServiceMonitor");
    assert!(others.is_empty(), "{others:?}");
    assert_eq!(monitors.len(), 1);
    let monitor = &monitors[0];
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(monitor["metadata"]["labels"]["release"], "prometheus");
    // It selects the Service by its labels, at the Service's port, over HTTPS.
    let service: Service = install.one("battery-apiserver");
    let labels = service.metadata.labels.unwrap();
    for (label, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(
            Some(value.as_str().unwrap()),
            labels.get(label).map(String::as_str)
        );
    }
    let endpoint = &monitor["spec"]["endpoints"][0];
    let port = endpoint["port"].as_str().unwrap();
    assert!(
        service
            .spec
            .unwrap()
            .ports
            .unwrap()
            .iter()
            .any(|p| p.name.as_deref() == Some(port))
    );
    assert_eq!(endpoint["scheme"], "https");
    assert_eq!(endpoint["path"], "/metrics");
    // Verified against the serving CA, for the name the serving certificate carries.
    let tls = &endpoint["tlsConfig"];
    assert_eq!(tls["serverName"], "battery-apiserver.battery-system.svc");
    assert_eq!(tls["ca"]["secret"]["name"], certs::SERVING_SECRET);
    assert_eq!(tls["ca"]["secret"]["key"], "ca.crt");
    assert!(tls.get("insecureSkipVerify").is_none());
    // As a ServiceAccount whose token Secret it names, allowed to get /metrics.
    let credentials = &endpoint["authorization"]["credentials"];
    let token: Secret = install.one(credentials["name"].as_str().unwrap());
    assert_eq!(
        token.type_.as_deref(),
        Some("kubernetes.io/service-account-token")
    );
    assert_eq!(credentials["key"], "token");
    let account = token.metadata.annotations.unwrap()["kubernetes.io/service-account.name"].clone();
    let role: ClusterRole = install.one("battery-apiserver-metrics");
    let rule = &role.rules.unwrap()[0];
    assert_eq!(rule.non_resource_urls, Some(vec!["/metrics".to_owned()]));
    assert_eq!(rule.verbs, ["get"]);
    let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding =
        install.one("battery-apiserver-metrics");
    assert_eq!(binding.role_ref.name, "battery-apiserver-metrics");
    let subject = &binding.subjects.unwrap()[0];
    assert_eq!(
        (subject.kind.as_str(), subject.name.as_str()),
        ("ServiceAccount", account.as_str())
    );
    // None of it by default.
    let (defaults, others) = helm_template(&[]);
    assert!(others.is_empty(), "{others:?}");
    assert!(
        !keys(&defaults)
            .iter()
            .any(|(_, _, name)| name.starts_with("battery-apiserver-metrics"))
    );
}

/// Values the schema refuses, and the part of helm's message that names them.
const REFUSED: &[(&str, &str)] = &[
    (
        "terminals.enabled=yes",
        "at '/terminals/enabled': got string, want boolean",
    ),
    (
        "batteryChannel.token.key=",
        "at '/batteryChannel/token/key'",
    ),
    (
        "batteryChannel.token.key=null",
        "at '/batteryChannel/token': missing property 'key'",
    ),
];

#[test]
fn values_outside_the_schema_are_refused_naming_them() {
    let more: &[(&[&str], &str)] = &[
        (
            &["--set", "terminal=true"],
            "additional properties 'terminal' not allowed",
        ),
        (
            &["--set", "certificates.source=vault"],
            "at '/certificates/source'",
        ),
        (
            &["--set", "apiserver.image.digest=latest"],
            "at '/apiserver/image/digest'",
        ),
        (
            &["--set", "poolmgrd.logLevel=trace"],
            "at '/poolmgrd/logLevel'",
        ),
        (
            &["--set", "apiserver.extraArgs={bind-wait}"],
            "at '/apiserver/extraArgs/0'",
        ),
        (
            &["--set", "apiserver.guestApiServer=https://api.example.com"],
            "at '/apiserver/guestApiServer'",
        ),
    ];
    let refused = REFUSED
        .iter()
        .map(|(set, named)| (vec!["--set", *set], *named))
        .chain(more.iter().map(|(args, named)| (args.to_vec(), *named)));
    for (args, named) in refused {
        let output = helm_template_output(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?} was rendered");
        assert!(stderr.contains(named), "{args:?}: {stderr}");
    }
}

/// base64 of `bytes`, as a Secret's data and a caBundle hold them.
fn base64(bytes: &[u8]) -> String {
    let json = serde_json::to_value(k8s_openapi::ByteString(bytes.to_vec())).unwrap();
    json.as_str().unwrap().to_owned()
}

/// helm as the cluster admin, with homes of its own in a test's directory and the
/// post-renderer plugin of this directory.
struct Helm {
    kubeconfig: PathBuf,
    home: PathBuf,
}

impl Helm {
    fn command<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(helm_binary());
        command
            .args(args)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .env("HELM_CONFIG_HOME", self.home.join("config"))
            .env("HELM_CACHE_HOME", self.home.join("cache"))
            .env("HELM_DATA_HOME", self.home.join("data"))
            .env("HELM_PLUGINS", repo().join("e2e/tests/deploy/helm-plugins"))
            // The post-renderer's kubectl: the newest release the suite covers.
            .env(
                "KUBECTL",
                battery_e2e::apiserver::kubectl_paths()
                    .last()
                    .expect("a kubectl"),
            )
            .kill_on_drop(true);
        command
    }

    async fn output<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(
        &self,
        args: &[S],
    ) -> std::process::Output {
        self.command(args)
            .output()
            .await
            .unwrap_or_else(|e| panic!("helm {args:?}: {e}"))
    }

    /// Runs helm with `args`; its stdout. Panics with its output when it fails.
    async fn run<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(&self, args: &[S]) -> String {
        let output = self.output(args).await;
        assert!(
            output.status.success(),
            "helm {args:?} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("UTF-8")
    }
}

/// The args of `container` in the chart's rendering, as the process runs them: files
/// under `root` (where their Secrets are projected), `serve` listening at `listen` and
/// dialing battery at `battery`, with `kubeconfig` for the cluster as its pod's token.
fn serve_args(
    container: &k8s_openapi::api::core::v1::Container,
    root: &Path,
    listen: &str,
    battery: &str,
    kubeconfig: &Path,
) -> Vec<String> {
    let mut args: Vec<String> = container
        .args
        .iter()
        .flatten()
        .map(|arg| match arg.split_once('=') {
            Some(("--listen", _)) => format!("--listen={listen}"),
            Some(("--battery-address", _)) => format!("--battery-address={battery}"),
            Some((flag, path)) if path.starts_with('/') => {
                format!("{flag}={}", under(root, Path::new(path)).display())
            }
            _ => arg.clone(),
        })
        .collect();
    args.push(format!("--kubeconfig={}", kubeconfig.display()));
    args
}

/// The Secrets of `namespace` as the cluster holds them, as objects of an [`Install`].
async fn cluster_secrets(client: &kube::Client, namespace: &str) -> Vec<Value> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    secrets
        .list(&Default::default())
        .await
        .expect("list the Secrets")
        .items
        .into_iter()
        .map(|mut secret| {
            secret.metadata.managed_fields = None;
            let mut value = serde_json::to_value(secret).unwrap();
            value["apiVersion"] = json!("v1");
            value["kind"] = json!("Secret");
            value
        })
        .collect()
}

/// Starts the StatefulSet's containers of `pod` as processes with the files of the
/// `secrets` its volumes name: poolmgrd's part by an embedded battery serving what its
/// `config.json` says, then `serve` with the chart's args. Returns both, `serve` last.
async fn start_pod(
    dir: &Path,
    install: &Install,
    listen: &str,
    kubeconfig: &Path,
) -> (Process, Process) {
    let (pod, _) = serve_args_in(install);
    let binary = battery_e2e::apiserver::target_binary("battery-apiserver", "battery-apiserver");

    let battery = container(&pod, "battery");
    let battery_root = dir.join("battery");
    project_secrets(install, &pod, battery, &battery_root);
    let config_path = under(&battery_root, Path::new(&poolmgrd_flag(battery, "config")));
    let config: Value = serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    let token = check_poolmgrd_config(install, &config);
    let token_file = dir.join("poolmgrd-token");
    std::fs::write(&token_file, &token).unwrap();
    let tls = &config["api_server"]["tls"];
    let file = |field: &str| under(&battery_root, Path::new(tls[field].as_str().unwrap()));
    let mut command = tokio::process::Command::new(&binary);
    command
        .args([
            "embedded-battery",
            "--listen",
            "127.0.0.1:0",
            "--sweep-interval",
            "2s",
        ])
        .arg("--tls-cert-file")
        .arg(file("cert_file"))
        .arg("--tls-private-key-file")
        .arg(file("key_file"))
        .arg("--client-ca-file")
        .arg(file("client_ca_file"))
        .arg("--basic-auth-token-file")
        .arg(&token_file);
    let (battery_process, address) =
        Process::start(command, &dir.join("battery.log"), BATTERY_SERVING_PREFIX).await;
    // poolmgrd's address is in its config; the embedded battery's port is its own, as
    // 50051 may be taken here.
    let configured: std::net::SocketAddr = config["api_server"]["addr"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let served: std::net::SocketAddr = address.trim().parse().expect("host:port");
    assert_eq!(served.ip(), configured.ip());

    let apiserver = container(&pod, "apiserver");
    let apiserver_root = dir.join("apiserver");
    project_secrets(install, &pod, apiserver, &apiserver_root);
    let mut command = tokio::process::Command::new(&binary);
    command.args(serve_args(
        apiserver,
        &apiserver_root,
        listen,
        &served.to_string(),
        kubeconfig,
    ));
    let (serve, _) = Process::start(command, &dir.join("serve.log"), SERVE_SERVING_PREFIX).await;
    (battery_process, serve)
}

/// Every object of the release's manifest, looked up as the admin: those still there.
async fn still_there(client: &kube::Client, manifest: &[Value]) -> Vec<String> {
    let mut there = Vec::new();
    for object in manifest {
        let (group, version) = match object["apiVersion"].as_str().unwrap().split_once('/') {
            Some((group, version)) => (group, version),
            None => ("", object["apiVersion"].as_str().unwrap()),
        };
        let kind = object["kind"].as_str().unwrap();
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
        let name = object["metadata"]["name"].as_str().unwrap();
        let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
            Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        if api.get_opt(name).await.expect("a lookup").is_some() {
            there.push(format!("{kind} {name}"));
        }
    }
    there
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_installs_upgrades_and_uninstalls_the_chart_on_a_real_control_plane() {
    let dir = tempfile::Builder::new()
        .prefix("battery-helm-e2e-")
        .tempdir()
        .unwrap();
    let dir = dir.path();
    let plane = ControlPlane::start(&dir.join("cluster"), Options::default()).await;
    let admin = plane.admin().await;
    let helm = Helm {
        kubeconfig: plane.admin_kubeconfig(),
        home: dir.join("helm"),
    };
    let chart = chart();
    let chart = chart.to_str().unwrap();

    // docs/install.md, with `certs`: the namespace, and the Secrets `certs` writes.
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    for name in [NAMESPACE, TEAM] {
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        };
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap_or_else(|e| panic!("create the namespace {name}: {e}"));
    }
    let certs_dir = dir.join("certs");
    write_certs(&certs_dir, NAMESPACE);
    let mut apply = tokio::process::Command::new(
        battery_e2e::apiserver::kubectl_paths()
            .last()
            .expect("a kubectl"),
    );
    apply
        .arg("--kubeconfig")
        .arg(plane.admin_kubeconfig())
        .args(["apply", "--server-side", "-f"])
        .arg(certs_dir.join(certs::SECRETS_FILE))
        .arg("-f")
        .arg(certs_dir.join(certs::BATTERY_SECRETS_FILE));
    let applied = apply.output().await.expect("kubectl apply");
    assert!(applied.status.success(), "{applied:?}");

    let address = free_loopback_ip().to_string();
    let install = |verb: &'static str, more: &[&'static str]| -> Vec<String> {
        [verb, RELEASE, chart, "--namespace", NAMESPACE]
            .into_iter()
            .chain([
                "--post-renderer",
                POST_RENDERER,
                "--post-renderer-args",
                &address,
            ])
            .chain(more.iter().copied())
            .map(str::to_owned)
            .collect()
    };

    // Values outside the schema: refused by `helm install`, naming them, with nothing
    // installed.
    for (set, named) in REFUSED {
        let args = install("install", &["--set", set]);
        let output = helm.output(&args).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success(),
            "helm install --set {set} installed"
        );
        assert!(stderr.contains(named), "--set {set}: {stderr}");
    }
    let services: Api<APIService> = Api::all(admin.clone());
    assert!(services.get_opt(API_SERVICE).await.unwrap().is_none());
    assert_eq!(helm.run(&["list", "-n", NAMESPACE, "-q"]).await.trim(), "");

    // The install: NOTES.txt prints the next commands, the APIService's check ...
    let notes = helm.run(&install("install", &[])).await;
    assert!(
        notes.contains(&format!("kubectl get apiservice {API_SERVICE}")),
        "{notes}"
    );
    // ... and a first claim, by a Holder bound to the shipped role.
    for next in ["--clusterrole battery-holder", "kind: MicroVMClaim"] {
        assert!(notes.contains(next), "{notes}");
    }
    assert!(!notes.contains("no caBundle"), "{notes}");
    // The caBundle is the serving CA of the Secret `certs` wrote, which the chart read.
    let api_service = services.get(API_SERVICE).await.unwrap();
    let serving: Secret = Api::namespaced(admin.clone(), NAMESPACE)
        .get(certs::SERVING_SECRET)
        .await
        .unwrap();
    assert_eq!(
        api_service.spec.unwrap().ca_bundle,
        serving.data.unwrap().remove("ca.crt")
    );

    // The pod's containers, as the release renders them, with the cluster's Secrets.
    let (mut rendered, others) = helm_template(&[]);
    assert!(others.is_empty());
    rendered
        .objects
        .extend(cluster_secrets(&admin, NAMESPACE).await);
    let serve_kubeconfig = plane
        .service_account_kubeconfig(NAMESPACE, "battery-apiserver")
        .await;
    let listen = format!("{address}:{SERVICE_PORT}");
    let (_battery, _serve) = start_pod(dir, &rendered, &listen, &serve_kubeconfig).await;
    cluster_install::wait_available(&plane, "True").await;
    cluster_install::wait_discovered(&plane).await;

    // A Pool, as the admin; a Holder bound to the shipped role alone claims from it.
    let pools: Api<Pool> = Api::namespaced(admin.clone(), TEAM);
    let mut pool: Pool = serde_json::from_value(battery_apiserver::dev::dev_pool(2)).unwrap();
    pool.metadata.namespace = Some(TEAM.to_owned());
    let pool_name = pool.metadata.name.clone().unwrap();
    pools.create(&PostParams::default(), &pool).await.unwrap();
    eventually(WAIT, "the Pool's MicroVMs", async || {
        let pool = pools.get(&pool_name).await.map_err(|e| e.to_string())?;
        match pool.status.as_ref().map(|s| s.available) {
            Some(available) if available >= 1 => Ok(()),
            other => Err(format!("available {other:?}")),
        }
    })
    .await;
    let holder_kubeconfig = plane.service_account_kubeconfig(TEAM, HOLDER).await;
    let bindings: Api<RoleBinding> = Api::namespaced(admin.clone(), TEAM);
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some(format!("{HOLDER}-holder")),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_owned(),
            kind: "ClusterRole".to_owned(),
            name: "battery-holder".to_owned(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_owned(),
            name: HOLDER.to_owned(),
            namespace: Some(TEAM.to_owned()),
            ..Default::default()
        }]),
    };
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let holder = battery_e2e::kube_client(&holder_kubeconfig).await;
    let claims: Api<MicroVMClaim> = Api::namespaced(holder, TEAM);
    let claim: MicroVMClaim = serde_json::from_value(json!({
        "apiVersion": battery_types::API_VERSION,
        "kind": "MicroVMClaim",
        "metadata": {"name": "first"},
        "spec": {"poolRef": {"name": pool_name}, "serviceAccountName": HOLDER},
    }))
    .unwrap();
    // RBAC's informers hear of the binding a moment after its create answers.
    let bound = eventually(WAIT, "the Holder's claim", async || {
        claims
            .create(&PostParams::default(), &claim)
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    let status = bound.status.expect("a status");
    assert_eq!(status.phase, Some(ClaimPhase::Bound));
    assert!(status.micro_vm.is_some(), "{status:?}");

    // An upgrade with a changed value: the PodDisruptionBudget goes, the rest serves on.
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(admin.clone(), NAMESPACE);
    assert!(
        budgets
            .get_opt("battery-apiserver")
            .await
            .unwrap()
            .is_some()
    );
    let upgrade = install(
        "upgrade",
        &[
            "--reuse-values",
            "--set",
            "apiserver.podDisruptionBudget.enabled=false",
        ],
    );
    helm.run(&upgrade).await;
    assert!(
        budgets
            .get_opt("battery-apiserver")
            .await
            .unwrap()
            .is_none()
    );
    let status: Value = serde_json::from_str(
        &helm
            .run(&["status", RELEASE, "-n", NAMESPACE, "-o", "json"])
            .await,
    )
    .unwrap();
    assert_eq!(status["version"], 2, "{status:#}");
    assert_eq!(status["info"]["status"], "deployed", "{status:#}");
    assert_eq!(
        status["config"]["apiserver"]["podDisruptionBudget"]["enabled"],
        false
    );
    cluster_install::wait_available(&plane, "True").await;
    let claim = claims.get("first").await.unwrap();
    assert_eq!(claim.status.and_then(|s| s.phase), Some(ClaimPhase::Bound));
    // The Holder releases it.
    claims
        .delete("first", &DeleteParams::default())
        .await
        .unwrap();

    // The uninstall leaves nothing of the release: no APIService, no RBAC.
    let manifest = documents(
        &helm
            .run(&["get", "manifest", RELEASE, "-n", NAMESPACE])
            .await,
    );
    let kinds: BTreeSet<&str> = manifest.iter().filter_map(|o| o["kind"].as_str()).collect();
    for kind in [
        "APIService",
        "ClusterRole",
        "ClusterRoleBinding",
        "RoleBinding",
        "ServiceAccount",
    ] {
        assert!(kinds.contains(kind), "no {kind} in the release: {kinds:?}");
    }
    helm.run(&["uninstall", RELEASE, "-n", NAMESPACE, "--wait"])
        .await;
    eventually(WAIT, "the release's objects to go", async || {
        let there = still_there(&admin, &manifest).await;
        if there.is_empty() {
            Ok(())
        } else {
            Err(format!("{there:?}"))
        }
    })
    .await;
    assert!(services.get_opt(API_SERVICE).await.unwrap().is_none());
    let roles: Api<ClusterRole> = Api::all(admin.clone());
    let ours = roles
        .list(
            &kube::api::ListParams::default().labels("app.kubernetes.io/part-of=battery-apiserver"),
        )
        .await
        .unwrap();
    assert!(ours.items.is_empty(), "{:?}", ours.items);
    assert_eq!(helm.run(&["list", "-n", NAMESPACE, "-q"]).await.trim(), "");
}
