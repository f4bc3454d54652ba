//! The HTTP API: routes, authentication and audit middleware, JSON errors.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::rejection::PathRejection;
use axum::extract::{MatchedPath, Path, RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter, on};
use axum::{Extension, Json, Router};
use futures::StreamExt;
use nfsprov_api_types::logsafe::{self, MAX_MESSAGE_BYTES};
use nfsprov_api_types::{
    AdoptVolumeRequest, AgentInfo, ApiError, Archive, ArchiveList, ArchivePath, ArchiveRequest,
    Capabilities, CloneVolumeRequest, CreateSnapshotRequest, CreateVolumeRequest, Endpoint,
    ErrorCode, ExportRequest, FilesystemStats, Health, ListQuery, NfsExport, Provisioning,
    REQUEST_ID_HEADER, ResizeVolumeRequest, RestoreSource, RestoreVolumeRequest, SnapshotList,
    SnapshotName, Volume, VolumeList, VolumePath,
};
use tokio::sync::Semaphore;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};

use crate::archive::catalog::Archives;
use crate::auth::{Authenticator, Caller};
use crate::config::AgentConfig;
use crate::connections::Ticket;
use crate::exports::{ExportError, ExportHealth, Exports, FaultPoint, crash_if_asked};
use crate::jobs::{self, CloneAnswer, Clones, JobRunner, RestoreAnswer, SnapshotAnswer, Snapshots};
use crate::metrics::{Metrics, RequestLabels, RouteLabels};
use crate::policy::Policy;
use crate::ratelimit::RateLimit;
use crate::root_filesystem::RootFilesystem;
use crate::store::{self, Archived, Created, Deleted, StoreError, VolumeStore};
use crate::tls::PeerCertificate;
use crate::usage::UsageCache;

/// What the handlers share.
#[derive(Debug)]
pub struct AppState {
    pub store: Arc<VolumeStore>,
    pub auth: Authenticator,
    pub metrics: Metrics,
    pub nfs: NfsExport,
    pub min_free_bytes: u64,
    pub min_free_inodes: u64,
    pub request_timeout: Duration,
    /// Longest wait for a request's body.
    pub body_read_timeout: Duration,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// What a create may ask for.
    pub policy: Policy,
    /// The archives, for the archive endpoints and the retention sweep.
    pub archives: Arc<Archives>,
    /// The clones being made.
    pub clones: Clones,
    /// The snapshots and restores being made.
    pub snapshots: Snapshots,
    /// Who each volume is exported to.
    pub exports: Arc<Exports>,
    /// Whether the export root has its filesystem to itself.
    pub root_filesystem: RootFilesystem,
    /// New per-volume exports on a shared filesystem (`exports.allow_shared_filesystem`).
    allow_shared_filesystem: bool,
    /// New per-volume exports where volumes share a filesystem (`exports.mount_control_only`).
    mount_control_only: bool,
    usage: UsageCache,
    readiness: Mutex<Option<(Instant, Result<(), String>)>>,
    /// Audit lines of unauthenticated requests allowed per second.
    unauthenticated_log: RateLimit,
    /// Bodies of refused requests being drained at once (see [`authenticate`]).
    refused_drains: Arc<Semaphore>,
}

/// The most bodies of refused requests drained at once: past it, a refused body is dropped
/// at once (the client of a flood may then see a reset instead of its 401).
const MAX_REFUSED_DRAINS: usize = 1024;

impl AppState {
    /// The state for `config`'s agent, serving `store` and checking callers with `auth`.
    pub fn new(store: Arc<VolumeStore>, auth: Authenticator, config: &AgentConfig) -> Self {
        let metrics = Metrics::new();
        let job_runner = JobRunner::new(config, &metrics);
        Self {
            archives: Arc::new(Archives::new(
                store.clone(),
                config.archive.clone(),
                metrics.archives.clone(),
            )),
            snapshots: Snapshots::new(store.clone(), metrics.snapshots.clone(), &job_runner),
            clones: Clones::new(store.clone(), metrics.clones.clone(), &job_runner),
            exports: Arc::new(Exports::none(&config.nfs_path)),
            root_filesystem: RootFilesystem {
                mount_point: config.export_root.clone(),
                shared: None,
            },
            allow_shared_filesystem: config.exports.allow_shared_filesystem,
            mount_control_only: config.exports.mount_control_only,
            store,
            auth,
            metrics,
            nfs: NfsExport {
                server: config.nfs_server.clone(),
                path: config.nfs_path.clone(),
            },
            min_free_bytes: config.min_free_bytes,
            min_free_inodes: config.min_free_inodes,
            request_timeout: config.request_timeout,
            body_read_timeout: config.body_read_timeout,
            max_body_bytes: config.max_body_bytes,
            policy: config.policy.clone(),
            // A figure up to a minute old is good enough for capacity dashboards; the
            // first request for a volume waits a little for a fresh one.
            usage: UsageCache::new(Duration::from_secs(60), Duration::from_secs(2), 2),
            readiness: Mutex::new(None),
            unauthenticated_log: RateLimit::new(20, "unauthenticated requests"),
            refused_drains: Arc::new(Semaphore::new(MAX_REFUSED_DRAINS)),
        }
    }

    /// The state with `exports` managing the volumes' exports.
    pub fn with_exports(mut self, exports: Arc<Exports>) -> Self {
        self.exports = exports;
        self
    }

    /// The state with the export root's filesystem as found at start.
    pub fn with_root_filesystem(self, root_filesystem: RootFilesystem) -> Self {
        self.metrics
            .export_root_shared
            .set(i64::from(root_filesystem.is_shared()));
        Self {
            root_filesystem,
            ..self
        }
    }

    /// The readiness verdict, re-checked at most once a second: `/readyz` is
    /// unauthenticated and must not let anyone drive filesystem work by polling it.
    async fn readiness(self: &Arc<Self>) -> Result<(), String> {
        if let Some((at, verdict)) = self
            .readiness
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            && at.elapsed() < Duration::from_secs(1)
        {
            return verdict.clone();
        }
        let state = self.clone();
        let verdict = tokio::task::spawn_blocking(move || {
            state
                .store
                .readiness(state.min_free_bytes, state.min_free_inodes)
        })
        .await
        .unwrap_or_else(|e| Err(format!("readiness check failed: {e}")))
        .and_then(|()| self.exports_readiness());
        *self.readiness.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((Instant::now(), verdict.clone()));
        verdict
    }
}

