//! `events.k8s.io/v1` Events are another view of the `core/v1` Events in the real API
//! (one storage, converted per request). Keeping one storage here too means an event the
//! controller records through kube-runtime's `Recorder` (events.k8s.io) is what
//! `kubectl get events` and core/v1 clients see, and the other way round.

use serde_json::{Map, Value};

/// (events.k8s.io/v1 field, core/v1 field) pairs that only differ in name.
const RENAMED: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

const SAME: &[&str] = &[
    "metadata",
    "eventTime",
    "series",
    "related",
    "action",
    "reason",
    "reportingInstance",
    "type",
];

fn convert(obj: &Value, api_version: &str, to_core: bool) -> Value {
    let mut out = Map::new();
    out.insert("apiVersion".into(), Value::String(api_version.into()));
    out.insert("kind".into(), Value::String("Event".into()));
    let Some(o) = obj.as_object() else {
        return Value::Object(out);
    };
    for k in SAME {
        if let Some(v) = o.get(*k) {
            out.insert((*k).into(), v.clone());
        }
    }
    for (v1, core) in RENAMED {
        let (from, to) = if to_core { (v1, core) } else { (core, v1) };
        if let Some(v) = o.get(*from) {
            out.insert((*to).into(), v.clone());
        }
    }
    Value::Object(out)
}

pub fn v1_to_core(obj: &Value) -> Value {
    convert(obj, "v1", true)
}

pub fn core_to_v1(obj: &Value) -> Value {
    convert(obj, "events.k8s.io/v1", false)
}
