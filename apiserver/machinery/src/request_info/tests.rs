//! The URL tables of `apiserver:pkg/endpoints/request/requestinfo_test.go`, plus our
//! group's paths and the per-segment decoding.

use proptest::prelude::*;

use super::*;
use crate::status::Reason;

fn parse(method: Method, url: &str) -> RequestInfo {
    let (path, query) = match url.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (url, None),
    };
    RequestInfo::parse(&method, path, query).unwrap_or_else(|e| panic!("{url}: {e}"))
}

/// method, url, verb, prefix, group, version, namespace, resource, subresource, name, parts
type Row = (
    Method,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static [&'static str],
);

#[test]
fn resource_requests() {
    #[rustfmt::skip]
    let cases: &[Row] = &[
        (Method::GET, "/api/v1/namespaces", "list", "api", "", "v1", "", "namespaces", "", "", &["namespaces"]),
        (Method::GET, "/api/v1/namespaces/other", "get", "api", "", "v1", "other", "namespaces", "", "other", &["namespaces", "other"]),
        (Method::GET, "/api/v1/namespaces/other/pods", "list", "api", "", "v1", "other", "pods", "", "", &["pods"]),
        (Method::GET, "/api/v1/namespaces/other/pods/foo", "get", "api", "", "v1", "other", "pods", "", "foo", &["pods", "foo"]),
        (Method::HEAD, "/api/v1/namespaces/other/pods/foo", "get", "api", "", "v1", "other", "pods", "", "foo", &["pods", "foo"]),
        (Method::GET, "/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "", &["pods"]),
        (Method::HEAD, "/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "", &["pods"]),
        // special verbs
        (Method::GET, "/api/v1/proxy/namespaces/other/pods/foo", "proxy", "api", "", "v1", "other", "pods", "", "foo", &["pods", "foo"]),
        (Method::GET, "/api/v1/proxy/namespaces/other/pods/foo/subpath/not/a/subresource", "proxy", "api", "", "v1", "other", "pods", "", "foo", &["pods", "foo", "subpath", "not", "a", "subresource"]),
        (Method::GET, "/api/v1/watch/pods", "watch", "api", "", "v1", "", "pods", "", "", &["pods"]),
        (Method::GET, "/api/v1/pods?watch=true", "watch", "api", "", "v1", "", "pods", "", "", &["pods"]),
        (Method::GET, "/api/v1/pods?watch=false", "list", "api", "", "v1", "", "pods", "", "", &["pods"]),
        (Method::GET, "/api/v1/watch/namespaces/other/pods", "watch", "api", "", "v1", "other", "pods", "", "", &["pods"]),
        (Method::GET, "/api/v1/namespaces/other/pods?watch=1", "watch", "api", "", "v1", "other", "pods", "", "", &["pods"]),
        (Method::GET, "/api/v1/namespaces/other/pods?watch=0", "list", "api", "", "v1", "other", "pods", "", "", &["pods"]),
        // subresource identification
        (Method::GET, "/api/v1/namespaces/other/pods/foo/status", "get", "api", "", "v1", "other", "pods", "status", "foo", &["pods", "foo", "status"]),
        (Method::GET, "/api/v1/namespaces/other/pods/foo/proxy/subpath", "get", "api", "", "v1", "other", "pods", "proxy", "foo", &["pods", "foo", "proxy", "subpath"]),
        (Method::PUT, "/api/v1/namespaces/other/finalize", "update", "api", "", "v1", "other", "namespaces", "finalize", "other", &["namespaces", "other", "finalize"]),
        (Method::PUT, "/api/v1/namespaces/other/status", "update", "api", "", "v1", "other", "namespaces", "status", "other", &["namespaces", "other", "status"]),
        // verb identification
        (Method::PATCH, "/api/v1/namespaces/other/pods/foo", "patch", "api", "", "v1", "other", "pods", "", "foo", &["pods", "foo"]),
        (Method::DELETE, "/api/v1/namespaces/other/pods/foo", "delete", "api", "", "v1", "other", "pods", "", "foo", &["pods", "foo"]),
        (Method::POST, "/api/v1/namespaces/other/pods", "create", "api", "", "v1", "other", "pods", "", "", &["pods"]),
        (Method::OPTIONS, "/api/v1/namespaces/other/pods", "", "api", "", "v1", "other", "pods", "", "", &["pods"]),
        // deletecollection verb identification
        (Method::DELETE, "/api/v1/nodes", "deletecollection", "api", "", "v1", "", "nodes", "", "", &["nodes"]),
        (Method::DELETE, "/api/v1/namespaces", "deletecollection", "api", "", "v1", "", "namespaces", "", "", &["namespaces"]),
        (Method::DELETE, "/api/v1/namespaces/other/pods", "deletecollection", "api", "", "v1", "other", "pods", "", "", &["pods"]),
        (Method::DELETE, "/apis/extensions/v1/namespaces/other/pods", "deletecollection", "apis", "extensions", "v1", "other", "pods", "", "", &["pods"]),
        // api group and version identification
        (Method::POST, "/apis/extensions/v1/namespaces/other/pods", "create", "apis", "extensions", "v1", "other", "pods", "", "", &["pods"]),
        (Method::POST, "/apis/extensions/v1beta3/namespaces/other/pods", "create", "apis", "extensions", "v1beta3", "other", "pods", "", "", &["pods"]),
        // our group
        (Method::GET, "/apis/battery.liquidmetal-x.dev/v1alpha1/pools", "list", "apis", "battery.liquidmetal-x.dev", "v1alpha1", "", "pools", "", "", &["pools"]),
        (Method::GET, "/apis/battery.liquidmetal-x.dev/v1alpha1/hosts/h1/status", "get", "apis", "battery.liquidmetal-x.dev", "v1alpha1", "", "hosts", "status", "h1", &["hosts", "h1", "status"]),
        (Method::PUT, "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/ns/microvmclaims/c/lease", "update", "apis", "battery.liquidmetal-x.dev", "v1alpha1", "ns", "microvmclaims", "lease", "c", &["microvmclaims", "c", "lease"]),
        (Method::POST, "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/ns/microvmclaims/c/exec?command=sh&stdin=true", "create", "apis", "battery.liquidmetal-x.dev", "v1alpha1", "ns", "microvmclaims", "exec", "c", &["microvmclaims", "c", "exec"]),
        (Method::GET, "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/ns/microvmclaims/c/exec", "get", "apis", "battery.liquidmetal-x.dev", "v1alpha1", "ns", "microvmclaims", "exec", "c", &["microvmclaims", "c", "exec"]),
        // a WebSocket upgrade of pods/exec is a GET (authorization makes it create)
        (Method::GET, "/api/v1/namespaces/ns/pods/p/exec?command=ls", "get", "api", "", "v1", "ns", "pods", "exec", "p", &["pods", "p", "exec"]),
        (Method::GET, "/api/v1/namespaces/ns/pods/p/log", "get", "api", "", "v1", "ns", "pods", "log", "p", &["pods", "p", "log"]),
        // trailing slashes are trimmed; inner empty segments are kept
        (Method::GET, "/apis/battery.liquidmetal-x.dev/v1alpha1/pools/", "list", "apis", "battery.liquidmetal-x.dev", "v1alpha1", "", "pools", "", "", &["pools"]),
        (Method::GET, "/apis/g/v/namespaces//pools", "list", "apis", "g", "v", "", "pools", "", "", &["pools"]),
        // a segment is decoded on its own, as axum's Path extractor decodes it
        (Method::GET, "/apis/g/v/namespaces/a%2Fb/pools/c%20d", "get", "apis", "g", "v", "a/b", "pools", "", "c d", &["pools", "c d"]),
    ];
    for &(
        ref method,
        url,
        verb,
        prefix,
        group,
        version,
        namespace,
        resource,
        subresource,
        name,
        parts,
    ) in cases
    {
        let info = parse(method.clone(), url);
        assert!(info.is_resource_request, "{url}");
        assert_eq!(info.verb, verb, "verb of {method} {url}");
        assert_eq!(info.api_prefix, prefix, "prefix of {url}");
        assert_eq!(info.api_group, group, "group of {url}");
        assert_eq!(info.api_version, version, "version of {url}");
        assert_eq!(info.namespace, namespace, "namespace of {url}");
        assert_eq!(info.resource, resource, "resource of {url}");
        assert_eq!(info.subresource, subresource, "subresource of {url}");
        assert_eq!(info.name, name, "name of {url}");
        assert_eq!(info.parts, parts, "parts of {url}");
    }
}

#[test]
fn non_resource_requests() {
    let cases = [
        ("/", false),
        ("", false),
        ("/api", false),
        ("/api/version", false),
        ("/api/version/", false),
        ("/apis", false),
        ("/apis/group/version/", false),
        ("/apis/extensions/v1beta1", false),
        ("/apis/version/resource", false),
        ("/badprefix/version/resource", false),
        ("/not-api/version/resource", false),
        ("/healthz", false),
        ("/openapi/v3/apis/battery.liquidmetal-x.dev/v1alpha1", false),
        ("/api/version/resource", true),
        ("/apis/group/version/resource/name/subresource", true),
        ("/api/version/resource/name/subresource", true),
        ("/apis/batch/v1/job", true),
        ("/apis/batch/v1/job/foo", true),
        ("/apis/batch/v1/job/foo/scale", true),
    ];
    for (url, resource) in cases {
        let info = parse(Method::GET, url);
        assert_eq!(info.is_resource_request, resource, "{url}");
        if !resource {
            assert_eq!(info.verb, "get", "{url}");
            assert_eq!(info.path, url, "{url}");
            assert_eq!(info.resource_verb(), None);
        }
    }
    assert_eq!(parse(Method::POST, "/healthz").verb, "post");
}

#[test]
fn selectors() {
    // name, method, url, name, verb, fieldSelector, labelSelector
    #[rustfmt::skip]
    let cases = [
        (Method::GET, "/apis/group/version/resource", "", "list", "", ""),
        (Method::GET, "/apis/group/version/resource?fieldSelector=metadata.name=name1", "name1", "list", "metadata.name=name1", ""),
        (Method::GET, "/apis/group/version/resource?watch=true&fieldSelector=metadata.name=name1", "name1", "watch", "metadata.name=name1", ""),
        (Method::GET, "/apis/group/version/resource?fieldSelector=foo=bar&labelSelector=baz=qux", "", "list", "foo=bar", "baz=qux"),
        // an invalid selector loses the name, not the watch
        (Method::GET, "/apis/group/version/resource?fieldSelector=metadata.name=name1,foo", "", "list", "metadata.name=name1,foo", ""),
        (Method::GET, "/apis/group/version/resource?fieldSelector=metadata.name=name1,foo&watch=true", "", "watch", "metadata.name=name1,foo", ""),
        (Method::GET, "/apis/group/version/resource?fieldSelector=metadata.name=name1,foo&watch=false", "", "list", "metadata.name=name1,foo", ""),
        (Method::GET, "/apis/group/version/resource?limit=x&watch=TRUE&fieldSelector=metadata.name=n", "", "watch", "metadata.name=n", ""),
        (Method::GET, "/apis/group/version/resource?labelSelector=-bad&fieldSelector=metadata.name=n", "", "list", "metadata.name=n", "-bad"),
        (Method::DELETE, "/apis/group/version/resource?fieldSelector=foo=bar&labelSelector=baz=qux", "", "deletecollection", "foo=bar", "baz=qux"),
        (Method::GET, "/apis/group/version/resource?fieldSelector=metadata.name=foo&fieldSelector=metadata.name=bar&labelSelector=foo=bar&labelSelector=foo=baz", "foo", "list", "metadata.name=foo", "foo=bar"),
        (Method::GET, "/apis/group/version/resource/name?fieldSelector=foo=bar&labelSelector=foo=bar", "name", "get", "", ""),
        (Method::GET, "/apis/group/version/watch/resource?fieldSelector=metadata.name=foo&labelSelector=foo=bar", "", "watch", "", ""),
        (Method::GET, "/apis/group/version/watch/resource/name?fieldSelector=metadata.name=foo&labelSelector=foo=bar", "name", "watch", "", ""),
        // a name that is not a path segment is not taken from the selector
        (Method::GET, "/apis/group/version/resource?fieldSelector=metadata.name=..", "", "list", "metadata.name=..", ""),
        (Method::GET, "/apis/group/version/resource?fieldSelector=metadata.name=a%2Fb", "", "list", "metadata.name=a/b", ""),
        (Method::GET, "/apis/group/version/resource?fieldSelector=metadata.name!=a", "", "list", "metadata.name!=a", ""),
    ];
    for (method, url, name, verb, fields, labels) in cases {
        let info = parse(method, url);
        assert_eq!(info.name, name, "name of {url}");
        assert_eq!(info.verb, verb, "verb of {url}");
        assert_eq!(info.field_selector, fields, "fieldSelector of {url}");
        assert_eq!(info.label_selector, labels, "labelSelector of {url}");
    }
}

#[test]
fn a_get_opening_a_stream_is_authorized_as_create_and_nothing_else_changes() {
    let authorized =
        |method: Method, url: &str| parse(method, url).for_authorization().verb.clone();
    let exec =
        "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/ns/microvmclaims/c/exec?command=ls";
    assert_eq!(authorized(Method::GET, exec), "create");
    assert_eq!(authorized(Method::POST, exec), "create");
    assert_eq!(
        authorized(Method::GET, "/api/v1/namespaces/ns/pods/p/attach"),
        "create"
    );
    assert_eq!(
        authorized(Method::GET, "/api/v1/namespaces/ns/pods/p/log"),
        "get"
    );
    assert_eq!(
        authorized(
            Method::GET,
            "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/ns/microvmclaims/c/lease"
        ),
        "get"
    );
    let info = parse(Method::GET, exec);
    assert_eq!(info.for_authorization().subresource, "exec");
    assert_eq!(
        info.verb, "get",
        "the request itself keeps kube-apiserver's verb"
    );
}

#[test]
fn resource_verbs() {
    let verb = |method: Method, url: &str| parse(method, url).resource_verb();
    assert_eq!(verb(Method::GET, "/apis/g/v/pools"), Some(Verb::List));
    assert_eq!(
        verb(Method::GET, "/apis/g/v/pools?watch=1"),
        Some(Verb::Watch)
    );
    assert_eq!(verb(Method::GET, "/apis/g/v/pools/x"), Some(Verb::Get));
    assert_eq!(verb(Method::POST, "/apis/g/v/pools"), Some(Verb::Create));
    assert_eq!(verb(Method::PUT, "/apis/g/v/pools/x"), Some(Verb::Update));
    assert_eq!(verb(Method::PATCH, "/apis/g/v/pools/x"), Some(Verb::Patch));
    assert_eq!(
        verb(Method::DELETE, "/apis/g/v/pools/x"),
        Some(Verb::Delete)
    );
    assert_eq!(
        verb(Method::DELETE, "/apis/g/v/pools"),
        Some(Verb::DeleteCollection)
    );
    assert_eq!(verb(Method::GET, "/apis/g/v/proxy/pools/x"), None);
    assert_eq!(verb(Method::OPTIONS, "/apis/g/v/pools"), None);
}

#[test]
fn errors() {
    let cases = [
        (
            "/apis/g/v/watch",
            None,
            "unable to determine kind and namespace from url, /apis/g/v/watch",
        ),
        (
            "/api/v1/proxy",
            Some("a=b"),
            "unable to determine kind and namespace from url, /api/v1/proxy?a=b",
        ),
        (
            "/apis/g/v/pools/%zz",
            None,
            "invalid URL path: \"/apis/g/v/pools/%zz\"",
        ),
        (
            "/apis/g/v/pools/%ff",
            None,
            "invalid URL path: \"/apis/g/v/pools/%ff\"",
        ),
    ];
    for (path, query, want) in cases {
        let err = RequestInfo::parse(&Method::GET, path, query).unwrap_err();
        assert_eq!(err.reason(), Reason::BadRequest, "{path}");
        assert_eq!(err.message(), want, "{path}");
    }
}

proptest! {
    #[test]
    fn never_panics(
        method in prop_oneof![Just(Method::GET), Just(Method::DELETE), Just(Method::POST), Just(Method::PATCH)],
        path in "(/(api|apis|watch|proxy|namespaces|[a-z%0-9.]{0,6}|status|finalize)){0,9}/?",
        query in proptest::option::of("[a-zA-Z=&%,.!()0-9]{0,40}"),
    ) {
        if let Ok(info) = RequestInfo::parse(&method, &path, query.as_deref()) {
            prop_assert!(info.is_resource_request || info.parts.is_empty());
            prop_assert!(info.name.is_empty() || info.is_resource_request);
        }
    }

    #[test]
    fn never_panics_on_anything(path in ".{0,80}", query in proptest::option::of(".{0,80}")) {
        let _ = RequestInfo::parse(&Method::GET, &path, query.as_deref());
    }
}
