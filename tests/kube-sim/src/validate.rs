//! Validation and defaulting the real API server applies to the kinds we serve. Only rules
//! a client could trip on are here, but those are enforced with the real field paths and
//! wording so a controller that passes here does not fail on a real cluster.

use serde_json::{Map, Value, json};

use crate::claim_validation;
use crate::errors::{ApiError, Cause};
use crate::meta::{self, path};
use crate::names::{
    SUBDOMAIN_MSG, is_dns1123_subdomain, label_value_ok, name_errors, qualified_name_errors,
};
use crate::quantity::Quantity;
use crate::resources::Kind;

pub const ACCESS_MODES: &[&str] = &[
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOnce",
    "ReadWriteOncePod",
];

/// PV source fields; exactly one must be set.
const VOLUME_SOURCES: &[&str] = &[
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "csi",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "glusterfs",
    "hostPath",
    "iscsi",
    "local",
    "nfs",
    "photonPersistentDisk",
    "portworxVolume",
    "quobyte",
    "rbd",
    "scaleIO",
    "storageos",
    "vsphereVolume",
];

/// Checks every kind shares: metadata shape, names, labels, annotations, finalizers.
fn validate_object_meta(kind: Kind, obj: &Value, causes: &mut Vec<Cause>) {
    let Some(m) = meta::meta(obj) else {
        causes.push(Cause::required("metadata"));
        return;
    };
    let name = meta::name(obj);
    if name.is_empty() {
        causes.push(Cause::required_msg(
            "metadata.name",
            "name or generateName is required",
        ));
    } else if let Some(msg) = name_errors(kind, name) {
        causes.push(Cause::invalid("metadata.name", &json!(name), msg));
    }
    if let Some(labels) = m.get("labels").filter(|v| !v.is_null()) {
        match labels.as_object() {
            Some(labels) => {
                for (k, v) in labels {
                    if let Some(msg) = qualified_name_errors(k) {
                        causes.push(Cause::invalid("metadata.labels", &json!(k), &msg));
                    }
                    match v.as_str() {
                        Some(s) if label_value_ok(s) => {}
                        _ => causes.push(Cause::invalid(
                            "metadata.labels",
                            v,
                            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
                        )),
                    }
                }
            }
            None => causes.push(Cause::invalid("metadata.labels", labels, "must be a map")),
        }
    }
    if let Some(ann) = m.get("annotations").filter(|v| !v.is_null()) {
        match ann.as_object() {
            Some(ann) => {
                let mut total = 0;
                for (k, v) in ann {
                    if let Some(msg) = qualified_name_errors(&k.to_ascii_lowercase()) {
                        causes.push(Cause::invalid("metadata.annotations", &json!(k), &msg));
                    }
                    match v.as_str() {
                        Some(s) => total += k.len() + s.len(),
                        None => causes.push(Cause::invalid(
                            format!("metadata.annotations.{k}"),
                            v,
                            "must be a string",
                        )),
                    }
                }
                if total > 256 * 1024 {
                    causes.push(Cause {
                        reason: "FieldValueTooLong",
                        field: "metadata.annotations".into(),
                        message: "Too long: must have at most 262144 bytes".into(),
                    });
                }
            }
            None => causes.push(Cause::invalid("metadata.annotations", ann, "must be a map")),
        }
    }
    if let Some(fins) = m.get("finalizers").filter(|v| !v.is_null()) {
        match fins.as_array() {
            Some(list) => {
                let mut seen = std::collections::HashSet::new();
                for (i, f) in list.iter().enumerate() {
                    let field = format!("metadata.finalizers[{i}]");
                    let Some(s) = f.as_str() else {
                        causes.push(Cause::invalid(field, f, "must be a string"));
                        continue;
                    };
                    if let Some(msg) = qualified_name_errors(s) {
                        causes.push(Cause::invalid(field, f, &msg));
                    } else if !s.contains('/')
                        && !["kubernetes", "orphan", "foregroundDeletion"].contains(&s)
                    {
                        causes.push(Cause::invalid(
                            field,
                            f,
                            "name is neither a standard finalizer name nor is it fully qualified",
                        ));
                    }
                    if !seen.insert(s) {
                        causes.push(Cause::duplicate("metadata.finalizers", f));
                    }
                }
            }
            None => causes.push(Cause::invalid(
                "metadata.finalizers",
                fins,
                "must be a list",
            )),
        }
    }
}

