//! The handlers: kube-openapi's hash, caching and content negotiation rules.

use std::time::{Duration, SystemTime};

use axum::body::to_bytes;
use http::header::IF_NONE_MATCH;
use serde_json::json;

use super::*;

fn request(pairs: &[(http::header::HeaderName, &str)]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in pairs {
        headers.append(name.clone(), HeaderValue::try_from(*value).unwrap());
    }
    headers
}

async fn body_of(response: Response) -> Bytes {
    to_bytes(response.into_body(), usize::MAX).await.unwrap()
}

#[tokio::test]
async fn root_lists_only_our_group_version_with_its_hash() {
    let openapi = OpenApi::new(GROUP, VERSION, &kinds()).unwrap();
    let response = openapi.v3_root(&HeaderMap::new());
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
    let etag = response.headers()[ETAG].clone();
    let root: Value = serde_json::from_slice(&body_of(response).await).unwrap();
    let url = format!(
        "/openapi/v3/apis/{GROUP}/{VERSION}?hash={}",
        openapi.v3_document().hash()
    );
    assert_eq!(
        root,
        json!({ "paths": { format!("apis/{GROUP}/{VERSION}"): { "serverRelativeURL": url } } })
    );
    assert_eq!(
        openapi.v3_group_version_path(),
        format!("/openapi/v3/apis/{GROUP}/{VERSION}")
    );

    let response = openapi.v3_root(&request(&[(IF_NONE_MATCH, etag.to_str().unwrap())]));
    assert_eq!(response.status(), StatusCode::NOT_MODIFIED);
}

#[tokio::test]
async fn group_version_follows_kube_openapi_hash_rules() {
    let openapi = OpenApi::new(GROUP, VERSION, &kinds()).unwrap();
    let hash = openapi.v3_document().hash().to_owned();
    assert_eq!(hash.len(), 128);
    assert!(
        hash.chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_lowercase())
    );

    // Without a hash: the document, not marked immutable.
    let response = openapi.v3_group_version(None, &HeaderMap::new());
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
    assert_eq!(response.headers()[VARY], "Accept");
    assert_eq!(response.headers()[ETAG], format!("\"{hash}\"").as_str());
    assert!(response.headers().get(CACHE_CONTROL).is_none());
    assert_eq!(body_of(response).await, openapi.v3_document().body());

    // With the current hash: cacheable for a year.
    let response = openapi.v3_group_version(Some(&hash), &request(&[(ACCEPT, "application/json")]));
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[CACHE_CONTROL], "public, immutable");
    let expires = httpdate::parse_http_date(response.headers()[EXPIRES].to_str().unwrap()).unwrap();
    let ahead = expires.duration_since(SystemTime::now()).unwrap();
    assert!(ahead > Duration::from_secs(364 * 24 * 3600), "{ahead:?}");

    // With an old hash: a permanent redirect to the current one.
    let response = openapi.v3_group_version(Some("0123"), &HeaderMap::new());
    assert_eq!(response.status(), StatusCode::MOVED_PERMANENTLY);
    assert_eq!(
        response.headers()[LOCATION],
        format!("/openapi/v3/apis/{GROUP}/{VERSION}?hash={hash}").as_str()
    );

    // An empty hash is no hash, as Go's `Query().Get` reads it.
    let response = openapi.v3_group_version(Some(""), &HeaderMap::new());
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().get(CACHE_CONTROL).is_none());

    // Conditional requests.
    let conditional = request(&[(IF_NONE_MATCH, &format!("\"{hash}\""))]);
    let response = openapi.v3_group_version(Some(&hash), &conditional);
    assert_eq!(response.status(), StatusCode::NOT_MODIFIED);
    assert!(body_of(response).await.is_empty());
}

#[tokio::test]
async fn only_json_is_served() {
    let openapi = OpenApi::new(GROUP, VERSION, &kinds()).unwrap();
    for accept in [
        "*/*",
        "application/*",
        "application/json",
        "application/json;q=0.5, text/html",
        "APPLICATION/JSON",
    ] {
        let headers = request(&[(ACCEPT, accept)]);
        assert_eq!(
            openapi.v3_group_version(None, &headers).status(),
            StatusCode::OK,
            "{accept}"
        );
        assert_eq!(openapi.v2(&headers).status(), StatusCode::OK, "{accept}");
    }
    for accept in [
        "application/com.github.proto-openapi.spec.v3.v1.0+protobuf",
        "application/yaml",
        "application/json;q=0",
        "text/*",
    ] {
        let headers = request(&[(ACCEPT, accept)]);
        let response = openapi.v3_group_version(Some("stale"), &headers);
        assert_eq!(response.status(), StatusCode::NOT_ACCEPTABLE, "{accept}");
        assert_eq!(response.headers()[VARY], "Accept");
        let status: Value = serde_json::from_slice(&body_of(response).await).unwrap();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["reason"], "NotAcceptable");
        assert_eq!(
            openapi.v2(&headers).status(),
            StatusCode::NOT_ACCEPTABLE,
            "{accept}"
        );
    }
    let response = openapi.v2(&HeaderMap::new());
    assert_eq!(response.status(), StatusCode::OK);
    let etag = response.headers()[ETAG].clone();
    let swagger: Value = serde_json::from_slice(&body_of(response).await).unwrap();
    assert_eq!(swagger["swagger"], "2.0");
    let response = openapi.v2(&request(&[(IF_NONE_MATCH, etag.to_str().unwrap())]));
    assert_eq!(response.status(), StatusCode::NOT_MODIFIED);
}
