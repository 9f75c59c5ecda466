//! Writing: every kubectl verb that changes a claim, each checked by reading the claim
//! back (and the dev Pool's lease count where battery is involved).

use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use battery_e2e::apiserver::{ApiServer, Invocation, Kubectl, Route, Stream};
use battery_e2e::eventually;
use serde_json::{Value, json};

use crate::{
    GROUP, assert_contains_all, claim_manifest, claim_names, create_claim, get_claim, leased, text,
};

crate::on_both_routes!(
    create_answers_with_a_bound_claim,
    apply_client_side_creates_then_updates_in_place,
    apply_server_side_reports_conflicts_until_forced,
    edit_saves_what_the_editor_changed,
    patch_merges_and_applies_json_patches,
    label_and_annotate_set_overwrite_and_remove,
    delete_one_then_all,
    wait_for_bound_and_for_delete,
    dry_run_server_changes_nothing,
);

/// How long a lease taken or released may take to show in the Pool's counts.
const LEASE_COUNT_TIMEOUT: Duration = Duration::from_secs(10);

async fn create_answers_with_a_bound_claim(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let name = kubectl.unique("created");
        let leased_before = leased(&kubectl).await;
        let created = create_claim(&kubectl, &name).await;
        let status = &created["status"];
        for field in ["boundTime", "leaseExpiresAt"] {
            assert!(status[field].is_string(), "no status.{field}: {created:#}");
        }
        assert!(!text(&status["microVM"]["uid"]).is_empty(), "{created:#}");
        assert!(!text(&status["host"]["nodeName"]).is_empty(), "{created:#}");
        // Binding leased one MicroVM of the dev Pool.
        await_leased(&kubectl, leased_before + 1).await;
        // What create answered is what the server keeps.
        let stored = get_claim(&kubectl, &name).await;
        for pointer in [
            "/metadata/uid",
            "/metadata/resourceVersion",
            "/status/microVM/uid",
        ] {
            assert_eq!(
                stored.pointer(pointer),
                created.pointer(pointer),
                "kubectl {}: {pointer} of {name}",
                kubectl.version()
            );
        }
        kubectl.ok(&["delete", "mvc", &name]).await;
        await_leased(&kubectl, leased_before).await;
    }
}

async fn apply_client_side_creates_then_updates_in_place(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let name = kubectl.unique("applied");
        let output = apply(&kubectl, &[], &labeled(&name, "one")).ok().await;
        assert_eq!(
            output.trim_end(),
            format!("microvmclaim.{GROUP}/{name} created")
        );
        let first = get_claim(&kubectl, &name).await;

        let output = apply(&kubectl, &[], &labeled(&name, "two")).ok().await;
        assert_eq!(
            output.trim_end(),
            format!("microvmclaim.{GROUP}/{name} configured")
        );
        let second = get_claim(&kubectl, &name).await;
        assert_eq!(
            second["metadata"]["labels"],
            json!({"tier": "two"}),
            "{second:#}"
        );
        assert_ne!(
            second["metadata"]["resourceVersion"], first["metadata"]["resourceVersion"],
            "the update did not change the resourceVersion"
        );
        // Updated in place: the same object, bound to the same MicroVM.
        for pointer in ["/metadata/uid", "/status/microVM/uid"] {
            assert_eq!(second.pointer(pointer), first.pointer(pointer), "{pointer}");
        }
        // kubectl keeps what it applied on the object, for the next three-way merge.
        let last_applied: Value = serde_json::from_str(text(
            &second["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"],
        ))
        .expect("the last-applied configuration is JSON");
        assert_eq!(last_applied["metadata"]["labels"], json!({"tier": "two"}));
        kubectl.ok(&["delete", "mvc", &name]).await;
    }
}

