//! The install (`deploy/`): `install.yaml` is the base as `scripts/render-install`
//! renders it, every object in it and in the overlays is a valid Kubernetes object (an
//! unknown field fails), and the objects say what `deploy/README.md` says: the
//! APIService reaches the server, the StatefulSet runs one restricted replica on a
//! volume, the containers' flags are the binaries' real flags, and the RBAC grants what
//! the README's tables list. No cluster: kubectl only renders.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use battery_apiserver::certs;
use clap::Parser as _;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use serde_json::Value;

#[path = "deploy/support.rs"]
mod support;

use support::*;

#[test]
fn install_yaml_is_the_base_as_render_install_renders_it() {
    let checked_in = read(&repo().join("deploy/install.yaml"));
    // Both kubectl releases the suite covers, so neither one's kustomize drifts.
    for kubectl in battery_e2e::apiserver::kubectl_paths() {
        let mut command = Command::new(repo().join("scripts/render-install"));
        command.arg("-").env("KUBECTL", kubectl);
        let rendered = run(command);
        assert!(
            rendered == checked_in,
            "deploy/install.yaml is not deploy/base as {} renders it: run scripts/render-install",
            kubectl.display()
        );
    }
    // `kubectl kustomize deploy/` is the base too.
    let base = documents(&kustomize(&repo().join("deploy/base")));
    assert_eq!(documents(&kustomize(&repo().join("deploy"))), base);
}

#[test]
fn an_unknown_field_fails_validation() {
    let mut object = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "a"},
    });
    strict::<ServiceAccount>(&object);
    object["metadata"]["labelz"] = serde_json::json!({});
    let caught = std::panic::catch_unwind(|| strict::<ServiceAccount>(&object));
    assert!(caught.is_err(), "an unknown field passed");
}

#[test]
fn every_object_of_install_yaml_is_a_valid_kubernetes_object() {
    let install = Install::checked_in();
    let kinds: BTreeSet<&str> = install
        .objects
        .iter()
        .filter_map(|o| o["kind"].as_str())
        .collect();
    for kind in [
        "Namespace",
        "StatefulSet",
        "DaemonSet",
        "Service",
        "APIService",
        "PodDisruptionBudget",
    ] {
        assert!(kinds.contains(kind), "no {kind} in install.yaml");
    }
    let namespace: Namespace = install.one("battery-system");
    for object in &install.objects {
        let namespace_of = object["metadata"]["namespace"].as_str();
        let cluster_scoped = matches!(
            object["kind"].as_str(),
            Some("Namespace" | "ClusterRole" | "ClusterRoleBinding" | "APIService")
        );
        match (cluster_scoped, namespace_of) {
            (true, None) => {}
            // The one object outside: the authentication reader's binding.
            (false, Some("kube-system")) => assert_eq!(object["kind"], "RoleBinding"),
            (false, Some(ns)) => assert_eq!(Some(ns), namespace.metadata.name.as_deref()),
            _ => panic!(
                "misplaced {} {}",
                object["kind"], object["metadata"]["name"]
            ),
        }
    }
}

#[test]
fn the_api_service_points_at_the_service_and_its_port() {
    let install = Install::checked_in();
    let api_service: APIService = install.one(certs::API_SERVICE);
    let spec = api_service.spec.expect("a spec");
    assert_eq!(spec.group.as_deref(), Some(battery_types::GROUP));
    assert_eq!(spec.version.as_deref(), Some("v1alpha1"));
    assert_ne!(spec.insecure_skip_tls_verify, Some(true));
    let reference = spec.service.expect("a Service");
    let service: Service = install.one(reference.name.as_deref().unwrap());
    assert_eq!(service.metadata.namespace, reference.namespace);
    let service_spec = service.spec.expect("a spec");
    let port = service_spec
        .ports
        .iter()
        .flatten()
        .find(|p| Some(p.port) == reference.port)
        .expect("the APIService's port on the Service");
    // Discovery answers while battery is down: the pod stays an endpoint.
    assert_eq!(service_spec.publish_not_ready_addresses, Some(true));

    let (pod, args) = serve_args();
    assert_eq!(
        service_spec.selector.as_ref(),
        pod_labels("battery-apiserver").as_ref()
    );
    let apiserver = container(&pod, "apiserver");
    let container_port = match &port.target_port {
        Some(IntOrString::String(name)) => {
            apiserver
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name))
                .expect("the Service's target port on the container")
                .container_port
        }
        other => panic!("target port {other:?}: name the container's port"),
    };
    assert_eq!(i32::from(args.listen.port()), container_port);
}

