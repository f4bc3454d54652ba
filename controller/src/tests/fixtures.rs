//! Test fixtures: an `ApiServerVerifier` (a tower-test mock of the Kubernetes API that
//! asserts the method, URI and body of each call in order and answers it), test objects,
//! and `MockAgent`, an in-test HTTPS fake of the agent API (NOT the real agent) that keeps
//! its volumes in memory and can be told to fail.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter, on};
use http::{Method, Request};
use k8s_openapi::api::core::v1::{
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimCondition,
    PersistentVolumeClaimSpec, PersistentVolumeClaimStatus, PersistentVolumeSpec,
    PersistentVolumeStatus, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::client::Body;
use kube::runtime::events::Reporter;
use kube::runtime::reflector;
use kube::runtime::watcher;
use nfsprov_api_types::client::AgentConnectionConfig;
use nfsprov_api_types::{
    AgentInfo, ApiError, Archive, ArchivePath, ArchiveResult, Capabilities, CloneMethod,
    CloneOrigin, CloneProgress, CloneVolumeRequest, CreateVolumeRequest, Endpoint, ErrorCode,
    ExportRequest, FilesystemStats, NfsExport, QuotaBackend, QuotaPolicy, ResizeVolumeRequest,
    RestoreOrigin, RestoreProgress, RestoreSource, RestoreVolumeRequest, Snapshot, SnapshotMethod,
    SnapshotName, Volume, VolumeExport, VolumePath, VolumeUsage,
};
use serde_json::{Value, json};

use crate::agents::AgentRegistry;
use crate::context::Context;
use crate::metrics::Metrics;
use crate::objects;
use crate::objects::CachedVolume;

pub const PROVISIONER: &str = "nfsprov.dev/nfs";
pub const CLAIM_UID: &str = "6b1c8f3e-2d4a-4e5b-9c7d-0a1b2c3d4e5f";
pub const PV_NAME: &str = "pvc-6b1c8f3e-2d4a-4e5b-9c7d-0a1b2c3d4e5f";

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

pub fn class(name: &str, parameters: &[(&str, &str)]) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        provisioner: PROVISIONER.to_owned(),
        parameters: (!parameters.is_empty()).then(|| {
            parameters
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        }),
        reclaim_policy: Some("Delete".to_owned()),
        volume_binding_mode: Some("Immediate".to_owned()),
        ..StorageClass::default()
    }
}

/// An unbound claim the PV controller has handed to our provisioner.
pub fn claim(class: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".to_owned()),
            namespace: Some("team-a".to_owned()),
            uid: Some(CLAIM_UID.to_owned()),
            resource_version: Some("100".to_owned()),
            annotations: Some(BTreeMap::from([(
                objects::ANN_STORAGE_PROVISIONER.to_owned(),
                PROVISIONER.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteMany".to_owned()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity("1Gi".to_owned()),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            storage_class_name: Some(class.to_owned()),
            volume_mode: Some("Filesystem".to_owned()),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}

/// The cache's view of a PV, as the watcher would decode it from the API.
pub fn cached(volume: PersistentVolume) -> CachedVolume {
    serde_json::from_value(serde_json::to_value(volume).expect("serialize")).expect("decode")
}

/// A released PV as this controller would have made it.
pub fn released_pv(on_delete: Option<&str>, path: &str) -> PersistentVolume {
    let mut annotations = BTreeMap::from([
        (
            objects::ANN_PROVISIONED_BY.to_owned(),
            PROVISIONER.to_owned(),
        ),
        (objects::ANN_AGENT.to_owned(), "nfs1".to_owned()),
        (objects::ANN_PATH.to_owned(), path.to_owned()),
    ]);
    if let Some(policy) = on_delete {
        annotations.insert(objects::ANN_ON_DELETE.to_owned(), policy.to_owned());
    }
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(PV_NAME.to_owned()),
            uid: Some("pv-uid-1".to_owned()),
            resource_version: Some("200".to_owned()),
            annotations: Some(annotations),
            finalizers: Some(vec![
                "kubernetes.io/pv-protection".to_owned(),
                objects::FINALIZER.to_owned(),
            ]),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            persistent_volume_reclaim_policy: Some("Delete".to_owned()),
            storage_class_name: Some("nfs".to_owned()),
            ..PersistentVolumeSpec::default()
        }),
        status: Some(PersistentVolumeStatus {
            phase: Some("Released".to_owned()),
            ..PersistentVolumeStatus::default()
        }),
    }
}

/// A class that allows expansion.
pub fn expandable_class(name: &str, parameters: &[(&str, &str)]) -> StorageClass {
    StorageClass {
        allow_volume_expansion: Some(true),
        ..class(name, parameters)
    }
}

fn storage(quantity: &str) -> BTreeMap<String, Quantity> {
    BTreeMap::from([("storage".to_owned(), Quantity(quantity.to_owned()))])
}

/// The claim of [`claim`] once bound to [`PV_NAME`], asking for `request` and holding
/// `capacity`, as the cache holds it (resourceVersion 300).
pub fn bound_claim(request: &str, capacity: &str) -> PersistentVolumeClaim {
    let mut pvc = claim("nfs");
    pvc.metadata.resource_version = Some("300".to_owned());
    let spec = pvc.spec.as_mut().expect("spec");
    spec.volume_name = Some(PV_NAME.to_owned());
    spec.resources = Some(VolumeResourceRequirements {
        requests: Some(storage(request)),
        ..VolumeResourceRequirements::default()
    });
    pvc.status = Some(PersistentVolumeClaimStatus {
        phase: Some("Bound".to_owned()),
        access_modes: Some(vec!["ReadWriteMany".to_owned()]),
        capacity: Some(storage(capacity)),
        ..PersistentVolumeClaimStatus::default()
    });
    pvc
}

/// `pvc` as the API answers after a status patch: the given resize state and a new
/// resourceVersion.
pub fn with_resize_state(
    mut pvc: PersistentVolumeClaim,
    resource_version: &str,
    allocated: &str,
    state: Option<&str>,
    conditions: &[&str],
) -> PersistentVolumeClaim {
    pvc.metadata.resource_version = Some(resource_version.to_owned());
    let status = pvc.status.get_or_insert_with(Default::default);
    status.allocated_resources = Some(storage(allocated));
    status.allocated_resource_statuses =
        state.map(|s| BTreeMap::from([("storage".to_owned(), s.to_owned())]));
    status.conditions = (!conditions.is_empty()).then(|| {
        conditions
            .iter()
            .map(|type_| PersistentVolumeClaimCondition {
                type_: (*type_).to_owned(),
                status: "True".to_owned(),
                ..PersistentVolumeClaimCondition::default()
            })
            .collect()
    });
    pvc
}

/// The PV of [`bound_claim`], made by this controller: `team-a/data` on agent nfs1.
pub fn bound_pv(capacity: &str, quota: &str) -> PersistentVolume {
    let mut volume = released_pv(Some("delete"), "team-a/data");
    volume
        .metadata
        .annotations
        .as_mut()
        .expect("annotations")
        .insert(objects::ANN_QUOTA.to_owned(), quota.to_owned());
    let spec = volume.spec.as_mut().expect("spec");
    spec.capacity = Some(storage(capacity));
    spec.claim_ref = Some(ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("PersistentVolumeClaim".to_owned()),
        namespace: Some("team-a".to_owned()),
        name: Some("data".to_owned()),
        uid: Some(CLAIM_UID.to_owned()),
        ..ObjectReference::default()
    });
    volume.status = Some(PersistentVolumeStatus {
        phase: Some("Bound".to_owned()),
        ..PersistentVolumeStatus::default()
    });
    volume
}

