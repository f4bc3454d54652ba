//! HTTP routing: maps kube-apiserver URL shapes and verbs onto the API operations, and
//! renders results and errors the way the real server does.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::api::{Api, DeleteOptions, DeleteOutcome, PatchType, Sub, present};
use crate::discovery;
use crate::errors::ApiError;
use crate::faults::{FaultControl, InjectedError};
use crate::list::{ContinueCache, ListItem, Page};
use crate::meta;
use crate::resources::Kind;
use crate::selectors::{FieldSelector, LabelSelector, Selectors};
use crate::watch::{self, WatchRequest};

pub struct AppState {
    pub api: Api,
    pub faults: Arc<FaultControl>,
    pub continues: ContinueCache,
    pub max_watch_timeout: Duration,
    pub bookmark_interval: Duration,
}

type Shared = Arc<AppState>;

pub fn router(state: Shared) -> Router {
    Router::new()
        .route(
            "/version",
            get(|| async { json_response(StatusCode::OK, &discovery::version()) }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .fallback(api_handler)
        .layer(middleware::from_fn_with_state(state.clone(), fault_layer))
        // Admin routes are outside the fault layer so tests can always switch faults off.
        .route("/_sim/faults", post(set_faults).delete(clear_faults))
        .route("/_sim/drop-watches", post(drop_watches))
        .route("/_sim/compact", post(compact))
        .with_state(state)
}

async fn fault_layer(State(st): State<Shared>, req: Request, next: Next) -> Response {
    let (latency, err) = st.faults.on_request();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    if let Some(e) = err {
        return e.into_response();
    }
    next.run(req).await
}

#[derive(serde::Deserialize)]
struct FaultsBody {
    #[serde(default)]
    error_rate: f64,
    /// 500 or 429.
    #[serde(default)]
    error_code: Option<u16>,
    #[serde(default)]
    retry_after_secs: Option<u32>,
    #[serde(default)]
    latency_ms: Option<u64>,
}

async fn set_faults(State(st): State<Shared>, body: Bytes) -> Response {
    let b: FaultsBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            return ApiError::bad_request(format!("invalid faults body: {e}")).into_response();
        }
    };
    let err = match b.error_code {
        None | Some(500) => InjectedError::Internal,
        Some(429) => InjectedError::TooManyRequests {
            retry_after_secs: b.retry_after_secs.unwrap_or(1),
        },
        Some(other) => {
            return ApiError::bad_request(format!("error_code must be 500 or 429, not {other}"))
                .into_response();
        }
    };
    st.faults.set_error_rate(b.error_rate, err);
    st.faults
        .set_latency(Duration::from_millis(b.latency_ms.unwrap_or(0)));
    StatusCode::NO_CONTENT.into_response()
}

async fn clear_faults(State(st): State<Shared>) -> Response {
    st.faults.clear();
    StatusCode::NO_CONTENT.into_response()
}

async fn drop_watches(State(st): State<Shared>) -> Response {
    st.faults.drop_watches();
    StatusCode::NO_CONTENT.into_response()
}

async fn compact(State(st): State<Shared>) -> Response {
    st.api.store.compact();
    StatusCode::NO_CONTENT.into_response()
}

pub fn json_response(code: StatusCode, v: &impl serde::Serialize) -> Response {
    match serde_json::to_vec(v) {
        Ok(body) => {
            let mut r = (code, body).into_response();
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        }
        Err(e) => ApiError::internal(format!("serialising response: {e}")).into_response(),
    }
}

/// A resource request after URL parsing.
struct Target {
    kind: Kind,
    namespace: Option<String>,
    name: Option<String>,
    sub: Sub,
}

enum Route {
    Doc(Value),
    Resource(Target),
}

fn not_found_path() -> ApiError {
    let mut e = ApiError::bad_request("the server could not find the requested resource");
    e.code = 404;
    e.reason = "NotFound";
    e.details = Some(json!({}));
    e
}

