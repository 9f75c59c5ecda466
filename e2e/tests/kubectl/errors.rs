//! Malformed and refused requests: for each, the HTTP status kubectl got, the message
//! it printed, and that nothing changed (no claim appeared, the target claim kept its
//! resourceVersion, labels and spec).

use battery_e2e::apiserver::{ApiServer, Kubectl, Route};
use serde_json::{Value, json};

use crate::{
    CLAIMS_PATH, GROUP, assert_contains_all, claim_manifest, create_claim, get_claim, list_claims,
    names,
};

crate::on_both_routes!(malformed_requests_fail_clearly_and_change_nothing,);

/// One request that must fail.
struct Case<'a> {
    what: &'static str,
    args: Vec<&'a str>,
    stdin: Option<String>,
    /// The response status as kubectl's `-v=6` log shows it; `None` when kubectl refuses
    /// before sending anything.
    status: Option<&'static str>,
    /// What kubectl must print on stderr.
    messages: Vec<String>,
}

/// What a failed request must leave as it was.
#[derive(Debug, PartialEq)]
struct State {
    claims: Vec<String>,
    target: Value,
}

impl State {
    /// Reads the state with one list, to keep the many reads of the table fast.
    async fn read(kubectl: &Kubectl, target: &str) -> Self {
        let claims = list_claims(kubectl).await;
        let claim = claims
            .iter()
            .find(|claim| claim["metadata"]["name"] == target)
            .unwrap_or_else(|| panic!("the claim {target} is gone: {claims:#?}"));
        Self {
            claims: names(&claims),
            target: json!({
                "resourceVersion": claim["metadata"]["resourceVersion"],
                "labels": claim["metadata"]["labels"],
                "spec": claim["spec"],
            }),
        }
    }
}

async fn malformed_requests_fail_clearly_and_change_nothing(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let target = kubectl.unique("target");
        let rejected = kubectl.unique("rejected");
        create_claim(&kubectl, &target).await;
        // A copy of the claim that the label below makes out of date.
        let stale = get_claim(&kubectl, &target).await.to_string();
        kubectl.ok(&["label", "mvc", &target, "bump=1"]).await;

        let mut unknown_field = claim_manifest(&rejected);
        unknown_field["spec"]["bogus"] = json!(1);
        let mut wrong_kind = claim_manifest(&rejected);
        wrong_kind["kind"] = json!("Pool");
        let create_raw = vec!["create", "--raw", CLAIMS_PATH, "-f", "-"];
        let merge_patch =
            |patch: &'static str| vec!["patch", "mvc", &target, "--type=merge", "-p", patch];

        let cases = [
            Case {
                what: "a body that is not JSON",
                args: create_raw.clone(),
                stdin: Some(format!(r#"{{"apiVersion": "{GROUP}/v1alpha1", "kind": "#)),
                status: Some("400 Bad Request"),
                messages: vec!["Error from server (BadRequest)".into(), "JSON".into()],
            },
            Case {
                what: "an unknown field (kubectl asks for Strict validation)",
                args: vec!["create", "-f", "-"],
                stdin: Some(unknown_field.to_string()),
                status: Some("400 Bad Request"),
                messages: vec![
                    "Error from server (BadRequest)".into(),
                    r#"strict decoding error: unknown field "spec.bogus""#.into(),
                ],
            },
            Case {
                what: "a Pool sent to the claims collection",
                args: create_raw,
                stdin: Some(wrong_kind.to_string()),
                status: Some("400 Bad Request"),
                messages: vec![
                    "Error from server (BadRequest)".into(),
                    "Pool".into(),
                    "MicroVMClaim".into(),
                ],
            },
            Case {
                what: "a change of the immutable spec.serviceAccountName",
                args: merge_patch(r#"{"spec":{"serviceAccountName":"intruder"}}"#),
                stdin: None,
                status: Some("422 Unprocessable Entity"),
                messages: vec![format!(
                    r#"The MicroVMClaim "{target}" is invalid: spec.serviceAccountName: Invalid value: "intruder": field is immutable"#
                )],
            },
            Case {
                what: "a change of the immutable spec.poolRef",
                args: merge_patch(r#"{"spec":{"poolRef":{"name":"other"}}}"#),
                stdin: None,
                status: Some("422 Unprocessable Entity"),
                messages: vec![
                    format!(r#"The MicroVMClaim "{target}" is invalid"#),
                    "spec.poolRef".into(),
                    "field is immutable".into(),
                ],
            },
            Case {
                what: "a replace with a stale resourceVersion",
                args: vec!["replace", "-f", "-"],
                stdin: Some(stale),
                status: Some("409 Conflict"),
                messages: vec![format!(
                    "Error from server (Conflict): error when replacing \"STDIN\": Operation cannot be fulfilled on microvmclaims.{GROUP} \"{target}\": the object has been modified; please apply your changes to the latest version and try again"
                )],
            },
            Case {
                what: "a strategic merge patch (kubectl patch's default)",
                args: vec!["patch", "mvc", &target, "-p", r#"{"metadata":{"labels":{"bump":"2"}}}"#],
                stdin: None,
                status: Some("415 Unsupported Media Type"),
                messages: vec![
                    format!("application/strategic-merge-patch+json is not supported by {GROUP}/v1alpha1, Kind=MicroVMClaim"),
                    "the body of the request was in an unknown format - accepted media types include: ".into(),
                    "application/merge-patch+json".into(),
                ],
            },
            Case {
                what: "an unknown resource",
                args: vec!["get", "nosuchthing"],
                stdin: None,
                status: None,
                messages: vec![r#"the server doesn't have a resource type "nosuchthing""#.into()],
            },
        ];

        // No case may change anything, so each must leave what the first found.
        let before = State::read(&kubectl, &target).await;
        for case in cases {
            let what = format!("kubectl {}: {}", kubectl.version(), case.what);
            // -v=6 logs each response's status line, so the code is checked too.
            let mut command = kubectl.cmd(&[&case.args[..], &["-v=6"]].concat());
            if let Some(input) = case.stdin {
                command = command.stdin(input);
            }
            let stderr = command.fails().await;
            let messages: Vec<&str> = case.messages.iter().map(String::as_str).collect();
            assert_contains_all(&stderr, &messages, &what);
            if let Some(status) = case.status {
                assert_contains_all(&stderr, &[status], &what);
            }
            assert_eq!(
                State::read(&kubectl, &target).await,
                before,
                "{what}: changed something"
            );
        }
        kubectl.ok(&["delete", "mvc", &target]).await;
    }
}
