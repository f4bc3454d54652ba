//! Snapshots: each `nfsprov.dev` Snapshot becomes a snapshot on the agent holding its
//! claim's volume, named after the Snapshot's UID; deleting the Snapshot deletes it, or
//! keeps it under `deletionPolicy: Retain`.
//!
//! Which agent and snapshot name a Snapshot stands for is written into its status before
//! the agent is first asked, so that deleting it later needs neither its claim (which may
//! be gone: a snapshot outlives its source) nor the claim's volume.

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use nfsprov_api_types::{CreateSnapshotRequest, ErrorCode, SnapshotName, VolumePath};
use nfsprov_vocabulary::snapshots::{
    CONDITION_READY, DeletionPolicy, SNAPSHOT_FINALIZER, Snapshot, agent_snapshot_name,
};
use serde_json::{Value, json};
use tracing::{debug, info};

use crate::agents::request_id;
use crate::context::{Context, Error};
use crate::datasource::{SourceClaim, claim_volume};
use crate::metrics::SnapshotState;
use crate::objects::{set_finalizers, volume_name};

pub(crate) const REASON_READY: &str = "SnapshotReady";
pub(crate) const REASON_FAILED: &str = "SnapshotFailed";
pub(crate) const REASON_DELETED: &str = "SnapshotDeleted";
const ACTION: &str = "Snapshot";
/// How often a Snapshot asks its agent again about a snapshot still being made.
const SNAPSHOT_POLL: Duration = Duration::from_secs(3);

/// `snapshot/namespace/name`: the Snapshot's key among per-object state such as backoff.
pub(crate) fn state_key(snapshot: &Snapshot) -> String {
    format!(
        "snapshot/{}/{}",
        snapshot.namespace().unwrap_or_default(),
        snapshot.name_any()
    )
}

fn has_finalizer(snapshot: &Snapshot) -> bool {
    snapshot
        .finalizers()
        .iter()
        .any(|f| f == SNAPSHOT_FINALIZER)
}

/// Where a Snapshot's data is: the agent, the snapshot's name there and its source.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Placement {
    agent: String,
    name: SnapshotName,
    source: VolumePath,
}

/// Reconciles one Snapshot.
pub(crate) async fn reconcile_snapshot(
    snapshot: &Snapshot,
    ctx: &Context,
) -> Result<Action, Error> {
    if snapshot.metadata.deletion_timestamp.is_some() {
        if has_finalizer(snapshot) {
            release(snapshot, ctx).await?;
            patch_finalizers(snapshot, ctx, false).await?;
        }
        ctx.metrics.set_snapshot_state(&state_key(snapshot), None);
        return Ok(Action::await_change());
    }
    if !has_finalizer(snapshot) {
        // Before anything is made on the agent, so nothing made can be left behind.
        patch_finalizers(snapshot, ctx, true).await?;
    }
    // A ready Snapshot is not asked about again: its status, cost included, is what the
    // agent answered when it became ready.
    if snapshot.ready() {
        ctx.metrics
            .set_snapshot_state(&state_key(snapshot), Some(SnapshotState::Ready));
        return Ok(Action::await_change());
    }
    match take(snapshot, ctx).await {
        Ok(Taking::Ready(taken)) => {
            info!(snapshot = %state_key(snapshot), agent = %taken.agent, method = %taken.method, "snapshot ready");
            ctx.metrics
                .set_snapshot_state(&state_key(snapshot), Some(SnapshotState::Ready));
            ctx.event(
                &snapshot.object_ref(&()),
                EventType::Normal,
                REASON_READY,
                ACTION,
                &format!(
                    "Snapshot {} of claim {} is ready on agent {} ({}, restore size {})",
                    taken.name,
                    snapshot.claim_name(),
                    taken.agent,
                    taken.method,
                    taken.restore_size
                ),
            )
            .await;
            Ok(Action::await_change())
        }
        Ok(Taking::Pending) => {
            ctx.metrics
                .set_snapshot_state(&state_key(snapshot), Some(SnapshotState::Pending));
            Ok(Action::requeue(SNAPSHOT_POLL))
        }
        // Not a failure: the agent took nothing for now and said when to ask again.
        Ok(Taking::QueueFull(retry_after)) => {
            debug!(snapshot = %state_key(snapshot), ?retry_after, "the agent's snapshot queue is full; asking again when it says");
            ctx.metrics
                .set_snapshot_state(&state_key(snapshot), Some(SnapshotState::Pending));
            Ok(Action::requeue(retry_after))
        }
        Err(message) => {
            ctx.metrics.snapshot_failed("create");
            ctx.metrics
                .set_snapshot_state(&state_key(snapshot), Some(SnapshotState::Failed));
            let status = json!({"status": {
                "readyToUse": false,
                "error": message,
                "conditions": [ready_condition(snapshot, false, "Failed", &message)],
            }});
            patch_status(snapshot, ctx, &status).await?;
            ctx.event(
                &snapshot.object_ref(&()),
                EventType::Warning,
                REASON_FAILED,
                ACTION,
                &message,
            )
            .await;
            Err(Error::Reported(message))
        }
    }
}

