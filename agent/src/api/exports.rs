//! Who may mount a volume: the checks of a request's export, the export step after a
//! volume is made and before it is removed, and the endpoint that changes an export.

use std::sync::Arc;

use axum::Extension;
use axum::Json;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use nfsprov_api_types::{ErrorCode, ExportRequest, Volume, VolumePath};

use super::blocking::with_path_lock;
use super::failure::{ApiResult, Failure, outcome};
use super::input::volume_request;
use super::state::AppState;
use crate::auth::Caller;
use crate::exports::{Exports, FaultPoint, crash_if_asked};
use crate::scope::Scope;
use crate::store::Created;

/// Checks a request's `export` against this agent's manager before anything is made:
/// without a manager the operator exports the export root, so asking who may mount a
/// volume is refused rather than ignored; with one, a volume without an export would be
/// one nobody can mount, made by mistake.
pub(super) fn check_export(
    state: &AppState,
    scope: &Scope,
    path: &VolumePath,
    export: Option<&ExportRequest>,
) -> ApiResult<()> {
    match (export, state.exports.kind().per_volume()) {
        (None, false) => Ok(()),
        (Some(_), false) => Err(no_export_manager(path)),
        (None, true) => Err(Failure::new(
            ErrorCode::InvalidBody,
            format!(
                "{path}: this agent exports each volume ({}); the request must say who may mount it (`export`)",
                state.exports.kind()
            ),
        )),
        (Some(request), true) => {
            request.validate().map_err(|e| {
                Failure::new(ErrorCode::InvalidBody, format!("{path}: export: {e}"))
            })?;
            scope.check_export(request)?;
            state
                .policy
                .check_export(request)
                .map_err(|refusal| Failure::new(ErrorCode::Forbidden, format!("{path}: {refusal}")))
        }
    }
}

/// [`check_export`] for a volume about to be made (a create, clone, adoption or
/// restore), which also gets no export while the export root shares its filesystem,
/// unless the operator accepted that. Export changes of existing volumes go on, so that
/// an upgraded agent's volumes keep following their nodes and pods.
pub(super) fn check_new_export(
    state: &AppState,
    scope: &Scope,
    path: &VolumePath,
    export: Option<&ExportRequest>,
) -> ApiResult<()> {
    check_export(state, scope, path, export)?;
    if export.is_none() || state.store.backend().isolates_exports() {
        // Each volume a filesystem of its own: what else shares the root's filesystem
        // is out of every export's reach.
        return Ok(());
    }
    if !state.mount_control_only {
        return Err(Failure::new(
            ErrorCode::Unsupported,
            format!(
                "{path}: this agent's volumes share one filesystem (quota backend {}), so a per-volume export would decide only who mounts the volume by name: a client admitted to any volume could reach every other by forging file handles; use quota backend image, whose volumes are filesystems of their own, or accept that with exports.mount_control_only = true in agent.toml",
                state.store.backend().kind()
            ),
        ));
    }
    match (export, state.root_filesystem.shared.as_deref()) {
        (Some(_), Some(why)) if !state.allow_shared_filesystem => Err(Failure::new(
            ErrorCode::Unsupported,
            format!(
                "{path}: this agent exports no new volume while its export root shares its filesystem ({why}): a client admitted to any volume could reach everything on that filesystem by forging file handles; give the export root a filesystem of its own, or accept that with exports.allow_shared_filesystem = true in agent.toml"
            ),
        )),
        _ => Ok(()),
    }
}

pub(super) fn no_export_manager(path: &VolumePath) -> Failure {
    Failure::new(
        ErrorCode::Unsupported,
        format!("{path}: this agent exports no volume by itself (no export manager)"),
    )
}

/// The export step after the volume step, under the same path lock: `volume` exported
/// as `request` asks, and reported with its export.
pub(super) fn exported(
    exports: &Exports,
    mut volume: Volume,
    request: Option<&ExportRequest>,
) -> Result<Volume, Failure> {
    crash_if_asked(FaultPoint::AfterVolume);
    if let Some(request) = request {
        volume.export = Some(exports.set(&volume.path, request)?);
    }
    Ok(volume)
}

/// The export step around a volume step that takes the volume's filesystem from the NFS
/// server for a while (an image volume grown unmounted), under the caller's path lock:
/// the export withheld, `work` done, the export served again as it was once the volume
/// is `servable` (mounted). The export stays recorded throughout, so a crash in between
/// leaves one the start serves again.
pub(super) fn with_export_withheld<T>(
    exports: &Exports,
    path: &VolumePath,
    work: impl FnOnce() -> Result<T, Failure>,
    servable: impl FnOnce() -> bool,
) -> Result<T, Failure> {
    exports.withhold(path)?;
    let result = work();
    if !servable() {
        // Never an export of the bare mountpoint: the next start mounts the volume
        // (what the work left tells it how) and serves it again.
        exports.keep_withheld(path, "its filesystem could not be mounted again");
        return Err(result.err().unwrap_or_else(|| {
            Failure::new(
                ErrorCode::NotReady,
                format!("{path}: its filesystem is not mounted"),
            )
        }));
    }
    let served = exports.serve_withheld(path);
    let value = result?;
    served?;
    Ok(value)
}

/// The volume's export removed before the volume itself is deleted or archived: a crash
/// between the two leaves a volume nobody can mount, never an export of nothing.
pub(super) fn unexported(exports: &Exports, path: &VolumePath) -> Result<(), Failure> {
    exports.remove(path)?;
    crash_if_asked(FaultPoint::AfterUnexport);
    Ok(())
}

pub(super) async fn set_volume_export(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    raw_path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<Volume>> {
    let (path, request): (VolumePath, ExportRequest) =
        volume_request(&state, caller.scope(), raw_path, &headers, body).await?;
    if !state.exports.kind().per_volume() {
        return Err(no_export_manager(&path));
    }
    check_export(&state, caller.scope(), &path, Some(&request))?;
    let exports = state.exports.clone();
    let result = with_path_lock(&state, &path.clone(), move |store| {
        // Under the path lock: a volume deleted meanwhile is not exported again.
        let volume = store.get(&path)?;
        exported(&exports, volume, Some(&request))
    })
    .await;
    state.metrics.count_operation("export", outcome(&result));
    Ok(Json(result?))
}

/// 201 with the volume when the request made it, 200 when it was there already.
pub(super) fn made_or_found(volume: Volume, how: Created) -> Response {
    let status = match how {
        Created::New => StatusCode::CREATED,
        Created::Existing => StatusCode::OK,
    };
    (status, Json(volume)).into_response()
}

/// The answer to a clone or restore whose data is in place: the volume with the export
/// its request asked for (as after a create), counted as `operation`.
pub(super) async fn export_made(
    state: &Arc<AppState>,
    path: &VolumePath,
    made: ApiResult<(Volume, Created)>,
    export: Option<ExportRequest>,
    operation: &'static str,
) -> ApiResult<Response> {
    let result = match made {
        Ok((volume, created)) => {
            let exports = state.exports.clone();
            with_path_lock(state, path, move |store| {
                // Under the path lock: a volume deleted meanwhile is not exported.
                store.get(&volume.path)?;
                Ok::<_, Failure>((exported(&exports, volume, export.as_ref())?, created))
            })
            .await
        }
        Err(failure) => Err(failure),
    };
    state.usage.forget(path);
    state.metrics.count_operation(operation, outcome(&result));
    let (volume, created) = result?;
    Ok(made_or_found(volume, created))
}
