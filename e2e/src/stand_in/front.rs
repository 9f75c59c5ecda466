//! The stand-in in front of battery-apiserver, as kube-apiserver's aggregator is:
//! TLS for kubectl, authentication (client certificate, bearer token, anonymous),
//! authorization by the policy, then either the stand-in's own kube API
//! ([`super::cluster`]) or a proxied request to the backend with the front-proxy client
//! certificate and `X-Remote-*` headers, streamed both ways. Upgrades are spliced the
//! way `upgradeaware.go` does it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::{Context as _, Result};
use axum::body::Body;
use axum::response::IntoResponse as _;
use battery_api_machinery::request_info::RequestInfo;
use battery_api_machinery::status::ApiError;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::cluster::Cluster;
use super::pki::{self, Layout};
use super::policy::{PolicyFile, User};
use super::status;

/// The stand-in's own endpoint that rotates the front-proxy CA.
pub const ROTATE_PATH: &str = "/stand-in/rotate-front-proxy";
/// How long a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the TLS handshake of a connection said about its client.
#[derive(Clone)]
struct Peer {
    address: SocketAddr,
    /// The chain the client presented, unverified (verified per request, so that a
    /// certificate of an unknown CA is a 401 as kube-apiserver answers, not a TLS alert).
    certificates: Option<Arc<Vec<CertificateDer<'static>>>>,
}

/// The front side: authentication, authorization and routing.
pub struct Front {
    layout: Layout,
    policy: Arc<PolicyFile>,
    cluster: Arc<Cluster>,
    /// Verifies users' client certificates against `client-ca.crt`.
    client_ca: Arc<dyn ClientCertVerifier>,
    backend: Backend,
}

impl Front {
    pub fn new(layout: Layout, policy: Arc<PolicyFile>, cluster: Arc<Cluster>) -> Result<Self> {
        let client_ca = pki::client_verifier(&layout.client_ca())?;
        let backend = Backend::new(&layout)?;
        Ok(Self {
            layout,
            policy,
            cluster,
            client_ca,
            backend,
        })
    }

    /// Where forwarded requests go from now on.
    pub fn set_backend(&self, url: &str) -> Result<()> {
        self.backend.set_target(url)
    }

