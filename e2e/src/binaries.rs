//! The workspace's binaries of this build, for the tests and the bench to start: found
//! beside the running binary, built with cargo when missing.

use std::path::{Path, PathBuf};

/// The binary `name` (of the cargo package `package`) of this build: it sits in
/// `target/<profile>/`, beside a test binary's `deps/` directory or beside a binary such
/// as `bench`, wherever the target directory is. Built with cargo when it is missing; one
/// build at a time, so that tests starting together do not all run cargo.
pub fn target_binary(package: &str, name: &str) -> PathBuf {
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let this_binary = std::env::current_exe().expect("this binary's path");
    let beside = this_binary.parent().expect("a binary lives in a directory");
    let profile_dir = if beside.file_name().is_some_and(|name| name == "deps") {
        beside.parent().expect("target/<profile>/deps has a parent")
    } else {
        beside
    };
    let path = profile_dir.join(name);
    if !path.is_file() {
        // A panic elsewhere while building poisons nothing worth keeping.
        let _building = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
        if !path.is_file() {
            build(profile_dir, package, name);
        }
    }
    assert!(
        path.is_file(),
        "cargo built {name} but {} is missing",
        path.display()
    );
    path
}

fn build(profile_dir: &Path, package: &str, name: &str) {
    // cargo's directory for the `dev` profile is `debug`; every other profile's is its name.
    let profile = match profile_dir.file_name().and_then(|name| name.to_str()) {
        Some("debug") | None => "dev",
        Some(other) => other,
    };
    eprintln!(
        "{name} is not built: running cargo build -p {package} --bin {name} --profile {profile}"
    );
    let status = std::process::Command::new(env!("CARGO"))
        .args(["build", "-p", package, "--bin", name, "--profile", profile])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("run cargo");
    assert!(
        status.success(),
        "cargo build -p {package} --bin {name} failed"
    );
}
