//! The volume endpoints: made, adopted or cloned, read, listed, resized and deleted.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use nfsprov_api_types::{
    AdoptVolumeRequest, CloneVolumeRequest, CreateVolumeRequest, ErrorCode, ListQuery,
    ResizeVolumeRequest, Volume, VolumeList, VolumePath,
};

use super::blocking::{clone_answer_wait, off_workers, with_path_lock};
use super::exports::{
    check_new_export, export_made, exported, made_or_found, unexported, with_export_withheld,
};
use super::failure::{ApiResult, Failure, outcome};
use super::input::{invalid_query, volume_path, volume_request};
use super::scoped::scoped_page;
use super::state::AppState;
use crate::auth::Caller;
use crate::exports::Exports;
use crate::jobs::CloneAnswer;
use crate::store::{Deleted, VolumeStore};

pub(super) async fn create_volume(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    raw_path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let (path, request): (VolumePath, CreateVolumeRequest) =
        volume_request(&state, caller.scope(), raw_path, &headers, body).await?;
    check_new_export(&state, caller.scope(), &path, request.export.as_ref())?;
    if let Err(refusal) = state.policy.check(&request) {
        state.metrics.count_operation("create", "rejected");
        return Err(Failure::new(
            ErrorCode::Forbidden,
            format!("{path}: {refusal}"),
        ));
    }
    let exports = state.exports.clone();
    let result = with_path_lock(&state, &path.clone(), move |store| {
        let (volume, created) = store.create(&path, &request)?;
        let volume = exported(&exports, volume, request.export.as_ref())?;
        Ok::<_, Failure>((volume, created))
    })
    .await;
    state.metrics.count_operation("create", outcome(&result));
    let (volume, created) = result?;
    Ok(made_or_found(volume, created))
}

pub(super) async fn get_volume(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    raw_path: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    let path = volume_path(caller.scope(), raw_path)?;
    let store = state.store.clone();
    let lookup = path.clone();
    let conditions = state.conditions.clone();
    // A volume gone or unreadable since the last pass saw it is answered for as that
    // pass knew it, with what is wrong now.
    let mut volume = off_workers(move || match store.get(&lookup) {
        Ok(mut volume) => {
            conditions.describe(&mut volume);
            Ok(volume)
        }
        Err(error) => conditions.lost(&lookup).ok_or(error),
    })
    .await?;
    volume.usage = if volume.quota_enforced {
        let fresh_for = state.quota_usage_fresh_for;
        state.usage.get_within(&state.store, &path, fresh_for).await
    } else {
        state.usage.get(&state.store, &path).await
    };
    state.conditions.with_usage(&mut volume);
    state.exports.describe(&mut volume);
    Ok(Json(volume).into_response())
}

pub(super) async fn list_volumes(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    RawQuery(query): RawQuery,
) -> ApiResult<Json<VolumeList>> {
    let page = ListQuery::parse(query.as_deref(), VolumePath::parse).map_err(invalid_query)?;
    let after = page.as_ref().and_then(|page| page.after.clone());
    let scope = caller.scope();
    let (mut volumes, next) = scoped_page(
        page,
        |volume: &Volume| scope.contains(&volume.path),
        |volume| volume.path.clone(),
        |page| {
            let store = state.store.clone();
            off_workers(move || store.list(page.as_ref()))
        },
    )
    .await?;
    for volume in &mut volumes {
        state.exports.describe(volume);
    }
    let conditions = state.conditions.clone();
    // The page covers the paths after its cursor up to the next page's (to the end on the
    // last page): the volumes gone from the store in that span are shown in it.
    let until = match &next {
        Some(next) => Some(VolumePath::parse(next).map_err(|e| {
            Failure::new(ErrorCode::Internal, format!("the next page's cursor: {e}"))
        })?),
        None => None,
    };
    let scope = scope.clone();
    let volumes = off_workers(move || {
        for volume in &mut volumes {
            conditions.describe(volume);
        }
        let listed: std::collections::BTreeSet<&VolumePath> =
            volumes.iter().map(|volume| &volume.path).collect();
        let mut lost = conditions.lost_between(after.as_ref(), until.as_ref(), &listed);
        lost.retain(|volume| scope.contains(&volume.path));
        volumes.extend(lost);
        volumes.sort_by(|a, b| a.path.cmp(&b.path));
        Ok::<_, Failure>(volumes)
    })
    .await?;
    Ok(Json(VolumeList { volumes, next }))
}

