//! API errors rendered as real `meta/v1 Status` objects, with the reasons, codes and
//! message wording kube-apiserver uses, because controllers branch on `reason`/`code`
//! and tests compare messages.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::resources::Kind;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
    /// Seconds for a `Retry-After` header (429 answers).
    pub retry_after: Option<u32>,
}

/// One field error of an `Invalid` answer.
#[derive(Debug, Clone)]
pub struct Cause {
    pub reason: &'static str,
    pub field: String,
    pub message: String,
}

impl Cause {
    pub fn required(field: impl Into<String>) -> Self {
        Cause {
            reason: "FieldValueRequired",
            field: field.into(),
            message: "Required value".into(),
        }
    }

    pub fn required_msg(field: impl Into<String>, detail: &str) -> Self {
        Cause {
            reason: "FieldValueRequired",
            field: field.into(),
            message: format!("Required value: {detail}"),
        }
    }

    pub fn invalid(field: impl Into<String>, value: &Value, detail: &str) -> Self {
        Cause {
            reason: "FieldValueInvalid",
            field: field.into(),
            message: format!("Invalid value: {}: {detail}", render_value(value)),
        }
    }

    pub fn forbidden(field: impl Into<String>, detail: &str) -> Self {
        Cause {
            reason: "FieldValueForbidden",
            field: field.into(),
            message: format!("Forbidden: {detail}"),
        }
    }

    pub fn unsupported(field: impl Into<String>, value: &Value, supported: &[&str]) -> Self {
        let list: Vec<String> = supported.iter().map(|s| format!("\"{s}\"")).collect();
        Cause {
            reason: "FieldValueNotSupported",
            field: field.into(),
            message: format!(
                "Unsupported value: {}: supported values: {}",
                render_value(value),
                list.join(", ")
            ),
        }
    }

    pub fn duplicate(field: impl Into<String>, value: &Value) -> Self {
        Cause {
            reason: "FieldValueDuplicate",
            field: field.into(),
            message: format!("Duplicate value: {}", render_value(value)),
        }
    }

    pub fn immutable(field: impl Into<String>, detail: &str) -> Self {
        Cause::invalid(field, &Value::Null, detail)
    }
}

fn render_value(v: &Value) -> String {
    match v {
        Value::String(s) => format!("\"{s}\""),
        Value::Null => "null".into(),
        other => other.to_string(),
    }
}