#[test]
fn the_stateful_set_runs_one_restricted_replica_with_battery_on_a_volume() {
    let install = Install::checked_in();
    let set: StatefulSet = install.one("battery-apiserver");
    let spec = set.spec.clone().expect("a spec");
    assert_eq!(spec.replicas, Some(1), "battery runs as one replica");
    let claims = spec.volume_claim_templates.clone().unwrap_or_default();
    assert_eq!(claims.len(), 1);
    let data = claims[0].metadata.name.clone().unwrap();
    let (pod, args) = serve_args();

    let pod_security = pod
        .security_context
        .as_ref()
        .expect("a pod security context");
    assert_eq!(pod_security.run_as_non_root, Some(true));
    assert_eq!(
        pod_security
            .seccomp_profile
            .as_ref()
            .map(|p| p.type_.as_str()),
        Some("RuntimeDefault")
    );
    for container in &pod.containers {
        let sc = container
            .security_context
            .as_ref()
            .unwrap_or_else(|| panic!("{} has no security context", container.name));
        assert_eq!(sc.run_as_non_root, Some(true), "{}", container.name);
        assert_eq!(
            sc.read_only_root_filesystem,
            Some(true),
            "{}",
            container.name
        );
        assert_eq!(
            sc.allow_privilege_escalation,
            Some(false),
            "{}",
            container.name
        );
        assert_eq!(
            sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
            Some(vec!["ALL".to_owned()]),
            "{}",
            container.name
        );
        assert_eq!(
            sc.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
            Some("RuntimeDefault"),
            "{}",
            container.name
        );
        assert!(
            container.resources.is_some(),
            "{} has no resources",
            container.name
        );
    }

    let apiserver = container(&pod, "apiserver");
    for (probe, path) in [
        (&apiserver.liveness_probe, "/livez"),
        (&apiserver.readiness_probe, "/readyz"),
    ] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .unwrap_or_else(|| panic!("no {path} probe"));
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(get.scheme.as_deref(), Some("HTTPS"));
        assert_eq!(get.port, IntOrString::String("https".to_owned()));
    }

    // Both databases on the claimed volume.
    let data_dir = args
        .data_dir
        .clone()
        .expect("--data-dir: metadata on the volume");
    assert_eq!(volume_name(apiserver, &data_dir), data);
    assert!(
        pod.volumes.iter().flatten().all(|v| v.name != data),
        "{data} is the claimed volume, not a pod volume"
    );
    let battery = container(&pod, "battery");
    let battery_args = battery.args.clone().unwrap_or_default();
    let flag = |name: &str| {
        battery_args
            .iter()
            .find_map(|a| a.strip_prefix(&format!("-{name}=")))
            .unwrap_or_else(|| panic!("poolmgrd has no -{name}"))
            .to_owned()
    };
    assert_eq!(volume_name(battery, Path::new(&flag("db"))), data);

    // battery listens where the server dials it: on loopback, in plain text.
    let config_path = PathBuf::from(flag("config"));
    let (config_volume, mount) = volume_of(&pod, battery, &config_path);
    let config_map: ConfigMap = install.one(
        config_volume
            .config_map
            .as_ref()
            .expect("a ConfigMap")
            .name
            .as_str(),
    );
    let key = config_path
        .strip_prefix(&mount)
        .unwrap()
        .display()
        .to_string();
    let config: Value =
        serde_json::from_str(&config_map.data.expect("data")[&key]).expect("JSON config");
    let battery_addr: std::net::SocketAddr = config["api_server"]["addr"]
        .as_str()
        .expect("api_server.addr")
        .parse()
        .expect("an address");
    assert!(battery_addr.ip().is_loopback());
    assert_eq!(config["api_server"]["tls"]["insecure"], true);
    assert_eq!(args.battery_address, format!("http://{battery_addr}"));

    // The certificates come from the Secrets either overlay makes.
    for (file, secret, key) in [
        (&args.tls_cert_file, certs::SERVING_SECRET, "tls.crt"),
        (&args.tls_private_key_file, certs::SERVING_SECRET, "tls.key"),
        (
            args.agent_ca_file.as_ref().unwrap(),
            certs::AGENT_CA_SECRET,
            "tls.crt",
        ),
        (
            args.agent_signing_cert_file.as_ref().unwrap(),
            certs::AGENT_CA_SECRET,
            "tls.crt",
        ),
        (
            args.agent_signing_key_file.as_ref().unwrap(),
            certs::AGENT_CA_SECRET,
            "tls.key",
        ),
        (
            args.agent_client_cert_file.as_ref().unwrap(),
            certs::RELAY_CLIENT_SECRET,
            "tls.crt",
        ),
        (
            args.agent_client_key_file.as_ref().unwrap(),
            certs::RELAY_CLIENT_SECRET,
            "tls.key",
        ),
    ] {
        assert_eq!(
            secret_file(&pod, apiserver, file),
            (secret.to_owned(), key.to_owned()),
            "{}",
            file.display()
        );
    }

    let budget: PodDisruptionBudget = install.one("battery-apiserver");
    let budget = budget.spec.expect("a spec");
    assert_eq!(
        budget.selector.and_then(|s| s.match_labels),
        pod_labels("battery-apiserver")
    );
    assert_eq!(budget.min_available, Some(IntOrString::Int(1)));
}

