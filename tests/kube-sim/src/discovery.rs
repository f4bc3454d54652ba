//! Discovery documents (`/api`, `/apis`, per group-version resource lists, `/version`),
//! enough for kube-rs discovery and `kubectl api-resources` to see what is served.

use serde_json::{Value, json};

use crate::resources::Kind;

/// Each group served, with its one version.
const GROUPS: &[(&str, &str)] = &[
    ("storage.k8s.io", "v1"),
    ("coordination.k8s.io", "v1"),
    ("events.k8s.io", "v1"),
    ("nfsprov.dev", "v1alpha1"),
];

fn group_version(name: &str) -> Option<&'static str> {
    GROUPS.iter().find(|(g, _)| *g == name).map(|(_, v)| *v)
}

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "34",
        "emulationMajor": "1",
        "emulationMinor": "34",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "33",
        "gitVersion": "v1.34.0-nfsprov-kube-sim",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-08-27T00:00:00Z",
        "goVersion": "go1.24",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

pub fn core_versions() -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]
    })
}

pub fn groups() -> Value {
    let groups: Vec<Value> = GROUPS
        .iter()
        .map(|(g, v)| {
            let gv = format!("{g}/{v}");
            json!({
                "name": g,
                "versions": [{"groupVersion": gv, "version": v}],
                "preferredVersion": {"groupVersion": gv, "version": v}
            })
        })
        .collect();
    json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
}

pub fn group(name: &str) -> Option<Value> {
    group_version(name).map(|v| {
        let gv = format!("{name}/{v}");
        json!({
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": name,
            "versions": [{"groupVersion": gv, "version": v}],
            "preferredVersion": {"groupVersion": gv, "version": v}
        })
    })
}

pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let served = if group.is_empty() {
        Some("v1")
    } else {
        group_version(group)
    };
    if served != Some(version) {
        return None;
    }
    let mut resources = Vec::new();
    for k in Kind::ALL.into_iter().filter(|k| k.info().group == group) {
        let i = k.info();
        let verbs = json!([
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch"
        ]);
        let mut r = json!({
            "name": i.plural,
            "singularName": i.singular,
            "namespaced": i.namespaced,
            "kind": i.kind,
            "verbs": verbs,
        });
        if !i.short_names.is_empty() {
            r["shortNames"] = json!(i.short_names);
        }
        resources.push(r);
        if i.has_status {
            resources.push(json!({
                "name": format!("{}/status", i.plural),
                "singularName": "",
                "namespaced": i.namespaced,
                "kind": i.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": gv,
        "resources": resources,
    }))
}
