use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;

fn spec(pool: &str, holder: &str) -> MicroVMClaimSpec {
    MicroVMClaimSpec {
        pool_ref: PoolRef {
            name: pool.to_owned(),
        },
        service_account_name: holder.to_owned(),
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
