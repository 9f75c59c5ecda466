use std::collections::BTreeMap;

use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;

use super::*;

fn text() -> impl Strategy<Value = String> {
    ".{0,8}"
}

fn string_map() -> impl Strategy<Value = BTreeMap<String, String>> {
    btree_map(text(), text(), 0..3)
}

fn volume() -> impl Strategy<Value = Volume> {
    (
        text(),
        any::<bool>(),
        option::of(text()),
        option::of(text()),
        option::of(any::<i32>()),
        option::of(text()),
        option::of(text()),
    )
        .prop_map(
            |(
                id,
                read_only,
                mount_point,
                partition_id,
                size_in_mb,
                container_source,
                virtiofs_source,
            )| Volume {
                id,
                read_only,
                mount_point,
                partition_id,
                size_in_mb,
                container_source,
                virtiofs_source,
            },
        )
}

fn interface() -> impl Strategy<Value = NetworkInterface> {
    let address = (text(), option::of(text()), vec(text(), 0..3)).prop_map(
        |(address, gateway, nameservers)| StaticAddress {
            address,
            gateway,
            nameservers,
        },
    );
    let overrides = option::of(text()).prop_map(|bridge_name| NetworkOverrides { bridge_name });
    (
        text(),
        prop_oneof![Just(InterfaceType::Macvtap), Just(InterfaceType::Tap)],
        option::of(text()),
        option::of(address),
        option::of(overrides),
    )
        .prop_map(
            |(device_id, type_, guest_mac, address, overrides)| NetworkInterface {
                device_id,
                type_,
                guest_mac,
                address,
                overrides,
            },
        )
}

fn template() -> impl Strategy<Value = MicroVMTemplate> {
    let kernel = (text(), string_map(), option::of(text()), any::<bool>()).prop_map(
        |(image, cmdline, filename, add_network_config)| Kernel {
            image,
            cmdline,
            filename,
            add_network_config,
        },
    );
    let initrd =
        (text(), option::of(text())).prop_map(|(image, filename)| Initrd { image, filename });
    (
        option::of(text()),
        any::<i32>(),
        any::<i32>(),
        kernel,
        option::of(initrd),
        volume(),
        vec(volume(), 0..3),
        vec(interface(), 0..3),
        string_map(),
        string_map(),
    )
        .prop_map(
            |(
                provider,
                vcpu,
                memory_in_mb,
                kernel,
                initrd,
                root_volume,
                additional_volumes,
                interfaces,
                metadata,
                labels,
            )| MicroVMTemplate {
                provider,
                vcpu,
                memory_in_mb,
                kernel,
                initrd,
                root_volume,
                additional_volumes,
                interfaces,
                metadata,
                labels,
            },
        )
}

fn pool_spec() -> impl Strategy<Value = PoolSpec> {
    let replenishment = (
        prop_oneof![
            Just(ReplenishmentType::ImmediateOnLease),
            Just(ReplenishmentType::MinSizeThreshold),
            Just(ReplenishmentType::ReplaceOnDelete),
        ],
        option::of(any::<i32>()),
    )
        .prop_map(|(type_, min_size)| Replenishment { type_, min_size });
    let hooks = (
        vec(text(), 0..3),
        vec(text(), 0..3),
        prop_oneof![
            Just(HookFailurePolicy::DeleteAndReplace),
            Just(HookFailurePolicy::Quarantine),
        ],
    )
        .prop_map(|(create, pre_lease, failure_policy)| Hooks {
            create,
            pre_lease,
            failure_policy,
        });
    let lease = (any::<i64>(), any::<i64>()).prop_map(|(interval, expiry)| LeaseSettings {
        heartbeat_interval: Duration::from_nanos(interval),
        expiry_threshold: Duration::from_nanos(expiry),
    });
    let placement = option::of(string_map().prop_map(|node_selector| Placement { node_selector }));
    (
        template(),
        any::<i32>(),
        placement,
        replenishment,
        hooks,
        lease,
    )
        .prop_map(
            |(template, size, placement, replenishment, hooks, lease)| PoolSpec {
                template,
                size: Some(size),
                placement,
                replenishment,
                hooks,
                lease,
                claim_limits: None,
                service_account_token: None,
            },
        )
}