impl AppState {
    /// Not ready while the exports are degraded: the volumes' API still serves, but a
    /// volume may not be mountable until the reconciler has repaired its export.
    fn exports_readiness(&self) -> Result<(), String> {
        match &*self.exports.health() {
            ExportHealth::Serving => Ok(()),
            ExportHealth::Degraded { reason, since } => Err(format!(
                "exports degraded for {}s: {reason}",
                since.elapsed().as_secs()
            )),
        }
    }
}

/// An error answer: `{"code": ..., "message": ...}` with the code's status.
#[derive(Debug)]
pub struct Failure(pub ApiError);

impl Failure {
    fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Failure(ApiError::new(code, message))
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.code.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let message = self.0.message.clone();
        let code = self.0.code;
        let mut response = (status, Json(self.0)).into_response();
        // Kept for the audit log, which runs outside the handler.
        response.extensions_mut().insert(FailureMessage(message));
        if code == ErrorCode::JobQueueFull {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(jobs::RETRY_AFTER.as_secs()),
            );
        }
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

#[derive(Debug, Clone)]
struct FailureMessage(String);

impl From<StoreError> for Failure {
    fn from(error: StoreError) -> Self {
        Failure(error.to_api_error())
    }
}

impl From<ExportError> for Failure {
    fn from(error: ExportError) -> Self {
        Failure(error.to_api_error())
    }
}

type ApiResult<T> = Result<T, Failure>;

/// Builds the router with every route, limit and middleware.
///
/// `max_concurrent_requests` bounds authenticated API work only, the whole service's at
/// once: a request waits for a slot after it was authenticated, so no unauthenticated
/// client can hold one, and the health endpoints never wait for one.
pub fn router(state: Arc<AppState>, max_concurrent_requests: usize) -> Router {
    let slots = Arc::new(Semaphore::new(max_concurrent_requests));
    let (open, authenticated) = Endpoint::ALL
        .into_iter()
        .partition::<Vec<_>, _>(|endpoint| !endpoint.authenticated());
    let authenticated = routes(&authenticated).route_layer(middleware::from_fn_with_state(
        (state.clone(), slots),
        authenticate,
    ));
    routes(&open)
        .merge(authenticated)
        .fallback(|| async { Failure::new(ErrorCode::NotFound, "no such endpoint") })
        .method_not_allowed_fallback(|| async {
            Failure::new(
                ErrorCode::MethodNotAllowed,
                "method not allowed on this endpoint",
            )
        })
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .layer(PropagateRequestIdLayer::new(
            header::HeaderName::from_static(REQUEST_ID_HEADER),
        ))
        .layer(SetRequestIdLayer::new(
            header::HeaderName::from_static(REQUEST_ID_HEADER),
            MakeRequestUuid,
        ))
        // Before an id is made: one that is unfit is dropped, so a fresh one replaces it.
        .layer(middleware::from_fn(drop_unfit_request_id))
        .layer(middleware::from_fn(close_unauthenticated_http1))
        .with_state(state)
}

/// A router serving `endpoints`, each at its template with its method, and nothing else:
/// the only place routes are added, so every route served is one of the table's.
fn routes(endpoints: &[Endpoint]) -> Router<Arc<AppState>> {
    endpoints.iter().fold(Router::new(), |router, &endpoint| {
        router.route(endpoint.template(), handler(endpoint))
    })
}

/// The handler of each endpoint, with the endpoint's method from the table.
fn handler(endpoint: Endpoint) -> MethodRouter<Arc<AppState>> {
    // The table uses standard methods only; its test in this module builds every route.
    let method = MethodFilter::try_from(endpoint.method())
        .unwrap_or_else(|_| panic!("{endpoint:?}: no method filter for its method"));
    match endpoint {
        Endpoint::Healthz => on(method, healthz),
        Endpoint::Readyz => on(method, readyz),
        Endpoint::Metrics => on(method, metrics),
        Endpoint::Info => on(method, info),
        Endpoint::ListVolumes => on(method, list_volumes),
        Endpoint::CreateVolume => on(method, create_volume),
        Endpoint::GetVolume => on(method, get_volume),
        Endpoint::ResizeVolume => on(method, resize_volume),
        Endpoint::DeleteVolume => on(method, delete_volume),
        Endpoint::AdoptVolume => on(method, adopt_volume),
        Endpoint::CloneVolume => on(method, clone_volume),
        Endpoint::SetVolumeExport => on(method, set_volume_export),
        Endpoint::ListArchives => on(method, list_archives),
        Endpoint::ArchiveVolume => on(method, archive_volume),
        Endpoint::GetArchive => on(method, get_archive),
        Endpoint::DeleteArchive => on(method, delete_archive),
        Endpoint::ListSnapshots => on(method, list_snapshots),
        Endpoint::CreateSnapshot => on(method, create_snapshot),
        Endpoint::GetSnapshot => on(method, get_snapshot),
        Endpoint::DeleteSnapshot => on(method, delete_snapshot),
        Endpoint::RestoreVolume => on(method, restore_volume),
    }
}

/// Accepts the request when it carries a verified client certificate or a valid token,
/// then waits for one of the service's `slots` to run it.
async fn authenticate(
    State((state, slots)): State<(Arc<AppState>, Arc<Semaphore>)>,
    peer: Option<Extension<PeerCertificate>>,
    connection: Option<Extension<Arc<Ticket>>>,
    mut request: Request,
    next: Next,
) -> Response {
    let certificate = peer
        .as_ref()
        .and_then(|Extension(PeerCertificate(name))| name.as_deref());
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    match state.auth.authenticate(certificate, authorization) {
        Some(caller) => {
            // The connection leaves the strangers' budget for an authenticated place.
            if let Some(Extension(ticket)) = connection
                && ticket.authenticate().is_err()
            {
                let mut refused = Failure::new(
                    ErrorCode::NotReady,
                    "too many authenticated connections (limits.max_connections); retry on a connection already open or later",
                )
                .into_response();
                // HTTP/2 has no such header: its connection is closed at the stranger's
                // deadline instead.
                if request.version() < http::Version::HTTP_2 {
                    refused
                        .headers_mut()
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                }
                return refused;
            }
            request.extensions_mut().insert(caller.clone());
            // Never closed, so acquiring only waits.
            let Ok(_slot) = slots.acquire_owned().await else {
                return Failure::new(ErrorCode::NotReady, "the agent is shutting down")
                    .into_response();
            };
            let mut response = next.run(request).await;
            response.extensions_mut().insert(caller);
            response
        }
        None => {
            // Answered at once, whatever of the body is still to come. What does come is
            // read and thrown away in the background for a little while (bounded in size,
            // time and number, holding no slot): a client still uploading would otherwise
            // meet a closed connection or a reset stream before it reads why it was
            // refused.
            let body = request.into_body();
            if let Ok(drain) = state.refused_drains.clone().try_acquire_owned() {
                let deadline = state.body_read_timeout;
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(deadline, read_body(body, 0)).await;
                    drop(drain);
                });
            }
            Failure::new(
                ErrorCode::Unauthenticated,
                "authentication required: a client certificate from the agent's CA or a valid bearer token",
            )
            .into_response()
        }
    }
}

