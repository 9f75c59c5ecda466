//! The operations of a group-version, derived from `ResourceInfo` as
//! `apiserver:pkg/endpoints/installer.go` derives them from a storage's capabilities, in a
//! form that renders to either OpenAPI 3.0 or Swagger 2.0.

use battery_types::{ResourceInfo, Scope, SubresourceInfo, Verb};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    APIResourceList, DeleteOptions, Patch, Status,
};

use super::error::OpenApiError;
use super::names::{Gvk, is_connect, name_of, rest_friendly_name};
use super::query::{self, QueryParam};
use super::schemas::Components;

/// An HTTP method of an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Method {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

impl Method {
    /// The key of the operation in a path item.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Get => "get",
            Self::Post => "post",
            Self::Put => "put",
            Self::Patch => "patch",
            Self::Delete => "delete",
        }
    }
}

/// One path and its operations.
pub(super) struct PathItem {
    pub(super) path: String,
    /// Whether the path has a `{namespace}` segment.
    pub(super) namespaced: bool,
    /// The kind named by the `{name}` segment, if the path has one.
    pub(super) name_of: Option<String>,
    pub(super) operations: Vec<Operation>,
}

/// One operation.
pub(super) struct Operation {
    pub(super) method: Method,
    /// `x-kubernetes-action`; the group-version's own resource list has none.
    pub(super) action: Option<&'static str>,
    pub(super) id: String,
    pub(super) description: String,
    /// `x-kubernetes-group-version-kind` of the object the operation serves.
    pub(super) gvk: Option<Gvk>,
    pub(super) query: &'static [&'static QueryParam],
    pub(super) body: Option<RequestBody>,
    pub(super) responses: Vec<Reply>,
    /// Response media types.
    pub(super) produces: &'static [&'static str],
}

/// The request body of an operation: a definition in one of `content_types`.
pub(super) struct RequestBody {
    pub(super) schema: String,
    pub(super) content_types: &'static [&'static str],
    pub(super) required: bool,
}

/// One response of an operation.
pub(super) struct Reply {
    pub(super) code: &'static str,
    pub(super) description: &'static str,
    pub(super) payload: Payload,
}

/// What a response carries.
pub(super) enum Payload {
    Nothing,
    Definition(String),
    /// A stream of bytes, as a `connect` operation answers.
    Text,
}

/// Media types of object bodies.
const JSON: &[&str] = &["application/json"];
/// Responses of list operations, which turn into a watch with `?watch=true`.
const JSON_AND_WATCH: &[&str] = &["application/json", "application/json;stream=watch"];
/// The PATCH body types served. Strategic merge patch is deliberately absent: when an
/// operation lists it, `kubectl apply` computes a strategic merge patch
/// (`kubectl:pkg/cmd/apply/patcher.go`), which needs Go struct tags we do not have.
pub(super) const PATCH_TYPES: &[&str] = &[
    "application/apply-patch+yaml",
    "application/json-patch+json",
    "application/merge-patch+json",
];
/// The PATCH body types of a subresource that takes strategic merge patches (`scale`), as
/// its handler serves them: a Scale has no list for kubectl to merge by key.
const STRATEGIC_PATCH_TYPES: &[&str] = &[
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
];
/// What a connect (exec) operation speaks: an upgraded stream of any type.
const ANY: &[&str] = &["*/*"];

/// The operation-ID infix and tag of a group-version, as Go's `GetOperationIDAndTags`
/// (`apiserver:pkg/endpoints/openapi/openapi.go`) makes them: `BatteryLiquidmetalXDevV1alpha1`
/// and `batteryLiquidmetalXDev_v1alpha1`.
pub(super) fn operation_naming(group: &str, version: &str) -> (String, String) {
    let group = group.strip_suffix(".k8s.io").unwrap_or(group);
    let infix = format!(
        "{}{}",
        valid_operation_id(group, true),
        valid_operation_id(version, true)
    );
    let tag = format!(
        "{}_{}",
        valid_operation_id(group, false),
        valid_operation_id(version, false)
    );
    (infix, tag)
}

