use super::*;

const PEM: &[u8] = b"-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n";

struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        for name in [
            "tls.crt",
            "tls.key",
            "ca.crt",
            "fl-ca.crt",
            "fl.crt",
            "fl.key",
        ] {
            std::fs::write(dir.path().join(name), PEM).expect("write");
        }
        std::fs::write(dir.path().join("der.crt"), [0x30, 0x82]).expect("write");
        Self { dir }
    }

    /// The serving flags, each replaced by a flag of the same name in `args`;
    /// a value starting with `@` names a file in the temp dir.
    fn cli(&self, args: &[&str]) -> Result<Cli, clap::Error> {
        let path = |name: &str| self.dir.path().join(name).display().to_string();
        let mut argv = vec!["battery-agent".to_owned()];
        for (flag, file) in [
            ("--tls-cert-file", "tls.crt"),
            ("--tls-private-key-file", "tls.key"),
            ("--client-ca-file", "ca.crt"),
        ] {
            if !args.contains(&flag) {
                argv.extend([flag.to_owned(), path(file)]);
            }
        }
        argv.extend(args.iter().map(|arg| {
            arg.strip_prefix('@')
                .map_or_else(|| (*arg).to_owned(), path)
        }));
        Cli::try_parse_from(argv)
    }
}

#[test]
fn insecure_flintlock_needs_no_files() {
    let files = Files::new();
    let config = files
        .cli(&[
            "--flintlock-address",
            "127.0.0.1:9090",
            "--flintlock-insecure",
        ])
        .expect("parses")
        .into_config()
        .expect("valid");
    assert_eq!(config.flintlock.uri(), "http://127.0.0.1:9090/");
}

#[test]
fn mutual_tls_flintlock_dials_https() {
    let files = Files::new();
    let config = files
        .cli(&[
            "--flintlock-address",
            "10.0.0.5:9090",
            "--flintlock-ca-file",
            "@fl-ca.crt",
            "--flintlock-cert-file",
            "@fl.crt",
            "--flintlock-key-file",
            "@fl.key",
        ])
        .expect("parses")
        .into_config()
        .expect("valid");
    assert_eq!(config.flintlock.uri(), "https://10.0.0.5:9090/");
}

#[test]
fn flintlock_tls_names_what_is_missing() {
    let files = Files::new();
    let error = files
        .cli(&[
            "--flintlock-address",
            "10.0.0.5:9090",
            "--flintlock-cert-file",
            "@fl.crt",
        ])
        .expect("parses")
        .into_config()
        .expect_err("incomplete TLS");
    let message = error.to_string();
    assert!(
        message.contains("missing: --flintlock-ca-file, --flintlock-key-file"),
        "{message}"
    );
}

#[test]
fn the_serving_certificate_comes_from_files_or_the_api_server() {
    let files = Files::new();
    let base = ["--flintlock-address", "h:1", "--flintlock-insecure"];
    let config = files.cli(&base).unwrap().into_config().unwrap();
    assert!(matches!(config.serving, Serving::Files { .. }));

    let path = |name: &str| files.dir.path().join(name).display().to_string();
    let fetch = |extra: &[&str]| {
        let mut argv = vec!["battery-agent".to_owned()];
        argv.extend(["--client-ca-file".to_owned(), path("ca.crt")]);
        argv.extend(base.iter().chain(extra).map(|arg| (*arg).to_owned()));
        Cli::try_parse_from(argv)
    };
    let config = fetch(&[
        "--serving-certificate-from-api-server",
        "--host-name",
        "host-0",
        "--advertise-address",
        "127.0.0.1:10270",
        "--host-tls-insecure",
    ])
    .unwrap()
    .into_config()
    .unwrap();
    assert!(
        matches!(config.serving, Serving::FromApiServer),
        "{:?}",
        config.serving
    );
    assert_eq!(
        config.registration.map(|r| r.host).as_deref(),
        Some("host-0")
    );
    // Without a Host name there is nothing to ask a certificate for.
    let error = fetch(&["--serving-certificate-from-api-server"])
        .unwrap()
        .into_config()
        .unwrap_err();
    assert!(matches!(error, ConfigError::ServingMissing), "{error}");
    let error = fetch(&[]).unwrap().into_config().unwrap_err();
    assert!(
        error.to_string().contains("needs a serving certificate"),
        "{error}"
    );
    let error = files
        .cli(&[
            "--flintlock-address",
            "h:1",
            "--flintlock-insecure",
            "--serving-certificate-from-api-server",
            "--host-name",
            "host-0",
        ])
        .unwrap_err();
    assert_eq!(error.kind(), clap::error::ErrorKind::ArgumentConflict);
}

