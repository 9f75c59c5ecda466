//! [`Client`]: claims of one namespace, and who the client is. The claim request it
//! makes, [`crate::ClaimBuilder`], is `claim_builder.rs`'s.

use battery_types::MicroVMClaim;
use http::Uri;
use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube::api::Api;
use kube::client::ConfigExt as _;
use tokio::net::TcpStream;
use tower::{Service, ServiceBuilder};

use crate::error::Error;

/// The entry point: claims of one namespace, through a `kube::Client`.
#[derive(Clone)]
pub struct Client {
    pub(crate) kube: kube::Client,
    pub(crate) namespace: String,
    /// The user the client authenticates as, where its configuration tells.
    user: Option<String>,
}

impl Client {
    /// A client for the kubeconfig's (or the Pod's) default namespace. A `kube::Client`
    /// made with its default retries (`Config::default_retry`) retries `429` and `503`
    /// itself, for minutes, before [`ClaimBuilder::send`](crate::ClaimBuilder::send) sees them: prefer
    /// [`Client::from_config`], which turns them off.
    pub fn new(kube: kube::Client) -> Self {
        let namespace = kube.default_namespace().to_owned();
        Self {
            kube,
            namespace,
            user: None,
        }
    }

    /// A client from a kube configuration, which also knows who it is: the user its
    /// client certificate or ServiceAccount token names (in a Pod, its own), so that a
    /// claim's Holder defaults to that ServiceAccount.
    /// kube-rs's own retries of `429` and `503` are turned off: [`ClaimBuilder::send`](crate::ClaimBuilder::send)
    /// retries to its deadline, which a `kube::Client` retrying on its own would outlast.
    /// Its connections are opened with `TCP_NODELAY`, which `kube::Client::try_from`'s
    /// are not (but through a `proxy_url`, whose connections kube-rs makes).
    pub fn from_config(mut config: kube::Config) -> Result<Self, Error> {
        let user = certificate_user(&config.auth_info).or_else(|| token_user(&config.auth_info));
        config.default_retry = false;
        // kube-rs's own client leaves Nagle's algorithm on (kube-rs/kube#2056): a new
        // connection's small writes (TLS Finished, then the upgrade request) waited on the
        // server's delayed ACK, some 40 ms of every exec and port-forward after the first.
        // A proxy's tunnel is kube-rs's to make, so that connection keeps its stack.
        let kube = if config.proxy_url.is_some() {
            kube::Client::try_from(config)
        } else {
            kube_client(&config, tcp_connector())
        }
        .map_err(Error::Api)?;
        Ok(Self {
            user,
            ..Self::new(kube)
        })
    }

    /// The ServiceAccount of this client's namespace that the client's user is, if any.
    pub(crate) fn own_service_account(&self) -> Option<String> {
        let user = self.user.as_deref()?;
        let rest = user.strip_prefix("system:serviceaccount:")?;
        let (namespace, name) = rest.split_once(':')?;
        (namespace == self.namespace).then(|| name.to_owned())
    }

    /// The same client for `namespace`.
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    pub(crate) fn kube(&self) -> kube::Client {
        self.kube.clone()
    }

    pub(crate) fn claims(&self) -> Api<MicroVMClaim> {
        Api::namespaced(self.kube.clone(), &self.namespace)
    }
}

/// The TCP connector under the client's connections: kube-rs's, with `TCP_NODELAY`.
fn tcp_connector() -> HttpConnector {
    let mut connector = HttpConnector::new();
    // `https` URIs too: TLS is layered on it.
    connector.enforce_http(false);
    connector.set_nodelay(true);
    connector
}

/// A `kube::Client` for `config` on the connections `tcp` makes: kube-rs's default stack
/// (`ClientBuilder::try_from`), TLS from `config` (HTTP/1.1, the only protocol kube-rs's
/// rustls connector offers), its timeouts, base URI, authentication (tokens and exec
/// plugins refreshed), impersonation and extra headers, WebSocket upgrades; less its
/// retries (off in [`Client::from_config`]), its tracing spans, gzip (a kube-rs feature
/// not enabled here) and `valid_until` (an exec plugin's certificate expiry, unread here).
fn kube_client<H>(config: &kube::Config, tcp: H) -> Result<kube::Client, kube::Error>
where
    H: Service<Uri, Response = TokioIo<TcpStream>> + Clone + Send + Sync + 'static,
    H::Future: Send + 'static,
    H::Error: Into<tower::BoxError>,
{
    let mut connector = TimeoutConnector::new(config.rustls_https_connector_with_connector(tcp)?);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let http: HyperClient<_, kube::client::Body> =
        HyperClient::builder(TokioExecutor::new()).build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        // One error type under the auth layer's `Either`.
        .map_err(tower::BoxError::from)
        .service(http);
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}

/// The common name of the client certificate, which Kubernetes takes as the user name.
fn certificate_user(auth: &kube::config::AuthInfo) -> Option<String> {
    use base64::Engine as _;
    let pem = match (&auth.client_certificate_data, &auth.client_certificate) {
        (Some(data), _) => base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .ok()?,
        (None, Some(path)) => std::fs::read(path).ok()?,
        (None, None) => return None,
    };
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).ok()?;
    let certificate = pem.parse_x509().ok()?;
    let name = certificate
        .subject()
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_owned();
    Some(name)
}