/// Go's `ToValidOperationID`: letters and `_` kept, digits kept after the first character,
/// anything else dropped and the next kept character upper-cased.
fn valid_operation_id(text: &str, capitalize_first: bool) -> String {
    let mut out = String::with_capacity(text.len());
    let mut capitalize = capitalize_first;
    for (index, c) in text.chars().enumerate() {
        if c.is_alphabetic() || c == '_' || (index != 0 && c.is_numeric()) {
            if capitalize {
                out.extend(c.to_uppercase());
                capitalize = false;
            } else {
                out.push(c);
            }
        } else {
            capitalize = true;
        }
    }
    out
}

fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map(|first| first.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// Every path of the group-version, in the order the document lists them.
pub(super) fn build(
    group: &str,
    version: &str,
    kinds: &[&ResourceInfo],
    components: &Components,
) -> Result<Vec<PathItem>, OpenApiError> {
    let (infix, _) = operation_naming(group, version);
    let base = format!("/apis/{group}/{version}");
    let mut items = vec![PathItem {
        path: format!("{base}/"),
        namespaced: false,
        name_of: None,
        operations: vec![Operation {
            method: Method::Get,
            action: None,
            id: format!("get{infix}APIResources"),
            description: "get available resources".to_owned(),
            gvk: None,
            query: &[],
            body: None,
            responses: ok(name_of::<APIResourceList>()),
            produces: JSON,
        }],
    }];
    for info in kinds {
        Resource::new(info, &base, &infix).paths(components, &mut items)?;
    }
    items.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(items)
}

/// Naming shared by the paths of one resource.
struct Resource<'a> {
    info: &'a ResourceInfo,
    infix: &'a str,
    namespaced: bool,
    /// `/apis/<g>/<v>[/namespaces/{namespace}]/<plural>`.
    collection: String,
    /// `/apis/<g>/<v>/<plural>`, the list across namespaces.
    all_namespaces: String,
    /// `Namespaced<Kind>` or `<Kind>`, the operation-ID suffix.
    scoped_kind: String,
    gvk: Gvk,
    definition: String,
}

impl<'a> Resource<'a> {
    fn new(info: &'a ResourceInfo, base: &str, infix: &'a str) -> Self {
        let namespaced = info.scope == Scope::Namespaced;
        let (collection, scoped_kind) = if namespaced {
            (
                format!("{base}/namespaces/{{namespace}}/{}", info.plural),
                format!("Namespaced{}", info.kind),
            )
        } else {
            (format!("{base}/{}", info.plural), info.kind.to_owned())
        };
        Self {
            info,
            infix,
            namespaced,
            collection,
            all_namespaces: format!("{base}/{}", info.plural),
            scoped_kind,
            gvk: Gvk::new(info.group, info.version, info.kind),
            definition: rest_friendly_name(info.group, info.version, info.kind),
        }
    }

    fn id(&self, verb: &str, rest: &str) -> String {
        format!("{verb}{}{rest}", self.infix)
    }

    fn operation(&self, method: Method, action: &'static str, id: String) -> Operation {
        Operation {
            method,
            action: Some(action),
            id,
            description: String::new(),
            gvk: Some(self.gvk.clone()),
            query: &[],
            body: None,
            responses: Vec::new(),
            produces: JSON,
        }
    }

    fn path(&self, path: String, named: bool, operations: Vec<Operation>) -> PathItem {
        PathItem {
            path,
            namespaced: self.namespaced,
            name_of: named.then(|| self.info.kind.to_owned()),
            operations,
        }
    }