// ---------------------------------------------------------------------------------------
// MockAgent: a fake of the agent API over real HTTPS, for tests only.
// ---------------------------------------------------------------------------------------

#[derive(Debug, Default)]
pub struct MockAgentState {
    pub volumes: BTreeMap<String, CreateVolumeRequest>,
    pub archived: BTreeMap<String, ArchiveResult>,
    /// The retention each archive request asked for, by path.
    pub archive_retention: BTreeMap<String, Option<u32>>,
    /// `METHOD path` of every authenticated call, in order.
    pub calls: Vec<String>,
    /// When set, every `/v1` call fails with this code.
    pub fail_with: Option<ErrorCode>,
    /// When set, the calls whose record starts with the prefix (`"PATCH"`, `"PUT"`) fail
    /// with the code.
    pub fail_calls: Option<(String, ErrorCode)>,
    /// Whether `/v1/info` says quotas are enforced; without, `quota: enforce` is refused.
    pub quota_enforced: bool,
    /// What `GET /v1/volumes/{path}` reports as usage, by path.
    pub usage: BTreeMap<String, VolumeUsage>,
    /// What `/v1/info` reports as available bytes; half a terabyte when unset.
    pub available_bytes: Option<u64>,
    /// Clone requests answered `202 Accepted` before the clone is made, per request.
    pub clone_polls: u32,
    /// Clone requests seen so far, by target path.
    pub clone_requests: BTreeMap<String, u32>,
    /// Answer as an agent a version newer would: enum values and fields the controller
    /// does not know (see [`newer_answer`]).
    pub newer: bool,
    /// When set, the calls whose record starts with the prefix fail with an error code
    /// the controller does not know, sent with this status.
    pub fail_newer: Option<(String, u16)>,
    /// The export manager `/v1/info` reports. With a per-volume one, every create and
    /// clone must carry an export and `PUT /v1/exports/{path}` replaces it (the export
    /// store is each volume's `export`); without, a request with one is refused.
    pub exports: nfsprov_api_types::ExportManager,
    /// Whether `/v1/info` reports `opaque_export_paths`; without, an export request
    /// asking for one is refused, as an older agent refuses a field it does not know.
    pub opaque_export_paths: bool,
    /// The opaque name each volume's export was given when first made, by volume path.
    pub opaque_names: BTreeMap<String, String>,
    /// Whether `/v1/info` reports `snapshots`; without, the snapshot endpoints answer
    /// `unsupported`, as an agent of an older version or with snapshots off does.
    pub snapshots_supported: bool,
    /// The snapshots taken, by name, each with the source volume as it was then.
    pub snapshots: BTreeMap<String, (Snapshot, CreateVolumeRequest)>,
    /// Create requests of a snapshot answered `ready: false` before it is ready.
    pub snapshot_polls: u32,
    /// Create requests seen so far, by snapshot name.
    pub snapshot_requests: BTreeMap<String, u32>,
    /// Restore requests answered `202` before the volume is made, per request.
    pub restore_polls: u32,
    /// Every restore request, by target path, in order.
    pub restores: Vec<(String, RestoreVolumeRequest)>,
    /// The archives `GET /v1/archives/{id}` answers and restores are made from, by id,
    /// each with the volume as it was archived.
    pub archives: BTreeMap<String, (Archive, CreateVolumeRequest)>,
    /// Answer as an agent from before archive restores: `/v1/info` reports no
    /// `archive_restores`, and `GET /v1/archives/{id}` is no route of it (the agent's
    /// fallback answers `not_found`, as for an archive that does not exist).
    pub predates_archive_restores: bool,
}

