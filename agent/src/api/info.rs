//! What the agent says of itself: liveness, readiness, metrics and its capabilities.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use nfsprov_api_types::{
    AgentInfo, Capabilities, FilesystemStats, Health, Provisioning, VolumePath,
};

use super::failure::ApiResult;
use super::state::AppState;
use crate::auth::Caller;
use crate::metrics::{CredentialLabels, NamespaceLabels};
use crate::store::{self, VolumeStore};
use crate::tls::PeerCertificate;

pub(super) async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        reason: None,
    })
}

/// Says whether the agent is ready. The reason it is not (the export path, free bytes) is
/// given only to authenticated callers and the log; anyone else learns only that it is
/// not ready.
pub(super) async fn readyz(
    State(state): State<Arc<AppState>>,
    peer: Option<Extension<PeerCertificate>>,
    headers: HeaderMap,
) -> Response {
    let certificate = peer
        .as_ref()
        .and_then(|Extension(PeerCertificate(name))| name.as_deref());
    let authorization = headers
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    let authenticated = state
        .auth
        .authenticate(certificate, authorization)
        .is_some();
    match state.readiness().await {
        Ok(()) => Json(Health {
            status: "ok".into(),
            reason: None,
        })
        .into_response(),
        Err(reason) => {
            tracing::debug!(%reason, "not ready");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(Health {
                    status: "unavailable".into(),
                    reason: Some(if authenticated {
                        reason
                    } else {
                        "the agent cannot serve everything now; the agent's log says why".into()
                    }),
                }),
            )
                .into_response()
        }
    }
}

pub(super) async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    if let Ok(fs) = state.store.filesystem_stats() {
        state
            .metrics
            .filesystem_available_bytes
            .set(fs.available_bytes as i64);
        state
            .metrics
            .filesystem_free_inodes
            .set(fs.free_inodes as i64);
        let provisioning = provisioning(&state.store, None, &fs);
        state
            .metrics
            .provisioned_bytes
            .set(i64::try_from(provisioning.provisioned_bytes).unwrap_or(i64::MAX));
        state
            .metrics
            .overcommit_ratio
            .set(provisioning.overcommit_ratio);
        state
            .metrics
            .overcommit_warn_ratio
            .set(provisioning.warn_ratio);
    }
    count_credentials(&state);
    let budget = state.store.snapshot_budget();
    // Set afresh at each scrape: a namespace whose snapshots are all gone disappears.
    state.metrics.namespace_snapshot_bytes.clear();
    for (namespace, bytes) in budget.sums() {
        state
            .metrics
            .namespace_snapshot_bytes
            .get_or_create(&NamespaceLabels { namespace })
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }
    state.metrics.namespace_snapshot_bytes_limit.set(
        budget
            .limit()
            .map_or(0, |l| i64::try_from(l).unwrap_or(i64::MAX)),
    );
    if let Ok(count) = state.store.leftover_count() {
        state.metrics.leftover_entries.set(count as i64);
    }
    state
        .metrics
        .exports
        .degraded
        .set(i64::from(state.exports.health().is_degraded()));
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
        .into_response()
}

/// The capacity promised against the filesystem `fs` of the store's root: the whole
/// agent's, or beneath `prefix` only (a scoped caller's own).
fn provisioning(
    store: &VolumeStore,
    prefix: Option<&VolumePath>,
    fs: &FilesystemStats,
) -> Provisioning {
    let provisioned = store.provisioned();
    let limits = provisioned.limits();
    let provisioned_bytes = match prefix {
        None => provisioned.bytes(),
        Some(prefix) => store.prefix_tally().usage(Some(prefix)).bytes,
    };
    Provisioning {
        provisioned_bytes,
        overcommit_ratio: store::provisioned_ratio(provisioned_bytes, fs.total_bytes),
        warn_ratio: limits.warn_ratio,
        max_ratio: limits.max_ratio,
    }
}

/// What the agent is and can do. A scoped caller is told what its own volumes were
/// promised, never the whole agent's figure, nor where the filesystem is mounted: those
/// count and name what other scopes hold.
pub(super) async fn info(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Json<AgentInfo>> {
    let filesystem = state.store.filesystem_stats()?;
    let prefix = caller.scope().prefix();
    let whole_agent = prefix.is_none();
    Ok(Json(AgentInfo {
        provisioning: Some(provisioning(&state.store, prefix, &filesystem)),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        nfs: state.nfs.clone(),
        capabilities: Capabilities {
            quota: state.store.backend().kind(),
            quota_enforced: state.store.backend().can_enforce(),
            archive: true,
            exports: state.exports.kind(),
            snapshots: state.store.takes_snapshots(),
            archive_restores: true,
            opaque_export_paths: state.exports.opaque_paths(),
        },
        filesystem,
        export_root_filesystem: whole_agent
            .then(|| state.root_filesystem.to_info(state.allow_shared_filesystem)),
    }))
}

/// Each scoped or limited credential's volumes and capacity, and its limits, set afresh
/// at each scrape: a revoked credential disappears.
fn count_credentials(state: &AppState) {
    let metrics = &state.metrics;
    let families = [
        &metrics.credential_volumes,
        &metrics.credential_bytes,
        &metrics.credential_volumes_limit,
        &metrics.credential_bytes_limit,
        &metrics.credential_jobs,
        &metrics.credential_jobs_limit,
    ];
    for family in families {
        family.clear();
    }
    let tally = state.store.prefix_tally();
    let gauge = |figure: u64| i64::try_from(figure).unwrap_or(i64::MAX);
    for (credential, admitted, max) in state.job_shares.admitted() {
        let labels = CredentialLabels { credential };
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        metrics
            .credential_jobs
            .get_or_create(&labels)
            .set(count(admitted));
        metrics
            .credential_jobs_limit
            .get_or_create(&labels)
            .set(count(max));
    }
    for limit in tally.limits().iter() {
        let labels = CredentialLabels {
            credential: limit.credential.clone(),
        };
        let used = tally.usage(limit.prefix.as_ref());
        metrics
            .credential_volumes
            .get_or_create(&labels)
            .set(gauge(used.volumes));
        metrics
            .credential_bytes
            .get_or_create(&labels)
            .set(gauge(used.bytes));
        if let Some(max) = limit.max_volumes {
            metrics
                .credential_volumes_limit
                .get_or_create(&labels)
                .set(gauge(max));
        }
        if let Some(max) = limit.max_bytes {
            metrics
                .credential_bytes_limit
                .get_or_create(&labels)
                .set(gauge(max));
        }
    }
}
