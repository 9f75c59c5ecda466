//! How `serve` reaches battery: poolmgrd serves TLS unless configured insecure, may
//! require a client certificate, and, given a basic-auth token, refuses every call
//! without it (`docs/reference/battery-behaviour.md`, "Transport and auth"). The CA, the
//! client certificate and the token come from files, read whole before anything is
//! dialled and read again when they change, so a rotation needs no restart: each new
//! connection shakes hands with the files of that moment, and every call carries the
//! token of that moment.

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::rt::TokioIo;
use rustls::SignatureScheme;
use rustls::client::ResolvesClientCert;
use rustls::pki_types::ServerName;
use rustls::sign::CertifiedKey;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::Interceptor;
use tonic::transport::{Channel, Endpoint};

use crate::tls_files::{self, RELOAD_INTERVAL, Reloading, TlsError, TlsFiles};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How the API server reaches battery.
#[derive(Debug, Clone)]
pub struct BatteryEndpoint {
    /// `host:port`, or a URL whose scheme agrees with `security`.
    pub address: String,
    pub security: Security,
    /// poolmgrd's basic-auth token (`api_server.basic_auth_token`), one line in a file.
    pub token_file: Option<PathBuf>,
}

/// The transport's security.
#[derive(Debug, Clone)]
pub enum Security {
    /// Plain gRPC: only when asked for (`--battery-insecure`).
    Plaintext,
    Tls(TlsSettings),
}

#[derive(Debug, Clone)]
pub struct TlsSettings {
    /// The CA bundle battery's serving certificate must chain to.
    pub ca_file: PathBuf,
    /// A client certificate and its key, for a poolmgrd with `validate_client`.
    pub client: Option<TlsFiles>,
    /// The name battery's certificate must carry; by default the address's host.
    pub server_name: Option<String>,
}

/// Why battery's channel could not be set up, naming the setting at fault.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error("not a battery address: {0}")]
    Address(String),
    #[error(
        "an http:// address is plaintext: ask for it with --battery-insecure, or give an \
         https:// one with --battery-ca-file"
    )]
    PlaintextNotAsked,
    #[error("an https:// address needs TLS: drop --battery-insecure and give --battery-ca-file")]
    TlsNotConfigured,
    #[error("{0:?} is not a DNS name or IP address")]
    ServerName(String),
    #[error(transparent)]
    CaFile(TlsError),
    #[error(transparent)]
    ClientCertificate(TlsError),
    #[error("setting up TLS")]
    Tls(#[source] rustls::Error),
    #[error("reading {path}")]
    TokenRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} holds no token (an empty file, or only whitespace)")]
    TokenEmpty { path: PathBuf },
    #[error("the token in {path} is not one line of printable ASCII")]
    TokenInvalid { path: PathBuf },
}

impl BatteryEndpoint {
    /// Reads every file and builds the channel; dials nothing. The returned task
    /// follows the files until it is aborted or the runtime ends.
    pub(super) fn connect_lazy(
        &self,
    ) -> Result<(Channel, Credentials, Option<tokio::task::JoinHandle<()>>), ChannelError> {
        let (uri, tls) = self.uri()?;
        let credentials = Credentials::load(self.token_file.as_deref())?;
        let endpoint = Endpoint::from(uri.clone())
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true);
        let Some(settings) = tls else {
            let follow = credentials.follow_files(None);
            return Ok((endpoint.connect_lazy(), credentials, follow));
        };
        let host = uri.host().unwrap_or_default().trim_matches(['[', ']']);
        let name = settings.server_name.as_deref().unwrap_or(host);
        let server_name = ServerName::try_from(name.to_owned())
            .map_err(|_| ChannelError::ServerName(name.to_owned()))?;
        let mut files = vec![settings.ca_file.clone()];
        if let Some(client) = &settings.client {
            files.extend([client.cert.clone(), client.key.clone()]);
        }
        let owned = settings.clone();
        let client_tls = Arc::new(Reloading::new("battery's TLS files", files, move || {
            client_config(&owned)
        })?);
        let connector = Connector {
            tls: client_tls.clone(),
            server_name,
        };
        // tonic does TLS itself only for an `https` endpoint it is given TLS for; ours
        // is done by the connector, so the endpoint is dialled as `http` while requests
        // say `https`, as they travel over TLS.
        let dialled = Uri::builder()
            .scheme("http")
            .authority(
                uri.authority()
                    .cloned()
                    .ok_or_else(|| ChannelError::Address(self.address.clone()))?,
            )
            .path_and_query("/")
            .build()
            .map_err(|e| ChannelError::Address(e.to_string()))?;
        let channel = Endpoint::from(dialled)
            .origin(uri)
            .connect_timeout(CONNECT_TIMEOUT)
            .connect_with_connector_lazy(connector);
        let follow = credentials.follow_files(Some(client_tls));
        Ok((channel, credentials, follow))
    }

    /// The address as a URL, and the TLS settings when it is to be reached over TLS.
    fn uri(&self) -> Result<(Uri, Option<&TlsSettings>), ChannelError> {
        let address = self.address.trim();
        let (scheme, rest) = match address.split_once("://") {
            Some((scheme, rest)) => (Some(scheme), rest),
            None => (None, address),
        };
        let tls = match (&self.security, scheme) {
            (Security::Plaintext, None | Some("http")) => None,
            (Security::Plaintext, Some("https")) => return Err(ChannelError::TlsNotConfigured),
            (Security::Tls(_), Some("http")) => return Err(ChannelError::PlaintextNotAsked),
            (Security::Tls(settings), None | Some("https")) => Some(settings),
            (_, Some(_)) => return Err(ChannelError::Address(self.address.clone())),
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        let uri: Uri = format!("{scheme}://{rest}")
            .parse()
            .map_err(|_| ChannelError::Address(self.address.clone()))?;
        if uri.host().is_none_or(str::is_empty) || uri.port_u16().is_none() {
            return Err(ChannelError::Address(format!(
                "{}: expected host:port",
                self.address
            )));
        }
        Ok((uri, tls))
    }
}

