use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::json;

use super::*;

#[test]
fn errors_print_as_apimachinery_does() {
    let cases = [
        (
            FieldError::required("spec.size", ""),
            "spec.size: Required value",
        ),
        (
            FieldError::required("spec.tls.caFile", "required unless insecure is true"),
            "spec.tls.caFile: Required value: required unless insecure is true",
        ),
        (
            FieldError::invalid(
                "spec.template.vcpu",
                0,
                "must be between 1 and 64, inclusive",
            ),
            "spec.template.vcpu: Invalid value: 0: must be between 1 and 64, inclusive",
        ),
        (
            FieldError::invalid("spec.name", "a\"b\n", "bad"),
            r#"spec.name: Invalid value: "a\"b\n": bad"#,
        ),
        (
            FieldError::invalid("spec.poolRef", json!({"name": "b"}), "field is immutable"),
            r#"spec.poolRef: Invalid value: {"name":"b"}: field is immutable"#,
        ),
        (
            FieldError::invalid("spec.x", Value::Null, "bad"),
            r#"spec.x: Invalid value: "null": bad"#,
        ),
        (
            FieldError::not_supported("spec.type", "x", &["a", "b"]),
            r#"spec.type: Unsupported value: "x": supported values: "a", "b""#,
        ),
        (
            FieldError::not_supported("spec.type", "x", &[]),
            r#"spec.type: Unsupported value: "x""#,
        ),
        (
            FieldError::forbidden("spec.tls.caFile", "may not be set when insecure is true"),
            "spec.tls.caFile: Forbidden: may not be set when insecure is true",
        ),
        (
            FieldError::duplicate("spec.interfaces[1].deviceId", "eth1"),
            r#"spec.interfaces[1].deviceId: Duplicate value: "eth1""#,
        ),
        (
            FieldError::too_long("status.conditions[0].reason", 1024),
            "status.conditions[0].reason: Too long: may not be more than 1024 bytes",
        ),
        (
            FieldError::too_long("x", 1),
            "x: Too long: may not be more than 1 byte",
        ),
    ];
    for (error, message) in cases {
        assert_eq!(error.to_string(), message);
    }
}

#[test]
fn body_omits_the_path_and_cause_types_match_go() {
    let error = FieldError::invalid("spec.size", -1, messages::NON_NEGATIVE);
    assert_eq!(
        error.body(),
        "Invalid value: -1: must be greater than or equal to 0"
    );
    let kinds = [
        (FieldErrorKind::Required, "FieldValueRequired"),
        (FieldErrorKind::Invalid, "FieldValueInvalid"),
        (FieldErrorKind::NotSupported, "FieldValueNotSupported"),
        (FieldErrorKind::Forbidden, "FieldValueForbidden"),
        (FieldErrorKind::Duplicate, "FieldValueDuplicate"),
        (FieldErrorKind::TooLong, "FieldValueTooLong"),
    ];
    for (kind, cause) in kinds {
        assert_eq!(kind.cause_type(), cause);
    }
}

#[test]
fn paths_nest_like_field_path() {
    let path = FieldPath::new("spec")
        .child("template")
        .child("interfaces")
        .index(2)
        .child("deviceId");
    assert_eq!(path.as_str(), "spec.template.interfaces[2].deviceId");
    assert_eq!(
        FieldPath::new("spec")
            .child("labels")
            .key("a/b")
            .to_string(),
        "spec.labels[a/b]"
    );
}

const SUBDOMAIN_ERROR: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

#[test]
fn dns1123_subdomains() {
    for good in ["a", "ab", "a-b", "a.b", "0", "a.b.c-d", &"a".repeat(253)] {
        assert_eq!(is_dns1123_subdomain(good), Vec::<String>::new(), "{good}");
    }
    for bad in ["", "A", "-a", "a-", "a..b", ".a", "a.", "a_b", "a b", "ä"] {
        assert_eq!(
            is_dns1123_subdomain(bad),
            vec![SUBDOMAIN_ERROR.to_owned()],
            "{bad}"
        );
    }
    assert_eq!(
        is_dns1123_subdomain(&"a".repeat(254)),
        vec!["must be no more than 253 characters".to_owned()]
    );
}

