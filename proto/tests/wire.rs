//! Pins messages to bytes computed by hand from the field numbers in
//! `reference/battery-api.md`, so a wrong number or type in a `.proto` fails here
//! instead of on the wire against a real poolmgrd or flintlockd.

use battery_proto::flintlock::types::{MicroVmSpec, NetworkInterface};
use battery_proto::microvmexec::services::api::v1alpha1::{
    ExecCommandResponse, exec_command_response,
};
use battery_proto::poolmgr::v1alpha1::{
    ClaimVmRequest, DeletePoolRequest, Event, EventType, Host, HostStatus, HostTls, LeaseRecord,
    PoolRef, PoolSpec, ReplenishmentStrategy, ReplenishmentStrategyType,
};
use prost::Message;

fn assert_wire<M: Message + Default + PartialEq + std::fmt::Debug>(msg: M, bytes: &[u8]) {
    assert_eq!(msg.encode_to_vec(), bytes, "encoding of {msg:?}");
    assert_eq!(M::decode(bytes).unwrap(), msg, "decoding of {bytes:02x?}");
}

#[test]
fn claim_vm_request_carries_pool_ref_1_and_request_id_2() {
    let msg = ClaimVmRequest {
        pool: Some(PoolRef {
            name: "p".into(),
            namespace: "n".into(),
        }),
        request_id: "r".into(),
    };
    assert_wire(
        msg,
        &[
            0x0a, 0x06, 0x0a, 0x01, b'p', 0x12, 0x01, b'n', 0x12, 0x01, b'r',
        ],
    );
}

#[test]
fn lease_record_request_id_is_field_8() {
    let msg = LeaseRecord {
        request_id: "x".into(),
        ..Default::default()
    };
    assert_wire(msg, &[0x42, 0x01, b'x']);
}

#[test]
fn delete_pool_force_is_field_2() {
    assert_wire(
        DeletePoolRequest {
            r#ref: None,
            force: true,
        },
        &[0x10, 0x01],
    );
}

#[test]
fn vm_deleted_on_pool_delete_is_11() {
    let msg = Event {
        r#type: EventType::VmDeletedOnPoolDelete as i32,
        ..Default::default()
    };
    assert_wire(msg, &[0x20, 0x0b]);
}

#[test]
fn host_tls_is_field_7() {
    let msg = Host {
        tls: Some(HostTls {
            insecure: true,
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_wire(msg, &[0x3a, 0x02, 0x08, 0x01]);
}

#[test]
fn host_status_flintlock_version_is_field_3() {
    let msg = HostStatus {
        flintlock_version: "v".into(),
        ..Default::default()
    };
    assert_wire(msg, &[0x1a, 0x01, b'v']);
}

#[test]
fn min_size_keeps_presence_of_zero() {
    let msg = ReplenishmentStrategy {
        r#type: ReplenishmentStrategyType::MinSizeThreshold as i32,
        min_size: Some(0),
    };
    assert_wire(msg, &[0x08, 0x02, 0x10, 0x00]);
}

#[test]
fn heartbeat_expiry_threshold_is_field_11() {
    let msg = PoolSpec {
        heartbeat_expiry_threshold: Some(prost_types::Duration {
            seconds: 1,
            nanos: 0,
        }),
        ..Default::default()
    };
    assert_wire(msg, &[0x5a, 0x02, 0x08, 0x01]);
}

#[test]
fn flintlock_allow_guest_agent_is_field_17_and_guest_mac_field_4() {
    let spec = MicroVmSpec {
        allow_guest_agent: true,
        ..Default::default()
    };
    assert_wire(spec, &[0x88, 0x01, 0x01]);
    let iface = NetworkInterface {
        guest_mac: Some("m".into()),
        ..Default::default()
    };
    assert_wire(iface, &[0x22, 0x01, b'm']);
}

#[test]
fn exec_exit_code_is_field_3() {
    let msg = ExecCommandResponse {
        payload: Some(exec_command_response::Payload::ExitCode(7)),
    };
    assert_wire(msg, &[0x18, 0x07]);
}

#[test]
fn service_paths_match_poolmgrd() {
    // The descriptor set carries the package and service names clients dial.
    let fds = prost_types::FileDescriptorSet::decode(battery_proto::FILE_DESCRIPTOR_SET).unwrap();
    let services: Vec<String> = fds
        .file
        .iter()
        .flat_map(|f| {
            f.service
                .iter()
                .map(move |s| format!("{}.{}", f.package(), s.name()))
        })
        .collect();
    for want in [
        "poolmgr.v1alpha1.PoolAdmin",
        "poolmgr.v1alpha1.Lease",
        "poolmgr.v1alpha1.Events",
        "poolmgr.v1alpha1.HostAdmin",
        "microvm.services.api.v1alpha1.MicroVM",
        "microvmexec.services.api.v1alpha1.MicroVMExec",
    ] {
        assert!(services.iter().any(|s| s == want), "{want} in {services:?}");
    }
}