#[derive(Clone)]
struct MockShared {
    state: Arc<Mutex<MockAgentState>>,
    token: String,
    /// `<name>.example`, so PVs show which agent they came from.
    server: String,
}

/// A fake agent (a mock, not the real `nfsprov-agent`) on 127.0.0.1 over HTTPS with a
/// throw-away CA, speaking the v1 contract closely enough for the controller's calls.
pub struct MockAgent {
    pub config: AgentConnectionConfig,
    pub state: Arc<Mutex<MockAgentState>>,
    handle: axum_server::Handle<SocketAddr>,
    server: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Drop for MockAgent {
    fn drop(&mut self) {
        self.handle.shutdown();
    }
}

impl MockAgent {
    pub async fn start(name: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca_key = rcgen::KeyPair::generate().expect("key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key).expect("ca");
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let server_key = rcgen::KeyPair::generate().expect("key");
        let mut server_params =
            rcgen::CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        server_params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        let server_cert = server_params.signed_by(&server_key, &issuer).expect("cert");

        let ca_file = dir.path().join("ca.pem");
        let token_file = dir.path().join("token");
        std::fs::write(&ca_file, ca_cert.pem()).expect("write ca");
        std::fs::write(&token_file, "mock-token\n").expect("write token");

        let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("tls versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![server_cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(server_key.serialize_der().into()),
        )
        .expect("tls config");

        let state = Arc::new(Mutex::new(MockAgentState::default()));
        let app = Endpoint::ALL
            .into_iter()
            .filter_map(|endpoint| Some((endpoint.template(), mock_handler(endpoint)?)))
            .fold(Router::new(), |router, (template, handler)| {
                router.route(template, handler)
            })
            .layer(axum::middleware::from_fn_with_state(
                state.clone(),
                newer_answer,
            ))
            .with_state(MockShared {
                state: state.clone(),
                token: "mock-token".to_owned(),
                server: format!("{name}.example"),
            });
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let handle = axum_server::Handle::new();
        let server = axum_server::from_tcp_rustls(
            listener,
            axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(tls)),
        )
        .expect("server")
        .handle(handle.clone());
        let server = tokio::spawn(async move {
            let _ = server.serve(app.into_make_service()).await;
        });
        let config = AgentConnectionConfig {
            name: name.to_owned(),
            url: format!("https://{addr}"),
            ca_file,
            token_file: Some(token_file),
            client_cert_file: None,
            client_key_file: None,
            timeout_seconds: 5,
            nfs_server: None,
            nfs_path: None,
            default: false,
        };
        Self {
            config,
            state,
            handle,
            server: Some(server),
            _dir: dir,
        }
    }

    /// Stops serving and waits until the port is closed; the files stay, so a client
    /// built from `config` now fails to connect, like one whose agent is down.
    pub async fn stop(&mut self) {
        self.handle.shutdown();
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
    }

    pub fn registry(&self) -> AgentRegistry {
        AgentRegistry::new(std::slice::from_ref(&self.config), Arc::new(Metrics::new()))
            .expect("registry")
    }

    /// A registry of several agents, with `default` marked `default = true`.
    pub fn registry_of(agents: &[&MockAgent], default: Option<&str>) -> AgentRegistry {
        let configs: Vec<AgentConnectionConfig> = agents
            .iter()
            .map(|agent| AgentConnectionConfig {
                default: Some(agent.config.name.as_str()) == default,
                ..agent.config.clone()
            })
            .collect();
        AgentRegistry::new(&configs, Arc::new(Metrics::new())).expect("registry")
    }

    /// Clone requests for a path are answered `202` this many times before the clone.
    pub fn set_clone_polls(&self, polls: u32) {
        self.state.lock().expect("lock").clone_polls = polls;
    }

    pub fn set_available_bytes(&self, bytes: u64) {
        self.state.lock().expect("lock").available_bytes = Some(bytes);
    }

    pub fn calls(&self) -> Vec<String> {
        self.state.lock().expect("lock").calls.clone()
    }

    pub fn fail_with(&self, code: Option<ErrorCode>) {
        self.state.lock().expect("lock").fail_with = code;
    }

    /// Fails the calls whose record starts with `prefix` (e.g. `"PATCH"`), or none.
    pub fn fail_calls(&self, failure: Option<(&str, ErrorCode)>) {
        self.state.lock().expect("lock").fail_calls =
            failure.map(|(prefix, code)| (prefix.to_owned(), code));
    }

    /// Answers from now on as a newer agent would ([`newer_answer`]).
    pub fn answer_as_newer(&self) {
        self.state.lock().expect("lock").newer = true;
    }

    /// Fails the calls whose record starts with `prefix` with a code newer than the
    /// controller, sent with `status`.
    pub fn fail_calls_newer(&self, prefix: &str, status: u16) {
        self.state.lock().expect("lock").fail_newer = Some((prefix.to_owned(), status));
    }

    /// Reports `manager` as the agent's export manager from now on.
    pub fn manage_exports(&self, manager: nfsprov_api_types::ExportManager) {
        self.state.lock().expect("lock").exports = manager;
    }

