//! Conversion between our API types and battery's protobuf messages, both ways.
//!
//! Writing is total: every spec that passed validation has exactly one battery form.
//! Reading never fails: battery is the authority, so a field it leaves unset or a value
//! newer than our protos reads as our default rather than making the object unreadable.
//! For everything our types can express, reading back what we wrote gives the original
//! (the proptest below checks it).

use std::collections::HashMap;

use battery_proto::flintlock::types as fl;
use battery_proto::poolmgr::v1alpha1 as pb;
use battery_types::{
    Duration, HookFailurePolicy, Hooks, HostSpec, HostStatus, HostTls, Initrd, InterfaceType,
    Kernel, LeaseSettings, MicroVMTemplate, NetworkInterface, NetworkInterfaceStatus,
    NetworkOverrides, Placement, PoolSpec, PoolStatus, Replenishment, ReplenishmentType,
    StaticAddress, Volume,
};
use fl::network_interface::IfaceType;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;

const NANOS_PER_SECOND: i64 = 1_000_000_000;
const NANOS_PER_MICROSECOND: i64 = 1_000;

/// The battery form of the Pool `namespace/name`. `hosts` are the Host names its
/// `placement` selects, resolved by the caller: battery knows hosts by name, not labels.
pub fn pool_spec_to_battery(
    namespace: &str,
    name: &str,
    spec: &PoolSpec,
    hosts: Vec<String>,
) -> pb::PoolSpec {
    pb::PoolSpec {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        microvm_template: Some(template_to_battery(&spec.template)),
        // Validation requires a size, so `None` never gets here; 0 is the harmless reading.
        size: spec.size.unwrap_or(0),
        flintlock_hosts: hosts,
        replenishment_strategy: Some(pb::ReplenishmentStrategy {
            r#type: replenishment_type_to_battery(&spec.replenishment.type_).into(),
            min_size: spec.replenishment.min_size,
        }),
        create_commands: spec.hooks.create.clone(),
        pre_lease_commands: spec.hooks.pre_lease.clone(),
        hook_failure_policy: failure_policy_to_battery(&spec.hooks.failure_policy).into(),
        heartbeat_interval: Some(duration_to_battery(spec.lease.heartbeat_interval)),
        heartbeat_expiry_threshold: Some(duration_to_battery(spec.lease.expiry_threshold)),
    }
}

