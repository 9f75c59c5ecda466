use http::HeaderValue;
use http::header::CONTENT_TYPE;
use proptest::prelude::*;

use super::*;
use crate::status::Reason;

fn list(query: &str) -> Result<ListOptions, ApiError> {
    ListOptions::from_request(query, &HeaderMap::new())
}

fn content_type(value: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_str(value).unwrap());
    headers
}

#[test]
fn list_options_decode() {
    let options = list(
        "labelSelector=app%3Dweb&fieldSelector=metadata.name%3Dx&watch=1&allowWatchBookmarks=true\
         &resourceVersion=12&timeoutSeconds=30&limit=500&continue=abc",
    )
    .unwrap();
    assert_eq!(options.label_selector.to_string(), "app=web");
    assert_eq!(
        options.field_selector.requires_exact_match("metadata.name"),
        Some("x")
    );
    assert!(options.watch);
    assert!(options.allow_watch_bookmarks);
    assert_eq!(options.resource_version.as_deref(), Some("12"));
    assert_eq!(options.timeout, Some(Duration::from_secs(30)));
    assert_eq!(options.limit, NonZeroU64::new(500));
    assert_eq!(options.continue_token.as_deref(), Some("abc"));
    assert_eq!(options.send_initial_events, None);

    assert_eq!(list("").unwrap(), ListOptions::default());
    let unset = list("resourceVersion=&continue=&limit=0&timeoutSeconds=0").unwrap();
    assert_eq!(
        (
            unset.resource_version,
            unset.continue_token,
            unset.limit,
            unset.timeout
        ),
        (None, None, None, None)
    );
    let negative = list("limit=-5&timeoutSeconds=-1").unwrap();
    assert_eq!(
        (negative.limit, negative.timeout),
        (None, Some(Duration::ZERO))
    );

    let streaming = list("watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true").unwrap();
    assert_eq!(streaming.send_initial_events, Some(true));
    assert_eq!(
        streaming.resource_version_match,
        Some(ResourceVersionMatch::NotOlderThan)
    );
    let exact = list("resourceVersion=5&resourceVersionMatch=Exact").unwrap();
    assert_eq!(
        exact.resource_version_match,
        Some(ResourceVersionMatch::Exact)
    );
}

#[test]
fn list_options_bad_request() {
    let cases = [
        (
            "limit=abc",
            r#"strconv.ParseInt: parsing "abc": invalid syntax"#,
        ),
        (
            "timeoutSeconds=1s",
            r#"strconv.ParseInt: parsing "1s": invalid syntax"#,
        ),
        (
            "labelSelector=a%3D%3Db%3D%3Dc",
            "found '==', expected: ',' or 'end of string'",
        ),
        (
            "fieldSelector=nonsense",
            "invalid selector: 'nonsense'; can't understand 'nonsense'",
        ),
    ];
    for (query, want) in cases {
        let err = list(query).unwrap_err();
        assert_eq!(err.reason(), Reason::BadRequest, "{query}");
        assert_eq!(err.message(), want, "{query}");
    }
}

#[test]
fn list_options_invalid() {
    let cases = [
        (
            "resourceVersionMatch=NotOlderThan",
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
        ),
        (
            "resourceVersion=0&resourceVersionMatch=Exact",
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
        ),
        (
            "resourceVersion=1&resourceVersionMatch=Newest",
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Unsupported value: \"Newest\": supported values: \"Exact\", \"NotOlderThan\", \"\"",
        ),
        (
            "resourceVersion=1&resourceVersionMatch=Exact&continue=x",
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided",
        ),
        (
            "sendInitialEvents=true",
            "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list",
        ),
        (
            "watch=1&sendInitialEvents=true",
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        ),
        (
            "watch=1&resourceVersionMatch=NotOlderThan",
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        ),
        (
            "watch=1&sendInitialEvents=false&resourceVersionMatch=Exact",
            "ListOptions.meta.k8s.io \"\" is invalid: [resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan, resourceVersionMatch: Unsupported value: \"Exact\": supported values: \"NotOlderThan\"]",
        ),
    ];
    for (query, want) in cases {
        let err = list(query).unwrap_err();
        assert_eq!(err.reason(), Reason::Invalid, "{query}");
        assert_eq!(err.message(), want, "{query}");
        assert_eq!(
            err.details().and_then(|d| d.kind.as_deref()),
            Some("ListOptions")
        );
    }
}

