use super::*;

#[test]
fn options_are_read_as_kube_rs_sends_them() {
    let options =
        ExecOptions::parse("&stdout=true&stderr=true&command=sh&command=-c&command=exit%203")
            .unwrap();
    assert_eq!(options.command, ["sh", "-c", "exit 3"]);
    assert!(options.stdout && options.stderr && !options.stdin);
}

#[test]
fn a_terminal_carries_stderr_with_stdout() {
    let options =
        ExecOptions::parse("command=sh&stdin=true&stdout=true&stderr=true&tty=true").unwrap();
    assert!(options.tty && options.stdin && options.stdout && !options.stderr);
}

#[test]
fn refused_options_say_why() {
    let refused = |query: &str| ExecOptions::parse(query).unwrap_err();
    assert!(refused("stdout=true").message().contains("command"));
    assert!(
        refused("command=ls")
            .message()
            .contains("stdin, stdout, stderr")
    );
    assert!(
        refused("command=ls&stdout=1&container=c")
            .message()
            .contains("no containers")
    );
}