fn route(path: &str) -> Result<Route, ApiError> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
        ["api"] => return Ok(Route::Doc(discovery::core_versions())),
        ["apis"] => return Ok(Route::Doc(discovery::groups())),
        ["apis", g] => {
            return discovery::group(g)
                .map(Route::Doc)
                .ok_or_else(not_found_path);
        }
        ["api", v] => {
            return discovery::resource_list("", v)
                .map(Route::Doc)
                .ok_or_else(not_found_path);
        }
        ["apis", g, v] => {
            return discovery::resource_list(g, v)
                .map(Route::Doc)
                .ok_or_else(not_found_path);
        }
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(not_found_path()),
    };
    let namespaced_path = rest.len() >= 3
        && rest[0] == "namespaces"
        && Kind::lookup(group, version, rest[2]).is_some_and(|k| k.info().namespaced);
    let (namespace, rest) = if namespaced_path {
        (Some(rest[1].to_string()), &rest[2..])
    } else {
        (None, rest)
    };
    let kind = rest
        .first()
        .and_then(|p| Kind::lookup(group, version, p))
        .ok_or_else(not_found_path)?;
    let name = rest.get(1).map(|s| s.to_string());
    let sub = match rest.get(2) {
        None => Sub::Main,
        Some(&"status") if kind.info().has_status => Sub::Status,
        Some(&"binding") if kind == Kind::Pod => Sub::Binding,
        Some(_) => return Err(not_found_path()),
    };
    if rest.len() > 3 {
        return Err(not_found_path());
    }
    // A namespaced kind addressed without a namespace is only valid for list/watch across
    // all namespaces; a cluster-scoped kind never lives under /namespaces/{ns}.
    if kind.info().namespaced && namespace.is_none() && name.is_some() {
        return Err(not_found_path());
    }
    if name.as_deref() == Some("") {
        return Err(not_found_path());
    }
    Ok(Route::Resource(Target {
        kind,
        namespace,
        name,
        sub,
    }))
}

fn parse_body(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
    })
}

fn dry_run(q: &HashMap<String, String>) -> Result<bool, ApiError> {
    match q.get("dryRun").map(String::as_str) {
        None | Some("") => Ok(false),
        Some("All") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "Invalid dryRun value: {other}: supported values: \"All\""
        ))),
    }
}

