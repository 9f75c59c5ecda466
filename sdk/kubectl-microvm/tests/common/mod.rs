//! What the plugin's tests share: the real kubectl with the plugin on PATH.

use std::ffi::OsString;
use std::path::Path;

use battery_e2e::apiserver::{ApiServer, Background, Kubectl, Output, Stream};

/// PATH with the plugin's directory first, as an installed plugin is found.
pub fn path_with_plugin() -> OsString {
    let plugin = Path::new(env!("CARGO_BIN_EXE_kubectl-microvm"));
    let mut dirs = vec![plugin.parent().unwrap().to_owned()];
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(dirs).unwrap()
}

pub fn kubectl(server: &ApiServer) -> Kubectl {
    server.kubectls().next().expect("a kubectl release")
}

/// `kubectl microvm <args>` with the plugin on PATH.
pub async fn microvm(kubectl: &Kubectl, args: &[&str]) -> Output {
    let mut all = vec!["microvm"];
    all.extend_from_slice(args);
    kubectl
        .cmd(&all)
        .env("PATH", path_with_plugin())
        .output()
        .await
}

/// The one line a failure prints.
pub fn one_line(output: &Output) -> &str {
    assert!(!output.success, "expected a failure: {output}");
    assert_eq!(output.code, Some(1), "{output}");
    let stderr = output.stderr.trim_end();
    assert!(!stderr.contains('\n'), "more than one line: {output}");
    assert!(stderr.starts_with("error: "), "{output}");
    stderr
}

/// Claims `name` of Pool `dev`, renewed by the plugin until the returned process is
/// interrupted or dropped: what a test does with it may outlast a lease.
pub async fn hold(kubectl: &Kubectl, name: &str) -> Background {
    let mut hold = kubectl
        .cmd(&["microvm", "claim", "dev", "--name", name, "--hold"])
        .env("PATH", path_with_plugin())
        .spawn();
    hold.line(Stream::Stderr, "the holding line", |l| {
        l.contains("Ctrl-C releases it")
    })
    .await;
    hold
}
