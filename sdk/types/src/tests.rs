//! Tests across the kinds: wire form round trips and the schemas `kubectl explain` reads.

use kube::CustomResourceExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::*;

/// Decodes `wire` as `K`, encodes it again, and expects the same JSON: every field name
/// and value survives, and nothing is added or dropped.
fn round_trip<K: Serialize + DeserializeOwned>(wire: &Value) -> K {
    let object: K = serde_json::from_value(wire.clone()).expect("decodes");
    assert_eq!(&serde_json::to_value(&object).expect("encodes"), wire);
    object
}

#[test]
fn a_full_pool_round_trips() {
    let wire = json!({
        "apiVersion": "battery.liquidmetal-x.dev/v1alpha1",
        "kind": "Pool",
        "metadata": { "name": "builders", "namespace": "ci", "labels": { "team": "ci" } },
        "spec": {
            "template": {
                "provider": "firecracker",
                "vcpu": 2,
                "memoryInMb": 2048,
                "kernel": {
                    "image": "ghcr.io/liquidmetal-dev/flintlock-kernel:6.1.72",
                    "cmdline": { "console": "ttyS0" },
                    "filename": "boot/vmlinux",
                    "addNetworkConfig": true
                },
                "initrd": { "image": "ghcr.io/liquidmetal-dev/initrd:1", "filename": "boot/initrd.img" },
                "rootVolume": {
                    "id": "root",
                    "readOnly": true,
                    "mountPoint": "/",
                    "partitionId": "1",
                    "sizeInMb": 4096,
                    "containerSource": "ghcr.io/liquidmetal-dev/ubuntu:22.04"
                },
                "additionalVolumes": [{ "id": "data", "mountPoint": "/data", "virtiofsSource": "/srv/data" }],
                "interfaces": [{
                    "deviceId": "eth1",
                    "type": "Tap",
                    "guestMac": "02:00:00:00:00:01",
                    "address": {
                        "address": "192.168.100.10/24",
                        "gateway": "192.168.100.1",
                        "nameservers": ["1.1.1.1"]
                    },
                    "overrides": { "bridgeName": "virbr-battery" }
                }],
                "metadata": { "user-data": "I2Nsb3VkLWNvbmZpZwo=" },
                "labels": { "team": "ci" }
            },
            "size": 1,
            "placement": { "nodeSelector": { "battery.liquidmetal-x.dev/arch": "amd64" } },
            "replenishment": { "type": "MinSizeThreshold", "minSize": 1 },
            "hooks": {
                "create": ["apt-get update"],
                "preLease": ["systemctl start docker"],
                "failurePolicy": "DeleteAndReplace"
            },
            "lease": { "heartbeatInterval": "15s", "expiryThreshold": "1m30s" }
        },
        "status": {
            "available": 1,
            "leased": 0,
            "provisioning": 0,
            "quarantined": 0,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "AtSize",
                    "message": "",
                    "observedGeneration": 1,
                    "lastTransitionTime": "2025-01-01T00:00:00Z"
                },
                {
                    "type": "Exhausted",
                    "status": "False",
                    "reason": "Available",
                    "message": "1 MicroVM available",
                    "lastTransitionTime": "2025-01-01T00:00:00Z"
                }
            ]
        }
    });
    let pool: Pool = round_trip(&wire);
    assert_eq!(pool.spec.validate(), vec![]);
    assert_eq!(pool.spec.lease.expiry_threshold, Duration::from_secs(90));
    assert_eq!(pool.spec.template.interfaces[0].type_, InterfaceType::Tap);
}