    /// Reports `opaque_export_paths` (ganesha's pseudo paths) from now on.
    pub fn serve_opaque_paths(&self) {
        self.state.lock().expect("lock").opaque_export_paths = true;
    }

    /// The path the agent reports clients mount `path` by, from its export.
    pub fn export_path(&self, path: &str) -> Option<String> {
        let state = self.state.lock().expect("lock");
        let request = state.volumes.get(path)?;
        let volume = volume_of(&state, VolumePath::parse(path).ok()?, request);
        volume.export.map(|export| export.path)
    }

    /// The export the agent serves for `path`, as the export store holds it.
    pub fn export(&self, path: &str) -> Option<nfsprov_api_types::ExportRequest> {
        self.volume(path)?.export
    }

    pub fn enforce_quotas(&self, enforced: bool) {
        self.state.lock().expect("lock").quota_enforced = enforced;
    }

    pub fn set_usage(&self, path: &str, used_bytes: u64, used_inodes: u64) {
        self.state.lock().expect("lock").usage.insert(
            path.to_owned(),
            VolumeUsage {
                used_bytes,
                used_inodes,
            },
        );
    }

    pub fn has_volume(&self, path: &str) -> bool {
        self.state.lock().expect("lock").volumes.contains_key(path)
    }

    pub fn volume(&self, path: &str) -> Option<CreateVolumeRequest> {
        self.state.lock().expect("lock").volumes.get(path).cloned()
    }

    pub fn insert_volume(&self, path: &str, request: CreateVolumeRequest) {
        self.state
            .lock()
            .expect("lock")
            .volumes
            .insert(path.to_owned(), request);
    }

    /// The retention the last archive request for `path` asked for (`None` inside: none).
    pub fn archive_retention(&self, path: &str) -> Option<Option<u32>> {
        self.state
            .lock()
            .expect("lock")
            .archive_retention
            .get(path)
            .copied()
    }

    pub fn archived(&self, path: &str) -> Option<ArchiveResult> {
        self.state.lock().expect("lock").archived.get(path).cloned()
    }

    /// Reports `capabilities.snapshots` and serves the snapshot endpoints.
    pub fn take_snapshots(&self, supported: bool) {
        self.state.lock().expect("lock").snapshots_supported = supported;
    }

    /// Answers as an agent from before archive restores (see the state's field).
    pub fn predate_archive_restores(&self) {
        self.state.lock().expect("lock").predates_archive_restores = true;
    }

    /// Snapshot creates are answered `ready: false` this many times per snapshot.
    pub fn set_snapshot_polls(&self, polls: u32) {
        self.state.lock().expect("lock").snapshot_polls = polls;
    }

    /// Restore requests for a path are answered `202` this many times first.
    pub fn set_restore_polls(&self, polls: u32) {
        self.state.lock().expect("lock").restore_polls = polls;
    }

    pub fn snapshot(&self, name: &str) -> Option<Snapshot> {
        let state = self.state.lock().expect("lock");
        state
            .snapshots
            .get(name)
            .map(|(snapshot, _)| snapshot.clone())
    }

    pub fn snapshot_names(&self) -> Vec<String> {
        let state = self.state.lock().expect("lock");
        state.snapshots.keys().cloned().collect()
    }

    pub fn restores(&self) -> Vec<(String, RestoreVolumeRequest)> {
        self.state.lock().expect("lock").restores.clone()
    }

    /// Keeps an archive of a volume `volume` (mode 0750, uid and gid 1000) of the claim
    /// `owner` (`namespace/name`, or none), which had `capacity_bytes`; its id.
    pub fn insert_archive(
        &self,
        volume: &str,
        owner: Option<&str>,
        capacity_bytes: Option<u64>,
    ) -> ArchivePath {
        let id = ArchivePath::parse(&format!("{volume}/@20260101T000000.000000000Z"))
            .expect("an archive id");
        let owner = nfsprov_api_types::VolumeOwner {
            pvc_namespace: owner.map(|o| o.split_once('/').expect("namespace/name").0.into()),
            pvc_name: owner.map(|o| o.split_once('/').expect("namespace/name").1.into()),
            pv_name: None,
        };
        let archive = Archive {
            id: id.clone(),
            archive_path: format!(".archive/{id}"),
            path: VolumePath::parse(volume).expect("a volume path"),
            owner: owner.clone(),
            archived_at: "2026-01-01T00:00:00Z".to_owned(),
            retention_days: None,
            expires_at: None,
            size_bytes: None,
            inodes: None,
            capacity_bytes,
        };
        let kept = CreateVolumeRequest {
            mode: nfsprov_api_types::Mode::parse_octal("0750").expect("a mode"),
            uid: Some(1000),
            gid: Some(1000),
            capacity_bytes: capacity_bytes.unwrap_or(0),
            owner,
            ..CreateVolumeRequest::default()
        };
        self.state
            .lock()
            .expect("lock")
            .archives
            .insert(id.to_string(), (archive, kept));
        id
    }
}

/// The mock's handler of each endpoint of the table, at the table's method; `None` for
/// the endpoints no controller test needs (the real agent's tests cover those).
fn mock_handler(endpoint: Endpoint) -> Option<MethodRouter<MockShared>> {
    let method = MethodFilter::try_from(endpoint.method()).expect("a standard method");
    let handler = match endpoint {
        Endpoint::Info => on(method, info),
        Endpoint::CreateVolume => on(method, create),
        Endpoint::GetVolume => on(method, fetch),
        Endpoint::ResizeVolume => on(method, resize),
        Endpoint::DeleteVolume => on(method, remove),
        Endpoint::ArchiveVolume => on(method, archive),
        Endpoint::CloneVolume => on(method, clone),
        Endpoint::SetVolumeExport => on(method, set_export),
        Endpoint::CreateSnapshot => on(method, create_snapshot),
        Endpoint::GetSnapshot => on(method, get_snapshot),
        Endpoint::DeleteSnapshot => on(method, delete_snapshot),
        Endpoint::RestoreVolume => on(method, restore),
        Endpoint::GetArchive => on(method, get_archive),
        Endpoint::Healthz
        | Endpoint::Readyz
        | Endpoint::Metrics
        | Endpoint::ListVolumes
        | Endpoint::AdoptVolume
        | Endpoint::ListArchives
        | Endpoint::DeleteArchive
        | Endpoint::ListSnapshots => return None,
    };
    Some(handler)
}

/// How long a mock agent whose job queue is full asks to wait, as a real one does with
/// `Retry-After`.
pub const MOCK_RETRY_AFTER: Duration = Duration::from_secs(7);

fn api_error(code: ErrorCode, message: &str) -> Response {
    let status =
        StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, Json(ApiError::new(code, message))).into_response();
    if code == ErrorCode::JobQueueFull {
        response.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from(MOCK_RETRY_AFTER.as_secs()),
        );
    }
    response
}

