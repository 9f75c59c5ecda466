//! What authentication trusts (the client CA, the front proxy's CA and header names),
//! where each part comes from, and keeping it current without a restart.
//!
//! As in Go's delegating authentication (`apiserver:pkg/server/options/authentication.go`),
//! each part comes from its flag when given, otherwise from the ConfigMap
//! `kube-system/extension-apiserver-authentication` that kube-apiserver maintains. Both
//! rotate: the ConfigMap is watched and the flags' files re-read, and a change swaps the
//! whole [`Trust`] at once. A broken new value is logged and the old one kept, and so is
//! a CA the ConfigMap loses, as in Go.

use std::path::PathBuf;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{WatchStreamExt as _, watcher};

use super::front_proxy::{FrontProxy, RequestHeaderNames};
use super::x509::{CaBundleError, Verifier, verifier};

/// Where kube-apiserver publishes who may authenticate how.
pub const CONFIG_MAP_NAMESPACE: &str = "kube-system";
pub const CONFIG_MAP_NAME: &str = "extension-apiserver-authentication";
/// How often the flags' CA files are read again for a rotation.
const FILE_CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// The CA bundles and header names authentication trusts, as data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrustConfig {
    /// PEM bundle that signs direct client certificates.
    pub client_ca: Option<Vec<u8>>,
    pub request_header: Option<RequestHeaderConfig>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestHeaderConfig {
    /// PEM bundle that signs the front proxy's certificate.
    pub ca: Vec<u8>,
    pub names: RequestHeaderNames,
}

/// A [`TrustConfig`] ready to verify with.
#[derive(Default)]
pub struct Trust {
    pub(super) client_ca: Option<Verifier>,
    pub(super) front_proxy: Option<FrontProxy>,
}

impl Trust {
    pub fn new(config: &TrustConfig) -> Result<Self, CaBundleError> {
        Ok(Self {
            client_ca: config
                .client_ca
                .as_deref()
                .map(|pem| verifier(pem, "the client CA"))
                .transpose()?,
            front_proxy: config
                .request_header
                .as_ref()
                .map(|header| -> Result<FrontProxy, CaBundleError> {
                    Ok(FrontProxy {
                        verifier: verifier(&header.ca, "the requestheader CA")?,
                        names: header.names.clone(),
                    })
                })
                .transpose()?,
        })
    }
}

/// Failing to learn what to trust.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    CaBundle(#[from] CaBundleError),
    #[error("ConfigMap {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME}: key {key}: {why}")]
    ConfigMapKey { key: &'static str, why: String },
    #[error(
        "reading ConfigMap {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME}: {source} (bind the Role extension-apiserver-authentication-reader in kube-system to this server's ServiceAccount, give the CAs as flags, or pass --authentication-tolerate-lookup-failure)"
    )]
    Lookup {
        #[source]
        source: kube::Error,
    },
}

/// The request-header flags, used instead of the ConfigMap when the CA file is given.
#[derive(Clone, Debug)]
pub struct RequestHeaderFlags {
    pub ca_file: PathBuf,
    pub names: RequestHeaderNames,
}

/// Where each part of the trust comes from.
pub struct TrustSources {
    pub client_ca_file: Option<PathBuf>,
    pub request_header: Option<RequestHeaderFlags>,
    /// The cluster whose ConfigMap gives what the flags do not.
    pub cluster: Option<kube::Client>,
    /// Start even when the ConfigMap cannot be read (then only the flags count).
    pub tolerate_lookup_failure: bool,
}

impl TrustSources {
    fn config_map_api(&self) -> Option<kube::Api<ConfigMap>> {
        let needed = self.client_ca_file.is_none() || self.request_header.is_none();
        let client = self.cluster.clone().filter(|_| needed)?;
        Some(kube::Api::namespaced(client, CONFIG_MAP_NAMESPACE))
    }

    /// The trust now: the flags' files as they are, the rest from `config_map`.
    fn resolve(&self, config_map: Option<&ConfigMap>) -> Result<TrustConfig, TrustError> {
        let client_ca = match &self.client_ca_file {
            Some(path) => Some(read(path)?),
            None => config_map.and_then(|cm| data(cm, "client-ca-file")),
        };
        let request_header = match &self.request_header {
            Some(flags) => Some(RequestHeaderConfig {
                ca: read(&flags.ca_file)?,
                names: flags.names.clone(),
            }),
            None => config_map.map(request_header_from).transpose()?.flatten(),
        };
        Ok(TrustConfig {
            client_ca,
            request_header,
        })
    }

