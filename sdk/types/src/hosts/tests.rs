use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

use super::*;
use crate::conditions::{ConditionStatus, HostReadyReason, READY};

fn valid_spec() -> HostSpec {
    HostSpec {
        address: "10.0.0.5:9090".to_owned(),
        unschedulable: false,
        tls: HostTls {
            ca_file: Some("/etc/battery/hosts/ca.crt".to_owned()),
            ..HostTls::default()
        },
        agent_address: Some("10.0.0.5:10270".to_owned()),
    }
}

fn file(path: &str) -> Option<String> {
    Some(path.to_owned())
}

#[test]
fn validation_rules() {
    type Mutation = fn(&mut HostSpec);
    let cases: &[(&str, Mutation, &[&str])] = &[
        ("valid", |_| {}, &[]),
        ("cordoned", |s| s.unschedulable = true, &[]),
        ("without an agent", |s| s.agent_address = None, &[]),
        (
            "IPv6 address",
            |s| s.address = "[2001:db8::5]:9090".to_owned(),
            &[],
        ),
        (
            "address absent",
            |s| s.address.clear(),
            &["spec.address: Required value"],
        ),
        (
            "address without a port",
            |s| s.address = "10.0.0.5".to_owned(),
            &[
                r#"spec.address: Invalid value: "10.0.0.5": must be a host:port address with a port between 1 and 65535 (e.g. 10.0.0.5:9090 or [2001:db8::5]:9090)"#,
            ],
        ),
        (
            "agent address out of range",
            |s| s.agent_address = Some("10.0.0.5:70000".to_owned()),
            &[
                r#"spec.agentAddress: Invalid value: "10.0.0.5:70000": must be a host:port address with a port between 1 and 65535 (e.g. 10.0.0.5:9090 or [2001:db8::5]:9090)"#,
            ],
        ),
        (
            "insecure",
            |s| {
                s.tls = HostTls {
                    insecure: true,
                    ..HostTls::default()
                }
            },
            &[],
        ),
        (
            "mutual TLS",
            |s| {
                s.tls.cert_file = file("/etc/battery/tls.crt");
                s.tls.key_file = file("/etc/battery/tls.key");
            },
            &[],
        ),
        (
            "no TLS settings",
            |s| s.tls = HostTls::default(),
            &["spec.tls.caFile: Required value: required unless insecure is true"],
        ),
        (
            "empty CA path",
            |s| s.tls.ca_file = file(""),
            &["spec.tls.caFile: Required value: required unless insecure is true"],
        ),
        (
            "insecure with files",
            |s| {
                s.tls.insecure = true;
                s.tls.cert_file = file("/etc/battery/tls.crt");
            },
            &[
                "spec.tls.caFile: Forbidden: may not be set when insecure is true",
                "spec.tls.certFile: Forbidden: may not be set when insecure is true",
            ],
        ),
        (
            "certificate without key",
            |s| s.tls.cert_file = file("/etc/battery/tls.crt"),
            &["spec.tls.keyFile: Required value: required when certFile is set"],
        ),
        (
            "key without certificate",
            |s| s.tls.key_file = file("/etc/battery/tls.key"),
            &["spec.tls.certFile: Required value: required when keyFile is set"],
        ),
    ];
    for (name, mutate, expected) in cases {
        let mut spec = valid_spec();
        mutate(&mut spec);
        let messages: Vec<String> = spec.validate().iter().map(ToString::to_string).collect();
        assert_eq!(messages, *expected, "{name}");
    }
}

#[test]
fn absent_spec_fields_decode_for_validation_to_report() {
    let spec: HostSpec = serde_json::from_value(json!({})).unwrap();
    let messages: Vec<String> = spec.validate().iter().map(ToString::to_string).collect();
    assert_eq!(
        messages,
        [
            "spec.address: Required value",
            "spec.tls.caFile: Required value: required unless insecure is true",
        ]
    );
}

#[test]
fn agent_reports_are_checked() {
    let ready = Condition {
        type_: READY.to_owned(),
        status: ConditionStatus::False.to_string(),
        reason: HostReadyReason::KvmUnavailable.to_string(),
        message: "/dev/kvm: no such file or directory".to_owned(),
        observed_generation: None,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    };
    let status = HostStatus {
        conditions: vec![ready.clone()],
        ..HostStatus::default()
    };
    assert_eq!(status.validate(), vec![]);

    let status = HostStatus {
        vm_count: -1,
        conditions: vec![ready.clone(), ready],
        ..HostStatus::default()
    };
    let messages: Vec<String> = status.validate().iter().map(ToString::to_string).collect();
    assert_eq!(
        messages,
        [
            r#"status.conditions[1].type: Duplicate value: "Ready""#,
            "status.vmCount: Invalid value: -1: must be greater than or equal to 0",
        ]
    );
}
