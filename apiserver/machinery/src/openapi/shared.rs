//! The Kubernetes definitions of the v2 document taken from the cluster served.
//!
//! kube-apiserver's aggregator merges every APIService's `/openapi/v2` into its own by
//! definition name, and a definition it already has that differs from ours by anything
//! but `x-kubernetes-group-version-kind` is renamed in ours, `ObjectMeta_v2`
//! (`kube-openapi:pkg/aggregator` `mergeSpecs`): `kubectl explain` and every client
//! generated from the merged document would then see two ObjectMetas. Ours are written
//! from k8s-openapi's types, which no release of kube-apiserver serializes identically
//! (descriptions, list extensions, `default`s differ by release), so `serve` takes them
//! from kube-apiserver's own `/openapi/v2` instead.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use super::names::{DEFINITIONS, GVK_EXTENSION};

/// Replaces in `document` (a v2 document) every definition not in `own` that `cluster`
/// also has with the cluster's, keeping our `x-kubernetes-group-version-kind` where we
/// have one (the aggregator merges those lists), then adds from `cluster` every
/// definition the result refers to and lacks. Returns how many were taken.
pub(super) fn adopt(
    document: &mut Value,
    own: &BTreeSet<String>,
    cluster: &Map<String, Value>,
) -> usize {
    let Some(Value::Object(definitions)) = document.get_mut("definitions") else {
        return 0;
    };
    let mut adopted = 0;
    for (name, ours) in definitions.iter_mut() {
        let Some(theirs) = cluster.get(name).filter(|_| !own.contains(name)) else {
            continue;
        };
        let mut taken = theirs.clone();
        if let (Some(gvks), Value::Object(taken)) = (ours.get(GVK_EXTENSION), &mut taken) {
            taken.insert(GVK_EXTENSION.to_owned(), gvks.clone());
        }
        *ours = taken;
        adopted += 1;
    }
    let mut missing: Vec<String> = referenced(definitions)
        .into_iter()
        .filter(|name| !definitions.contains_key(name))
        .collect();
    while let Some(name) = missing.pop() {
        let Some(theirs) = cluster.get(&name) else {
            continue;
        };
        let mut found = BTreeSet::new();
        collect_references(theirs, &mut found);
        definitions.insert(name, theirs.clone());
        adopted += 1;
        for name in found {
            if !definitions.contains_key(&name) && !missing.contains(&name) {
                missing.push(name);
            }
        }
    }
    adopted
}

/// The definition names every `$ref` in `definitions` points at.
fn referenced(definitions: &Map<String, Value>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for schema in definitions.values() {
        collect_references(schema, &mut found);
    }
    found
}

fn collect_references(value: &Value, found: &mut BTreeSet<String>) {
    match value {
        Value::Object(object) => {
            for (key, value) in object {
                match (key.as_str(), value) {
                    ("$ref", Value::String(target)) => {
                        if let Some(name) = target.strip_prefix(DEFINITIONS) {
                            found.insert(name.to_owned());
                        }
                    }
                    _ => collect_references(value, found),
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                collect_references(item, found);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn cluster() -> Map<String, Value> {
        let cluster = json!({
            "io.k8s.Meta": {"description": "theirs", "properties": {"owner": {"$ref": "#/definitions/io.k8s.Owner"}}},
            "io.k8s.Owner": {"description": "theirs", "properties": {"at": {"$ref": "#/definitions/io.k8s.Time"}}},
            "io.k8s.Time": {"type": "string"},
            "io.k8s.Delete": {"description": "theirs", GVK_EXTENSION: [{"group": "apps", "version": "v1", "kind": "DeleteOptions"}]},
            "dev.ours.Pool": {"description": "a stale merge of ours"},
            "io.k8s.Unused": {},
        });
        let Value::Object(cluster) = cluster else {
            unreachable!()
        };
        cluster
    }

    #[test]
    fn shared_definitions_become_the_clusters_and_what_they_reference_follows() {
        let mut document = json!({"definitions": {
            "io.k8s.Meta": {"description": "ours"},
            "io.k8s.Delete": {"description": "ours", GVK_EXTENSION: [{"group": "b", "version": "v1", "kind": "DeleteOptions"}]},
            "io.k8s.OnlyOurs": {"description": "ours"},
            "dev.ours.Pool": {"description": "ours", "properties": {"metadata": {"$ref": "#/definitions/io.k8s.Meta"}}},
        }});
        let own = BTreeSet::from(["dev.ours.Pool".to_owned()]);
        assert_eq!(adopt(&mut document, &own, &cluster()), 4);
        let definitions = &document["definitions"];
        assert_eq!(definitions["io.k8s.Meta"], cluster()["io.k8s.Meta"]);
        assert_eq!(definitions["io.k8s.Owner"], cluster()["io.k8s.Owner"]);
        assert_eq!(definitions["io.k8s.Time"], cluster()["io.k8s.Time"]);
        assert_eq!(definitions["io.k8s.Delete"]["description"], "theirs");
        assert_eq!(
            definitions["io.k8s.Delete"][GVK_EXTENSION],
            json!([{"group": "b", "version": "v1", "kind": "DeleteOptions"}]),
            "our group-version-kinds stay ours"
        );
        assert_eq!(definitions["io.k8s.OnlyOurs"]["description"], "ours");
        assert_eq!(definitions["dev.ours.Pool"]["description"], "ours");
        assert!(definitions.get("io.k8s.Unused").is_none());
    }

    #[test]
    fn without_a_cluster_definition_ours_stay() {
        let mut document = json!({"definitions": {"io.k8s.Other": {"description": "ours"}}});
        let before = document.clone();
        assert_eq!(adopt(&mut document, &BTreeSet::new(), &cluster()), 0);
        assert_eq!(document, before);
    }
}
