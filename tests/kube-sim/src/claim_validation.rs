//! kube-apiserver's rules for changing a PersistentVolumeClaim after creation
//! (`ValidatePersistentVolumeClaimUpdate` and `...StatusUpdate` in Kubernetes 1.34, where
//! RecoverVolumeExpansionFailure and VolumeAttributesClass are GA): which parts of the spec
//! may change and when, how far a request may shrink, and what an external resizer may
//! write into the status. Field paths and wording are the real ones, since resizers and
//! tests match on them.

use serde_json::{Map, Value, json};

use crate::errors::Cause;
use crate::meta::{annotation, path, path_str};
use crate::names::qualified_name_errors;
use crate::quantity::Quantity;
use crate::quantity::storage_quantity;

/// The storage class as an annotation, from before `spec.storageClassName` existed; claims
/// may still carry it and it still wins over the field.
pub const BETA_STORAGE_CLASS_ANN: &str = "volume.beta.kubernetes.io/storage-class";

const IMMUTABLE_SPEC: &str = "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims";

/// The values `status.allocatedResourceStatuses` may hold, in the order the real message
/// lists them (sorted).
pub const RESIZE_STATUSES: [&str; 5] = [
    "ControllerResizeInProgress",
    "ControllerResizeInfeasible",
    "NodeResizeInProgress",
    "NodeResizeInfeasible",
    "NodeResizePending",
];

/// The spec fields in the order of the Go struct, which is how the real diff lists them.
const SPEC_FIELDS: [&str; 9] = [
    "accessModes",
    "selector",
    "resources",
    "volumeName",
    "storageClassName",
    "volumeMode",
    "dataSource",
    "dataSourceRef",
    "volumeAttributesClassName",
];

fn spec_of(claim: &Value) -> Map<String, Value> {
    claim
        .get("spec")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

fn non_null<'a>(spec: &'a Map<String, Value>, field: &str) -> Option<&'a Value> {
    spec.get(field).filter(|v| !v.is_null())
}

/// A missing quantity is zero, as a lookup in a Go map of quantities gives.
fn quantity_or_zero(obj: &Value, keys: &[&str]) -> Quantity {
    storage_quantity(obj, keys).unwrap_or_default()
}

pub fn requested_storage(claim: &Value) -> Quantity {
    quantity_or_zero(claim, &["spec", "resources", "requests", "storage"])
}

pub fn capacity_storage(claim: &Value) -> Quantity {
    quantity_or_zero(claim, &["status", "capacity", "storage"])
}

/// The class a claim names: the beta annotation wins over the field, as in the real
/// `GetPersistentVolumeClaimClass`.
pub fn claim_class(claim: &Value) -> &str {
    annotation(claim, BETA_STORAGE_CLASS_ANN)
        .or_else(|| path_str(claim, &["spec", "storageClassName"]))
        .unwrap_or("")
}

/// Copy `field` of `from` into `to`, absent included.
fn copy_field(to: &mut Map<String, Value>, from: &Map<String, Value>, field: &str) {
    match from.get(field) {
        Some(v) => {
            to.insert(field.into(), v.clone());
        }
        None => {
            to.remove(field);
        }
    }
}

/// The spec as the real server's semantic equality sees it: nil and empty lists and maps
/// are equal, an empty string equals an unset string field, quantities compare by amount.
/// Pointer fields (`selector`, `storageClassName`...) keep the difference between unset
/// and empty, as they do there.
fn comparable(spec: &Map<String, Value>) -> Map<String, Value> {
    let mut out = Map::new();
    for (k, v) in spec {
        let v = match (k.as_str(), v) {
            (_, Value::Null) => continue,
            ("accessModes", Value::Array(a)) if a.is_empty() => continue,
            ("volumeName", Value::String(s)) if s.is_empty() => continue,
            ("resources", Value::Object(r)) => {
                let mut lists = Map::new();
                for (list, amounts) in r {
                    let Some(amounts) = amounts.as_object().filter(|m| !m.is_empty()) else {
                        continue;
                    };
                    let amounts = amounts
                        .iter()
                        .map(|(name, q)| match Quantity::from_json(q) {
                            Some(Ok(q)) => (name.clone(), json!(q.canonical())),
                            _ => (name.clone(), q.clone()),
                        })
                        .collect();
                    lists.insert(list.clone(), Value::Object(amounts));
                }
                if lists.is_empty() {
                    continue;
                }
                Value::Object(lists)
            }
            ("selector", Value::Object(sel)) => Value::Object(
                sel.iter()
                    .filter(|(_, part)| {
                        !part.is_null()
                            && part.as_object().is_none_or(|m| !m.is_empty())
                            && part.as_array().is_none_or(|a| !a.is_empty())
                    })
                    .map(|(k, part)| (k.clone(), part.clone()))
                    .collect(),
            ),
            _ => v.clone(),
        };
        out.insert(k.clone(), v);
    }
    out
}