/// Authenticates, records the call and applies an injected failure; `Some` is the answer
/// to give instead of handling the call.
fn enter(shared: &MockShared, headers: &HeaderMap, call: String) -> Option<Response> {
    let expected = format!("Bearer {}", shared.token);
    if headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        != Some(&expected)
    {
        return Some(api_error(ErrorCode::Unauthenticated, "bad token"));
    }
    let mut state = shared.state.lock().expect("lock");
    if let Some((_, status)) = state
        .fail_newer
        .as_ref()
        .filter(|(prefix, _)| call.starts_with(prefix.as_str()))
    {
        let status = StatusCode::from_u16(*status).expect("a valid status");
        state.calls.push(call);
        let body =
            json!({"code": "volume_busy", "message": "injected failure", "retry_after_seconds": 5});
        return Some((status, Json(body)).into_response());
    }
    let failure = state.fail_with.or_else(|| {
        state
            .fail_calls
            .as_ref()
            .filter(|(prefix, _)| call.starts_with(prefix.as_str()))
            .map(|(_, code)| *code)
    });
    state.calls.push(call);
    failure.map(|code| api_error(code, "injected failure"))
}

/// Once [`MockAgent::answer_as_newer`] was called, rewrites every JSON answer the way a
/// newer agent may answer: a quota backend and a clone method the controller does not
/// know, and new fields at the top, in the capabilities and in the owner.
async fn newer_answer(
    State(state): State<Arc<Mutex<MockAgentState>>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let response = next.run(request).await;
    if !state.lock().expect("lock").newer {
        return response;
    }
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20)
        .await
        .expect("mock body");
    let Ok(mut value) = serde_json::from_slice::<Value>(&bytes) else {
        return Response::from_parts(parts, axum::body::Body::from(bytes));
    };
    if let Some(object) = value.as_object_mut() {
        object.insert("added_later".into(), json!({"nested": [1, 2]}));
        if let Some(capabilities) = object.get_mut("capabilities") {
            capabilities["quota"] = json!("lvm-thin");
            capabilities["snapshots"] = json!(true);
        }
        if let Some(owner) = object.get_mut("owner") {
            owner["workload"] = json!("statefulset/db");
        }
        if let Some(origin) = object.get_mut("clone").filter(|c| c.is_object()) {
            origin["method"] = json!("block-clone");
        }
    }
    let mut parts = parts;
    parts.headers.remove(http::header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(value.to_string()))
}

/// The agent's view of a stored volume.
fn volume_of(state: &MockAgentState, path: VolumePath, request: &CreateVolumeRequest) -> Volume {
    Volume {
        usage: state.usage.get(path.as_str()).copied(),
        mode: request.mode,
        uid: request.uid.unwrap_or(1000),
        gid: request.gid.unwrap_or(1000),
        capacity_bytes: request.capacity_bytes,
        quota_enforced: state.quota_enforced && request.quota != QuotaPolicy::Off,
        owner: request.owner.clone(),
        created_at: "2026-01-01T00:00:00Z".to_owned(),
        clone: None,
        restore: None,
        export: request.export.as_ref().map(|export| VolumeExport {
            path: match state.opaque_names.get(path.as_str()) {
                Some(name) => format!("/srv/nfs/{name}"),
                None => format!("/srv/nfs/{}", path.as_str()),
            },
            clients: export.clients.clone(),
            access: export.access,
            squash: export.squash,
            anon_uid: export.anon_uid,
            anon_gid: export.anon_gid,
            sec: export.sec.clone(),
        }),
        path,
    }
}

/// What the contract says of a request's export, by the agent's manager.
fn check_export(state: &MockAgentState, export: Option<&ExportRequest>) -> Option<Response> {
    match export {
        None if state.exports.per_volume() => Some(api_error(
            ErrorCode::InvalidBody,
            "this agent exports each volume: the request needs an export",
        )),
        Some(_) if !state.exports.per_volume() => Some(api_error(
            ErrorCode::Unsupported,
            "this agent has no export manager",
        )),
        Some(export) if export.opaque_path && !state.opaque_export_paths => Some(api_error(
            ErrorCode::InvalidBody,
            "unknown field `opaque_path`",
        )),
        Some(export) => export
            .validate()
            .err()
            .map(|e| api_error(ErrorCode::InvalidBody, &e.to_string())),
        None => None,
    }
}

