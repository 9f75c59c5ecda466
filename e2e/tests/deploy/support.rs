//! What tests/deploy.rs reads the install with: the repository's files, kubectl's
//! rendering, objects checked strictly against their k8s-openapi types, and the pod
//! specs' containers, flags and volumes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser as _;
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, PodSpec, Secret, Service, ServiceAccount, Volume,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use serde::Deserialize as _;
use serde_json::Value;

/// The label the agent's Nodes carry, as the README documents it.
pub const HOST_LABEL: &str = "battery.liquidmetal-x.dev/host";

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_owned()
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Runs `command`, expecting success; its stdout.
pub fn run(mut command: Command) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8")
}

/// `kubectl kustomize dir`, with the suite's newest kubectl.
pub fn kustomize(dir: &Path) -> String {
    let kubectl = battery_e2e::apiserver::kubectl_paths()
        .last()
        .expect("a kubectl");
    let mut command = Command::new(kubectl);
    command.arg("kustomize").arg(dir);
    run(command)
}

/// The YAML stream's documents.
pub fn documents(yaml: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(yaml)
        .map(|document| Value::deserialize(document).expect("a YAML document"))
        .filter(|document| !document.is_null())
        .collect()
}

/// `document` as a `T`; any field `T` does not have fails.
pub fn strict<T: serde::de::DeserializeOwned>(document: &Value) -> T {
    let mut unknown = Vec::new();
    let object = serde_ignored::deserialize(document.clone(), |path| {
        unknown.push(path.to_string());
    })
    .unwrap_or_else(|e| panic!("{e} in {document:#}"));
    assert!(
        unknown.is_empty(),
        "unknown fields {unknown:?} in {} {}",
        document["kind"],
        document["metadata"]["name"]
    );
    object
}

pub fn check<T>(document: &Value)
where
    T: serde::de::DeserializeOwned + k8s_openapi::Resource,
{
    assert_eq!(
        document["apiVersion"],
        T::API_VERSION,
        "{}",
        document["metadata"]["name"]
    );
    strict::<T>(document);
}

/// Checks each Kubernetes object against its k8s-openapi type; returns the others
/// (cert-manager's) by kind.
pub fn validate(objects: &[Value]) -> BTreeMap<String, Vec<Value>> {
    let mut others: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for object in objects {
        match object["kind"].as_str().expect("a kind") {
            "Namespace" => check::<Namespace>(object),
            "ServiceAccount" => check::<ServiceAccount>(object),
            "ClusterRole" => check::<ClusterRole>(object),
            "ClusterRoleBinding" => check::<ClusterRoleBinding>(object),
            "Role" => check::<Role>(object),
            "RoleBinding" => check::<RoleBinding>(object),
            "ConfigMap" => check::<ConfigMap>(object),
            "Secret" => check::<Secret>(object),
            "Service" => check::<Service>(object),
            "StatefulSet" => check::<StatefulSet>(object),
            "DaemonSet" => check::<DaemonSet>(object),
            "PodDisruptionBudget" => check::<PodDisruptionBudget>(object),
            "APIService" => check::<APIService>(object),
            kind => others
                .entry(kind.to_owned())
                .or_default()
                .push(object.clone()),
        }
    }
    others
}

/// The objects of one rendering, typed on demand.
pub struct Install {
    pub objects: Vec<Value>,
}

impl Install {
    pub fn checked_in() -> Self {
        let objects = documents(&read(&repo().join("deploy/install.yaml")));
        let others = validate(&objects);
        assert!(others.is_empty(), "objects of no known kind: {others:?}");
        Self { objects }
    }

    pub fn all<T>(&self) -> Vec<T>
    where
        T: serde::de::DeserializeOwned + k8s_openapi::Resource,
    {
        self.objects
            .iter()
            .filter(|o| o["kind"] == T::KIND && o["apiVersion"] == T::API_VERSION)
            .map(strict)
            .collect()
    }

    pub fn one<T>(&self, name: &str) -> T
    where
        T: serde::de::DeserializeOwned
            + k8s_openapi::Resource
            + k8s_openapi::Metadata<Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
    {
        let mut found: Vec<T> = self
            .all::<T>()
            .into_iter()
            .filter(|o| o.metadata().name.as_deref() == Some(name))
            .collect();
        assert_eq!(found.len(), 1, "{} {name}", T::KIND);
        found.remove(0)
    }
}

