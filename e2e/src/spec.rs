//! Pool specs with defaults, so tests state only what they are about.

use std::time::Duration;

use battery_proto::flintlock::types::{
    Kernel, MicroVmSpec, NetworkInterface, StaticAddress, Volume, VolumeSource,
    network_interface::IfaceType,
};
use battery_proto::poolmgr::v1alpha1::{
    HookFailurePolicy, PoolRef, PoolSpec, ReplenishmentStrategy, ReplenishmentStrategyType,
};

use crate::env::{DEFAULT_KERNEL_IMAGE, DEFAULT_ROOT_IMAGE, KERNEL_IMAGE_VAR, ROOT_IMAGE_VAR, var};

/// The template's one network interface (its key in `ClaimVMResponse.network_interfaces`).
pub const TEMPLATE_INTERFACE: &str = "eth1";

/// A `google.protobuf.Duration`.
pub fn proto_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).expect("duration fits"),
        nanos: i32::try_from(d.subsec_nanos()).expect("nanos fit"),
    }
}

/// A small MicroVM template: 1 vCPU, 512 MiB, kernel and root volume images from the
/// environment (or flintlock's usual ones), one DHCP TAP interface `eth1`, no id and no
/// namespace (battery fills both in).
pub fn default_template() -> MicroVmSpec {
    let kernel = var(KERNEL_IMAGE_VAR).unwrap_or_else(|| DEFAULT_KERNEL_IMAGE.to_owned());
    let root = var(ROOT_IMAGE_VAR).unwrap_or_else(|| DEFAULT_ROOT_IMAGE.to_owned());
    MicroVmSpec {
        vcpu: 1,
        memory_in_mb: 512,
        kernel: Some(Kernel {
            image: kernel,
            filename: Some("boot/vmlinux".to_owned()),
            add_network_config: true,
            ..Kernel::default()
        }),
        root_volume: Some(Volume {
            id: "root".to_owned(),
            is_read_only: false,
            source: Some(VolumeSource {
                container_source: Some(root),
                ..VolumeSource::default()
            }),
            ..Volume::default()
        }),
        interfaces: vec![NetworkInterface {
            device_id: TEMPLATE_INTERFACE.to_owned(),
            r#type: IfaceType::Tap as i32,
            ..NetworkInterface::default()
        }],
        ..MicroVmSpec::default()
    }
}

/// Builds a [`PoolSpec`]. Defaults: size 1, REPLACE_ON_DELETE, DELETE_AND_REPLACE, no
/// hooks, heartbeat interval 10 s, expiry threshold 60 s, [`default_template`].
#[derive(Debug, Clone)]
pub struct PoolBuilder {
    spec: PoolSpec,
}

impl PoolBuilder {
    pub fn new(name: &str, namespace: &str, hosts: &[String]) -> Self {
        Self {
            spec: PoolSpec {
                name: name.to_owned(),
                namespace: namespace.to_owned(),
                microvm_template: Some(default_template()),
                size: 1,
                flintlock_hosts: hosts.to_vec(),
                replenishment_strategy: Some(ReplenishmentStrategy {
                    r#type: ReplenishmentStrategyType::ReplaceOnDelete as i32,
                    min_size: None,
                }),
                create_commands: Vec::new(),
                pre_lease_commands: Vec::new(),
                hook_failure_policy: HookFailurePolicy::DeleteAndReplace as i32,
                heartbeat_interval: Some(proto_duration(Duration::from_secs(10))),
                heartbeat_expiry_threshold: Some(proto_duration(Duration::from_secs(60))),
            },
        }
    }

    pub fn pool_ref(&self) -> PoolRef {
        PoolRef {
            name: self.spec.name.clone(),
            namespace: self.spec.namespace.clone(),
        }
    }

    pub fn name(mut self, name: &str) -> Self {
        self.spec.name = name.to_owned();
        self
    }

    pub fn namespace(mut self, namespace: &str) -> Self {
        self.spec.namespace = namespace.to_owned();
        self
    }

    pub fn size(mut self, size: i32) -> Self {
        self.spec.size = size;
        self
    }

    pub fn hosts<S: AsRef<str>>(mut self, hosts: &[S]) -> Self {
        self.spec.flintlock_hosts = hosts.iter().map(|h| h.as_ref().to_owned()).collect();
        self
    }

    pub fn strategy(mut self, strategy: Option<ReplenishmentStrategy>) -> Self {
        self.spec.replenishment_strategy = strategy;
        self
    }

    fn strategy_type(self, kind: ReplenishmentStrategyType, min_size: Option<i32>) -> Self {
        self.strategy(Some(ReplenishmentStrategy {
            r#type: kind as i32,
            min_size,
        }))
    }

    pub fn immediate_on_lease(self) -> Self {
        self.strategy_type(ReplenishmentStrategyType::ImmediateOnLease, None)
    }

    pub fn replace_on_delete(self) -> Self {
        self.strategy_type(ReplenishmentStrategyType::ReplaceOnDelete, None)
    }

    pub fn min_size_threshold(self, min_size: i32) -> Self {
        self.strategy_type(ReplenishmentStrategyType::MinSizeThreshold, Some(min_size))
    }

    pub fn create_commands<S: AsRef<str>>(mut self, commands: &[S]) -> Self {
        self.spec.create_commands = commands.iter().map(|c| c.as_ref().to_owned()).collect();
        self
    }

    pub fn pre_lease_commands<S: AsRef<str>>(mut self, commands: &[S]) -> Self {
        self.spec.pre_lease_commands = commands.iter().map(|c| c.as_ref().to_owned()).collect();
        self
    }

    pub fn policy(self, policy: HookFailurePolicy) -> Self {
        self.raw_policy(policy as i32)
    }

    pub fn raw_policy(mut self, policy: i32) -> Self {
        self.spec.hook_failure_policy = policy;
        self
    }

    pub fn quarantine(self) -> Self {
        self.policy(HookFailurePolicy::Quarantine)
    }

    /// `heartbeat_expiry_threshold`: the lease lifetime after a claim or heartbeat.
    pub fn expiry(mut self, threshold: Duration) -> Self {
        self.spec.heartbeat_expiry_threshold = Some(proto_duration(threshold));
        self
    }

    pub fn template(mut self, template: Option<MicroVmSpec>) -> Self {
        self.spec.microvm_template = template;
        self
    }

    fn edit_interface(mut self, edit: impl FnOnce(&mut NetworkInterface)) -> Self {
        let template = self
            .spec
            .microvm_template
            .get_or_insert_with(default_template);
        edit(
            template
                .interfaces
                .first_mut()
                .expect("template has an interface"),
        );
        self
    }

    /// Gives the template interface a fixed MAC (a "static network" template).
    pub fn guest_mac(self, mac: &str) -> Self {
        self.edit_interface(|iface| iface.guest_mac = Some(mac.to_owned()))
    }

    /// Gives the template interface a static address (a "static network" template).
    pub fn static_address(self, cidr: &str) -> Self {
        self.edit_interface(|iface| {
            iface.address = Some(StaticAddress {
                address: cidr.to_owned(),
                ..StaticAddress::default()
            });
        })
    }

    pub fn build(self) -> PoolSpec {
        self.spec
    }
}
