//! The documentation site (`docs/`, an mdBook) kept true by tests:
//!
//! - [`quick_start`]: the Quick start's commands, parsed out of the page, run as written
//!   against a fresh `battery-apiserver dev` with the real kubectl and plugin;
//! - [`api_reference`]: `docs/reference/api.md` is rendered from the server's own
//!   OpenAPI document, and must equal a fresh render;
//! - [`examples`]: every object of ours a page shows as YAML passes the server's
//!   validation;
//! - [`site`]: `mdbook build docs`, then headless Chromium ([`cdp`]) opens every built
//!   page, which must render with no console error, and every internal link and anchor
//!   must resolve.
//!
//! mdBook and Chromium come from `scripts/install-test-tools`. Without them a test says
//! it was skipped, except under `CI=true`, where it fails.

mod api_reference;
mod cdp;
mod examples;
mod quick_start;
mod site;

use std::path::{Path, PathBuf};

/// The repository's root.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ lives in the workspace")
        .to_owned()
}

/// `docs/` of the repository.
fn docs_dir() -> PathBuf {
    workspace_root().join("docs")
}

/// The program `name` on `PATH`, if any.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// A tool the test drives, or `None` when it is missing outside CI (after saying the
/// test is skipped). Under `CI=true` a missing tool fails the test: CI must run it.
fn tool(name: &str) -> Option<PathBuf> {
    if let Some(path) = on_path(name) {
        return Some(path);
    }
    let why = format!("{name} is not on PATH: run scripts/install-test-tools");
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
    eprintln!("SKIP: {why}");
    None
}
