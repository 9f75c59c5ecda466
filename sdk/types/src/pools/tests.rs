use serde_json::{Value, json};

use super::*;
use crate::template::{Initrd, InterfaceType, NetworkInterface, StaticAddress, Volume};

/// A Pool spec as a user writes it: only what has no default.
fn minimal_json() -> Value {
    json!({
        "template": {
            "vcpu": 2,
            "memoryInMb": 2048,
            "kernel": { "image": "ghcr.io/liquidmetal-dev/flintlock-kernel:6.1.72" },
            "rootVolume": { "id": "root", "containerSource": "ghcr.io/liquidmetal-dev/ubuntu:22.04" },
            "interfaces": [{ "deviceId": "eth1" }]
        },
        "size": 3
    })
}

fn valid_spec() -> PoolSpec {
    serde_json::from_value(minimal_json()).expect("the minimal spec decodes")
}

#[test]
fn defaults_are_applied_while_decoding() {
    let spec = valid_spec();
    assert_eq!(
        spec.replenishment.type_,
        ReplenishmentType::ImmediateOnLease
    );
    assert_eq!(spec.replenishment.min_size, None);
    assert_eq!(
        spec.hooks.failure_policy,
        HookFailurePolicy::DeleteAndReplace
    );
    assert_eq!(spec.lease.heartbeat_interval, Duration::from_secs(10));
    assert_eq!(spec.lease.expiry_threshold, Duration::from_secs(30));
    assert_eq!(spec.template.interfaces[0].type_, InterfaceType::Macvtap);
    assert_eq!(spec.placement, None);

    // The defaulted object is what a read returns.
    let written = serde_json::to_value(&spec).unwrap();
    assert_eq!(
        written["replenishment"],
        json!({ "type": "ImmediateOnLease" })
    );
    assert_eq!(
        written["hooks"],
        json!({ "failurePolicy": "DeleteAndReplace" })
    );
    assert_eq!(
        written["lease"],
        json!({ "heartbeatInterval": "10s", "expiryThreshold": "30s" })
    );
    assert_eq!(
        written["template"]["interfaces"][0],
        json!({ "deviceId": "eth1", "type": "Macvtap" })
    );
}

#[test]
fn default_impls_hold_the_api_defaults() {
    let spec = valid_spec();
    assert_eq!(Replenishment::default(), spec.replenishment);
    assert_eq!(Hooks::default(), spec.hooks);
    assert_eq!(LeaseSettings::default(), spec.lease);
    assert_eq!(NetworkInterface::default().type_, InterfaceType::Macvtap);
}

#[test]
fn partially_given_blocks_are_completed() {
    let mut json = minimal_json();
    json["lease"] = json!({ "expiryThreshold": "1m" });
    json["replenishment"] = json!({ "minSize": 2 });
    let spec: PoolSpec = serde_json::from_value(json).unwrap();
    assert_eq!(spec.lease.heartbeat_interval, Duration::from_secs(10));
    assert_eq!(spec.lease.expiry_threshold, Duration::from_secs(60));
    assert_eq!(
        spec.replenishment.type_,
        ReplenishmentType::ImmediateOnLease
    );
    assert_eq!(spec.replenishment.min_size, Some(2));
}

#[test]
fn absent_required_fields_decode_so_validation_can_name_them() {
    let spec: PoolSpec = serde_json::from_value(json!({})).unwrap();
    let messages: Vec<String> = spec.validate().iter().map(ToString::to_string).collect();
    assert_eq!(
        messages,
        ["spec.template: Required value", "spec.size: Required value"]
    );

    let mut json = minimal_json();
    json["template"].as_object_mut().unwrap().remove("vcpu");
    let spec: PoolSpec = serde_json::from_value(json).unwrap();
    let messages: Vec<String> = spec.validate().iter().map(ToString::to_string).collect();
    assert_eq!(
        messages,
        ["spec.template.vcpu: Invalid value: 0: must be between 1 and 64, inclusive"]
    );
}

#[test]
fn unknown_enum_values_survive_decoding_for_validation_to_report() {
    let mut json = minimal_json();
    json["replenishment"] = json!({ "type": "Eventually" });
    let spec: PoolSpec = serde_json::from_value(json).unwrap();
    assert_eq!(
        spec.replenishment.type_,
        ReplenishmentType::Unknown("Eventually".to_owned())
    );
    assert_eq!(
        serde_json::to_value(&spec).unwrap()["replenishment"]["type"],
        "Eventually"
    );
}