#[test]
fn a_full_claim_round_trips() {
    let wire = json!({
        "apiVersion": "battery.liquidmetal-x.dev/v1alpha1",
        "kind": "MicroVMClaim",
        "metadata": { "name": "build-1", "namespace": "ci", "uid": "2c1a0c1e-5b0d-4f4e-9a57-6c1f0e3d2b10" },
        "spec": { "poolRef": { "name": "builders" }, "serviceAccountName": "ci-runner" },
        "status": {
            "phase": "Bound",
            "microVM": { "uid": "01JGXK5Q8ZP3M4N5R6S7T8V9W0" },
            "host": { "nodeName": "host-a", "agentAddress": "10.0.0.5:10270" },
            "boundTime": "2025-01-01T00:00:00Z",
            "leaseExpiresAt": "2025-01-01T00:00:40.500000Z",
            "renewTime": "2025-01-01T00:00:10.500000Z",
            "networkInterfaces": [
                { "deviceId": "eth1", "hostDeviceName": "tap0", "index": 1, "macAddress": "02:00:00:00:00:01" }
            ],
            "conditions": [
                {
                    "type": "Bound",
                    "status": "True",
                    "reason": "Bound",
                    "message": "",
                    "lastTransitionTime": "2025-01-01T00:00:00Z"
                },
                {
                    "type": "HostReady",
                    "status": "False",
                    "reason": "ExecDisabled",
                    "message": "flintlockd's exec API is disabled",
                    "lastTransitionTime": "2025-01-01T00:00:05Z"
                }
            ]
        }
    });
    let claim: MicroVMClaim = round_trip(&wire);
    assert_eq!(claim.spec.validate(), vec![]);
    let status = claim.status.expect("status decodes");
    assert_eq!(status.phase, Some(ClaimPhase::Bound));
    assert_eq!(
        status.micro_vm.map(|vm| vm.uid).as_deref(),
        Some("01JGXK5Q8ZP3M4N5R6S7T8V9W0")
    );
}

#[test]
fn a_full_host_round_trips() {
    let wire = json!({
        "apiVersion": "battery.liquidmetal-x.dev/v1alpha1",
        "kind": "Host",
        "metadata": { "name": "host-a", "labels": { "battery.liquidmetal-x.dev/arch": "amd64" } },
        "spec": {
            "address": "10.0.0.5:9090",
            "unschedulable": true,
            "tls": {
                "caFile": "/etc/battery/hosts/ca.crt",
                "certFile": "/etc/battery/tls/tls.crt",
                "keyFile": "/etc/battery/tls/tls.key"
            },
            "agentAddress": "10.0.0.5:10270"
        },
        "status": {
            "flintlockVersion": "v0.15.2",
            "vmCount": 4,
            "cordonedReason": "kernel upgrade",
            "conditions": [{
                "type": "Ready",
                "status": "True",
                "reason": "Ready",
                "message": "",
                "lastTransitionTime": "2025-01-01T00:00:00Z"
            }]
        }
    });
    let host: Host = round_trip(&wire);
    assert_eq!(host.spec.validate(), vec![]);
    assert_eq!(host.status.expect("status decodes").validate(), vec![]);
}

#[test]
fn empty_optional_fields_are_omitted() {
    let claim = MicroVMClaim::new(
        "build-1",
        MicroVMClaimSpec {
            pool_ref: PoolRef {
                name: "builders".to_owned(),
            },
            service_account_name: "ci-runner".to_owned(),
            ..MicroVMClaimSpec::default()
        },
    );
    let mut claim = serde_json::to_value(&claim).unwrap();
    claim["status"] = serde_json::to_value(MicroVMClaimStatus::default()).unwrap();
    assert_eq!(claim["status"], json!({}));

    let host = serde_json::to_value(HostSpec {
        address: "10.0.0.5:9090".to_owned(),
        tls: HostTls {
            insecure: true,
            ..HostTls::default()
        },
        ..HostSpec::default()
    })
    .unwrap();
    assert_eq!(
        host,
        json!({ "address": "10.0.0.5:9090", "tls": { "insecure": true } })
    );
}

