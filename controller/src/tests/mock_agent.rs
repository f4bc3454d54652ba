//! `MockAgent`, an in-test HTTPS fake of the agent API (NOT the real agent) that keeps its
//! volumes in memory and can be told to fail, to report a volume's condition, or to be out
//! of reach (a relay in front of it that drops every connection).

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
use nfsprov_api_types::client::AgentConnectionConfig;
use nfsprov_api_types::{
    AgentInfo, ApiError, Archive, ArchivePath, ArchiveResult, Capabilities, CloneMethod,
    CloneOrigin, CloneProgress, CloneVolumeRequest, CreateVolumeRequest, Endpoint, ErrorCode,
    ExportRequest, FilesystemStats, NfsExport, QuotaBackend, QuotaPolicy, ResizeVolumeRequest,
    RestoreOrigin, RestoreProgress, RestoreSource, RestoreVolumeRequest, Snapshot, SnapshotMethod,
    SnapshotName, Volume, VolumeCondition, VolumeExport, VolumePath, VolumeUsage,
};
use serde_json::{Value, json};

use crate::agents::AgentRegistry;
use crate::metrics::Metrics;

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
    /// What every answer carrying a volume reports as its condition, by path; none (as an
    /// agent that does not check) when unset.
    pub conditions: BTreeMap<String, VolumeCondition>,
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
    /// What a ready snapshot reports it holds and holds alone (`size_bytes`,
    /// `exclusive_bytes`); neither when unset.
    pub snapshot_cost: (Option<u64>, Option<u64>),
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
    exports_held: Arc<HeldExports>,
}

/// Export changes recorded but held without an answer, while the test says so: the
/// requests a client has in flight at a moment of the test's choosing.
#[derive(Debug)]
pub struct HeldExports {
    holding: tokio::sync::watch::Sender<bool>,
    now: std::sync::atomic::AtomicUsize,
}

impl Default for HeldExports {
    fn default() -> Self {
        Self {
            holding: tokio::sync::watch::Sender::new(false),
            now: std::sync::atomic::AtomicUsize::new(0),
        }
    }
}

impl HeldExports {
    /// Waits while changes are held.
    async fn pass(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        let mut holding = self.holding.subscribe();
        if !*holding.borrow_and_update() {
            return;
        }
        self.now.fetch_add(1, SeqCst);
        let _ = holding.wait_for(|holding| !*holding).await;
        self.now.fetch_sub(1, SeqCst);
    }