fn validate_access_modes(modes: Option<&Value>, field: &str, causes: &mut Vec<Cause>) {
    let list = modes.and_then(Value::as_array).filter(|a| !a.is_empty());
    let Some(list) = list else {
        causes.push(Cause::required_msg(
            field,
            "at least 1 access mode is required",
        ));
        return;
    };
    for m in list {
        if !m.as_str().is_some_and(|s| ACCESS_MODES.contains(&s)) {
            causes.push(Cause::unsupported(field, m, ACCESS_MODES));
        }
    }
    if list.len() > 1 && list.iter().any(|m| m == "ReadWriteOncePod") {
        causes.push(Cause::forbidden(
            field,
            "may not use ReadWriteOncePod with other access modes",
        ));
    }
}

fn validate_enum(v: Option<&Value>, field: &str, allowed: &[&str], causes: &mut Vec<Cause>) {
    if let Some(v) = v.filter(|v| !v.is_null())
        && !v.as_str().is_some_and(|s| allowed.contains(&s))
    {
        causes.push(Cause::unsupported(field, v, allowed));
    }
}

fn validate_class_name(v: Option<&Value>, field: &str, causes: &mut Vec<Cause>) {
    if let Some(v) = v.filter(|v| !v.is_null()) {
        match v.as_str() {
            Some("") => {}
            Some(s) if is_dns1123_subdomain(s) => {}
            _ => causes.push(Cause::invalid(field, v, SUBDOMAIN_MSG)),
        }
    }
}

fn validate_pv(obj: &Value, causes: &mut Vec<Cause>) {
    let spec = obj.get("spec").cloned().unwrap_or(Value::Null);
    match spec.get("capacity").and_then(Value::as_object) {
        None => causes.push(Cause::required("spec.capacity")),
        Some(c) if c.is_empty() => causes.push(Cause::required("spec.capacity")),
        Some(c) => {
            for (k, v) in c {
                if k != "storage" {
                    causes.push(Cause::unsupported("spec.capacity", &json!(k), &["storage"]));
                } else if Quantity::from_json(v).is_some_and(|q| q.is_ok_and(|q| q.is_negative())) {
                    causes.push(Cause::invalid(
                        "spec.capacity[storage]",
                        v,
                        "must be greater than or equal to 0",
                    ));
                }
            }
            if !c.contains_key("storage") {
                causes.push(Cause::required("spec.capacity[storage]"));
            }
        }
    }
    validate_access_modes(spec.get("accessModes"), "spec.accessModes", causes);
    let sources: Vec<&str> = VOLUME_SOURCES
        .iter()
        .copied()
        .filter(|s| spec.get(*s).is_some_and(|v| !v.is_null()))
        .collect();
    match sources.len() {
        0 => causes.push(Cause::required_msg("spec", "must specify a volume type")),
        1 => {}
        _ => causes.push(Cause::forbidden(
            "spec",
            "may not specify more than 1 volume type",
        )),
    }
    if let Some(nfs) = spec.get("nfs").filter(|v| !v.is_null()) {
        if nfs
            .get("server")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            causes.push(Cause::required("spec.nfs.server"));
        }
        match nfs.get("path").and_then(Value::as_str) {
            None | Some("") => causes.push(Cause::required("spec.nfs.path")),
            Some(p) if !p.starts_with('/') => causes.push(Cause::invalid(
                "spec.nfs.path",
                &json!(p),
                "must be an absolute path",
            )),
            _ => {}
        }
    }
    validate_enum(
        spec.get("persistentVolumeReclaimPolicy"),
        "spec.persistentVolumeReclaimPolicy",
        &["Delete", "Recycle", "Retain"],
        causes,
    );
    validate_mode_and_class(&spec, causes);
    if let Some(cr) = spec.get("claimRef").filter(|v| !v.is_null())
        && !cr.is_object()
    {
        causes.push(Cause::invalid("spec.claimRef", cr, "must be an object"));
    }
}