/// Gives a volume's first export its opaque name, when it asks for one.
fn name_export(state: &mut MockAgentState, path: &str, export: Option<&ExportRequest>) {
    if export.is_some_and(|export| export.opaque_path) && !state.opaque_names.contains_key(path) {
        let name = format!("{:032x}", state.opaque_names.len() + 1);
        state.opaque_names.insert(path.to_owned(), name);
    }
}

async fn set_export(
    State(shared): State<MockShared>,
    headers: HeaderMap,
    Path(path): Path<String>,
    Json(request): Json<ExportRequest>,
) -> Response {
    let clients: Vec<String> = request.clients.iter().map(ToString::to_string).collect();
    let call = format!("PUT export {path} [{}]", clients.join(","));
    if let Some(response) = enter(&shared, &headers, call) {
        return response;
    }
    let Ok(volume_path) = VolumePath::parse(&path) else {
        return api_error(ErrorCode::InvalidPath, "invalid path");
    };
    let mut state = shared.state.lock().expect("lock");
    if let Some(refused) = check_export(&state, Some(&request)) {
        return refused;
    }
    let Some(stored) = state.volumes.get_mut(&path) else {
        return api_error(ErrorCode::NotFound, "no such volume");
    };
    let first = stored.export.is_none();
    stored.export = Some(request);
    let stored = stored.clone();
    if first {
        name_export(&mut state, &path, stored.export.as_ref());
    }
    Json(volume_of(&state, volume_path, &stored)).into_response()
}

async fn info(State(shared): State<MockShared>, headers: HeaderMap) -> Response {
    if let Some(response) = enter(&shared, &headers, "GET info".to_owned()) {
        return response;
    }
    let (quota_enforced, available, exports, snapshots, archive_restores, opaque_export_paths) = {
        let state = shared.state.lock().expect("lock");
        (
            state.quota_enforced,
            state.available_bytes.unwrap_or(1 << 39),
            state.exports,
            state.snapshots_supported,
            !state.predates_archive_restores,
            state.opaque_export_paths,
        )
    };
    Json(AgentInfo {
        version: "mock".to_owned(),
        nfs: NfsExport {
            server: shared.server.clone(),
            path: "/srv/nfs".to_owned(),
        },
        capabilities: Capabilities {
            quota: if quota_enforced {
                QuotaBackend::Xfs
            } else {
                QuotaBackend::None
            },
            quota_enforced,
            archive: true,
            exports,
            snapshots,
            archive_restores,
            opaque_export_paths,
        },
        filesystem: FilesystemStats {
            total_bytes: 1 << 40,
            free_bytes: available,
            available_bytes: available,
            total_inodes: 1 << 20,
            free_inodes: 1 << 19,
        },
        export_root_filesystem: None,
    })
    .into_response()
}

async fn create(
    State(shared): State<MockShared>,
    headers: HeaderMap,
    Path(path): Path<String>,
    Json(request): Json<CreateVolumeRequest>,
) -> Response {
    if let Some(response) = enter(&shared, &headers, format!("PUT {path}")) {
        return response;
    }
    let Ok(volume_path) = VolumePath::parse(&path) else {
        return api_error(ErrorCode::InvalidPath, "invalid path");
    };
    let mut state = shared.state.lock().expect("lock");
    if request.quota == QuotaPolicy::Enforce && !state.quota_enforced {
        return api_error(ErrorCode::Unsupported, "this agent cannot enforce quotas");
    }
    if let Some(refused) = check_export(&state, request.export.as_ref()) {
        return refused;
    }
    // A repeat keeps the export the volume has: who may mount changes through
    // `PUT /v1/exports` alone.
    let same = |existing: &CreateVolumeRequest| {
        CreateVolumeRequest {
            export: existing.export.clone(),
            ..request.clone()
        } == *existing
    };
    let status = match state.volumes.get(&path) {
        Some(existing) if same(existing) => StatusCode::OK,
        Some(_) => return api_error(ErrorCode::Conflict, "exists with other settings"),
        None => {
            state.volumes.insert(path.clone(), request.clone());
            name_export(&mut state, &path, request.export.as_ref());
            StatusCode::CREATED
        }
    };
    (status, Json(volume_of(&state, volume_path, &request))).into_response()
}

/// Answers `202` for the first [`MockAgentState::clone_polls`] requests for a path, then
/// makes the clone (the source's mode and owner, the request's capacity and owner).
async fn clone(
    State(shared): State<MockShared>,
    headers: HeaderMap,
    Path(path): Path<String>,
    Json(request): Json<CloneVolumeRequest>,
) -> Response {
    let call = format!("POST clone {path} from {}", request.source);
    if let Some(response) = enter(&shared, &headers, call) {
        return response;
    }
    let Ok(volume_path) = VolumePath::parse(&path) else {
        return api_error(ErrorCode::InvalidPath, "invalid path");
    };
    let mut state = shared.state.lock().expect("lock");
    if let Some(refused) = check_export(&state, request.export.as_ref()) {
        return refused;
    }
    let Some(source) = state.volumes.get(request.source.as_str()).cloned() else {
        return api_error(ErrorCode::NotFound, "no source volume");
    };
    let seen = {
        let seen = state.clone_requests.entry(path.clone()).or_default();
        *seen += 1;
        *seen
    };
    if seen <= state.clone_polls {
        let progress = CloneProgress {
            source: request.source.clone(),
            running_seconds: u64::from(seen),
        };
        return (StatusCode::ACCEPTED, Json(progress)).into_response();
    }
    let made = CreateVolumeRequest {
        capacity_bytes: request.capacity_bytes,
        ..source
    };
    let asked = (request.owner.clone(), request.quota, request.export.clone());
    let (status, mut volume) = keep_made(&mut state, volume_path, made, asked);
    volume.clone = Some(CloneOrigin {
        source: request.source,
        method: CloneMethod::Reflink,
    });
    (status, Json(volume)).into_response()
}

