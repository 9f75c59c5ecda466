use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;

fn spec(pool: &str, holder: &str) -> MicroVMClaimSpec {
    MicroVMClaimSpec {
        pool_ref: PoolRef {
            name: pool.to_owned(),
        },
        service_account_name: holder.to_owned(),
        ..MicroVMClaimSpec::default()
    }
}

#[test]
fn validation_rules() {
    let long = "a".repeat(254);
    let cases: &[(&str, MicroVMClaimSpec, &[&str])] = &[
        ("valid", spec("builders", "ci-runner"), &[]),
        (
            "both absent",
            MicroVMClaimSpec::default(),
            &[
                "spec.poolRef.name: Required value",
                "spec.serviceAccountName: Required value",
            ],
        ),
        (
            "pool name not a DNS subdomain",
            spec("Builders", "ci-runner"),
            &[
                r#"spec.poolRef.name: Invalid value: "Builders": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"#,
            ],
        ),
        (
            // A colon would make the Holder's username ambiguous.
            "holder with a colon",
            spec("builders", "ci:runner"),
            &[
                r#"spec.serviceAccountName: Invalid value: "ci:runner": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"#,
            ],
        ),
    ];
    for (name, spec, expected) in cases {
        let messages: Vec<String> = spec.validate().iter().map(ToString::to_string).collect();
        assert_eq!(messages, *expected, "{name}");
    }

    let too_long = spec(&long, "ci-runner").validate();
    assert_eq!(too_long.len(), 1);
    assert_eq!(too_long[0].detail, "must be no more than 253 characters");
}

#[test]
fn pool_and_holder_are_immutable() {
    let old = spec("builders", "ci-runner");
    assert_eq!(
        MicroVMClaimSpec::validate_update(&old, &old.clone()),
        vec![]
    );

    let messages: Vec<String> =
        MicroVMClaimSpec::validate_update(&old, &spec("testers", "intruder"))
            .iter()
            .map(ToString::to_string)
            .collect();
    assert_eq!(
        messages,
        [
            r#"spec.poolRef: Invalid value: {"name":"testers"}: field is immutable"#,
            r#"spec.serviceAccountName: Invalid value: "intruder": field is immutable"#,
        ]
    );

    // An update is also held to the create rules.
    let messages: Vec<String> = MicroVMClaimSpec::validate_update(&old, &spec("builders", ""))
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        messages,
        [
            "spec.serviceAccountName: Required value",
            r#"spec.serviceAccountName: Invalid value: "": field is immutable"#,
        ]
    );
}

#[test]
fn holder_username_is_the_service_accounts() {
    let mut claim = MicroVMClaim::new("build-1", spec("builders", "ci-runner"));
    assert_eq!(claim.holder_username(), None);
    claim.metadata = ObjectMeta {
        namespace: Some("ci".to_owned()),
        ..claim.metadata
    };
    assert_eq!(
        claim.holder_username().as_deref(),
        Some("system:serviceaccount:ci:ci-runner")
    );
    assert_eq!(
        service_account_username("default", "dev"),
        "system:serviceaccount:default:dev"
    );
}

#[test]
fn absent_spec_fields_decode_for_validation_to_report() {
    let spec: MicroVMClaimSpec = serde_json::from_str("{}").unwrap();
    assert_eq!(spec, MicroVMClaimSpec::default());
    assert_eq!(spec.validate().len(), 2);
}

