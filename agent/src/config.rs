//! The command line, and its validation into a [`Config`] before any port is bound:
//! every file is read and every address parsed here, so a mistake exits at once with
//! the flag to fix instead of on the first exec. Every flag can also come from the
//! environment variable named after it (`--listen` is `BATTERY_AGENT_LISTEN`).

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::{Parser, ValueEnum};
use thiserror::Error;
use tonic::transport::{Certificate, Identity};

use crate::flintlock::{FlintlockConfig, FlintlockTls};

/// The Exec Agent on each Host: relays the API server's exec sessions to flintlockd's
/// exec API over mTLS.
#[derive(Debug, Parser)]
#[command(name = "battery-agent", version, about)]
pub struct Cli {
    /// Address to serve the relay on: the Host's internal address.
    #[arg(long, env = "BATTERY_AGENT_LISTEN", default_value = "0.0.0.0:10270")]
    pub listen: SocketAddr,

    /// The relay's serving certificate (PEM), naming the Host; served as it is, never
    /// renewed. The alternative to --serving-certificate-from-api-server.
    #[arg(
        long,
        env = "BATTERY_AGENT_TLS_CERT_FILE",
        requires = "tls_private_key_file"
    )]
    pub tls_cert_file: Option<PathBuf>,

    /// The serving certificate's key (PEM).
    #[arg(
        long,
        env = "BATTERY_AGENT_TLS_PRIVATE_KEY_FILE",
        requires = "tls_cert_file"
    )]
    pub tls_private_key_file: Option<PathBuf>,

    /// Get the relay's serving certificate from the API server
    /// (`hosts/<--host-name>/certificate`) with a key made at start, and renew it at 2/3
    /// of its lifetime. The API server is reached as kubeconfig or the pod's service
    /// account says.
    #[arg(
        long,
        env = "BATTERY_AGENT_SERVING_CERTIFICATE_FROM_API_SERVER",
        conflicts_with_all = ["tls_cert_file", "tls_private_key_file"],
        requires = "host_name"
    )]
    pub serving_certificate_from_api_server: bool,

    /// The name of this agent's Host, which its serving certificate names.
    #[arg(long, env = "BATTERY_AGENT_HOST_NAME")]
    pub host_name: Option<String>,

    /// CA bundle (PEM) of the API server's client certificate: a client whose
    /// certificate does not chain to it is refused during the TLS handshake.
    #[arg(long, env = "BATTERY_AGENT_CLIENT_CA_FILE")]
    pub client_ca_file: PathBuf,

    /// flintlockd's gRPC address on this Host, as host:port (e.g. 10.0.0.5:9090).
    #[arg(long, env = "BATTERY_AGENT_FLINTLOCK_ADDRESS")]
    pub flintlock_address: String,

    /// CA bundle (PEM) that signs flintlockd's serving certificate.
    #[arg(long, env = "BATTERY_AGENT_FLINTLOCK_CA_FILE")]
    pub flintlock_ca_file: Option<PathBuf>,

    /// The agent's client certificate (PEM) towards flintlockd.
    #[arg(long, env = "BATTERY_AGENT_FLINTLOCK_CERT_FILE")]
    pub flintlock_cert_file: Option<PathBuf>,

    /// The client certificate's key (PEM).
    #[arg(long, env = "BATTERY_AGENT_FLINTLOCK_KEY_FILE")]
    pub flintlock_key_file: Option<PathBuf>,

    /// Talk to flintlockd in plain gRPC, without TLS: only for the simulated Hosts of
    /// `battery-apiserver dev`, which serve no TLS.
    #[arg(
        long,
        env = "BATTERY_AGENT_FLINTLOCK_INSECURE",
        conflicts_with_all = ["flintlock_ca_file", "flintlock_cert_file", "flintlock_key_file"]
    )]
    pub flintlock_insecure: bool,

    /// How log lines on stderr are written: `text` for people, `json` (one object a
    /// line) for log collectors.
    #[arg(
        long,
        env = "BATTERY_AGENT_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text
    )]
    pub log_format: LogFormat,
}

/// The shape of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One readable line per event, coloured only when stderr is a terminal.
    Text,
    /// One JSON object per line.
    Json,
}

/// A configuration whose files have been read and whose addresses parse.
#[derive(Debug)]
pub struct Config {
    pub listen: SocketAddr,
    /// Where the relay's serving certificate comes from.
    pub serving: Serving,
    /// The CA bundle (PEM) that client certificates must chain to.
    pub client_ca: Vec<u8>,
    pub flintlock: FlintlockConfig,
}

