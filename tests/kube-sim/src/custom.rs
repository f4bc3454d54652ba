//! The custom resources served, checked against the very CRD manifests nfsprov installs
//! (`deploy/crds`): as the real server does with a structural schema, unknown fields are
//! pruned, defaults filled in, then types, enums, required fields and bounds checked. A
//! field the controller writes but the manifest lacks therefore vanishes here as it
//! would on a cluster.

use std::sync::OnceLock;

use serde_json::{Map, Value};

use crate::errors::Cause;
use crate::resources::Kind;

const SNAPSHOT_CRD: &str = include_str!("../../../deploy/crds/snapshots.yaml");
const SCHEDULE_CRD: &str = include_str!("../../../deploy/crds/snapshotschedules.yaml");

/// The `openAPIV3Schema` of the manifest's first version.
fn load(manifest: &str) -> Value {
    let crd: Value = match serde_yaml_ng::from_str(manifest) {
        Ok(crd) => crd,
        // The manifests are compiled in; one that does not parse is a bug to see at once.
        Err(e) => panic!("CRD manifest does not parse: {e}"),
    };
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

/// The schema of a custom kind; `None` for the built-in ones.
pub fn schema(kind: Kind) -> Option<&'static Value> {
    static SNAPSHOT: OnceLock<Value> = OnceLock::new();
    static SCHEDULE: OnceLock<Value> = OnceLock::new();
    match kind {
        Kind::Snapshot => Some(SNAPSHOT.get_or_init(|| load(SNAPSHOT_CRD))),
        Kind::SnapshotSchedule => Some(SCHEDULE.get_or_init(|| load(SCHEDULE_CRD))),
        _ => None,
    }
}

/// Prunes what the schema does not name and fills in its defaults. `metadata` is the
/// server's and never pruned.
pub fn prune_and_default(schema: &Value, obj: &mut Value) {
    let Some(object) = obj.as_object_mut() else {
        return;
    };
    let properties = schema.get("properties").and_then(Value::as_object);
    object.retain(|key, _| {
        key == "metadata" || properties.is_some_and(|p| p.contains_key(key.as_str()))
    });
    for (key, value) in object.iter_mut() {
        if key != "metadata"
            && let Some(field) = properties.and_then(|p| p.get(key))
        {
            walk(field, value);
        }
    }
    add_defaults(properties, object);
}

fn walk(schema: &Value, value: &mut Value) {
    if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        return;
    }
    match value {
        Value::Object(object) => {
            if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
                object.retain(|key, _| properties.contains_key(key.as_str()));
                for (key, value) in object.iter_mut() {
                    walk(&properties[key.as_str()], value);
                }
                add_defaults(Some(properties), object);
            } else if let Some(each) = schema.get("additionalProperties") {
                for value in object.values_mut() {
                    walk(each, value);
                }
            }
        }
        Value::Array(items) => {
            if let Some(each) = schema.get("items") {
                for item in items {
                    walk(each, item);
                }
            }
        }
        _ => {}
    }
}

fn add_defaults(properties: Option<&Map<String, Value>>, object: &mut Map<String, Value>) {
    for (key, field) in properties.into_iter().flatten() {
        if let Some(default) = field.get("default")
            && !object.contains_key(key)
        {
            object.insert(key.clone(), default.clone());
        }
    }
}

/// The transition rules of an update: the CEL rule `self == oldSelf` (the one form the
/// manifests use), on a field present before and after, refused with the rule's message
/// as the real server words it (no value: CEL errors carry none).
pub fn validate_transition(schema: &Value, old: &Value, new: &Value, causes: &mut Vec<Cause>) {
    transition(schema, old, new, "", causes);
}

fn transition(schema: &Value, old: &Value, new: &Value, at: &str, causes: &mut Vec<Cause>) {
    for rule in schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if rule.get("rule").and_then(Value::as_str) == Some("self == oldSelf") && old != new {
            let message = rule
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("failed rule: self == oldSelf");
            causes.push(Cause {
                reason: "FieldValueInvalid",
                field: at.to_owned(),
                message: format!("Invalid value: {message}"),
            });
        }
    }
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (key, field) in properties {
        if at.is_empty() && key == "metadata" {
            continue;
        }
        if let (Some(o), Some(n)) = (old.get(key), new.get(key)) {
            let path = if at.is_empty() {
                key.clone()
            } else {
                format!("{at}.{key}")
            };
            transition(field, o, n, &path, causes);
        }
    }
}