#[test]
fn the_agent_runs_on_labelled_nodes_with_what_its_checks_read() {
    let (pod, cli) = agent_cli();
    assert_eq!(pod.host_network, Some(true));
    // Privileged for the devices, but not root: no capabilities.
    let security = pod
        .security_context
        .as_ref()
        .expect("a pod security context");
    assert_eq!(security.run_as_non_root, Some(true));
    assert_ne!(security.run_as_user, Some(0));
    assert_eq!(
        pod.node_selector
            .as_ref()
            .and_then(|s| s.get(HOST_LABEL))
            .map(String::as_str),
        Some("true")
    );
    assert!(
        pod.tolerations
            .iter()
            .flatten()
            .any(|t| t.key.as_deref() == Some(HOST_LABEL)),
        "the agent tolerates the Hosts' taint"
    );
    assert!(
        read(&repo().join("deploy/README.md")).contains(&format!("{HOST_LABEL}=true")),
        "the README documents the label"
    );
    let agent = container(&pod, "agent");
    // The checks read the Host's devices, not the container's.
    for device in [&cli.kvm_device, &cli.thin_pool_device] {
        let (volume, _) = volume_of(&pod, agent, device);
        let host_path = volume.host_path.as_ref().expect("a hostPath");
        assert!(device.starts_with(&host_path.path), "{}", device.display());
    }
    assert!(cli.serving_certificate_from_api_server);
    assert_eq!(
        secret_file(&pod, agent, &cli.client_ca_file),
        (
            certs::RELAY_CLIENT_CA_SECRET.to_owned(),
            "ca.crt".to_owned()
        )
    );
    // The Host's name is its Node's.
    let node_name = agent
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "NODE_NAME")
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.as_str());
    assert_eq!(node_name, Some("spec.nodeName"));
    assert!(cli.host_name.is_none());
    for file in [
        &cli.kubeconfig,
        &cli.flintlock_ca_file,
        &cli.flintlock_cert_file,
        &cli.flintlock_key_file,
    ] {
        let file = file.as_ref().expect("a Host file");
        let (volume, _) = volume_of(&pod, agent, file);
        assert!(
            volume.host_path.is_some(),
            "{} comes from the Host",
            file.display()
        );
    }
    // The Host it registers names battery's own files.
    let (battery_pod, _) = serve_args();
    let battery = container(&battery_pod, "battery");
    for file in [
        &cli.host_tls_ca_file,
        &cli.host_tls_cert_file,
        &cli.host_tls_key_file,
    ] {
        let file = PathBuf::from(file.as_ref().expect("a spec.tls file"));
        let (volume, _) = volume_of(&battery_pod, battery, &file);
        assert!(volume.secret.is_some(), "{}", file.display());
    }
    // The agent authenticates with the Host's certificate, not a token.
    assert_eq!(pod.automount_service_account_token, Some(false));
}