    /// Accepts connections on `listener` until the process ends.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) -> Result<()> {
        let acceptor = TlsAcceptor::from(Arc::new(self.server_config()?));
        loop {
            let (tcp, address) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!("accept: {error}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let front = self.clone();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await
                {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(error)) => {
                        tracing::debug!(%address, "TLS handshake failed: {error}");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%address, "TLS handshake timed out");
                        return;
                    }
                };
                let peer = Peer {
                    address,
                    certificates: tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .filter(|chain| !chain.is_empty())
                        .map(|chain| {
                            Arc::new(chain.iter().map(|c| c.clone().into_owned()).collect())
                        }),
                };
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let front = front.clone();
                    let peer = peer.clone();
                    async move {
                        Ok::<_, std::convert::Infallible>(
                            front.handle(&peer, request.map(Body::new)).await,
                        )
                    }
                });
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                if let Err(error) = builder
                    .serve_connection_with_upgrades(TokioIo::new(tls), service)
                    .await
                {
                    tracing::debug!(%address, "connection: {error}");
                }
            });
        }
    }

    fn server_config(&self) -> Result<rustls::ServerConfig> {
        let (cert, key) = self.layout.stand_in_serving();
        pki::server_config(&cert, &key)
    }

    async fn handle(&self, peer: &Peer, mut request: Request<Body>) -> Response<Body> {
        let method = request.method().clone();
        let path = request.uri().path().to_owned();
        let Some(user) = self.authenticate(peer, request.headers()) else {
            tracing::info!(%method, %path, client = %peer.address, "401: not authenticated");
            return status::unauthorized();
        };
        let info = match RequestInfo::parse(&method, &path, request.uri().query()) {
            Ok(info) => info,
            Err(error) => return error.into_response(),
        };
        let decision = self.policy.current().authorize(&user, &info);
        if !decision.allowed {
            tracing::info!(%method, %path, user = %user.username, "403: not allowed");
            // kube-apiserver's wording, which is battery-apiserver's too.
            return ApiError::forbidden(&user.username, &info, "").into_response();
        }
        // What the client said about itself must never reach anyone.
        strip_identity(request.headers_mut());
        let response = if path == ROTATE_PATH {
            self.rotate(&method)
        } else if Cluster::serves(&path) {
            self.cluster.handle(request).await
        } else {
            self.forward(request, &user, peer.address).await
        };
        tracing::info!(%method, %path, user = %user.username, status = response.status().as_u16(), "served");
        response
    }

    /// kube-apiserver's union of authenticators: a client certificate of `client-ca`,
    /// else a bearer token of the policy, else anonymous. A credential that was
    /// presented and does not verify makes the request unauthenticated (401).
    fn authenticate(&self, peer: &Peer, headers: &HeaderMap) -> Option<User> {
        let mut presented = false;
        if let Some(chain) = &peer.certificates {
            presented = true;
            match self
                .client_ca
                .verify_client_cert(&chain[0], &chain[1..], UnixTime::now())
            {
                Ok(_) => {
                    if let Some(user) = certificate_user(&chain[0]) {
                        return Some(user.authenticated());
                    }
                }
                Err(error) => {
                    tracing::info!(client = %peer.address, "client certificate refused: {error}")
                }
            }
        }
        // `Authorization: Bearer`, or a WebSocket's token sub-protocol, as kube-apiserver
        // reads them.
        match battery_apiserver::http::authn::bearer(headers) {
            Ok(Some(token)) => {
                presented = true;
                if let Some(user) = self.policy.current().token_user(&token).cloned() {
                    return Some(user.authenticated());
                }
            }
            Ok(None) => presented |= headers.contains_key(header::AUTHORIZATION),
            Err(_) => presented = true,
        }
        (!presented).then(User::anonymous)
    }

    fn rotate(&self, method: &Method) -> Response<Body> {
        if method != Method::POST {
            return status::method_not_allowed(method);
        }
        let rotated = pki::rotate_front_proxy(&self.layout).and_then(|pem| {
            self.backend.reload(&self.layout)?;
            Ok(pem)
        });
        match rotated {
            Ok(pem) => {
                let config_map = self.cluster.set_front_proxy_ca(&pem);
                tracing::info!("rotated the front-proxy CA and client certificate");
                status::json(StatusCode::OK, &config_map)
            }
            Err(error) => status::failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                format!("rotating the front-proxy certificates: {error:#}"),
            ),
        }
    }

    /// Proxies to the backend as `handler_proxy.go` does.
    async fn forward(
        &self,
        mut request: Request<Body>,
        user: &User,
        client: SocketAddr,
    ) -> Response<Body> {
        let Some(target) = self.backend.target() else {
            return status::service_unavailable(
                "no backend yet: the stand-in forwards once it is given one",
            );
        };
        let upgrade = is_upgrade(request.headers());
        let headers = request.headers_mut();
        set_identity(headers, user);
        if let Ok(ip) = HeaderValue::from_str(&client.ip().to_string()) {
            headers.append(HeaderName::from_static("x-forwarded-for"), ip);
        }
        if upgrade {
            return self.forward_upgrade(request, &target).await;
        }
        remove_hop_by_hop(request.headers_mut());
        match self.backend.send(request, &target).await {
            Ok(response) => {
                let mut response = response.map(Body::new);
                remove_hop_by_hop(response.headers_mut());
                response
            }
            Err(error) => {
                tracing::warn!("forwarding to {}: {error:#}", target.authority);
                status::service_unavailable(format!("error trying to reach service: {error:#}"))
            }
        }
    }

    /// An upgrade: a new HTTP/1.1 connection to the backend; 101 → both upgraded
    /// connections are spliced; >= 400 → that response; anything else → 503.
    async fn forward_upgrade(
        &self,
        mut request: Request<Body>,
        target: &BackendTarget,
    ) -> Response<Body> {
        let client_upgrade = hyper::upgrade::on(&mut request);
        let sent = async {
            let io = self
                .backend
                .connect(target, self.backend.config(true))
                .await?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
            tokio::spawn(async move {
                if let Err(error) = connection.with_upgrades().await {
                    tracing::debug!("upgrade connection to the backend: {error}");
                }
            });
            let (mut parts, _) = request.into_parts();
            parts.uri = target.origin_form(&parts.uri);
            parts.version = Version::HTTP_11;
            parts
                .headers
                .insert(header::HOST, HeaderValue::from_str(&target.authority)?);
            anyhow::Ok(
                sender
                    .send_request(Request::from_parts(parts, Body::empty()))
                    .await?,
            )
        };
        let mut response = match sent.await {
            Ok(response) => response,
            Err(error) => {
                return status::service_unavailable(format!(
                    "error trying to reach service: {error:#}"
                ));
            }
        };
        let code = response.status();
        if code == StatusCode::SWITCHING_PROTOCOLS {
            let backend_upgrade = hyper::upgrade::on(&mut response);
            tokio::spawn(async move {
                match tokio::join!(client_upgrade, backend_upgrade) {
                    (Ok(client), Ok(backend)) => {
                        let (mut client, mut backend) =
                            (TokioIo::new(client), TokioIo::new(backend));
                        if let Err(error) =
                            tokio::io::copy_bidirectional(&mut client, &mut backend).await
                        {
                            tracing::debug!("upgraded connection: {error}");
                        }
                    }
                    (client, backend) => tracing::warn!(
                        "upgrade failed: client {:?}, backend {:?}",
                        client.err(),
                        backend.err()
                    ),
                }
            });
            let (parts, _) = response.into_parts();
            return Response::from_parts(parts, Body::empty());
        }
        if code.as_u16() >= 400 {
            return response.map(Body::new);
        }
        status::service_unavailable(format!(
            "invalid upgrade response: status code {}",
            code.as_u16()
        ))
    }
}

