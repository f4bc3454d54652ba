//! Deletion: released PVs of ours with reclaimPolicy Delete have their data deleted,
//! archived or kept as recorded on the PV, then lose the finalizer and are deleted.

use std::time::Instant;

use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use nfsprov_api_types::{ErrorCode, VolumePath};
use nfsprov_vocabulary::params::{ClassParams, OnDelete, parse_retention_days};
use tracing::{debug, info, warn};

use crate::agents::{BUSY_RETRY, request_id};
use crate::context::{Context, Error};
use crate::objects::{
    ANN_AGENT, ANN_ARCHIVE_RETENTION_DAYS, ANN_ON_DELETE, ANN_PATH, CachedVolume, FINALIZER,
    Provisioners, RECLAIM_DELETE, class_name, has_finalizer, is_ours, phase, reclaim_policy,
    set_finalizers,
};

pub(crate) const REASON_FAILED_DELETE: &str = "VolumeFailedDelete";
const ACTION: &str = "Delete";

/// Ours, reclaimPolicy Delete, Released, and our part not yet done.
fn awaits_deletion(volume: &CachedVolume, provisioner: &Provisioners) -> bool {
    let done = volume.metadata.deletion_timestamp.is_some() && !has_finalizer(volume);
    is_ours(volume, provisioner)
        && reclaim_policy(volume) == RECLAIM_DELETE
        && phase(volume) == "Released"
        // Finalizer removed and delete requested: other finalizers such as pv-protection
        // are what still holds the object.
        && !done
}

/// Reconciles one volume: deletes (or archives) a released PV of ours whose
/// reclaimPolicy is Delete, and keeps our finalizer in step with that policy.
pub(crate) async fn reconcile_volume(
    volume: &CachedVolume,
    ctx: &Context,
) -> Result<Action, Error> {
    if !is_ours(volume, &ctx.provisioner) {
        return Ok(Action::await_change());
    }
    if reclaim_policy(volume) != RECLAIM_DELETE {
        // Someone switched the PV to Retain: the data stays, and our finalizer must go or
        // the PV could never be deleted (the library does the same).
        if has_finalizer(volume) {
            remove_finalizer(volume, ctx).await?;
        }
        return Ok(Action::await_change());
    }
    if !has_finalizer(volume) && volume.metadata.deletion_timestamp.is_none() {
        // Switched from Retain to Delete: as the library does, the finalizer comes first,
        // so the PV cannot go before its data is handled. The patch brings the PV back
        // through the watch, and that reconcile goes on from here.
        add_finalizer(volume, ctx).await?;
        return Ok(Action::await_change());
    }
    if !awaits_deletion(volume, &ctx.provisioner) {
        return Ok(Action::await_change());
    }
    // The cache can lag behind this controller's own last writes (a rerun right after a
    // finished deletion would redo it): act only on what the API says now.
    let api = Api::<CachedVolume>::all(ctx.client.clone());
    let Some(fresh) = api.get_opt(&volume.name_any()).await? else {
        return Ok(Action::await_change());
    };
    if fresh.uid() != volume.uid() || !awaits_deletion(&fresh, &ctx.provisioner) {
        return Ok(Action::await_change());
    }
    let volume = &fresh;
    // An unknown agent is reported by the deletion itself.
    let agent = volume
        .recorded
        .agent
        .as_deref()
        .and_then(|name| ctx.agents.get(name));
    let _slot = match agent.map(|agent| agent.try_slot()) {
        Some(None) => {
            debug!(pv = %volume.name_any(), "every reconcile slot of its agent is taken; waiting");
            return Ok(Action::requeue(BUSY_RETRY));
        }
        slot => slot.flatten(),
    };
    let started = Instant::now();
    let class = class_name(volume).to_owned();
    if let Err(message) = dispose_of_data(volume, ctx).await {
        ctx.metrics.delete_failed(&class);
        ctx.event(
            &volume.object_ref(&()),
            EventType::Warning,
            REASON_FAILED_DELETE,
            ACTION,
            &message,
        )
        .await;
        return Err(Error::Reported(message));
    }
    if has_finalizer(volume) {
        remove_finalizer(volume, ctx).await?;
    }
    let params = DeleteParams {
        // Only the PV we looked at, never a namesake created since.
        preconditions: volume.uid().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&volume.name_any(), &params).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(e) => {
            ctx.metrics.delete_failed(&class);
            return Err(e.into());
        }
    }
    ctx.metrics.delete_succeeded(&class, started.elapsed());
    info!(pv = %volume.name_any(), "volume deleted");
    Ok(Action::await_change())
}