/// An outline of what differs, in the shape of the go-cmp diff the real message carries
/// (whose exact text go-cmp deliberately varies from run to run).
fn spec_diff(old: &Map<String, Value>, new: &Map<String, Value>) -> String {
    let (old_cmp, new_cmp) = (comparable(old), comparable(new));
    let mut fields: Vec<&str> = SPEC_FIELDS.to_vec();
    for k in old.keys().chain(new.keys()) {
        if !fields.contains(&k.as_str()) {
            fields.push(k);
        }
    }
    let render = |spec: &Map<String, Value>, field: &str| {
        spec.get(field).map_or("nil".to_string(), Value::to_string)
    };
    let mut lines = vec!["  core.PersistentVolumeClaimSpec{".to_string()];
    for field in fields {
        if old_cmp.get(field) == new_cmp.get(field) {
            continue;
        }
        let mut letters = field.chars();
        let go_name: String = letters
            .next()
            .map(|first| first.to_ascii_uppercase())
            .into_iter()
            .chain(letters)
            .collect();
        lines.push(format!("- \t{go_name}: {},", render(old, field)));
        lines.push(format!("+ \t{go_name}: {},", render(new, field)));
    }
    lines.push("  }".to_string());
    lines.join("\n")
}

/// The class may go from the beta annotation to the field, if it names the same class.
fn class_moves_from_annotation(
    old_ann: Option<&str>,
    new_ann: Option<&str>,
    old_class: Option<&str>,
    new_class: Option<&str>,
) -> bool {
    let Some(old_ann) = old_ann else {
        return false;
    };
    old_class.is_none() && new_class == Some(old_ann) && new_ann.is_none_or(|a| a == old_ann)
}

/// A claim without a class may get one later (the retroactive default class), if it does
/// not contradict the beta annotation.
fn class_set_from_nil(
    old_ann: Option<&str>,
    old_class: Option<&str>,
    new_class: Option<&str>,
) -> bool {
    new_class.is_some() && old_class.is_none() && old_ann.is_none_or(|a| new_class == Some(a))
}