#[test]
fn phases() {
    assert_eq!(ClaimPhase::VALUES, ["Bound", "Expired"]);
    assert_eq!(ClaimPhase::from("Expired"), ClaimPhase::Expired);
    // A phase a newer server adds still decodes.
    let phase: ClaimPhase = serde_json::from_str(r#""Releasing""#).unwrap();
    assert_eq!(phase, ClaimPhase::Unknown("Releasing".to_owned()));
    assert!(!phase.is_known());
    assert_eq!(phase.to_string(), "Releasing");
}

fn messages(errors: &[FieldError]) -> Vec<String> {
    errors.iter().map(ToString::to_string).collect()
}

fn with_config(env: serde_json::Value, files: serde_json::Value) -> MicroVMClaimSpec {
    serde_json::from_value(serde_json::json!({
        "poolRef": {"name": "builders"},
        "serviceAccountName": "ci-runner",
        "env": env,
        "files": files,
    }))
    .unwrap()
}

#[test]
fn env_and_files_decode_in_the_shapes_pods_use() {
    let config = with_config(
        serde_json::json!([
            {"name": "GREETING", "value": "hello"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "ci", "key": "token"}}},
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode", "optional": true}}},
        ]),
        serde_json::json!([
            {"path": "/etc/ci/token", "secretKeyRef": {"name": "ci", "key": "token"}},
            {"path": "/etc/ci/settings", "mode": 0o640, "configMapKeyRef": {"name": "settings", "key": "mode"}},
        ]),
    );
    assert_eq!(config.validate(), vec![]);
    assert!(config.has_references());
    let (kind, selector) = config.env[1]
        .value_from
        .as_ref()
        .unwrap()
        .reference()
        .unwrap();
    assert_eq!((kind, selector.key.as_str()), (SourceKind::Secret, "token"));
    assert!(
        config.env[2]
            .value_from
            .as_ref()
            .unwrap()
            .config_map_key_ref
            .as_ref()
            .unwrap()
            .is_optional()
    );
    // A Secret's file is its owner's unless asked otherwise; a ConfigMap's gets its mode.
    assert_eq!(config.files[0].mode_or_default(), 0o600);
    assert_eq!(config.files[1].mode_or_default(), 0o640);
    let config_map_file = ClaimFile {
        mode: None,
        ..config.files[1].clone()
    };
    assert_eq!(config_map_file.mode_or_default(), 0o644);
    // What is empty stays out of the JSON, so claims without config look as before.
    let plain = serde_json::to_value(spec("builders", "ci-runner")).unwrap();
    assert_eq!(
        plain,
        serde_json::json!({"poolRef": {"name": "builders"}, "serviceAccountName": "ci-runner"})
    );
    // Literal values alone need nothing read.
    let literal = with_config(
        serde_json::json!([{"name": "A", "value": "1"}]),
        serde_json::json!([]),
    );
    assert!(!literal.has_references());
}

#[test]
fn env_validation_rules() {
    let spec = with_config(
        serde_json::json!([
            {"value": "x"},
            {"name": "1ABC"},
            {"name": "A"},
            {"name": "A"},
            {"name": "B", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            {"name": "C", "valueFrom": {}},
            {"name": "D", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}, "configMapKeyRef": {"name": "c", "key": "k"}}},
            {"name": "E", "valueFrom": {"secretKeyRef": {"name": "S", "key": "a/b"}}},
            {"name": "F", "valueFrom": {"configMapKeyRef": {"name": "c"}}},
        ]),
        serde_json::json!([]),
    );
    assert_eq!(
        messages(&spec.validate()),
        [
            "spec.env[0].name: Required value",
            r#"spec.env[1].name: Invalid value: "1ABC": a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', and must not start with a digit (e.g. 'my.env-name',  or 'MY_ENV.NAME',  or 'MyEnvName1', regex used for validation is '[-._a-zA-Z][-._a-zA-Z0-9]*')"#,
            r#"spec.env[3].name: Duplicate value: "A""#,
            r#"spec.env[4].valueFrom: Invalid value: "": may not be specified when `value` is not empty"#,
            r#"spec.env[5].valueFrom: Invalid value: "": must specify one of: `configMapKeyRef` or `secretKeyRef`"#,
            r#"spec.env[6].valueFrom: Invalid value: "": may not have more than one field specified at a time"#,
            r#"spec.env[7].valueFrom.secretKeyRef.name: Invalid value: "S": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"#,
            r#"spec.env[7].valueFrom.secretKeyRef.key: Invalid value: "a/b": a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"#,
            "spec.env[8].valueFrom.configMapKeyRef.key: Required value",
        ]
    );
    let many: Vec<serde_json::Value> = (0..=MAX_ENV)
        .map(|i| serde_json::json!({"name": format!("V{i}"), "value": "x"}))
        .collect();
    let too_many = with_config(serde_json::json!(many), serde_json::json!([])).validate();
    assert_eq!(
        messages(&too_many),
        ["spec.env: Forbidden: must have at most 256 items"]
    );
}