#[test]
fn the_rbac_grants_what_the_readme_says() {
    let install = Install::checked_in();
    let mut granted: BTreeSet<Grant> = BTreeSet::new();
    let mut aggregated: BTreeSet<(String, String)> = BTreeSet::new();
    for role in install.all::<ClusterRole>() {
        let name = role.metadata.name.clone().unwrap();
        for rule in role.rules.iter().flatten() {
            for group in rule.api_groups.iter().flatten() {
                for resource in rule.resources.iter().flatten() {
                    for verb in &rule.verbs {
                        let group = if group.is_empty() { "core" } else { group };
                        granted.insert((
                            name.clone(),
                            group.to_owned(),
                            resource.clone(),
                            verb.clone(),
                        ));
                    }
                }
            }
        }
        for (label, value) in role.metadata.labels.iter().flatten() {
            if let Some(into) = label.strip_prefix("rbac.authorization.k8s.io/aggregate-to-") {
                assert_eq!(value, "true");
                aggregated.insert((name.clone(), into.to_owned()));
            }
        }
    }
    assert!(
        install.all::<Role>().is_empty(),
        "Roles are not in the README"
    );
    let mut documented: BTreeSet<Grant> = BTreeSet::new();
    for row in readme_table("### Roles") {
        for resource in list(&row[2]) {
            for verb in list(&row[3]) {
                documented.insert((row[0].clone(), row[1].clone(), resource.clone(), verb));
            }
        }
    }
    assert_eq!(
        granted, documented,
        "the ClusterRoles against the README's Roles table"
    );
    let documented: BTreeSet<(String, String)> = readme_table("### Aggregated")
        .into_iter()
        .flat_map(|row| {
            list(&row[1])
                .into_iter()
                .map(move |into| (row[0].clone(), into))
        })
        .collect();
    assert_eq!(
        aggregated, documented,
        "the aggregation labels against the README"
    );

    let subject = |s: &k8s_openapi::api::rbac::v1::Subject| match &s.namespace {
        Some(ns) => format!("{}/{ns}/{}", s.kind, s.name),
        None => format!("{}/{}", s.kind, s.name),
    };
    let mut bound: BTreeSet<(String, String, String)> = BTreeSet::new();
    for binding in install.all::<ClusterRoleBinding>() {
        for s in binding.subjects.iter().flatten() {
            bound.insert((
                format!(
                    "ClusterRoleBinding/{}",
                    binding.metadata.name.clone().unwrap()
                ),
                format!("{}/{}", binding.role_ref.kind, binding.role_ref.name),
                subject(s),
            ));
        }
    }
    for binding in install.all::<RoleBinding>() {
        for s in binding.subjects.iter().flatten() {
            bound.insert((
                format!(
                    "RoleBinding/{}/{}",
                    binding.metadata.namespace.clone().unwrap(),
                    binding.metadata.name.clone().unwrap()
                ),
                format!("{}/{}", binding.role_ref.kind, binding.role_ref.name),
                subject(s),
            ));
        }
    }
    let documented: BTreeSet<(String, String, String)> = readme_table("### Bindings")
        .into_iter()
        .map(|row| (row[0].clone(), row[1].clone(), row[2].clone()))
        .collect();
    assert_eq!(bound, documented, "the bindings against the README");
}

