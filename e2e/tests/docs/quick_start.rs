//! The Quick start (`docs/quick-start.md`) run as a reader runs it: every `$ ` command of
//! its `console` blocks, in order, in one fresh directory, with the real kubectl and
//! the real `kubectl-microvm`, each of which must succeed and print what the page shows
//! under it.
//!
//! - A command's state carries over as in one terminal: each runs in `bash` after the
//!   page's earlier `export`s. The directory has `target` pointing at this build's
//!   target directory, so `$PWD/target/debug` holds the binaries under test.
//! - A block after `<!-- docs-test: keeps running -->` is started in the background (a
//!   second terminal) and the test goes on once it has printed what the page shows. It
//!   serves on a free port, read as the page's `8443`, so tests never collide.
//! - `cargo` is not run: it would rebuild the workspace with another feature set. `cargo
//!   build -p P` is checked to name the binaries this build has, and `cargo run -p P
//!   --example E -- ARGS` runs this build's example `E` with `ARGS` as written.
//! - Shown output matches line by line, runs of spaces equal; `…` stands for any text in
//!   a line, and a line of its own `…` for any number of lines.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// The page, relative to `docs/`.
const PAGE: &str = "quick-start.md";
/// The comment that marks a block as running in the background.
const KEEPS_RUNNING: &str = "<!-- docs-test: keeps running -->";
/// The directory, in the one the Quick start is followed in, that its commands' `TMPDIR`
/// names.
const TMP: &str = "tmp";

/// The address the page shows `dev` serving on.
const PAGE_ADDRESS: &str = "127.0.0.1:8443";
/// The most one command may take, the background one to print its output included.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(90);

/// One command of the page, with the output the page shows under it.
#[derive(Debug, PartialEq)]
struct Step {
    command: String,
    shown: Vec<String>,
    background: bool,
    /// The page's line of the command, for messages.
    line: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_start_runs_as_written() {
    let page = std::fs::read_to_string(crate::docs_dir().join(PAGE)).expect("docs/quick-start.md");
    let steps = parse(&page);
    assert!(
        steps.iter().filter(|step| step.background).count() == 1,
        "the Quick start starts one server in the background: {steps:#?}"
    );
    let dir = tempfile::Builder::new()
        .prefix("docs-quick-start-")
        .tempdir()
        .expect("a directory to follow the Quick start in");
    std::fs::create_dir(dir.path().join(TMP)).expect("a TMPDIR for the Quick start's commands");
    let profile_dir =
        battery_e2e::apiserver::target_binary("battery-apiserver", "battery-apiserver")
            .parent()
            .expect("target/<profile>/")
            .to_owned();
    std::os::unix::fs::symlink(
        profile_dir.parent().expect("target/"),
        dir.path().join("target"),
    )
    .expect("link the target directory");
    let mut exports = String::new();
    let mut background: Option<Child> = None;
    for step in &steps {
        eprintln!("$ {}", step.command);
        let context = format!("{PAGE}:{} `{}`", step.line, step.command);
        if step.command.starts_with("export ") {
            exports.push_str(&step.command);
            exports.push('\n');
        }
        if step.background {
            background = Some(start_background(dir.path(), &exports, step, &context).await);
            continue;
        }
        let command = match step.command.strip_prefix("cargo ").map(cargo) {
            Some(Cargo::Build(packages)) => {
                for package in packages {
                    // Its binary, built now if this build lacks it.
                    battery_e2e::apiserver::target_binary(package, package);
                }
                continue;
            }
            Some(Cargo::RunExample {
                package,
                example,
                args,
            }) => {
                let binary = example_binary(&profile_dir, package, example);
                format!("'{}' {args}", binary.display())
            }
            None => step.command.clone(),
        };
        let output = tokio::time::timeout(
            COMMAND_TIMEOUT,
            shell(dir.path(), &exports, &command).output(),
        )
        .await
        .unwrap_or_else(|_| panic!("{context} took over {COMMAND_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("{context}: run bash: {e}"));
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "{context} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
            output.status
        );
        let lines: Vec<String> = stdout.lines().map(str::to_owned).collect();
        if let Err(why) = matches(&step.shown, &lines) {
            panic!(
                "{context} printed other than the page shows: {why}\nstdout:\n{stdout}\nstderr:\n{stderr}"
            );
        }
    }
    let mut server = background.expect("the server was started");
    assert!(
        server.try_wait().expect("poll the server").is_none(),
        "the server the Quick start started exited while it was followed"
    );
    // Gone before `dir` is removed, with the scratch directories it kept in its TMPDIR.
    server.kill().await.expect("stop the server");
}

/// `bash` running `command` in `dir` after `exports`, failing on the first error.
fn shell(dir: &Path, exports: &str, command: &str) -> Command {
    let mut shell = Command::new("bash");
    shell
        .args(["-euo", "pipefail", "-c"])
        .arg(format!("{exports}{command}"))
        .current_dir(dir)
        // kubectl's user preferences (kuberc) would change what it prints.
        .env("KUBERC", "off")
        .env("KUBECACHEDIR", dir.join(".kube-cache"))
        .env_remove("KUBECONFIG")
        // Inside `dir`, so that what a killed `dev` cleans up nothing of (its simulated
        // Hosts' scratch directories) goes with it.
        .env("TMPDIR", dir.join(TMP))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    shell
}

/// Starts the background step and waits until it has printed what the page shows.
async fn start_background(dir: &Path, exports: &str, step: &Step, context: &str) -> Child {
    let log = dir.join("background.log");
    let mut command = shell(dir, exports, &format!("exec {}", step.command));
    command
        .env("BATTERY_APISERVER_LISTEN", "127.0.0.1:0")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).expect("create the background log"));
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("{context}: start: {e}"));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout is piped")).lines();
    tokio::spawn(async move {
        // Keeps reading after the test stops listening, so the server never meets a
        // closed pipe.
        while let Ok(Some(line)) = stdout.next_line().await {
            let _ = tx.send(line);
        }
    });
    let mut printed = Vec::new();
    let waited = tokio::time::timeout(COMMAND_TIMEOUT, async {
        while let Some(line) = rx.recv().await {
            printed.push(as_on_the_page(&line));
            if matches(&step.shown, &printed).is_ok() {
                return true;
            }
        }
        false
    })
    .await;
    if waited != Ok(true) {
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        panic!(
            "{context} did not print what the page shows:\n{}\nit printed:\n{}\nits log:\n{log}",
            step.shown.join("\n"),
            printed.join("\n")
        );
    }
    child
}

