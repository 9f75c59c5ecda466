//! The install (`deploy/`): the base, the cert-manager overlay's Certificates and
//! `install.yaml` are what `scripts/render-install` renders from the Helm chart (ADR 38),
//! every object in it and in the overlays is a valid Kubernetes object (an
//! unknown field fails), and the objects say what `deploy/README.md` says: the
//! APIService reaches the server, the StatefulSet runs one restricted replica on a
//! volume, the containers' flags are the binaries' real flags, and the RBAC grants what
//! the README's tables list. The battery channel is secured as poolmgrd's chart secures
//! it: `serve`'s battery files and poolmgrd's config.json come from Secrets both overlays
//! make, with one token, and with the self-signed overlay's files `serve`'s battery client
//! reaches an embedded battery set up as that config.json says. No cluster: kubectl only
//! renders. `helm` (deploy/helm.rs) checks the chart's values, and installs, upgrades and
//! uninstalls it on a real control plane.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use battery_apiserver::certs;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use serde_json::Value;

#[path = "deploy/support.rs"]
mod support;

#[path = "deploy/helm.rs"]
mod helm;

use support::*;

/// The chart is the one source (ADR 38): deploy/base, the cert-manager overlay's
/// Certificates and install.yaml are what `scripts/render-install` renders from it.
#[test]
fn deploy_is_what_render_install_renders_from_the_chart() {
    // Both kubectl releases the suite covers, so neither one's kustomize drifts.
    for kubectl in battery_e2e::apiserver::kubectl_paths() {
        let mut command = Command::new(repo().join("scripts/render-install"));
        command
            .arg("--check")
            .env("KUBECTL", kubectl)
            .env("HELM", helm_binary());
        let output = command.output().expect("run scripts/render-install");
        assert!(
            output.status.success(),
            "deploy/ is not what the chart renders with {}: run scripts/render-install\n{}{}",
            kubectl.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    // `kubectl kustomize deploy/` is the base too.
    let base = documents(&kustomize(&repo().join("deploy/base")));
    assert_eq!(documents(&kustomize(&repo().join("deploy"))), base);
    assert_eq!(
        base,
        documents(&read(&repo().join("deploy/install.yaml"))),
        "install.yaml"
    );
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
    assert_eq!(
        volume_name(battery, Path::new(&poolmgrd_flag(battery, "db"))),
        data
    );

    // battery listens on loopback, where the server dials it over TLS. Its configuration
    // is a Secret either overlay makes (it holds the token): their tests read it.
    assert!(!args.battery_insecure, "serve reaches battery over TLS");
    assert_eq!(args.battery_address, certs::BATTERY_ADDRESS);
    let battery_addr: std::net::SocketAddr = args.battery_address.parse().expect("host:port");
    assert!(battery_addr.ip().is_loopback());
    assert_eq!(args.battery_tls_server_name, None, "the address's host");
    assert_eq!(
        secret_file(&pod, battery, Path::new(&poolmgrd_flag(battery, "config"))),
        (
            certs::BATTERY_CONFIG_SECRET.to_owned(),
            certs::BATTERY_CONFIG_KEY.to_owned()
        )
    );

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
        // battery's CA, our client certificate and the token, which poolmgrd's
        // config.json holds too.
        (
            args.battery_ca_file.as_ref().expect("--battery-ca-file"),
            certs::BATTERY_CLIENT_SECRET,
            "ca.crt",
        ),
        (
            args.battery_client_cert_file
                .as_ref()
                .expect("--battery-client-cert-file"),
            certs::BATTERY_CLIENT_SECRET,
            "tls.crt",
        ),
        (
            args.battery_client_key_file
                .as_ref()
                .expect("--battery-client-key-file"),
            certs::BATTERY_CLIENT_SECRET,
            "tls.key",
        ),
        (
            args.battery_token_file
                .as_ref()
                .expect("--battery-token-file"),
            certs::BATTERY_TOKEN_SECRET,
            certs::BATTERY_TOKEN_KEY,
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
fn the_readme_lists_every_secret_the_base_mounts() {
    let install = Install::checked_in();
    let (pod, _) = serve_args();
    let (agent_pod, _) = agent_cli();
    let mounted: BTreeSet<String> = [pod, agent_pod]
        .iter()
        .flat_map(|pod| pod.volumes.iter().flatten())
        .filter_map(|volume| volume.secret.as_ref()?.secret_name.clone())
        .collect();
    assert!(mounted.is_superset(&mounted_secrets(&install)));
    let documented: BTreeSet<String> =
        readme_table("The Secrets the base mounts, from either overlay:")
            .into_iter()
            .map(|row| row[0].clone())
            .collect();
    assert_eq!(mounted, documented, "deploy/README.md's table of Secrets");
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
    let mut made: BTreeSet<String> = certificates
        .iter()
        .filter_map(|c| c["spec"]["secretName"].as_str().map(str::to_owned))
        .collect();
    for secret in [
        certs::SERVING_SECRET,
        certs::AGENT_CA_SECRET,
        certs::RELAY_CLIENT_SECRET,
        certs::RELAY_CLIENT_CA_SECRET,
        certs::BATTERY_SERVING_SECRET,
        certs::BATTERY_CLIENT_SECRET,
    ] {
        assert!(made.contains(secret), "no Certificate makes {secret}");
    }
    // What no certificate makes, the overlay's script does; the pod mounts nothing else.
    made.extend(
        battery_token_secrets(&[])
            .into_iter()
            .filter_map(|s| s.metadata.name),
    );
    let install = Install {
        objects: objects.clone(),
    };
    let missing: Vec<_> = mounted_secrets(&install)
        .into_iter()
        .filter(|secret| !made.contains(secret))
        .collect();
    assert!(missing.is_empty(), "nothing makes {missing:?}");
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

    // battery's channel: poolmgrd's certificate for the address serve dials, serve's
    // for a client, both from the one CA that poolmgrd's client_ca_file (the serving
    // Secret's ca.crt) and serve's --battery-ca-file (the client Secret's) hold.
    let battery_serving = certificate(certs::BATTERY_SERVING_SECRET);
    let host = certs::BATTERY_ADDRESS.rsplit_once(':').unwrap().0;
    assert!(
        battery_serving["ipAddresses"]
            .as_array()
            .is_some_and(|ips| ips.contains(&Value::from(host))),
        "{battery_serving:#}"
    );
    let battery_client = certificate(certs::BATTERY_CLIENT_SECRET);
    for (spec, usage) in [
        (&battery_serving, "server auth"),
        (&battery_client, "client auth"),
    ] {
        assert!(
            spec["usages"]
                .as_array()
                .is_some_and(|u| u.contains(&Value::from(usage))),
            "{spec:#}"
        );
    }
    let battery_issuer = &battery_serving["issuerRef"]["name"];
    assert_eq!(&battery_client["issuerRef"]["name"], battery_issuer);
    let issuer = issuers
        .iter()
        .find(|i| &i["metadata"]["name"] == battery_issuer)
        .expect("the battery gRPC CA's Issuer");
    let ca_secret = issuer["spec"]["ca"]["secretName"].as_str().unwrap();
    assert_eq!(certificate(ca_secret)["isCA"], true);
    for other in [
        certs::SERVING_SECRET,
        certs::AGENT_CA_SECRET,
        certs::RELAY_CLIENT_CA_SECRET,
    ] {
        assert_ne!(ca_secret, other, "the battery gRPC CA is a CA of its own");
    }

    let api_service = objects
        .iter()
        .find(|o| o["kind"] == "APIService")
        .expect("the APIService");
    assert_eq!(
        api_service["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        format!("battery-system/{}", certs::SERVING_SECRET)
    );
}

/// What `deploy/overlays/cert-manager/battery-token` prints, with `args`.
fn battery_token_secrets(args: &[&str]) -> Vec<Secret> {
    let mut command = Command::new(repo().join("deploy/overlays/cert-manager/battery-token"));
    command.args(args);
    let objects = documents(&run(command));
    let others = validate(&objects);
    assert!(others.is_empty(), "{others:?}");
    objects.iter().map(strict).collect()
}

/// `key` of `secret`, which must hold it.
fn secret_data<'a>(secret: &'a Secret, key: &str) -> &'a [u8] {
    &secret
        .data
        .as_ref()
        .and_then(|data| data.get(key))
        .unwrap_or_else(|| panic!("{:?} has no {key}", secret.metadata.name))
        .0
}

/// Checks that `secrets` hold a token and the poolmgrd configuration that requires it,
/// as the base mounts them.
fn check_token_and_config(install: &Install, secrets: &[Secret]) -> String {
    let named = |name: &str| {
        secrets
            .iter()
            .find(|s| s.metadata.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no Secret {name}"))
    };
    let config: Value = serde_json::from_slice(secret_data(
        named(certs::BATTERY_CONFIG_SECRET),
        certs::BATTERY_CONFIG_KEY,
    ))
    .expect("JSON");
    let required = check_poolmgrd_config(install, &config);
    let sent = std::str::from_utf8(secret_data(
        named(certs::BATTERY_TOKEN_SECRET),
        certs::BATTERY_TOKEN_KEY,
    ))
    .unwrap();
    // serve drops a trailing newline; poolmgrd compares the rest byte for byte.
    assert_eq!(sent.trim_end_matches(['\r', '\n']), required);
    // certs and the script write one configuration.
    assert_eq!(config, certs::poolmgrd_config(&required));
    required
}

#[test]
fn the_battery_token_script_makes_the_token_and_poolmgrds_config() {
    let install = Install::checked_in();
    let secrets = battery_token_secrets(&[]);
    assert_eq!(
        secrets
            .iter()
            .map(|s| s.metadata.name.clone().unwrap())
            .collect::<BTreeSet<_>>(),
        BTreeSet::from([
            certs::BATTERY_TOKEN_SECRET.to_owned(),
            certs::BATTERY_CONFIG_SECRET.to_owned()
        ])
    );
    for secret in &secrets {
        assert_eq!(secret.metadata.namespace.as_deref(), Some("battery-system"));
    }
    let token = check_token_and_config(&install, &secrets);
    assert_eq!(token.len(), 64, "{token}");
    assert!(token.chars().all(|c| c.is_ascii_hexdigit()), "{token}");
    // A new token each run, in the namespace asked for.
    let again = battery_token_secrets(&["infra"]);
    assert_ne!(check_token_and_config(&install, &again), token);
    for secret in &again {
        assert_eq!(secret.metadata.namespace.as_deref(), Some("infra"));
    }
}

#[test]
fn the_self_signed_overlay_takes_what_certs_writes() {
    let (_scratch, install) = self_signed_install();
    let secrets: Vec<Secret> = install.all();
    let missing: Vec<_> = mounted_secrets(&install)
        .into_iter()
        .filter(|name| {
            !secrets
                .iter()
                .any(|s| s.metadata.name.as_ref() == Some(name))
        })
        .collect();
    assert!(missing.is_empty(), "the overlay makes no {missing:?}");
    for secret in [
        certs::SERVING_SECRET,
        certs::AGENT_CA_SECRET,
        certs::RELAY_CLIENT_SECRET,
        certs::RELAY_CLIENT_CA_SECRET,
        certs::BATTERY_SERVING_SECRET,
        certs::BATTERY_CLIENT_SECRET,
        certs::BATTERY_TOKEN_SECRET,
        certs::BATTERY_CONFIG_SECRET,
    ] {
        install.one::<Secret>(secret);
    }
    // The token serve sends is the one poolmgrd's config requires.
    check_token_and_config(&install, &secrets);
    let serving: Secret = install.one(certs::SERVING_SECRET);
    let api_service: APIService = install.one(certs::API_SERVICE);
    let spec = api_service.spec.unwrap();
    assert_eq!(spec.ca_bundle, serving.data.unwrap().remove("ca.crt"));
    assert!(spec.service.is_some(), "the patch keeps the base's spec");
}

/// The self-signed install's battery channel, end to end: the embedded battery serves
/// what poolmgrd's config.json says, from the files of its container's mounts, and
/// `serve`'s battery client with its flags' files from its own mounts reaches it.
#[tokio::test]
async fn serve_reaches_poolmgrd_with_what_the_self_signed_overlay_mounts() {
    use battery_apiserver::battery::{BatteryClient, BatteryEndpoint, Security, TlsSettings};
    use battery_apiserver::tls_files::TlsFiles;
    use battery_embedded::{ApiSecurity, BatteryConfig, EmbeddedBattery, ServerTls};

    let (_scratch, install) = self_signed_install();
    let (pod, args) = serve_args_in(&install);
    let files = tempfile::tempdir().unwrap();

    // poolmgrd's side, as its container sees it.
    let battery = container(&pod, "battery");
    let battery_root = files.path().join("battery");
    project_secrets(&install, &pod, battery, &battery_root);
    let config: Value = serde_json::from_slice(
        &std::fs::read(under(
            &battery_root,
            Path::new(&poolmgrd_flag(battery, "config")),
        ))
        .unwrap(),
    )
    .unwrap();
    let tls = &config["api_server"]["tls"];
    let read = |field: &str| {
        std::fs::read(under(
            &battery_root,
            Path::new(tls[field].as_str().unwrap()),
        ))
        .unwrap()
    };
    let security = ApiSecurity {
        tls: Some(ServerTls {
            cert_pem: read("cert_file"),
            key_pem: read("key_file"),
            client_ca_pem: (tls["validate_client"] == true).then(|| read("client_ca_file")),
        }),
        basic_auth_token: config["api_server"]["basic_auth_token"]
            .as_str()
            .map(str::to_owned),
    };
    // Its address's host, on a port of its own: 50051 may be taken here.
    let address: std::net::SocketAddr = config["api_server"]["addr"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let listener = tokio::net::TcpListener::bind((address.ip(), 0))
        .await
        .unwrap();
    let embedded = EmbeddedBattery::start(
        BatteryConfig {
            api: security,
            ..BatteryConfig::default()
        },
        listener,
    )
    .await
    .unwrap();

    // serve's side, as its container sees it.
    let apiserver_root = files.path().join("apiserver");
    project_secrets(
        &install,
        &pod,
        container(&pod, "apiserver"),
        &apiserver_root,
    );
    let file = |path: &Option<PathBuf>| under(&apiserver_root, path.as_deref().unwrap());
    let endpoint = |client: bool, token: bool| BatteryEndpoint {
        address: args.battery_address.replace(
            &address.port().to_string(),
            &embedded.address().port().to_string(),
        ),
        security: Security::Tls(TlsSettings {
            ca_file: file(&args.battery_ca_file),
            client: client.then(|| TlsFiles {
                cert: file(&args.battery_client_cert_file),
                key: file(&args.battery_client_key_file),
            }),
            server_name: args.battery_tls_server_name.clone(),
        }),
        token_file: token.then(|| file(&args.battery_token_file)),
    };
    let readiness = async |endpoint: BatteryEndpoint| {
        let (client, follower) = BatteryClient::connect_secured(&endpoint).unwrap();
        let ready = client.readiness().await;
        follower.inspect(tokio::task::JoinHandle::abort);
        ready
    };
    readiness(endpoint(true, true))
        .await
        .unwrap_or_else(|why| panic!("serve does not reach poolmgrd: {why}"));
    // Both credentials are required, not merely accepted.
    let why = readiness(endpoint(true, false)).await.unwrap_err();
    assert!(
        why.starts_with("battery refused the API server's credentials"),
        "{why}"
    );
    readiness(endpoint(false, true))
        .await
        .expect_err("no client certificate");
    embedded.shutdown().await;
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