    fn paths(
        &self,
        components: &Components,
        items: &mut Vec<PathItem>,
    ) -> Result<(), OpenApiError> {
        let info = self.info;
        let kind = info.kind;
        let has = |verb| info.has_verb(verb);
        let list = rest_friendly_name(info.group, info.version, &format!("{kind}List"));

        let mut collection = Vec::new();
        if has(Verb::List) {
            collection.push(Operation {
                description: format!("list or watch objects of kind {kind}"),
                query: query::LIST,
                responses: ok(list.clone()),
                produces: JSON_AND_WATCH,
                ..self.operation(Method::Get, "list", self.id("list", &self.scoped_kind))
            });
            if self.namespaced {
                let operation = Operation {
                    description: format!("list or watch objects of kind {kind}"),
                    query: query::LIST,
                    responses: ok(list),
                    produces: JSON_AND_WATCH,
                    ..self.operation(
                        Method::Get,
                        "list",
                        self.id("list", &format!("{kind}ForAllNamespaces")),
                    )
                };
                items.push(PathItem {
                    path: self.all_namespaces.clone(),
                    namespaced: false,
                    name_of: None,
                    operations: vec![operation],
                });
            }
        }
        if has(Verb::Create) {
            collection.push(Operation {
                description: format!("create a {kind}"),
                query: query::WRITE,
                body: Some(object_body(&self.definition)),
                responses: created(&self.definition, true),
                ..self.operation(Method::Post, "post", self.id("create", &self.scoped_kind))
            });
        }
        if has(Verb::DeleteCollection) {
            collection.push(Operation {
                description: format!("delete collection of {kind}"),
                query: query::DELETE_COLLECTION,
                body: Some(delete_body()),
                responses: ok(name_of::<Status>()),
                ..self.operation(
                    Method::Delete,
                    "deletecollection",
                    self.id("delete", &format!("Collection{}", self.scoped_kind)),
                )
            });
        }
        if !collection.is_empty() {
            items.push(self.path(self.collection.clone(), false, collection));
        }

        let mut item = Vec::new();
        if has(Verb::Get) {
            item.push(Operation {
                description: format!("read the specified {kind}"),
                responses: ok(self.definition.clone()),
                ..self.operation(Method::Get, "get", self.id("read", &self.scoped_kind))
            });
        }
        if has(Verb::Update) {
            item.push(Operation {
                description: format!("replace the specified {kind}"),
                query: query::WRITE,
                body: Some(object_body(&self.definition)),
                responses: created(&self.definition, false),
                ..self.operation(Method::Put, "put", self.id("replace", &self.scoped_kind))
            });
        }
        if has(Verb::Patch) {
            item.push(Operation {
                description: format!("partially update the specified {kind}"),
                query: query::PATCH,
                body: Some(patch_body()),
                responses: created(&self.definition, false),
                ..self.operation(Method::Patch, "patch", self.id("patch", &self.scoped_kind))
            });
        }
        if has(Verb::Delete) {
            item.push(Operation {
                description: format!("delete a {kind}"),
                query: query::DELETE,
                body: Some(delete_body()),
                responses: deleted(),
                ..self.operation(
                    Method::Delete,
                    "delete",
                    self.id("delete", &self.scoped_kind),
                )
            });
        }
        let named = format!("{}/{{name}}", self.collection);
        if !item.is_empty() {
            items.push(self.path(named.clone(), true, item));
        }

        for sub in info.subresources {
            let operations = self.subresource(sub, components)?;
            if !operations.is_empty() {
                items.push(self.path(format!("{named}/{}", sub.name), true, operations));
            }
        }
        Ok(())
    }