/// A line of the background server's output with its free port written as the page's.
fn as_on_the_page(line: &str) -> String {
    let Some(at) = line.find("127.0.0.1:") else {
        return line.to_owned();
    };
    let after = &line[at + "127.0.0.1:".len()..];
    let digits = after.chars().take_while(char::is_ascii_digit).count();
    format!("{}{PAGE_ADDRESS}{}", &line[..at], &after[digits..])
}

/// A `cargo` command of the page, as this test follows it.
#[derive(Debug, PartialEq)]
enum Cargo<'a> {
    /// `cargo build -p P...`: the packages' binaries must be in this build.
    Build(Vec<&'a str>),
    /// `cargo run -p P --example E -- ARGS`: this build's example `E`, run with `ARGS`.
    RunExample {
        package: &'a str,
        example: &'a str,
        args: String,
    },
}

/// The page's `cargo ARGS`; panics on one this test does not know how to follow.
fn cargo(args: &str) -> Cargo<'_> {
    let words: Vec<&str> = args.split_whitespace().collect();
    match words.as_slice() {
        ["build", packages @ ..] => Cargo::Build(
            packages
                .chunks(2)
                .map(|pair| match pair {
                    ["-p", package] => *package,
                    _ => {
                        panic!("the Quick start's `cargo {args}`: only `-p PACKAGE` is known here")
                    }
                })
                .collect(),
        ),
        ["run", "-p", package, "--example", example, "--", rest @ ..] => Cargo::RunExample {
            package,
            example,
            args: rest.join(" "),
        },
        _ => panic!("the Quick start's `cargo {args}` is not one this test knows how to follow"),
    }
}

/// This build's example `example` of `package`, built when missing.
fn example_binary(profile_dir: &Path, package: &str, example: &str) -> PathBuf {
    let binary = profile_dir.join("examples").join(example);
    if !binary.is_file() {
        let status = std::process::Command::new(env!("CARGO"))
            .args(["build", "-p", package, "--example", example])
            .current_dir(crate::workspace_root())
            .status()
            .expect("run cargo");
        assert!(
            status.success(),
            "cargo build -p {package} --example {example} failed"
        );
    }
    binary
}

/// The page's steps: each `$ ` line of a `console` block (with the lines of a here
/// document it opens), and the output lines under it.
fn parse(page: &str) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut in_block = false;
    let mut background = false;
    let mut heredoc: Option<String> = None;
    for (index, line) in page.lines().enumerate() {
        if !in_block {
            if line.trim() == KEEPS_RUNNING {
                background = true;
            } else if line.starts_with("```") {
                let info = line.trim_start_matches('`').trim();
                assert!(
                    !matches!(info, "sh" | "bash" | "shell" | "zsh"),
                    "{PAGE}:{}: a `{info}` block: write commands as `console` blocks with `$ `, so the test runs them",
                    index + 1
                );
                in_block = info == "console";
                if !in_block {
                    background = false;
                }
            }
            continue;
        }
        if let Some(end) = &heredoc {
            let step = steps
                .last_mut()
                .expect("a here document follows its command");
            step.command.push('\n');
            step.command.push_str(line);
            if line == end {
                heredoc = None;
            }
        } else if line.starts_with("```") {
            in_block = false;
            background = false;
        } else if let Some(command) = line.strip_prefix("$ ") {
            heredoc = heredoc_end(command);
            steps.push(Step {
                command: command.to_owned(),
                shown: Vec::new(),
                background,
                line: index + 1,
            });
        } else if let Some(step) = steps.last_mut() {
            step.shown.push(line.to_owned());
        }
    }
    steps
}

