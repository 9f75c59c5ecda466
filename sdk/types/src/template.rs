//! `MicroVMTemplate`: flintlock's `MicroVMSpec` without the fields that identify one
//! MicroVM (`id`, `namespace`, `uid`, timestamps) or that battery sets itself
//! (`allow_guest_agent`, always true).

use std::collections::{BTreeMap, HashSet};

use base64::Engine as _;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::string_enum::string_enum;
use crate::validation::{FieldError, FieldErrorKind, FieldPath, messages};
use crate::wire::{is_false, required_fields};

/// The flintlock providers a template may name.
const PROVIDERS: &[&str] = &["firecracker", "cloudhypervisor"];
/// flintlock v0.15.2's vCPU limits.
const VCPU_RANGE: (i32, i32) = (1, 64);
/// flintlock v0.15.2's memory limits, in MiB.
const MEMORY_RANGE_MB: (i32, i32) = (1024, 32768);

/// The MicroVM every member of a Pool is created from: flintlock's MicroVMSpec without the
/// fields that identify one MicroVM.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = required_fields(&["vcpu", "memoryInMb", "kernel", "rootVolume", "interfaces"]))]
pub struct MicroVMTemplate {
    /// The flintlock provider that runs the MicroVM: `firecracker` or `cloudhypervisor`.
    /// Unset means flintlockd's default provider (Firecracker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Number of virtual CPUs, 1 to 64.
    #[serde(default)]
    #[schemars(range(min = 1, max = 64))]
    pub vcpu: i32,
    /// Memory in MiB, 1024 to 32768.
    #[serde(default)]
    #[schemars(range(min = 1024, max = 32768))]
    pub memory_in_mb: i32,
    /// The kernel the MicroVM boots.
    #[serde(default)]
    pub kernel: Kernel,
    /// An initial ramdisk to boot with the kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd: Option<Initrd>,
    /// The root filesystem volume.
    #[serde(default)]
    pub root_volume: Volume,
    /// Further volumes attached to the MicroVM. Volume ids must be unique, the root
    /// volume's included.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub additional_volumes: Vec<Volume>,
    /// Network interfaces, at least one. The guest sees them as eth1, eth2, ... in order,
    /// because flintlock keeps eth0 for its own use.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub interfaces: Vec<NetworkInterface>,
    /// Metadata flintlock's metadata service serves to cloud-init in the guest (for example
    /// `meta-data`, `user-data`, `vendor-data`). Each value is base64-encoded.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// Labels flintlock records on each MicroVM.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// The kernel a MicroVM boots, taken from a container image.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = required_fields(&["image"]))]
pub struct Kernel {
    /// The container image that holds the kernel.
    #[serde(default)]
    pub image: String,
    /// Kernel command-line arguments, added to those the provider sets itself.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cmdline: BTreeMap<String, String>,
    /// The kernel's path inside the image, for example `boot/vmlinux`. Unset means the
    /// provider's default path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
    /// Whether flintlock adds the network configuration of the interfaces to the kernel
    /// command line.
    #[serde(default, skip_serializing_if = "is_false")]
    pub add_network_config: bool,
}

/// An initial ramdisk, taken from a container image.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = required_fields(&["image"]))]
pub struct Initrd {
    /// The container image that holds the initrd.
    #[serde(default)]
    pub image: String,
    /// The initrd's path inside the image. Unset means the provider's default path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
}

/// A volume attached to a MicroVM. Exactly one source, `containerSource` or
/// `virtiofsSource`, must be set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = required_fields(&["id"]))]
pub struct Volume {
    /// The volume's id, unique among the MicroVM's volumes.
    #[serde(default)]
    pub id: String,
    /// Whether the guest sees the volume read-only.
    #[serde(default, skip_serializing_if = "is_false")]
    pub read_only: bool,
    /// Where the guest mounts the volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_point: Option<String>,
    /// The partition of the volume to use, when it has several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_id: Option<String>,
    /// The volume's size in MiB, at least 1. Unset means the size of its source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub size_in_mb: Option<i32>,
    /// A container image whose filesystem becomes the volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_source: Option<String>,
    /// A host path shared into the guest with virtio-fs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtiofs_source: Option<String>,
}

string_enum! {
    /// How a network interface reaches the host network.
    #[derive(Default)]
    pub enum InterfaceType {
        /// A macvtap device on the host's interface (the default).
        #[default]
        Macvtap = "Macvtap",
        /// A tap device attached to a host bridge.
        Tap = "Tap",
    }
}

/// A network interface of a MicroVM.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = required_fields(&["deviceId"]))]
pub struct NetworkInterface {
    /// The interface's name in flintlock, unique within the MicroVM; a claim's
    /// `status.networkInterfaces` reports each interface under this name.
    #[serde(default)]
    pub device_id: String,
    /// How the interface reaches the host network: `Macvtap` (the default) or `Tap`.
    #[serde(default, rename = "type")]
    pub type_: InterfaceType,
    /// The guest's MAC address, six colon-separated hex octets. Unset lets flintlock choose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_mac: Option<String>,
    /// A static address for the guest. Unset means the guest configures itself (DHCP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<StaticAddress>,
    /// Overrides of the host-side network settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overrides: Option<NetworkOverrides>,
}

/// A static address for a guest interface.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = required_fields(&["address"]))]
pub struct StaticAddress {
    /// The address with its prefix length, for example `192.168.100.10/24`.
    #[serde(default)]
    pub address: String,
    /// The default gateway's IP address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// IP addresses of DNS servers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
}

/// Overrides of the host-side settings of a network interface.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkOverrides {
    /// The host bridge a `Tap` interface is attached to, instead of flintlockd's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge_name: Option<String>,
}

