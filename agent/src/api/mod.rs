//! The HTTPS API: the router, which serves each endpoint of the table with its handler
//! inside the middleware. The handlers are grouped by what they serve; what they share
//! is below them: the state, error answers, request input and work handed off the
//! async workers.

mod archives;
mod blocking;
mod exports;
mod failure;
mod info;
mod input;
mod middleware;
mod replicas;
mod request_ids;
mod restores;
mod scoped;
mod snapshots;
mod state;
mod transfers;
mod volumes;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use axum::Router;
use axum::http::header;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::routing::{MethodFilter, MethodRouter, on};
use nfsprov_api_types::{Endpoint, ErrorCode, REQUEST_ID_HEADER};
use tokio::sync::Semaphore;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};

use self::failure::Failure;
pub(crate) use self::state::AppState;

/// Builds the router with every route, limit and middleware.
///
/// `max_concurrent_requests` bounds authenticated API work only, the whole service's at
/// once: a request waits for a slot after it was authenticated, so no unauthenticated
/// client can hold one, and the health endpoints never wait for one.
pub(crate) fn router(state: Arc<AppState>, max_concurrent_requests: usize) -> Router {
    let slots = Arc::new(Semaphore::new(max_concurrent_requests));
    let (open, authenticated) = Endpoint::ALL
        .into_iter()
        .partition::<Vec<_>, _>(|endpoint| !endpoint.authenticated());
    let authenticated = routes(&authenticated).route_layer(from_fn_with_state(
        (state.clone(), slots),
        middleware::authenticate,
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
        .layer(from_fn_with_state(state.clone(), middleware::observe))
        .layer(PropagateRequestIdLayer::new(
            header::HeaderName::from_static(REQUEST_ID_HEADER),
        ))
        .layer(SetRequestIdLayer::new(
            header::HeaderName::from_static(REQUEST_ID_HEADER),
            MakeRequestUuid,
        ))
        // Before an id is made: one that is unfit is dropped, so a fresh one replaces it.
        .layer(from_fn(request_ids::drop_unfit_request_id))
        .layer(from_fn(middleware::close_unauthenticated_http1))
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
    // The table uses standard methods only; its test (`api::tests`) builds every route.
    let method = MethodFilter::try_from(endpoint.method())
        .unwrap_or_else(|_| panic!("{endpoint:?}: no method filter for its method"));
    match endpoint {
        Endpoint::Healthz => on(method, info::healthz),
        Endpoint::Readyz => on(method, info::readyz),
        Endpoint::Metrics => on(method, info::metrics),
        Endpoint::Info => on(method, info::info),
        Endpoint::ListVolumes => on(method, volumes::list_volumes),
        Endpoint::CreateVolume => on(method, volumes::create_volume),
        Endpoint::GetVolume => on(method, volumes::get_volume),
        Endpoint::ResizeVolume => on(method, volumes::resize_volume),
        Endpoint::DeleteVolume => on(method, volumes::delete_volume),
        Endpoint::AdoptVolume => on(method, volumes::adopt_volume),
        Endpoint::CloneVolume => on(method, volumes::clone_volume),
        Endpoint::SetVolumeExport => on(method, exports::set_volume_export),
        Endpoint::ListArchives => on(method, archives::list_archives),
        Endpoint::ArchiveVolume => on(method, archives::archive_volume),
        Endpoint::GetArchive => on(method, archives::get_archive),
        Endpoint::DeleteArchive => on(method, archives::delete_archive),
        Endpoint::ListSnapshots => on(method, snapshots::list_snapshots),
        Endpoint::CreateSnapshot => on(method, snapshots::create_snapshot),
        Endpoint::GetSnapshot => on(method, snapshots::get_snapshot),
        Endpoint::DeleteSnapshot => on(method, snapshots::delete_snapshot),
        Endpoint::RestoreVolume => on(method, restores::restore_volume),
        Endpoint::CreateTransfer => on(method, transfers::create_transfer),
        Endpoint::TransferManifest => on(method, transfers::transfer_manifest),
        Endpoint::TransferContent => on(method, transfers::transfer_content),
        Endpoint::ReceiveReplica => on(method, replicas::receive_replica),
    }
}
