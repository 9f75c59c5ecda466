//! Reading: every `kubectl get` output format and `kubectl describe`, checked against
//! the object the server holds.

use battery_e2e::apiserver::{ApiServer, Route};

use crate::{
    DEV_ACCOUNT, DEV_POOL, GROUP, assert_contains_all, create_claim, get_claim, table, text,
};

crate::on_both_routes!(
    get_prints_every_output_format,
    describe_shows_claim_and_pool,
);

async fn get_prints_every_output_format(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let name = kubectl.unique("formats");
        create_claim(&kubectl, &name).await;
        let what = |format: &str| format!("kubectl {} get mvc {name} {format}", kubectl.version());

        let claim = get_claim(&kubectl, &name).await;
        assert_eq!(claim["kind"], "MicroVMClaim", "{}", what("-o json"));
        assert_eq!(
            claim["metadata"]["name"],
            name.as_str(),
            "{}",
            what("-o json")
        );
        assert_eq!(
            claim["metadata"]["namespace"],
            "default",
            "{}",
            what("-o json")
        );
        assert_eq!(
            claim["spec"]["poolRef"]["name"],
            DEV_POOL,
            "{}",
            what("-o json")
        );
        assert_eq!(claim["status"]["phase"], "Bound", "{}", what("-o json"));
        let node = text(&claim["status"]["host"]["nodeName"]);
        let vm = text(&claim["status"]["microVM"]["uid"]);
        let expires = text(&claim["status"]["leaseExpiresAt"]);

        let yaml = kubectl.ok(&["get", "mvc", &name, "-o", "yaml"]).await;
        let from_yaml: serde_json::Value = serde_norway::from_str(&yaml)
            .unwrap_or_else(|e| panic!("{}: not YAML ({e}):\n{yaml}", what("-o yaml")));
        assert_eq!(from_yaml, claim, "{} differs from -o json", what("-o yaml"));

        // The server's Table: its columns, then the wide ones (priority 1) before AGE.
        let printed = kubectl.ok(&["get", "mvc", &name]).await;
        let row = single_row(&printed);
        let expires_second = format!("{}Z", &expires[..19]);
        let columns = [
            ("NAME", name.as_str()),
            ("POOL", DEV_POOL),
            ("PHASE", "Bound"),
            ("NODE", node),
            ("EXPIRES", expires_second.as_str()),
        ];
        assert_eq!(row[..5], columns, "{}", what(""));
        // The dev Pool limits no claim's life: no time left to show.
        assert_eq!(row[5], ("TTL", "<none>"), "{}", what(""));
        assert_eq!(row[6].0, "AGE", "{}", what(""));
        let printed = kubectl.ok(&["get", "mvc", &name, "-o", "wide"]).await;
        let wide = single_row(&printed);
        let wide_columns = [("MICROVM", vm), ("HOLDER", DEV_ACCOUNT)];
        assert_eq!(wide[..5], columns, "{}", what("-o wide"));
        assert_eq!(wide[6..8], wide_columns, "{}", what("-o wide"));
        assert_eq!(wide[8].0, "AGE", "{}", what("-o wide"));

        let phase = kubectl
            .ok(&["get", "mvc", &name, "-o", "jsonpath={.status.phase}"])
            .await;
        assert_eq!(phase, "Bound", "{}", what("-o jsonpath"));
        let names = kubectl
            .ok(&["get", "mvc", "-o", "jsonpath={.items[*].metadata.name}"])
            .await;
        assert_eq!(names, name, "kubectl {} list jsonpath", kubectl.version());

        let columns = kubectl
            .ok(&[
                "get",
                "mvc",
                &name,
                "-o",
                "custom-columns=CLAIM:.metadata.name,VM:.status.microVM.uid,HOLDER:.spec.serviceAccountName",
            ])
            .await;
        assert_eq!(
            table(&columns),
            [
                vec!["CLAIM", "VM", "HOLDER"],
                vec![name.as_str(), vm, DEV_ACCOUNT]
            ],
            "{}",
            what("-o custom-columns")
        );

        let qualified = kubectl.ok(&["get", "mvc", &name, "-o", "name"]).await;
        assert_eq!(
            qualified.trim_end(),
            format!("microvmclaim.{GROUP}/{name}"),
            "{}",
            what("-o name")
        );

        let printed = kubectl.ok(&["get", "bpool", DEV_POOL]).await;
        let pool = single_row(&printed);
        assert_eq!(
            pool[..2],
            [("NAME", DEV_POOL), ("SIZE", "3")],
            "kubectl {} get bpool dev",
            kubectl.version()
        );
        kubectl.ok(&["delete", "mvc", &name]).await;
    }
}

async fn describe_shows_claim_and_pool(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let name = kubectl.unique("described");
        let claim = create_claim(&kubectl, &name).await;
        let output = kubectl.ok(&["describe", "mvc", &name]).await;
        assert_contains_all(
            &squeeze(&output),
            &[
                &format!("Name: {name}"),
                "Namespace: default",
                &format!("API Version: {GROUP}/v1alpha1"),
                "Kind: MicroVMClaim",
                &format!("Service Account Name: {DEV_ACCOUNT}"),
                "Phase: Bound",
                &format!("Node Name: {}", text(&claim["status"]["host"]["nodeName"])),
                &format!("UID: {}", text(&claim["status"]["microVM"]["uid"])),
            ],
            &format!("kubectl {} describe mvc {name}", kubectl.version()),
        );

        let output = kubectl.ok(&["describe", "bpool", DEV_POOL]).await;
        assert_contains_all(
            &squeeze(&output),
            &["Name: dev", "Kind: Pool", "Size: 3", "Type: Ready"],
            &format!("kubectl {} describe bpool dev", kubectl.version()),
        );
        kubectl.ok(&["delete", "mvc", &name]).await;
    }
}

/// The only row of a table, each cell paired with its column's header.
fn single_row(output: &str) -> Vec<(&str, &str)> {
    let rows = table(output);
    assert_eq!(rows.len(), 2, "expected a header and one row:\n{output}");
    assert_eq!(rows[0].len(), rows[1].len(), "a ragged table:\n{output}");
    rows[0]
        .iter()
        .copied()
        .zip(rows[1].iter().copied())
        .collect()
}

/// `describe` output with each line's runs of whitespace made one space, so that
/// checks do not depend on how kubectl aligned the values.
fn squeeze(output: &str) -> String {
    let lines: Vec<String> = output
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    lines.join("\n")
}