/// `volumeMode` and `storageClassName`, which volumes and claims share.
fn validate_mode_and_class(spec: &Value, causes: &mut Vec<Cause>) {
    validate_enum(
        spec.get("volumeMode"),
        "spec.volumeMode",
        &["Block", "Filesystem"],
        causes,
    );
    validate_class_name(
        spec.get("storageClassName"),
        "spec.storageClassName",
        causes,
    );
}

fn validate_pvc(obj: &Value, causes: &mut Vec<Cause>) {
    let spec = obj.get("spec").cloned().unwrap_or(Value::Null);
    validate_access_modes(spec.get("accessModes"), "spec.accessModes", causes);
    match path(&spec, &["resources", "requests", "storage"]) {
        None => causes.push(Cause::required("spec.resources[storage]")),
        Some(v) => {
            if !Quantity::from_json(v).is_some_and(|q| q.is_ok_and(|q| q.is_positive())) {
                causes.push(Cause::invalid(
                    "spec.resources[storage]",
                    v,
                    "must be greater than zero",
                ));
            }
        }
    }
    validate_mode_and_class(&spec, causes);
}

fn validate_storage_class(obj: &Value, causes: &mut Vec<Cause>) {
    match obj.get("provisioner").and_then(Value::as_str) {
        None | Some("") => causes.push(Cause::required("provisioner")),
        Some(p) => {
            if let Some(msg) = qualified_name_errors(p) {
                causes.push(Cause::invalid("provisioner", &json!(p), &msg));
            }
        }
    }
    validate_enum(
        obj.get("reclaimPolicy"),
        "reclaimPolicy",
        &["Delete", "Retain"],
        causes,
    );
    validate_enum(
        obj.get("volumeBindingMode"),
        "volumeBindingMode",
        &["Immediate", "WaitForFirstConsumer"],
        causes,
    );
    if let Some(p) = obj.get("parameters").filter(|v| !v.is_null()) {
        match p.as_object() {
            Some(m) => {
                for (k, v) in m {
                    if !v.is_string() {
                        causes.push(Cause::invalid(
                            format!("parameters.{k}"),
                            v,
                            "must be a string",
                        ));
                    }
                }
            }
            None => causes.push(Cause::invalid("parameters", p, "must be a map")),
        }
    }
}

fn validate_lease(obj: &Value, causes: &mut Vec<Cause>) {
    if let Some(d) = path(obj, &["spec", "leaseDurationSeconds"]).filter(|v| !v.is_null())
        && d.as_i64().is_none_or(|d| d <= 0)
    {
        causes.push(Cause::invalid(
            "spec.leaseDurationSeconds",
            d,
            "must be greater than 0",
        ));
    }
    if let Some(t) = path(obj, &["spec", "leaseTransitions"]).filter(|v| !v.is_null())
        && t.as_i64().is_none_or(|t| t < 0)
    {
        causes.push(Cause::invalid(
            "spec.leaseTransitions",
            t,
            "must be greater than or equal to 0",
        ));
    }
}

fn validate_core_event(obj: &Value, causes: &mut Vec<Cause>) {
    let ns = meta::namespace(obj);
    match obj.get("involvedObject").and_then(Value::as_object) {
        None => causes.push(Cause::required("involvedObject")),
        Some(io) => {
            let io_ns = io.get("namespace").and_then(Value::as_str).unwrap_or("");
            // Events about cluster-scoped objects live in "default"; namespaced ones must
            // sit in their object's namespace.
            if !io_ns.is_empty() && io_ns != ns {
                causes.push(Cause::invalid(
                    "involvedObject.namespace",
                    &json!(io_ns),
                    "does not match event.namespace",
                ));
            }
        }
    }
    validate_enum(obj.get("type"), "type", &["Normal", "Warning"], causes);
}

