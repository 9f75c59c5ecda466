//! Every Pool, MicroVMClaim or Host a page shows as YAML is one the server accepts: each
//! is created with `dryRun` against a fresh `battery-apiserver dev`, so validation runs
//! and nothing is bound or stored.

use battery_e2e::apiserver::{ApiServer, Route};

/// The API group whose objects the pages' examples are checked for.
const GROUP_PREFIX: &str = "battery.liquidmetal-x.dev/";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_example_object_on_the_pages_is_accepted_by_the_server() {
    let examples = examples();
    assert!(
        examples.iter().any(|(_, yaml)| yaml.contains("kind: Pool")),
        "the pages show no Pool: {examples:?}"
    );
    let server = ApiServer::start(Route::Direct).await;
    let kubectl = server.kubectls().next().expect("a kubectl release");
    let mut refused = Vec::new();
    for (page, yaml) in &examples {
        let output = kubectl
            .cmd(&["create", "--dry-run=server", "-f", "-"])
            .stdin(yaml.clone())
            .output()
            .await;
        if !output.success {
            refused.push(format!("{page}:\n{yaml}\n{}", output.stderr));
        }
    }
    assert!(
        refused.is_empty(),
        "the server refuses examples on the pages:\n{}",
        refused.join("\n")
    );
}

/// Each document of a `yaml` block of a page under `docs/` (the built book and the ADRs
/// aside) whose `apiVersion` is ours, with the page's path.
fn examples() -> Vec<(String, String)> {
    let docs = crate::docs_dir();
    let mut pages: Vec<_> = std::fs::read_dir(&docs)
        .expect("read docs/")
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    pages.sort();
    let mut examples = Vec::new();
    for page in pages {
        let text = std::fs::read_to_string(&page).expect("read a page");
        let name = page
            .file_name()
            .expect("a file")
            .to_string_lossy()
            .into_owned();
        for block in yaml_blocks(&text) {
            for document in block.split("\n---\n") {
                let value: serde_norway::Value =
                    serde_norway::from_str(document).unwrap_or_else(|e| {
                        panic!("{name}: a yaml block does not parse: {e}\n{document}")
                    });
                let ours = value
                    .get("apiVersion")
                    .and_then(|v| v.as_str())
                    .is_some_and(|v| v.starts_with(GROUP_PREFIX));
                if ours {
                    examples.push((name.clone(), document.to_owned()));
                }
            }
        }
    }
    examples
}

/// The contents of the ```` ```yaml ```` blocks of `page`.
fn yaml_blocks(page: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in page.lines() {
        match &mut current {
            None if line.trim_start().starts_with("```yaml") => current = Some(String::new()),
            None => {}
            Some(_) if line.trim_start().starts_with("```") => {
                blocks.extend(current.take());
            }
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    blocks
}

#[test]
fn yaml_blocks_are_found_and_others_are_not() {
    let page =
        "```yaml\nkind: Pool\n```\n\n```sh\nkubectl get pools\n```\n   ```yaml\na: 1\n   ```\n";
    assert_eq!(yaml_blocks(page), vec!["kind: Pool\n", "a: 1\n"]);
}