/// An HTTP/1 connection that has not authenticated is closed after each answer (a
/// health check is answered, then the connection goes): keep-alive requests cannot hold
/// a stranger's place. HTTP/2 strangers have their deadline instead (see `server`).
async fn close_unauthenticated_http1(
    connection: Option<Extension<Arc<Ticket>>>,
    request: Request,
    next: Next,
) -> Response {
    // A request whose body is still coming keeps its connection until its refusal's
    // drain is done (see `authenticate`): closing it under an upload would reset it
    // before the client reads why. The stranger's deadline closes it after that.
    let closable = request.version() < http::Version::HTTP_2 && request.body().is_end_stream();
    let mut response = next.run(request).await;
    if closable && connection.is_some_and(|Extension(ticket)| !ticket.is_authenticated()) {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// The longest request id kept; a longer one is replaced.
const MAX_REQUEST_ID_BYTES: usize = 128;

/// Whether a client's request id is kept as it is: short, and only characters that
/// cannot disturb a log line or a header (those of object names and timestamps).
fn fit_request_id(id: &[u8]) -> bool {
    !id.is_empty()
        && id.len() <= MAX_REQUEST_ID_BYTES
        && id
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:/@+=".contains(b))
}

/// Removes a request id that is not [`fit_request_id`], so the agent makes one of its own;
/// the id used is the one sent back and logged.
async fn drop_unfit_request_id(mut request: Request, next: Next) -> Response {
    let headers = request.headers_mut();
    let unfit = headers
        .get_all(REQUEST_ID_HEADER)
        .iter()
        .any(|id| !fit_request_id(id.as_bytes()))
        || headers.get_all(REQUEST_ID_HEADER).iter().count() > 1;
    if unfit {
        headers.remove(REQUEST_ID_HEADER);
    }
    next.run(request).await
}

/// Times, counts and audits every request, and enforces the request timeout.
async fn observe(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    // What a client sent is logged bounded and never becomes a metric label: labels come
    // from closed sets, so no request can add lasting state.
    let uri_path = logsafe::clean(request.uri().path(), MAX_LOGGED_BYTES);
    let method_label = method_label(&method);
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |m| route_label(m.as_str()));
    let request_id = request
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let response = match tokio::time::timeout(state.request_timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => Failure::new(
            ErrorCode::Timeout,
            format!(
                "request took longer than {}s; the work goes on and a retry will see its result",
                state.request_timeout.as_secs()
            ),
        )
        .into_response(),
    };
    let elapsed = started.elapsed();
    let status = response.status();
    state
        .metrics
        .requests
        .get_or_create(&RequestLabels {
            method: method_label,
            route,
            status: status.as_u16(),
        })
        .inc();
    state
        .metrics
        .request_duration
        .get_or_create(&RouteLabels {
            method: method_label,
            route,
        })
        .observe(elapsed.as_secs_f64());

    let caller = response
        .extensions()
        .get::<Caller>()
        .map_or_else(|| "unauthenticated".to_owned(), ToString::to_string);
    let error_text = response
        .extensions()
        .get::<FailureMessage>()
        // Store errors arrive escaped already: only what is still raw is escaped here.
        .map(|m| logsafe::bound(&logsafe::escape_controls(&m.0), MAX_MESSAGE_BYTES).into_owned())
        .unwrap_or_default();
    let error = error_text.as_str();
    let duration_ms = elapsed.as_secs_f64() * 1000.0;
    let mutation = matches!(method, Method::PUT | Method::DELETE | Method::POST);
    let method = logsafe::clean(method.as_str(), MAX_LOGGED_BYTES);
    let unauthenticated = response.extensions().get::<Caller>().is_none();
    if unauthenticated && !status.is_server_error() && !state.unauthenticated_log.allow() {
        // Anyone can send these: their audit lines are rate-limited (and counted).
    } else if status.is_server_error() {
        tracing::error!(target: "audit", request_id, %caller, %method, path = uri_path, status = status.as_u16(), duration_ms, error, "request failed");
    } else if mutation || status == StatusCode::UNAUTHORIZED {
        tracing::info!(target: "audit", request_id, %caller, %method, path = uri_path, status = status.as_u16(), duration_ms, error, "request");
    } else {
        tracing::debug!(target: "audit", request_id, %caller, %method, path = uri_path, status = status.as_u16(), duration_ms, "request");
    }
    response
}

/// The longest path or method the audit log keeps of a request.
const MAX_LOGGED_BYTES: usize = 256;

fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::POST => "POST",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// The metric label of a matched route: its template in the endpoint table. Every route
/// the router has comes from the table, so `unmatched` is only for requests no route
/// took.
fn route_label(matched: &str) -> &'static str {
    Endpoint::templates()
        .find(|template| *template == matched)
        .unwrap_or("unmatched")
}

async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        reason: None,
    })
}

/// Says whether the agent is ready. The reason it is not (the export path, free bytes) is
/// given only to authenticated callers and the log; anyone else learns only that it is
/// not ready.
async fn readyz(
    State(state): State<Arc<AppState>>,
    peer: Option<Extension<PeerCertificate>>,
    headers: HeaderMap,
) -> Response {
    let certificate = peer
        .as_ref()
        .and_then(|Extension(PeerCertificate(name))| name.as_deref());
    let authorization = headers
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    let authenticated = state
        .auth
        .authenticate(certificate, authorization)
        .is_some();
    match state.readiness().await {
        Ok(()) => Json(Health {
            status: "ok".into(),
            reason: None,
        })
        .into_response(),
        Err(reason) => {
            tracing::debug!(%reason, "not ready");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(Health {
                    status: "unavailable".into(),
                    reason: Some(if authenticated {
                        reason
                    } else {
                        "the agent cannot serve everything now; the agent's log says why".into()
                    }),
                }),
            )
                .into_response()
        }
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    if let Ok(fs) = state.store.filesystem_stats() {
        state
            .metrics
            .filesystem_available_bytes
            .set(fs.available_bytes as i64);
        state
            .metrics
            .filesystem_free_inodes
            .set(fs.free_inodes as i64);
        let provisioning = provisioning(&state.store, &fs);
        state
            .metrics
            .provisioned_bytes
            .set(i64::try_from(provisioning.provisioned_bytes).unwrap_or(i64::MAX));
        state
            .metrics
            .overcommit_ratio
            .set(provisioning.overcommit_ratio);
        state
            .metrics
            .overcommit_warn_ratio
            .set(provisioning.warn_ratio);
    }
    if let Ok(count) = state.store.leftover_count() {
        state.metrics.leftover_entries.set(count as i64);
    }
    state
        .metrics
        .exports
        .degraded
        .set(i64::from(state.exports.health().is_degraded()));
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
        .into_response()
}