/// Where the relay's serving certificate comes from.
pub enum Serving {
    /// PEM files, served as they are.
    Files { cert: Vec<u8>, key: Vec<u8> },
    /// The API server signs it for the Host `host` (ADR 0011), and renews it.
    FromApiServer { host: String },
}

impl std::fmt::Debug for Serving {
    // The key is a secret: never print it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Files { .. } => f.write_str("Files"),
            Self::FromApiServer { host } => {
                f.debug_struct("FromApiServer").field("host", host).finish()
            }
        }
    }
}

/// A flag whose value cannot be used, named so the message says which to fix.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("reading --{flag} {}", path.display())]
    ReadFile {
        flag: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("--{flag} {}: no PEM block in it; give a PEM file", path.display())]
    NotPem { flag: &'static str, path: PathBuf },
    #[error(
        "--flintlock-address {0:?}: give host:port (e.g. 10.0.0.5:9090), without a scheme or path"
    )]
    FlintlockAddress(String),
    #[error(
        "flintlockd needs TLS: give --flintlock-ca-file, --flintlock-cert-file and \
         --flintlock-key-file (missing: {missing}), or --flintlock-insecure for a simulated Host"
    )]
    FlintlockTlsMissing { missing: String },
    #[error(
        "the relay needs a serving certificate: give --tls-cert-file and \
         --tls-private-key-file, or --serving-certificate-from-api-server with --host-name"
    )]
    ServingMissing,
}

impl Cli {
    /// Reads every file and checks every value, before anything is bound or dialled.
    pub fn into_config(self) -> Result<Config, ConfigError> {
        let serving = match (
            &self.tls_cert_file,
            &self.tls_private_key_file,
            &self.host_name,
        ) {
            (Some(cert), Some(key), _) => Serving::Files {
                cert: read_pem("tls-cert-file", cert)?,
                key: read_pem("tls-private-key-file", key)?,
            },
            (None, None, Some(host)) if self.serving_certificate_from_api_server => {
                Serving::FromApiServer { host: host.clone() }
            }
            _ => return Err(ConfigError::ServingMissing),
        };
        let client_ca = read_pem("client-ca-file", &self.client_ca_file)?;
        let tls = if self.flintlock_insecure {
            FlintlockTls::Insecure
        } else {
            match (
                &self.flintlock_ca_file,
                &self.flintlock_cert_file,
                &self.flintlock_key_file,
            ) {
                (Some(ca), Some(cert), Some(key)) => FlintlockTls::Mutual {
                    ca: Certificate::from_pem(read_pem("flintlock-ca-file", ca)?),
                    identity: Identity::from_pem(
                        read_pem("flintlock-cert-file", cert)?,
                        read_pem("flintlock-key-file", key)?,
                    ),
                },
                (ca, cert, key) => {
                    let missing: Vec<&str> = [
                        (ca.is_none(), "--flintlock-ca-file"),
                        (cert.is_none(), "--flintlock-cert-file"),
                        (key.is_none(), "--flintlock-key-file"),
                    ]
                    .into_iter()
                    .filter_map(|(absent, flag)| absent.then_some(flag))
                    .collect();
                    return Err(ConfigError::FlintlockTlsMissing {
                        missing: missing.join(", "),
                    });
                }
            }
        };
        let flintlock = FlintlockConfig::new(&self.flintlock_address, tls)
            .ok_or_else(|| ConfigError::FlintlockAddress(self.flintlock_address.clone()))?;
        Ok(Config {
            listen: self.listen,
            serving,
            client_ca,
            flintlock,
        })
    }
}

/// The file's bytes, if it holds at least one PEM block. rustls parses them only when
/// the server or channel is built; this catches a wrong file (a DER, a path mix-up)
/// with the flag's name.
fn read_pem(flag: &'static str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    let bytes = std::fs::read(path).map_err(|source| ConfigError::ReadFile {
        flag,
        path: path.to_owned(),
        source,
    })?;
    if !bytes.windows(11).any(|window| window == b"-----BEGIN ") {
        return Err(ConfigError::NotPem {
            flag,
            path: path.to_owned(),
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
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
        ])
        .unwrap()
        .into_config()
        .unwrap();
        assert!(
            matches!(&config.serving, Serving::FromApiServer { host } if host == "host-0"),
            "{:?}",
            config.serving
        );
        let error = fetch(&["--serving-certificate-from-api-server"]).unwrap_err();
        assert_eq!(
            error.kind(),
            clap::error::ErrorKind::MissingRequiredArgument
        );
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
}