impl MicroVMTemplate {
    /// Checks the template found at `path` (`spec.template`).
    pub(crate) fn validate(&self, path: &FieldPath) -> Vec<FieldError> {
        // A template that is absent altogether decodes to the default one; one error for
        // the whole field says what happened better than one for each of its parts.
        if *self == Self::default() {
            return vec![FieldError::required(path, "")];
        }
        let mut errors = Vec::new();
        if let Some(provider) = &self.provider
            && !PROVIDERS.contains(&provider.as_str())
        {
            errors.push(FieldError::not_supported(
                path.child("provider"),
                provider.as_str(),
                PROVIDERS,
            ));
        }
        errors.extend(check_range(self.vcpu, VCPU_RANGE, &path.child("vcpu")));
        errors.extend(check_range(
            self.memory_in_mb,
            MEMORY_RANGE_MB,
            &path.child("memoryInMb"),
        ));
        errors.extend(self.kernel.validate(&path.child("kernel")));
        if let Some(initrd) = &self.initrd
            && initrd.image.is_empty()
        {
            errors.push(FieldError::required(
                path.child("initrd").child("image"),
                "",
            ));
        }

        let mut volume_ids = HashSet::new();
        let volumes = std::iter::once((path.child("rootVolume"), &self.root_volume)).chain(
            self.additional_volumes
                .iter()
                .enumerate()
                .map(|(i, volume)| (path.child("additionalVolumes").index(i), volume)),
        );
        for (volume_path, volume) in volumes {
            errors.extend(volume.validate(&volume_path));
            if !volume.id.is_empty() && !volume_ids.insert(volume.id.as_str()) {
                errors.push(FieldError::duplicate(
                    volume_path.child("id"),
                    volume.id.as_str(),
                ));
            }
        }

        if self.interfaces.is_empty() {
            errors.push(FieldError::required(
                path.child("interfaces"),
                "at least one network interface is required",
            ));
        }
        let mut device_ids = HashSet::new();
        for (i, interface) in self.interfaces.iter().enumerate() {
            let interface_path = path.child("interfaces").index(i);
            errors.extend(interface.validate(&interface_path));
            if !interface.device_id.is_empty() && !device_ids.insert(interface.device_id.as_str()) {
                errors.push(FieldError::duplicate(
                    interface_path.child("deviceId"),
                    interface.device_id.as_str(),
                ));
            }
        }

        // flintlock takes these base64-encoded; a value that is not would only be found
        // out when a MicroVM is created, leaving the Pool unable to fill.
        for (key, value) in &self.metadata {
            if base64::engine::general_purpose::STANDARD
                .decode(value)
                .is_err()
            {
                // The value is left out of the message: it may be a whole cloud-init file.
                errors.push(FieldError {
                    field: path.child("metadata").key(key).into(),
                    kind: FieldErrorKind::Invalid,
                    value: None,
                    detail: "must be base64-encoded".to_owned(),
                });
            }
        }
        errors
    }
}