#[test]
fn watch_list_can_be_refused() {
    let streaming =
        list("watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan").unwrap();
    let err = streaming.forbid_send_initial_events().unwrap_err();
    assert_eq!(err.code(), http::StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        err.message(),
        "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"
    );
    assert!(
        list("watch=1")
            .unwrap()
            .forbid_send_initial_events()
            .is_ok()
    );
}

#[test]
fn create_and_update_options() {
    let create = CreateOptions::from_request(
        "fieldManager=kubectl-create&fieldValidation=Strict",
        &HeaderMap::new(),
    )
    .unwrap();
    assert_eq!(
        create,
        CreateOptions {
            dry_run: false,
            field_manager: Some("kubectl-create".into()),
            field_validation: FieldValidation::Strict
        }
    );
    let dry = CreateOptions::from_request("dryRun=All&dryRun=All", &HeaderMap::new()).unwrap();
    assert!(dry.dry_run);
    assert_eq!(dry.field_validation, FieldValidation::Warn);
    assert_eq!(
        UpdateOptions::from_request("fieldValidation=Ignore", &HeaderMap::new())
            .unwrap()
            .field_validation,
        FieldValidation::Ignore
    );

    let cases = [
        (
            "dryRun=Server",
            "CreateOptions.meta.k8s.io \"\" is invalid: dryRun: Unsupported value: [\"Server\"]: supported values: \"All\"",
        ),
        (
            "fieldValidation=Loud",
            "CreateOptions.meta.k8s.io \"\" is invalid: fieldValidation: Unsupported value: \"Loud\": supported values: \"\", \"Ignore\", \"Strict\", \"Warn\"",
        ),
        (
            "fieldManager=a%07b",
            "CreateOptions.meta.k8s.io \"\" is invalid: fieldManager: Invalid value: \"a\\ab\": invalid character U+0007 (at position 1)",
        ),
    ];
    for (query, want) in cases {
        let err = CreateOptions::from_request(query, &HeaderMap::new()).unwrap_err();
        assert_eq!(err.reason(), Reason::Invalid, "{query}");
        assert_eq!(err.message(), want, "{query}");
    }
    let long = format!("fieldManager={}", "m".repeat(129));
    let err = UpdateOptions::from_request(&long, &HeaderMap::new()).unwrap_err();
    assert_eq!(
        err.message(),
        "UpdateOptions.meta.k8s.io \"\" is invalid: fieldManager: Too long: may not be more than 128 bytes"
    );
    assert!(
        UpdateOptions::from_request(
            &format!("fieldManager={}", "m".repeat(128)),
            &HeaderMap::new()
        )
        .is_ok()
    );
}

#[test]
fn patch_options() {
    let merge = PatchOptions::from_request(
        "fieldManager=kubectl-edit",
        &content_type("application/merge-patch+json"),
    )
    .unwrap();
    assert_eq!(merge.patch_type, PatchType::MergePatch);
    assert!(!merge.force);
    let apply = PatchOptions::from_request(
        "fieldManager=kubectl&force=true&fieldValidation=Strict",
        &content_type("application/apply-patch+yaml"),
    )
    .unwrap();
    assert_eq!(
        (apply.patch_type, apply.force, apply.field_validation),
        (PatchType::Apply, true, FieldValidation::Strict)
    );

    let err =
        PatchOptions::from_request("", &content_type("application/apply-patch+yaml")).unwrap_err();
    assert_eq!(
        err.message(),
        "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"
    );
    let err =
        PatchOptions::from_request("force=false", &content_type("application/json-patch+json"))
            .unwrap_err();
    assert_eq!(
        err.message(),
        "PatchOptions.meta.k8s.io \"\" is invalid: force: Forbidden: may not be specified for non-apply patch"
    );
    // The patch type is checked first, as in Go.
    let err = PatchOptions::from_request(
        "limit=x",
        &content_type("application/strategic-merge-patch+json"),
    )
    .unwrap_err();
    assert_eq!(err.reason(), Reason::UnsupportedMediaType);
}

