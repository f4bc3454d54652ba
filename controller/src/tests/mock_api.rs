//! `ApiServerVerifier`, a tower-test mock of the Kubernetes API that asserts the method,
//! URI and body of each call in order and answers it, and the contexts wired to it.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request};
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Client;
use kube::client::Body;
use kube::runtime::events::Reporter;
use kube::runtime::reflector;
use kube::runtime::watcher;
use serde_json::{Value, json};

use crate::agents::AgentRegistry;
use crate::context::Context;
use crate::metrics::Metrics;
use crate::objects;
use crate::objects::CachedVolume;
use crate::tests::builders::{PROVISIONER, cached};

type ApiServerHandle = tower_test::mock::Handle<Request<Body>, http::Response<Body>>;

/// How a request body is checked.
#[derive(Debug, Clone)]
pub enum BodyCheck {
    /// The whole body must equal this JSON.
    Exact(Value),
    /// Every field given must be present with this value (arrays compared whole).
    Subset(Value),
    /// Like `Exact`, except that `{"$any": true}` stands for any value (for timestamps) and
    /// `{"$contains": "text"}` for a string containing the text.
    Shape(Value),
}

/// One expected API call and the answer to give.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: Method,
    /// The path and query; with `prefix`, only the start must match (for generated names).
    pub uri: String,
    pub prefix: bool,
    pub body: BodyCheck,
    pub status: u16,
    pub response: Option<Value>,
}

impl Call {
    pub fn new(method: Method, uri: &str, body: BodyCheck) -> Self {
        Self {
            method,
            uri: uri.to_owned(),
            prefix: false,
            body,
            status: 200,
            response: None,
        }
    }

    /// An event created through the events.k8s.io API (reason, type and object checked).
    pub fn event(
        namespace: &str,
        type_: &str,
        reason: &str,
        regarding: &str,
        note_contains: &str,
    ) -> Self {
        Self {
            method: Method::POST,
            uri: format!("/apis/events.k8s.io/v1/namespaces/{namespace}/events?"),
            prefix: false,
            body: BodyCheck::Subset(json!({
                "reason": reason,
                "type": type_,
                "regarding": {"name": regarding},
                "reportingController": "nfsprov-controller",
                "note": {"$contains": note_contains},
            })),
            status: 201,
            response: None,
        }
    }

    /// A repeated event: the recorder patches the series of the first one.
    pub fn event_repeat(namespace: &str, reason: &str, count: u32) -> Self {
        Self {
            method: Method::PATCH,
            uri: format!("/apis/events.k8s.io/v1/namespaces/{namespace}/events/"),
            prefix: true,
            body: BodyCheck::Subset(json!({"reason": reason, "series": {"count": count}})),
            status: 200,
            response: None,
        }
    }

    pub fn status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }

    pub fn respond(mut self, response: Value) -> Self {
        self.response = Some(response);
        self
    }
}

fn matches(expected: &Value, actual: &Value) -> bool {
    match (expected, actual) {
        (Value::Object(e), _) if e.len() == 1 && e.contains_key("$contains") => {
            let needle = e["$contains"].as_str().unwrap_or_default();
            actual.as_str().is_some_and(|s| s.contains(needle))
        }
        (Value::Object(e), Value::Object(a)) => e
            .iter()
            .all(|(k, v)| a.get(k).is_some_and(|av| matches(v, av))),
        _ => expected == actual,
    }
}

/// Same keys and array lengths all the way down; `{"$any": true}` matches any value and
/// `{"$contains": "text"}` any string containing the text.
fn same_shape(expected: &Value, actual: &Value) -> bool {
    match (expected, actual) {
        (Value::Object(e), _) if e.len() == 1 && e.contains_key("$any") => true,
        (Value::Object(e), _) if e.len() == 1 && e.contains_key("$contains") => {
            matches(expected, actual)
        }
        (Value::Object(e), Value::Object(a)) => {
            e.len() == a.len()
                && e.iter()
                    .all(|(k, v)| a.get(k).is_some_and(|av| same_shape(v, av)))
        }
        (Value::Array(e), Value::Array(a)) => {
            e.len() == a.len() && e.iter().zip(a).all(|(ev, av)| same_shape(ev, av))
        }
        _ => expected == actual,
    }
}

fn status_body(code: u16) -> Value {
    let reason = match code {
        404 => "NotFound",
        409 => "AlreadyExists",
        422 => "Invalid",
        _ => "InternalError",
    };
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("mock API answered {code}"), "reason": reason, "code": code,
    })
}

/// Plays a scenario against the client side of a tower-test mock.
pub struct ApiServerVerifier(ApiServerHandle);

