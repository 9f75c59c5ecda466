//! Front-proxy (request-header) authentication, as the aggregator uses it
//! (`…/request/x509/x509.go` `Verifier`, `…/headerrequest/requestheader.go`).

use std::collections::BTreeMap;

use http::HeaderMap;
use rustls::pki_types::CertificateDer;

use super::x509::{Verifier, common_name, verify};
use crate::api::UserInfo;

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
    /// The user the headers name when `chain` is a front proxy's: `Ok(None)` when the chain
    /// is not the requestheader CA's or names nobody, so that the next authenticator runs;
    /// an error when the chain is the CA's but its CN is not allowed.
    pub(super) fn authenticate(
        &self,
        chain: &[CertificateDer<'static>],
        headers: &HeaderMap,
    ) -> Result<Option<UserInfo>, String> {
        verify(&self.verifier, chain).map_err(|e| format!("front-proxy certificate: {e}"))?;
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
        Ok(self.user(headers))
    }

    /// The user the identity headers name, if the first username header has a value.
    fn user(&self, headers: &HeaderMap) -> Option<UserInfo> {
        let names = &self.names;
        let name = values(headers, &names.username_headers).find(|v| !v.is_empty())?;
        let uid = values(headers, &names.uid_headers)
            .find(|v| !v.is_empty())
            .unwrap_or_default();
        // Every value of every group header: the aggregator sends one line per group.
        let groups = values(headers, &names.group_headers).collect();
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

    /// Removes every identity header (`ClearAuthenticationHeaders`).
    pub(super) fn clear(&self, headers: &mut HeaderMap) {
        let names = &self.names;
        for name in names
            .username_headers
            .iter()
            .chain(&names.uid_headers)
            .chain(&names.group_headers)
        {
            headers.remove(name.as_str());
        }
        let extra: Vec<http::HeaderName> = headers
            .keys()
            .filter(|k| {
                names
                    .extra_prefixes
                    .iter()
                    .any(|p| strip_prefix_ignore_case(k.as_str(), p).is_some())
            })
            .cloned()
            .collect();
        for name in extra {
            headers.remove(name);
        }
    }
}

/// `header` (lowercase, as `http` keeps names) without `prefix`, compared ignoring case.
fn strip_prefix_ignore_case<'a>(header: &'a str, prefix: &str) -> Option<&'a str> {
    let head = header.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &header[prefix.len()..])
}

fn values<'a>(headers: &'a HeaderMap, names: &'a [String]) -> impl Iterator<Item = String> + 'a {
    names.iter().flat_map(move |name| {
        headers
            .get_all(name.as_str())
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::to_owned)
    })
}

/// `url.PathUnescape` of an extra key; an undecodable key is kept as it came.
fn unescape(key: &str) -> String {
    let bytes = key.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = key.get(i + 1..i + 3)
            && let Ok(byte) = u8::from_str_radix(hex, 16)
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
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