/// The capacity promised against the filesystem `fs` of the store's root.
fn provisioning(store: &VolumeStore, fs: &FilesystemStats) -> Provisioning {
    let provisioned = store.provisioned();
    let limits = provisioned.limits();
    let provisioned_bytes = provisioned.bytes();
    Provisioning {
        provisioned_bytes,
        overcommit_ratio: store::provisioned_ratio(provisioned_bytes, fs.total_bytes),
        warn_ratio: limits.warn_ratio,
        max_ratio: limits.max_ratio,
    }
}

async fn info(State(state): State<Arc<AppState>>) -> ApiResult<Json<AgentInfo>> {
    let filesystem = state.store.filesystem_stats()?;
    Ok(Json(AgentInfo {
        provisioning: Some(provisioning(&state.store, &filesystem)),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        nfs: state.nfs.clone(),
        capabilities: Capabilities {
            quota: state.store.backend().kind(),
            quota_enforced: state.store.backend().can_enforce(),
            archive: true,
            exports: state.exports.kind(),
            snapshots: state.store.takes_snapshots(),
            archive_restores: true,
            opaque_export_paths: state.exports.opaque_paths(),
        },
        filesystem,
        export_root_filesystem: Some(state.root_filesystem.to_info(state.allow_shared_filesystem)),
    }))
}

fn volume_path(raw: Result<Path<String>, PathRejection>) -> ApiResult<VolumePath> {
    let Path(raw) =
        raw.map_err(|e| Failure::new(ErrorCode::InvalidPath, format!("invalid path: {e}")))?;
    VolumePath::parse(&raw)
        .map_err(|e| Failure::new(ErrorCode::InvalidPath, format!("invalid volume path: {e}")))
}

/// The archive id of `DELETE /v1/archives/{id}`: validated before anything is touched,
/// so traversal, a hidden name or a live volume's path never reaches the store.
fn archive_id(raw: Result<Path<String>, PathRejection>) -> ApiResult<ArchivePath> {
    let Path(raw) =
        raw.map_err(|e| Failure::new(ErrorCode::InvalidPath, format!("invalid path: {e}")))?;
    ArchivePath::parse(&raw)
        .map_err(|e| Failure::new(ErrorCode::InvalidPath, format!("invalid archive id: {e}")))
}

/// How much of an oversized body is still read (and thrown away) before answering 413.
const OVERSIZED_DRAIN_BYTES: usize = 1 << 20;

/// Reads the body up to `limit` bytes within the body deadline: a client that announces a
/// body and stops sending gets a 408 then, not a slot held until the request timeout.
async fn read_body_in_time(state: &AppState, body: Body, limit: usize) -> ApiResult<Bytes> {
    let deadline = state.body_read_timeout;
    tokio::time::timeout(deadline, read_body(body, limit))
        .await
        .unwrap_or_else(|_| {
            Err(Failure::new(
                ErrorCode::Timeout,
                format!(
                    "the request body did not arrive within {}s (limits.body_read_timeout_seconds)",
                    deadline.as_secs()
                ),
            ))
        })
}

/// Reads the body up to `limit` bytes. An oversized body is read on to its end (at most
/// [`OVERSIZED_DRAIN_BYTES`] more) before the 413 is sent: a client still uploading would
/// otherwise have its stream reset and never see the answer.
async fn read_body(body: Body, limit: usize) -> ApiResult<Bytes> {
    let mut chunks = body.into_data_stream();
    let mut kept = Vec::new();
    let mut seen = 0usize;
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| {
            Failure::new(ErrorCode::InvalidBody, format!("cannot read the body: {e}"))
        })?;
        seen = seen.saturating_add(chunk.len());
        if seen <= limit {
            kept.extend_from_slice(&chunk);
        } else if seen > limit.saturating_add(OVERSIZED_DRAIN_BYTES) {
            break;
        }
    }
    if seen > limit {
        return Err(Failure::new(
            ErrorCode::PayloadTooLarge,
            format!("request body is too large (limit {limit} bytes)"),
        ));
    }
    Ok(kept.into())
}

fn json_body<T: serde::de::DeserializeOwned>(headers: &HeaderMap, body: &[u8]) -> ApiResult<T> {
    if let Some(content_type) = headers.get(header::CONTENT_TYPE)
        && !content_type.as_bytes().starts_with(b"application/json")
    {
        return Err(Failure::new(
            ErrorCode::UnsupportedMediaType,
            "the body must be JSON (Content-Type: application/json)",
        ));
    }
    serde_json::from_slice(body)
        .map_err(|e| Failure::new(ErrorCode::InvalidBody, format!("invalid body: {e}")))
}

/// The volume path and JSON body of a request. The body is read before anything can be
/// refused, so a rejected request's body never remains unread (which would reset the
/// client's stream and lose the answer).
async fn volume_request<T: serde::de::DeserializeOwned>(
    state: &AppState,
    raw_path: Result<Path<String>, PathRejection>,
    headers: &HeaderMap,
    body: Body,
) -> ApiResult<(VolumePath, T)> {
    let body = read_body_in_time(state, body, state.max_body_bytes).await;
    let path = volume_path(raw_path)?;
    Ok((path, json_body(headers, &body?)?))
}