    /// Reads every source once: the trust to start with, and what keeps it current.
    /// Errors when a file or the ConfigMap cannot be read (a missing ConfigMap is not an
    /// error: the cluster publishes none).
    pub async fn load(self) -> Result<(Trust, TrustKeeper), TrustError> {
        let config_map = match self.config_map_api() {
            Some(api) => match api.get_opt(CONFIG_MAP_NAME).await {
                Ok(found) => {
                    if found.is_none() {
                        tracing::warn!(
                            "the cluster has no ConfigMap {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME}: only the flags' CAs are trusted"
                        );
                    }
                    found
                }
                Err(source) if self.tolerate_lookup_failure => {
                    tracing::warn!(error = %TrustError::Lookup { source }, "starting without the ConfigMap");
                    None
                }
                Err(source) => return Err(TrustError::Lookup { source }),
            },
            None => None,
        };
        let config = self.resolve(config_map.as_ref())?;
        let trust = Trust::new(&config)?;
        let keeper = TrustKeeper {
            sources: self,
            config,
            config_map: ConfigMapView {
                current: config_map,
                relisted: None,
            },
        };
        Ok((trust, keeper))
    }
}

/// What keeps the trust loaded at start current.
pub struct TrustKeeper {
    sources: TrustSources,
    /// What the trust in use was built from.
    config: TrustConfig,
    config_map: ConfigMapView,
}

/// The ConfigMap as the watch last settled it. A re-list (after a broken watch) replaces
/// it only once complete, so a tick in between still sees the old one, and a re-list that
/// no longer finds it means it was deleted meanwhile (what it gave is then kept:
/// [`keep_withdrawn`]).
#[derive(Default)]
struct ConfigMapView {
    current: Option<ConfigMap>,
    /// During a re-list: what it has found so far.
    relisted: Option<Option<ConfigMap>>,
}

impl ConfigMapView {
    /// Takes one watch event; true when `current` may have changed.
    fn apply(&mut self, event: watcher::Event<ConfigMap>) -> bool {
        match event {
            watcher::Event::Init => {
                self.relisted = Some(None);
                false
            }
            watcher::Event::InitApply(config_map) => {
                self.relisted = Some(Some(config_map));
                false
            }
            watcher::Event::InitDone => {
                self.current = self.relisted.take().flatten();
                true
            }
            watcher::Event::Apply(config_map) => {
                self.current = Some(config_map);
                true
            }
            watcher::Event::Delete(_) => {
                self.current = None;
                true
            }
        }
    }
}

/// What verifies against a [`Trust`], and takes a new one when its sources change: the
/// server's authentication.
pub trait TrustHolder: Send + Sync {
    /// From now on, verify against `trust`.
    fn set_trust(&self, trust: Trust);
}

impl TrustKeeper {
    /// Swaps `authentication`'s trust whenever a source changes; runs until dropped.
    pub async fn run(mut self, authentication: Arc<dyn TrustHolder>) {
        let mut config_maps = pin!(self.config_map_events());
        let mut tick = tokio::time::interval(FILE_CHECK_INTERVAL);
        loop {
            tokio::select! {
                event = config_maps.next() => match event {
                    Some(Ok(event)) => {
                        if !self.config_map.apply(event) {
                            continue;
                        }
                    }
                    Some(Err(err)) => {
                        tracing::warn!(error = %err, "watching ConfigMap {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME}");
                        continue;
                    }
                    None => return,
                },
                _ = tick.tick() => {}
            }
            let config_map = self.config_map.current.clone();
            self.refresh(config_map.as_ref(), authentication.as_ref());
        }
    }

    fn refresh(&mut self, config_map: Option<&ConfigMap>, authentication: &dyn TrustHolder) {
        let config = match self.sources.resolve(config_map) {
            Ok(config) => keep_withdrawn(&self.config, config),
            Err(err) => {
                tracing::warn!(error = %err, "keeping the authentication trust as it was");
                return;
            }
        };
        if config == self.config {
            return;
        }
        match Trust::new(&config) {
            Ok(trust) => {
                authentication.set_trust(trust);
                self.config = config;
                tracing::info!("reloaded the CAs and headers authentication trusts");
            }
            Err(err) => {
                tracing::warn!(error = %err, "keeping the authentication trust as it was")
            }
        }
    }