async fn api_handler(
    State(st): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match handle(&st, method, &uri, &headers, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn handle(
    st: &Shared,
    method: Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let target = match route(uri.path())? {
        Route::Doc(doc) => {
            return if method == Method::GET {
                Ok(json_response(StatusCode::OK, &doc))
            } else {
                Err(ApiError::method_not_allowed(
                    "the server does not allow this method on the requested resource",
                ))
            };
        }
        Route::Resource(t) => t,
    };
    let q: HashMap<String, String> = Query::try_from_uri(uri)
        .map(|Query(q)| q)
        .map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if content_type.contains("protobuf") {
        return Err(ApiError::unsupported_media_type(content_type));
    }
    let api = &st.api;
    let kind = target.kind;
    // Like the real server: the fieldManager parameter, else the client's User-Agent up
    // to the first '/'.
    let user_agent = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("unknown");
    let manager = q
        .get("fieldManager")
        .filter(|m| !m.is_empty())
        .cloned()
        .unwrap_or_else(|| {
            user_agent
                .split('/')
                .next()
                .unwrap_or("unknown")
                .to_string()
        });
    let ns = target.namespace.clone().unwrap_or_default();
    let not_allowed = || {
        ApiError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        )
    };
    match (&method, target.name.as_deref()) {
        (&Method::GET, None) => {
            let watching = matches!(q.get("watch").map(String::as_str), Some("true" | "1"));
            if watching {
                watch_collection(st, &target, &q)
            } else {
                list_collection(st, &target, &q)
            }
        }
        (&Method::POST, None) => {
            if target.sub != Sub::Main {
                return Err(not_allowed());
            }
            if kind.info().namespaced && target.namespace.is_none() {
                return Err(not_found_path());
            }
            let parsed = parse_body(&body)?;
            crate::api::check_raw_type_meta(kind, &body, &parsed)?;
            let obj = api.create_as(kind, &ns, parsed, dry_run(&q)?, &manager)?;
            Ok(json_response(StatusCode::CREATED, &*obj))
        }
        (&Method::POST, Some(name)) if target.sub == Sub::Binding => {
            api.bind_pod(&ns, name, &parse_body(&body)?)?;
            Ok(json_response(
                StatusCode::CREATED,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
            ))
        }
        (&Method::DELETE, None) => delete_collection(st, &target, &q),
        (&Method::GET, Some(name)) => {
            Ok(json_response(StatusCode::OK, &*api.get(kind, &ns, name)?))
        }
        (&Method::PUT, Some(name)) => {
            let parsed = parse_body(&body)?;
            crate::api::check_raw_type_meta(kind, &body, &parsed)?;
            let obj = api.update(kind, &ns, name, parsed, target.sub, dry_run(&q)?, &manager)?;
            Ok(json_response(StatusCode::OK, &*obj))
        }
        (&Method::PATCH, Some(name)) => {
            let pt = PatchType::from_content_type(content_type)?;
            if pt != PatchType::Apply && q.contains_key("force") {
                return Err(ApiError::unprocessable(
                    "PatchOptions.meta.k8s.io \"\" is invalid: force: Forbidden: may not be specified for non-apply patch",
                ));
            }
            if pt == PatchType::Apply && q.get("fieldManager").is_none_or(|m| m.is_empty()) {
                return Err(ApiError::unprocessable(
                    "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                ));
            }
            let force = matches!(q.get("force").map(String::as_str), Some("true" | "1"));
            let parsed = parse_body(&body)?;
            if pt == PatchType::Apply {
                crate::api::check_apply_type_meta(&parsed)?;
            }
            let (obj, created) = api.patch(
                kind,
                &ns,
                name,
                pt,
                parsed,
                target.sub,
                &manager,
                force,
                dry_run(&q)?,
            )?;
            let code = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(json_response(code, &*obj))
        }
        (&Method::DELETE, Some(name)) => {
            if target.sub != Sub::Main {
                return Err(not_allowed());
            }
            let opts = delete_options(&body, &q)?;
            match api.delete(kind, &ns, name, &opts)? {
                DeleteOutcome::Pending(obj) => Ok(json_response(StatusCode::OK, &*obj)),
                DeleteOutcome::Deleted(obj) => {
                    let mut details = json!({
                        "name": name,
                        "kind": kind.info().plural,
                        "uid": meta::meta_str(&obj, "uid").unwrap_or(""),
                    });
                    if !kind.info().group.is_empty() {
                        details["group"] = json!(kind.info().group);
                    }
                    Ok(json_response(
                        StatusCode::OK,
                        &json!({
                            "kind": "Status",
                            "apiVersion": "v1",
                            "metadata": {},
                            "status": "Success",
                            "details": details,
                        }),
                    ))
                }
            }
        }
        _ => Err(not_allowed()),
    }
}

fn delete_options(body: &Bytes, q: &HashMap<String, String>) -> Result<DeleteOptions, ApiError> {
    let mut opts = DeleteOptions {
        dry_run: dry_run(q)?,
        ..Default::default()
    };
    let trimmed = body.iter().all(u8::is_ascii_whitespace);
    if !trimmed {
        let v = parse_body(body)?;
        if let Some(p) = v.get("preconditions").filter(|p| !p.is_null()) {
            opts.uid = p.get("uid").and_then(Value::as_str).map(str::to_string);
            opts.resource_version = p
                .get("resourceVersion")
                .and_then(Value::as_str)
                .map(str::to_string);
        }
        if let Some(d) = v.get("dryRun").and_then(Value::as_array) {
            for x in d {
                if x != "All" {
                    return Err(ApiError::bad_request(format!(
                        "Invalid dryRun value: {x}: supported values: \"All\""
                    )));
                }
                opts.dry_run = true;
            }
        }
        if let Some(p) = v.get("propagationPolicy").and_then(Value::as_str)
            && !["Orphan", "Background", "Foreground"].contains(&p)
        {
            return Err(ApiError::unprocessable(format!(
                "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: \"{p}\": supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\""
            )));
        }
    }
    Ok(opts)
}

fn selectors(kind: Kind, q: &HashMap<String, String>) -> Result<Selectors, ApiError> {
    Ok(Selectors {
        labels: LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))?,
        fields: FieldSelector::parse(
            kind,
            q.get("fieldSelector").map(String::as_str).unwrap_or(""),
        )?,
    })
}

fn parse_rv(s: &str) -> Result<u64, ApiError> {
    s.parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s:?}")))
}

fn matching(st: &Shared, t: &Target, sel: &Selectors) -> (Vec<Arc<Value>>, u64) {
    let (items, rv) = if t.kind == Kind::EventsV1Event {
        let (items, rv) = st
            .api
            .store
            .snapshot(Kind::CoreEvent, t.namespace.as_deref());
        let items = items.into_iter().map(|o| present(t.kind, o)).collect();
        (items, rv)
    } else {
        st.api.store.snapshot(t.kind, t.namespace.as_deref())
    };
    if sel.is_empty() {
        return (items, rv);
    }
    (items.into_iter().filter(|o| sel.matches(o)).collect(), rv)
}