/// Keeps a volume made from another's data (a clone, a restore) with the owner, quota
/// and export its request asked for, unless one is there already: `201` and the volume,
/// or `200` and the one there.
fn keep_made(
    state: &mut MockAgentState,
    path: VolumePath,
    made: CreateVolumeRequest,
    (owner, quota, export): (
        nfsprov_api_types::VolumeOwner,
        QuotaPolicy,
        Option<ExportRequest>,
    ),
) -> (StatusCode, Volume) {
    let made = CreateVolumeRequest {
        owner,
        quota,
        export,
        ..made
    };
    let status = if state.volumes.contains_key(path.as_str()) {
        StatusCode::OK
    } else {
        state.volumes.insert(path.as_str().to_owned(), made.clone());
        name_export(state, path.as_str(), made.export.as_ref());
        StatusCode::CREATED
    };
    (status, volume_of(state, path, &made))
}

async fn fetch(
    State(shared): State<MockShared>,
    headers: HeaderMap,
    Path(path): Path<String>,
) -> Response {
    if let Some(response) = enter(&shared, &headers, format!("GET {path}")) {
        return response;
    }
    let Ok(volume_path) = VolumePath::parse(&path) else {
        return api_error(ErrorCode::InvalidPath, "invalid path");
    };
    let state = shared.state.lock().expect("lock");
    match state.volumes.get(&path) {
        Some(request) => Json(volume_of(&state, volume_path, request)).into_response(),
        None => api_error(ErrorCode::NotFound, "no such volume"),
    }
}

async fn resize(
    State(shared): State<MockShared>,
    headers: HeaderMap,
    Path(path): Path<String>,
    Json(request): Json<ResizeVolumeRequest>,
) -> Response {
    let call = format!("PATCH {path} {}", request.capacity_bytes);
    if let Some(response) = enter(&shared, &headers, call) {
        return response;
    }
    let Ok(volume_path) = VolumePath::parse(&path) else {
        return api_error(ErrorCode::InvalidPath, "invalid path");
    };
    let mut state = shared.state.lock().expect("lock");
    let Some(stored) = state.volumes.get_mut(&path) else {
        return api_error(ErrorCode::NotFound, "no such volume");
    };
    if request.capacity_bytes < stored.capacity_bytes {
        return api_error(ErrorCode::Unsupported, "volumes cannot shrink");
    }
    stored.capacity_bytes = request.capacity_bytes;
    let stored = stored.clone();
    Json(volume_of(&state, volume_path, &stored)).into_response()
}

async fn remove(
    State(shared): State<MockShared>,
    headers: HeaderMap,
    Path(path): Path<String>,
) -> Response {
    if let Some(response) = enter(&shared, &headers, format!("DELETE {path}")) {
        return response;
    }
    shared.state.lock().expect("lock").volumes.remove(&path);
    StatusCode::NO_CONTENT.into_response()
}

async fn archive(
    State(shared): State<MockShared>,
    headers: HeaderMap,
    Path(path): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    if let Some(response) = enter(&shared, &headers, format!("POST archive {path}")) {
        return response;
    }
    let request: nfsprov_api_types::ArchiveRequest = if body.is_empty() {
        Default::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(request) => request,
            Err(e) => return api_error(ErrorCode::InvalidBody, &e.to_string()),
        }
    };
    let Ok(volume_path) = VolumePath::parse(&path) else {
        return api_error(ErrorCode::InvalidPath, "invalid path");
    };
    let mut state = shared.state.lock().expect("lock");
    state
        .archive_retention
        .insert(path.clone(), request.retention_days);
    if state.volumes.remove(&path).is_some() {
        let result = ArchiveResult {
            path: volume_path,
            archive_path: format!(".archive/{path}-20260101T000000Z"),
            archived_at: "2026-01-01T00:00:00Z".to_owned(),
        };
        state.archived.insert(path.clone(), result);
    }
    match state.archived.get(&path) {
        Some(result) => Json(result.clone()).into_response(),
        None => api_error(ErrorCode::NotFound, "nothing to archive"),
    }
}

/// The time every snapshot of the mock holds.
pub const SNAPSHOT_CREATED_AT: &str = "2026-01-02T03:04:05Z";