    /// The ConfigMap's events, or nothing when every part comes from flags.
    fn config_map_events(
        &self,
    ) -> impl Stream<Item = Result<watcher::Event<ConfigMap>, watcher::Error>> + use<> {
        match self.sources.config_map_api() {
            Some(api) => watcher(
                api,
                watcher::Config::default().fields(&format!("metadata.name={CONFIG_MAP_NAME}")),
            )
            .default_backoff()
            .left_stream(),
            None => futures::stream::pending().right_stream(),
        }
    }
}

/// `new`, but with what `old` trusted where `new` has nothing: Go keeps the last CA bundle
/// it loaded when the ConfigMap loses it (deleted, or a key emptied), so that a delete
/// and re-create or a bad edit does not lock every client out in between.
fn keep_withdrawn(old: &TrustConfig, mut new: TrustConfig) -> TrustConfig {
    if new.client_ca.is_none() && old.client_ca.is_some() {
        tracing::warn!(
            "the client CA is gone from ConfigMap {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME}: keeping the last one"
        );
        new.client_ca.clone_from(&old.client_ca);
    }
    if new.request_header.is_none() && old.request_header.is_some() {
        tracing::warn!(
            "the requestheader CA is gone from ConfigMap {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME}: keeping the last one"
        );
        new.request_header.clone_from(&old.request_header);
    }
    new
}

fn read(path: &std::path::Path) -> Result<Vec<u8>, TrustError> {
    std::fs::read(path).map_err(|source| TrustError::Read {
        path: path.to_owned(),
        source,
    })
}

/// A key's value; an empty one means not set, as in Go.
fn data(config_map: &ConfigMap, key: &str) -> Option<Vec<u8>> {
    let value = config_map.data.as_ref()?.get(key)?;
    (!value.is_empty()).then(|| value.clone().into_bytes())
}

/// A key holding a JSON array of strings (`deserializeStrings`); unset is empty.
fn strings(config_map: &ConfigMap, key: &'static str) -> Result<Vec<String>, TrustError> {
    match data(config_map, key) {
        None => Ok(Vec::new()),
        Some(json) => serde_json::from_slice(&json).map_err(|e| TrustError::ConfigMapKey {
            key,
            why: format!("not a JSON array of strings: {e}"),
        }),
    }
}

