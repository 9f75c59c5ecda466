//! Front-proxy (request-header) authentication, as the aggregator uses it
//! (`…/request/x509/x509.go` `Verifier`, `…/headerrequest/requestheader.go`).

use std::collections::BTreeMap;

use http::HeaderMap;
use rustls::pki_types::{CertificateDer, UnixTime};

use super::x509::{Verifier, common_name, verify};
use crate::auth::UserInfo;

/// Which certificates may speak for others, and in which headers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestHeaderNames {
    /// CNs the front-proxy certificate may have; empty allows any.
    pub allowed_names: Vec<String>,
    pub username_headers: Vec<String>,
    pub uid_headers: Vec<String>,
    pub group_headers: Vec<String>,
    pub extra_prefixes: Vec<String>,
}

pub struct FrontProxy {
    /// Verifies against the requestheader CA.
    pub verifier: Verifier,
    pub names: RequestHeaderNames,
}

impl FrontProxy {
    /// Whether `chain` is a front proxy's at `now`: it verifies against the requestheader
    /// CA, and its CN is allowed. Only then do the identity headers count
    /// ([`FrontProxy::user`]).
    pub(super) fn vouches(
        &self,
        chain: &[CertificateDer<'static>],
        now: UnixTime,
    ) -> Result<(), String> {
        verify(&self.verifier, chain, now).map_err(|e| format!("front-proxy certificate: {e}"))?;
        let allowed = &self.names.allowed_names;
        let cn = chain
            .first()
            .and_then(|leaf| common_name(leaf))
            .unwrap_or_default();
        if !allowed.is_empty() && !allowed.contains(&cn) {
            return Err(format!(
                "x509: subject with cn={cn} is not in the allowed list"
            ));
        }
        Ok(())
    }

    /// The user the identity headers name, as Go's `requestheader.go` reads them: the
    /// first value of the first username header that has a non-empty one; every non-empty
    /// value of every group header; every value of every extra header.
    pub(super) fn user(&self, headers: &HeaderMap) -> Option<UserInfo> {
        let names = &self.names;
        let first = |candidates: &[String]| {
            candidates.iter().find_map(|name| {
                headers
                    .get(name.as_str())
                    .and_then(|v| v.to_str().ok())
                    .filter(|v| !v.is_empty())
                    .map(str::to_owned)
            })
        };
        let name = first(&names.username_headers)?;
        let uid = first(&names.uid_headers).unwrap_or_default();
        // One header line per group, as the aggregator sends them; never comma-split.
        let groups = names
            .group_headers
            .iter()
            .flat_map(|name| headers.get_all(name.as_str()))
            .filter_map(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
            .collect();
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (header, value) in headers {
            for prefix in &names.extra_prefixes {
                if let Some(key) = strip_prefix_ignore_case(header.as_str(), prefix)
                    && let Ok(value) = value.to_str()
                {
                    extra
                        .entry(unescape(key))
                        .or_default()
                        .push(value.to_owned());
                }
            }
        }
        Some(UserInfo {
            name,
            uid,
            groups,
            extra,
        })
    }
}

/// The identity headers Kubernetes' aggregator sets: removed from every request even
/// when no front proxy is trusted (or it uses other names), so a forged one never reaches
/// a handler, or anything a handler forwards to.
const STANDARD_HEADERS: [&str; 3] = ["x-remote-user", "x-remote-group", "x-remote-uid"];
const STANDARD_EXTRA_PREFIX: &str = "x-remote-extra-";

/// Removes every identity header: the standard ones, and those `names` configures
/// (`ClearAuthenticationHeaders`).
pub(super) fn clear(names: Option<&RequestHeaderNames>, headers: &mut HeaderMap) {
    let configured = names.into_iter();
    let singles: Vec<&str> = configured
        .clone()
        .flat_map(|n| [&n.username_headers, &n.uid_headers, &n.group_headers])
        .flatten()
        .map(String::as_str)
        .chain(STANDARD_HEADERS)
        .collect();
    for name in singles {
        headers.remove(name);
    }
    let prefixes: Vec<&str> = configured
        .flat_map(|n| &n.extra_prefixes)
        .map(String::as_str)
        .chain([STANDARD_EXTRA_PREFIX])
        .collect();
    let extra: Vec<http::HeaderName> = headers
        .keys()
        .filter(|k| {
            prefixes
                .iter()
                .any(|p| strip_prefix_ignore_case(k.as_str(), p).is_some())
        })
        .cloned()
        .collect();
    for name in extra {
        headers.remove(name);
    }
}

/// `header` (lowercase, as `http` keeps names) without `prefix`, compared ignoring case.
fn strip_prefix_ignore_case<'a>(header: &'a str, prefix: &str) -> Option<&'a str> {
    let head = header.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &header[prefix.len()..])
}

/// `url.PathUnescape` of an extra key, all or nothing: a key with a malformed escape, or
/// that decodes to something not UTF-8, is kept as it came.
fn unescape(key: &str) -> String {
    let bytes = key.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let Some(byte) = key
                .get(i + 1..i + 3)
                .filter(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()))
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
            else {
                return key.to_owned();
            };
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| key.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_keys_are_lowercased_and_unescaped() {
        assert_eq!(
            unescape("authentication.kubernetes.io%2fcredential-id"),
            "authentication.kubernetes.io/credential-id"
        );
        assert_eq!(unescape("bad%zzkey"), "bad%zzkey");
        assert_eq!(unescape("trailing%2"), "trailing%2");
        // All or nothing, as Go: one bad escape keeps the good one encoded too.
        assert_eq!(unescape("a%2Fb%zz"), "a%2Fb%zz");
        assert_eq!(unescape("sign%2b"), "sign+");
    }

    #[test]
    fn prefixes_match_ignoring_case_and_never_split_a_character() {
        assert_eq!(
            strip_prefix_ignore_case("x-remote-extra-scopes", "X-Remote-Extra-"),
            Some("scopes")
        );
        assert_eq!(strip_prefix_ignore_case("x-rem", "X-Remote-Extra-"), None);
        assert_eq!(strip_prefix_ignore_case("é-remote", "X-"), None);
    }
}