pub fn pod_spec(spec: Option<k8s_openapi::api::core::v1::PodTemplateSpec>) -> PodSpec {
    spec.and_then(|t| t.spec).expect("a pod spec")
}

pub fn container<'a>(pod: &'a PodSpec, name: &str) -> &'a Container {
    pod.containers
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// The argv of `container`: its image's entrypoint name, then its args.
pub fn argv(binary: &str, container: &Container) -> Vec<String> {
    assert!(container.command.is_none(), "the image's entrypoint runs");
    std::iter::once(binary.to_owned())
        .chain(container.args.clone().unwrap_or_default())
        .collect()
}

/// The volume mounted in `container` at the directory holding `file`, and the mount path.
pub fn volume_of<'a>(pod: &'a PodSpec, container: &Container, file: &Path) -> (&'a Volume, String) {
    let mount = container
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| file.starts_with(&m.mount_path))
        .max_by_key(|m| m.mount_path.len())
        .unwrap_or_else(|| panic!("{} is on no volume of {}", file.display(), container.name));
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .unwrap_or_else(|| panic!("no volume {}", mount.name));
    (volume, mount.mount_path.clone())
}

/// The Secret and key `file` is projected from in `container`.
pub fn secret_file(pod: &PodSpec, container: &Container, file: &Path) -> (String, String) {
    let (volume, mount_path) = volume_of(pod, container, file);
    let secret = volume
        .secret
        .as_ref()
        .unwrap_or_else(|| panic!("{} is not from a Secret", file.display()));
    let key = file
        .strip_prefix(&mount_path)
        .unwrap()
        .display()
        .to_string();
    if let Some(items) = &secret.items {
        assert!(
            items.iter().any(|i| i.path == key),
            "{} projects no {key}",
            volume.name
        );
    }
    (secret.secret_name.clone().unwrap(), key)
}

pub fn serve_args() -> (PodSpec, Box<battery_apiserver::cli::ServeArgs>) {
    serve_args_in(&Install::checked_in())
}

/// The StatefulSet's pod in `install`, and its `serve` flags.
pub fn serve_args_in(install: &Install) -> (PodSpec, Box<battery_apiserver::cli::ServeArgs>) {
    let set: StatefulSet = install.one("battery-apiserver");
    let pod = pod_spec(set.spec.map(|s| s.template));
    let cli = battery_apiserver::cli::Cli::try_parse_from(argv(
        "battery-apiserver",
        container(&pod, "apiserver"),
    ))
    .unwrap_or_else(|e| panic!("the StatefulSet's battery-apiserver args: {e}"));
    match cli.command {
        battery_apiserver::cli::Command::Serve(args) => (pod, args),
        other => panic!("the StatefulSet runs {other:?}, not serve"),
    }
}

pub fn agent_cli() -> (PodSpec, battery_agent::config::Cli) {
    agent_cli_in(&Install::checked_in())
}

/// The DaemonSet's pod in `install`, and its `battery-agent` flags.
pub fn agent_cli_in(install: &Install) -> (PodSpec, battery_agent::config::Cli) {
    let set: DaemonSet = install.one("battery-agent");
    let pod = pod_spec(set.spec.map(|s| s.template));
    let cli =
        battery_agent::config::Cli::try_parse_from(argv("battery-agent", container(&pod, "agent")))
            .unwrap_or_else(|e| panic!("the DaemonSet's battery-agent args: {e}"));
    (pod, cli)
}
pub fn pod_labels(name: &str) -> Option<BTreeMap<String, String>> {
    let set: StatefulSet = Install::checked_in().one(name);
    set.spec
        .and_then(|s| s.template.metadata)
        .and_then(|m| m.labels)
}
/// The name of the volume `file` is on in `container`.
pub fn volume_name(container: &Container, file: &Path) -> String {
    container
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| file.starts_with(&m.mount_path))
        .max_by_key(|m| m.mount_path.len())
        .unwrap_or_else(|| panic!("{} is on no volume", file.display()))
        .name
        .clone()
}
/// One row of the README's Roles table: (role, API group, resource, verb).
pub type Grant = (String, String, String, String);

