//! Content negotiation: `Accept` for resources, watches and discovery, `Content-Type` for
//! bodies and patches, `User-Agent` and `?pretty` for indentation. Input: `Accept`,
//! `Content-Type`, `User-Agent` and the query, one a line; a line that is not a valid
//! header value leaves its header out.
#![no_main]

use battery_api_machinery::negotiate::{Discovery, Format, Negotiated, PatchType, body_format};
use http::header::{ACCEPT, CONTENT_TYPE, HeaderName, USER_AGENT};
use http::{HeaderMap, HeaderValue, StatusCode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let mut lines = input.splitn(4, |b| *b == b'\n');
    let mut headers = HeaderMap::new();
    let names: [HeaderName; 3] = [ACCEPT, CONTENT_TYPE, USER_AGENT];
    for name in names {
        if let Some(Ok(value)) = lines.next().map(HeaderValue::from_bytes) {
            headers.insert(name, value);
        }
    }
    let query = lines.next().and_then(|q| std::str::from_utf8(q).ok());

    let resource = Negotiated::for_resource(&headers, query);
    assert_eq!(
        resource.as_ref().ok(),
        Negotiated::for_resource(&headers, query).as_ref().ok()
    );
    match &resource {
        Ok(negotiated) => assert!(negotiated.format == Format::Json || !negotiated.pretty),
        Err(e) => assert_eq!(e.code(), StatusCode::NOT_ACCEPTABLE),
    }
    match Negotiated::for_watch(&headers) {
        // A watch streams JSON lines, never indented.
        Ok(watch) => {
            assert_eq!(watch.format, Format::Json);
            assert!(!watch.pretty);
            assert!(resource.is_ok());
        }
        Err(e) => assert_eq!(e.code(), StatusCode::NOT_ACCEPTABLE),
    }
    if let Err(e) = Discovery::negotiate(&headers) {
        assert_eq!(e.code(), StatusCode::NOT_ACCEPTABLE);
    }
    if let Err(e) = body_format(&headers) {
        assert_eq!(e.code(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    }
    match PatchType::from_headers(&headers) {
        Ok(patch) => {
            let content_type = headers.get(CONTENT_TYPE).map(HeaderValue::as_bytes);
            assert!(content_type.is_some_and(|c| c.starts_with(patch.content_type().as_bytes())));
        }
        Err(e) => assert_eq!(e.code(), StatusCode::UNSUPPORTED_MEDIA_TYPE),
    }
});