/// The word that ends the here document `command` opens (`<<EOF`, `<<'EOF'`), if any.
fn heredoc_end(command: &str) -> Option<String> {
    let after = &command[command.find("<<")? + 2..];
    let word: String = after
        .trim_start_matches('-')
        .trim_matches(|c| c == '\'' || c == '"')
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!word.is_empty()).then_some(word)
}

/// Whether `printed` is what `shown` shows, or why not.
fn matches(shown: &[String], printed: &[String]) -> Result<(), String> {
    fn go(shown: &[String], printed: &[String]) -> bool {
        match shown.split_first() {
            None => printed.is_empty(),
            Some((first, rest)) if first.trim() == "…" => {
                (0..=printed.len()).any(|skip| go(rest, &printed[skip..]))
            }
            Some((first, rest)) => printed
                .split_first()
                .is_some_and(|(line, more)| line_matches(first, line) && go(rest, more)),
        }
    }
    if go(shown, printed) {
        Ok(())
    } else {
        Err(format!("the page shows\n{}", shown.join("\n")))
    }
}

/// Whether `line` is `pattern`, where `…` stands for any text and runs of spaces equal.
fn line_matches(pattern: &str, line: &str) -> bool {
    let squeeze = |text: &str| text.split_whitespace().collect::<Vec<_>>().join(" ");
    let (pattern, line) = (squeeze(pattern), squeeze(line));
    let parts: Vec<&str> = pattern.split('…').map(str::trim).collect();
    let [first, middle @ .., last] = parts.as_slice() else {
        return pattern == line;
    };
    let Some(mut rest) = line.strip_prefix(first) else {
        return false;
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.trim_end().ends_with(last)
}

#[test]
fn steps_are_the_commands_of_console_blocks_with_their_output() {
    let page = "text\n\n<!-- docs-test: keeps running -->\n```console\n$ server\nserving\n```\n\n\
                ```console\n$ export A=1\n$ cat <<EOF\nhi\nEOF\nhi\n```\n\n```yaml\nkind: X\n```\n";
    let steps = parse(page);
    let commands: Vec<(&str, bool, Vec<&str>)> = steps
        .iter()
        .map(|s| {
            (
                s.command.as_str(),
                s.background,
                s.shown.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    assert_eq!(
        commands,
        vec![
            ("server", true, vec!["serving"]),
            ("export A=1", false, vec![]),
            ("cat <<EOF\nhi\nEOF", false, vec!["hi"]),
        ]
    );
}

#[test]
fn shown_output_matches_with_ellipses_and_any_spacing() {
    let lines = |text: &str| text.lines().map(str::to_owned).collect::<Vec<_>>();
    let shown = lines("NAME   AGE\ndev    …\n…\nnext: kubectl --kubeconfig …/kubeconfig get pools");
    let printed = lines(
        "NAME AGE\ndev 7s\nexec agents: two\npolicy: you\nnext: kubectl --kubeconfig /tmp/x/kubeconfig get pools",
    );
    assert_eq!(matches(&shown, &printed), Ok(()));
    assert!(
        matches(&shown, &printed[..2]).is_err(),
        "a missing last line"
    );
    assert!(matches(&lines("dev 3"), &lines("dev 4")).is_err());
    assert!(
        matches(&lines("hello"), &lines("hello\nmore")).is_err(),
        "an extra line"
    );
    assert!(line_matches("host-… True", "host-0   True"));
    assert!(!line_matches("host-… True", "host-0 False"));
    assert_eq!(
        as_on_the_page("dev: serving https://127.0.0.1:40123"),
        "dev: serving https://127.0.0.1:8443"
    );
}

#[test]
fn cargo_builds_are_checked_and_example_runs_run_the_built_example() {
    assert_eq!(
        cargo("build -p battery-apiserver -p kubectl-microvm"),
        Cargo::Build(vec!["battery-apiserver", "kubectl-microvm"])
    );
    assert_eq!(
        cargo("run -p battery-sdk --example run -- dev echo hi"),
        Cargo::RunExample {
            package: "battery-sdk",
            example: "run",
            args: "dev echo hi".to_owned()
        }
    );
    assert_eq!(
        heredoc_end("kubectl create -f - <<'EOF'"),
        Some("EOF".to_owned())
    );
    assert_eq!(heredoc_end("echo hi"), None);
}