fn validate_events_v1(obj: &Value, causes: &mut Vec<Cause>) {
    if obj.get("eventTime").is_none_or(Value::is_null) {
        causes.push(Cause::required("eventTime"));
    }
    match obj.get("reportingController").and_then(Value::as_str) {
        None | Some("") => causes.push(Cause::required("reportingController")),
        Some(c) => {
            if let Some(msg) = qualified_name_errors(c) {
                causes.push(Cause::invalid("reportingController", &json!(c), &msg));
            }
        }
    }
    for (field, max) in [("reportingInstance", 128), ("action", 128), ("reason", 128)] {
        match obj.get(field).and_then(Value::as_str) {
            None | Some("") => causes.push(Cause::required(field)),
            Some(s) if s.len() > max => causes.push(Cause {
                reason: "FieldValueTooLong",
                field: field.into(),
                message: format!("Too long: may not be more than {max} bytes"),
            }),
            _ => {}
        }
    }
    match obj.get("type") {
        Some(t) if t == "Normal" || t == "Warning" => {}
        Some(t) => causes.push(Cause::unsupported("type", t, &["Normal", "Warning"])),
        None => causes.push(Cause::required("type")),
    }
    if let Some(n) = obj.get("note").and_then(Value::as_str)
        && n.len() > 1024
    {
        causes.push(Cause {
            reason: "FieldValueTooLong",
            field: "note".into(),
            message: "Too long: may not be more than 1024 bytes".into(),
        });
    }
    if let Some(series) = obj.get("series").filter(|v| !v.is_null()) {
        if series
            .get("count")
            .and_then(Value::as_i64)
            .is_none_or(|c| c < 2)
        {
            causes.push(Cause::invalid(
                "series.count",
                series.get("count").unwrap_or(&Value::Null),
                "should be at least 2",
            ));
        }
        if series.get("lastObservedTime").is_none_or(Value::is_null) {
            causes.push(Cause::required("series.lastObservedTime"));
        }
    }
}

fn validate_namespace(obj: &Value, causes: &mut Vec<Cause>) {
    if let Some(fins) = path(obj, &["spec", "finalizers"]).and_then(Value::as_array) {
        for (i, f) in fins.iter().enumerate() {
            if let Some(msg) = f.as_str().and_then(qualified_name_errors) {
                causes.push(Cause::invalid(format!("spec.finalizers[{i}]"), f, &msg));
            }
        }
    }
}

/// Full validation of an object about to be stored (create or update).
pub fn validate(kind: Kind, obj: &Value) -> Result<(), ApiError> {
    let mut causes = Vec::new();
    if !obj.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    validate_object_meta(kind, obj, &mut causes);
    match kind {
        Kind::PersistentVolume => validate_pv(obj, &mut causes),
        Kind::PersistentVolumeClaim => validate_pvc(obj, &mut causes),
        Kind::StorageClass => validate_storage_class(obj, &mut causes),
        Kind::Lease => validate_lease(obj, &mut causes),
        Kind::CoreEvent => validate_core_event(obj, &mut causes),
        Kind::EventsV1Event => validate_events_v1(obj, &mut causes),
        Kind::Namespace => validate_namespace(obj, &mut causes),
        Kind::Node | Kind::Pod => {}
        Kind::Snapshot | Kind::SnapshotSchedule => {
            if let Some(schema) = crate::custom::schema(kind) {
                crate::custom::validate(schema, obj, &mut causes);
            }
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(kind, meta::name(obj), causes))
    }
}