/// The rows of the README table under `heading`, as cells without backticks.
pub fn readme_table(heading: &str) -> Vec<Vec<String>> {
    let readme = read(&repo().join("deploy/README.md"));
    let section = readme
        .split_once(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("the README has no {heading}"))
        .1;
    section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|row| {
            row.trim_matches('|')
                .split('|')
                .map(|cell| cell.trim().replace('`', ""))
                .collect()
        })
        .collect()
}

pub fn list(cell: &str) -> Vec<String> {
    cell.split(',').map(|s| s.trim().to_owned()).collect()
}
/// Copies `from` into `to`, recursively.
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}
/// A Containerfile's instructions, continuation lines joined.
pub fn instructions(path: &Path) -> Vec<(String, String)> {
    read(path)
        .replace("\\\n", " ")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (op, rest) = l.split_once(' ').unwrap_or((l, ""));
            (op.to_uppercase(), rest.trim().to_owned())
        })
        .collect()
}

/// The value of poolmgrd's `-<name>=` flag in `container`.
pub fn poolmgrd_flag(container: &Container, name: &str) -> String {
    container
        .args
        .iter()
        .flatten()
        .find_map(|a| a.strip_prefix(&format!("-{name}=")))
        .unwrap_or_else(|| panic!("poolmgrd has no -{name}"))
        .to_owned()
}

/// The keys of a JSON object, to check one holds only keys poolmgrd knows: it ignores
/// any other, so a misspelt one would silently turn a setting off.
fn keys(object: &Value) -> Vec<&str> {
    object
        .as_object()
        .unwrap_or_else(|| panic!("{object} is not an object"))
        .keys()
        .map(String::as_str)
        .collect()
}

/// Checks poolmgrd's `config.json` against the StatefulSet in `install`: it listens where
/// `serve` dials, serves TLS with the files of its mounted serving Secret, requires
/// client certificates of that Secret's CA and a token, and keeps its metrics on
/// loopback. Returns the token.
pub fn check_poolmgrd_config(install: &Install, config: &Value) -> String {
    use battery_apiserver::certs;
    let (pod, args) = serve_args_in(install);
    let battery = container(&pod, "battery");
    let mut top = keys(config);
    top.sort_unstable();
    assert_eq!(top, ["api_server", "metrics_addr"], "{config:#}");
    let api = &config["api_server"];
    let mut api_keys = keys(api);
    api_keys.sort_unstable();
    assert_eq!(api_keys, ["addr", "basic_auth_token", "tls"], "{config:#}");
    assert_eq!(
        api["addr"],
        args.battery_address.as_str(),
        "where serve dials"
    );
    let tls = &api["tls"];
    let mut tls_keys = keys(tls);
    tls_keys.sort_unstable();
    assert_eq!(
        tls_keys,
        ["cert_file", "client_ca_file", "key_file", "validate_client"],
        "TLS, and not insecure: {config:#}"
    );
    assert_eq!(tls["validate_client"], true);
    for (field, key) in [
        ("cert_file", "tls.crt"),
        ("key_file", "tls.key"),
        ("client_ca_file", "ca.crt"),
    ] {
        let path = tls[field]
            .as_str()
            .unwrap_or_else(|| panic!("api_server.tls.{field}"));
        assert_eq!(
            secret_file(&pod, battery, Path::new(path)),
            (certs::BATTERY_SERVING_SECRET.to_owned(), key.to_owned()),
            "api_server.tls.{field}"
        );
    }
    let metrics: std::net::SocketAddr = config["metrics_addr"]
        .as_str()
        .and_then(|a| a.parse().ok())
        .expect("metrics_addr, host:port");
    assert!(metrics.ip().is_loopback(), "{metrics}");
    let token = api["basic_auth_token"]
        .as_str()
        .expect("api_server.basic_auth_token");
    assert!(!token.trim().is_empty(), "an empty token turns auth off");
    token.to_owned()
}

/// The Secrets the pod specs of `install` mount and cannot do without.
pub fn mounted_secrets(install: &Install) -> BTreeSet<String> {
    let mut pods: Vec<PodSpec> = install
        .all::<StatefulSet>()
        .into_iter()
        .map(|set| pod_spec(set.spec.map(|s| s.template)))
        .collect();
    pods.extend(
        install
            .all::<DaemonSet>()
            .into_iter()
            .map(|set| pod_spec(set.spec.map(|s| s.template))),
    );
    pods.iter()
        .flat_map(|pod| pod.volumes.iter().flatten())
        .filter_map(|volume| volume.secret.as_ref())
        .filter(|secret| secret.optional != Some(true))
        .filter_map(|secret| secret.secret_name.clone())
        .collect()
}

