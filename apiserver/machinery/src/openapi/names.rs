//! The names the documents share: where each dialect keeps its schemas, the extension
//! that ties a schema to its kind, a kind's group-version-kind and definition names (Go's
//! and a CRD's), and which subresources are connects. Below the schemas, the paths and
//! the renderers, which all name them.

use battery_types::SubresourceInfo;
use k8s_openapi::schemars::JsonSchema;
use serde_json::{Value, json};

/// Where a v3 document keeps its schemas.
pub(super) const COMPONENTS: &str = "#/components/schemas/";
/// Where a Swagger 2.0 document keeps its schemas.
pub(super) const DEFINITIONS: &str = "#/definitions/";

/// The extension that names the kinds a schema (or an operation) is of.
pub(super) const GVK_EXTENSION: &str = "x-kubernetes-group-version-kind";

/// A group, version and kind.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Gvk {
    pub(super) group: String,
    pub(super) version: String,
    pub(super) kind: String,
}

impl Gvk {
    pub(super) fn new(group: &str, version: &str, kind: &str) -> Self {
        Self {
            group: group.to_owned(),
            version: version.to_owned(),
            kind: kind.to_owned(),
        }
    }

    pub(super) fn to_json(&self) -> Value {
        json!({ "group": self.group, "version": self.version, "kind": self.kind })
    }
}

/// The definition name of a type, as k8s-openapi (and so kube-apiserver) names it.
pub(super) fn name_of<T: JsonSchema>() -> String {
    T::schema_name().into_owned()
}

/// The definition name kube-apiserver gives a kind with no Go package, such as a CRD's:
/// `<group reversed>.<version>.<kind>` (`kube-openapi:pkg/util/util.go`
/// `ToRESTFriendlyName`, applied in
/// `apiextensions-apiserver:pkg/controller/openapi/builder/builder.go`).
pub(super) fn rest_friendly_name(group: &str, version: &str, kind: &str) -> String {
    let reversed: Vec<&str> = group.rsplit('.').collect();
    format!("{}.{version}.{kind}", reversed.join("."))
}

/// Whether `sub` is a connect subresource (exec, attach, proxy) rather than a view of an
/// object. Kubernetes names the kind of every connect subresource after the options its
/// query parameters decode into (`PodExecOptions`, `PodAttachOptions`, `NodeProxyOptions`:
/// `rest.Connecter.NewConnectOptions` in `apiserver:pkg/registry/rest/rest.go`), and the
/// resource table follows that convention (`MicroVMClaimExecOptions`).
pub(super) fn is_connect(sub: &SubresourceInfo) -> bool {
    sub.kind.ends_with("Options")
}