/// Takes a snapshot of an existing volume; the first [`MockAgentState::snapshot_polls`]
/// creates of a name answer it still being made (reflink, as a walk would be).
async fn create_snapshot(
    State(shared): State<MockShared>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Json(request): Json<nfsprov_api_types::CreateSnapshotRequest>,
) -> Response {
    let call = format!("PUT snapshot {name} of {}", request.source);
    if let Some(response) = enter(&shared, &headers, call) {
        return response;
    }
    let Ok(snapshot_name) = SnapshotName::parse(&name) else {
        return api_error(ErrorCode::InvalidPath, "invalid snapshot name");
    };
    let mut state = shared.state.lock().expect("lock");
    if !state.snapshots_supported {
        return api_error(ErrorCode::Unsupported, "this agent takes no snapshots");
    }
    if let Some((existing, _)) = state.snapshots.get(&name)
        && existing.source != request.source
    {
        return api_error(ErrorCode::Conflict, "a snapshot of another volume");
    }
    let Some(volume) = state.volumes.get(request.source.as_str()).cloned() else {
        return api_error(ErrorCode::NotFound, "no source volume");
    };
    let seen = {
        let seen = state.snapshot_requests.entry(name.clone()).or_default();
        *seen += 1;
        *seen
    };
    let ready = seen > state.snapshot_polls;
    let (snapshot, kept) = match state.snapshots.get(&name) {
        Some((existing, kept)) => (
            Snapshot {
                ready,
                ..existing.clone()
            },
            kept.clone(),
        ),
        None => (
            Snapshot {
                name: snapshot_name,
                source: request.source,
                method: SnapshotMethod::Reflink,
                ready,
                created_at: SNAPSHOT_CREATED_AT.to_owned(),
                restore_size_bytes: volume.capacity_bytes,
                size_bytes: None,
                exclusive_bytes: None,
            },
            volume,
        ),
    };
    state.snapshots.insert(name, (snapshot.clone(), kept));
    Json(snapshot).into_response()
}

async fn get_snapshot(
    State(shared): State<MockShared>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    if let Some(response) = enter(&shared, &headers, format!("GET snapshot {name}")) {
        return response;
    }
    let state = shared.state.lock().expect("lock");
    match state.snapshots.get(&name) {
        Some((snapshot, _)) => Json(snapshot.clone()).into_response(),
        None => api_error(ErrorCode::NotFound, "no such snapshot"),
    }
}

async fn delete_snapshot(
    State(shared): State<MockShared>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    if let Some(response) = enter(&shared, &headers, format!("DELETE snapshot {name}")) {
        return response;
    }
    shared.state.lock().expect("lock").snapshots.remove(&name);
    StatusCode::NO_CONTENT.into_response()
}

/// Makes a volume from a ready snapshot or an archive (its source's mode and owner as they
/// were, the request's capacity and owner); the first [`MockAgentState::restore_polls`]
/// requests for a path answer `202`.
async fn restore(
    State(shared): State<MockShared>,
    headers: HeaderMap,
    Path(path): Path<String>,
    Json(request): Json<RestoreVolumeRequest>,
) -> Response {
    let source = match request.source() {
        Ok(source) => source,
        Err(why) => return api_error(ErrorCode::InvalidBody, why),
    };
    let call = format!("POST restore {path} from {source}");
    if let Some(response) = enter(&shared, &headers, call) {
        return response;
    }
    let Ok(volume_path) = VolumePath::parse(&path) else {
        return api_error(ErrorCode::InvalidPath, "invalid path");
    };
    let mut state = shared.state.lock().expect("lock");
    state.restores.push((path.clone(), request.clone()));
    if let Some(refused) = check_export(&state, request.export.as_ref()) {
        return refused;
    }
    let (least, kept) = match &source {
        RestoreSource::Snapshot(name) => {
            let Some((snapshot, kept)) = state
                .snapshots
                .get(name.as_str())
                .filter(|(snapshot, _)| snapshot.ready)
                .cloned()
            else {
                return api_error(ErrorCode::NotFound, "no such ready snapshot");
            };
            (snapshot.restore_size_bytes, kept)
        }
        // Its strict reading of requests knows no `archive` field.
        RestoreSource::Archive(_) if state.predates_archive_restores => {
            return api_error(ErrorCode::InvalidBody, "unknown field `archive`");
        }
        RestoreSource::Archive(id) => {
            let Some((archive, kept)) = state.archives.get(&id.to_string()).cloned() else {
                return api_error(ErrorCode::NotFound, "no such archive");
            };
            (archive.capacity_bytes.unwrap_or(0), kept)
        }
    };
    if request.capacity_bytes < least {
        return api_error(ErrorCode::InvalidBody, "smaller than the source");
    }
    let seen = state
        .restores
        .iter()
        .filter(|(restored, _)| *restored == path)
        .count() as u32;
    if seen <= state.restore_polls {
        let progress = RestoreProgress {
            source: source.clone(),
            running_seconds: u64::from(seen),
        };
        return (StatusCode::ACCEPTED, Json(progress)).into_response();
    }
    let made = CreateVolumeRequest {
        capacity_bytes: request.capacity_bytes,
        ..kept
    };
    let asked = (request.owner.clone(), request.quota, request.export.clone());
    let (status, mut volume) = keep_made(&mut state, volume_path, made, asked);
    volume.restore = Some(RestoreOrigin {
        source,
        method: CloneMethod::Reflink,
    });
    (status, Json(volume)).into_response()
}

async fn get_archive(
    State(shared): State<MockShared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Some(response) = enter(&shared, &headers, format!("GET archive {id}")) {
        return response;
    }
    let state = shared.state.lock().expect("lock");
    if state.predates_archive_restores {
        return api_error(ErrorCode::NotFound, "no such endpoint");
    }
    match state.archives.get(&id) {
        Some((archive, _)) => Json(archive.clone()).into_response(),
        None => api_error(ErrorCode::NotFound, "no such archive"),
    }
}