#[test]
fn the_cert_manager_overlay_makes_the_secrets_the_base_mounts() {
    let objects = documents(&kustomize(&repo().join("deploy/overlays/cert-manager")));
    let others = validate(&objects);
    let certificates = &others["Certificate"];
    let certificate = |name: &str| {
        certificates
            .iter()
            .find(|c| c["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no Certificate {name}"))["spec"]
            .clone()
    };
    let made: BTreeSet<&str> = certificates
        .iter()
        .filter_map(|c| c["spec"]["secretName"].as_str())
        .collect();
    for secret in [
        certs::SERVING_SECRET,
        certs::AGENT_CA_SECRET,
        certs::RELAY_CLIENT_SECRET,
        certs::RELAY_CLIENT_CA_SECRET,
    ] {
        assert!(made.contains(secret), "no Certificate makes {secret}");
    }
    let serving = certificate(certs::SERVING_SECRET);
    assert!(
        serving["dnsNames"]
            .as_array()
            .unwrap()
            .contains(&Value::from("battery-apiserver.battery-system.svc"))
    );
    // The agent CA and the relay client CA are two (ADR 0013).
    assert_eq!(certificate(certs::AGENT_CA_SECRET)["isCA"], true);
    assert_eq!(certificate(certs::RELAY_CLIENT_CA_SECRET)["isCA"], true);
    let relay_issuer = certificate(certs::RELAY_CLIENT_SECRET)["issuerRef"]["name"].clone();
    let issuers = &others["Issuer"];
    let issuer = issuers
        .iter()
        .find(|i| i["metadata"]["name"] == relay_issuer)
        .expect("the relay client's Issuer");
    assert_eq!(
        issuer["spec"]["ca"]["secretName"],
        certs::RELAY_CLIENT_CA_SECRET
    );

    let api_service = objects
        .iter()
        .find(|o| o["kind"] == "APIService")
        .expect("the APIService");
    assert_eq!(
        api_service["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        format!("battery-system/{}", certs::SERVING_SECRET)
    );
}

#[test]
fn the_self_signed_overlay_takes_what_certs_writes() {
    let scratch = tempfile::tempdir().unwrap();
    let deploy = scratch.path().join("deploy");
    copy_tree(&repo().join("deploy"), &deploy);
    let overlay = deploy.join("overlays/self-signed");
    // A checkout's own certificates, if it made some, are not the test's.
    if overlay.join("certs").exists() {
        std::fs::remove_dir_all(overlay.join("certs")).unwrap();
    }
    let cli = battery_apiserver::cli::Cli::try_parse_from([
        "battery-apiserver",
        "certs",
        "--out",
        overlay.join("certs").to_str().unwrap(),
    ])
    .unwrap();
    let battery_apiserver::cli::Command::Certs(args) = cli.command else {
        panic!("parsed another command");
    };
    certs::write(&args).unwrap();

    let objects = documents(&kustomize(&overlay));
    let others = validate(&objects);
    assert!(others.is_empty(), "{others:?}");
    let install = Install { objects };
    for secret in [
        certs::SERVING_SECRET,
        certs::AGENT_CA_SECRET,
        certs::RELAY_CLIENT_SECRET,
        certs::RELAY_CLIENT_CA_SECRET,
    ] {
        install.one::<Secret>(secret);
    }
    let serving: Secret = install.one(certs::SERVING_SECRET);
    let api_service: APIService = install.one(certs::API_SERVICE);
    let spec = api_service.spec.unwrap();
    assert_eq!(spec.ca_bundle, serving.data.unwrap().remove("ca.crt"));
    assert!(spec.service.is_some(), "the patch keeps the base's spec");
}

#[test]
fn the_images_are_a_static_binary_from_scratch_as_a_non_root_user() {
    for (file, binary) in [
        ("apiserver", "battery-apiserver"),
        ("agent", "battery-agent"),
    ] {
        let path = repo().join(format!("deploy/images/{file}.Containerfile"));
        let instructions = instructions(&path);
        let of = |op: &str| -> Vec<&String> {
            instructions
                .iter()
                .filter(|(o, _)| o == op)
                .map(|(_, r)| r)
                .collect()
        };
        // Nothing pulled, so nothing to pin; and no RUN, as there is no shell.
        assert_eq!(of("FROM"), [&"scratch".to_owned()], "{file}");
        assert!(of("RUN").is_empty(), "{file}: RUN needs a shell");
        let user = of("USER");
        assert_eq!(user.len(), 1, "{file}");
        for id in user[0].split(':') {
            let id: u32 = id
                .parse()
                .unwrap_or_else(|_| panic!("{file}: USER {id} is not numeric"));
            assert_ne!(id, 0, "{file} runs as root");
        }
        let entrypoint: Vec<String> =
            serde_json::from_str(of("ENTRYPOINT").last().expect("an ENTRYPOINT"))
                .expect("exec form");
        assert_eq!(entrypoint, [format!("/{binary}")], "{file}");
        assert!(
            of("COPY")
                .iter()
                .any(|c| c.ends_with(&format!("{binary} /{binary}"))),
            "{file} copies {binary}"
        );
    }
    // The manifests run our images by tag, and the user the images name.
    let install = Install::checked_in();
    let (pod, _) = serve_args();
    assert_eq!(
        pod.security_context.and_then(|s| s.run_as_user),
        Some(65532)
    );
    for object in &install.objects {
        for container in object["spec"]["template"]["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let image = container["image"].as_str().unwrap();
            let (_, tag) = image
                .rsplit_once(':')
                .unwrap_or_else(|| panic!("{image} has no tag"));
            assert!(tag != "latest" && !tag.is_empty(), "{image}");
        }
    }
}