    fn subresource(
        &self,
        sub: &SubresourceInfo,
        components: &Components,
    ) -> Result<Vec<Operation>, OpenApiError> {
        let gvk = Gvk::new(sub.group, sub.version, sub.kind);
        let kind = self.info.kind;
        let name = sub.name;
        let suffix = format!("{}{}", self.scoped_kind, capitalized(name));
        let operation = |method, action, id| Operation {
            gvk: Some(gvk.clone()),
            ..self.operation(method, action, id)
        };
        let mut operations = Vec::new();
        if is_connect(sub) {
            // A connect subresource answers GET and POST with an upgraded stream, as
            // `pods/exec` does (`installer.go`, `rest.Connecter`); its options kind has no
            // schema because its fields arrive as query parameters.
            for (method, upper, camel) in
                [(Method::Get, "GET", "Get"), (Method::Post, "POST", "Post")]
            {
                operations.push(Operation {
                    description: format!("connect {upper} requests to {name} of {kind}"),
                    responses: vec![reply("200", "OK", Payload::Text), unauthorized()],
                    produces: ANY,
                    ..operation(
                        method,
                        "connect",
                        self.id("connect", &format!("{camel}{suffix}")),
                    )
                });
            }
            return Ok(operations);
        }
        let definition = components
            .name_of(&gvk)
            .ok_or_else(|| OpenApiError::UnknownSubresourceKind {
                subresource: format!("{}/{}", self.info.plural, sub.name),
                kind: format!("{}/{} {}", sub.group, sub.version, sub.kind),
            })?
            .to_owned();
        for verb in sub.verbs {
            operations.push(match verb {
                Verb::Get => Operation {
                    description: format!("read {name} of the specified {kind}"),
                    responses: ok(definition.clone()),
                    ..operation(Method::Get, "get", self.id("read", &suffix))
                },
                Verb::Create => Operation {
                    description: format!("create {name} of a {kind}"),
                    query: query::WRITE,
                    body: Some(object_body(&definition)),
                    responses: created(&definition, true),
                    ..operation(Method::Post, "post", self.id("create", &suffix))
                },
                Verb::Update => Operation {
                    description: format!("replace {name} of the specified {kind}"),
                    query: query::WRITE,
                    body: Some(object_body(&definition)),
                    responses: created(&definition, false),
                    ..operation(Method::Put, "put", self.id("replace", &suffix))
                },
                Verb::Patch => Operation {
                    description: format!("partially update {name} of the specified {kind}"),
                    query: query::PATCH,
                    body: Some(if sub.strategic_merge_patch {
                        RequestBody {
                            content_types: STRATEGIC_PATCH_TYPES,
                            ..patch_body()
                        }
                    } else {
                        patch_body()
                    }),
                    responses: created(&definition, false),
                    ..operation(Method::Patch, "patch", self.id("patch", &suffix))
                },
                Verb::Delete => Operation {
                    description: format!("delete {name} of a {kind}"),
                    query: query::DELETE,
                    body: Some(delete_body()),
                    responses: deleted(),
                    ..operation(Method::Delete, "delete", self.id("delete", &suffix))
                },
                // A subresource names one object: it has no collection to list, watch or
                // delete.
                Verb::List | Verb::Watch | Verb::DeleteCollection => continue,
            });
        }
        Ok(operations)
    }
}

fn reply(code: &'static str, description: &'static str, payload: Payload) -> Reply {
    Reply {
        code,
        description,
        payload,
    }
}

/// Go documents 401 on every operation.
fn unauthorized() -> Reply {
    reply("401", "Unauthorized", Payload::Nothing)
}

fn ok(definition: String) -> Vec<Reply> {
    vec![
        reply("200", "OK", Payload::Definition(definition)),
        unauthorized(),
    ]
}

/// Responses of create (with 202 Accepted) and of update and patch, which may create.
fn created(definition: &str, accepted: bool) -> Vec<Reply> {
    let mut replies = vec![
        reply("200", "OK", Payload::Definition(definition.to_owned())),
        reply("201", "Created", Payload::Definition(definition.to_owned())),
    ];
    if accepted {
        replies.push(reply(
            "202",
            "Accepted",
            Payload::Definition(definition.to_owned()),
        ));
    }
    replies.push(unauthorized());
    replies
}

/// Delete answers with a `Status`, as Go's generic store does unless it returns the
/// deleted object.
fn deleted() -> Vec<Reply> {
    vec![
        reply("200", "OK", Payload::Definition(name_of::<Status>())),
        reply("202", "Accepted", Payload::Definition(name_of::<Status>())),
        unauthorized(),
    ]
}

fn object_body(definition: &str) -> RequestBody {
    RequestBody {
        schema: definition.to_owned(),
        content_types: JSON,
        required: true,
    }
}

fn patch_body() -> RequestBody {
    RequestBody {
        schema: name_of::<Patch>(),
        content_types: PATCH_TYPES,
        required: true,
    }
}

fn delete_body() -> RequestBody {
    RequestBody {
        schema: name_of::<DeleteOptions>(),
        content_types: JSON,
        required: false,
    }
}