#[test]
fn malformed_durations_fail_decoding_as_in_go() {
    let mut json = minimal_json();
    json["lease"] = json!({ "heartbeatInterval": "10 seconds" });
    let error = serde_json::from_value::<PoolSpec>(json).unwrap_err();
    assert!(
        error
            .to_string()
            .contains(r#"time: unknown unit " seconds" in duration "10 seconds""#),
        "{error}"
    );
}

type Mutation = fn(&mut PoolSpec);

fn interface(device_id: &str) -> NetworkInterface {
    NetworkInterface {
        device_id: device_id.to_owned(),
        ..NetworkInterface::default()
    }
}

fn volume(id: &str) -> Volume {
    Volume {
        id: id.to_owned(),
        container_source: Some("ghcr.io/example/data:1".to_owned()),
        ..Volume::default()
    }
}

/// A Pool that holds exactly one MicroVM, where a fixed MAC or address is allowed.
fn single_vm(spec: &mut PoolSpec) {
    spec.size = Some(1);
    spec.replenishment.type_ = ReplenishmentType::ReplaceOnDelete;
}

#[test]
fn validation_rules() {
    let cases: &[(&str, Mutation, &[&str])] = &[
        ("valid", |_| {}, &[]),
        (
            "template absent",
            |s| s.template = MicroVMTemplate::default(),
            &["spec.template: Required value"],
        ),
        (
            "vcpu too low",
            |s| s.template.vcpu = 0,
            &["spec.template.vcpu: Invalid value: 0: must be between 1 and 64, inclusive"],
        ),
        (
            "vcpu too high",
            |s| s.template.vcpu = 65,
            &["spec.template.vcpu: Invalid value: 65: must be between 1 and 64, inclusive"],
        ),
        ("vcpu at the limits", |s| s.template.vcpu = 64, &[]),
        (
            "memory too low",
            |s| s.template.memory_in_mb = 1023,
            &[
                "spec.template.memoryInMb: Invalid value: 1023: must be between 1024 and 32768, inclusive",
            ],
        ),
        (
            "memory too high",
            |s| s.template.memory_in_mb = 32769,
            &[
                "spec.template.memoryInMb: Invalid value: 32769: must be between 1024 and 32768, inclusive",
            ],
        ),
        (
            "known provider",
            |s| s.template.provider = Some("cloudhypervisor".to_owned()),
            &[],
        ),
        (
            "unknown provider",
            |s| s.template.provider = Some("qemu".to_owned()),
            &[
                r#"spec.template.provider: Unsupported value: "qemu": supported values: "firecracker", "cloudhypervisor""#,
            ],
        ),
        (
            "kernel image empty",
            |s| s.template.kernel.image.clear(),
            &["spec.template.kernel.image: Required value"],
        ),
        (
            "initrd image empty",
            |s| s.template.initrd = Some(Initrd::default()),
            &["spec.template.initrd.image: Required value"],
        ),
        (
            "volume without a source",
            |s| s.template.root_volume.container_source = None,
            &[
                "spec.template.rootVolume: Required value: exactly one of containerSource or virtiofsSource is required",
            ],
        ),
        (
            "volume with two sources",
            |s| s.template.root_volume.virtiofs_source = Some("/srv/data".to_owned()),
            &[
                "spec.template.rootVolume.virtiofsSource: Forbidden: may not be specified together with containerSource",
            ],
        ),
        (
            "volume without an id",
            |s| s.template.root_volume.id.clear(),
            &["spec.template.rootVolume.id: Required value"],
        ),
        (
            "volume size below 1",
            |s| {
                s.template.additional_volumes = vec![Volume {
                    size_in_mb: Some(0),
                    ..volume("data")
                }]
            },
            &[
                "spec.template.additionalVolumes[0].sizeInMb: Invalid value: 0: must be greater than or equal to 1",
            ],
        ),
        (
            "duplicate volume id",
            |s| s.template.additional_volumes = vec![volume("data"), volume("root")],
            &[r#"spec.template.additionalVolumes[1].id: Duplicate value: "root""#],
        ),
        (
            "no interface",
            |s| s.template.interfaces.clear(),
            &[
                "spec.template.interfaces: Required value: at least one network interface is required",
            ],
        ),
        (
            "interface without a device id",
            |s| s.template.interfaces[0].device_id.clear(),
            &["spec.template.interfaces[0].deviceId: Required value"],
        ),
        (
            "duplicate device id",
            |s| s.template.interfaces.push(interface("eth1")),
            &[r#"spec.template.interfaces[1].deviceId: Duplicate value: "eth1""#],
        ),
        (
            "unknown interface type",
            |s| s.template.interfaces[0].type_ = InterfaceType::from("Bridge"),
            &[
                r#"spec.template.interfaces[0].type: Unsupported value: "Bridge": supported values: "Macvtap", "Tap""#,
            ],
        ),
        (
            "malformed guest MAC",
            |s| {
                single_vm(s);
                s.template.interfaces[0].guest_mac = Some("02:00:00:00:00".to_owned());
            },
            &[
                r#"spec.template.interfaces[0].guestMac: Invalid value: "02:00:00:00:00": must be a MAC address of six colon-separated hex octets (e.g. 02:00:00:00:00:01)"#,
            ],
        ),
        (
            "static address on a single-VM Pool",
            |s| {
                single_vm(s);
                s.template.interfaces[0].guest_mac = Some("02:00:00:00:00:01".to_owned());
                s.template.interfaces[0].address = Some(StaticAddress {
                    address: "192.168.100.10/24".to_owned(),
                    gateway: Some("192.168.100.1".to_owned()),
                    nameservers: vec!["1.1.1.1".to_owned(), "2606:4700:4700::1111".to_owned()],
                });
            },
            &[],
        ),
        (
            "malformed static address",
            |s| {
                single_vm(s);
                s.template.interfaces[0].address = Some(StaticAddress {
                    address: "192.168.100.10".to_owned(),
                    gateway: Some("gateway".to_owned()),
                    nameservers: vec!["1.1.1.1".to_owned(), "dns".to_owned()],
                });
            },
            &[
                r#"spec.template.interfaces[0].address.address: Invalid value: "192.168.100.10": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"#,
                r#"spec.template.interfaces[0].address.gateway: Invalid value: "gateway": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"#,
                r#"spec.template.interfaces[0].address.nameservers[1]: Invalid value: "dns": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"#,
            ],
        ),
        (
            "static address without an address",
            |s| {
                single_vm(s);
                s.template.interfaces[0].address = Some(StaticAddress::default());
            },
            &["spec.template.interfaces[0].address.address: Required value"],
        ),
        (
            "prefix too long",
            |s| {
                single_vm(s);
                s.template.interfaces[0].address = Some(StaticAddress {
                    address: "10.0.0.1/33".to_owned(),
                    ..StaticAddress::default()
                });
            },
            &[
                r#"spec.template.interfaces[0].address.address: Invalid value: "10.0.0.1/33": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"#,
            ],
        ),
        (
            "fixed MAC on a Pool of several",
            |s| s.template.interfaces[0].guest_mac = Some("02:00:00:00:00:01".to_owned()),
            &[
                "spec.template.interfaces[0].guestMac: Forbidden: may not be set while the Pool can hold more than one MicroVM (size above 1, replenishment type ImmediateOnLease, or hook failure policy Quarantine): every MicroVM would get the same one",
            ],
        ),
        (
            "static address with ImmediateOnLease",
            |s| {
                s.size = Some(1);
                s.template.interfaces[0].address = Some(StaticAddress {
                    address: "10.0.0.1/24".to_owned(),
                    ..StaticAddress::default()
                });
            },
            &[
                "spec.template.interfaces[0].address: Forbidden: may not be set while the Pool can hold more than one MicroVM (size above 1, replenishment type ImmediateOnLease, or hook failure policy Quarantine): every MicroVM would get the same one",
            ],
        ),
        (
            "fixed MAC with Quarantine",
            |s| {
                single_vm(s);
                s.hooks.failure_policy = HookFailurePolicy::Quarantine;
                s.template.interfaces[0].guest_mac = Some("02:00:00:00:00:01".to_owned());
            },
            &[
                "spec.template.interfaces[0].guestMac: Forbidden: may not be set while the Pool can hold more than one MicroVM (size above 1, replenishment type ImmediateOnLease, or hook failure policy Quarantine): every MicroVM would get the same one",
            ],
        ),
        (
            "metadata not base64",
            |s| {
                s.template
                    .metadata
                    .insert("meta-data".to_owned(), "aW5zdGFuY2UtaWQ6IGEK".to_owned());
                s.template
                    .metadata
                    .insert("user-data".to_owned(), "#cloud-config".to_owned());
            },
            &["spec.template.metadata[user-data]: Invalid value: must be base64-encoded"],
        ),
        (
            "size absent",
            |s| s.size = None,
            &["spec.size: Required value"],
        ),
        ("size zero", |s| s.size = Some(0), &[]),
        (
            "size negative",
            |s| s.size = Some(-1),
            &["spec.size: Invalid value: -1: must be greater than or equal to 0"],
        ),
        (
            "valid node selector",
            |s| {
                s.placement = Some(Placement {
                    node_selector: [(
                        "battery.liquidmetal-x.dev/arch".to_owned(),
                        "amd64".to_owned(),
                    )]
                    .into(),
                });
            },
            &[],
        ),
        (
            "invalid node selector",
            |s| {
                s.placement = Some(Placement {
                    node_selector: [("zone".to_owned(), "eu west".to_owned())].into(),
                });
            },
            &[
                r#"spec.placement.nodeSelector: Invalid value: "eu west": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"#,
            ],
        ),
        (
            "unknown replenishment type",
            |s| s.replenishment.type_ = ReplenishmentType::from("Eventually"),
            &[
                r#"spec.replenishment.type: Unsupported value: "Eventually": supported values: "ImmediateOnLease", "MinSizeThreshold", "ReplaceOnDelete""#,
            ],
        ),
        (
            "MinSizeThreshold without minSize",
            |s| s.replenishment.type_ = ReplenishmentType::MinSizeThreshold,
            &["spec.replenishment.minSize: Required value: required when type is MinSizeThreshold"],
        ),
        (
            "MinSizeThreshold with minSize",
            |s| {
                s.replenishment.type_ = ReplenishmentType::MinSizeThreshold;
                s.replenishment.min_size = Some(1);
            },
            &[],
        ),
        (
            "minSize below 1",
            |s| s.replenishment.min_size = Some(0),
            &["spec.replenishment.minSize: Invalid value: 0: must be greater than or equal to 1"],
        ),
        (
            "unknown hook failure policy",
            |s| s.hooks.failure_policy = HookFailurePolicy::from("Retry"),
            &[
                r#"spec.hooks.failurePolicy: Unsupported value: "Retry": supported values: "DeleteAndReplace", "Quarantine""#,
            ],
        ),
        (
            "zero heartbeat interval",
            |s| s.lease.heartbeat_interval = Duration::ZERO,
            &[r#"spec.lease.heartbeatInterval: Invalid value: "0s": must be greater than zero"#],
        ),
        (
            "negative expiry threshold",
            |s| s.lease.expiry_threshold = Duration::from_nanos(-5_000_000_000),
            &[r#"spec.lease.expiryThreshold: Invalid value: "-5s": must be greater than zero"#],
        ),
        (
            "heartbeat no shorter than the expiry",
            |s| s.lease.heartbeat_interval = Duration::from_secs(30),
            &[
                r#"spec.lease.heartbeatInterval: Invalid value: "30s": must be less than expiryThreshold (30s)"#,
            ],
        ),
        (
            "several errors, in field order",
            |s| {
                s.template.vcpu = 0;
                s.size = Some(-2);
                s.hooks.failure_policy = HookFailurePolicy::from("");
            },
            &[
                "spec.template.vcpu: Invalid value: 0: must be between 1 and 64, inclusive",
                "spec.size: Invalid value: -2: must be greater than or equal to 0",
                r#"spec.hooks.failurePolicy: Unsupported value: "": supported values: "DeleteAndReplace", "Quarantine""#,
            ],
        ),
    ];
    for (name, mutate, expected) in cases {
        let mut spec = valid_spec();
        mutate(&mut spec);
        let messages: Vec<String> = spec.validate().iter().map(ToString::to_string).collect();
        assert_eq!(messages, *expected, "{name}");
    }
}

/// A Pool of `spec` with the counts battery reports.
fn counted(type_: ReplenishmentType, available: i32, leased: i32, provisioning: i32) -> Pool {
    let mut spec = valid_spec();
    spec.replenishment.type_ = type_;
    let mut pool = Pool::new("dev", spec);
    pool.status = Some(PoolStatus {
        available,
        leased,
        provisioning,
        quarantined: 4,
        ..PoolStatus::default()
    });
    pool
}

#[test]
fn scale_replicas_count_what_battery_counts_towards_size() {
    // Leased MicroVMs come on top of `size` for ImmediateOnLease; quarantined ones never
    // count (`reference/battery-api.md` §4.2).
    let cases = [
        (ReplenishmentType::ImmediateOnLease, 3),
        (ReplenishmentType::MinSizeThreshold, 5),
        (ReplenishmentType::ReplaceOnDelete, 5),
    ];
    for (type_, replicas) in cases {
        assert_eq!(
            counted(type_.clone(), 2, 2, 1).replicas(),
            replicas,
            "{type_:?}"
        );
    }
    // A Pool read without a status has none.
    assert_eq!(Pool::new("dev", valid_spec()).replicas(), 0);
}

#[test]
fn scale_selector_names_the_pool_by_uid() {
    let mut pool = Pool::new(
        "a-name-longer-than-a-label-value-may-be.example.with.dots.and-more",
        valid_spec(),
    );
    pool.metadata.uid = Some("0b5e3c9e-2f5b-4f44-9d55-7d7c4e1a2b3c".to_owned());
    assert_eq!(
        pool.scale_selector(),
        "battery.liquidmetal-x.dev/pool-uid=0b5e3c9e-2f5b-4f44-9d55-7d7c4e1a2b3c"
    );
}