/// Our form of a battery Pool spec. `placement` is passed through because battery holds
/// only the Host names it resolved to, not the selector.
pub fn pool_spec_from_battery(spec: &pb::PoolSpec, placement: Option<Placement>) -> PoolSpec {
    let defaults = LeaseSettings::default();
    PoolSpec {
        template: spec
            .microvm_template
            .as_ref()
            .map(template_from_battery)
            .unwrap_or_default(),
        size: Some(spec.size),
        placement,
        // Ours, like placement: battery has no limits on a lease's life.
        claim_limits: None,
        // Ours alone: the caller puts back what its record keeps.
        service_account_token: None,
        replenishment: spec
            .replenishment_strategy
            .as_ref()
            .map(|strategy| Replenishment {
                type_: replenishment_type_from_battery(strategy.r#type()),
                min_size: strategy.min_size,
            })
            .unwrap_or_default(),
        hooks: Hooks {
            create: spec.create_commands.clone(),
            pre_lease: spec.pre_lease_commands.clone(),
            failure_policy: failure_policy_from_battery(spec.hook_failure_policy()),
        },
        // We always send both; only a Pool written by another client of battery can lack
        // them, and our defaults are what such a Pool would have got here.
        lease: LeaseSettings {
            heartbeat_interval: spec
                .heartbeat_interval
                .as_ref()
                .map_or(defaults.heartbeat_interval, duration_from_battery),
            expiry_threshold: spec
                .heartbeat_expiry_threshold
                .as_ref()
                .map_or(defaults.expiry_threshold, duration_from_battery),
        },
    }
}

/// The MicroVM counts of a Pool. A missing status counts nothing; conditions are the
/// caller's to compute, from these counts and what it knows beyond battery.
pub fn pool_counts(status: Option<&pb::PoolStatus>) -> PoolStatus {
    let Some(status) = status else {
        return PoolStatus::default();
    };
    PoolStatus {
        available: status.available_count,
        leased: status.leased_count,
        provisioning: status.provisioning_count,
        quarantined: status.quarantined_count,
        conditions: Vec::new(),
    }
}

/// The battery form of the Host `name`, for AddHost and UpdateHost. The cordon fields stay
/// unset: both RPCs ignore them, and `unschedulable` is applied with CordonHost and
/// UncordonHost instead.
pub fn host_to_battery(name: &str, spec: &HostSpec) -> pb::Host {
    let tls = &spec.tls;
    pb::Host {
        name: name.to_owned(),
        address: spec.address.clone(),
        cordoned: false,
        cordoned_reason: String::new(),
        cordoned_at: None,
        updated_at: None,
        tls: Some(pb::HostTls {
            insecure: tls.insecure,
            ca_file: tls.ca_file.clone().unwrap_or_default(),
            cert_file: tls.cert_file.clone().unwrap_or_default(),
            key_file: tls.key_file.clone().unwrap_or_default(),
        }),
    }
}

/// Our form of a battery Host. `agent_address` is passed through because battery does not
/// hold it: only the exec relay uses it.
pub fn host_spec_from_battery(host: &pb::Host, agent_address: Option<String>) -> HostSpec {
    // Only a Host stored by a battery older than HostTLS lacks it; such a Host has no TLS
    // settings at all, which is what the default says.
    let tls = host
        .tls
        .as_ref()
        .map_or_else(HostTls::default, |tls| HostTls {
            insecure: tls.insecure,
            ca_file: non_empty(&tls.ca_file),
            cert_file: non_empty(&tls.cert_file),
            key_file: non_empty(&tls.key_file),
        });
    HostSpec {
        address: host.address.clone(),
        unschedulable: host.cordoned,
        tls,
        agent_address,
    }
}

/// What battery reports about a Host. Conditions come from its agent, not from battery.
pub fn host_status_from_battery(status: &pb::HostStatus) -> HostStatus {
    HostStatus {
        // Empty until battery has asked flintlockd for its version.
        flintlock_version: non_empty(&status.flintlock_version),
        vm_count: status.vm_count,
        cordoned_reason: status
            .host
            .as_ref()
            .and_then(|host| non_empty(&host.cordoned_reason)),
        conditions: Vec::new(),
    }
}

/// A battery timestamp as Kubernetes writes a `MicroTime`: to the microsecond, the rest
/// dropped as Go's RFC 3339 formatting drops it, so an object compares equal to its own
/// JSON. `None` when the time is outside what `MicroTime` can hold.
pub fn micro_time(ts: &prost_types::Timestamp) -> Option<MicroTime> {
    let micros =
        i64::try_from(timestamp_nanos(ts).div_euclid(NANOS_PER_MICROSECOND.into())).ok()?;
    Timestamp::from_microsecond(micros).ok().map(MicroTime)
}

/// A claimed MicroVM's interfaces, ordered by device id so that the list (which battery
/// sends as a map) reads the same on every call.
pub fn network_interfaces(
    map: &HashMap<String, fl::NetworkInterfaceStatus>,
) -> Vec<NetworkInterfaceStatus> {
    let mut interfaces: Vec<_> = map
        .iter()
        .map(|(device_id, status)| NetworkInterfaceStatus {
            device_id: device_id.clone(),
            host_device_name: status.host_device_name.clone(),
            index: status.index,
            mac_address: status.mac_address.clone(),
        })
        .collect();
    interfaces.sort_by(|a, b| a.device_id.cmp(&b.device_id));
    interfaces
}

/// Nanoseconds since the epoch. Widened so that a timestamp whose nanos are out of their
/// normal range (protobuf allows it on the wire) still adds up exactly.
fn timestamp_nanos(ts: &prost_types::Timestamp) -> i128 {
    i128::from(ts.seconds) * i128::from(NANOS_PER_SECOND) + i128::from(ts.nanos)
}

fn non_empty(value: &str) -> Option<String> {
    (!value.is_empty()).then(|| value.to_owned())
}

/// Seconds and nanos truncated toward zero, so both carry the duration's sign as
/// google.protobuf.Duration requires. Every `i64` of nanoseconds fits.
fn duration_to_battery(duration: Duration) -> prost_types::Duration {
    let nanos = duration.as_nanos();
    prost_types::Duration {
        seconds: nanos / NANOS_PER_SECOND,
        nanos: i32::try_from(nanos % NANOS_PER_SECOND)
            .expect("a remainder of a division by 1e9 fits an i32"),
    }
}

/// A duration too long for `i64` nanoseconds (about 292 years) saturates, as Go's
/// `durationpb.AsDuration` does when battery reads the same field.
fn duration_from_battery(duration: &prost_types::Duration) -> Duration {
    let nanos =
        i128::from(duration.seconds) * i128::from(NANOS_PER_SECOND) + i128::from(duration.nanos);
    let saturated = if nanos < 0 { i64::MIN } else { i64::MAX };
    Duration::from_nanos(i64::try_from(nanos).unwrap_or(saturated))
}

/// Validation refuses an unknown type before a spec reaches battery; UNSPECIFIED is what
/// battery would refuse it as, should one slip through.
fn replenishment_type_to_battery(type_: &ReplenishmentType) -> pb::ReplenishmentStrategyType {
    match type_ {
        ReplenishmentType::ImmediateOnLease => pb::ReplenishmentStrategyType::ImmediateOnLease,
        ReplenishmentType::MinSizeThreshold => pb::ReplenishmentStrategyType::MinSizeThreshold,
        ReplenishmentType::ReplaceOnDelete => pb::ReplenishmentStrategyType::ReplaceOnDelete,
        ReplenishmentType::Unknown(_) => pb::ReplenishmentStrategyType::Unspecified,
    }
}

/// battery refuses UNSPECIFIED in a spec, so it reaches us only from a Pool stored some
/// other way; prost also reads a value newer than our proto as UNSPECIFIED. Either way our
/// default keeps the Pool readable.
fn replenishment_type_from_battery(type_: pb::ReplenishmentStrategyType) -> ReplenishmentType {
    match type_ {
        pb::ReplenishmentStrategyType::ImmediateOnLease => ReplenishmentType::ImmediateOnLease,
        pb::ReplenishmentStrategyType::MinSizeThreshold => ReplenishmentType::MinSizeThreshold,
        pb::ReplenishmentStrategyType::ReplaceOnDelete => ReplenishmentType::ReplaceOnDelete,
        pb::ReplenishmentStrategyType::Unspecified => ReplenishmentType::default(),
    }
}

/// As for [`replenishment_type_to_battery`]: validation refuses an unknown policy first.
fn failure_policy_to_battery(policy: &HookFailurePolicy) -> pb::HookFailurePolicy {
    match policy {
        HookFailurePolicy::DeleteAndReplace => pb::HookFailurePolicy::DeleteAndReplace,
        HookFailurePolicy::Quarantine => pb::HookFailurePolicy::Quarantine,
        HookFailurePolicy::Unknown(_) => pb::HookFailurePolicy::Unspecified,
    }
}

/// UNSPECIFIED or a newer value reads as our default, DeleteAndReplace, which is also how
/// battery itself treats an unknown policy when a hook fails.
fn failure_policy_from_battery(policy: pb::HookFailurePolicy) -> HookFailurePolicy {
    match policy {
        pb::HookFailurePolicy::DeleteAndReplace => HookFailurePolicy::DeleteAndReplace,
        pb::HookFailurePolicy::Quarantine => HookFailurePolicy::Quarantine,
        pb::HookFailurePolicy::Unspecified => HookFailurePolicy::default(),
    }
}

/// flintlock's MicroVMSpec for a template. The fields that identify one MicroVM stay
/// empty: battery fills them for each MicroVM it creates, and an empty namespace makes it
/// use the Pool's. `allow_guest_agent` is sent true because battery needs the agent for
/// hooks and forces it true anyway.
fn template_to_battery(template: &MicroVMTemplate) -> fl::MicroVmSpec {
    let kernel = &template.kernel;
    fl::MicroVmSpec {
        id: String::new(),
        namespace: String::new(),
        labels: template.labels.clone().into_iter().collect(),
        vcpu: template.vcpu,
        memory_in_mb: template.memory_in_mb,
        kernel: Some(fl::Kernel {
            image: kernel.image.clone(),
            cmdline: kernel.cmdline.clone().into_iter().collect(),
            filename: kernel.filename.clone(),
            add_network_config: kernel.add_network_config,
        }),
        initrd: template.initrd.as_ref().map(|initrd| fl::Initrd {
            image: initrd.image.clone(),
            filename: initrd.filename.clone(),
        }),
        root_volume: Some(volume_to_battery(&template.root_volume)),
        additional_volumes: template
            .additional_volumes
            .iter()
            .map(volume_to_battery)
            .collect(),
        interfaces: template
            .interfaces
            .iter()
            .map(interface_to_battery)
            .collect(),
        metadata: template.metadata.clone().into_iter().collect(),
        created_at: None,
        updated_at: None,
        deleted_at: None,
        uid: None,
        provider: template.provider.clone(),
        allow_guest_agent: true,
    }
}

/// Reads only what a template can express, so what battery adds (id, namespace, uid,
/// timestamps, `allow_guest_agent`) does not show up as a change to the Pool.
fn template_from_battery(spec: &fl::MicroVmSpec) -> MicroVMTemplate {
    MicroVMTemplate {
        provider: spec.provider.clone(),
        vcpu: spec.vcpu,
        memory_in_mb: spec.memory_in_mb,
        kernel: spec
            .kernel
            .as_ref()
            .map(|kernel| Kernel {
                image: kernel.image.clone(),
                cmdline: kernel.cmdline.clone().into_iter().collect(),
                filename: kernel.filename.clone(),
                add_network_config: kernel.add_network_config,
            })
            .unwrap_or_default(),
        initrd: spec.initrd.as_ref().map(|initrd| Initrd {
            image: initrd.image.clone(),
            filename: initrd.filename.clone(),
        }),
        root_volume: spec
            .root_volume
            .as_ref()
            .map(volume_from_battery)
            .unwrap_or_default(),
        additional_volumes: spec
            .additional_volumes
            .iter()
            .map(volume_from_battery)
            .collect(),
        interfaces: spec.interfaces.iter().map(interface_from_battery).collect(),
        metadata: spec.metadata.clone().into_iter().collect(),
        labels: spec.labels.clone().into_iter().collect(),
    }
}

fn volume_to_battery(volume: &Volume) -> fl::Volume {
    fl::Volume {
        id: volume.id.clone(),
        is_read_only: volume.read_only,
        mount_point: volume.mount_point.clone(),
        source: Some(fl::VolumeSource {
            container_source: volume.container_source.clone(),
            virtiofs_source: volume.virtiofs_source.clone(),
        }),
        partition_id: volume.partition_id.clone(),
        size_in_mb: volume.size_in_mb,
    }
}

fn volume_from_battery(volume: &fl::Volume) -> Volume {
    let source = volume.source.as_ref();
    Volume {
        id: volume.id.clone(),
        read_only: volume.is_read_only,
        mount_point: volume.mount_point.clone(),
        partition_id: volume.partition_id.clone(),
        size_in_mb: volume.size_in_mb,
        container_source: source.and_then(|source| source.container_source.clone()),
        virtiofs_source: source.and_then(|source| source.virtiofs_source.clone()),
    }
}

fn interface_to_battery(interface: &NetworkInterface) -> fl::NetworkInterface {
    let type_ = match &interface.type_ {
        InterfaceType::Tap => IfaceType::Tap,
        // Validation refuses an unknown type before a spec reaches battery; MACVTAP is
        // flintlock's zero value, what it would read for an unset type.
        InterfaceType::Macvtap | InterfaceType::Unknown(_) => IfaceType::Macvtap,
    };
    fl::NetworkInterface {
        device_id: interface.device_id.clone(),
        r#type: type_.into(),
        guest_mac: interface.guest_mac.clone(),
        address: interface.address.as_ref().map(|address| fl::StaticAddress {
            address: address.address.clone(),
            gateway: address.gateway.clone(),
            nameservers: address.nameservers.clone(),
        }),
        overrides: interface
            .overrides
            .as_ref()
            .map(|overrides| fl::NetworkOverrides {
                bridge_name: overrides.bridge_name.clone(),
            }),
    }
}

fn interface_from_battery(interface: &fl::NetworkInterface) -> NetworkInterface {
    // prost reads a type newer than our proto as MACVTAP, flintlock's zero value.
    let type_ = match interface.r#type() {
        IfaceType::Macvtap => InterfaceType::Macvtap,
        IfaceType::Tap => InterfaceType::Tap,
    };
    NetworkInterface {
        device_id: interface.device_id.clone(),
        type_,
        guest_mac: interface.guest_mac.clone(),
        address: interface.address.as_ref().map(|address| StaticAddress {
            address: address.address.clone(),
            gateway: address.gateway.clone(),
            nameservers: address.nameservers.clone(),
        }),
        overrides: interface
            .overrides
            .as_ref()
            .map(|overrides| NetworkOverrides {
                bridge_name: overrides.bridge_name.clone(),
            }),
    }
}

#[cfg(test)]
mod tests;