/// The schema's checks of a pruned, defaulted object.
pub fn validate(schema: &Value, obj: &Value, causes: &mut Vec<Cause>) {
    let Some(object) = obj.as_object() else {
        return;
    };
    let properties = schema.get("properties").and_then(Value::as_object);
    required(schema, object, "", causes);
    for (key, value) in object {
        if key != "metadata"
            && let Some(field) = properties.and_then(|p| p.get(key))
        {
            check(field, value, key, causes);
        }
    }
}

fn required(schema: &Value, object: &Map<String, Value>, at: &str, causes: &mut Vec<Cause>) {
    for name in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if object.get(name).is_none_or(Value::is_null) {
            causes.push(Cause::required(join(at, name)));
        }
    }
}

fn join(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_owned()
    } else {
        format!("{at}.{key}")
    }
}

fn check(schema: &Value, value: &Value, at: &str, causes: &mut Vec<Cause>) {
    if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        if !(value.is_i64() || value.is_u64() || value.is_string()) {
            causes.push(Cause::invalid(at, value, "must be an integer or a string"));
        }
        return;
    }
    let wanted = schema.get("type").and_then(Value::as_str).unwrap_or("");
    let fits = match wanted {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        _ => true,
    };
    if !fits {
        causes.push(Cause::invalid(
            at,
            value,
            &format!("must be of type {wanted}"),
        ));
        return;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        let names: Vec<&str> = allowed.iter().filter_map(Value::as_str).collect();
        causes.push(Cause::unsupported(at, value, &names));
    }
    if let (Some(min), Some(s)) = (
        schema.get("minLength").and_then(Value::as_u64),
        value.as_str(),
    ) && (s.chars().count() as u64) < min
    {
        causes.push(Cause::invalid(
            at,
            value,
            &format!("should be at least {min} chars long"),
        ));
    }
    if let (Some(min), Some(n)) = (
        schema.get("minimum").and_then(Value::as_i64),
        value.as_i64(),
    ) && n < min
    {
        causes.push(Cause::invalid(
            at,
            value,
            &format!("should be greater than or equal to {min}"),
        ));
    }
    match value {
        Value::Object(object) => {
            required(schema, object, at, causes);
            let properties = schema.get("properties").and_then(Value::as_object);
            let each = schema.get("additionalProperties");
            for (key, value) in object {
                if let Some(field) = properties.and_then(|p| p.get(key)).or(each) {
                    check(field, value, &join(at, key), causes);
                }
            }
        }
        Value::Array(items) => {
            if let Some(each) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check(each, item, &format!("{at}[{i}]"), causes);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_snapshot_is_pruned_defaulted_and_checked_by_its_manifest() {
        let schema = schema(Kind::Snapshot).unwrap();
        let mut obj = json!({
            "apiVersion": "nfsprov.dev/v1alpha1",
            "kind": "Snapshot",
            "metadata": {"name": "s", "anything": 1},
            "spec": {"source": {"persistentVolumeClaimName": "data", "typo": 1}},
            "status": {"readyToUse": true, "restoreSize": "1Gi", "made_up": "x"},
            "extra": true,
        });
        prune_and_default(schema, &mut obj);
        assert_eq!(
            obj,
            json!({
                "apiVersion": "nfsprov.dev/v1alpha1",
                "kind": "Snapshot",
                "metadata": {"name": "s", "anything": 1},
                "spec": {
                    "source": {"persistentVolumeClaimName": "data"},
                    "deletionPolicy": "Delete",
                },
                "status": {"readyToUse": true, "restoreSize": "1Gi"},
            })
        );
        let mut causes = Vec::new();
        validate(schema, &obj, &mut causes);
        assert!(causes.is_empty(), "{causes:?}");

        let bad = json!({
            "spec": {"source": {"persistentVolumeClaimName": ""}, "deletionPolicy": "Keep"},
            "status": {"readyToUse": "yes"},
        });
        let mut causes = Vec::new();
        validate(schema, &bad, &mut causes);
        let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.deletionPolicy",
                "spec.source.persistentVolumeClaimName",
                "status.readyToUse"
            ],
            "{causes:?}"
        );
    }

    #[test]
    fn a_schedule_needs_an_interval_and_keeps_at_least_one() {
        let schema = schema(Kind::SnapshotSchedule).unwrap();
        let mut causes = Vec::new();
        validate(
            schema,
            &json!({"spec": {"keep": 0, "claimSelector": {"matchLabels": {"a": 1}}}}),
            &mut causes,
        );
        let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.interval",
                "spec.claimSelector.matchLabels.a",
                "spec.keep"
            ],
            "{causes:?}"
        );
    }
}