#[test]
fn qualified_names() {
    for good in [
        "a",
        "A",
        "Ready",
        "my.name",
        "123-abc",
        "example.com/MyName",
        "a_b",
        &"a".repeat(63),
    ] {
        assert_eq!(is_qualified_name(good), Vec::<String>::new(), "{good}");
    }
    let name_error = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
    assert_eq!(is_qualified_name("-a"), vec![name_error.to_owned()]);
    assert_eq!(
        is_qualified_name(""),
        vec![
            "name part must be non-empty".to_owned(),
            name_error.to_owned()
        ]
    );
    assert_eq!(
        is_qualified_name(&"a".repeat(64)),
        vec!["name part must be no more than 63 characters".to_owned()]
    );
    assert_eq!(
        is_qualified_name("/a"),
        vec!["prefix part must be non-empty".to_owned()]
    );
    assert_eq!(
        is_qualified_name("Example.com/a"),
        vec![format!("prefix part {SUBDOMAIN_ERROR}")]
    );
    assert_eq!(
        is_qualified_name("a/b/c"),
        vec!["a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')".to_owned()]
    );
}

#[test]
fn label_values() {
    for good in ["", "a", "MyValue", "my_value", "12345", &"a".repeat(63)] {
        assert_eq!(is_valid_label_value(good), Vec::<String>::new(), "{good}");
    }
    assert_eq!(
        is_valid_label_value("-a"),
        vec!["a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')".to_owned()]
    );
    assert_eq!(
        is_valid_label_value(&"a".repeat(64)),
        vec!["must be no more than 63 characters".to_owned()]
    );
}

#[test]
fn labels_report_keys_and_values_at_the_map_path() {
    let labels = std::collections::BTreeMap::from([
        ("ok".to_owned(), "-bad".to_owned()),
        ("bad key".to_owned(), "ok".to_owned()),
    ]);
    let errors = validate_labels(&labels, &FieldPath::new("spec").child("nodeSelector"));
    let fields: Vec<(&str, Option<&Value>)> = errors
        .iter()
        .map(|e| (e.field.as_str(), e.value.as_ref()))
        .collect();
    assert_eq!(
        fields,
        vec![
            ("spec.nodeSelector", Some(&json!("bad key"))),
            ("spec.nodeSelector", Some(&json!("-bad")))
        ]
    );
}

fn condition(type_: &str, status: &str, reason: &str) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: String::new(),
        observed_generation: None,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    }
}

#[test]
fn conditions_follow_metav1_rules() {
    let path = FieldPath::new("status").child("conditions");
    assert_eq!(
        validate_conditions(&[condition("Ready", "True", "Ready")], &path),
        vec![]
    );

    let mut long_message = condition("Long", "False", "KVMUnavailable");
    long_message.message = "x".repeat(32 * 1024 + 1);
    let mut negative = condition("Negative", "True", "Ready");
    negative.observed_generation = Some(-1);
    let conditions = [
        condition("Ready", "True", "Ready"),
        condition("Ready", "Maybe", ""),
        condition("Bad Type", "False", "not valid!"),
        long_message,
        negative,
    ];
    let messages: Vec<String> = validate_conditions(&conditions, &path)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        messages,
        vec![
            r#"status.conditions[1].type: Duplicate value: "Ready""#.to_owned(),
            r#"status.conditions[1].status: Unsupported value: "Maybe": supported values: "False", "True", "Unknown""#.to_owned(),
            "status.conditions[1].reason: Required value: must be set".to_owned(),
            r#"status.conditions[2].type: Invalid value: "Bad Type": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"#.to_owned(),
            r#"status.conditions[2].reason: Invalid value: "not valid!": a condition reason must start with alphabetic character, optionally followed by a string of alphanumeric characters or '_,:', and must end with an alphanumeric character or '_' (regex used for validation is '[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?')"#.to_owned(),
            "status.conditions[3].message: Too long: may not be more than 32768 bytes".to_owned(),
            "status.conditions[4].observedGeneration: Invalid value: -1: must be greater than or equal to zero".to_owned(),
        ]
    );
}

#[test]
fn host_port_addresses() {
    let path = FieldPath::new("spec").child("address");
    for good in [
        "10.0.0.5:9090",
        "host.example.com:1",
        "[2001:db8::5]:65535",
        "localhost:9090",
    ] {
        assert_eq!(validate_host_port(good, &path), None, "{good}");
    }
    for bad in [
        "",
        "10.0.0.5",
        ":9090",
        "10.0.0.5:0",
        "10.0.0.5:65536",
        "10.0.0.5:+1",
        "2001:db8::5:9090",
        "[zz]:1",
        "a b:1",
    ] {
        assert!(validate_host_port(bad, &path).is_some(), "{bad}");
    }
}
