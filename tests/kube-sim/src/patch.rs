//! The three patch formats kube clients send: JSON merge patch (RFC 7386), JSON patch
//! (RFC 6902) and strategic merge patch (for the fields of the kinds served here).

use serde_json::{Map, Value};

use crate::errors::ApiError;

/// RFC 7386: objects merge recursively, `null` deletes, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Some(t) = target.as_object_mut() {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

fn pointer_tokens(ptr: &str) -> Result<Vec<String>, ApiError> {
    if ptr.is_empty() {
        return Ok(Vec::new());
    }
    if !ptr.starts_with('/') {
        return Err(ApiError::unprocessable(format!(
            "the server rejected our request due to an error in our request: invalid JSON pointer {ptr:?}"
        )));
    }
    Ok(ptr[1..]
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn patch_err(msg: impl std::fmt::Display) -> ApiError {
    ApiError::unprocessable(format!(
        "the server rejected our request due to an error in our request: {msg}"
    ))
}

fn parent_mut<'a>(doc: &'a mut Value, tokens: &[String]) -> Result<&'a mut Value, ApiError> {
    let mut cur = doc;
    for t in tokens {
        cur = match cur {
            Value::Object(m) => m
                .get_mut(t)
                .ok_or_else(|| patch_err(format!("missing path component {t:?}")))?,
            Value::Array(a) => {
                let i: usize = t
                    .parse()
                    .map_err(|_| patch_err(format!("invalid array index {t:?}")))?;
                a.get_mut(i)
                    .ok_or_else(|| patch_err(format!("array index {i} out of bounds")))?
            }
            _ => return Err(patch_err(format!("cannot traverse into {t:?}"))),
        };
    }
    Ok(cur)
}

fn add_at(doc: &mut Value, path: &str, value: Value) -> Result<(), ApiError> {
    let tokens = pointer_tokens(path)?;
    let Some((last, parents)) = tokens.split_last() else {
        *doc = value;
        return Ok(());
    };
    match parent_mut(doc, parents)? {
        Value::Object(m) => {
            m.insert(last.clone(), value);
        }
        Value::Array(a) => {
            if last == "-" {
                a.push(value);
            } else {
                let i: usize = last
                    .parse()
                    .map_err(|_| patch_err(format!("invalid array index {last:?}")))?;
                if i > a.len() {
                    return Err(patch_err(format!("array index {i} out of bounds")));
                }
                a.insert(i, value);
            }
        }
        _ => return Err(patch_err(format!("cannot add at {path:?}"))),
    }
    Ok(())
}

fn remove_at(doc: &mut Value, path: &str) -> Result<Value, ApiError> {
    let tokens = pointer_tokens(path)?;
    let Some((last, parents)) = tokens.split_last() else {
        return Err(patch_err("cannot remove the whole document"));
    };
    match parent_mut(doc, parents)? {
        Value::Object(m) => m.remove(last).ok_or_else(|| {
            patch_err(format!(
                "unable to remove nonexistent key: {last}: missing value"
            ))
        }),
        Value::Array(a) => {
            let i: usize = last
                .parse()
                .map_err(|_| patch_err(format!("invalid array index {last:?}")))?;
            if i >= a.len() {
                return Err(patch_err(format!("array index {i} out of bounds")));
            }
            Ok(a.remove(i))
        }
        _ => Err(patch_err(format!("cannot remove at {path:?}"))),
    }
}

/// RFC 6902, all six operations; the whole patch fails if any operation fails.
pub fn json_patch(doc: &mut Value, patch: &Value) -> Result<(), ApiError> {
    let ops = patch
        .as_array()
        .ok_or_else(|| ApiError::bad_request("json patch must be a JSON array of operations"))?;
    let mut work = doc.clone();
    for op in ops {
        let kind = op.get("op").and_then(Value::as_str).unwrap_or("");
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| patch_err("operation is missing \"path\""))?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| patch_err(format!("operation {kind} is missing \"value\"")))
        };
        let from = || {
            op.get("from")
                .and_then(Value::as_str)
                .ok_or_else(|| patch_err(format!("operation {kind} is missing \"from\"")))
        };
        match kind {
            "add" => add_at(&mut work, path, value()?)?,
            "remove" => {
                remove_at(&mut work, path)?;
            }
            "replace" => {
                remove_at(&mut work, path)?;
                add_at(&mut work, path, value()?)?;
            }
            "move" => {
                let v = remove_at(&mut work, from()?)?;
                add_at(&mut work, path, v)?;
            }
            "copy" => {
                let v = work
                    .pointer(from()?)
                    .cloned()
                    .ok_or_else(|| patch_err("copy from a missing path"))?;
                add_at(&mut work, path, v)?;
            }
            "test" => {
                let expected = value()?;
                if work.pointer(path) != Some(&expected) {
                    return Err(patch_err(format!(
                        "testing value {path} failed: test failed"
                    )));
                }
            }
            other => return Err(patch_err(format!("Unexpected kind: {other}"))),
        }
    }
    *doc = work;
    Ok(())
}

