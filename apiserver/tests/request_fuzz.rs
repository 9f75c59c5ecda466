//! Arbitrary requests through the whole in-process router: methods, paths built from the
//! API's own segments and random ones, queries, `Accept`/`Content-Type` and bodies (random
//! bytes, and valid objects and patches with random mutations). Whatever comes in, the
//! answer is a well-formed response, every error is a `Status` whose `code` is the HTTP
//! status, and nothing is a 500: a 500 is a server bug, as no part of this server is
//! documented to answer one for a request alone. A handler panic fails the test, as the
//! router runs here without the serving stack.
//!
//! `PROPTEST_CASES` sets the number of requests (2000 by default).

use battery_apiserver::testing as common;

use std::time::Duration;

use axum::body::Body;
use common::{Harness, POOLS, as_dev, pool, post};
use http::{HeaderValue, Method, Request, StatusCode, Uri, header};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{Value, json};
use tower::ServiceExt;

/// How long a 2xx body may take: a watch streams until its timeout, so an answer that is
/// still streaming then is taken as a watch and dropped.
const STREAM_WAIT: Duration = Duration::from_millis(100);

const GROUP_VERSION: &str = "/apis/battery.liquidmetal-x.dev/v1alpha1";

/// Segments the router and `RequestInfo` give meaning to, and names that may exist.
const SEGMENTS: &[&str] = &[
    "api",
    "apis",
    "v1",
    "battery.liquidmetal-x.dev",
    "v1alpha1",
    "namespaces",
    "default",
    "kube-system",
    "pools",
    "microvmclaims",
    "hosts",
    "status",
    "lease",
    "exec",
    "finalize",
    "watch",
    "proxy",
    "p",
    "c",
    "h",
    ".",
    "..",
    "%2F",
    "%ff",
    "%",
    "%zz",
    "a%20b",
    "openapi",
    "v2",
    "v3",
    "healthz",
    "version",
];

const QUERY_KEYS: &[&str] = &[
    "labelSelector",
    "fieldSelector",
    "watch",
    "allowWatchBookmarks",
    "resourceVersion",
    "resourceVersionMatch",
    "timeoutSeconds",
    "limit",
    "continue",
    "sendInitialEvents",
    "dryRun",
    "fieldManager",
    "fieldValidation",
    "force",
    "gracePeriodSeconds",
    "propagationPolicy",
    "orphanDependents",
    "includeObject",
    "pretty",
];

const QUERY_VALUES: &[&str] = &[
    "",
    "true",
    "false",
    "0",
    "1",
    "-1",
    "99999999999999999999",
    "All",
    "Exact",
    "NotOlderThan",
    "Strict",
    "Ignore",
    "Warn",
    "Object",
    "None",
    "Orphan",
    "Foreground",
    "app%3Dweb",
    "app+in+%28a%2Cb%29",
    "%21app",
    "app%21%3D",
    "a%2Cb%3D%3Dc",
    "metadata.name%3Dp",
    "metadata.namespace%21%3Ddefault%2Cspec.pool%3Dp",
    "spec.nosuch%3Dx",
    "eyJ2IjoxLCJhZnRlciI6WyJkZWZhdWx0IiwicCJdfQ",
    "%zz",
    "%",
];

const ACCEPTS: &[&str] = &[
    "application/json",
    "application/yaml",
    "*/*",
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    "application/json;as=Table;v=v1beta1;g=meta.k8s.io",
    "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json",
    "application/vnd.kubernetes.protobuf",
    "application/json;stream=watch",
    "application/json;q=0, application/yaml;q=0.5",
    "text/html;q=x",
];

const CONTENT_TYPES: &[&str] = &[
    "application/json",
    "application/yaml",
    "application/merge-patch+json",
    "application/json-patch+json",
    "application/apply-patch+yaml",
    "application/strategic-merge-patch+json",
    "application/vnd.kubernetes.protobuf",
    "application/json; charset=utf-8",
    ";application/json",
    "text/plain",
];

/// One of `known`, or a random string of `chars` (a regex character class).
fn known_or_random(known: &'static [&'static str], chars: &str) -> BoxedStrategy<String> {
    prop_oneof![
        3 => proptest::sample::select(known).prop_map(str::to_owned),
        1 => proptest::string::string_regex(&format!("{chars}{{0,16}}")).unwrap(),
    ]
    .boxed()
}

/// A header value: a known one, or any bytes a header value may hold.
fn header_value(known: &'static [&'static str]) -> impl Strategy<Value = Option<HeaderValue>> {
    let random =
        proptest::collection::vec(prop_oneof![Just(b'\t'), 0x20u8..0x7f, 0x80u8..=0xff], 0..40);
    proptest::option::weighted(
        0.8,
        prop_oneof![
            3 => proptest::sample::select(known).prop_map(|v| v.as_bytes().to_vec()),
            1 => random,
        ]
        .prop_map(|bytes| HeaderValue::from_bytes(&bytes).expect("header-safe bytes")),
    )
}

