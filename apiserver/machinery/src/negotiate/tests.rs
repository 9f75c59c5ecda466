use http::HeaderValue;
use proptest::prelude::*;

use super::*;

const KUBECTL_GET: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
const METADATA_LIST: &str = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
const METADATA_WATCH: &str = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";
const AGGREGATOR: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";

fn headers(pairs: &[(http::HeaderName, &str)]) -> HeaderMap {
    pairs
        .iter()
        .map(|(k, v)| (k.clone(), HeaderValue::from_str(v).unwrap()))
        .collect()
}

fn resource(accept: &str) -> Result<Negotiated, ApiError> {
    Negotiated::for_resource(&headers(&[(ACCEPT, accept)]), None)
}

#[test]
fn resource_targets() {
    use MetaVersion::*;
    use Target::*;
    let cases = [
        ("", Object, Format::Json),
        ("*/*", Object, Format::Json),
        ("application/*", Object, Format::Json),
        ("application/json", Object, Format::Json),
        ("application/yaml", Object, Format::Yaml),
        ("application/json, */*", Object, Format::Json),
        (KUBECTL_GET, Table(V1), Format::Json),
        (
            "application/json;as=Table;v=v1beta1;g=meta.k8s.io",
            Table(V1beta1),
            Format::Json,
        ),
        (
            "application/yaml;as=Table;v=v1;g=meta.k8s.io",
            Table(V1),
            Format::Yaml,
        ),
        (METADATA_LIST, PartialObjectMetadataList(V1), Format::Json),
        (METADATA_WATCH, PartialObjectMetadata(V1), Format::Json),
        // An unknown conversion is skipped for the next clause.
        (
            "application/json;as=Foo;g=meta.k8s.io;v=v1,application/json",
            Object,
            Format::Json,
        ),
        (
            "application/json;as=Table;g=example.com;v=v1,application/yaml",
            Object,
            Format::Yaml,
        ),
        (
            "application/json;v=v1,application/yaml",
            Object,
            Format::Yaml,
        ),
        // Parameters we do not know are ignored.
        (
            "application/json;charset=utf-8;profile=x",
            Object,
            Format::Json,
        ),
        // q orders clauses; a malformed q is 0 but still a candidate.
        (
            "application/yaml;q=0.5, application/json",
            Object,
            Format::Json,
        ),
        (
            "application/json;q=0.1,application/yaml",
            Object,
            Format::Yaml,
        ),
        ("application/json;q=x", Object, Format::Json),
        // goautoneg's comparison puts a specific type before a wildcard whatever the q.
        ("*/*;q=1, application/yaml;q=0.5", Object, Format::Yaml),
        ("application/json;stream=watch", Object, Format::Json),
        (
            "application/yaml;stream=watch,application/json",
            Object,
            Format::Json,
        ),
        ("application/json;sv=v1", Object, Format::Json),
        (
            "application/json;sv=v2,application/yaml",
            Object,
            Format::Yaml,
        ),
    ];
    for (accept, target, format) in cases {
        let negotiated = resource(accept).unwrap_or_else(|e| panic!("{accept:?}: {e}"));
        assert_eq!(
            (negotiated.target, negotiated.format),
            (target, format),
            "{accept:?}"
        );
    }
}

#[test]
fn metadata_conversion_must_fit() {
    use MetaVersion::V1;
    assert!(Target::PartialObjectMetadata(V1).check_fits(false).is_ok());
    assert!(
        Target::PartialObjectMetadataList(V1)
            .check_fits(true)
            .is_ok()
    );
    assert!(Target::Table(V1).check_fits(true).is_ok());
    assert!(Target::Object.check_fits(false).is_ok());
    let err = Target::PartialObjectMetadata(V1)
        .check_fits(true)
        .unwrap_err();
    assert_eq!(
        (err.reason(), err.message()),
        (
            Reason::NotAcceptable,
            "you requested PartialObjectMetadata, but the requested object is a list"
        )
    );
    let err = Target::PartialObjectMetadataList(V1)
        .check_fits(false)
        .unwrap_err();
    assert_eq!(
        err.message(),
        "you requested PartialObjectMetadataList, but the requested object is not a list"
    );
}

