//! How a test reaches a battery, secured as poolmgrd secures its port: TLS verified
//! against a CA, optionally a client certificate, and a basic-auth token on every call.
//! [`BatteryPki`] makes the files for an embedded battery that requires all three, and
//! the flags that give them to `battery-apiserver embedded-battery` and `serve`.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use battery_proto::poolmgr::basic_auth;
use tonic::metadata::AsciiMetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::pki::{Ca, KeyedCert};

/// A channel to battery whose calls carry the token, if any.
pub type BatteryChannel = InterceptedService<Channel, BasicAuth>;

/// Adds poolmgrd's `authorization: Basic ...` to every call.
#[derive(Clone, Default)]
pub struct BasicAuth(Option<AsciiMetadataValue>);

impl BasicAuth {
    pub fn new(token: Option<&str>) -> Self {
        Self(token.map(|token| {
            basic_auth::header_value(token)
                .parse()
                .expect("a token of printable ASCII")
        }))
    }
}

impl Interceptor for BasicAuth {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert(basic_auth::METADATA_KEY, value.clone());
        }
        Ok(request)
    }
}

/// What a client needs to reach a battery: its address and the credentials it asks for.
#[derive(Debug, Clone, Default)]
pub struct BatteryAccess {
    /// `host:port`.
    pub address: String,
    /// PEM CA of battery's serving certificate; `None` reaches it in plaintext.
    pub ca_pem: Option<String>,
    /// PEM client certificate and key.
    pub identity: Option<(String, String)>,
    /// The name battery's certificate carries, when not the address's host.
    pub server_name: Option<String>,
    pub token: Option<String>,
}

impl BatteryAccess {
    /// A lazy channel (nothing dialled yet) with these credentials.
    pub fn channel(&self) -> BatteryChannel {
        let endpoint = match &self.ca_pem {
            None => Endpoint::from_shared(format!("http://{}", self.address))
                .unwrap_or_else(|e| panic!("battery address {:?}: {e}", self.address)),
            Some(ca) => {
                let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
                if let Some((cert, key)) = &self.identity {
                    tls = tls.identity(Identity::from_pem(cert, key));
                }
                if let Some(name) = &self.server_name {
                    tls = tls.domain_name(name);
                }
                Endpoint::from_shared(format!("https://{}", self.address))
                    .and_then(|e| e.tls_config(tls))
                    .unwrap_or_else(|e| panic!("battery address {:?}: {e}", self.address))
            }
        };
        InterceptedService::new(
            endpoint.tcp_nodelay(true).connect_lazy(),
            BasicAuth::new(self.token.as_deref()),
        )
    }

    /// The same battery reached without `what` of the credentials, for tests that it
    /// is refused.
    pub fn without(&self, what: Credential) -> Self {
        let mut access = self.clone();
        match what {
            Credential::Token => access.token = None,
            Credential::ClientCertificate => access.identity = None,
        }
        access
    }
}

/// One of the credentials a secured battery asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential {
    Token,
    ClientCertificate,
}

/// The files of a battery that requires TLS, a client certificate and a token, written
/// into a directory: a CA, battery's serving certificate for 127.0.0.1 and localhost, a
/// client certificate, and the token.
pub struct BatteryPki {
    dir: PathBuf,
    ca: String,
    client: KeyedCert,
    token: String,
}

impl BatteryPki {
    pub fn write(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let ca = Ca::new("battery gRPC CA (tests)")?;
        let serving_params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
                .context("battery's serving certificate names")?;
        let serving = ca.sign(serving_params, "battery")?;
        let client = ca.sign(
            rcgen::CertificateParams::new(Vec::<String>::new()).context("a client certificate")?,
            "battery-apiserver",
        )?;
        let token = format!("token-{}", uuid::Uuid::new_v4().simple());
        ca.write(&dir.join("ca.crt"), &dir.join("ca.key"))?;
        serving.write(&dir.join("battery.crt"), &dir.join("battery.key"))?;
        client.write(&dir.join("client.crt"), &dir.join("client.key"))?;
        crate::pki::write_file(&dir.join("token"), format!("{token}\n").as_bytes(), true)?;
        Ok(Self {
            dir: dir.to_owned(),
            ca: ca.pem().to_owned(),
            client,
            token,
        })
    }

    /// `embedded-battery`'s flags: serve TLS, require a client certificate and the token.
    pub fn battery_args(&self) -> Vec<std::ffi::OsString> {
        self.flags(&[
            ("--tls-cert-file", "battery.crt"),
            ("--tls-private-key-file", "battery.key"),
            ("--client-ca-file", "ca.crt"),
            ("--basic-auth-token-file", "token"),
        ])
    }

    /// `serve`'s flags to reach that battery with every credential.
    pub fn serve_args(&self) -> Vec<std::ffi::OsString> {
        self.flags(&[
            ("--battery-ca-file", "ca.crt"),
            ("--battery-client-cert-file", "client.crt"),
            ("--battery-client-key-file", "client.key"),
            ("--battery-token-file", "token"),
        ])
    }

    /// The same security for an embedded battery started in this process.
    pub fn api_security(&self) -> Result<battery_embedded::ApiSecurity> {
        let read = |name: &str| {
            let path = self.dir.join(name);
            std::fs::read(&path).with_context(|| format!("reading {}", path.display()))
        };
        Ok(battery_embedded::ApiSecurity {
            tls: Some(battery_embedded::ServerTls {
                cert_pem: read("battery.crt")?,
                key_pem: read("battery.key")?,
                client_ca_pem: Some(self.ca.clone().into_bytes()),
            }),
            basic_auth_token: Some(self.token.clone()),
        })
    }

    /// The token file `serve` reads: a test rewrites it to rotate or break the token.
    pub fn token_file(&self) -> PathBuf {
        self.dir.join("token")
    }

    /// A client's access to the battery at `address` with every credential.
    pub fn access(&self, address: &str) -> BatteryAccess {
        BatteryAccess {
            address: address.to_owned(),
            ca_pem: Some(self.ca.clone()),
            identity: Some((self.client.cert.clone(), self.client.key.clone())),
            server_name: None,
            token: Some(self.token.clone()),
        }
    }

    fn flags(&self, flags: &[(&str, &str)]) -> Vec<std::ffi::OsString> {
        flags
            .iter()
            .flat_map(|(flag, file)| [flag.into(), self.dir.join(file).into_os_string()])
            .collect()
    }
}
