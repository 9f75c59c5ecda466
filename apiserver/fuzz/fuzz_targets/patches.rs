//! Merge and JSON patches applied to a valid Pool, then the result decoded and validated,
//! as a PATCH does. Input: the patch's `Content-Type` on the first line, the patch after.
#![no_main]

use battery_api_machinery::negotiate::PatchType;
use battery_api_machinery::patch::apply_patch;
use battery_types::Pool;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, StatusCode};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

fuzz_target!(|input: &[u8]| {
    let mut lines = input.splitn(2, |b| *b == b'\n');
    let mut headers = HeaderMap::new();
    if let Some(Ok(content_type)) = lines.next().map(HeaderValue::from_bytes) {
        headers.insert(CONTENT_TYPE, content_type);
    }
    let Ok(kind) = PatchType::from_headers(&headers) else {
        return;
    };
    // Server-side apply merges by field ownership, not through `apply_patch`.
    if kind == PatchType::Apply {
        return;
    }
    // The handler's own decoding of the patch.
    let Ok(patch) = serde_json::from_slice::<Value>(lines.next().unwrap_or_default()) else {
        return;
    };
    let original = json!({
        "apiVersion": "battery.liquidmetal-x.dev/v1alpha1", "kind": "Pool",
        "metadata": {"name": "p", "namespace": "default", "resourceVersion": "7",
            "labels": {"team": "ci"}, "finalizers": ["f"]},
        "spec": {"size": 1, "template": {"vcpu": 1, "memoryInMb": 1024,
            "kernel": {"image": "k"}, "rootVolume": {"id": "root", "containerSource": "r"},
            "interfaces": [{"deviceId": "eth1"}]}}
    });
    let mut document = original.clone();
    match apply_patch(kind, &mut document, &patch) {
        Ok(()) => {
            if kind == PatchType::MergePatch {
                // A merge patch states the result: applying it again changes nothing.
                let mut again = document.clone();
                apply_patch(kind, &mut again, &patch).expect("a merge patch applies twice");
                assert_eq!(again, document);
            }
            if let Ok(pool) = serde_json::from_value::<Pool>(document) {
                pool.spec.validate();
            }
        }
        Err(e) => {
            assert!(
                matches!(
                    e.code(),
                    StatusCode::BAD_REQUEST
                        | StatusCode::UNPROCESSABLE_ENTITY
                        | StatusCode::PAYLOAD_TOO_LARGE
                ),
                "{e}"
            );
            // A JSON patch that fails leaves no half-applied document behind.
            assert_eq!(document, original);
        }
    }
});