/// Rules that compare the new object to the stored one.
pub fn validate_update(kind: Kind, old: &Value, new: &Value) -> Result<(), ApiError> {
    let mut causes = Vec::new();
    let old_fins = meta::finalizers(old);
    if meta::is_deleting(old) {
        for f in meta::finalizers(new) {
            if !old_fins.contains(&f) {
                causes.push(Cause::forbidden(
                    "metadata.finalizers",
                    &format!("no new finalizers can be added if the object is being deleted, found new finalizers []string{{\"{f}\"}}"),
                ));
            }
        }
    }
    let spec_of = |o: &Value| o.get("spec").cloned().unwrap_or(Value::Null);
    match kind {
        Kind::PersistentVolume => {
            let (os, ns) = (spec_of(old), spec_of(new));
            let source_of = |s: &Value| -> Map<String, Value> {
                VOLUME_SOURCES
                    .iter()
                    .filter_map(|k| s.get(*k).map(|v| (k.to_string(), v.clone())))
                    .collect()
            };
            if source_of(&os) != source_of(&ns) {
                causes.push(Cause::forbidden(
                    "spec.persistentvolumesource",
                    "spec.persistentvolumesource is immutable after creation",
                ));
            }
            if os.get("volumeMode") != ns.get("volumeMode") {
                causes.push(Cause::immutable("spec.volumeMode", "field is immutable"));
            }
        }
        Kind::PersistentVolumeClaim => claim_validation::validate_update(old, new, &mut causes),
        Kind::StorageClass => {
            for (field, msg) in [
                ("parameters", "updates to parameters are forbidden."),
                ("reclaimPolicy", "updates to reclaimPolicy are forbidden."),
            ] {
                if old.get(field) != new.get(field) {
                    causes.push(Cause::forbidden(field, msg));
                }
            }
            // Kubernetes 1.36 words the provisioner as any immutable field, with its value.
            if old.get("provisioner") != new.get("provisioner") {
                let value = new.get("provisioner").cloned().unwrap_or(Value::Null);
                causes.push(Cause::invalid("provisioner", &value, "field is immutable"));
            }
            if old.get("volumeBindingMode") != new.get("volumeBindingMode") {
                causes.push(Cause::immutable("volumeBindingMode", "field is immutable"));
            }
        }
        _ => {
            if let Some(schema) = crate::custom::schema(kind) {
                crate::custom::validate_transition(schema, old, new, &mut causes);
            }
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(kind, meta::name(new), causes))
    }
}

/// A Pod update changing what only a binding may set, worded as the real server's
/// (the text after the list of mutable fields is an outline, not its exact diff).
pub fn pod_spec_immutable(name: &str, old: &Value, new: &Value) -> ApiError {
    let node = |o: &Value| {
        o.get("spec")
            .and_then(|s| s.get("nodeName"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    ApiError::invalid(
        Kind::Pod,
        name,
        vec![Cause::forbidden(
            "spec",
            &format!(
                "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)\n- \"NodeName\": {:?},\n+ \"NodeName\": {:?},\n",
                node(old),
                node(new)
            ),
        )],
    )
}

/// Rules for writes to a `/status` subresource, where the real server checks the status
/// instead of the spec.
pub fn validate_status_update(kind: Kind, new: &Value) -> Result<(), ApiError> {
    let mut causes = Vec::new();
    if kind == Kind::PersistentVolumeClaim {
        claim_validation::validate_status_update(new, &mut causes);
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(kind, meta::name(new), causes))
    }
}

/// Server-side defaults applied on every write (after decoding, as the real API's
/// defaulting functions do).
pub fn apply_defaults(kind: Kind, obj: &mut Value) {
    let set_default = |o: &mut Value, keys: &[&str], v: Value| {
        let mut cur = o;
        for k in &keys[..keys.len() - 1] {
            if !cur.get(*k).is_some_and(Value::is_object) {
                cur[*k] = json!({});
            }
            cur = &mut cur[*k];
        }
        let last = keys[keys.len() - 1];
        if cur.get(last).is_none_or(Value::is_null) {
            cur[last] = v;
        }
    };
    match kind {
        Kind::PersistentVolume => {
            set_default(
                obj,
                &["spec", "persistentVolumeReclaimPolicy"],
                json!("Retain"),
            );
            set_default(obj, &["spec", "volumeMode"], json!("Filesystem"));
        }
        Kind::PersistentVolumeClaim => {
            set_default(obj, &["spec", "volumeMode"], json!("Filesystem"));
        }
        Kind::StorageClass => {
            set_default(obj, &["reclaimPolicy"], json!("Delete"));
            set_default(obj, &["volumeBindingMode"], json!("Immediate"));
        }
        Kind::Namespace => {
            set_default(obj, &["spec", "finalizers"], json!(["kubernetes"]));
            set_default(obj, &["status", "phase"], json!("Active"));
            let name = meta::name(obj).to_string();
            let m = meta::meta_mut(obj);
            if !m.get("labels").is_some_and(Value::is_object) {
                m.insert("labels".into(), json!({}));
            }
            if let Some(l) = m.get_mut("labels").and_then(Value::as_object_mut) {
                l.insert("kubernetes.io/metadata.name".into(), json!(name));
            }
        }
        _ => {}
    }
}