fn check_range(value: i32, (low, high): (i32, i32), path: &FieldPath) -> Option<FieldError> {
    (!(low..=high).contains(&value)).then(|| {
        FieldError::invalid(
            path,
            value,
            messages::inclusive_range(low.into(), high.into()),
        )
    })
}

impl Kernel {
    fn validate(&self, path: &FieldPath) -> Vec<FieldError> {
        if self.image.is_empty() {
            return vec![FieldError::required(path.child("image"), "")];
        }
        Vec::new()
    }
}

impl Volume {
    fn validate(&self, path: &FieldPath) -> Vec<FieldError> {
        let mut errors = Vec::new();
        if self.id.is_empty() {
            errors.push(FieldError::required(path.child("id"), ""));
        }
        if let Some(size) = self.size_in_mb.filter(|size| *size < 1) {
            errors.push(FieldError::invalid(
                path.child("sizeInMb"),
                size,
                messages::at_least(1),
            ));
        }
        match (&self.container_source, &self.virtiofs_source) {
            (Some(_), Some(_)) => errors.push(FieldError::forbidden(
                path.child("virtiofsSource"),
                "may not be specified together with containerSource",
            )),
            (None, None) => errors.push(FieldError::required(
                path,
                "exactly one of containerSource or virtiofsSource is required",
            )),
            _ => {}
        }
        errors
    }
}

impl NetworkInterface {
    fn validate(&self, path: &FieldPath) -> Vec<FieldError> {
        let mut errors = Vec::new();
        if self.device_id.is_empty() {
            errors.push(FieldError::required(path.child("deviceId"), ""));
        }
        if !self.type_.is_known() {
            errors.push(FieldError::not_supported(
                path.child("type"),
                self.type_.as_str(),
                InterfaceType::VALUES,
            ));
        }
        if let Some(mac) = self.guest_mac.as_deref()
            && !is_mac_address(mac)
        {
            errors.push(FieldError::invalid(
                path.child("guestMac"),
                mac,
                "must be a MAC address of six colon-separated hex octets (e.g. 02:00:00:00:00:01)",
            ));
        }
        if let Some(address) = &self.address {
            errors.extend(address.validate(&path.child("address")));
        }
        errors
    }
}

impl StaticAddress {
    fn validate(&self, path: &FieldPath) -> Vec<FieldError> {
        let mut errors = Vec::new();
        if self.address.is_empty() {
            errors.push(FieldError::required(path.child("address"), ""));
        } else if !is_cidr(&self.address) {
            errors.push(FieldError::invalid(
                path.child("address"),
                self.address.as_str(),
                messages::CIDR,
            ));
        }
        if let Some(gateway) = self.gateway.as_deref()
            && gateway.parse::<std::net::IpAddr>().is_err()
        {
            errors.push(FieldError::invalid(
                path.child("gateway"),
                gateway,
                messages::IP,
            ));
        }
        for (i, nameserver) in self.nameservers.iter().enumerate() {
            if nameserver.parse::<std::net::IpAddr>().is_err() {
                errors.push(FieldError::invalid(
                    path.child("nameservers").index(i),
                    nameserver.as_str(),
                    messages::IP,
                ));
            }
        }
        errors
    }
}

/// An address with a prefix length (`10.0.0.5/24`, `2001:db8::5/64`); host bits may be set,
/// since this is an interface address rather than a network.
fn is_cidr(value: &str) -> bool {
    let Some((ip, prefix)) = value.split_once('/') else {
        return false;
    };
    let Ok(ip) = ip.parse::<std::net::IpAddr>() else {
        return false;
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    prefix.bytes().all(|b| b.is_ascii_digit())
        && prefix.parse::<u8>().is_ok_and(|prefix| prefix <= max)
}

/// Six colon-separated pairs of hex digits, the form Firecracker and Cloud Hypervisor take.
fn is_mac_address(value: &str) -> bool {
    let octets: Vec<&str> = value.split(':').collect();
    octets.len() == 6
        && octets
            .iter()
            .all(|octet| octet.len() == 2 && octet.bytes().all(|b| b.is_ascii_hexdigit()))
}