#[test]
fn file_validation_rules() {
    let spec = with_config(
        serde_json::json!([]),
        serde_json::json!([
            {"secretKeyRef": {"name": "s", "key": "k"}},
            {"path": "etc/token", "secretKeyRef": {"name": "s", "key": "k"}},
            {"path": "/etc/../root/token", "secretKeyRef": {"name": "s", "key": "k"}},
            {"path": "/etc/dir/", "secretKeyRef": {"name": "s", "key": "k"}},
            {"path": "/etc/token", "mode": 512, "secretKeyRef": {"name": "s", "key": "k"}},
            {"path": "/etc/token", "mode": -1, "configMapKeyRef": {"name": "c", "key": "k"}},
            {"path": "/etc/other"},
            {"path": "/etc/both", "secretKeyRef": {"name": "s", "key": "k"}, "configMapKeyRef": {"name": "c", "key": "k"}},
        ]),
    );
    assert_eq!(
        messages(&spec.validate()),
        [
            "spec.files[0].path: Required value",
            r#"spec.files[1].path: Invalid value: "etc/token": must be an absolute path"#,
            r#"spec.files[2].path: Invalid value: "/etc/../root/token": must not contain '.' or '..'"#,
            r#"spec.files[3].path: Invalid value: "/etc/dir/": must name a file, not end in '/'"#,
            "spec.files[4].mode: Invalid value: 512: must be a number between 0 and 0777 (octal), both inclusive",
            r#"spec.files[5].path: Duplicate value: "/etc/token""#,
            "spec.files[5].mode: Invalid value: -1: must be a number between 0 and 0777 (octal), both inclusive",
            "spec.files[6]: Required value: must specify one of: `configMapKeyRef` or `secretKeyRef`",
            "spec.files[7]: Forbidden: may not have more than one of `configMapKeyRef` and `secretKeyRef`",
        ]
    );
}

#[test]
fn env_and_files_are_immutable() {
    let old = with_config(
        serde_json::json!([{"name": "A", "value": "1"}]),
        serde_json::json!([{"path": "/etc/a", "secretKeyRef": {"name": "s", "key": "k"}}]),
    );
    assert_eq!(
        MicroVMClaimSpec::validate_update(&old, &old.clone()),
        vec![]
    );
    let new = with_config(
        serde_json::json!([{"name": "A", "value": "2"}]),
        serde_json::json!([{"path": "/etc/b", "secretKeyRef": {"name": "s", "key": "k"}}]),
    );
    assert_eq!(
        messages(&MicroVMClaimSpec::validate_update(&old, &new)),
        [
            r#"spec.env: Invalid value: [{"name":"A","value":"2"}]: field is immutable"#,
            r#"spec.files: Invalid value: [{"path":"/etc/b","secretKeyRef":{"key":"k","name":"s"}}]: field is immutable"#,
        ]
    );
}

#[test]
fn the_schema_shows_env_and_files() {
    use kube::CustomResourceExt as _;
    let crd = serde_json::to_value(MicroVMClaim::crd()).unwrap();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    let env = &spec["env"];
    assert_eq!(
        env["x-kubernetes-list-map-keys"],
        serde_json::json!(["name"])
    );
    let source = &env["items"]["properties"]["valueFrom"]["properties"];
    assert_eq!(
        source["secretKeyRef"]["required"],
        serde_json::json!(["key", "name"])
    );
    assert!(source["configMapKeyRef"].is_object(), "{env}");
    let files = &spec["files"]["items"];
    assert_eq!(files["required"], serde_json::json!(["path"]));
    assert_eq!(files["properties"]["mode"]["type"], "integer");
}