/// Runs filesystem work on the blocking pool while holding the path's lock. The lock
/// guard travels into the blocking task, so a request that times out keeps the path
/// locked until its work has really finished.
async fn with_path_lock<T, E, F>(state: &Arc<AppState>, path: &VolumePath, work: F) -> ApiResult<T>
where
    T: Send + 'static,
    E: Send + 'static,
    Failure: From<E>,
    F: FnOnce(&VolumeStore) -> Result<T, E> + Send + 'static,
{
    let guard = state.store.lock(path).await;
    let store = state.store.clone();
    let result = tokio::task::spawn_blocking(move || {
        let result = work(&store);
        drop(guard);
        result
    })
    .await;
    // Whatever the mutation did, an earlier usage figure no longer describes the path.
    state.usage.forget(path);
    match result {
        Ok(result) => result.map_err(Failure::from),
        Err(e) => Err(Failure::new(
            ErrorCode::Internal,
            format!("filesystem task failed: {e}"),
        )),
    }
}

async fn create_volume(
    State(state): State<Arc<AppState>>,
    raw_path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let (path, request): (VolumePath, CreateVolumeRequest) =
        volume_request(&state, raw_path, &headers, body).await?;
    check_new_export(&state, &path, request.export.as_ref())?;
    if let Err(refusal) = state.policy.check(&request) {
        state.metrics.count_operation("create", "rejected");
        return Err(Failure::new(
            ErrorCode::Forbidden,
            format!("{path}: {refusal}"),
        ));
    }
    let exports = state.exports.clone();
    let result = with_path_lock(&state, &path.clone(), move |store| {
        let (volume, created) = store.create(&path, &request)?;
        let volume = exported(&exports, volume, request.export.as_ref())?;
        Ok::<_, Failure>((volume, created))
    })
    .await;
    state.metrics.count_operation("create", outcome(&result));
    let (volume, created) = result?;
    Ok(made_or_found(volume, created))
}

/// Checks a request's `export` against this agent's manager before anything is made:
/// without a manager the operator exports the export root, so asking who may mount a
/// volume is refused rather than ignored; with one, a volume without an export would be
/// one nobody can mount, made by mistake.
fn check_export(
    state: &AppState,
    path: &VolumePath,
    export: Option<&ExportRequest>,
) -> ApiResult<()> {
    match (export, state.exports.kind().per_volume()) {
        (None, false) => Ok(()),
        (Some(_), false) => Err(no_export_manager(path)),
        (None, true) => Err(Failure::new(
            ErrorCode::InvalidBody,
            format!(
                "{path}: this agent exports each volume ({}); the request must say who may mount it (`export`)",
                state.exports.kind()
            ),
        )),
        (Some(request), true) => {
            request.validate().map_err(|e| {
                Failure::new(ErrorCode::InvalidBody, format!("{path}: export: {e}"))
            })?;
            state
                .policy
                .check_export(request)
                .map_err(|refusal| Failure::new(ErrorCode::Forbidden, format!("{path}: {refusal}")))
        }
    }
}

/// [`check_export`] for a volume about to be made (a create, clone, adoption or
/// restore), which also gets no export while the export root shares its filesystem,
/// unless the operator accepted that. Export changes of existing volumes go on, so that
/// an upgraded agent's volumes keep following their nodes and pods.
fn check_new_export(
    state: &AppState,
    path: &VolumePath,
    export: Option<&ExportRequest>,
) -> ApiResult<()> {
    check_export(state, path, export)?;
    if export.is_none() || state.store.backend().isolates_exports() {
        // Each volume a filesystem of its own: what else shares the root's filesystem
        // is out of every export's reach.
        return Ok(());
    }
    if !state.mount_control_only {
        return Err(Failure::new(
            ErrorCode::Unsupported,
            format!(
                "{path}: this agent's volumes share one filesystem (quota backend {}), so a per-volume export would decide only who mounts the volume by name: a client admitted to any volume could reach every other by forging file handles; use quota backend image, whose volumes are filesystems of their own, or accept that with exports.mount_control_only = true in agent.toml",
                state.store.backend().kind()
            ),
        ));
    }
    match (export, state.root_filesystem.shared.as_deref()) {
        (Some(_), Some(why)) if !state.allow_shared_filesystem => Err(Failure::new(
            ErrorCode::Unsupported,
            format!(
                "{path}: this agent exports no new volume while its export root shares its filesystem ({why}): a client admitted to any volume could reach everything on that filesystem by forging file handles; give the export root a filesystem of its own, or accept that with exports.allow_shared_filesystem = true in agent.toml"
            ),
        )),
        _ => Ok(()),
    }
}

fn no_export_manager(path: &VolumePath) -> Failure {
    Failure::new(
        ErrorCode::Unsupported,
        format!("{path}: this agent exports no volume by itself (no export manager)"),
    )
}

/// The export step after the volume step, under the same path lock: `volume` exported
/// as `request` asks, and reported with its export.
fn exported(
    exports: &Exports,
    mut volume: Volume,
    request: Option<&ExportRequest>,
) -> Result<Volume, Failure> {
    crash_if_asked(FaultPoint::AfterVolume);
    if let Some(request) = request {
        volume.export = Some(exports.set(&volume.path, request)?);
    }
    Ok(volume)
}

/// The volume's export removed before the volume itself is deleted or archived: a crash
/// between the two leaves a volume nobody can mount, never an export of nothing.
fn unexported(exports: &Exports, path: &VolumePath) -> Result<(), Failure> {
    exports.remove(path)?;
    crash_if_asked(FaultPoint::AfterUnexport);
    Ok(())
}