impl ApiServerVerifier {
    /// Answers `calls` in order, asserting each, then asserts that no further call comes
    /// before every client clone is dropped.
    pub fn run(mut self, calls: Vec<Call>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            for (i, call) in calls.into_iter().enumerate() {
                let Some((request, send)) = self.0.next_request().await else {
                    panic!("call {i} never came: expected {} {}", call.method, call.uri);
                };
                let uri = request.uri().to_string();
                assert_eq!(
                    request.method(),
                    call.method,
                    "call {i}: method (uri {uri})"
                );
                if call.prefix {
                    assert!(
                        uri.starts_with(&call.uri),
                        "call {i}: uri {uri} does not start with {}",
                        call.uri
                    );
                } else {
                    assert_eq!(uri, call.uri, "call {i}: uri");
                }
                let bytes = request
                    .into_body()
                    .collect_bytes()
                    .await
                    .unwrap_or_default();
                let body: Value = if bytes.is_empty() {
                    Value::Null
                } else {
                    serde_json::from_slice(&bytes).unwrap_or(Value::Null)
                };
                match &call.body {
                    BodyCheck::Exact(expected) => {
                        assert_eq!(&body, expected, "call {i}: body of {uri}")
                    }
                    BodyCheck::Subset(expected) => assert!(
                        matches(expected, &body),
                        "call {i}: body of {uri}\n{body:#}\ndoes not contain\n{expected:#}"
                    ),
                    BodyCheck::Shape(expected) => assert!(
                        same_shape(expected, &body),
                        "call {i}: body of {uri}\n{body:#}\nis not\n{expected:#}"
                    ),
                }
                let response = match (call.response, call.status) {
                    (Some(response), _) => response,
                    (None, status) if status >= 400 => status_body(status),
                    // Echo what was sent, as create and patch of the real API roughly do.
                    (None, _) => body,
                };
                send.send_response(
                    http::Response::builder()
                        .status(call.status)
                        .body(Body::from(
                            serde_json::to_vec(&response).unwrap_or_default(),
                        ))
                        .expect("response"),
                );
            }
            if let Some((request, _)) = self.0.next_request().await {
                panic!("unexpected call: {} {}", request.method(), request.uri());
            }
        })
    }
}

/// A context wired to a mock API, with the given objects in its caches.
pub fn context(
    agents: AgentRegistry,
    classes: Vec<StorageClass>,
    volumes: Vec<PersistentVolume>,
) -> (Arc<Context>, ApiServerVerifier) {
    let (ctx, api, _) = context_with_volume_writer(agents, classes, volumes);
    (ctx, api)
}

/// [`context`], plus the writer of its volume cache, for tests in which volumes come and go.
pub fn context_with_volume_writer(
    agents: AgentRegistry,
    classes: Vec<StorageClass>,
    volumes: Vec<PersistentVolume>,
) -> (
    Arc<Context>,
    ApiServerVerifier,
    reflector::store::Writer<CachedVolume>,
) {
    context_with_provisioners(PROVISIONER.into(), agents, classes, volumes)
}

/// [`context_with_volume_writer`] for a controller answering to `provisioners`.
pub fn context_with_provisioners(
    provisioners: objects::Provisioners,
    agents: AgentRegistry,
    classes: Vec<StorageClass>,
    volumes: Vec<PersistentVolume>,
) -> (
    Arc<Context>,
    ApiServerVerifier,
    reflector::store::Writer<CachedVolume>,
) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, http::Response<Body>>();
    let client = Client::new(service, "default");
    let (class_store, mut class_writer) = reflector::store();
    for class in classes {
        class_writer.apply_watcher_event(&watcher::Event::Apply(class));
    }
    let (volume_store, mut volume_writer) = reflector::store();
    for volume in volumes {
        volume_writer.apply_watcher_event(&watcher::Event::Apply(cached(volume)));
    }
    let ctx = Context::new(
        client,
        provisioners,
        agents,
        class_store,
        volume_store,
        Arc::new(Metrics::new()),
        test_reporter(),
    );
    (Arc::new(ctx), ApiServerVerifier(handle), volume_writer)
}

/// Who the events of a scenario come from.
pub fn test_reporter() -> Reporter {
    Reporter {
        controller: "nfsprov-controller".to_owned(),
        instance: Some("test".to_owned()),
    }
}

/// Waits for the scenario to finish once the context (and so every client) is dropped.
pub async fn finish(ctx: Arc<Context>, server: tokio::task::JoinHandle<()>) {
    drop(ctx);
    match tokio::time::timeout(Duration::from_secs(10), server).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => std::panic::resume_unwind(e.into_panic()),
        Err(_) => panic!("scenario did not finish"),
    }
}