#[test]
fn insecure_conflicts_with_tls_files() {
    let files = Files::new();
    let error = files
        .cli(&[
            "--flintlock-address",
            "10.0.0.5:9090",
            "--flintlock-insecure",
            "--flintlock-ca-file",
            "@fl-ca.crt",
        ])
        .expect_err("conflict");
    assert_eq!(error.kind(), clap::error::ErrorKind::ArgumentConflict);
}

#[test]
fn bad_values_name_their_flag() {
    let files = Files::new();
    let cases: [(&[&str], &str); 4] = [
        (
            &["--flintlock-address", "https://h:1", "--flintlock-insecure"],
            "--flintlock-address \"https://h:1\"",
        ),
        (
            &["--flintlock-address", "h", "--flintlock-insecure"],
            "--flintlock-address \"h\"",
        ),
        (
            &[
                "--flintlock-address",
                "h:1",
                "--flintlock-insecure",
                "--client-ca-file",
                "@der.crt",
            ],
            "--client-ca-file",
        ),
        (
            &[
                "--flintlock-address",
                "h:1",
                "--flintlock-insecure",
                "--tls-cert-file",
                "@absent.crt",
            ],
            "reading --tls-cert-file",
        ),
    ];
    for (args, want) in cases {
        let error = files
            .cli(args)
            .expect("parses")
            .into_config()
            .expect_err("invalid");
        assert!(error.to_string().contains(want), "{args:?}: {error}");
    }
}

#[test]
fn a_host_name_registers_with_its_advertised_address_and_the_checks_asked_for() {
    let files = Files::new();
    let registration = files
        .cli(&[
            "--flintlock-address",
            "127.0.0.1:9090",
            "--flintlock-insecure",
            "--host-name",
            "host-0",
            "--advertise-address",
            "127.0.0.1:10270",
            "--host-tls-insecure",
            "--skip-check",
            "kvm,thin-pool",
            "--report-interval",
            "2s",
        ])
        .expect("parses")
        .into_config()
        .expect("valid")
        .registration
        .expect("registers");
    assert_eq!(registration.host, "host-0");
    assert_eq!(registration.spec.address, "127.0.0.1:9090");
    assert_eq!(
        registration.spec.agent_address.as_deref(),
        Some("127.0.0.1:10270")
    );
    assert_eq!(
        registration.report_interval,
        std::time::Duration::from_secs(2)
    );
    assert!(registration.checks.kvm_device.is_none());
    assert!(registration.checks.thin_pool_device.is_none());
    assert!(registration.checks.flintlockd && registration.checks.exec_api);
}

#[test]
fn registering_needs_an_advertised_address_and_a_valid_host() {
    let files = Files::new();
    let base = [
        "--flintlock-address",
        "127.0.0.1:9090",
        "--flintlock-insecure",
        "--host-name",
        "host-0",
    ];
    let error = files
        .cli(&base)
        .expect("parses")
        .into_config()
        .expect_err("no address");
    assert!(error.to_string().contains("--advertise-address"), "{error}");
    // Neither insecure nor a CA: battery could not reach flintlockd.
    let mut args = base.to_vec();
    args.extend(["--advertise-address", "127.0.0.1:10270"]);
    let error = files
        .cli(&args)
        .expect("parses")
        .into_config()
        .expect_err("no TLS for battery");
    assert!(error.to_string().contains("spec.tls.caFile"), "{error}");
}