    /// The export changes waiting for an answer now.
    pub fn now(&self) -> usize {
        self.now.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A fake agent (a mock, not the real `nfsprov-agent`) on 127.0.0.1 over HTTPS with a
/// throw-away CA, speaking the v1 contract closely enough for the controller's calls.
pub struct MockAgent {
    pub config: AgentConnectionConfig,
    pub state: Arc<Mutex<MockAgentState>>,
    handle: axum_server::Handle<SocketAddr>,
    server: Option<tokio::task::JoinHandle<()>>,
    /// Clients connect through this relay, which serves, cuts or holds them.
    cut: tokio::sync::watch::Sender<Reach>,
    /// Connections the relay holds without an answer now ([`Reach::Silent`]), and the
    /// most it held at once.
    held: Arc<HeldConnections>,
    exports_held: Arc<HeldExports>,
    relay: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Drop for MockAgent {
    fn drop(&mut self) {
        self.handle.shutdown();
        self.relay.abort();
    }
}

/// How the relay in front of the mock treats connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    /// Relayed to the mock.
    Open,
    /// Closed at once, open ones too: an agent that is down (no answer, not an error).
    Cut,
    /// Accepted and held without a byte in answer until the relay serves again: an agent
    /// whose packets are dropped, which costs a client its whole time limit.
    Silent,
}

/// The connections a silent relay holds.
#[derive(Debug, Default)]
pub struct HeldConnections {
    now: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
}

impl HeldConnections {
    fn hold(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.now.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
    }

    fn release(&self) {
        self.now.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// The most connections held at once since the mock started.
    pub fn most(&self) -> usize {
        self.most.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Relays connections from `listener` to `backend` as `reach` says.
async fn relay(
    listener: tokio::net::TcpListener,
    backend: SocketAddr,
    reach: tokio::sync::watch::Receiver<Reach>,
    held: Arc<HeldConnections>,
) {
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            return;
        };
        let mut reach = reach.clone();
        let now = *reach.borrow();
        match now {
            Reach::Cut => drop(inbound),
            Reach::Silent => {
                let held = held.clone();
                held.hold();
                tokio::spawn(async move {
                    // Until the client gives up (its end closes) or the relay serves again.
                    let mut sink = [0u8; 4096];
                    loop {
                        tokio::select! {
                            read = tokio::io::AsyncReadExt::read(&mut inbound, &mut sink) => {
                                if matches!(read, Ok(0) | Err(_)) {
                                    break;
                                }
                            }
                            _ = reach.wait_for(|reach| *reach != Reach::Silent) => break,
                        }
                    }
                    held.release();
                });
            }
            Reach::Open => {
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(backend).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = reach.wait_for(|reach| *reach != Reach::Open) => {}
                    }
                });
            }
        }
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
        let exports_held = Arc::new(HeldExports::default());
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
                exports_held: exports_held.clone(),
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
        let front = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind relay");
        let front_addr = front.local_addr().expect("addr");
        let (cut, cut_rx) = tokio::sync::watch::channel(Reach::Open);
        let held = Arc::new(HeldConnections::default());
        let relay = tokio::spawn(relay(front, addr, cut_rx, held.clone()));
        let config = AgentConnectionConfig {
            name: name.to_owned(),
            url: format!("https://{front_addr}"),
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
            cut,
            held,
            exports_held,
            relay,
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

    /// Out of reach (`true`): every connection is closed without an answer, as with an
    /// agent that is down or cut off by the network; `false` serves again.
    pub fn set_unreachable(&self, unreachable: bool) {
        self.cut
            .send_replace(if unreachable { Reach::Cut } else { Reach::Open });
    }

    /// Silent (`true`): every connection is accepted and never answered, as with an agent
    /// whose packets are dropped; `false` serves again.
    pub fn set_silent(&self, silent: bool) {
        self.cut
            .send_replace(if silent { Reach::Silent } else { Reach::Open });
    }

    /// The connections the silent relay held.
    pub fn held(&self) -> &HeldConnections {
        &self.held
    }

    /// Holding (`true`): every export change is recorded, then held without an answer
    /// until `false`.
    pub fn hold_exports(&self, holding: bool) {
        self.exports_held.holding.send_replace(holding);
    }

    /// The export changes held.
    pub fn exports_held(&self) -> &HeldExports {
        &self.exports_held
    }

    /// Reports `condition` for the volume `path` from now on (`None`: no condition, as an
    /// agent that does not check).
    pub fn set_condition(&self, path: &str, condition: Option<VolumeCondition>) {
        let mut state = self.state.lock().expect("lock");
        match condition {
            Some(condition) => state.conditions.insert(path.to_owned(), condition),
            None => state.conditions.remove(path),
        };
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

    /// What every ready snapshot is answered with from now on as the bytes it holds and
    /// the bytes only it holds.
    pub fn set_snapshot_cost(&self, size_bytes: Option<u64>, exclusive_bytes: Option<u64>) {
        self.state.lock().expect("lock").snapshot_cost = (size_bytes, exclusive_bytes);
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
        | Endpoint::ListSnapshots
        | Endpoint::CreateTransfer
        | Endpoint::TransferManifest
        | Endpoint::TransferContent
        | Endpoint::ReceiveReplica => return None,
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
        condition: state.conditions.get(path.as_str()).cloned(),
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
    shared.exports_held.pass().await;
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
        provisioning: None,
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
    // As the agent, the cost is known once the snapshot is ready.
    let (size_bytes, exclusive_bytes) = if ready {
        state.snapshot_cost
    } else {
        (None, None)
    };
    let (snapshot, kept) = match state.snapshots.get(&name) {
        Some((existing, kept)) => (
            Snapshot {
                ready,
                size_bytes,
                exclusive_bytes,
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
                size_bytes,
                exclusive_bytes,
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