/// `ValidatePersistentVolumeClaimUpdate`, except what every kind shares (metadata).
pub fn validate_update(old: &Value, new: &Value, causes: &mut Vec<Cause>) {
    let (old_spec, new_spec) = (spec_of(old), spec_of(new));
    let (mut old_clone, mut new_clone) = (old_spec.clone(), new_spec.clone());

    // The binder sets volumeName once; after that it is fixed.
    if non_null(&old_spec, "volumeName")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        copy_field(&mut old_clone, &new_spec, "volumeName");
    }

    let old_ann = annotation(old, BETA_STORAGE_CLASS_ANN);
    let new_ann = annotation(new, BETA_STORAGE_CLASS_ANN);
    let class = |spec: &Map<String, Value>| {
        non_null(spec, "storageClassName")
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let (old_class, new_class) = (class(&old_spec), class(&new_spec));
    if class_moves_from_annotation(old_ann, new_ann, old_class.as_deref(), new_class.as_deref()) {
        new_clone.remove("storageClassName");
    } else {
        if old_ann.unwrap_or("") != new_ann.unwrap_or("") {
            causes.push(Cause::invalid(
                format!("metadata.annotations.{BETA_STORAGE_CLASS_ANN}"),
                &json!(new_ann.unwrap_or("")),
                "field is immutable",
            ));
        }
        if class_set_from_nil(old_ann, old_class.as_deref(), new_class.as_deref()) {
            copy_field(&mut new_clone, &old_clone, "storageClassName");
        }
    }

    // The status is the stored one (main-resource writes cannot change it).
    let bound = path_str(new, &["status", "phase"]) == Some("Bound");
    if bound {
        let old_request = path(old, &["spec", "resources", "requests", "storage"]).cloned();
        if let Some(requests) = new_clone
            .get_mut("resources")
            .and_then(|r| r.get_mut("requests"))
            .and_then(Value::as_object_mut)
        {
            match old_request {
                Some(q) => requests.insert("storage".into(), q),
                None => requests.remove("storage"),
            };
        }
        if non_null(&new_clone, "volumeAttributesClassName").is_some() {
            copy_field(&mut new_clone, &old_clone, "volumeAttributesClassName");
        }
    }

    if comparable(&old_clone) != comparable(&new_clone) {
        causes.push(Cause::forbidden(
            "spec",
            &format!("{IMMUTABLE_SPEC}\n{}", spec_diff(&old_clone, &new_clone)),
        ));
    }

    // Shrinking is allowed (to recover from a failed expansion), but never to or below
    // what the volume already has.
    let (old_size, new_size) = (requested_storage(old), requested_storage(new));
    if new_size < old_size && new_size <= capacity_storage(old) {
        causes.push(Cause::forbidden(
            "spec.resources.requests.storage",
            "field can not be less than status.capacity",
        ));
    }

    let old_mode = non_null(&old_spec, "volumeMode");
    let new_mode = non_null(&new_spec, "volumeMode");
    if old_mode != new_mode {
        causes.push(Cause::invalid(
            "volumeMode",
            new_mode.unwrap_or(&Value::Null),
            "field is immutable",
        ));
    }

    let old_vac = non_null(&old_spec, "volumeAttributesClassName");
    let new_vac = non_null(&new_spec, "volumeAttributesClassName");
    if old_vac.is_some() && old_vac != new_vac {
        let detail = match new_vac {
            None => Some("update from non-nil value to nil is forbidden"),
            Some(v) if v.as_str() == Some("") => {
                Some("update from non-nil value to an empty string is forbidden")
            }
            Some(_) => None,
        };
        if let Some(detail) = detail {
            causes.push(Cause::forbidden("spec.volumeAttributesClassName", detail));
        }
    }
}

/// Native resource names (unprefixed, or under kubernetes.io) must be `storage` in the
/// resize status maps; names under other domains are free for drivers to use. Returns
/// whether the key was refused.
fn resource_key_errors(key: &str, field: &str, causes: &mut Vec<Cause>) -> bool {
    if let Some(msg) = qualified_name_errors(key) {
        causes.push(Cause::invalid(field, &json!(key), &msg));
        return true;
    }
    let native = !key.contains('/') || key.contains("kubernetes.io/");
    if native && key != "storage" {
        causes.push(Cause::unsupported(field, &json!(key), &["storage"]));
        return true;
    }
    false
}

/// The real check on a quantity in a status map: its whole value, rounded away from
/// zero, must not be negative (and is what the message shows).
fn negative_quantity(field: String, q: &Value, causes: &mut Vec<Cause>) {
    if let Some(Ok(q)) = Quantity::from_json(q)
        && q.is_negative()
    {
        let units = i64::try_from(q.units_rounded_away_from_zero()).unwrap_or(i64::MIN);
        causes.push(Cause::invalid(
            field,
            &json!(units),
            "must be a valid resource quantity",
        ));
    }
}

