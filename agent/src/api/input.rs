//! What a handler reads of its request: the volume path validated, and the body read
//! within its size and time limits, as JSON.

use axum::body::{Body, Bytes};
use axum::extract::Path;
use axum::extract::rejection::PathRejection;
use axum::http::{HeaderMap, header};
use futures::StreamExt;
use nfsprov_api_types::{ErrorCode, VolumePath};

use super::failure::{ApiResult, Failure};
use super::state::AppState;
use crate::scope::Scope;

/// The volume path of a request, validated and within the caller's `scope`. Outside it
/// the answer is the same whether or not anything is there.
pub(super) fn volume_path(
    scope: &Scope,
    raw: Result<Path<String>, PathRejection>,
) -> ApiResult<VolumePath> {
    let Path(raw) =
        raw.map_err(|e| Failure::new(ErrorCode::InvalidPath, format!("invalid path: {e}")))?;
    let path = VolumePath::parse(&raw)
        .map_err(|e| Failure::new(ErrorCode::InvalidPath, format!("invalid volume path: {e}")))?;
    scope.check_path(&path)?;
    Ok(path)
}

/// A list query refused; what was wrong is in the message.
pub(super) fn invalid_query(message: String) -> Failure {
    Failure::new(ErrorCode::InvalidQuery, message)
}

/// How much of an oversized body is still read (and thrown away) before answering 413.
const OVERSIZED_DRAIN_BYTES: usize = 1 << 20;

/// Reads the body up to `limit` bytes within the body deadline: a client that announces a
/// body and stops sending gets a 408 then, not a slot held until the request timeout.
pub(super) async fn read_body_in_time(
    state: &AppState,
    body: Body,
    limit: usize,
) -> ApiResult<Bytes> {
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
pub(super) async fn read_body(body: Body, limit: usize) -> ApiResult<Bytes> {
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

pub(super) fn json_body<T: serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    body: &[u8],
) -> ApiResult<T> {
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
pub(super) async fn volume_request<T: serde::de::DeserializeOwned>(
    state: &AppState,
    scope: &Scope,
    raw_path: Result<Path<String>, PathRejection>,
    headers: &HeaderMap,
    body: Body,
) -> ApiResult<(VolumePath, T)> {
    let body = read_body_in_time(state, body, state.max_body_bytes).await;
    let path = volume_path(scope, raw_path)?;
    Ok((path, json_body(headers, &body?)?))
}
