//! The entry points kube-runtime calls for each object: which reconciler a claim or a
//! volume goes to, and the per-object backoff around them.

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use tracing::warn;

use crate::context::{Context, Error};
use crate::objects::{
    CachedClaim, CachedVolume, claim_is_bound, claim_key, claim_state_key, volume_state_key,
};
use crate::{delete, expand, provision, schedules, snapshots};
use nfsprov_vocabulary::snapshots::{Snapshot, SnapshotSchedule};

/// Reconciles one claim: provisions it when it is ours and unbound, expands its volume when
/// it is bound to one of ours and asks for more.
pub async fn reconcile_claim(claim: Arc<CachedClaim>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.leading().await;
    // No claim is refused for an agent whose Secret is simply not read yet.
    ctx.agents.ready().await;
    let pvc = claim.to_claim();
    let result = if claim_is_bound(&pvc) {
        expand::reconcile(&pvc, &ctx).await
    } else {
        provision::reconcile(&pvc, &ctx).await
    };
    if result.is_ok() {
        ctx.backoff.succeeded(&claim_state_key(&pvc));
    }
    result
}

pub fn claim_error_policy(claim: Arc<CachedClaim>, error: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoff.failed(&claim_state_key(&*claim));
    let work = if claim_is_bound(&*claim) {
        "expansion"
    } else {
        "provisioning"
    };
    warn!(claim = %claim_key(&*claim), %error, retry_in = ?delay, "{work} failed");
    Action::requeue(delay)
}

/// Reconciles one volume: deletes released PVs of ours whose reclaimPolicy is Delete.
pub async fn reconcile_volume(pv: Arc<CachedVolume>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.leading().await;
    ctx.agents.ready().await;
    let result = delete::reconcile(&pv, &ctx).await;
    if result.is_ok() {
        ctx.backoff.succeeded(&volume_state_key(&pv));
    }
    result
}

pub fn volume_error_policy(pv: Arc<CachedVolume>, error: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoff.failed(&volume_state_key(&pv));
    warn!(volume = %pv.name_any(), %error, retry_in = ?delay, "deletion failed");
    Action::requeue(delay)
}

/// Reconciles one Snapshot: takes it on its claim's agent, or deletes it there.
pub async fn reconcile_snapshot(
    snapshot: Arc<Snapshot>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    ctx.leading().await;
    ctx.agents.ready().await;
    let result = snapshots::reconcile(&snapshot, &ctx).await;
    if result.is_ok() {
        ctx.backoff.succeeded(&snapshots::state_key(&snapshot));
    }
    result
}

pub fn snapshot_error_policy(snapshot: Arc<Snapshot>, error: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoff.failed(&snapshots::state_key(&snapshot));
    warn!(snapshot = %snapshots::state_key(&snapshot), %error, retry_in = ?delay, "snapshot failed");
    Action::requeue(delay)
}

/// Reconciles one SnapshotSchedule: runs it when due, prunes what it made.
pub async fn reconcile_schedule(
    schedule: Arc<SnapshotSchedule>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    ctx.leading().await;
    let result = schedules::reconcile(&schedule, &ctx).await;
    if result.is_ok() {
        ctx.backoff.succeeded(&schedules::state_key(&schedule));
    }
    result
}

pub fn schedule_error_policy(
    schedule: Arc<SnapshotSchedule>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    let delay = ctx.backoff.failed(&schedules::state_key(&schedule));
    warn!(schedule = %schedules::state_key(&schedule), %error, retry_in = ?delay, "snapshot schedule failed");
    Action::requeue(delay)
}