/// The token every call carries, read again when its file changes. Cloned into each
/// generated client as its interceptor.
#[derive(Clone, Default)]
pub struct Credentials {
    token: Option<Arc<Reloading<AsciiMetadataValue>>>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("token", &self.token)
            .finish()
    }
}

impl Credentials {
    fn load(path: Option<&Path>) -> Result<Self, ChannelError> {
        Ok(Self {
            token: path
                .map(|path| {
                    let owned = path.to_owned();
                    Reloading::new("battery's token", vec![path.to_owned()], move || {
                        read_token(&owned)
                    })
                })
                .transpose()?
                .map(Arc::new),
        })
    }

    /// Follows the token's file and the TLS files, if any, every [`RELOAD_INTERVAL`].
    fn follow_files(
        &self,
        tls: Option<Arc<Reloading<rustls::ClientConfig>>>,
    ) -> Option<tokio::task::JoinHandle<()>> {
        if self.token.is_none() && tls.is_none() {
            return None;
        }
        let token = self.token.clone();
        Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(RELOAD_INTERVAL);
            loop {
                tick.tick().await;
                if let Some(token) = &token {
                    token.reload_if_changed();
                }
                if let Some(tls) = &tls {
                    tls.reload_if_changed();
                }
            }
        }))
    }
}

impl Interceptor for Credentials {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.token {
            let value = AsciiMetadataValue::clone(&token.current());
            request
                .metadata_mut()
                .insert(battery_proto::poolmgr::basic_auth::METADATA_KEY, value);
        }
        Ok(request)
    }
}

/// The `authorization` value for the token in `path`. A trailing newline is not part of
/// the token: files written by `echo` or an editor end with one.
fn read_token(path: &Path) -> Result<AsciiMetadataValue, ChannelError> {
    let text = std::fs::read_to_string(path).map_err(|source| ChannelError::TokenRead {
        path: path.to_owned(),
        source,
    })?;
    let token = battery_proto::poolmgr::basic_auth::token_in(&text).ok_or_else(|| {
        ChannelError::TokenEmpty {
            path: path.to_owned(),
        }
    })?;
    let invalid = || ChannelError::TokenInvalid {
        path: path.to_owned(),
    };
    if token.contains(['\r', '\n']) || !token.chars().all(|c| c.is_ascii_graphic() || c == ' ') {
        return Err(invalid());
    }
    let mut value: AsciiMetadataValue =
        MetadataValue::try_from(battery_proto::poolmgr::basic_auth::header_value(token))
            .map_err(|_| invalid())?;
    // Kept out of any Debug output of the request, as hyper does for sensitive headers.
    value.set_sensitive(true);
    Ok(value)
}

/// The client TLS of the CA bundle and, for mTLS, the client certificate.
fn client_config(settings: &TlsSettings) -> Result<rustls::ClientConfig, ChannelError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in tls_files::certificates(&settings.ca_file).map_err(ChannelError::CaFile)? {
        roots.add(cert).map_err(ChannelError::Tls)?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(tls_files::provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(ChannelError::Tls)?
        .with_root_certificates(roots);
    let mut config = match &settings.client {
        Some(files) => {
            let key = tls_files::certified_key(files).map_err(ChannelError::ClientCertificate)?;
            builder.with_client_cert_resolver(Arc::new(ClientCertificate(Arc::new(key))))
        }
        None => builder.with_no_client_auth(),
    };
    // gRPC over TLS is HTTP/2 chosen by ALPN; grpc-go refuses a handshake without it.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// The client certificate offered to battery, whatever it asks for: poolmgrd names no
/// CA in its request.
#[derive(Debug)]
struct ClientCertificate(Arc<CertifiedKey>);

impl ResolvesClientCert for ClientCertificate {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// Dials battery and shakes hands with the TLS files of the moment.
#[derive(Clone)]
struct Connector {
    tls: Arc<Reloading<rustls::ClientConfig>>,
    server_name: ServerName<'static>,
}

impl tower::Service<Uri> for Connector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connector = TlsConnector::from(self.tls.current());
        let server_name = self.server_name.clone();
        Box::pin(async move {
            let authority = uri.authority().map(ToString::to_string).unwrap_or_default();
            let tcp = TcpStream::connect(authority).await?;
            // A small HTTP/2 frame after another would wait for the peer's delayed ACK.
            tcp.set_nodelay(true)?;
            let tls = connector.connect(server_name, tcp).await?;
            Ok(TokioIo::new(tls))
        })
    }
}

#[cfg(test)]
mod tests;
