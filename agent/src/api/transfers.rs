//! The source side of a replica: a grant for one snapshot, and that snapshot read
//! through it, its manifest and then each file's content, streamed as it is read.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::{Body, Bytes};
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use nfsprov_api_types::{
    CreateTransferRequest, DEFAULT_TRANSFER_TTL_SECONDS, ErrorCode, MAX_TRANSFER_TTL_SECONDS,
    SnapshotName, TransferContentQuery, TransferGrant,
};

use super::blocking::off_workers;
use super::failure::{ApiResult, Failure};
use super::input::{invalid_query, json_body, read_body_in_time};
use super::snapshots::snapshot_name;
use super::state::AppState;
use crate::auth::Caller;
use crate::replication::stream::{ChannelWriter, body_of};
use crate::replication::{send_extents, write_manifest};

/// Chunks of a streamed answer held between the reading thread and the connection.
const STREAM_CHUNKS: usize = 8;

pub(super) async fn create_transfer(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    raw_name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let body = read_body_in_time(&state, body, state.max_body_bytes).await;
    let name = snapshot_name(raw_name)?;
    let body = body?;
    let request: CreateTransferRequest = if body.is_empty() {
        CreateTransferRequest::default()
    } else {
        json_body(&headers, &body)?
    };
    let ttl = request.ttl_seconds.unwrap_or(DEFAULT_TRANSFER_TTL_SECONDS);
    if ttl == 0 || ttl > MAX_TRANSFER_TTL_SECONDS {
        return Err(Failure::new(
            ErrorCode::InvalidBody,
            format!("ttl_seconds must be 1 to {MAX_TRANSFER_TTL_SECONDS}, not {ttl}"),
        ));
    }
    // A grant is only for a ready snapshot this agent can send: its tree opens now.
    // Another scope's snapshot is answered as one that does not exist.
    let store = state.store.clone();
    let lookup = name.clone();
    let (snapshot, _) = off_workers(move || store.open_snapshot_tree(&lookup)).await?;
    if !caller.scope().contains(&snapshot.source) {
        return Err(Failure::new(
            ErrorCode::NotFound,
            format!("no ready snapshot {name}"),
        ));
    }
    let (token, grant) = state
        .auth
        .grants
        .issue(
            &snapshot.name,
            Duration::from_secs(ttl),
            caller.name(),
            SystemTime::now(),
        )
        .map_err(|e| {
            Failure::new(
                ErrorCode::Internal,
                format!("cannot make a grant's token: {e}"),
            )
        })?;
    state.metrics.count_operation("create_transfer", "success");
    tracing::info!(caller = %caller, snapshot = %name, ttl_seconds = ttl, "transfer granted");
    let answer = TransferGrant {
        token,
        snapshot: grant.snapshot,
        expires_at: crate::condition::rfc3339(grant.expires_at),
    };
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

/// The snapshot a grant's bearer reads.
fn granted(caller: &Caller) -> ApiResult<SnapshotName> {
    caller.granted_snapshot().cloned().ok_or_else(|| {
        Failure::new(
            ErrorCode::OutOfScope,
            "this endpoint takes a transfer grant's token only",
        )
    })
}

pub(super) async fn transfer_manifest(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Response> {
    let name = granted(&caller)?;
    let store = state.store.clone();
    let lookup = name.clone();
    // Opened before answering: a snapshot gone or unsupported is a plain error, not a
    // stream cut short.
    let (snapshot, tree) = off_workers(move || store.open_snapshot_tree(&lookup)).await?;
    let (writer, chunks) = ChannelWriter::new(STREAM_CHUNKS);
    tokio::task::spawn_blocking(move || {
        let mut writer = writer;
        if let Err(e) = write_manifest(&snapshot, tree, &mut writer) {
            tracing::warn!(snapshot = %name, error = %e, "sending a manifest failed");
            writer.fail(e.to_string());
        }
    });
    state
        .metrics
        .count_operation("transfer_manifest", "success");
    Ok(streamed(chunks, "application/x-ndjson"))
}

pub(super) async fn transfer_content(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<TransferContentQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let name = granted(&caller)?;
    let Query(query) = query.map_err(|e| invalid_query(e.body_text()))?;
    let path = crate::replication::decode_path(&query.path)
        .map_err(|e| Failure::new(ErrorCode::InvalidPath, e))?;
    let store = state.store.clone();
    let lookup = name.clone();
    // The file is opened before answering, so a path that is not a regular file of the
    // snapshot is refused with an error the target can read.
    let file = off_workers(move || {
        let (_, tree) = store.open_snapshot_tree(&lookup)?;
        crate::replication::open_file(&tree, &path)
    })
    .await?;
    let (writer, chunks) = ChannelWriter::new(STREAM_CHUNKS);
    tokio::task::spawn_blocking(move || {
        let mut writer = writer;
        if let Err(e) = send_extents(&file, &mut writer) {
            tracing::warn!(snapshot = %name, error = %e, "sending a file failed");
            writer.fail(e.to_string());
        }
    });
    state.metrics.count_operation("transfer_content", "success");
    Ok(streamed(chunks, "application/octet-stream"))
}

fn streamed(
    chunks: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
    kind: &'static str,
) -> Response {
    let mut response = Response::new(body_of(chunks));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(kind));
    response
}
