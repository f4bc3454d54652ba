//! The restore endpoint: a volume made from a snapshot or an archive, as a job.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use nfsprov_api_types::{ErrorCode, RestoreSource, RestoreVolumeRequest, VolumePath};

use super::blocking::clone_answer_wait;
use super::exports::{check_new_export, export_made};
use super::failure::{ApiResult, Failure};
use super::input::volume_request;
use super::snapshots::{check_snapshots, visible_snapshot};
use super::state::AppState;
use crate::auth::Caller;
use crate::jobs::RestoreAnswer;
use crate::store::VolumeStore;

pub(super) async fn restore_volume(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    raw_path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let (path, request): (VolumePath, RestoreVolumeRequest) =
        volume_request(&state, caller.scope(), raw_path, &headers, body).await?;
    check_new_export(&state, caller.scope(), &path, request.export.as_ref())?;
    let source = request
        .source()
        .map_err(|why| Failure::new(ErrorCode::InvalidBody, format!("{path}: {why}")))?;
    match &source {
        RestoreSource::Snapshot(name) => {
            check_snapshots(&state)?;
            if caller.scope().prefix().is_some()
                && visible_snapshot(&state, &caller, name).await?.is_none()
            {
                // Absent, or another scope's: answered as the store answers the first.
                return Err(Failure::from(VolumeStore::no_ready_snapshot(&path, name)));
            }
        }
        RestoreSource::Archive(id) => caller.scope().check_path(id.volume())?,
    }
    let export = request.export.clone();
    let share = state.job_shares.share(caller.name(), caller.max_jobs());
    let wait = clone_answer_wait(state.request_timeout);
    let result = match state
        .snapshots
        .restore(&path, &source, request, wait, share.as_ref())
        .await
    {
        RestoreAnswer::Running(progress) => {
            return Ok((StatusCode::ACCEPTED, Json(progress)).into_response());
        }
        RestoreAnswer::Done(outcome) => outcome.map_err(Failure),
    };
    export_made(&state, &path, result, export, "restore").await
}