#[test]
fn delete_options() {
    let none = HeaderMap::new();
    let body = br#"{"kind":"DeleteOptions","apiVersion":"v1","propagationPolicy":"Background","gracePeriodSeconds":0,"preconditions":{"uid":"u1"}}"#;
    let options = DeleteOptions::from_request("dryRun=x", &none, body).unwrap();
    assert_eq!(
        options.propagation_policy,
        Some(PropagationPolicy::Background)
    );
    assert_eq!(options.grace_period_seconds, Some(0));
    assert_eq!(
        options.preconditions.and_then(|p| p.uid).as_deref(),
        Some("u1")
    );
    // With a body the query is not read, so its bad dryRun does not count.
    assert!(!options.dry_run);

    let query = DeleteOptions::from_request(
        "gracePeriodSeconds=5&propagationPolicy=Foreground&dryRun=All",
        &none,
        b"",
    )
    .unwrap();
    assert_eq!(
        query,
        DeleteOptions {
            dry_run: true,
            grace_period_seconds: Some(5),
            preconditions: None,
            propagation_policy: Some(PropagationPolicy::Foreground),
            orphan_dependents: None,
        }
    );
    let yaml = DeleteOptions::from_request(
        "",
        &content_type("application/yaml"),
        b"propagationPolicy: Orphan\n",
    )
    .unwrap();
    assert_eq!(yaml.propagation_policy, Some(PropagationPolicy::Orphan));
    let legacy = DeleteOptions::from_request("orphanDependents=false", &none, b"").unwrap();
    assert_eq!(legacy.orphan_dependents, Some(false));

    let cases = [
        (
            "orphanDependents=true&propagationPolicy=Orphan",
            "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Invalid value: \"Orphan\": orphanDependents and deletionPropagation cannot be both set",
        ),
        (
            "propagationPolicy=Later",
            "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: \"Later\": supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\"",
        ),
        (
            "dryRun=All&dryRun=x",
            "DeleteOptions.meta.k8s.io \"\" is invalid: dryRun: Unsupported value: [\"All\",\"x\"]: supported values: \"All\"",
        ),
    ];
    for (query, want) in cases {
        let err = DeleteOptions::from_request(query, &none, b"").unwrap_err();
        assert_eq!(err.reason(), Reason::Invalid, "{query}");
        assert_eq!(err.message(), want, "{query}");
    }

    let bad_request = [
        (
            &none,
            &br#"{"kind":"Pool"}"#[..],
            "decoded object cannot be converted to DeleteOptions",
        ),
        (&none, &b"{"[..], ""),
    ];
    for (headers, body, want) in bad_request {
        let err = DeleteOptions::from_request("", headers, body).unwrap_err();
        assert_eq!(err.reason(), Reason::BadRequest);
        assert!(err.message().starts_with(want), "{}", err.message());
    }
    let err = DeleteOptions::from_request("", &content_type("text/plain"), b"x").unwrap_err();
    assert_eq!(err.reason(), Reason::UnsupportedMediaType);
    let err = DeleteOptions::from_request("gracePeriodSeconds=soon", &none, b"").unwrap_err();
    assert_eq!(
        err.message(),
        r#"strconv.ParseInt: parsing "soon": invalid syntax"#
    );
}

