//! The archive endpoints: a volume archived, the archives listed, read and deleted.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use nfsprov_api_types::{Archive, ArchiveList, ArchivePath, ArchiveRequest, ErrorCode, ListQuery};

use super::blocking::with_path_lock;
use super::exports::unexported;
use super::failure::{ApiResult, Failure, outcome};
use super::input::{invalid_query, json_body, read_body_in_time, volume_path};
use super::scoped::scoped_page;
use super::state::AppState;
use crate::auth::Caller;
use crate::scope::Scope;
use crate::store::{Archived, Deleted};

/// The archive id of `DELETE /v1/archives/{id}`: validated before anything is touched,
/// so traversal, a hidden name or a live volume's path never reaches the store.
/// An archive id names the volume it was archived from, so the caller's scope is checked
/// on the id alone, the same whether or not such an archive exists.
fn archive_id(scope: &Scope, raw: Result<Path<String>, PathRejection>) -> ApiResult<ArchivePath> {
    let Path(raw) =
        raw.map_err(|e| Failure::new(ErrorCode::InvalidPath, format!("invalid path: {e}")))?;
    let id = ArchivePath::parse(&raw)
        .map_err(|e| Failure::new(ErrorCode::InvalidPath, format!("invalid archive id: {e}")))?;
    scope.check_path(id.volume())?;
    Ok(id)
}

pub(super) async fn archive_volume(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    raw_path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let body = read_body_in_time(&state, body, state.max_body_bytes).await;
    let path = volume_path(caller.scope(), raw_path)?;
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

pub(super) async fn list_archives(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    RawQuery(query): RawQuery,
) -> ApiResult<Json<ArchiveList>> {
    let page = ListQuery::parse(query.as_deref(), ArchivePath::parse).map_err(invalid_query)?;
    let scope = caller.scope();
    let (archives, next) = scoped_page(
        page,
        |archive: &Archive| scope.contains(&archive.path),
        |archive| archive.id.clone(),
        |page| async { Ok(state.archives.list(page).await?) },
    )
    .await?;
    Ok(Json(ArchiveList { archives, next }))
}

pub(super) async fn get_archive(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    raw_id: Result<Path<String>, PathRejection>,
) -> ApiResult<Json<Archive>> {
    let id = archive_id(caller.scope(), raw_id)?;
    state
        .archives
        .get(&id)
        .await?
        .map(Json)
        .ok_or_else(|| Failure::new(ErrorCode::NotFound, format!("no archive {id}")))
}

pub(super) async fn delete_archive(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    raw_id: Result<Path<String>, PathRejection>,
) -> ApiResult<StatusCode> {
    let id = archive_id(caller.scope(), raw_id)?;
    let result = state.archives.delete(&id).await.map_err(Failure::from);
    state
        .metrics
        .count_operation("delete_archive", outcome(&result));
    match result? {
        Deleted::Removed | Deleted::WasAbsent => Ok(StatusCode::NO_CONTENT),
    }
}