fn method() -> impl Strategy<Value = Method> {
    prop_oneof![
        Just(Method::GET),
        Just(Method::HEAD),
        Just(Method::POST),
        Just(Method::PUT),
        Just(Method::PATCH),
        Just(Method::DELETE),
        Just(Method::OPTIONS),
        Just(Method::from_bytes(b"WATCH").unwrap()),
    ]
}

/// A path: mostly a resource request (collection, object or subresource, each part
/// sometimes replaced at random), so that requests get past routing; sometimes segments
/// alone.
fn path() -> impl Strategy<Value = String> {
    let segment = || known_or_random(SEGMENTS, "[a-zA-Z0-9._~%+:@-]");
    let part = |known: &'static [&'static str]| {
        prop_oneof![
            4 => proptest::sample::select(known).prop_map(str::to_owned),
            1 => segment(),
        ]
    };
    let resource = (
        proptest::option::weighted(0.2, Just("watch/")),
        proptest::option::weighted(0.7, part(&["default", "kube-system"])),
        part(&["pools", "microvmclaims", "hosts"]),
        proptest::option::weighted(0.6, part(&["p", "c", "h"])),
        proptest::option::weighted(0.3, part(&["status", "lease", "exec"])),
    )
        .prop_map(|(watch, namespace, plural, name, subresource)| {
            let mut path = format!("{GROUP_VERSION}/{}", watch.unwrap_or_default());
            if let Some(namespace) = namespace {
                path += &format!("namespaces/{namespace}/");
            }
            path += &plural;
            for part in [name, subresource].into_iter().flatten() {
                path += &format!("/{part}");
            }
            path
        });
    prop_oneof![
        4 => resource,
        1 => proptest::collection::vec(segment(), 0..7)
            .prop_map(|segments| format!("/{}", segments.join("/"))),
    ]
}

fn query() -> impl Strategy<Value = Option<String>> {
    let pair = (
        known_or_random(QUERY_KEYS, "[a-zA-Z%]"),
        known_or_random(QUERY_VALUES, "[a-zA-Z0-9=!,()%+.-]"),
    )
        .prop_map(|(k, v)| format!("{k}={v}"));
    proptest::option::weighted(
        0.7,
        proptest::collection::vec(pair, 0..4).prop_map(|pairs| pairs.join("&")),
    )
}

/// A JSON value of any shape, small.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        known_or_random(SEGMENTS, "[a-z0-9./=-]").prop_map(Value::from),
    ];
    leaf.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
            proptest::collection::btree_map("[a-zA-Z]{1,8}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Documents the API takes: objects to create or update, merge patches, JSON patches.
fn valid_documents() -> Vec<Value> {
    vec![
        pool("p", 1),
        json!({"apiVersion": "battery.liquidmetal-x.dev/v1alpha1", "kind": "MicroVMClaim",
            "metadata": {"name": "c"}, "spec": {"poolRef": {"name": "p"}}}),
        json!({"apiVersion": "battery.liquidmetal-x.dev/v1alpha1", "kind": "Host",
            "metadata": {"name": "h"}, "spec": {"address": "127.0.0.1:9090"}}),
        json!({"metadata": {"labels": {"team": null, "tier": "a"}}, "spec": {"size": 2}}),
        json!([{"op": "replace", "path": "/spec/size", "value": 3},
               {"op": "test", "path": "/metadata/name", "value": "p"},
               {"op": "add", "path": "/metadata/finalizers/-", "value": "x"},
               {"op": "copy", "from": "/spec/template", "path": "/spec/x"},
               {"op": "move", "from": "/spec/x", "path": "/metadata/y"}]),
        json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground",
            "preconditions": {"uid": "u"}}),
    ]
}

/// Every JSON pointer in `value`, including its root.
fn pointers(value: &Value, at: String, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                pointers(
                    child,
                    format!("{at}/{}", key.replace('~', "~0").replace('/', "~1")),
                    out,
                );
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                pointers(child, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
    out.push(at);
}

/// A valid document with some of its values replaced by random ones.
fn mutated_document() -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::sample::select(valid_documents()),
        proptest::collection::vec((any::<proptest::sample::Index>(), json_value()), 0..3),
    )
        .prop_map(|(mut document, mutations)| {
            for (index, replacement) in mutations {
                let mut all = Vec::new();
                pointers(&document, String::new(), &mut all);
                let target = index.get(&all);
                if let Some(slot) = document.pointer_mut(target) {
                    *slot = replacement;
                }
            }
            document.to_string().into_bytes()
        })
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => Just(Vec::new()),
        2 => proptest::collection::vec(any::<u8>(), 0..64),
        // Valid JSON cut short, and YAML.
        1 => (mutated_document(), any::<proptest::sample::Index>())
            .prop_map(|(bytes, cut)| bytes[..cut.index(bytes.len() + 1)].to_vec()),
        1 => Just(b"apiVersion: battery.liquidmetal-x.dev/v1alpha1\nkind: Pool\nmetadata:\n  name: y\nspec:\n  size: 1\n".to_vec()),
        5 => mutated_document(),
    ]
}