proptest! {
    #[test]
    fn pool_spec_round_trips(spec in pool_spec()) {
        let battery = pool_spec_to_battery("ns", "pool", &spec, vec!["host-a".to_owned()]);
        prop_assert_eq!(pool_spec_from_battery(&battery, spec.placement.clone()), spec);
    }

    #[test]
    fn durations_round_trip(nanos in any::<i64>()) {
        let duration = Duration::from_nanos(nanos);
        let battery = duration_to_battery(duration);
        prop_assert!(
            (battery.seconds >= 0 && battery.nanos >= 0)
                || (battery.seconds <= 0 && battery.nanos <= 0),
            "seconds and nanos must share a sign: {:?}",
            battery
        );
        prop_assert_eq!(duration_from_battery(&battery), duration);
    }
}

fn minimal_spec() -> PoolSpec {
    PoolSpec {
        size: Some(2),
        ..PoolSpec::default()
    }
}

#[test]
fn writes_identity_and_battery_owned_fields() {
    let hosts = vec!["a".to_owned(), "b".to_owned()];
    let battery = pool_spec_to_battery("team", "web", &minimal_spec(), hosts.clone());
    assert_eq!(battery.name, "web");
    assert_eq!(battery.namespace, "team");
    assert_eq!(battery.flintlock_hosts, hosts);
    let template = battery.microvm_template.expect("always sent");
    assert!(template.allow_guest_agent);
    assert_eq!(template.id, "");
    assert_eq!(template.namespace, "");
    assert_eq!(template.uid, None);
    assert_eq!(template.created_at, None);
}

#[test]
fn reading_ignores_what_battery_adds() {
    let spec = minimal_spec();
    let mut battery = pool_spec_to_battery("team", "web", &spec, Vec::new());
    let template = battery.microvm_template.as_mut().expect("always sent");
    template.id = "web-1".to_owned();
    template.namespace = "team".to_owned();
    template.uid = Some("01J".to_owned());
    template.created_at = Some(prost_types::Timestamp {
        seconds: 1,
        nanos: 0,
    });
    assert_eq!(pool_spec_from_battery(&battery, None), spec);
}

#[test]
fn missing_size_is_sent_as_zero_and_read_back_as_zero() {
    let spec = PoolSpec::default();
    let battery = pool_spec_to_battery("ns", "p", &spec, Vec::new());
    assert_eq!(battery.size, 0);
    assert_eq!(pool_spec_from_battery(&battery, None).size, Some(0));
}

#[test]
fn empty_battery_spec_reads_as_defaults() {
    let spec = pool_spec_from_battery(&pb::PoolSpec::default(), None);
    assert_eq!(spec.replenishment, Replenishment::default());
    assert_eq!(spec.hooks, Hooks::default());
    assert_eq!(spec.lease, LeaseSettings::default());
    assert_eq!(spec.template, MicroVMTemplate::default());
}

#[test]
fn replenishment_types() {
    let table = [
        (
            ReplenishmentType::ImmediateOnLease,
            pb::ReplenishmentStrategyType::ImmediateOnLease,
        ),
        (
            ReplenishmentType::MinSizeThreshold,
            pb::ReplenishmentStrategyType::MinSizeThreshold,
        ),
        (
            ReplenishmentType::ReplaceOnDelete,
            pb::ReplenishmentStrategyType::ReplaceOnDelete,
        ),
    ];
    for (ours, theirs) in table {
        assert_eq!(replenishment_type_to_battery(&ours), theirs);
        assert_eq!(replenishment_type_from_battery(theirs), ours);
    }
    assert_eq!(
        replenishment_type_to_battery(&ReplenishmentType::Unknown("Eager".to_owned())),
        pb::ReplenishmentStrategyType::Unspecified,
    );
    for raw in [0, 99] {
        let strategy = pb::ReplenishmentStrategy {
            r#type: raw,
            min_size: Some(3),
        };
        let spec = pool_spec_from_battery(
            &pb::PoolSpec {
                replenishment_strategy: Some(strategy),
                ..pb::PoolSpec::default()
            },
            None,
        );
        assert_eq!(
            spec.replenishment.type_,
            ReplenishmentType::ImmediateOnLease
        );
        assert_eq!(spec.replenishment.min_size, Some(3));
    }
}

