//! Strong entity tags for the static documents (aggregated discovery, OpenAPI), computed
//! and compared the way the Go servers do.

use std::fmt::Write as _;

use http::HeaderMap;
use http::header::IF_NONE_MATCH;
use sha2::{Digest, Sha512};

/// The SHA-512 of `body` in upper-case hex, unquoted: the form kube-openapi puts in
/// `?hash=` and both Go servers quote into `ETag` (`fmt.Sprintf("%X", sha512.Sum512(…))` in
/// `apiserver:pkg/endpoints/discovery/aggregated/etag.go` and
/// `kube-openapi:pkg/handler3/handler.go` `computeETag`).
pub(crate) fn sha512_hex(body: &[u8]) -> String {
    let digest = Sha512::digest(body);
    let mut hex = String::with_capacity(digest.len() * 2);
    for byte in digest {
        // Writing to a String cannot fail.
        let _ = write!(hex, "{byte:02X}");
    }
    hex
}

/// The `ETag` header value for an unquoted hash: the hash in double quotes.
pub(crate) fn quoted(hash: &str) -> String {
    format!("\"{hash}\"")
}

/// Whether the request's `If-None-Match` names `quoted_etag`, so the answer is 304.
///
/// Go's discovery handler compares the whole header with the quoted hash; Go's
/// `http.ServeContent` (used for OpenAPI) also accepts lists, `*` and weak tags
/// (RFC 9110 §13.1.2, weak comparison). Doing the latter for both covers the former.
pub(crate) fn if_none_match(headers: &HeaderMap, quoted_etag: &str) -> bool {
    headers
        .get_all(IF_NONE_MATCH)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .any(|tag| tag == "*" || tag.strip_prefix("W/").unwrap_or(tag) == quoted_etag)
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    #[test]
    fn hash_is_upper_case_sha512_hex() {
        // sha512("") from FIPS 180-4 test vectors.
        assert_eq!(
            sha512_hex(b""),
            "CF83E1357EEFB8BDF1542850D66D8007D620E4050B5715DC83F4A921D36CE9CE\
             47D0D13C5D85F2B0FF8318D2877EEC2F63B931BD47417A81A538327AF927DA3E"
        );
    }

    #[test]
    fn if_none_match_forms() {
        let etag = quoted("ABC");
        let matches = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(IF_NONE_MATCH, HeaderValue::from_static(value));
            if_none_match(&headers, &etag)
        };
        assert!(matches("\"ABC\""));
        assert!(matches("W/\"ABC\""));
        assert!(matches("\"XYZ\", \"ABC\""));
        assert!(matches("*"));
        assert!(!matches("\"abc\""));
        assert!(!matches("ABC"));
        assert!(!if_none_match(&HeaderMap::new(), &etag));
    }
}
