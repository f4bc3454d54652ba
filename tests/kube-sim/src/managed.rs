//! Field ownership (`metadata.managedFields`) and server-side apply conflicts.
//! kube-lease-manager takes an orphaned Lease with a non-forced apply and relies on the
//! server refusing it with 409 when another manager set `holderIdentity` first; without
//! ownership tracking two replicas could both believe they lead.
//!
//! Simplified against the real structured-merge-diff: lists are atomic leaves, `status` is
//! not tracked, and fields dropped from a manager's applied configuration are not removed.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use crate::meta;

type Path = Vec<String>;

/// Who writes, and how.
#[derive(Clone, Copy, Debug)]
pub struct WriteOp<'a> {
    pub manager: &'a str,
    /// The applied configuration, for server-side apply.
    pub apply: Option<&'a Value>,
    pub force: bool,
}

impl<'a> WriteOp<'a> {
    pub fn update(manager: &'a str) -> Self {
        WriteOp {
            manager,
            apply: None,
            force: false,
        }
    }
}

/// Metadata fields the server owns; never tracked.
const SYSTEM_META: &[&str] = &[
    "name",
    "namespace",
    "generateName",
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "managedFields",
    "selfLink",
];

fn collect(v: &Value, path: &mut Path, out: &mut Vec<(Path, Value)>) {
    match v.as_object() {
        Some(m) if !m.is_empty() => {
            for (k, child) in m {
                if path.is_empty() && matches!(k.as_str(), "apiVersion" | "kind" | "status") {
                    continue;
                }
                if path.len() == 1 && path[0] == "metadata" && SYSTEM_META.contains(&k.as_str()) {
                    continue;
                }
                path.push(k.clone());
                collect(child, path, out);
                path.pop();
            }
        }
        _ => {
            if !path.is_empty() {
                out.push((path.clone(), v.clone()));
            }
        }
    }
}

/// Leaf fields of an object with their values.
pub fn leaves(obj: &Value) -> Vec<(Path, Value)> {
    let mut out = Vec::new();
    collect(obj, &mut Vec::new(), &mut out);
    out
}

fn value_at<'v>(obj: &'v Value, path: &Path) -> Option<&'v Value> {
    path.iter().try_fold(obj, |v, k| v.get(k))
}

struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    time: String,
    fields: BTreeSet<Path>,
}

fn decode_fields(v: &Value, path: &mut Path, out: &mut BTreeSet<Path>) {
    if let Some(m) = v.as_object() {
        if m.is_empty() && !path.is_empty() {
            out.insert(path.clone());
        }
        for (k, child) in m {
            if let Some(key) = k.strip_prefix("f:") {
                path.push(key.to_string());
                decode_fields(child, path, out);
                path.pop();
            }
        }
    }
}

fn encode_fields(fields: &BTreeSet<Path>) -> Value {
    let mut root = Map::new();
    for p in fields {
        let mut cur = &mut root;
        for k in p {
            let node = cur
                .entry(format!("f:{k}"))
                .or_insert_with(|| Value::Object(Map::new()));
            if !node.is_object() {
                *node = Value::Object(Map::new());
            }
            cur = match node.as_object_mut() {
                Some(m) => m,
                None => unreachable!("node was just made an object"),
            };
        }
    }
    Value::Object(root)
}

fn entries(obj: &Value) -> Vec<Entry> {
    meta::meta(obj)
        .and_then(|m| m.get("managedFields"))
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .map(|e| {
                    let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                    let mut fields = BTreeSet::new();
                    if let Some(f) = e.get("fieldsV1") {
                        decode_fields(f, &mut Vec::new(), &mut fields);
                    }
                    Entry {
                        manager: s("manager"),
                        operation: s("operation"),
                        api_version: s("apiVersion"),
                        time: s("time"),
                        fields,
                    }
                })
                .collect()
        })
        .unwrap_or_default()
}

fn store_entries(obj: &mut Value, list: Vec<Entry>) {
    let encoded: Vec<Value> = list
        .into_iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            json!({
                "manager": e.manager,
                "operation": e.operation,
                "apiVersion": e.api_version,
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": encode_fields(&e.fields),
            })
        })
        .collect();
    let m = meta::meta_mut(obj);
    if encoded.is_empty() {
        m.remove("managedFields");
    } else {
        m.insert("managedFields".into(), Value::Array(encoded));
    }
}

fn render(path: &Path) -> String {
    path.iter().map(|k| format!(".{k}")).collect()
}

/// Server-side apply conflicts: fields the configuration sets to a different value than
/// the live object's while another manager owns them. Returns (manager, field) pairs,
/// the manager as the real server prints it: quoted, and for a manager that updated
/// (rather than applied) the field, with the version it wrote (`"m" using v1`).
pub fn apply_conflicts(live: &Value, config: &Value, manager: &str) -> Vec<(String, String)> {
    let owners = entries(live);
    let mut out = Vec::new();
    for (path, value) in leaves(config) {
        if value_at(live, &path).is_none_or(|v| *v == value) {
            continue;
        }
        for e in &owners {
            if !(e.manager == manager && e.operation == "Apply") && e.fields.contains(&path) {
                let who = if e.operation == "Apply" {
                    format!("\"{}\"", e.manager)
                } else {
                    format!("\"{}\" using {}", e.manager, e.api_version)
                };
                out.push((who, render(&path)));
            }
        }
    }
    out
}

/// Update `new`'s managedFields for a write by `op` that turned `old` (None on create)
/// into `new`.
pub fn record(old: Option<&Value>, new: &mut Value, op: &WriteOp<'_>, api_version: &str) {
    let mut list = old.map(entries).unwrap_or_default();
    let old_leaves: Vec<(Path, Value)> = old.map(leaves).unwrap_or_default();
    let new_leaves = leaves(new);
    let new_set: BTreeSet<&Path> = new_leaves.iter().map(|(p, _)| p).collect();
    let changed: BTreeSet<Path> = new_leaves
        .iter()
        .filter(|(p, v)| old.and_then(|o| value_at(o, p)) != Some(v))
        .map(|(p, _)| p.clone())
        .collect();
    let removed: BTreeSet<Path> = old_leaves
        .iter()
        .filter(|(p, _)| !new_set.contains(p))
        .map(|(p, _)| p.clone())
        .collect();
    let (operation, mine): (&str, BTreeSet<Path>) = match op.apply {
        Some(config) => (
            "Apply",
            leaves(config)
                .into_iter()
                .map(|(p, _)| p)
                .filter(|p| new_set.contains(p))
                .collect(),
        ),
        None => ("Update", changed.clone()),
    };
    // Changing (or removing) a field takes it from everyone else; a forced apply also
    // takes the fields it sets with equal values. Equal values applied without force are
    // shared, as in the real API.
    for e in list.iter_mut() {
        if e.manager == op.manager && e.operation == operation {
            e.fields.retain(|p| !removed.contains(p));
            continue;
        }
        e.fields.retain(|p| {
            !(changed.contains(p) || removed.contains(p) || op.force && mine.contains(p))
        });
    }
    let now = meta::now_time();
    match list
        .iter_mut()
        .find(|e| e.manager == op.manager && e.operation == operation)
    {
        Some(e) => {
            if op.apply.is_some() {
                e.fields = mine;
            } else {
                e.fields.extend(mine);
            }
            e.time = now;
            e.api_version = api_version.into();
        }
        None => list.push(Entry {
            manager: op.manager.into(),
            operation: operation.into(),
            api_version: api_version.into(),
            time: now,
            fields: mine,
        }),
    }
    store_entries(new, list);
}