/// Every path in `schema` to a property without a description.
fn undescribed(schema: &Value, path: &str, found: &mut Vec<String>) {
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, property) in properties {
            let path = format!("{path}.{name}");
            let described = property
                .get("description")
                .and_then(Value::as_str)
                .is_some_and(|description| !description.trim().is_empty());
            if !described {
                found.push(path.clone());
            }
            undescribed(property, &path, found);
        }
    }
    if let Some(items) = schema.get("items") {
        undescribed(items, &format!("{path}[]"), found);
    }
}

/// Every path in `schema` to a required property that advertises a default.
fn required_with_default(schema: &Value, path: &str, found: &mut Vec<String>) {
    let required = schema
        .get("required")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, property) in properties {
            let path = format!("{path}.{name}");
            if required.contains(&Value::from(name.as_str())) && property.get("default").is_some() {
                found.push(path.clone());
            }
            required_with_default(property, &path, found);
        }
    }
    if let Some(items) = schema.get("items") {
        required_with_default(items, &format!("{path}[]"), found);
    }
}

fn schema_of<K: CustomResourceExt>() -> Value {
    let crd = K::crd();
    let version = crd.spec.versions.into_iter().next().expect("one version");
    let schema = version
        .schema
        .and_then(|schema| schema.open_api_v3_schema)
        .expect("a schema");
    serde_json::to_value(schema).unwrap()
}

#[test]
fn every_field_is_described_for_kubectl_explain() {
    for (kind, schema) in [
        ("Pool", schema_of::<Pool>()),
        ("MicroVMClaim", schema_of::<MicroVMClaim>()),
        ("Host", schema_of::<Host>()),
    ] {
        assert!(
            schema["description"]
                .as_str()
                .is_some_and(|d| !d.is_empty()),
            "{kind}"
        );
        let mut found = Vec::new();
        undescribed(&schema, kind, &mut found);
        assert_eq!(found, Vec::<String>::new(), "fields without a description");
    }
}

#[test]
fn required_fields_are_marked_and_advertise_no_default() {
    let pool = schema_of::<Pool>();
    assert_eq!(
        pool["properties"]["spec"]["required"],
        json!(["size", "template"])
    );
    assert_eq!(
        pool["properties"]["spec"]["properties"]["template"]["required"],
        json!(["interfaces", "kernel", "memoryInMb", "rootVolume", "vcpu"])
    );
    assert_eq!(
        pool["properties"]["spec"]["properties"]["lease"]["properties"]["expiryThreshold"]["default"],
        "30s"
    );
    let claim = schema_of::<MicroVMClaim>();
    assert_eq!(
        claim["properties"]["spec"]["required"],
        json!(["poolRef", "serviceAccountName"])
    );
    for (kind, schema) in [
        ("Pool", pool),
        ("MicroVMClaim", claim),
        ("Host", schema_of::<Host>()),
    ] {
        let mut found = Vec::new();
        required_with_default(&schema, kind, &mut found);
        assert_eq!(
            found,
            Vec::<String>::new(),
            "required fields with a default"
        );
    }
}

#[test]
fn enums_publish_their_values() {
    let pool = schema_of::<Pool>();
    assert_eq!(
        pool["properties"]["spec"]["properties"]["replenishment"]["properties"]["type"]["enum"],
        json!(["ImmediateOnLease", "MinSizeThreshold", "ReplaceOnDelete"])
    );
    let claim = schema_of::<MicroVMClaim>();
    assert_eq!(
        claim["properties"]["status"]["properties"]["phase"]["enum"],
        json!(["Bound", "Expired"])
    );
}

#[test]
fn no_schema_has_a_place_for_the_lease_id() {
    for schema in [
        schema_of::<Pool>(),
        schema_of::<MicroVMClaim>(),
        schema_of::<Host>(),
    ] {
        let text = schema.to_string().to_lowercase();
        assert!(
            !text.contains("leaseid") && !text.contains("lease_id"),
            "{text}"
        );
    }
}

#[test]
fn api_version_is_group_and_version() {
    assert_eq!(API_VERSION, format!("{GROUP}/{VERSION}"));
}