#[test]
fn not_acceptable() {
    for accept in [
        "application/vnd.kubernetes.protobuf",
        "text/html",
        " ",
        "application",
        "application/json;as=Foo;g=meta.k8s.io;v=v1",
        "application/json;as=APIGroupDiscoveryList;g=apidiscovery.k8s.io;v=v2",
        "application/json;stream=other",
    ] {
        let err = resource(accept).unwrap_err();
        assert_eq!(err.reason(), Reason::NotAcceptable, "{accept:?}");
        assert_eq!(
            err.message(),
            "only the following media types are accepted: application/json, application/yaml"
        );
    }
}

#[test]
fn pretty_printing() {
    let pretty = |pairs: &[(http::HeaderName, &str)], query: Option<&str>| {
        Negotiated::for_resource(&headers(pairs), query)
            .unwrap()
            .pretty
    };
    assert!(!pretty(&[], None));
    assert!(pretty(&[(ACCEPT, "application/json;pretty=1")], None));
    assert!(pretty(&[], Some("pretty=true")));
    assert!(pretty(&[], Some("pretty=1&limit=5")));
    assert!(!pretty(&[], Some("pretty=yes")));
    assert!(pretty(&[(USER_AGENT, "curl/8.5.0")], None));
    assert!(pretty(&[(USER_AGENT, "Mozilla/5.0 (X11)")], None));
    assert!(!pretty(&[(USER_AGENT, "kubectl/v1.35.0")], None));
    // An explicit value wins over the User-Agent; an empty one does not.
    assert!(!pretty(&[(USER_AGENT, "curl/8.5.0")], Some("pretty=false")));
    assert!(pretty(&[(USER_AGENT, "curl/8.5.0")], Some("pretty=")));
    // YAML has no compact form to leave.
    assert!(!pretty(
        &[(ACCEPT, "application/yaml;pretty=1")],
        Some("pretty=true")
    ));
}

#[test]
fn watch_streams_json_only() {
    let watch =
        |accept: &str| Negotiated::for_watch(&headers(&[(ACCEPT, accept), (USER_AGENT, "curl/8")]));
    let table = watch(KUBECTL_GET).unwrap();
    assert_eq!(table.target, Target::Table(MetaVersion::V1));
    assert!(!table.pretty);
    assert_eq!(
        watch(METADATA_WATCH).unwrap().target,
        Target::PartialObjectMetadata(MetaVersion::V1)
    );
    for accept in [
        "application/yaml",
        "application/yaml,application/json",
        "application/vnd.kubernetes.protobuf",
    ] {
        let err = watch(accept).unwrap_err();
        assert_eq!(err.reason(), Reason::NotAcceptable);
        assert_eq!(
            err.message(),
            "only the following media types are accepted: application/json;stream=watch"
        );
    }
}

#[test]
fn discovery() {
    let negotiate = |accept: &str| Discovery::negotiate(&headers(&[(ACCEPT, accept)]));
    let cases = [
        (
            AGGREGATOR,
            Discovery::Aggregated(DiscoveryVersion::V2, Format::Json),
        ),
        (
            "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json",
            Discovery::Aggregated(DiscoveryVersion::V2beta1, Format::Json),
        ),
        (
            "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            Discovery::Aggregated(DiscoveryVersion::V2, Format::Json),
        ),
        ("", Discovery::Legacy(Format::Json)),
        ("application/json", Discovery::Legacy(Format::Json)),
        ("*/*", Discovery::Legacy(Format::Json)),
        ("application/yaml", Discovery::Legacy(Format::Yaml)),
        (
            "application/json;g=apidiscovery.k8s.io;v=v2beta2;as=APIGroupDiscoveryList,application/json",
            Discovery::Legacy(Format::Json),
        ),
    ];
    for (accept, want) in cases {
        assert_eq!(negotiate(accept).unwrap(), want, "{accept:?}");
    }
    assert_eq!(DiscoveryVersion::V2beta1.as_str(), "v2beta1");
    // The answer an old aggregator needs to fall back (kubernetes/kubernetes#119662).
    for accept in [
        "application/json;g=apidiscovery.k8s.io;v=v2beta2;as=APIGroupDiscoveryList",
        "application/vnd.kubernetes.protobuf",
        "application/json;as=Table;g=meta.k8s.io;v=v1",
    ] {
        assert_eq!(
            negotiate(accept).unwrap_err().reason(),
            Reason::NotAcceptable,
            "{accept:?}"
        );
    }
}