fn details(kind: Kind, name: &str, kind_field: &str) -> Value {
    let mut d = json!({ "name": name, "kind": kind_field });
    let group = kind.info().group;
    if !group.is_empty() {
        d["group"] = json!(group);
    }
    d
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    pub fn not_found(kind: Kind, name: &str) -> Self {
        let mut e = Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", kind.qualified_resource()),
        );
        e.details = Some(details(kind, name, kind.info().plural));
        e
    }

    pub fn namespace_not_found(ns: &str) -> Self {
        Self::not_found(Kind::Namespace, ns)
    }

    pub fn already_exists(kind: Kind, name: &str) -> Self {
        let mut e = Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", kind.qualified_resource()),
        );
        e.details = Some(details(kind, name, kind.info().plural));
        e
    }

    /// The optimistic-concurrency failure every controller retries on.
    pub fn conflict_modified(kind: Kind, name: &str) -> Self {
        Self::conflict(
            kind,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// A delete or update whose precondition names another object than the stored one.
    pub fn uid_precondition(kind: Kind, name: &str, wanted: &str, stored: &str) -> Self {
        Self::conflict(
            kind,
            name,
            &format!(
                "Precondition failed: UID in precondition: {wanted}, UID in object meta: {stored}"
            ),
        )
    }

    pub fn conflict(kind: Kind, name: &str, detail: &str) -> Self {
        let mut e = Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {detail}",
                kind.qualified_resource()
            ),
        );
        e.details = Some(details(kind, name, kind.info().plural));
        e
    }

    /// Server-side apply refused: fields owned by other managers would change.
    pub fn apply_conflicts(kind: Kind, name: &str, conflicts: &[(String, String)]) -> Self {
        let n = conflicts.len();
        let listed: Vec<String> = conflicts
            .iter()
            .map(|(m, f)| format!("conflict with {m}: {f}"))
            .collect();
        let mut e = Self::new(
            409,
            "Conflict",
            format!(
                "Apply failed with {n} conflict{}: {}",
                if n == 1 { "" } else { "s" },
                listed.join("\n")
            ),
        );
        let mut d = details(kind, name, kind.info().plural);
        d["causes"] = Value::Array(
            conflicts
                .iter()
                .map(|(m, f)| {
                    json!({
                        "reason": "FieldManagerConflict",
                        "message": format!("conflict with {m}"),
                        "field": f,
                    })
                })
                .collect(),
        );
        e.details = Some(d);
        e
    }

    pub fn invalid(kind: Kind, name: &str, causes: Vec<Cause>) -> Self {
        let rendered: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        let joined = if rendered.len() == 1 {
            rendered[0].clone()
        } else {
            format!("[{}]", rendered.join(", "))
        };
        let kind_name = kind.info().kind;
        let mut e = Self::new(
            422,
            "Invalid",
            format!("{} \"{name}\" is invalid: {joined}", kind.qualified_kind()),
        );
        let mut d = details(kind, name, kind_name);
        d["causes"] = Value::Array(
            causes
                .iter()
                .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                .collect(),
        );
        e.details = Some(d);
        e
    }

    /// A custom object whose `kind` names another kind of the URL's group: refused by
    /// the CRD's validation, under the kind the body named.
    pub fn invalid_kind(kind: Kind, name: &str, named: &str) -> Self {
        let cause = Cause::invalid(
            "kind",
            &json!(named),
            &format!("must be {}", kind.info().kind),
        );
        let group = kind.info().group;
        let mut e = Self::new(
            422,
            "Invalid",
            format!(
                "{named}.{group} \"{name}\" is invalid: kind: {}",
                cause.message
            ),
        );
        e.details = Some(json!({
            "name": name,
            "group": group,
            "kind": named,
            "causes": [{"reason": cause.reason, "message": cause.message, "field": cause.field}],
        }));
        e
    }

    /// A replace of a custom object without `metadata.resourceVersion`: unlike the
    /// built-in kinds, custom resources are never updated unconditionally.
    pub fn resource_version_required(kind: Kind, name: &str) -> Self {
        let cause = Cause::invalid(
            "metadata.resourceVersion",
            &json!(0),
            "must be specified for an update",
        );
        let mut e = Self::new(
            422,
            "Invalid",
            format!(
                "{} \"{name}\" is invalid: {}: {}",
                kind.qualified_resource(),
                cause.field,
                cause.message
            ),
        );
        let mut d = details(kind, name, kind.info().plural);
        d["causes"] =
            json!([{"reason": cause.reason, "message": cause.message, "field": cause.field}]);
        e.details = Some(d);
        e
    }

    /// A body the server cannot decode as the URL's kind, worded as the real server's
    /// `transformDecodeError`: a custom object without `kind` is quoted whole, then its
    /// first 30 bytes.
    pub fn unrecognized(kind: Kind, body: &[u8]) -> Self {
        let text = String::from_utf8_lossy(body);
        let summary = if body.is_empty() {
            "<empty>".to_owned()
        } else if body.len() > 30 {
            format!("{} ...", String::from_utf8_lossy(&body[..30]))
        } else {
            text.to_string()
        };
        Self::bad_request(format!(
            "the object provided is unrecognized (must be of type {}): Object 'Kind' is missing in '{text}' ({summary})",
            kind.info().kind
        ))
    }

    /// A built-in object whose `apiVersion`/`kind` are not the URL's, as the real
    /// server's scheme answers.
    pub fn cannot_handle(kind: Kind, api_version: &str, named: &str) -> Self {
        let version = api_version.rsplit('/').next().unwrap_or(api_version);
        let expected = kind.info().kind;
        let why = if version != kind.info().version {
            format!(
                "no kind \"{named}\" is registered for version \"{api_version}\" in scheme \"pkg/api/legacyscheme/scheme.go:30\""
            )
        } else {
            let group = kind.info().group;
            let internal = if group.is_empty() {
                "core"
            } else {
                group.split('.').next().unwrap_or(group)
            };
            format!("converting ({version}.{named}) to ({internal}.{expected}): unknown conversion")
        };
        Self::bad_request(format!(
            "{named} in version \"{version}\" cannot be handled as a {expected}: {why}"
        ))
    }

    /// An apply whose configuration lacks `apiVersion` or `kind`.
    pub fn invalid_object_type(api_version: &str, kind: &str) -> Self {
        let group_version = if api_version.is_empty() {
            "/"
        } else {
            api_version
        };
        Self::bad_request(format!("invalid object type: {group_version}, Kind={kind}"))
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// A request about a named object refused by policy (admission plugins), worded and
    /// detailed as the real `NewForbidden` does.
    pub fn forbidden_for(kind: Kind, name: &str, detail: &str) -> Self {
        let mut e = Self::new(
            403,
            "Forbidden",
            format!(
                "{} \"{name}\" is forbidden: {detail}",
                kind.qualified_resource()
            ),
        );
        e.details = Some(details(kind, name, kind.info().plural));
        e
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {content_type:?})"
            ),
        )
    }

    /// A strategic merge patch of a custom object: custom resources have no patch
    /// strategy, so the real server lists the other patch types only.
    pub fn no_strategic_merge() -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        )
    }

    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// A 500 the real server sends without a `reason` (a plain error of its storage
    /// layer, e.g. a `resourceVersion` on create).
    pub fn unreasoned(message: impl Into<String>) -> Self {
        Self::new(500, "", message)
    }

    pub fn too_many_requests(retry_after: u32) -> Self {
        let mut e = Self::new(
            429,
            "TooManyRequests",
            "the server has received too many requests and has asked us to try again later",
        );
        e.details = Some(json!({ "retryAfterSeconds": retry_after }));
        e.retry_after = Some(retry_after);
        e
    }

    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(504, "Timeout", message)
    }

    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if self.reason.is_empty()
            && let Some(o) = s.as_object_mut()
        {
            o.remove("reason");
        }
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = self.to_status().to_string();
        let mut resp = (code, body).into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(secs) = self.retry_after
            && let Ok(v) = HeaderValue::from_str(&secs.to_string())
        {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        resp
    }
}
