//! `labelSelector` and `fieldSelector`: parsing, printing and matching. Input: a label
//! selector on the first line, a field selector on the second, then `key=value` lines,
//! the labels (and fields) to match.
#![no_main]

use std::collections::BTreeMap;

use battery_api_machinery::selectors::{FieldSelector, LabelSelector};
use http::StatusCode;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &str| {
    let mut lines = input.split('\n');
    let label_text = lines.next().unwrap_or_default();
    let field_text = lines.next().unwrap_or_default();
    let labels: BTreeMap<String, String> = lines
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();

    match LabelSelector::parse(label_text) {
        Ok(selector) => {
            // What a selector prints is what it parsed, and matches the same objects.
            let printed = selector.to_string();
            let reparsed = LabelSelector::parse(&printed)
                .unwrap_or_else(|e| panic!("{printed:?} does not parse: {e}"));
            assert_eq!(reparsed, selector, "{printed:?}");
            let matched = selector.matches(&labels);
            assert_eq!(matched, reparsed.matches(&labels));
            assert_eq!(matched, selector.matches(&labels));
            if selector.is_empty() {
                assert!(matched);
            }
        }
        Err(e) => assert_eq!(e.code(), StatusCode::BAD_REQUEST),
    }

    match FieldSelector::parse(field_text) {
        Ok(selector) => {
            let printed = selector.to_string();
            let reparsed = FieldSelector::parse(&printed)
                .unwrap_or_else(|e| panic!("{printed:?} does not parse: {e}"));
            // Go sorts the terms as written (`a==x` before `a=b`), so the order of terms
            // on one field may change; the conjunction may not.
            let terms = |s: &FieldSelector| {
                let mut terms: Vec<String> = s.terms().iter().map(ToString::to_string).collect();
                terms.sort();
                terms
            };
            assert_eq!(terms(&reparsed), terms(&selector), "{printed:?}");
            let value_of = |field: &str| labels.get(field).map(String::as_str);
            let matched = selector.matches(value_of);
            assert_eq!(matched, reparsed.matches(value_of));
            if selector.is_empty() {
                assert!(matched);
            }
            // A check against the supported fields fails only as a client error.
            if let Err(e) = selector.check_supported(&["metadata.name", "metadata.namespace"]) {
                assert_eq!(e.code(), StatusCode::BAD_REQUEST);
            }
        }
        Err(e) => assert_eq!(e.code(), StatusCode::BAD_REQUEST),
    }
});