/// The subject of a ServiceAccount token (a JWT), which Kubernetes takes as the user
/// name. Read, not verified: it only picks the default Holder, which the server checks.
fn token_user(auth: &kube::config::AuthInfo) -> Option<String> {
    use base64::Engine as _;
    use secrecy::ExposeSecret as _;
    let token = match (&auth.token, &auth.token_file) {
        (Some(token), _) => token.expose_secret().to_owned(),
        (None, Some(path)) => std::fs::read_to_string(path).ok()?,
        (None, None) => return None,
    };
    let payload = token.trim().split('.').nth(1)?;
    let claims: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload.trim_end_matches('='))
            .ok()?,
    )
    .ok()?;
    let subject = claims.get("sub")?.as_str()?;
    subject
        .starts_with("system:serviceaccount:")
        .then(|| subject.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token_of(claims: serde_json::Value) -> kube::config::AuthInfo {
        use base64::Engine as _;
        let part = |v: &serde_json::Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
        };
        let jwt = format!(
            "{}.{}.sig",
            part(&serde_json::json!({"alg": "RS256"})),
            part(&claims)
        );
        kube::config::AuthInfo {
            token: Some(jwt.into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_service_account_token_names_its_user() {
        let auth = token_of(serde_json::json!({"sub": "system:serviceaccount:ci:runner"}));
        assert_eq!(
            token_user(&auth).as_deref(),
            Some("system:serviceaccount:ci:runner")
        );
        // An OIDC user is no ServiceAccount, and garbage is nobody.
        assert_eq!(
            token_user(&token_of(serde_json::json!({"sub": "alice"}))),
            None
        );
        let garbage = kube::config::AuthInfo {
            token: Some("not-a-jwt".to_owned().into()),
            ..Default::default()
        };
        assert_eq!(token_user(&garbage), None);
    }

    /// Of each connection its connector makes, whether `TCP_NODELAY` is set: read on the
    /// client's socket, where the option lives (a server cannot see it).
    #[derive(Clone)]
    struct Recording {
        connector: HttpConnector,
        nodelay: std::sync::Arc<std::sync::Mutex<Vec<bool>>>,
    }

    impl Service<Uri> for Recording {
        type Response = TokioIo<TcpStream>;
        type Error = tower::BoxError;
        type Future =
            std::pin::Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

        fn poll_ready(
            &mut self,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Self::Error>> {
            self.connector.poll_ready(cx).map_err(Into::into)
        }

        fn call(&mut self, uri: Uri) -> Self::Future {
            let connecting = self.connector.call(uri);
            let nodelay = self.nodelay.clone();
            Box::pin(async move {
                let io = connecting.await?;
                nodelay.lock().unwrap().push(io.inner().nodelay()?);
                Ok(io)
            })
        }
    }

    /// A WebSocket server on localhost, answering every upgrade as an apiserver's exec
    /// does, which reports each request's path and headers.
    async fn websocket_server() -> (Uri, tokio::sync::mpsc::UnboundedReceiver<http::Request<()>>) {
        use futures::StreamExt as _;
        use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/prefix", listener.local_addr().unwrap());
        let (requests, seen) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                let requests = requests.clone();
                tokio::spawn(async move {
                    #[allow(clippy::result_large_err)] // tungstenite's callback type
                    let answer = |request: &Request, mut response: Response| {
                        let mut seen = http::Request::new(());
                        *seen.uri_mut() = request.uri().clone();
                        *seen.headers_mut() = request.headers().clone();
                        requests.send(seen).unwrap();
                        response.headers_mut().insert(
                            http::header::SEC_WEBSOCKET_PROTOCOL,
                            http::HeaderValue::from_static("v5.channel.k8s.io"),
                        );
                        Ok::<_, ErrorResponse>(response)
                    };
                    let mut ws = tokio_tungstenite::accept_hdr_async(tcp, answer)
                        .await
                        .unwrap();
                    while let Some(Ok(_)) = ws.next().await {}
                });
            }
        });
        (url.parse().unwrap(), seen)
    }

    /// The stack `from_config` builds opens its connections with `TCP_NODELAY`, keeps
    /// kube-rs's base URI, authentication and impersonation, and upgrades to WebSocket as
    /// exec and port-forward do; each upgrade is a new connection.
    #[tokio::test]
    async fn connections_are_opened_with_tcp_nodelay() {
        let (url, mut seen) = websocket_server().await;
        let mut config = kube::Config::new(url);
        config.auth_info.token = Some("a-token".to_owned().into());
        config.auth_info.impersonate = Some("alice".to_owned());
        let exec = || {
            http::Request::get("/api/v1/namespaces/default/pods/p/exec?command=true")
                .body(Vec::new())
                .unwrap()
        };

        let nodelay = std::sync::Arc::default();
        let connector = Recording {
            connector: tcp_connector(),
            nodelay: std::sync::Arc::clone(&nodelay),
        };
        let kube = kube_client(&config, connector).unwrap();
        for _ in 0..2 {
            let connection = kube.connect(exec()).await.unwrap();
            drop(connection);
            let request = seen.recv().await.unwrap();
            assert_eq!(
                request.uri().path(),
                "/prefix/api/v1/namespaces/default/pods/p/exec"
            );
            let header = |name: &str| request.headers().get(name).unwrap().to_str().unwrap();
            assert_eq!(header("authorization"), "Bearer a-token");
            assert_eq!(header("impersonate-user"), "alice");
        }
        assert_eq!(*nodelay.lock().unwrap(), [true, true]);

        // The control: a connector as kube-rs makes it leaves Nagle's algorithm on, which
        // `Recording` sees.
        let nodelay = std::sync::Arc::default();
        let mut connector = HttpConnector::new();
        connector.enforce_http(false);
        let connector = Recording {
            connector,
            nodelay: std::sync::Arc::clone(&nodelay),
        };
        let kube = kube_client(&config, connector).unwrap();
        drop(kube.connect(exec()).await.unwrap());
        assert_eq!(*nodelay.lock().unwrap(), [false]);
    }
}
