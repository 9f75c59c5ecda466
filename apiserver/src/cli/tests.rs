use super::*;

#[test]
fn flags_parse_durations_and_defaults() {
    let cli = Cli::try_parse_from([
        "battery-apiserver",
        "embedded-battery",
        "--insecure",
        "--listen",
        "127.0.0.1:0",
        "--sweep-interval",
        "250ms",
    ])
    .unwrap();
    let Command::EmbeddedBattery(args) = cli.command else {
        panic!("parsed another command");
    };
    assert_eq!(args.listen, SocketAddr::from(([127, 0, 0, 1], 0)));
    assert_eq!(args.sweep_interval, Duration::from_millis(250));
    assert_eq!(args.warning_window, Duration::from_secs(30));
    assert_eq!(args.hosts, 2);
    assert!(args.data_dir.is_none());
}

#[test]
fn the_agent_relay_files_come_together() {
    let serve = |extra: &[&str]| {
        let mut args = vec![
            "battery-apiserver",
            "serve",
            "--battery-address",
            "127.0.0.1:1",
            "--battery-insecure",
            "--tls-cert-file",
            "c",
            "--tls-private-key-file",
            "k",
        ];
        args.extend_from_slice(extra);
        Cli::try_parse_from(args)
    };
    let err = serve(&["--agent-ca-file", "ca"]).unwrap_err();
    assert!(
        err.to_string().contains("--agent-client-cert-file"),
        "{err}"
    );
    let cli = serve(&[
        "--agent-ca-file",
        "ca",
        "--agent-client-cert-file",
        "crt",
        "--agent-client-key-file",
        "key",
    ])
    .unwrap();
    let Command::Serve(args) = cli.command else {
        panic!("parsed another command");
    };
    assert_eq!(args.agent_ca_file, Some(PathBuf::from("ca")));
    assert_eq!(
        args.max_exec_sessions,
        crate::resources::microvmclaims::DEFAULT_MAX_SESSIONS
    );
}

#[test]
fn dev_refuses_a_non_loopback_address() {
    let err =
        Cli::try_parse_from(["battery-apiserver", "dev", "--listen", "0.0.0.0:8443"]).unwrap_err();
    assert!(err.to_string().contains("loopback only"), "{err}");
    assert!(Cli::try_parse_from(["battery-apiserver", "dev", "--listen", "127.0.0.1:0"]).is_ok());
}

#[test]
fn a_create_rate_must_be_positive() {
    let err = Cli::try_parse_from([
        "battery-apiserver",
        "serve",
        "--battery-address",
        "127.0.0.1:9090",
        "--battery-insecure",
        "--tls-cert-file",
        "c",
        "--tls-private-key-file",
        "k",
        "--creates-per-second",
        "0",
    ])
    .unwrap_err();
    assert!(err.to_string().contains("not a positive number"), "{err}");
}

fn serve_with(extra: &[&str]) -> Result<Box<ServeArgs>, clap::Error> {
    let mut argv = vec![
        "battery-apiserver",
        "serve",
        "--battery-address",
        "127.0.0.1:9090",
        "--battery-insecure",
        "--tls-cert-file",
        "c",
        "--tls-private-key-file",
        "k",
    ];
    argv.extend_from_slice(extra);
    match Cli::try_parse_from(argv)?.command {
        Command::Serve(args) => Ok(args),
        _ => panic!("parsed another command"),
    }
}

#[test]
fn slow_requests_are_logged_from_half_a_second_unless_told() {
    let args = serve_with(&[]).unwrap();
    assert_eq!(
        *args.requests.slow_request_threshold,
        Duration::from_millis(500)
    );
    let args = serve_with(&["--slow-request-threshold", "20ms"]).unwrap();
    assert_eq!(
        *args.requests.slow_request_threshold,
        Duration::from_millis(20)
    );
    let err = serve_with(&["--slow-request-threshold", "soon"]).unwrap_err();
    assert!(
        err.to_string().contains("--slow-request-threshold"),
        "{err}"
    );
}

#[test]
fn creates_are_limited_only_when_a_rate_is_given() {
    let args = serve_with(&[]).unwrap();
    assert_eq!(args.creates_per_second, None);
    let args = serve_with(&["--creates-per-second", "50", "--create-burst", "10"]).unwrap();
    assert_eq!(
        (args.creates_per_second, args.create_burst),
        (Some(50.0), 10)
    );
    let err = serve_with(&["--create-burst", "10"]).unwrap_err();
    assert!(err.to_string().contains("--creates-per-second"), "{err}");
}

#[test]
fn agent_signing_flags_come_together_and_bound_the_lifetime() {
    let args = serve_with(&[]).unwrap();
    assert_eq!(args.agent_certificate_lifetime, Duration::from_secs(86400));
    assert!(args.agent_signing_cert_file.is_none());
    let args = serve_with(&[
        "--agent-signing-cert-file",
        "ca.crt",
        "--agent-signing-key-file",
        "ca.key",
        "--agent-certificate-lifetime",
        "2h",
    ])
    .unwrap();
    assert_eq!(args.agent_certificate_lifetime, Duration::from_secs(7200));
    let err = serve_with(&["--agent-signing-cert-file", "ca.crt"]).unwrap_err();
    assert!(
        err.to_string().contains("--agent-signing-key-file"),
        "{err}"
    );
    for lifetime in ["30s", "31d", "soon"] {
        let err = serve_with(&["--agent-certificate-lifetime", lifetime]).unwrap_err();
        assert!(
            err.to_string().contains("--agent-certificate-lifetime"),
            "{lifetime}: {err}"
        );
    }
}

