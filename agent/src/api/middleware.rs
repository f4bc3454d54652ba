//! What runs around every handler: authentication with the service's slots, the closing
//! of strangers' HTTP/1 connections, and the timing, metrics and audit log of each
//! request with its time limit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Extension;
use axum::body::HttpBody;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use nfsprov_api_types::logsafe::{self, MAX_MESSAGE_BYTES};
use nfsprov_api_types::{Endpoint, ErrorCode, REQUEST_ID_HEADER};
use tokio::sync::Semaphore;

use super::failure::{Failure, FailureMessage, RefusedOutOfScope};
use super::input::read_body;
use super::state::AppState;
use crate::auth::Caller;
use crate::connections::Ticket;
use crate::metrics::{CredentialLabels, RequestLabels, RouteLabels};
use crate::tls::PeerCertificate;

/// Accepts the request when it carries a verified client certificate or a valid token,
/// then waits for one of the service's `slots` to run it.
pub(super) async fn authenticate(
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
                return no_connection_left(request.version());
            }
            // The kinds of operation come before any work: a refused caller takes no slot.
            if let Some(endpoint) = endpoint_of(&request)
                && let Err(refusal) = caller.check_endpoint(endpoint)
            {
                let mut refused = Failure::from(refusal).into_response();
                refused.extensions_mut().insert(caller);
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
        None => refuse_unauthenticated(&state, request),
    }
}

/// The endpoint of the table a routed request is for.
fn endpoint_of(request: &Request) -> Option<Endpoint> {
    let template = request.extensions().get::<MatchedPath>()?.as_str();
    let method = request.method();
    Endpoint::ALL
        .into_iter()
        .find(|endpoint| endpoint.template() == template && endpoint.method() == *method)
}

/// The answer to an authenticated caller whose connection found no authenticated place.
fn no_connection_left(version: http::Version) -> Response {
    let mut refused = Failure::new(
        ErrorCode::NotReady,
        "too many authenticated connections (limits.max_connections); retry on a connection already open or later",
    )
    .into_response();
    // HTTP/2 has no such header: its connection is closed at the stranger's deadline instead.
    if version < http::Version::HTTP_2 {
        refused
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    refused
}

/// The answer to a request that did not authenticate, given at once whatever of the body
/// is still to come. What does come is read and thrown away in the background for a
/// little while (bounded in size, time and number, holding no slot): a client still
/// uploading would otherwise meet a closed connection or a reset stream before it reads
/// why it was refused.
fn refuse_unauthenticated(state: &AppState, request: Request) -> Response {
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

/// An HTTP/1 connection that has not authenticated is closed after each answer (a
/// health check is answered, then the connection goes): keep-alive requests cannot hold
/// a stranger's place. HTTP/2 strangers have their deadline instead (see `server`).
pub(super) async fn close_unauthenticated_http1(
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

/// Times, counts and audits every request, and enforces the request timeout.
pub(super) async fn observe(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
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
    let labels = RequestLabels {
        method: method_label,
        route,
        status: response.status().as_u16(),
    };
    count(&state, &labels, elapsed);
    let request = Audited {
        method,
        uri_path,
        request_id,
        elapsed,
    };
    audit(&state, &request, &response);
    response
}

/// Counts a request answered, and the time it took.
fn count(state: &AppState, labels: &RequestLabels, elapsed: Duration) {
    state.metrics.requests.get_or_create(labels).inc();
    state
        .metrics
        .request_duration
        .get_or_create(&RouteLabels {
            method: labels.method,
            route: labels.route,
        })
        .observe(elapsed.as_secs_f64());
}

/// What the audit line of a request says of it besides its answer.
struct Audited {
    method: Method,
    /// Cleaned and bounded.
    uri_path: String,
    request_id: String,
    elapsed: Duration,
}

/// Writes the audit line of `request`, answered with `response`.
fn audit(state: &AppState, request: &Audited, response: &Response) {
    let Audited {
        method,
        uri_path,
        request_id,
        elapsed,
    } = request;
    let (uri_path, request_id) = (uri_path.as_str(), request_id.as_str());
    let status = response.status();
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
    let mutation = matches!(*method, Method::PUT | Method::DELETE | Method::POST);
    let method = logsafe::clean(method.as_str(), MAX_LOGGED_BYTES);
    let unauthenticated = response.extensions().get::<Caller>().is_none();
    if response.extensions().get::<RefusedOutOfScope>().is_some() {
        // An attempt on what another credential owns, or a controller set up wrong:
        // either way the operator should see it.
        if let Some(caller) = response.extensions().get::<Caller>() {
            state
                .metrics
                .refused_out_of_scope
                .get_or_create(&CredentialLabels {
                    credential: caller.name().to_owned(),
                })
                .inc();
        }
        tracing::warn!(target: "audit", request_id, %caller, %method, path = uri_path, status = status.as_u16(), duration_ms, error, "request refused: outside the credential's scope");
    } else if unauthenticated && !status.is_server_error() && !state.unauthenticated_log.allow() {
        // Anyone can send these: their audit lines are rate-limited (and counted).
    } else if status.is_server_error() {
        tracing::error!(target: "audit", request_id, %caller, %method, path = uri_path, status = status.as_u16(), duration_ms, error, "request failed");
    } else if mutation || status == StatusCode::UNAUTHORIZED {
        tracing::info!(target: "audit", request_id, %caller, %method, path = uri_path, status = status.as_u16(), duration_ms, error, "request");
    } else {
        tracing::debug!(target: "audit", request_id, %caller, %method, path = uri_path, status = status.as_u16(), duration_ms, "request");
    }
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