/// `ValidatePersistentVolumeClaimStatusUpdate`: what a resizer or the binder may write to
/// `/status`. Conditions (`Resizing`, `FileSystemResizePending`, `ControllerResizeError`...)
/// are free-form there and kept as written.
pub fn validate_status_update(new: &Value, causes: &mut Vec<Cause>) {
    let map_at = |field: &str| {
        path(new, &["status", field])
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default()
    };
    for (name, q) in map_at("capacity") {
        negative_quantity(format!("status.capacity[{name}]"), &q, causes);
    }
    // The real field path lacks the final "es" of the field's name.
    let statuses_field = "status.allocatedResourceStatus";
    for (name, state) in map_at("allocatedResourceStatuses") {
        resource_key_errors(&name, statuses_field, causes);
        if !state.as_str().is_some_and(|s| RESIZE_STATUSES.contains(&s)) {
            causes.push(Cause::unsupported(
                statuses_field,
                &json!(name),
                &RESIZE_STATUSES,
            ));
        }
    }
    for (name, q) in map_at("allocatedResources") {
        if !resource_key_errors(&name, "status.allocatedResources", causes) {
            negative_quantity(format!("status.allocatedResources[{name}]"), &q, causes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(spec: Value, phase: &str) -> Value {
        json!({"metadata": {"name": "c"}, "spec": spec, "status": {"phase": phase, "capacity": {"storage": "1Gi"}}})
    }

    fn causes_of(old: &Value, new: &Value) -> Vec<Cause> {
        let mut causes = Vec::new();
        validate_update(old, new, &mut causes);
        causes
    }

    #[test]
    fn equal_amounts_in_other_units_are_no_change() {
        let spec = json!({"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}, "limits": {"storage": "2Gi"}}, "volumeMode": "Filesystem"});
        let mut respelled = spec.clone();
        respelled["resources"]["limits"]["storage"] = json!("2048Mi");
        respelled["volumeName"] = json!("");
        let causes = causes_of(&claim(spec, "Pending"), &claim(respelled, "Pending"));
        assert!(causes.is_empty(), "{causes:?}");
    }

    #[test]
    fn only_the_storage_request_of_a_bound_claim_may_change() {
        let spec =
            json!({"resources": {"requests": {"storage": "1Gi"}}, "volumeMode": "Filesystem"});
        let mut grown = spec.clone();
        grown["resources"]["requests"]["storage"] = json!("2Gi");
        assert!(
            causes_of(
                &claim(spec.clone(), "Bound"),
                &claim(grown.clone(), "Bound")
            )
            .is_empty()
        );
        let causes = causes_of(&claim(spec.clone(), "Pending"), &claim(grown, "Pending"));
        assert_eq!(causes.len(), 1, "{causes:?}");
        assert_eq!(causes[0].field, "spec");
        assert!(
            causes[0]
                .message
                .starts_with(&format!("Forbidden: {IMMUTABLE_SPEC}\n"))
        );
        let mut limited = spec.clone();
        limited["resources"]["limits"] = json!({"storage": "5Gi"});
        let causes = causes_of(&claim(spec, "Bound"), &claim(limited, "Bound"));
        assert!(
            causes[0].message.contains("- \tResources: {\"requests\""),
            "{causes:?}"
        );
    }

    #[test]
    fn a_class_may_be_set_once_when_none_was() {
        let spec = json!({"resources": {"requests": {"storage": "1Gi"}}});
        let mut classed = spec.clone();
        classed["storageClassName"] = json!("nfs");
        assert!(causes_of(&claim(spec, "Pending"), &claim(classed.clone(), "Pending")).is_empty());
        let mut reclassed = classed.clone();
        reclassed["storageClassName"] = json!("other");
        assert_eq!(
            causes_of(&claim(classed, "Pending"), &claim(reclassed, "Pending")).len(),
            1
        );
    }

    #[test]
    fn resize_statuses_are_checked_by_key_and_value() {
        let status = |s: Value| json!({"status": s});
        let mut causes = Vec::new();
        validate_status_update(
            &status(
                json!({"allocatedResourceStatuses": {"storage": "ControllerResizeInProgress", "example.com/iops": "NodeResizePending"}, "allocatedResources": {"storage": "2Gi"}}),
            ),
            &mut causes,
        );
        assert!(causes.is_empty(), "{causes:?}");
        validate_status_update(
            &status(
                json!({"allocatedResourceStatuses": {"cpu": "Resizing"}, "capacity": {"storage": "-1"}}),
            ),
            &mut causes,
        );
        let rendered: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        assert_eq!(
            rendered,
            [
                "status.capacity[storage]: Invalid value: -1: must be a valid resource quantity",
                "status.allocatedResourceStatus: Unsupported value: \"cpu\": supported values: \"storage\"",
                "status.allocatedResourceStatus: Unsupported value: \"cpu\": supported values: \"ControllerResizeInProgress\", \"ControllerResizeInfeasible\", \"NodeResizeInProgress\", \"NodeResizeInfeasible\", \"NodeResizePending\"",
            ]
        );
    }
}
