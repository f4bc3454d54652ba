//! The snapshot endpoints: a snapshot made as a job, looked up, listed and deleted.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use nfsprov_api_types::{
    CreateSnapshotRequest, ErrorCode, ListQuery, Snapshot, SnapshotList, SnapshotName,
};

use super::blocking::{clone_answer_wait, off_workers};
use super::failure::{ApiResult, Failure, outcome};
use super::input::{invalid_query, json_body, read_body_in_time};
use super::scoped::scoped_page;
use super::state::AppState;
use crate::auth::Caller;
use crate::jobs::SnapshotAnswer;
use crate::store::{Created, Deleted};

/// The snapshot name of a snapshot endpoint: validated before anything is touched, so
/// traversal or a hidden name never reaches the store.
pub(super) fn snapshot_name(raw: Result<Path<String>, PathRejection>) -> ApiResult<SnapshotName> {
    let Path(raw) =
        raw.map_err(|e| Failure::new(ErrorCode::InvalidPath, format!("invalid path: {e}")))?;
    SnapshotName::parse(&raw).map_err(|e| {
        Failure::new(
            ErrorCode::InvalidPath,
            format!("invalid snapshot name: {e}"),
        )
    })
}

/// The snapshot `name` (ready or being made) when the caller's scope holds its source.
/// Snapshot names are one namespace across the agent: another scope's snapshot is
/// answered as one that does not exist.
pub(super) async fn visible_snapshot(
    state: &AppState,
    caller: &Caller,
    name: &SnapshotName,
) -> ApiResult<Option<Snapshot>> {
    let store = state.store.clone();
    let lookup = name.clone();
    let found = off_workers(move || store.snapshot(&lookup)).await?;
    Ok(found
        .or_else(|| state.snapshots.pending(name))
        .filter(|snapshot| caller.scope().contains(&snapshot.source)))
}

/// Refuses snapshot work on an agent whose volumes cannot be snapshotted.
pub(super) fn check_snapshots(state: &AppState) -> ApiResult<()> {
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

pub(super) async fn create_snapshot(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    raw_name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let body = read_body_in_time(&state, body, state.max_body_bytes).await;
    let name = snapshot_name(raw_name)?;
    let request: CreateSnapshotRequest = json_body(&headers, &body?)?;
    caller.scope().check_path(&request.source)?;
    check_snapshots(&state)?;
    let wait = clone_answer_wait(state.request_timeout);
    let share = state.job_shares.share(caller.name(), caller.max_jobs());
    let result = match state
        .snapshots
        .create(&name, request, wait, share.as_ref())
        .await
    {
        SnapshotAnswer::Running(snapshot) => {
            return Ok((StatusCode::ACCEPTED, Json(snapshot)).into_response());
        }
        SnapshotAnswer::Done(outcome) => outcome.map_err(Failure),
    };
    let result = result.map_err(|failure| name_taken_elsewhere(&caller, &name, failure));
    state.metrics.count_operation("snapshot", outcome(&result));
    let (snapshot, created) = result?;
    let status = match created {
        Created::New => StatusCode::CREATED,
        Created::Existing => StatusCode::OK,
    };
    Ok((status, Json(snapshot)).into_response())
}

pub(super) async fn get_snapshot(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    raw_name: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    let name = snapshot_name(raw_name)?;
    match visible_snapshot(&state, &caller, &name).await? {
        Some(snapshot) => Ok(Json(snapshot).into_response()),
        None => Err(Failure::new(
            ErrorCode::NotFound,
            format!("no snapshot {name}"),
        )),
    }
}

/// The ready snapshots; one being made is found by its name only.
pub(super) async fn list_snapshots(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    RawQuery(query): RawQuery,
) -> ApiResult<Json<SnapshotList>> {
    let page = ListQuery::parse(query.as_deref(), |raw| {
        SnapshotName::parse(raw).map_err(|e| e.to_string())
    })
    .map_err(invalid_query)?;
    let scope = caller.scope();
    let (snapshots, next) = scoped_page(
        page,
        |snapshot: &Snapshot| scope.contains(&snapshot.source),
        |snapshot| snapshot.name.clone(),
        |page| {
            let store = state.store.clone();
            off_workers(move || store.list_snapshots(page.as_ref()))
        },
    )
    .await?;
    Ok(Json(SnapshotList { snapshots, next }))
}

pub(super) async fn delete_snapshot(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    raw_name: Result<Path<String>, PathRejection>,
) -> ApiResult<StatusCode> {
    let name = snapshot_name(raw_name)?;
    if caller.scope().prefix().is_some()
        && visible_snapshot(&state, &caller, &name).await?.is_none()
    {
        // Absent, or another scope's: answered alike, and nothing is touched.
        state.metrics.count_operation("delete_snapshot", "success");
        return Ok(StatusCode::NO_CONTENT);
    }
    if state.snapshots.cancel(&name) {
        // Its job records nothing and removes what it made once its copy ends: no record
        // of it is on disk to outlive a power cut. Otherwise the job's lock is awaited below.
        state.metrics.count_operation("delete_snapshot", "success");
        return Ok(StatusCode::NO_CONTENT);
    }
    // No grant outlives its snapshot, nor reads another made later under its name.
    state.auth.grants.revoke_snapshot(&name);
    let guard = state.store.lock_snapshot(&name).await;
    let store = state.store.clone();
    let result = off_workers(move || {
        let deleted = store.delete_snapshot(&name);
        drop(guard);
        deleted
    })
    .await;
    state
        .metrics
        .count_operation("delete_snapshot", outcome(&result));
    match result? {
        Deleted::Removed | Deleted::WasAbsent => Ok(StatusCode::NO_CONTENT),
    }
}

/// A conflict over `name` answered to a scoped caller without naming the source of the
/// snapshot that holds the name, which may be another scope's volume.
fn name_taken_elsewhere(caller: &Caller, name: &SnapshotName, failure: Failure) -> Failure {
    if caller.scope().prefix().is_none() || failure.0.code != ErrorCode::Conflict {
        return failure;
    }
    Failure::new(
        ErrorCode::Conflict,
        format!(
            "snapshot {name} exists already, of another volume (snapshot names are one namespace across the agent)"
        ),
    )
}