async fn apply_server_side_reports_conflicts_until_forced(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let name = kubectl.unique("ssa");
        let output = apply(&kubectl, &["--server-side"], &labeled(&name, "one"))
            .ok()
            .await;
        assert_eq!(
            output.trim_end(),
            format!("microvmclaim.{GROUP}/{name} serverside-applied")
        );
        let applied = claim_with_managed_fields(&kubectl, &name).await;

        // Another manager setting the label kubectl's apply owns is a conflict, and
        // changes nothing.
        let other = ["--server-side", "--field-manager=other"];
        let stderr = apply(&kubectl, &other, &labeled(&name, "two"))
            .fails()
            .await;
        assert_contains_all(
            &stderr,
            &[r#"Apply failed with 1 conflict: conflict with "kubectl": .metadata.labels.tier"#],
            &format!(
                "kubectl {}: a conflicting server-side apply",
                kubectl.version()
            ),
        );
        assert_eq!(
            claim_with_managed_fields(&kubectl, &name).await,
            applied,
            "the conflicting apply changed the claim"
        );

        let forced = [&other[..], &["--force-conflicts"]].concat();
        apply(&kubectl, &forced, &labeled(&name, "two")).ok().await;
        let claim = claim_with_managed_fields(&kubectl, &name).await;
        assert_eq!(
            claim["metadata"]["labels"],
            json!({"tier": "two"}),
            "{claim:#}"
        );
        // The label changed hands: `other` owns it now, and kubectl's apply no longer does.
        assert_eq!(owns_tier_label(&claim, "other"), Some(true), "{claim:#}");
        assert_eq!(owns_tier_label(&claim, "kubectl"), Some(false), "{claim:#}");
        kubectl.ok(&["delete", "mvc", &name]).await;
    }
}

async fn edit_saves_what_the_editor_changed(route: Route) {
    let server = ApiServer::start(route).await;
    // An "editor" that rewrites the label in the file kubectl hands it.
    let editor = server.scratch().join("edit-label.sh");
    std::fs::write(
        &editor,
        "#!/bin/sh\nsed -i 's/tier: before/tier: after/' \"$1\"\n",
    )
    .expect("write the editor script");
    std::fs::set_permissions(&editor, std::fs::Permissions::from_mode(0o755))
        .expect("make the editor script executable");
    for kubectl in server.kubectls() {
        let name = kubectl.unique("edited");
        kubectl
            .cmd(&["create", "-f", "-"])
            .stdin(labeled(&name, "before"))
            .ok()
            .await;
        // KUBE_EDITOR, not EDITOR: kubectl prefers it, so the environment cannot override.
        let output = kubectl
            .cmd(&["edit", "mvc", &name])
            .env("KUBE_EDITOR", &editor)
            .ok()
            .await;
        assert_eq!(
            output.trim_end(),
            format!("microvmclaim.{GROUP}/{name} edited")
        );
        let claim = get_claim(&kubectl, &name).await;
        assert_eq!(
            claim["metadata"]["labels"],
            json!({"tier": "after"}),
            "{claim:#}"
        );
        kubectl.ok(&["delete", "mvc", &name]).await;
    }
}

async fn patch_merges_and_applies_json_patches(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let name = kubectl.unique("patched");
        create_claim(&kubectl, &name).await;
        let steps: &[(&str, &str, Value)] = &[
            (
                "merge",
                r#"{"metadata":{"labels":{"tier":"merged","keep":"yes"}}}"#,
                json!({"tier": "merged", "keep": "yes"}),
            ),
            // A JSON patch runs its `test` first: it applies only to what it expects.
            (
                "json",
                r#"[{"op":"test","path":"/metadata/labels/tier","value":"merged"},
                    {"op":"replace","path":"/metadata/labels/tier","value":"json"}]"#,
                json!({"tier": "json", "keep": "yes"}),
            ),
            // In a merge patch, null removes.
            (
                "merge",
                r#"{"metadata":{"labels":{"tier":null}}}"#,
                json!({"keep": "yes"}),
            ),
        ];
        for (patch_type, patch, labels) in steps {
            let output = kubectl
                .ok(&["patch", "mvc", &name, "--type", patch_type, "-p", patch])
                .await;
            assert_eq!(
                output.trim_end(),
                format!("microvmclaim.{GROUP}/{name} patched")
            );
            let claim = get_claim(&kubectl, &name).await;
            assert_eq!(
                claim["metadata"]["labels"],
                *labels,
                "kubectl {}: after the {patch_type} patch {patch}",
                kubectl.version()
            );
        }
        kubectl.ok(&["delete", "mvc", &name]).await;
    }
}