#[derive(Debug)]
struct Case {
    method: Method,
    uri: String,
    accept: Option<HeaderValue>,
    content_type: Option<HeaderValue>,
    body: Vec<u8>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        method(),
        path(),
        query(),
        header_value(ACCEPTS),
        header_value(CONTENT_TYPES),
        body(),
    )
        .prop_map(|(method, path, query, accept, content_type, body)| Case {
            method,
            uri: match query {
                Some(query) => format!("{path}?{query}"),
                None => path,
            },
            accept,
            content_type,
            body,
        })
}

async fn check(h: &Harness, case: Case) -> Result<(), TestCaseError> {
    // Only URIs a client could send: the strategies also make some `http` refuses.
    let Ok(uri) = case.uri.parse::<Uri>() else {
        return Ok(());
    };
    let mut request = Request::builder().method(case.method.clone()).uri(uri);
    if let Some(accept) = case.accept {
        request = request.header(header::ACCEPT, accept);
    }
    if let Some(content_type) = case.content_type {
        request = request.header(header::CONTENT_TYPE, content_type);
    }
    let request = as_dev(request.body(Body::from(case.body)).unwrap());
    let response = h.router().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    prop_assert!(
        status.as_u16() >= 200,
        "an informational status {status} is not an answer"
    );
    prop_assert_ne!(status, StatusCode::INTERNAL_SERVER_ERROR);

    let body = tokio::time::timeout(
        STREAM_WAIT,
        axum::body::to_bytes(response.into_body(), usize::MAX),
    )
    .await;
    let body = match body {
        Ok(body) => body.map_err(|e| TestCaseError::fail(format!("body error: {e}")))?,
        Err(_) => {
            prop_assert!(status.is_success(), "a {status} still streaming");
            return Ok(());
        }
    };
    // The `Content-Length` of a HEAD is that of the GET.
    if let Some(length) = headers.get(header::CONTENT_LENGTH)
        && case.method != Method::HEAD
    {
        let length = length.to_str().ok().and_then(|l| l.parse::<usize>().ok());
        prop_assert_eq!(length, Some(body.len()));
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if status.is_success() {
        // A JSON body: one document, or the events of a watch that ended, one a line.
        if content_type == "application/json" && case.method != Method::HEAD {
            let documents = serde_json::Deserializer::from_slice(&body).into_iter::<Value>();
            for document in documents {
                prop_assert!(
                    document.is_ok(),
                    "a {status} with a JSON body that is not JSON"
                );
            }
        }
        return Ok(());
    }
    // 304 and answers to HEAD have no body by definition.
    if status == StatusCode::NOT_MODIFIED || case.method == Method::HEAD {
        return Ok(());
    }
    prop_assert_eq!(content_type, "application/json");
    let status_body: Value = serde_json::from_slice(&body)
        .map_err(|e| TestCaseError::fail(format!("a {status} whose body is not JSON: {e}")))?;
    prop_assert_eq!(&status_body["kind"], "Status", "{}", status_body);
    prop_assert_eq!(&status_body["apiVersion"], "v1", "{}", status_body);
    prop_assert_eq!(&status_body["status"], "Failure", "{}", status_body);
    prop_assert_eq!(
        status_body["code"].as_u64(),
        Some(u64::from(status.as_u16())),
        "{}",
        status_body
    );
    Ok(())
}

#[test]
fn no_request_panics_or_answers_anything_but_a_status() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let h = runtime.block_on(Harness::start());
    // Objects for the paths' names to find, so gets, updates and patches reach storage.
    let (status, _, _) = runtime.block_on(h.send(post(POOLS, &pool("p", 0))));
    assert_eq!(status, StatusCode::CREATED);
    // A request takes about 2 ms here, so the default run sends more than proptest's
    // default 256; `PROPTEST_CASES` still decides when it is set.
    let defaults = Config::default();
    let cases = match std::env::var_os("PROPTEST_CASES") {
        Some(_) => defaults.cases,
        None => 2000,
    };
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..defaults
    });
    runner
        .run(&case(), |case| runtime.block_on(check(&h, case)))
        .unwrap();
}