/// The front proxy the ConfigMap describes; none without its CA.
fn request_header_from(config_map: &ConfigMap) -> Result<Option<RequestHeaderConfig>, TrustError> {
    let Some(ca) = data(config_map, "requestheader-client-ca-file") else {
        return Ok(None);
    };
    Ok(Some(RequestHeaderConfig {
        ca,
        names: RequestHeaderNames {
            allowed_names: strings(config_map, "requestheader-allowed-names")?,
            username_headers: strings(config_map, "requestheader-username-headers")?,
            uid_headers: strings(config_map, "requestheader-uid-headers")?,
            group_headers: strings(config_map, "requestheader-group-headers")?,
            extra_prefixes: strings(config_map, "requestheader-extra-headers-prefix")?,
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_map(entries: &[(&str, &str)]) -> ConfigMap {
        ConfigMap {
            data: Some(
                entries
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..ConfigMap::default()
        }
    }

    fn no_flags() -> TrustSources {
        TrustSources {
            client_ca_file: None,
            request_header: None,
            cluster: None,
            tolerate_lookup_failure: false,
        }
    }

    #[test]
    fn the_config_map_gives_both_cas_and_the_header_names() {
        let cm = config_map(&[
            ("client-ca-file", "CLIENT"),
            ("requestheader-client-ca-file", "FRONT"),
            ("requestheader-allowed-names", r#"["front-proxy-client"]"#),
            ("requestheader-username-headers", r#"["X-Remote-User"]"#),
            ("requestheader-group-headers", r#"["X-Remote-Group"]"#),
            (
                "requestheader-extra-headers-prefix",
                r#"["X-Remote-Extra-"]"#,
            ),
        ]);
        let config = no_flags().resolve(Some(&cm)).unwrap();
        assert_eq!(config.client_ca.as_deref(), Some(&b"CLIENT"[..]));
        let header = config.request_header.unwrap();
        assert_eq!(header.ca, b"FRONT");
        assert_eq!(header.names.allowed_names, ["front-proxy-client"]);
        assert_eq!(header.names.username_headers, ["X-Remote-User"]);
        // Opt-in, as in Go: absent means no uid header is trusted.
        assert!(header.names.uid_headers.is_empty());
    }

    #[test]
    fn without_a_requestheader_ca_nobody_may_speak_for_others() {
        let cm = config_map(&[
            ("client-ca-file", "CLIENT"),
            ("requestheader-client-ca-file", ""),
            ("requestheader-username-headers", r#"["X-Remote-User"]"#),
        ]);
        assert_eq!(no_flags().resolve(Some(&cm)).unwrap().request_header, None);
        assert_eq!(no_flags().resolve(None).unwrap(), TrustConfig::default());
    }

    #[test]
    fn a_header_list_that_is_not_json_is_an_error_naming_the_key() {
        let cm = config_map(&[
            ("requestheader-client-ca-file", "FRONT"),
            ("requestheader-allowed-names", "front-proxy-client"),
        ]);
        let err = no_flags().resolve(Some(&cm)).unwrap_err().to_string();
        assert!(err.contains("requestheader-allowed-names"), "{err}");
    }

    #[test]
    fn the_watch_settles_the_config_map_only_when_a_relist_is_complete() {
        let cm = |v: &str| config_map(&[("client-ca-file", v)]);
        let mut view = ConfigMapView {
            current: Some(cm("start")),
            relisted: None,
        };
        // A re-list in progress leaves what ticks see as it was.
        assert!(!view.apply(watcher::Event::Init));
        assert!(!view.apply(watcher::Event::InitApply(cm("relisted"))));
        assert_eq!(view.current, Some(cm("start")));
        assert!(view.apply(watcher::Event::InitDone));
        assert_eq!(view.current, Some(cm("relisted")));
        // Changes and deletion apply at once.
        assert!(view.apply(watcher::Event::Apply(cm("rotated"))));
        assert_eq!(view.current, Some(cm("rotated")));
        assert!(view.apply(watcher::Event::Delete(cm("rotated"))));
        assert_eq!(view.current, None);
        // A re-list that finds nothing: it was deleted while the watch was down.
        view.current = Some(cm("again"));
        view.apply(watcher::Event::Init);
        assert!(view.apply(watcher::Event::InitDone));
        assert_eq!(view.current, None);
    }

    #[test]
    fn a_ca_the_config_map_loses_is_kept_and_one_it_changes_is_taken() {
        let sources = no_flags();
        let old = sources
            .resolve(Some(&config_map(&[
                ("client-ca-file", "CLIENT"),
                ("requestheader-client-ca-file", "FRONT"),
            ])))
            .unwrap();
        let deleted = keep_withdrawn(&old, sources.resolve(None).unwrap());
        assert_eq!(deleted, old);
        let rotated = sources
            .resolve(Some(&config_map(&[(
                "requestheader-client-ca-file",
                "FRONT-2",
            )])))
            .unwrap();
        let rotated = keep_withdrawn(&old, rotated);
        assert_eq!(rotated.request_header.unwrap().ca, b"FRONT-2");
        assert_eq!(rotated.client_ca.as_deref(), Some(&b"CLIENT"[..]));
    }

    #[test]
    fn flags_win_over_the_config_map() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("front.crt");
        std::fs::write(&file, "FROM-FLAG").unwrap();
        let sources = TrustSources {
            request_header: Some(RequestHeaderFlags {
                ca_file: file,
                names: RequestHeaderNames::default(),
            }),
            ..no_flags()
        };
        let cm = config_map(&[
            ("client-ca-file", "CLIENT"),
            ("requestheader-client-ca-file", "FRONT"),
        ]);
        let config = sources.resolve(Some(&cm)).unwrap();
        assert_eq!(config.request_header.unwrap().ca, b"FROM-FLAG");
        assert_eq!(config.client_ca.as_deref(), Some(&b"CLIENT"[..]));
    }
}