/// Writes the Secrets `container` mounts, from `install`, under `root` as the kubelet
/// projects them at their mount paths; what it reads is then at [`under`]`(root, path)`.
pub fn project_secrets(install: &Install, pod: &PodSpec, container: &Container, root: &Path) {
    for mount in container.volume_mounts.iter().flatten() {
        // A mount of no pod volume is the StatefulSet's claim.
        let Some(source) = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == mount.name)
            .and_then(|v| v.secret.as_ref())
        else {
            continue;
        };
        let name = source.secret_name.as_deref().expect("a Secret's name");
        let secrets: Vec<Secret> = install.all();
        let Some(secret) = secrets
            .into_iter()
            .find(|s| s.metadata.name.as_deref() == Some(name))
        else {
            assert_eq!(source.optional, Some(true), "no Secret {name}");
            continue;
        };
        let dir = under(root, Path::new(&mount.mount_path));
        std::fs::create_dir_all(&dir).unwrap();
        for (key, value) in secret.data.iter().flatten() {
            let path = source
                .items
                .iter()
                .flatten()
                .find(|item| &item.key == key)
                .map_or(key.as_str(), |item| item.path.as_str());
            std::fs::write(dir.join(path), &value.0).unwrap();
        }
    }
}

/// `path` (absolute, in a container) under `root`.
pub fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").expect("an absolute path"))
}

/// Runs `battery-apiserver certs` into a copy of `deploy/`'s self-signed overlay and
/// renders it: the scratch directory (kept alive by the caller) and the objects.
pub fn self_signed_install() -> (tempfile::TempDir, Install) {
    let scratch = tempfile::tempdir().unwrap();
    let deploy = scratch.path().join("deploy");
    copy_tree(&repo().join("deploy"), &deploy);
    let overlay = deploy.join("overlays/self-signed");
    // A checkout's own certificates, if it made some, are not the test's.
    if overlay.join("certs").exists() {
        std::fs::remove_dir_all(overlay.join("certs")).unwrap();
    }
    write_certs(&overlay.join("certs"), "battery-system");
    let objects = documents(&kustomize(&overlay));
    let others = validate(&objects);
    assert!(others.is_empty(), "{others:?}");
    (scratch, Install { objects })
}

/// Runs `battery-apiserver certs --out out --namespace namespace`, as a user does.
pub fn write_certs(out: &Path, namespace: &str) {
    let cli = battery_apiserver::cli::Cli::try_parse_from([
        "battery-apiserver",
        "certs",
        "--out",
        out.to_str().expect("a UTF-8 path"),
        "--namespace",
        namespace,
    ])
    .expect("certs' flags");
    let battery_apiserver::cli::Command::Certs(args) = cli.command else {
        panic!("parsed another command");
    };
    battery_apiserver::certs::write(&args).expect("battery-apiserver certs");
}

/// The helm that e2e/go/build builds from helm's Go module, beside the control plane.
pub fn helm_binary() -> PathBuf {
    battery_e2e::control_plane::binaries().join("helm")
}

/// The chart, in the repository.
pub fn chart() -> PathBuf {
    repo().join("deploy/charts/battery-apiserver")
}

/// `helm template` of the chart as the release `battery-apiserver` in `battery-system`,
/// with `args` (`--set ...`), checked strictly: the objects of no known kind (cert-manager's,
/// prometheus-operator's) are returned apart, by kind.
pub fn helm_template(args: &[&str]) -> (Install, BTreeMap<String, Vec<Value>>) {
    let output = helm_template_output(args);
    assert!(
        output.status.success(),
        "helm template {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let objects = documents(std::str::from_utf8(&output.stdout).expect("UTF-8"));
    let others = validate(&objects);
    (Install { objects }, others)
}

/// `helm template` as [`helm_template`] runs it, whatever its outcome.
pub fn helm_template_output(args: &[&str]) -> std::process::Output {
    let mut command = Command::new(helm_binary());
    command
        .args(["template", "battery-apiserver"])
        .arg(chart())
        .args(["--namespace", "battery-system"])
        .args(args);
    command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"))
}