#[test]
fn body_formats() {
    let format = |content_type: Option<&str>| {
        let map = content_type
            .map(|ct| headers(&[(CONTENT_TYPE, ct)]))
            .unwrap_or_default();
        body_format(&map)
    };
    assert_eq!(format(None).unwrap(), Format::Json);
    assert_eq!(format(Some("")).unwrap(), Format::Json);
    assert_eq!(format(Some("application/json")).unwrap(), Format::Json);
    assert_eq!(
        format(Some("application/json; charset=utf-8")).unwrap(),
        Format::Json
    );
    assert_eq!(format(Some("Application/YAML")).unwrap(), Format::Yaml);
    assert_eq!(format(Some("application/json;")).unwrap(), Format::Json);
    for bad in [
        "application/vnd.kubernetes.protobuf",
        "text/plain",
        "application/json;charset",
        "application/json;=x",
        "json",
        "application/json/x",
    ] {
        let err = format(Some(bad)).unwrap_err();
        assert_eq!(err.reason(), Reason::UnsupportedMediaType, "{bad:?}");
        assert_eq!(
            err.message(),
            "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml"
        );
    }
}

#[test]
fn patch_types() {
    let patch =
        |content_type: &str| PatchType::from_headers(&headers(&[(CONTENT_TYPE, content_type)]));
    assert_eq!(
        patch("application/merge-patch+json").unwrap(),
        PatchType::MergePatch
    );
    assert_eq!(
        patch("application/merge-patch+json; charset=utf-8").unwrap(),
        PatchType::MergePatch
    );
    assert_eq!(
        patch("application/json-patch+json").unwrap(),
        PatchType::JsonPatch
    );
    assert_eq!(
        patch("application/apply-patch+yaml").unwrap(),
        PatchType::Apply
    );
    for bad in [
        "application/strategic-merge-patch+json",
        "application/json",
        "",
        "APPLICATION/MERGE-PATCH+JSON",
        ";application/merge-patch+json",
    ] {
        let err = patch(bad).unwrap_err();
        assert_eq!(err.reason(), Reason::UnsupportedMediaType, "{bad:?}");
        assert_eq!(
            err.message(),
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
        );
    }
    assert_eq!(
        PatchType::from_headers(&HeaderMap::new())
            .unwrap_err()
            .reason(),
        Reason::UnsupportedMediaType
    );
}

#[test]
fn decode_and_encode() {
    let value: serde_json::Value = Format::Yaml.decode(b"a: 1\nb: [x]\n").unwrap();
    assert_eq!(value, serde_json::json!({"a": 1, "b": ["x"]}));
    let err = Format::Json.decode::<serde_json::Value>(b"{").unwrap_err();
    assert_eq!(err.reason(), Reason::BadRequest);
    assert!(
        err.message()
            .starts_with("error decoding the request body as JSON: "),
        "{}",
        err.message()
    );
    let value = serde_json::json!({"a": 1});
    assert_eq!(Format::Json.encode(&value, false).unwrap(), br#"{"a":1}"#);
    assert_eq!(
        Format::Json.encode(&value, true).unwrap(),
        b"{\n  \"a\": 1\n}"
    );
    assert_eq!(Format::Yaml.encode(&value, false).unwrap(), b"a: 1\n");
    assert_eq!(Format::Yaml.content_type(), "application/yaml");
}

#[test]
fn long_headers_sort_stably() {
    // More than 12 clauses take the O(n log n) path; the best q still wins.
    let mut accept: Vec<String> = (0..40)
        .map(|i| format!("text/t{i};q=0.{}", i % 9 + 1))
        .collect();
    accept.push("application/yaml;q=0.95".into());
    accept.push("application/json;q=0.9".into());
    let negotiated = resource(&accept.join(",")).unwrap();
    assert_eq!(negotiated.format, Format::Yaml);
}

proptest! {
    #[test]
    fn never_panics(accept in ".{0,200}", content_type in ".{0,60}", ua in "[ -~]{0,20}", query in ".{0,40}") {
        let mut map = HeaderMap::new();
        for (name, value) in [(ACCEPT, &accept), (CONTENT_TYPE, &content_type), (USER_AGENT, &ua)] {
            if let Ok(value) = HeaderValue::from_str(value) {
                map.insert(name, value);
            }
        }
        let _ = Negotiated::for_resource(&map, Some(&query));
        let _ = Negotiated::for_watch(&map);
        let _ = Discovery::negotiate(&map);
        let _ = body_format(&map);
        let _ = PatchType::from_headers(&map);
    }

    #[test]
    fn never_panics_on_accept_grammar(accept in "([a-z*/]{0,12}(;[a-z]{0,3}=[a-z0-9.*]{0,8}){0,3},?){0,20}") {
        let _ = resource(&accept);
    }
}