/// The user of a verified client certificate: CN the name, O the groups, and the
/// credential id kube-apiserver adds.
fn certificate_user(der: &CertificateDer<'_>) -> Option<User> {
    // The same reading as battery-apiserver's, which is Go's: the last CN, the O's, the
    // fingerprint as the credential id; no user for an empty CN.
    let user = battery_apiserver::http::authn::user_from_certificate(der)?;
    Some(User {
        username: user.name,
        uid: user.uid,
        groups: user.groups,
        extra: user.extra,
    })
}

/// Deletes the credentials and every identity header the client sent.
fn strip_identity(headers: &mut HeaderMap) {
    headers.remove(header::AUTHORIZATION);
    battery_apiserver::http::authn::clear_websocket_token(headers);
    let forged: Vec<HeaderName> = headers
        .keys()
        .filter(|name| name.as_str().starts_with("x-remote-"))
        .cloned()
        .collect();
    for name in forged {
        headers.remove(name);
    }
}

/// `SetAuthProxyHeaders` (client-go `transport/round_trippers.go`): one
/// `X-Remote-Group` line per group, extra keys percent-escaped like `headerKeyEscape`.
fn set_identity(headers: &mut HeaderMap, user: &User) {
    strip_identity(headers);
    let mut add = |name: &str, value: &str| match (
        HeaderName::from_bytes(name.as_bytes()),
        HeaderValue::from_str(value),
    ) {
        (Ok(name), Ok(value)) => {
            headers.append(name, value);
        }
        _ => tracing::warn!("cannot send the header {name}: {value:?}"),
    };
    add("x-remote-user", &user.username);
    if !user.uid.is_empty() {
        add("x-remote-uid", &user.uid);
    }
    for group in &user.groups {
        add("x-remote-group", group);
    }
    for (key, values) in &user.extra {
        let name = format!("x-remote-extra-{}", header_key_escape(key));
        for value in values {
            add(&name, value);
        }
    }
}

/// Percent-encodes every byte that may not be in a header name, and `%` itself.
pub fn header_key_escape(key: &str) -> String {
    let legal = |b: u8| b.is_ascii_alphanumeric() || b"!#$&'*+-.^_`|~".contains(&b);
    key.bytes()
        .map(|b| {
            if legal(b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn is_upgrade(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("upgrade"))
}

/// Hop-by-hop headers belong to one connection, not to the request (RFC 9110 §7.6.1),
/// and HTTP/2 forbids them.
fn remove_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
    ] {
        headers.remove(name);
    }
}

/// Where the backend is.
#[derive(Debug, Clone)]
struct BackendTarget {
    scheme: http::uri::Scheme,
    /// `host:port`, as the Host header and TCP want it.
    authority: String,
    /// The name its certificate must have.
    server_name: ServerName<'static>,
}

impl BackendTarget {
    fn parse(url: &str) -> Result<Self> {
        let uri: Uri = url
            .trim()
            .parse()
            .with_context(|| format!("backend URL {url:?}"))?;
        anyhow::ensure!(
            uri.scheme_str() == Some("https"),
            "the backend URL {url} must be https"
        );
        let authority = uri.authority().context("the backend URL has no host")?;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let server_name = ServerName::try_from(host.to_owned())
            .with_context(|| format!("the backend host {host}"))?;
        Ok(Self {
            scheme: http::uri::Scheme::HTTPS,
            authority: format!(
                "{}:{}",
                authority.host(),
                authority.port_u16().unwrap_or(443)
            ),
            server_name,
        })
    }

    fn origin_form(&self, uri: &Uri) -> Uri {
        uri.path_and_query()
            .map_or_else(|| Uri::from_static("/"), |pq| Uri::from(pq.clone()))
    }

    fn absolute(&self, uri: &Uri) -> Result<Uri> {
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.authority.parse()?);
        parts.path_and_query = Some(
            uri.path_and_query()
                .cloned()
                .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")),
        );
        Ok(Uri::from_parts(parts)?)
    }
}

