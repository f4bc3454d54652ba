//! Events the in-process controllers record, written as client-go's event recorder writes
//! them (core/v1, `source.component` and `reportingComponent` set to the controller's
//! name). Each occurrence is recorded once rather than repeated with a growing count on
//! every pass, so tests can count them.

use std::collections::HashSet;

use serde_json::{Value, json};

use crate::api::Api;
use crate::meta;
use crate::resources::Kind;

/// What an event says.
pub struct Note<'a> {
    pub type_: &'a str,
    pub reason: &'a str,
    pub message: &'a str,
}

pub struct Recorder {
    api: Api,
    component: &'static str,
    /// (object uid, reason, message, occurrence) already recorded.
    recorded: HashSet<(String, String, String, String)>,
}

impl Recorder {
    pub fn new(api: Api, component: &'static str) -> Self {
        Recorder {
            api,
            component,
            recorded: HashSet::new(),
        }
    }

    /// Record `note` about `obj` unless it was recorded before for the same `occurrence`;
    /// the occurrence tells apart repeats that are news (a resize to a new size) from ones
    /// that are not (the same state seen on the next pass).
    pub fn record(&mut self, obj: &Value, kind: Kind, note: Note<'_>, occurrence: &str) {
        let uid = meta::meta_str(obj, "uid").unwrap_or("");
        let key = (
            uid.to_string(),
            note.reason.to_string(),
            note.message.to_string(),
            occurrence.to_string(),
        );
        if !self.recorded.insert(key) {
            return;
        }
        // Events about cluster-scoped objects live in "default".
        let ns = if kind.info().namespaced {
            meta::namespace(obj).to_string()
        } else {
            "default".to_string()
        };
        let now = meta::now_time();
        let mut involved = json!({
            "kind": kind.info().kind,
            "name": meta::name(obj),
            "uid": uid,
            "apiVersion": kind.api_version(),
            "resourceVersion": meta::resource_version(obj),
        });
        if kind.info().namespaced {
            involved["namespace"] = json!(ns);
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let ev = json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": format!("{}.{nanos:x}", meta::name(obj)),
                "namespace": ns,
            },
            "involvedObject": involved,
            "reason": note.reason,
            "message": note.message,
            "type": note.type_,
            "source": { "component": self.component },
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": self.component,
            "reportingInstance": "",
        });
        if let Err(e) = self.api.create(Kind::CoreEvent, &ns, ev, false) {
            tracing::debug!("recording event {}: {e}", note.reason);
        }
    }
}