/// Adds our finalizer, guarded by resourceVersion like [`remove_finalizer`].
async fn add_finalizer(volume: &CachedVolume, ctx: &Context) -> Result<(), Error> {
    let mut finalizers: Vec<&str> = volume.finalizers().iter().map(String::as_str).collect();
    finalizers.push(FINALIZER);
    patch_finalizers(volume, ctx, &finalizers).await
}

async fn remove_finalizer(volume: &CachedVolume, ctx: &Context) -> Result<(), Error> {
    let remaining: Vec<&str> = volume
        .finalizers()
        .iter()
        .map(String::as_str)
        .filter(|f| *f != FINALIZER)
        .collect();
    patch_finalizers(volume, ctx, &remaining).await
}

async fn patch_finalizers(
    volume: &CachedVolume,
    ctx: &Context,
    finalizers: &[&str],
) -> Result<(), Error> {
    let api = Api::<CachedVolume>::all(ctx.client.clone());
    Ok(set_finalizers(&api, volume, finalizers).await?)
}

/// What to do with the data: the policy recorded on the PV; for PVs without one, the
/// class's current policy; without a class, archive (never lose data by guessing).
fn policy(volume: &CachedVolume, ctx: &Context) -> Result<OnDelete, String> {
    if let Some(recorded) = volume.recorded.on_delete.as_deref() {
        return recorded
            .parse::<OnDelete>()
            .map_err(|_| format!("annotation {}={recorded:?} is not delete, retain or archive; not touching the data", ANN_ON_DELETE));
    }
    let from_class = ctx
        .class(class_name(volume))
        .and_then(|class| ClassParams::parse(class.parameters.as_ref()).ok())
        .map(|params| params.on_delete);
    Ok(from_class.unwrap_or(OnDelete::Archive))
}

/// The archive retention recorded on the PV; an unreadable one stops the deletion rather
/// than keep the archive for a time nobody asked for.
fn retention_days(volume: &CachedVolume) -> Result<Option<u32>, String> {
    volume
        .recorded
        .archive_retention_days
        .as_deref()
        .map(|raw| {
            parse_retention_days(raw).map_err(|_| {
                format!("annotation {ANN_ARCHIVE_RETENTION_DAYS}={raw:?} is not a whole number of days; not touching the data")
            })
        })
        .transpose()
}

async fn dispose_of_data(volume: &CachedVolume, ctx: &Context) -> Result<(), String> {
    let recorded = &volume.recorded;
    let agent_name = recorded.agent.as_deref().ok_or_else(|| {
        format!("PV has no {} annotation, so the agent holding its data is unknown; not touching the data", ANN_AGENT)
    })?;
    let raw_path = recorded.path.as_deref().ok_or_else(|| {
        format!(
            "PV has no {} annotation, so its directory is unknown; not touching the data",
            ANN_PATH
        )
    })?;
    let path = VolumePath::parse(raw_path).map_err(|e| {
        format!(
            "annotation {}={raw_path:?} is not a valid volume path: {e}",
            ANN_PATH
        )
    })?;
    let policy = policy(volume, ctx)?;
    if policy == OnDelete::Retain {
        info!(pv = %volume.name_any(), agent = %agent_name, %path, "onDelete retain: data kept");
        return Ok(());
    }
    let agent = ctx.agents.get(agent_name).ok_or_else(|| {
        format!(
            "agent {agent_name:?} that holds directory {path} is not configured ({}; known: {})",
            ctx.agents.why_missing(agent_name),
            ctx.agents.names().join(", ")
        )
    })?;
    let rid = request_id(&volume.name_any());
    match policy {
        OnDelete::Delete => agent
            .client()
            .delete_volume(&path, Some(&rid))
            .await
            .map_err(|e| format!("agent {agent_name} could not delete directory {path}: {e}")),
        OnDelete::Archive => match agent
            .client()
            .archive_volume(&path, retention_days(volume)?, Some(&rid))
            .await
        {
            Ok(archived) => {
                info!(pv = %volume.name_any(), %path, archive = %archived.archive_path, "archived");
                Ok(())
            }
            // Nothing there and never archived: someone removed it by hand already.
            Err(e) if e.code() == Some(ErrorCode::NotFound) => {
                warn!(pv = %volume.name_any(), %path, "nothing to archive: directory already gone");
                Ok(())
            }
            Err(e) => Err(format!(
                "agent {agent_name} could not archive directory {path}: {e}"
            )),
        },
        OnDelete::Retain => {
            debug!("retain handled above");
            Ok(())
        }
    }
}
