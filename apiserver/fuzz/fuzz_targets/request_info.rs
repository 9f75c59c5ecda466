//! `RequestInfo::parse`, which authorization and audit run on every request before
//! routing. Input: `METHOD PATH[?QUERY]`, as on an HTTP request line.
#![no_main]

use battery_api_machinery::request_info::RequestInfo;
use http::{Method, StatusCode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &str| {
    let Some((method, target)) = input.split_once(' ') else {
        return;
    };
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return;
    };
    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (target, None),
    };
    let parsed = RequestInfo::parse(&method, path, query);
    // Authorization and the handler must agree, so the parse is a function of its input.
    assert_eq!(
        parsed.as_ref().ok(),
        RequestInfo::parse(&method, path, query).as_ref().ok()
    );
    match parsed {
        Ok(info) => {
            if info.is_resource_request {
                assert!(matches!(info.api_prefix.as_str(), "api" | "apis"));
                assert_eq!(info.parts.first().map_or("", String::as_str), info.resource);
            } else {
                assert!(info.resource.is_empty() && info.resource_verb().is_none());
            }
        }
        Err(e) => assert_eq!(e.code(), StatusCode::BAD_REQUEST),
    }
});