async fn label_and_annotate_set_overwrite_and_remove(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let name = kubectl.unique("marked");
        create_claim(&kubectl, &name).await;
        // (command, change and flags, what kubectl prints, the map afterwards)
        let steps: &[(&str, &[&str], &str, Value)] = &[
            ("label", &["tier=one"], "labeled", json!({"tier": "one"})),
            (
                "label",
                &["tier=two", "--overwrite"],
                "labeled",
                json!({"tier": "two"}),
            ),
            ("label", &["tier-"], "unlabeled", Value::Null),
            (
                "annotate",
                &["note=one"],
                "annotated",
                json!({"note": "one"}),
            ),
            (
                "annotate",
                &["note=two", "--overwrite"],
                "annotated",
                json!({"note": "two"}),
            ),
            ("annotate", &["note-"], "annotated", Value::Null),
        ];
        for (command, change, verb, expected) in steps {
            let output = kubectl
                .ok(&[&[*command, "mvc", &name][..], change].concat())
                .await;
            assert_eq!(
                output.trim_end(),
                format!("microvmclaim.{GROUP}/{name} {verb}")
            );
            let claim = get_claim(&kubectl, &name).await;
            let field = if *command == "label" {
                "labels"
            } else {
                "annotations"
            };
            // A map emptied by the removal may be dropped or kept empty.
            let actual = match &claim["metadata"][field] {
                Value::Object(map) if map.is_empty() => &Value::Null,
                other => other,
            };
            assert_eq!(
                actual,
                expected,
                "kubectl {} {command} {change:?}: metadata.{field}",
                kubectl.version()
            );
        }
        kubectl.ok(&["delete", "mvc", &name]).await;
    }
}

async fn delete_one_then_all(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let leased_before = leased(&kubectl).await;
        let names: Vec<String> = ["doomed-a", "doomed-b", "doomed-c"]
            .iter()
            .map(|base| kubectl.unique(base))
            .collect();
        for name in &names {
            create_claim(&kubectl, name).await;
        }

        let output = kubectl.ok(&["delete", "mvc", &names[0]]).await;
        assert_deleted(&kubectl, output.trim_end(), &names[0], "");
        let stderr = kubectl.fails(&["get", "mvc", &names[0]]).await;
        assert_contains_all(
            &stderr,
            &[&format!(
                "Error from server (NotFound): microvmclaims.{GROUP} \"{}\" not found",
                names[0]
            )],
            &format!("kubectl {}: get a deleted claim", kubectl.version()),
        );

        let output = kubectl.ok(&["delete", "mvc", "--all"]).await;
        // In the order the server listed them, which need not be the order of creation.
        let mut lines: Vec<&str> = output.lines().collect();
        lines.sort_unstable();
        assert_eq!(lines.len(), names.len() - 1, "delete --all:\n{output}");
        for (line, name) in lines.iter().zip(&names[1..]) {
            assert_deleted(&kubectl, line, name, "");
        }
        assert_eq!(claim_names(&kubectl).await, Vec::<String>::new());
        await_leased(&kubectl, leased_before).await;
    }
}

async fn wait_for_bound_and_for_delete(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let name = kubectl.unique("awaited");
        create_claim(&kubectl, &name).await;
        let met = format!("microvmclaim.{GROUP}/{name} condition met");
        let output = kubectl
            .ok(&[
                "wait",
                "mvc",
                &name,
                "--for=jsonpath={.status.phase}=Bound",
                "--timeout=30s",
            ])
            .await;
        assert_eq!(output.trim_end(), met);

        // -v=6 makes kubectl log its informer's progress: once its cache is populated it
        // watches from a known resourceVersion, so the delete cannot slip past it.
        let mut wait = kubectl
            .cmd(&[
                "wait",
                "mvc",
                &name,
                "--for=delete",
                "--timeout=30s",
                "-v=6",
            ])
            .spawn();
        wait.line(Stream::Stderr, "the informer's first sync", |line| {
            line.contains("Caches populated")
        })
        .await;
        kubectl.ok(&["delete", "mvc", &name]).await;
        let output = wait.finish().await;
        assert!(output.success, "{output}");
        assert_eq!(output.stdout.trim_end(), met, "{output}");
    }
}

