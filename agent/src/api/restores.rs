//! The restore endpoint: a volume made from a snapshot or an archive, as a job.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use nfsprov_api_types::{ErrorCode, RestoreSource, RestoreVolumeRequest, VolumePath};

use super::blocking::clone_answer_wait;
use super::exports::{check_new_export, export_made};
use super::failure::{ApiResult, Failure};
use super::input::volume_request;
use super::snapshots::check_snapshots;
use super::state::AppState;
use crate::jobs::RestoreAnswer;

pub(super) async fn restore_volume(
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