fn list_collection(
    st: &Shared,
    t: &Target,
    q: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    let sel = selectors(t.kind, q)?;
    let limit = match q.get("limit") {
        Some(l) => Some(
            l.parse::<i64>()
                .map_err(|_| ApiError::bad_request(format!("invalid limit: {l:?}")))?
                .max(0) as usize,
        ),
        None => None,
    };
    let rv = q.get("resourceVersion").map(String::as_str).unwrap_or("");
    let rv_match = q
        .get("resourceVersionMatch")
        .map(String::as_str)
        .unwrap_or("");
    let page: Page = if let Some(token) = q.get("continue").filter(|c| !c.is_empty()) {
        if !rv.is_empty() {
            return Err(ApiError::bad_request(
                "specifying resource version is not allowed when using continue",
            ));
        }
        st.continues.next_page(token, limit)?
    } else {
        if !rv_match.is_empty() {
            if rv.is_empty() {
                return Err(ApiError::unprocessable(
                    "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
                ));
            }
            if rv_match != "NotOlderThan" && rv_match != "Exact" {
                return Err(ApiError::bad_request(format!(
                    "resourceVersionMatch: Unsupported value: \"{rv_match}\": supported values: \"Exact\", \"NotOlderThan\""
                )));
            }
        }
        let (items, current) = matching(st, t, &sel);
        if !rv.is_empty() {
            let want = parse_rv(rv)?;
            if rv_match == "Exact" {
                if want == 0 {
                    return Err(ApiError::bad_request(
                        "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                    ));
                }
                if want < current {
                    // Past snapshots are not kept; a client asking for one gets the
                    // answer a compacted etcd would give.
                    return Err(ApiError::expired(
                        "The resourceVersion for the provided list is too old.",
                    ));
                }
            }
            if want > current {
                return Err(ApiError::timeout(format!(
                    "Too large resource version: {want}, current: {current}"
                )));
            }
        }
        st.continues.first_page(items, current, limit)
    };
    let mut metadata = json!({ "resourceVersion": page.rv.to_string() });
    if let Some(c) = &page.continue_token {
        metadata["continue"] = json!(c);
    }
    if let Some(r) = page.remaining {
        metadata["remainingItemCount"] = json!(r);
    }
    #[derive(serde::Serialize)]
    struct ListBody<'a> {
        kind: String,
        #[serde(rename = "apiVersion")]
        api_version: String,
        metadata: Value,
        items: Vec<ListItem<'a>>,
    }
    let body = ListBody {
        kind: format!("{}List", t.kind.info().kind),
        api_version: t.kind.api_version(),
        metadata,
        items: page.items.iter().map(|o| ListItem(o)).collect(),
    };
    Ok(json_response(StatusCode::OK, &body))
}

fn watch_collection(
    st: &Shared,
    t: &Target,
    q: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    let sel = selectors(t.kind, q)?;
    let flag = |k: &str| matches!(q.get(k).map(String::as_str), Some("true" | "1"));
    let timeout = match q.get("timeoutSeconds") {
        Some(s) => {
            let secs: u64 = s
                .parse()
                .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds: {s:?}")))?;
            Duration::from_secs(secs).min(st.max_watch_timeout)
        }
        None => st.max_watch_timeout,
    };
    let send_initial = flag("sendInitialEvents");
    if !send_initial && q.get("resourceVersionMatch").is_some_and(|m| !m.is_empty()) {
        return Err(ApiError::unprocessable(
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        ));
    }
    if send_initial && q.get("resourceVersionMatch").map(String::as_str) != Some("NotOlderThan") {
        return Err(ApiError::unprocessable(
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        ));
    }
    let req = WatchRequest {
        kind: t.kind,
        namespace: t.namespace.clone(),
        selectors: sel,
        resource_version: q.get("resourceVersion").cloned(),
        send_initial_events: send_initial,
        bookmarks: flag("allowWatchBookmarks"),
        timeout,
        bookmark_interval: st.bookmark_interval,
    };
    let body: Body = watch::start(st.api.store.clone(), st.faults.watch_drops(), req)?;
    let mut r = Response::new(body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(r)
}

fn delete_collection(
    st: &Shared,
    t: &Target,
    q: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    if t.sub != Sub::Main {
        return Err(ApiError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        ));
    }
    let sel = selectors(t.kind, q)?;
    let (items, _) = matching(st, t, &sel);
    let opts = DeleteOptions {
        dry_run: dry_run(q)?,
        ..Default::default()
    };
    let mut out = Vec::new();
    for obj in items {
        match st
            .api
            .delete(t.kind, meta::namespace(&obj), meta::name(&obj), &opts)
        {
            Ok(DeleteOutcome::Pending(o) | DeleteOutcome::Deleted(o)) => out.push(o),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let body = json!({
        "kind": format!("{}List", t.kind.info().kind),
        "apiVersion": t.kind.api_version(),
        "metadata": { "resourceVersion": st.api.store.current_rv().to_string() },
        "items": out.iter().map(|o| serde_json::to_value(ListItem(o)).unwrap_or(Value::Null)).collect::<Vec<_>>(),
    });
    Ok(json_response(StatusCode::OK, &body))
}
