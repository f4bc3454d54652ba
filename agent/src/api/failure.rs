//! Error answers: `{"code": ..., "message": ...}` with the code's status, and the
//! outcome label of an operation's metric.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use nfsprov_api_types::{ApiError, ErrorCode};

use crate::exports::ExportError;
use crate::jobs;
use crate::scope::OutOfScope;
use crate::store::StoreError;

/// An error answer: `{"code": ..., "message": ...}` with the code's status.
#[derive(Debug)]
pub(super) struct Failure(pub(super) ApiError);

impl Failure {
    pub(super) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
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
        if code == ErrorCode::OutOfScope {
            response.extensions_mut().insert(RefusedOutOfScope);
        }
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
pub(super) struct FailureMessage(pub(super) String);

/// Marks an answer that refused a request outside its credential's scope, for the
/// audit log's warning and its metric.
#[derive(Debug, Clone, Copy)]
pub(super) struct RefusedOutOfScope;

impl From<OutOfScope> for Failure {
    fn from(refusal: OutOfScope) -> Self {
        Failure::new(ErrorCode::OutOfScope, refusal.to_string())
    }
}

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

pub(super) type ApiResult<T> = Result<T, Failure>;

pub(super) fn outcome<T>(result: &ApiResult<T>) -> &'static str {
    match result {
        Ok(_) => "success",
        Err(Failure(error)) if error.code == ErrorCode::Internal => "error",
        Err(_) => "rejected",
    }
}