async fn set_volume_export(
    State(state): State<Arc<AppState>>,
    raw_path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<Volume>> {
    let (path, request): (VolumePath, ExportRequest) =
        volume_request(&state, raw_path, &headers, body).await?;
    if !state.exports.kind().per_volume() {
        return Err(no_export_manager(&path));
    }
    check_export(&state, &path, Some(&request))?;
    let exports = state.exports.clone();
    let result = with_path_lock(&state, &path.clone(), move |store| {
        // Under the path lock: a volume deleted meanwhile is not exported again.
        let volume = store.get(&path)?;
        exported(&exports, volume, Some(&request))
    })
    .await;
    state.metrics.count_operation("export", outcome(&result));
    Ok(Json(result?))
}

/// 201 with the volume when the request made it, 200 when it was there already.
fn made_or_found(volume: Volume, how: Created) -> Response {
    let status = match how {
        Created::New => StatusCode::CREATED,
        Created::Existing => StatusCode::OK,
    };
    (status, Json(volume)).into_response()
}

async fn adopt_volume(
    State(state): State<Arc<AppState>>,
    raw_path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let (path, request): (VolumePath, AdoptVolumeRequest) =
        volume_request(&state, raw_path, &headers, body).await?;
    check_new_export(&state, &path, request.export.as_ref())?;
    let exports = state.exports.clone();
    let result = with_path_lock(&state, &path.clone(), move |store| {
        let (volume, adopted) = store.adopt(&path, &request)?;
        let volume = exported(&exports, volume, request.export.as_ref())?;
        Ok::<_, Failure>((volume, adopted))
    })
    .await;
    state.metrics.count_operation("adopt", outcome(&result));
    let (volume, adopted) = result?;
    Ok(made_or_found(volume, adopted))
}

/// How long a clone request waits for its job before answering `202 Accepted`: well
/// inside the agent's own request time limit and the controller's.
fn clone_answer_wait(request_timeout: Duration) -> Duration {
    (request_timeout / 4).min(Duration::from_secs(10))
}

async fn clone_volume(
    State(state): State<Arc<AppState>>,
    raw_path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let (path, request): (VolumePath, CloneVolumeRequest) =
        volume_request(&state, raw_path, &headers, body).await?;
    check_new_export(&state, &path, request.export.as_ref())?;
    let export = request.export.clone();
    let wait = clone_answer_wait(state.request_timeout);
    let result = match state.clones.clone_volume(&path, request, wait).await {
        CloneAnswer::Running(progress) => {
            return Ok((StatusCode::ACCEPTED, Json(progress)).into_response());
        }
        CloneAnswer::Done(outcome) => outcome.map_err(Failure),
    };
    export_made(&state, &path, result, export, "clone").await
}

/// The answer to a clone or restore whose data is in place: the volume with the export
/// its request asked for (as after a create), counted as `operation`.
async fn export_made(
    state: &Arc<AppState>,
    path: &VolumePath,
    made: ApiResult<(Volume, Created)>,
    export: Option<ExportRequest>,
    operation: &'static str,
) -> ApiResult<Response> {
    let result = match made {
        Ok((volume, created)) => {
            let exports = state.exports.clone();
            with_path_lock(state, path, move |store| {
                // Under the path lock: a volume deleted meanwhile is not exported.
                store.get(&volume.path)?;
                Ok::<_, Failure>((exported(&exports, volume, export.as_ref())?, created))
            })
            .await
        }
        Err(failure) => Err(failure),
    };
    state.usage.forget(path);
    state.metrics.count_operation(operation, outcome(&result));
    let (volume, created) = result?;
    Ok(made_or_found(volume, created))
}

async fn resize_volume(
    State(state): State<Arc<AppState>>,
    raw_path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<Volume>> {
    let (path, request): (VolumePath, ResizeVolumeRequest) =
        volume_request(&state, raw_path, &headers, body).await?;
    let result = with_path_lock(&state, &path.clone(), move |store| {
        store.resize(&path, request.capacity_bytes)
    })
    .await;
    state.metrics.count_operation("resize", outcome(&result));
    let mut volume = result?;
    state.exports.describe(&mut volume);
    Ok(Json(volume))
}

async fn get_volume(
    State(state): State<Arc<AppState>>,
    raw_path: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    let path = volume_path(raw_path)?;
    let store = state.store.clone();
    let lookup = path.clone();
    let mut volume = tokio::task::spawn_blocking(move || store.get(&lookup))
        .await
        .map_err(|e| Failure::new(ErrorCode::Internal, format!("filesystem task failed: {e}")))??;
    volume.usage = state.usage.get(&state.store, &path).await;
    state.exports.describe(&mut volume);
    Ok(Json(volume).into_response())
}

async fn list_volumes(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> ApiResult<Json<VolumeList>> {
    let page = ListQuery::parse(query.as_deref(), VolumePath::parse).map_err(invalid_query)?;
    let store = state.store.clone();
    let (mut volumes, next) = tokio::task::spawn_blocking(move || match page {
        Some(page) => store.list_page(page.after.as_ref(), page.limit),
        None => store.list().map(|all| (all, None)),
    })
    .await
    .map_err(|e| Failure::new(ErrorCode::Internal, format!("filesystem task failed: {e}")))??;
    for volume in &mut volumes {
        state.exports.describe(volume);
    }
    Ok(Json(VolumeList { volumes, next }))
}

/// A list query refused; what was wrong is in the message.
fn invalid_query(message: String) -> Failure {
    Failure::new(ErrorCode::InvalidQuery, message)
}

async fn delete_volume(
    State(state): State<Arc<AppState>>,
    raw_path: Result<Path<String>, PathRejection>,
) -> ApiResult<StatusCode> {
    let path = volume_path(raw_path)?;
    let exports = state.exports.clone();
    let result = with_path_lock(&state, &path.clone(), move |store| {
        unexported(&exports, &path)?;
        Ok::<_, Failure>(store.delete(&path)?)
    })
    .await;
    state.metrics.count_operation("delete", outcome(&result));
    match result? {
        Deleted::Removed | Deleted::WasAbsent => Ok(StatusCode::NO_CONTENT),
    }
}

async fn archive_volume(
    State(state): State<Arc<AppState>>,
    raw_path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let body = read_body_in_time(&state, body, state.max_body_bytes).await;
    let path = volume_path(raw_path)?;
    let body = body?;
    // No body at all is what controllers that predate retention send.
    let request: ArchiveRequest = if body.is_empty() {
        ArchiveRequest::default()
    } else {
        json_body(&headers, &body)?
    };
    let exports = state.exports.clone();
    let result = with_path_lock(&state, &path.clone(), move |store| {
        unexported(&exports, &path)?;
        Ok::<_, Failure>(store.archive(&path, request.retention_days)?)
    })
    .await;
    state.metrics.count_operation("archive", outcome(&result));
    let (archived, how) = result?;
    let status = match how {
        Archived::New => StatusCode::CREATED,
        Archived::Earlier => StatusCode::OK,
    };
    Ok((status, Json(archived)).into_response())
}

async fn list_archives(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> ApiResult<Json<ArchiveList>> {
    let page = ListQuery::parse(query.as_deref(), ArchivePath::parse).map_err(invalid_query)?;
    let (archives, next) = match page {
        Some(page) => state.archives.page(page.after, page.limit).await?,
        None => (state.archives.list().await?, None),
    };
    Ok(Json(ArchiveList { archives, next }))
}

async fn get_archive(
    State(state): State<Arc<AppState>>,
    raw_id: Result<Path<String>, PathRejection>,
) -> ApiResult<Json<Archive>> {
    let id = archive_id(raw_id)?;
    state
        .archives
        .get(&id)
        .await?
        .map(Json)
        .ok_or_else(|| Failure::new(ErrorCode::NotFound, format!("no archive {id}")))
}

async fn delete_archive(
    State(state): State<Arc<AppState>>,
    raw_id: Result<Path<String>, PathRejection>,
) -> ApiResult<StatusCode> {
    let id = archive_id(raw_id)?;
    let result = state.archives.delete(&id).await.map_err(Failure::from);
    state
        .metrics
        .count_operation("delete_archive", outcome(&result));
    match result? {
        Deleted::Removed | Deleted::WasAbsent => Ok(StatusCode::NO_CONTENT),
    }
}

/// The snapshot name of a snapshot endpoint: validated before anything is touched, so
/// traversal or a hidden name never reaches the store.
fn snapshot_name(raw: Result<Path<String>, PathRejection>) -> ApiResult<SnapshotName> {
    let Path(raw) =
        raw.map_err(|e| Failure::new(ErrorCode::InvalidPath, format!("invalid path: {e}")))?;
    SnapshotName::parse(&raw).map_err(|e| {
        Failure::new(
            ErrorCode::InvalidPath,
            format!("invalid snapshot name: {e}"),
        )
    })
}

/// Refuses snapshot work on an agent whose volumes cannot be snapshotted.
fn check_snapshots(state: &AppState) -> ApiResult<()> {
    if state.store.takes_snapshots() {
        return Ok(());
    }
    Err(Failure::new(
        ErrorCode::Unsupported,
        format!(
            "this agent's {} volumes cannot be snapshotted",
            state.store.backend().kind()
        ),
    ))
}

async fn create_snapshot(
    State(state): State<Arc<AppState>>,
    raw_name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let body = read_body_in_time(&state, body, state.max_body_bytes).await;
    let name = snapshot_name(raw_name)?;
    let request: CreateSnapshotRequest = json_body(&headers, &body?)?;
    check_snapshots(&state)?;
    let wait = clone_answer_wait(state.request_timeout);
    let result = match state.snapshots.create(&name, request, wait).await {
        SnapshotAnswer::Running(snapshot) => {
            return Ok((StatusCode::ACCEPTED, Json(snapshot)).into_response());
        }
        SnapshotAnswer::Done(outcome) => outcome.map_err(Failure),
    };
    state.metrics.count_operation("snapshot", outcome(&result));
    let (snapshot, created) = result?;
    let status = match created {
        Created::New => StatusCode::CREATED,
        Created::Existing => StatusCode::OK,
    };
    Ok((status, Json(snapshot)).into_response())
}

async fn get_snapshot(
    State(state): State<Arc<AppState>>,
    raw_name: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    let name = snapshot_name(raw_name)?;
    let store = state.store.clone();
    let lookup = name.clone();
    let found = tokio::task::spawn_blocking(move || store.snapshot(&lookup))
        .await
        .map_err(|e| Failure::new(ErrorCode::Internal, format!("filesystem task failed: {e}")))??;
    match found.or_else(|| state.snapshots.pending(&name)) {
        Some(snapshot) => Ok(Json(snapshot).into_response()),
        None => Err(Failure::new(
            ErrorCode::NotFound,
            format!("no snapshot {name}"),
        )),
    }
}

/// The ready snapshots; one being made is found by its name only.
async fn list_snapshots(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> ApiResult<Json<SnapshotList>> {
    let page = ListQuery::parse(query.as_deref(), |raw| {
        SnapshotName::parse(raw).map_err(|e| e.to_string())
    })
    .map_err(invalid_query)?;
    let store = state.store.clone();
    let (snapshots, next) = tokio::task::spawn_blocking(move || match page {
        Some(page) => store.list_snapshots(page.after.as_ref(), Some(page.limit)),
        None => store.list_snapshots(None, None),
    })
    .await
    .map_err(|e| Failure::new(ErrorCode::Internal, format!("filesystem task failed: {e}")))??;
    Ok(Json(SnapshotList { snapshots, next }))
}

async fn delete_snapshot(
    State(state): State<Arc<AppState>>,
    raw_name: Result<Path<String>, PathRejection>,
) -> ApiResult<StatusCode> {
    let name = snapshot_name(raw_name)?;
    if state.snapshots.cancel(&name) {
        // Its job records nothing and removes what it made once its copy ends: no record
        // of it is on disk to outlive a power cut. Otherwise the job's lock is awaited below.
        state.metrics.count_operation("delete_snapshot", "success");
        return Ok(StatusCode::NO_CONTENT);
    }
    let guard = state.store.lock_snapshot(&name).await;
    let store = state.store.clone();
    let result = tokio::task::spawn_blocking(move || {
        let deleted = store.delete_snapshot(&name);
        drop(guard);
        deleted
    })
    .await
    .map_err(|e| Failure::new(ErrorCode::Internal, format!("filesystem task failed: {e}")))
    .and_then(|deleted| deleted.map_err(Failure::from));
    state
        .metrics
        .count_operation("delete_snapshot", outcome(&result));
    match result? {
        Deleted::Removed | Deleted::WasAbsent => Ok(StatusCode::NO_CONTENT),
    }
}

async fn restore_volume(
    State(state): State<Arc<AppState>>,
    raw_path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let (path, request): (VolumePath, RestoreVolumeRequest) =
        volume_request(&state, raw_path, &headers, body).await?;
    check_new_export(&state, &path, request.export.as_ref())?;
    let source = request
        .source()
        .map_err(|why| Failure::new(ErrorCode::InvalidBody, format!("{path}: {why}")))?;
    if matches!(source, RestoreSource::Snapshot(_)) {
        check_snapshots(&state)?;
    }
    let export = request.export.clone();
    let wait = clone_answer_wait(state.request_timeout);
    let result = match state.snapshots.restore(&path, &source, request, wait).await {
        RestoreAnswer::Running(progress) => {
            return Ok((StatusCode::ACCEPTED, Json(progress)).into_response());
        }
        RestoreAnswer::Done(outcome) => outcome.map_err(Failure),
    };
    export_made(&state, &path, result, export, "restore").await
}

fn outcome<T>(result: &ApiResult<T>) -> &'static str {
    match result {
        Ok(_) => "success",
        Err(Failure(error)) if error.code == ErrorCode::Internal => "error",
        Err(_) => "rejected",
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path as FsPath;

    use axum::http::Request as HttpRequest;
    use tower::ServiceExt;

    use super::*;
    use crate::config::{AuthConfig, LogFormat, TokenSection};

    const TOKEN: &str = "table-test-token";

    /// The agent's real state over a temporary export root, with one token.
    fn state(dir: &FsPath) -> Arc<AppState> {
        let root = dir.join("export");
        std::fs::create_dir(&root).unwrap();
        let token = dir.join("token");
        std::fs::write(&token, TOKEN).unwrap();
        let config = AgentConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            export_root: root.clone(),
            nfs_server: "127.0.0.1".into(),
            nfs_path: root.display().to_string(),
            log_format: LogFormat::Text,
            cert_file: dir.join("unused-cert.pem"),
            key_file: dir.join("unused-key.pem"),
            auth: AuthConfig {
                client_ca_file: None,
                allowed_client_names: Vec::new(),
                tokens: vec![TokenSection {
                    name: "controller".into(),
                    file: token,
                }],
                disabled: false,
            },
            max_body_bytes: 64 * 1024,
            request_timeout: Duration::from_secs(30),
            max_connections: 16,
            max_tls_handshakes: 256,
            tls_handshake_timeout: Duration::from_secs(5),
            max_unauthenticated_connections: 512,
            max_unauthenticated_per_source: 128,
            unauthenticated_timeout: Duration::from_secs(5),
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_read_timeout: Duration::from_secs(10),
            max_concurrent_requests: 4,
            max_clone_jobs: 1,
            max_queued_jobs: 64,
            overcommit: Default::default(),
            shutdown_grace: Duration::from_secs(1),
            min_free_bytes: 0,
            min_free_inodes: 0,
            quota: Default::default(),
            policy: Default::default(),
            archive: Default::default(),
            exports: Default::default(),
        };
        let store = Arc::new(VolumeStore::open(&root).unwrap());
        let auth = Authenticator::new(&config.auth).unwrap();
        Arc::new(AppState::new(store, auth, &config))
    }

    /// The concrete path of an endpoint, its parameter filled with a valid sample.
    fn sample_path(endpoint: Endpoint) -> String {
        match endpoint {
            Endpoint::GetArchive | Endpoint::DeleteArchive => endpoint
                .path_for(&ArchivePath::parse("table/probe/@20260101T000000.000000000Z").unwrap()),
            Endpoint::CreateSnapshot | Endpoint::GetSnapshot | Endpoint::DeleteSnapshot => {
                endpoint.path_for(&SnapshotName::parse("table-probe").unwrap())
            }
            _ if endpoint.takes_path() => {
                endpoint.path_for(&VolumePath::parse("table/probe").unwrap())
            }
            _ => endpoint.path().to_owned(),
        }
    }

    async fn send(router: &Router, method: Method, path: &str) -> (StatusCode, String) {
        let request = HttpRequest::builder()
            .method(method)
            .uri(path)
            .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from("{}"))
            .unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// What the router answers for a path or method none of its routes serves.
    fn unrouted(status: StatusCode, body: &str) -> bool {
        status == StatusCode::METHOD_NOT_ALLOWED || body.contains("no such endpoint")
    }

    #[test]
    fn every_routed_path_is_in_the_endpoint_table() {
        let dir = tempfile::tempdir().unwrap();
        let router = router(state(dir.path()), 4);
        // axum keeps no public list of its routes; its Debug output names the paths of
        // the path router (and the fallback router's, which holds only the fallback).
        let debug = format!("{router:?}");
        let (paths, _fallbacks) = debug
            .split_once("fallback_router")
            .expect("the router's Debug output names its fallback router");
        let routed: BTreeSet<&str> = paths
            .split('"')
            .skip(1)
            .step_by(2)
            .filter(|text| text.starts_with('/'))
            .collect();
        let table: BTreeSet<&str> = Endpoint::templates().collect();
        assert_eq!(routed, table, "routes served and the endpoint table differ");
    }

    #[tokio::test]
    async fn every_endpoint_is_served_with_its_method_and_labelled_by_its_template() {
        let dir = tempfile::tempdir().unwrap();
        let state = state(dir.path());
        let router = router(state.clone(), 4);
        for endpoint in Endpoint::ALL {
            let path = sample_path(endpoint);
            let (status, body) = send(&router, endpoint.method(), &path).await;
            assert!(
                !unrouted(status, &body),
                "{endpoint:?} ({} {path}) is not served: {status} {body}",
                endpoint.method()
            );
        }
        let metrics = state.metrics.encode();
        for endpoint in Endpoint::ALL {
            let series = format!(
                "nfsprov_agent_http_requests_total{{method=\"{}\",route=\"{}\",",
                endpoint.method(),
                endpoint.template()
            );
            assert!(metrics.contains(&series), "{series} missing:\n{metrics}");
        }
        assert!(!metrics.contains("unmatched"), "{metrics}");

        // No method the table does not list is served on a template (GET brings HEAD).
        for template in Endpoint::templates() {
            let listed: Vec<Method> = Endpoint::ALL
                .into_iter()
                .filter(|e| e.template() == template)
                .map(Endpoint::method)
                .collect();
            let endpoint = Endpoint::ALL
                .into_iter()
                .find(|e| e.template() == template)
                .unwrap();
            let path = sample_path(endpoint);
            for method in [
                Method::GET,
                Method::PUT,
                Method::POST,
                Method::PATCH,
                Method::DELETE,
                Method::OPTIONS,
            ] {
                if listed.contains(&method) {
                    continue;
                }
                let (status, body) = send(&router, method.clone(), &path).await;
                assert_eq!(
                    status,
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {path} is served but not in the table: {body}"
                );
            }
        }
        // A path outside the table is answered by the fallback and labelled unmatched.
        let (status, body) = send(&router, Method::GET, "/v1/no-such-collection").await;
        assert!(unrouted(status, &body), "{status} {body}");
        assert!(state.metrics.encode().contains("route=\"unmatched\""));
    }

    #[test]
    fn request_ids_are_kept_only_short_and_plain() {
        for kept in [
            "pvc-0d1e-17f3a9c2b4",
            "orphan-check-1a2b",
            "a",
            "ns/claim@x:1+2=3_.",
        ] {
            assert!(fit_request_id(kept.as_bytes()), "{kept}");
        }
        assert!(fit_request_id("r".repeat(MAX_REQUEST_ID_BYTES).as_bytes()));
        for replaced in [
            String::new(),
            "r".repeat(MAX_REQUEST_ID_BYTES + 1),
            "a b".into(),
            "a\"b".into(),
            "a\\nb".into(),
            "é".into(),
            "x\u{1b}[2J".into(),
        ] {
            assert!(!fit_request_id(replaced.as_bytes()), "{replaced:?}");
        }
    }
}