/// TLS configurations for the backend: with ALPN `h2` and `http/1.1` for requests, and
/// `http/1.1` only for upgrades (an upgrade needs HTTP/1.1).
struct BackendTls {
    requests: Arc<rustls::ClientConfig>,
    upgrades: Arc<rustls::ClientConfig>,
}

/// The connection to the backend: one HTTP/2 connection shared by every request (the
/// aggregator multiplexes too), or a new HTTP/1.1 connection per request when the
/// backend does not speak HTTP/2.
struct Backend {
    target: RwLock<Option<BackendTarget>>,
    tls: RwLock<BackendTls>,
    /// Bumped whenever the target or the certificate changes: a cached connection of an
    /// older generation is not used again.
    generation: AtomicU64,
    h2: tokio::sync::Mutex<Option<(u64, hyper::client::conn::http2::SendRequest<Body>)>>,
}

impl Backend {
    fn new(layout: &Layout) -> Result<Self> {
        Ok(Self {
            target: RwLock::new(None),
            tls: RwLock::new(Self::tls(layout)?),
            generation: AtomicU64::new(0),
            h2: tokio::sync::Mutex::new(None),
        })
    }

    /// Trusts `serving-ca` (the APIService's caBundle), presents the front-proxy client
    /// certificate.
    fn tls(layout: &Layout) -> Result<BackendTls> {
        let (cert, key) = layout.front_proxy_client();
        let config = |alpn: &[&[u8]]| {
            pki::client_config(&[&layout.serving_ca()], Some((&cert, &key)), alpn).map(Arc::new)
        };
        Ok(BackendTls {
            requests: config(&[b"h2", b"http/1.1"])?,
            upgrades: config(&[b"http/1.1"])?,
        })
    }

    /// Reads the client certificate again; new connections present it.
    fn reload(&self, layout: &Layout) -> Result<()> {
        *self.tls.write().expect("tls lock") = Self::tls(layout)?;
        // Requests on the old connection would still carry the old certificate.
        self.generation.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn set_target(&self, url: &str) -> Result<()> {
        let target = BackendTarget::parse(url)?;
        *self.target.write().expect("target lock") = Some(target);
        self.generation.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn target(&self) -> Option<BackendTarget> {
        self.target.read().expect("target lock").clone()
    }

    fn config(&self, upgrade: bool) -> Arc<rustls::ClientConfig> {
        let tls = self.tls.read().expect("tls lock");
        if upgrade {
            tls.upgrades.clone()
        } else {
            tls.requests.clone()
        }
    }

    async fn connect(
        &self,
        target: &BackendTarget,
        config: Arc<rustls::ClientConfig>,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(&target.authority)
            .await
            .with_context(|| format!("dialing {}", target.authority))?;
        let _ = tcp.set_nodelay(true);
        TlsConnector::from(config)
            .connect(target.server_name.clone(), tcp)
            .await
            .with_context(|| format!("TLS with {}", target.authority))
    }

    async fn send(
        &self,
        mut request: Request<Body>,
        target: &BackendTarget,
    ) -> Result<Response<Incoming>> {
        let mut cached = self.h2.lock().await;
        // Read before connecting: a change while connecting makes the next request
        // connect again rather than keep a connection of the old settings.
        let generation = self.generation.load(Ordering::SeqCst);
        let reusable = cached
            .as_ref()
            .filter(|(made, sender)| *made == generation && !sender.is_closed());
        let mut sender = match reusable {
            Some((_, sender)) => sender.clone(),
            None => {
                let io = self.connect(target, self.config(false)).await?;
                let h2 = io.get_ref().1.alpn_protocol() == Some(b"h2");
                if !h2 {
                    drop(cached);
                    let (mut sender, connection) =
                        hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
                    tokio::spawn(connection);
                    *request.uri_mut() = target.origin_form(request.uri());
                    *request.version_mut() = Version::HTTP_11;
                    request
                        .headers_mut()
                        .insert(header::HOST, HeaderValue::from_str(&target.authority)?);
                    return Ok(sender.send_request(request).await?);
                }
                let (sender, connection) =
                    hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
                        .await?;
                tokio::spawn(connection);
                *cached = Some((generation, sender.clone()));
                sender
            }
        };
        drop(cached);
        sender.ready().await?;
        *request.uri_mut() = target.absolute(request.uri())?;
        *request.version_mut() = Version::HTTP_2;
        Ok(sender.send_request(request).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_keys_are_escaped_like_client_go() {
        assert_eq!(
            header_key_escape("authentication.kubernetes.io/credential-id"),
            "authentication.kubernetes.io%2Fcredential-id"
        );
        assert_eq!(header_key_escape("100%"), "100%25");
    }
}
