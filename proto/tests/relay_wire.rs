//! Pins the relay API (`agent/v1alpha1/relay.proto`) to hand-computed bytes. The API
//! server and the agent on a Host may run different versions, so a renumbered field
//! must fail here rather than between them.

use battery_proto::agent::v1alpha1::{
    ClaimRef, ExecOpen, ExecRequest, ExecResponse, ExitStatus, StdinEof, exec_request,
    exec_response, exit_status,
};
use prost::Message;

fn assert_wire<M: Message + Default + PartialEq + std::fmt::Debug>(msg: M, bytes: &[u8]) {
    assert_eq!(msg.encode_to_vec(), bytes, "encoding of {msg:?}");
    assert_eq!(M::decode(bytes).unwrap(), msg, "decoding of {bytes:02x?}");
}

#[test]
fn open_is_field_1_with_claim_1_command_3_and_stdout_7() {
    let msg = ExecRequest {
        payload: Some(exec_request::Payload::Open(ExecOpen {
            claim: Some(ClaimRef {
                namespace: "n".into(),
                ..Default::default()
            }),
            command: vec!["a".into()],
            stdout: true,
            ..Default::default()
        })),
    };
    assert_wire(
        msg,
        &[
            0x0a, 0x0a, 0x0a, 0x03, 0x0a, 0x01, b'n', 0x1a, 0x01, b'a', 0x38, 0x01,
        ],
    );
}

#[test]
fn stdin_eof_is_an_empty_field_3() {
    let msg = ExecRequest {
        payload: Some(exec_request::Payload::StdinEof(StdinEof {})),
    };
    assert_wire(msg, &[0x1a, 0x00]);
}

#[test]
fn exit_is_field_3_with_code_1_or_error_2() {
    let code = ExecResponse {
        payload: Some(exec_response::Payload::Exit(ExitStatus {
            outcome: Some(exit_status::Outcome::Code(3)),
        })),
    };
    assert_wire(code, &[0x1a, 0x02, 0x08, 0x03]);
    let error = ExecResponse {
        payload: Some(exec_response::Payload::Exit(ExitStatus {
            outcome: Some(exit_status::Outcome::Error("e".into())),
        })),
    };
    assert_wire(error, &[0x1a, 0x03, 0x12, 0x01, b'e']);
}

#[test]
fn relay_service_path() {
    let fds = prost_types::FileDescriptorSet::decode(battery_proto::FILE_DESCRIPTOR_SET).unwrap();
    let relay = fds
        .file
        .iter()
        .find(|f| f.package() == "battery.agent.v1alpha1")
        .expect("relay.proto in the descriptor set");
    let services: Vec<&str> = relay.service.iter().map(|s| s.name()).collect();
    assert_eq!(services, ["Relay"]);
    assert_eq!(relay.service[0].method[0].name(), "Exec");
}