/// How a list field merges under strategic merge patch.
enum ListStrategy {
    /// Replace the whole list (the default for lists without patch metadata).
    Atomic,
    /// A set of scalars: union, with `$deleteFromPrimitiveList/<field>` to remove.
    PrimitiveMerge,
    /// Objects identified by a key field.
    MergeByKey(&'static str),
}

/// Patch metadata of the list fields in the kinds served here (from their Go struct tags).
fn list_strategy(path: &[String]) -> ListStrategy {
    let p: Vec<&str> = path.iter().map(String::as_str).collect();
    match p.as_slice() {
        ["metadata", "finalizers"] => ListStrategy::PrimitiveMerge,
        ["metadata", "ownerReferences"] => ListStrategy::MergeByKey("uid"),
        ["status", "conditions"] => ListStrategy::MergeByKey("type"),
        _ => ListStrategy::Atomic,
    }
}

/// Strategic merge patch for the fields of PV, PVC, StorageClass, Lease, Event and
/// Namespace: like a merge patch, except the list fields the API declares mergeable
/// (finalizers, ownerReferences, conditions) merge instead of being replaced, and the
/// `$patch`/`$deleteFromPrimitiveList`/`$setElementOrder` directives are honoured.
pub fn strategic_merge_patch(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    smp_object(target, patch, &mut Vec::new())
}

fn smp_object(target: &mut Value, patch: &Value, path: &mut Vec<String>) -> Result<(), ApiError> {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return Ok(());
    };
    match p.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut clean = p.clone();
            clean.remove("$patch");
            *target = Value::Object(clean);
            return Ok(());
        }
        Some("delete") => {
            *target = Value::Null;
            return Ok(());
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unknown patch type: {other}"
            )));
        }
        None => {}
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Some(t) = target.as_object_mut() else {
        return Ok(());
    };
    for (k, v) in p {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Some(del)) = (t.get_mut(field), v.as_array()) {
                list.retain(|x| !del.contains(x));
            }
            continue;
        }
        if k.starts_with("$setElementOrder/") || k.starts_with("$retainKeys") {
            continue;
        }
        path.push(k.clone());
        if v.is_null() {
            t.remove(k);
        } else if let Value::Array(items) = v {
            match list_strategy(path) {
                ListStrategy::Atomic => {
                    t.insert(k.clone(), v.clone());
                }
                ListStrategy::PrimitiveMerge => {
                    let entry = t
                        .entry(k.clone())
                        .or_insert_with(|| Value::Array(Vec::new()));
                    if !entry.is_array() {
                        *entry = Value::Array(Vec::new());
                    }
                    if let Value::Array(cur) = entry {
                        for item in items {
                            if !cur.contains(item) {
                                cur.push(item.clone());
                            }
                        }
                    }
                }
                ListStrategy::MergeByKey(key) => {
                    let entry = t
                        .entry(k.clone())
                        .or_insert_with(|| Value::Array(Vec::new()));
                    if !entry.is_array() {
                        *entry = Value::Array(Vec::new());
                    }
                    if let Value::Array(cur) = entry {
                        for item in items {
                            let id = item.get(key).cloned();
                            let directive = item.get("$patch").and_then(Value::as_str);
                            let pos = cur.iter().position(|c| c.get(key).cloned() == id);
                            match (pos, directive) {
                                (Some(i), Some("delete")) => {
                                    cur.remove(i);
                                }
                                (None, Some("delete")) => {}
                                (Some(i), _) => smp_object(&mut cur[i], item, path)?,
                                (None, _) => cur.push(item.clone()),
                            }
                        }
                    }
                }
            }
        } else if v.is_object() {
            let entry = t.entry(k.clone()).or_insert(Value::Null);
            smp_object(entry, v, path)?;
            if entry.is_null() {
                t.remove(k);
            }
        } else {
            t.insert(k.clone(), v.clone());
        }
        path.pop();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strategic_merges_finalizers_and_deletes_from_them() {
        let mut o = json!({"metadata": {"finalizers": ["a/x"]}});
        strategic_merge_patch(&mut o, &json!({"metadata": {"finalizers": ["b/y"]}})).unwrap();
        assert_eq!(o["metadata"]["finalizers"], json!(["a/x", "b/y"]));
        strategic_merge_patch(
            &mut o,
            &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a/x"]}}),
        )
        .unwrap();
        assert_eq!(o["metadata"]["finalizers"], json!(["b/y"]));
    }

    #[test]
    fn merge_patch_replaces_lists_and_null_deletes() {
        let mut o = json!({"a": [1, 2], "b": {"c": 1, "d": 2}});
        merge_patch(&mut o, &json!({"a": [3], "b": {"c": null}}));
        assert_eq!(o, json!({"a": [3], "b": {"d": 2}}));
    }

    #[test]
    fn json_patch_is_atomic_and_tests() {
        let mut o = json!({"a": 1});
        let err = json_patch(
            &mut o,
            &json!([{"op": "replace", "path": "/a", "value": 2}, {"op": "test", "path": "/a", "value": 3}]),
        );
        assert!(err.is_err());
        assert_eq!(o, json!({"a": 1}));
        json_patch(&mut o, &json!([{"op": "add", "path": "/b", "value": [1]}, {"op": "add", "path": "/b/-", "value": 2}])).unwrap();
        assert_eq!(o, json!({"a": 1, "b": [1, 2]}));
    }
}