pub(super) async fn resize_volume(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    raw_path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<Volume>> {
    let (path, request): (VolumePath, ResizeVolumeRequest) =
        volume_request(&state, caller.scope(), raw_path, &headers, body).await?;
    let exports = state.exports.clone();
    let (offline, result) = match with_path_lock(&state, &path.clone(), move |store| {
        Ok::<_, Failure>(resized(store, &exports, &path, request.capacity_bytes))
    })
    .await
    {
        Ok((offline, result)) => (offline, result),
        Err(failure) => (false, Err(failure)),
    };
    if offline {
        state
            .metrics
            .count_operation("grow_offline", outcome(&result));
    }
    state.metrics.count_operation("resize", outcome(&result));
    let mut volume = result?;
    state.exports.describe(&mut volume);
    Ok(Json(volume))
}

/// The volume resized; where its backend grows it offline, its export withheld around
/// the growth. Answers whether a growth offline was tried, and the volume. Under the
/// volume's path lock.
fn resized(
    store: &VolumeStore,
    exports: &Exports,
    path: &VolumePath,
    capacity_bytes: u64,
) -> (bool, ApiResult<Volume>) {
    let offline = || {
        let grown = with_export_withheld(
            exports,
            path,
            || Ok(store.resize(path, capacity_bytes)?),
            || store.backend().is_servable(path),
        );
        (true, grown)
    };
    if store.backend().grows_offline() {
        return match store.would_grow(path, capacity_bytes) {
            Ok(true) => offline(),
            Ok(false) => (
                false,
                store.resize(path, capacity_bytes).map_err(Failure::from),
            ),
            Err(error) => (false, Err(error.into())),
        };
    }
    match store.resize(path, capacity_bytes) {
        Ok(volume) => (false, Ok(volume)),
        // The kernel refused to grow it mounted, and from now on it is grown offline.
        Err(_) if store.backend().grows_offline() => offline(),
        Err(error) => (false, Err(error.into())),
    }
}

pub(super) async fn delete_volume(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    raw_path: Result<Path<String>, PathRejection>,
) -> ApiResult<StatusCode> {
    let path = volume_path(caller.scope(), raw_path)?;
    let exports = state.exports.clone();
    let result = with_path_lock(&state, &path.clone(), move |store| {
        unexported(&exports, &path)?;
        Ok::<_, Failure>(store.delete(&path)?)
    })
    .await;
    state.metrics.count_operation("delete", outcome(&result));
    match result? {
        Deleted::Removed | Deleted::WasAbsent => Ok(StatusCode::NO_CONTENT),
    }
}

pub(super) async fn adopt_volume(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    raw_path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let (path, request): (VolumePath, AdoptVolumeRequest) =
        volume_request(&state, caller.scope(), raw_path, &headers, body).await?;
    check_new_export(&state, caller.scope(), &path, request.export.as_ref())?;
    let exports = state.exports.clone();
    let result = with_path_lock(&state, &path.clone(), move |store| {
        let (volume, adopted) = store.adopt(&path, &request)?;
        let volume = exported(&exports, volume, request.export.as_ref())?;
        Ok::<_, Failure>((volume, adopted))
    })
    .await;
    state.metrics.count_operation("adopt", outcome(&result));
    let (volume, adopted) = result?;
    Ok(made_or_found(volume, adopted))
}

pub(super) async fn clone_volume(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    raw_path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let (path, request): (VolumePath, CloneVolumeRequest) =
        volume_request(&state, caller.scope(), raw_path, &headers, body).await?;
    check_new_export(&state, caller.scope(), &path, request.export.as_ref())?;
    caller.scope().check_path(&request.source)?;
    let export = request.export.clone();
    let share = state.job_shares.share(caller.name(), caller.max_jobs());
    let wait = clone_answer_wait(state.request_timeout);
    let result = match state
        .clones
        .clone_volume(&path, request, wait, share.as_ref())
        .await
    {
        CloneAnswer::Running(progress) => {
            return Ok((StatusCode::ACCEPTED, Json(progress)).into_response());
        }
        CloneAnswer::Done(outcome) => outcome.map_err(Failure),
    };
    export_made(&state, &path, result, export, "clone").await
}