/// How far taking a snapshot came.
enum Taking {
    /// Ready, its status says so.
    Ready(Taken),
    /// Being made.
    Pending,
    /// Not started: the agent's queue of snapshot jobs is full; ask again after this.
    QueueFull(Duration),
}

/// What a ready snapshot's event says.
struct Taken {
    agent: String,
    name: SnapshotName,
    method: String,
    restore_size: String,
}

/// Takes the snapshot, or learns how far the agent is with it: `Some` once it is ready
/// (its status then says so), `None` while it is being made. An error is the message
/// the Snapshot's status and event give.
async fn take(snapshot: &Snapshot, ctx: &Context) -> Result<Taking, String> {
    let placement = match recorded(snapshot)? {
        Some(placement) => placement,
        None => {
            let placement = place(snapshot, ctx).await?;
            // Recorded first: from here on, deleting the Snapshot finds what to delete.
            let status = json!({"status": {
                "readyToUse": false,
                "agent": placement.agent,
                "snapshotName": placement.name,
                "sourcePath": placement.source,
            }});
            patch_status(snapshot, ctx, &status)
                .await
                .map_err(|e| format!("cannot record where the snapshot is made: {e}"))?;
            placement
        }
    };
    let agent = ctx.agents.get(&placement.agent).ok_or_else(|| {
        format!(
            "agent {} is not configured ({})",
            placement.agent,
            ctx.agents.why_missing(&placement.agent)
        )
    })?;
    let rid = request_id(placement.name.as_str());
    let request = CreateSnapshotRequest {
        source: placement.source.clone(),
    };
    let made = match agent
        .client()
        .create_snapshot(&placement.name, &request, Some(&rid))
        .await
    {
        Ok(made) => made,
        Err(e) if e.code() == Some(ErrorCode::JobQueueFull) => {
            return Ok(Taking::QueueFull(e.retry_after().unwrap_or(SNAPSHOT_POLL)));
        }
        Err(e) => {
            return Err(format!(
                "agent {} could not snapshot volume {}: {e}",
                placement.agent, placement.source
            ));
        }
    };
    if !made.ready {
        debug!(snapshot = %state_key(snapshot), "the agent is still making the snapshot");
        let status = json!({"status": {
            "readyToUse": false,
            "error": null,
            "method": made.method.as_str(),
            "conditions": [ready_condition(
                snapshot,
                false,
                "InProgress",
                &format!("agent {} is making the snapshot ({})", placement.agent, made.method),
            )],
        }});
        patch_status(snapshot, ctx, &status)
            .await
            .map_err(|e| e.to_string())?;
        return Ok(Taking::Pending);
    }
    let creation_time: Time = serde_json::from_value(Value::String(made.created_at.clone()))
        .map_err(|e| {
            format!(
                "agent {} reported an invalid creation time {:?}: {e}",
                placement.agent, made.created_at
            )
        })?;
    let restore_size = made.restore_size_bytes.to_string();
    let status = json!({"status": {
        "readyToUse": true,
        "creationTime": creation_time,
        "restoreSize": restore_size,
        "method": made.method.as_str(),
        // What the snapshot costs, as the agent counts it; `null` (no field) where it
        // does not.
        "sizeBytes": made.size_bytes,
        "exclusiveBytes": made.exclusive_bytes,
        "error": null,
        "conditions": [ready_condition(
            snapshot,
            true,
            REASON_READY,
            &format!("snapshot {} on agent {}", placement.name, placement.agent),
        )],
    }});
    patch_status(snapshot, ctx, &status)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Taking::Ready(Taken {
        agent: placement.agent,
        name: placement.name,
        method: made.method.to_string(),
        restore_size,
    }))
}

/// The `Ready` condition; its transition time moves only when its status changes.
fn ready_condition(snapshot: &Snapshot, ready: bool, reason: &str, message: &str) -> Condition {
    let status = if ready { "True" } else { "False" };
    let since = snapshot
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == CONDITION_READY))
        .filter(|c| c.status == status)
        .map_or_else(
            || Time(Timestamp::now()),
            |c| c.last_transition_time.clone(),
        );
    Condition {
        type_: CONDITION_READY.to_owned(),
        status: status.to_owned(),
        observed_generation: snapshot.metadata.generation,
        last_transition_time: since,
        reason: reason.to_owned(),
        message: message.to_owned(),
    }
}

/// The placement a previous reconcile recorded, if any.
fn recorded(snapshot: &Snapshot) -> Result<Option<Placement>, String> {
    let Some(status) = snapshot.status.as_ref() else {
        return Ok(None);
    };
    let (Some(agent), Some(name), Some(source)) = (
        status.agent.as_deref(),
        status.snapshot_name.as_deref(),
        status.source_path.as_deref(),
    ) else {
        return Ok(None);
    };
    let name = SnapshotName::parse(name)
        .map_err(|e| format!("status.snapshotName {name:?} is invalid: {e}"))?;
    let source = VolumePath::parse(source)
        .map_err(|e| format!("status.sourcePath {source:?} is invalid: {e}"))?;
    Ok(Some(Placement {
        agent: agent.to_owned(),
        name,
        source,
    }))
}