async fn dry_run_server_changes_nothing(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let kept = kubectl.unique("kept");
        let imagined = kubectl.unique("imagined");
        create_claim(&kubectl, &kept).await;
        let names_before = claim_names(&kubectl).await;
        let leased_before = leased(&kubectl).await;
        let kept_before = get_claim(&kubectl, &kept).await;
        let unchanged = async || {
            assert_eq!(claim_names(&kubectl).await, names_before, "the claims");
            assert_eq!(
                leased(&kubectl).await,
                leased_before,
                "the dev Pool's leases"
            );
            let kept_now = get_claim(&kubectl, &kept).await;
            for pointer in ["/metadata/uid", "/metadata/resourceVersion"] {
                assert_eq!(kept_now.pointer(pointer), kept_before.pointer(pointer));
            }
        };

        let output = kubectl
            .cmd(&["create", "--dry-run=server", "-f", "-"])
            .stdin(claim_manifest(&imagined).to_string())
            .ok()
            .await;
        assert_eq!(
            output.trim_end(),
            format!("microvmclaim.{GROUP}/{imagined} created (server dry run)")
        );
        unchanged().await;

        let output = kubectl
            .ok(&["delete", "mvc", &kept, "--dry-run=server"])
            .await;
        assert_deleted(&kubectl, output.trim_end(), &kept, " (server dry run)");
        unchanged().await;
        kubectl.ok(&["delete", "mvc", &kept]).await;
    }
}

/// A claim manifest with the label `tier`.
fn labeled(name: &str, tier: &str) -> String {
    let mut manifest = claim_manifest(name);
    manifest["metadata"]["labels"] = json!({"tier": tier});
    manifest.to_string()
}

/// Asserts that `line` is kubectl's report of deleting the claim `name`, then `suffix`.
#[track_caller]
fn assert_deleted(kubectl: &Kubectl, line: &str, name: &str, suffix: &str) {
    let deleted = format!("microvmclaim.{GROUP} \"{name}\" deleted");
    // Newer releases also say where from.
    let accepted = [
        format!("{deleted}{suffix}"),
        format!("{deleted} from default namespace{suffix}"),
    ];
    assert!(
        accepted.iter().any(|report| report == line),
        "kubectl {}: expected one of {accepted:?}, got {line:?}",
        kubectl.version()
    );
}

/// `kubectl apply -f - <flags>` of `manifest`.
fn apply<'k>(kubectl: &'k Kubectl, flags: &[&str], manifest: &str) -> Invocation<'k> {
    kubectl
        .cmd(&[&["apply", "-f", "-"][..], flags].concat())
        .stdin(manifest)
}

/// The claim with its managedFields, which kubectl hides by default.
async fn claim_with_managed_fields(kubectl: &Kubectl, name: &str) -> Value {
    kubectl
        .json(&["get", "mvc", name, "-o", "json", "--show-managed-fields"])
        .await
}

/// Whether `manager`'s Apply entry in the claim's managedFields owns the label `tier`;
/// `None` when the manager has no Apply entry.
fn owns_tier_label(claim: &Value, manager: &str) -> Option<bool> {
    let entries = claim["metadata"]["managedFields"].as_array()?;
    let entry = entries
        .iter()
        .find(|entry| entry["manager"] == manager && entry["operation"] == "Apply")?;
    Some(
        entry["fieldsV1"]
            .pointer("/f:metadata/f:labels/f:tier")
            .is_some(),
    )
}

/// Waits until the dev Pool counts `expected` leased MicroVMs (the Pool's status may
/// trail battery by a cache's lifetime).
async fn await_leased(kubectl: &Kubectl, expected: i64) {
    eventually(
        LEASE_COUNT_TIMEOUT,
        "the dev Pool's lease count",
        async || match leased(kubectl).await {
            now if now == expected => Ok(()),
            now => Err(format!("{now} leased, expecting {expected}")),
        },
    )
    .await;
}