#[test]
fn failure_policies() {
    let table = [
        (
            HookFailurePolicy::DeleteAndReplace,
            pb::HookFailurePolicy::DeleteAndReplace,
        ),
        (
            HookFailurePolicy::Quarantine,
            pb::HookFailurePolicy::Quarantine,
        ),
    ];
    for (ours, theirs) in table {
        assert_eq!(failure_policy_to_battery(&ours), theirs);
        assert_eq!(failure_policy_from_battery(theirs), ours);
    }
    assert_eq!(
        failure_policy_to_battery(&HookFailurePolicy::Unknown("Ignore".to_owned())),
        pb::HookFailurePolicy::Unspecified,
    );
    for raw in [0, 99] {
        let spec = pool_spec_from_battery(
            &pb::PoolSpec {
                hook_failure_policy: raw,
                ..pb::PoolSpec::default()
            },
            None,
        );
        assert_eq!(
            spec.hooks.failure_policy,
            HookFailurePolicy::DeleteAndReplace
        );
    }
}

#[test]
fn interface_types() {
    let table = [
        (InterfaceType::Macvtap, IfaceType::Macvtap),
        (InterfaceType::Tap, IfaceType::Tap),
        (
            InterfaceType::Unknown("Veth".to_owned()),
            IfaceType::Macvtap,
        ),
    ];
    for (ours, theirs) in table {
        let interface = NetworkInterface {
            type_: ours,
            ..NetworkInterface::default()
        };
        assert_eq!(interface_to_battery(&interface).r#type(), theirs);
    }
    let newer = fl::NetworkInterface {
        r#type: 7,
        ..fl::NetworkInterface::default()
    };
    assert_eq!(interface_from_battery(&newer).type_, InterfaceType::Macvtap);
}

#[test]
fn durations_from_battery() {
    let cases = [
        ((10, 0), 10_000_000_000),
        ((1, 500_000_000), 1_500_000_000),
        ((-1, -500_000_000), -1_500_000_000),
        ((0, -1), -1),
        // Unnormalized nanos still add up.
        ((2, -1), 1_999_999_999),
        ((i64::MAX, 0), i64::MAX),
        ((i64::MIN, 0), i64::MIN),
    ];
    for ((seconds, nanos), expected) in cases {
        let battery = prost_types::Duration { seconds, nanos };
        assert_eq!(
            duration_from_battery(&battery),
            Duration::from_nanos(expected),
            "{seconds}s {nanos}ns"
        );
    }
}

#[test]
fn micro_time_keeps_microseconds() {
    let cases = [
        ((1_700_000_000, 0), Some(1_700_000_000_000_000)),
        ((1_700_000_000, 123_456_789), Some(1_700_000_000_123_456)),
        ((-1, 999), Some(-1_000_000)),
        ((i64::MIN, 0), None),
    ];
    for ((seconds, nanos), expected) in cases {
        let ts = prost_types::Timestamp { seconds, nanos };
        assert_eq!(
            micro_time(&ts).map(|MicroTime(t)| t.as_microsecond()),
            expected,
            "{seconds}s {nanos}ns"
        );
    }
}

#[test]
fn micro_time_serializes_as_kubernetes_does() {
    let ts = prost_types::Timestamp {
        seconds: 1_700_000_000,
        nanos: 123_456_789,
    };
    assert_eq!(
        serde_json::to_value(micro_time(&ts)).expect("serializable"),
        "2023-11-14T22:13:20.123456Z"
    );
}

#[test]
fn network_interfaces_are_ordered_by_device_id() {
    let status = |index| fl::NetworkInterfaceStatus {
        host_device_name: format!("tap{index}"),
        index,
        mac_address: format!("02:00:00:00:00:0{index}"),
    };
    let map = HashMap::from([
        ("eth2".to_owned(), status(2)),
        ("eth0".to_owned(), status(0)),
        ("eth1".to_owned(), status(1)),
    ]);
    let interfaces = network_interfaces(&map);
    let ids: Vec<_> = interfaces.iter().map(|i| i.device_id.as_str()).collect();
    assert_eq!(ids, ["eth0", "eth1", "eth2"]);
    assert_eq!(
        interfaces[1],
        NetworkInterfaceStatus {
            device_id: "eth1".to_owned(),
            host_device_name: "tap1".to_owned(),
            index: 1,
            mac_address: "02:00:00:00:00:01".to_owned(),
        }
    );
    assert!(network_interfaces(&HashMap::new()).is_empty());
}

#[test]
fn pool_counts_copy_battery_counts() {
    let status = pb::PoolStatus {
        available_count: 1,
        leased_count: 2,
        provisioning_count: 3,
        quarantined_count: 4,
    };
    assert_eq!(
        pool_counts(Some(&status)),
        PoolStatus {
            available: 1,
            leased: 2,
            provisioning: 3,
            quarantined: 4,
            conditions: Vec::new(),
        }
    );
    assert_eq!(pool_counts(None), PoolStatus::default());
}

#[test]
fn host_round_trips() {
    let specs = [
        HostSpec {
            address: "10.0.0.1:9090".to_owned(),
            unschedulable: false,
            tls: HostTls {
                insecure: false,
                ca_file: Some("/etc/ca.pem".to_owned()),
                cert_file: Some("/etc/cert.pem".to_owned()),
                key_file: Some("/etc/key.pem".to_owned()),
            },
            agent_address: Some("10.0.0.1:9443".to_owned()),
        },
        HostSpec {
            address: "h:9090".to_owned(),
            unschedulable: false,
            tls: HostTls {
                insecure: true,
                ..HostTls::default()
            },
            agent_address: None,
        },
    ];
    for spec in specs {
        let battery = host_to_battery("h1", &spec);
        assert_eq!(battery.name, "h1");
        assert_eq!(
            host_spec_from_battery(&battery, spec.agent_address.clone()),
            spec
        );
    }
}

#[test]
fn host_cordon_is_left_to_the_cordon_rpcs() {
    let spec = HostSpec {
        address: "h:9090".to_owned(),
        unschedulable: true,
        ..HostSpec::default()
    };
    let battery = host_to_battery("h1", &spec);
    assert!(!battery.cordoned);
    assert_eq!(battery.cordoned_reason, "");
    assert_eq!(battery.cordoned_at, None);
}

#[test]
fn host_from_battery() {
    let host = pb::Host {
        name: "h1".to_owned(),
        address: "h:9090".to_owned(),
        cordoned: true,
        cordoned_reason: "maintenance".to_owned(),
        cordoned_at: Some(prost_types::Timestamp {
            seconds: 1,
            nanos: 0,
        }),
        updated_at: None,
        tls: None,
    };
    assert_eq!(
        host_spec_from_battery(&host, None),
        HostSpec {
            address: "h:9090".to_owned(),
            unschedulable: true,
            tls: HostTls::default(),
            agent_address: None,
        }
    );
    let status = pb::HostStatus {
        host: Some(host),
        vm_count: 3,
        flintlock_version: "v0.15.2".to_owned(),
    };
    assert_eq!(
        host_status_from_battery(&status),
        HostStatus {
            flintlock_version: Some("v0.15.2".to_owned()),
            vm_count: 3,
            cordoned_reason: Some("maintenance".to_owned()),
            conditions: Vec::new(),
        }
    );
    assert_eq!(
        host_status_from_battery(&pb::HostStatus::default()),
        HostStatus::default()
    );
}
