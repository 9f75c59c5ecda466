//! Every option type's decoding and validation, as the handlers run them on the raw query.
//! Input: the query on the first line, a `Content-Type` on the second (for patch and
//! delete options), and a DeleteOptions body after it.
#![no_main]

use battery_api_machinery::params::{
    CreateOptions, DeleteOptions, ListOptions, PatchOptions, QueryOptions, TableOptions,
    UpdateOptions,
};
use battery_api_machinery::selectors::{FieldSelector, LabelSelector};
use battery_api_machinery::status::ApiError;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, StatusCode};
use libfuzzer_sys::fuzz_target;

/// A bad option is the client's error: 400, 415 or 422, never a server error.
fn client_error<T>(result: Result<T, ApiError>) -> Option<T> {
    result
        .inspect_err(|e| {
            assert!(
                matches!(
                    e.code(),
                    StatusCode::BAD_REQUEST
                        | StatusCode::UNSUPPORTED_MEDIA_TYPE
                        | StatusCode::UNPROCESSABLE_ENTITY
                ),
                "{e}"
            )
        })
        .ok()
}

fuzz_target!(|input: &[u8]| {
    let mut lines = input.splitn(3, |b| *b == b'\n');
    let Ok(query) = std::str::from_utf8(lines.next().unwrap_or_default()) else {
        return;
    };
    let mut headers = HeaderMap::new();
    if let Some(Ok(content_type)) = lines.next().map(HeaderValue::from_bytes) {
        headers.insert(CONTENT_TYPE, content_type);
    }
    let body = lines.next().unwrap_or_default();

    if let Some(list) = client_error(ListOptions::from_request(query, &headers)) {
        // The selectors a list filters with are the ones authorization saw, printed.
        let labels = LabelSelector::parse(&list.label_selector.to_string());
        assert_eq!(labels.as_ref().ok(), Some(&list.label_selector));
        // The same terms, maybe in another order: terms are sorted by their raw text, which
        // printing changes (`==` prints as `=`), and a selector's terms all hold either way.
        let fields = FieldSelector::parse(&list.field_selector.to_string())
            .expect("a printed field selector parses");
        let sorted = |selector: &FieldSelector| {
            let mut terms = selector.terms().to_vec();
            terms.sort_by_key(ToString::to_string);
            terms
        };
        assert_eq!(sorted(&fields), sorted(&list.field_selector));
        assert!(list.limit.is_none_or(|l| l.get() > 0));
    }
    client_error(CreateOptions::from_request(query, &headers));
    client_error(UpdateOptions::from_request(query, &headers));
    client_error(TableOptions::from_request(query, &headers));
    if let Some(patch) = client_error(PatchOptions::from_request(query, &headers)) {
        assert!(patch.field_manager.is_none_or(|m| !m.is_empty()));
    }
    client_error(DeleteOptions::from_request(query, &headers, body));
});
