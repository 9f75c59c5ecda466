//! Request bodies of the three kinds, decoded as a create or update decodes them (JSON or
//! YAML, per `Content-Type`) and validated. Input: the `Content-Type` on the first line,
//! the kind (`Pool`, `MicroVMClaim` or `Host`) on the second, the body after.
#![no_main]

use battery_api_machinery::negotiate::body_format;
use battery_types::{Host, MicroVMClaim, MicroVMClaimSpec, Pool};
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, StatusCode};
use libfuzzer_sys::fuzz_target;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// A decoded object re-encodes to what decodes to it again.
fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(
    value: Value,
) -> Option<T> {
    let object: T = serde_json::from_value(value).ok()?;
    let encoded = serde_json::to_value(&object).expect("a decoded object encodes");
    let again: T = serde_json::from_value(encoded.clone())
        .unwrap_or_else(|e| panic!("{encoded} does not decode: {e}"));
    assert_eq!(again, object);
    Some(object)
}

fuzz_target!(|input: &[u8]| {
    let mut lines = input.splitn(3, |b| *b == b'\n');
    let mut headers = HeaderMap::new();
    if let Some(Ok(content_type)) = lines.next().map(HeaderValue::from_bytes) {
        headers.insert(CONTENT_TYPE, content_type);
    }
    let kind = lines.next().unwrap_or_default();
    let body = lines.next().unwrap_or_default();
    let Ok(format) = body_format(&headers) else {
        return;
    };
    let value: Value = match format.decode(body) {
        Ok(value) => value,
        Err(e) => {
            assert_eq!(e.code(), StatusCode::BAD_REQUEST);
            return;
        }
    };
    // Validation reports; it must not panic on anything that decodes.
    match kind {
        b"Pool" => {
            if let Some(pool) = round_trip::<Pool>(value) {
                pool.spec.validate();
            }
        }
        b"MicroVMClaim" => {
            if let Some(claim) = round_trip::<MicroVMClaim>(value) {
                claim.spec.validate();
                MicroVMClaimSpec::validate_update(&claim.spec, &claim.spec);
            }
        }
        _ => {
            if let Some(host) = round_trip::<Host>(value) {
                host.spec.validate();
                if let Some(status) = &host.status {
                    status.validate();
                }
            }
        }
    }
});