#[test]
fn table_options() {
    let table = |q: &str| TableOptions::from_request(q, &HeaderMap::new());
    assert_eq!(table("").unwrap().include_object, IncludeObject::Metadata);
    assert_eq!(
        table("includeObject=Metadata").unwrap().include_object,
        IncludeObject::Metadata
    );
    assert_eq!(
        table("includeObject=None").unwrap().include_object,
        IncludeObject::None
    );
    assert_eq!(
        table("includeObject=Object").unwrap().include_object,
        IncludeObject::Object
    );
    let err = table("includeObject=All").unwrap_err();
    assert_eq!(err.reason(), Reason::BadRequest);
    assert_eq!(
        err.message(),
        "Unable to convert to Table as requested: includeObject: Invalid value: \"All\": must be 'Metadata', 'Object', 'None', or empty"
    );
}

#[test]
fn options_reject_with_status() {
    assert_eq!(list("limit=x").unwrap_err().reason(), Reason::BadRequest);
    assert!(list("watch=1&limit=2").unwrap().watch);
    let merge = content_type("application/merge-patch+json");
    let patch = PatchOptions::from_request("fieldManager=m", &merge).unwrap();
    assert_eq!(patch.field_manager.as_deref(), Some("m"));
}

#[test]
fn decode_query_for_ad_hoc_options() {
    #[derive(Debug, Deserialize, PartialEq)]
    struct Exec {
        command: Vec<String>,
        #[serde(default)]
        stdin: bool,
        #[serde(default)]
        tty: bool,
    }
    let exec: Exec = decode_query("command=sh&command=-c&command=echo+hi&stdin=true").unwrap();
    assert_eq!(
        exec,
        Exec {
            command: vec!["sh".into(), "-c".into(), "echo hi".into()],
            stdin: true,
            tty: false
        }
    );
    let err = decode_query::<Exec>("stdin=1").unwrap_err();
    assert_eq!(err.reason(), Reason::BadRequest);
    assert_eq!(err.message(), "missing field `command`");
}

proptest! {
    #[test]
    fn never_panics(query in ".{0,120}", body in proptest::collection::vec(any::<u8>(), 0..64)) {
        let none = HeaderMap::new();
        let _ = ListOptions::from_request(&query, &none);
        let _ = CreateOptions::from_request(&query, &none);
        let _ = UpdateOptions::from_request(&query, &none);
        let _ = PatchOptions::from_request(&query, &content_type("application/apply-patch+yaml"));
        let _ = DeleteOptions::from_request(&query, &none, &body);
        let _ = DeleteOptions::from_request(&query, &content_type("application/yaml"), &body);
        let _ = TableOptions::from_request(&query, &none);
        let _ = list_options_for_request_info(&query);
    }

    #[test]
    fn never_panics_on_option_names(
        query in "((labelSelector|fieldSelector|watch|limit|timeoutSeconds|resourceVersionMatch|sendInitialEvents|dryRun|fieldManager|force)=[a-zA-Z0-9%=,!()-]{0,10}&?){0,8}",
    ) {
        let none = HeaderMap::new();
        let _ = ListOptions::from_request(&query, &none);
        let _ = PatchOptions::from_request(&query, &content_type("application/merge-patch+json"));
    }
}

#[test]
fn patch_options_among_the_types_an_endpoint_takes() {
    // The `scale` subresource's types: a strategic merge patch, and no apply.
    let scale = [
        PatchType::JsonPatch,
        PatchType::MergePatch,
        PatchType::StrategicMergePatch,
    ];
    let options = PatchOptions::from_request_among(
        "dryRun=All",
        &content_type("application/strategic-merge-patch+json"),
        &scale,
    )
    .unwrap();
    assert_eq!(options.patch_type, PatchType::StrategicMergePatch);
    assert!(options.dry_run);
    let err =
        PatchOptions::from_request_among("", &content_type("application/apply-patch+yaml"), &scale)
            .unwrap_err();
    assert_eq!(err.reason(), Reason::UnsupportedMediaType);
    assert_eq!(
        err.message(),
        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json"
    );
}
