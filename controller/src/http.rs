//! The small operations server: `/livez`, `/readyz` and `/metrics`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::metrics::Metrics;

#[derive(Debug, Clone)]
pub(crate) struct HttpState {
    pub(crate) ready: Arc<AtomicBool>,
    pub(crate) metrics: Arc<Metrics>,
}

pub(crate) fn router(state: HttpState) -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn readyz(State(state): State<HttpState>) -> Response {
    if state.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced\n").into_response()
    }
}

async fn metrics(State(state): State<HttpState>) -> Response {
    match state.metrics.encode() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    async fn get(app: &Router, uri: &str) -> (StatusCode, String) {
        let response = app
            .clone()
            .oneshot(Request::get(uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    #[tokio::test]
    async fn probes_and_metrics() {
        let state = HttpState {
            ready: Arc::new(AtomicBool::new(false)),
            metrics: Arc::new(Metrics::new()),
        };
        let app = router(state.clone());
        assert_eq!(get(&app, "/livez").await.0, StatusCode::OK);
        assert_eq!(
            get(&app, "/readyz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        state.ready.store(true, Ordering::SeqCst);
        assert_eq!(get(&app, "/readyz").await.0, StatusCode::OK);
        state.metrics.provision_failed("nfs", "");
        let (status, body) = get(&app, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            body.contains(
                "controller_persistentvolumeclaim_provision_failed_total{class=\"nfs\",source=\"\"} 1"
            ),
            "{body}"
        );
        assert_eq!(get(&app, "/nope").await.0, StatusCode::NOT_FOUND);
    }
}