/// Finds the agent and volume of the Snapshot's claim, and checks the agent takes
/// snapshots.
async fn place(snapshot: &Snapshot, ctx: &Context) -> Result<Placement, String> {
    let namespace = snapshot.namespace().unwrap_or_default();
    let claim_name = snapshot.claim_name();
    let source = SourceClaim {
        namespace: namespace.clone(),
        name: claim_name.to_owned(),
    };
    let claim = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &namespace)
        .get_opt(claim_name)
        .await
        .map_err(|e| format!("cannot read claim {source}: {e}"))?
        .ok_or_else(|| format!("claim {source} does not exist"))?;
    if volume_name(&claim).is_none() {
        return Err(format!(
            "claim {source} is not bound to a volume yet; the snapshot is taken once it is"
        ));
    }
    let volume = claim_volume(ctx, &claim, &source).map_err(|problem| problem.message)?;
    let agent = ctx.agents.get(&volume.agent).ok_or_else(|| {
        format!(
            "claim {source} is on agent {}, which is not configured ({})",
            volume.agent,
            ctx.agents.why_missing(&volume.agent)
        )
    })?;
    let uid = snapshot.uid().unwrap_or_default();
    let name = SnapshotName::parse(&agent_snapshot_name(&uid))
        .map_err(|e| format!("the Snapshot's UID {uid:?} makes no snapshot name: {e}"))?;
    let capabilities = agent
        .capabilities(&request_id(name.as_str()))
        .await
        .map_err(|e| {
            format!(
                "agent {} did not report its capabilities: {e}",
                volume.agent
            )
        })?;
    if !capabilities.snapshots {
        return Err(format!(
            "agent {} of claim {source} does not take snapshots (an older version, or snapshots turned off)",
            volume.agent
        ));
    }
    Ok(Placement {
        agent: volume.agent,
        name,
        source: volume.path,
    })
}

/// Deals with the agent's snapshot of a deleted Snapshot as its policy says.
async fn release(snapshot: &Snapshot, ctx: &Context) -> Result<(), Error> {
    let placement = recorded(snapshot).map_err(Error::Reported)?;
    let Some(placement) = placement else {
        // Nothing was ever asked of an agent.
        return Ok(());
    };
    if snapshot.spec.deletion_policy == DeletionPolicy::Retain {
        info!(snapshot = %state_key(snapshot), agent = %placement.agent, name = %placement.name, "deletionPolicy Retain: the agent's snapshot is kept");
        return Ok(());
    }
    let Some(agent) = ctx.agents.get(&placement.agent) else {
        let message = format!(
            "agent {} holding snapshot {} is not configured ({}); the Snapshot stays until it is",
            placement.agent,
            placement.name,
            ctx.agents.why_missing(&placement.agent)
        );
        ctx.event(
            &snapshot.object_ref(&()),
            EventType::Warning,
            REASON_FAILED,
            "Delete",
            &message,
        )
        .await;
        return Err(Error::Reported(message));
    };
    let rid = request_id(placement.name.as_str());
    if let Err(source) = agent
        .client()
        .delete_snapshot(&placement.name, Some(&rid))
        .await
    {
        ctx.metrics.snapshot_failed("delete");
        ctx.event(
            &snapshot.object_ref(&()),
            EventType::Warning,
            REASON_FAILED,
            "Delete",
            &format!(
                "agent {} could not delete snapshot {}: {source}",
                placement.agent, placement.name
            ),
        )
        .await;
        return Err(Error::Agent {
            agent: placement.agent,
            source,
        });
    }
    info!(snapshot = %state_key(snapshot), agent = %placement.agent, name = %placement.name, "snapshot deleted");
    ctx.event(
        &snapshot.object_ref(&()),
        EventType::Normal,
        REASON_DELETED,
        "Delete",
        &format!(
            "Deleted snapshot {} on agent {}",
            placement.name, placement.agent
        ),
    )
    .await;
    Ok(())
}

fn api(snapshot: &Snapshot, ctx: &Context) -> Api<Snapshot> {
    Api::namespaced(
        ctx.client.clone(),
        &snapshot.namespace().unwrap_or_default(),
    )
}

async fn patch_status(snapshot: &Snapshot, ctx: &Context, status: &Value) -> Result<(), Error> {
    api(snapshot, ctx)
        .patch_status(
            &snapshot.name_any(),
            &PatchParams::default(),
            &Patch::Merge(status),
        )
        .await?;
    Ok(())
}

/// Adds or removes our finalizer.
async fn patch_finalizers(snapshot: &Snapshot, ctx: &Context, ours: bool) -> Result<(), Error> {
    let mut finalizers: Vec<&str> = snapshot
        .finalizers()
        .iter()
        .map(String::as_str)
        .filter(|f| *f != SNAPSHOT_FINALIZER)
        .collect();
    if ours {
        finalizers.push(SNAPSHOT_FINALIZER);
    }
    Ok(set_finalizers(&api(snapshot, ctx), snapshot, &finalizers).await?)
}
