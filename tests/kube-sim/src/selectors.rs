//! Label and field selectors as the real API parses them; unsupported field selectors
//! are rejected rather than ignored, so a controller cannot rely on a filter a real
//! server would refuse.

use serde_json::Value;

use crate::errors::ApiError;
use crate::meta;
use crate::resources::Kind;

#[derive(Debug, Clone)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

#[derive(Debug, Clone, Default)]
pub struct LabelSelector(Vec<Req>);

/// Split on commas that are not inside a `(...)` value set.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn bad_selector(s: &str) -> ApiError {
    ApiError::bad_request(format!(
        "unable to parse requirement: found '{s}', expected: valid selector"
    ))
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let req = if let Some((k, v)) = part.split_once("!=") {
                Req::Ne(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some(idx) = part.find(" notin ") {
                Req::NotIn(part[..idx].trim().into(), parse_set(&part[idx + 7..])?)
            } else if let Some(idx) = part.find(" in ") {
                Req::In(part[..idx].trim().into(), parse_set(&part[idx + 4..])?)
            } else if let Some(k) = part.strip_prefix('!') {
                Req::NotExists(k.trim().into())
            } else {
                Req::Exists(part.into())
            };
            let key = match &req {
                Req::Eq(k, _)
                | Req::Ne(k, _)
                | Req::In(k, _)
                | Req::NotIn(k, _)
                | Req::Exists(k)
                | Req::NotExists(k) => k,
            };
            if crate::names::qualified_name_errors(key).is_some() {
                return Err(bad_selector(part));
            }
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => meta::label(obj, k) == Some(v.as_str()),
            Req::Ne(k, v) => meta::label(obj, k) != Some(v.as_str()),
            Req::In(k, vs) => meta::label(obj, k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Req::NotIn(k, vs) => !meta::label(obj, k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Req::Exists(k) => meta::label(obj, k).is_some(),
            Req::NotExists(k) => meta::label(obj, k).is_none(),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn parse_set(s: &str) -> Result<Vec<String>, ApiError> {
    let s = s.trim();
    let inner = s
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| bad_selector(s))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

#[derive(Debug, Clone, Default)]
pub struct FieldSelector(Vec<(String, bool, String)>);

/// The field labels each kind supports (metadata.name/namespace everywhere, plus the
/// kind-specific ones registered by the real server).
fn supported_fields(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Namespace => &["metadata.name", "status.phase"],
        Kind::PersistentVolumeClaim => &["metadata.name", "metadata.namespace"],
        Kind::PersistentVolume => &["metadata.name"],
        Kind::CoreEvent => &[
            "metadata.name",
            "metadata.namespace",
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        Kind::EventsV1Event => &[
            "metadata.name",
            "metadata.namespace",
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "reason",
            "reportingController",
            "type",
        ],
        Kind::StorageClass => &["metadata.name"],
        Kind::Lease => &["metadata.name", "metadata.namespace"],
        Kind::Node => &["metadata.name", "spec.unschedulable"],
        Kind::Snapshot | Kind::SnapshotSchedule => &["metadata.name", "metadata.namespace"],
        Kind::Pod => &[
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
    }
}

fn field_value(obj: &Value, field: &str) -> String {
    if field == "source" {
        return meta::path_str(obj, &["source", "component"])
            .unwrap_or("")
            .to_string();
    }
    let keys: Vec<&str> = field.split('.').collect();
    match meta::path(obj, &keys) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(v) => v.to_string(),
    }
}

impl FieldSelector {
    pub fn parse(kind: Kind, s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let (k, neg, v) = if let Some((k, v)) = part.split_once("!=") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, false, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                )));
            };
            let k = k.trim();
            if !(supported_fields(kind).contains(&k)
                || k == "metadata.namespace" && kind.info().namespaced)
            {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {k}"
                )));
            }
            reqs.push((k.to_string(), neg, v.trim().to_string()));
        }
        Ok(FieldSelector(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0
            .iter()
            .all(|(k, neg, v)| (field_value(obj, k) == *v) != *neg)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[derive(Debug, Clone, Default)]
pub struct Selectors {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selectors {
    pub fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }
}
