//! The target side of a replica: `PUT /v1/replicas/{name}` starts the receive as a job
//! and answers when it ends, or `202 Accepted` with how far it is; the same request again
//! waits for the same job, and once the replica is recorded finds it.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use nfsprov_api_types::{ErrorCode, ReceiveReplicaRequest, Snapshot, SnapshotMethod};

use super::blocking::clone_answer_wait;
use super::failure::{ApiResult, Failure, outcome};
use super::input::{json_body, read_body_in_time};
use super::snapshots::{check_snapshots, snapshot_name};
use super::state::AppState;
use crate::auth::Caller;
use crate::store::Created;

pub(super) async fn receive_replica(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    raw_name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let body = read_body_in_time(&state, body, state.max_body_bytes).await;
    let name = snapshot_name(raw_name)?;
    let request: ReceiveReplicaRequest = json_body(&headers, &body?)?;
    // A replica's source volume is a path of another agent: no prefix of this one holds
    // it, so only a credential of the whole root receives replicas.
    if caller.scope().prefix().is_some() {
        return Err(Failure::new(
            ErrorCode::OutOfScope,
            "a replica is received by a credential of the whole export root only",
        ));
    }
    check_snapshots(&state)?;
    let job = state.replicas.job(&state.store, &name, request)?;
    let mut done = job.done.clone();
    let wait = clone_answer_wait(state.request_timeout);
    let ended = tokio::time::timeout(wait, done.wait_for(Option::is_some)).await;
    if let Ok(Ok(finished)) = ended {
        let finished = finished.clone();
        state.replicas.forget(&name, &job);
        let result = match finished.as_deref() {
            Some(Ok((outcome, created))) => Ok((outcome.clone(), *created)),
            Some(Err(error)) => Err(Failure(error.to_api_error())),
            None => Err(Failure::new(
                ErrorCode::Internal,
                "the receive ended without an answer",
            )),
        };
        state
            .metrics
            .count_operation("receive_replica", outcome(&result));
        let (answer, created) = result?;
        let status = match created {
            Created::New => StatusCode::CREATED,
            Created::Existing => StatusCode::OK,
        };
        return Ok((status, Json(answer)).into_response());
    }
    let Some(source) = job.progress.source.get() else {
        return Err(Failure::new(
            ErrorCode::NotReady,
            format!("replica {name}: waiting for the source agent's manifest; repeat the request"),
        ));
    };
    let receiving = Snapshot {
        name: name.clone(),
        source: source.source.clone(),
        method: SnapshotMethod::Replica,
        ready: false,
        created_at: source.created_at.clone(),
        restore_size_bytes: source.restore_size_bytes,
        size_bytes: None,
        exclusive_bytes: None,
    };
    Ok((StatusCode::ACCEPTED, Json(job.progress.outcome(receiving))).into_response())
}