#[test]
fn the_log_format_is_a_global_flag_and_defaults_to_text() {
    let text = Cli::try_parse_from(["battery-apiserver", "dev"]).unwrap();
    assert_eq!(text.log_format, LogFormat::Text);
    for args in [
        &["battery-apiserver", "--log-format", "json", "dev"][..],
        &["battery-apiserver", "dev", "--log-format", "json"],
        &[
            "battery-apiserver",
            "embedded-battery",
            "--log-format",
            "json",
            "--insecure",
        ],
    ] {
        let cli = Cli::try_parse_from(args).unwrap();
        assert_eq!(cli.log_format, LogFormat::Json, "{args:?}");
    }
    let err = Cli::try_parse_from(["battery-apiserver", "dev", "--log-format", "xml"]).unwrap_err();
    assert!(
        err.to_string().contains("[possible values: text, json]"),
        "{err}"
    );
}

#[test]
fn a_bad_duration_is_refused() {
    let err = Cli::try_parse_from([
        "battery-apiserver",
        "embedded-battery",
        "--insecure",
        "--sweep-interval",
        "soon",
    ])
    .unwrap_err();
    assert!(err.to_string().contains("--sweep-interval"), "{err}");
}

#[test]
fn battery_is_reached_over_tls_unless_plaintext_is_asked_for() {
    let serve = |extra: &[&str]| {
        let mut argv = vec![
            "battery-apiserver",
            "serve",
            "--battery-address",
            "127.0.0.1:50051",
            "--tls-cert-file",
            "c",
            "--tls-private-key-file",
            "k",
        ];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv)
    };
    let err = serve(&[]).unwrap_err();
    assert!(err.to_string().contains("--battery-ca-file"), "{err}");
    assert!(serve(&["--battery-insecure"]).is_ok());
    assert!(serve(&["--battery-ca-file", "ca.crt"]).is_ok());
    let err = serve(&["--battery-insecure", "--battery-ca-file", "ca.crt"]).unwrap_err();
    assert!(err.to_string().contains("cannot be used with"), "{err}");
    let err = serve(&["--battery-ca-file", "ca", "--battery-client-cert-file", "c"]).unwrap_err();
    assert!(
        err.to_string().contains("--battery-client-key-file"),
        "{err}"
    );
    // A token may go either way: poolmgrd checks it whatever its TLS.
    assert!(serve(&["--battery-insecure", "--battery-token-file", "t"]).is_ok());
}

#[test]
fn the_embedded_battery_serves_tls_unless_plaintext_is_asked_for() {
    let battery = |extra: &[&str]| {
        let mut argv = vec!["battery-apiserver", "embedded-battery"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv)
    };
    let err = battery(&[]).unwrap_err();
    assert!(err.to_string().contains("--tls-cert-file"), "{err}");
    assert!(battery(&["--insecure"]).is_ok());
    assert!(battery(&["--tls-cert-file", "c", "--tls-private-key-file", "k"]).is_ok());
    let err = battery(&["--insecure", "--client-ca-file", "ca"]).unwrap_err();
    assert!(err.to_string().contains("cannot be used with"), "{err}");
}

#[test]
fn the_guests_api_server_is_host_and_port() {
    assert_eq!(serve_with(&[]).unwrap().guest_api_server, None);
    let args = serve_with(&["--guest-api-server", "[fd00::1]:6443"]).unwrap();
    let api = args.guest_api_server.unwrap();
    assert_eq!((api.host.as_str(), api.port), ("fd00::1", 6443));
    let err = serve_with(&["--guest-api-server", "https://api.example.com"]).unwrap_err();
    let err = err.to_string();
    assert!(
        err.contains("--guest-api-server") && err.contains("give HOST:PORT"),
        "{err}"
    );
}

#[test]
fn serve_and_dev_default_to_the_servers_own_waits() {
    let defaults = crate::server::Settings::default();
    let serve = serve_with(&[]).unwrap().requests;
    let Command::Dev(dev) = Cli::try_parse_from(["battery-apiserver", "dev"])
        .unwrap()
        .command
    else {
        panic!("parsed another command");
    };
    for requests in [serve, dev.requests] {
        assert_eq!(*requests.bind_wait, defaults.bind_wait);
        assert_eq!(
            *requests.slow_request_threshold,
            defaults.slow_request_threshold
        );
    }
    let dev = Cli::try_parse_from(["battery-apiserver", "dev", "--bind-wait", "7s"]).unwrap();
    let Command::Dev(dev) = dev.command else {
        panic!("parsed another command");
    };
    assert_eq!(*dev.requests.bind_wait, Duration::from_secs(7));
}
