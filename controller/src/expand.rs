//! Online expansion: this controller is the external resizer of its own PVs.
//!
//! kube-controller-manager has no in-tree plugin that can expand an NFS PV, so when a bound
//! claim asks for more it emits `ExternalExpanding` and waits for an external resizer. What
//! follows is what kubernetes-csi/external-resizer does (`expandAndRecover`, with the
//! status fields of RecoverVolumeExpansionFailure) for a volume that needs no expansion on
//! the node: mark the claim `ControllerResizeInProgress`, resize, record the new capacity
//! on the PV, then on the claim.
//!
//! Every step can be repeated: the agent's PATCH is idempotent, the PV patch sets an
//! absolute value, and a claim found already marked for the same size resumes where a
//! crashed run stopped instead of starting over.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimCondition,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use nfsprov_api_types::client::ClientError;
use nfsprov_api_types::{ErrorCode, QuotaPolicy, Volume, VolumePath};
use nfsprov_vocabulary::quantity::bytes;
use serde_json::{Value, json};
use tracing::{debug, info, warn};

use crate::agents::{Agent, request_id};
use crate::context::{Context, Error};
use crate::objects::{
    ANN_PATH, CachedVolume, STORAGE, allocated, claim_class, claim_key, is_ours, requested,
    resize_status, status_capacity, storage_of, volume_name,
};

/// Event reasons, as external-resizer spells them.
pub(crate) const REASON_RESIZING: &str = "Resizing";
pub(crate) const REASON_RESIZE_FAILED: &str = "VolumeResizeFailed";
pub(crate) const REASON_RESIZE_SUCCEEDED: &str = "VolumeResizeSuccessful";
const ACTION: &str = "Resize";

/// `PersistentVolumeClaimConditionType`s.
const CONDITION_RESIZING: &str = "Resizing";
const CONDITION_CONTROLLER_RESIZE_ERROR: &str = "ControllerResizeError";
/// The conditions that belong to resizing (upstream's `knownResizeConditions`); a finished
/// resize drops them all and leaves any other condition alone.
const RESIZE_CONDITIONS: [&str; 4] = [
    CONDITION_RESIZING,
    "FileSystemResizePending",
    CONDITION_CONTROLLER_RESIZE_ERROR,
    "NodeResizeError",
];

/// `ClaimResourceStatus` values of `status.allocatedResourceStatuses["storage"]`.
pub(crate) const CONTROLLER_RESIZE_IN_PROGRESS: &str = "ControllerResizeInProgress";
pub(crate) const CONTROLLER_RESIZE_INFEASIBLE: &str = "ControllerResizeInfeasible";

/// Why a bound claim is left alone (debug level: nearly every bound claim is).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Skip {
    NotBound,
    NoResizeRequested,
    VolumeNotFound(String),
    VolumeNotOurs,
    VolumeBoundElsewhere,
    ExpansionNotAllowed,
}

/// A bound claim asking for more than its status capacity, on a volume of ours whose
/// class allows expansion; what the cache alone can tell.
#[derive(Debug)]
struct Wanted {
    pv_name: String,
    /// The new size as the user wrote it, and in bytes.
    target: Quantity,
    target_bytes: u64,
    agent: String,
    path: String,
    quota: Option<QuotaPolicy>,
}

/// What such a claim needs, once the PV was read from the API.
#[derive(Debug)]
enum Plan {
    /// The request is below what the volume already has; NFS directories only grow.
    Shrink {
        volume: Quantity,
    },
    Expand(Job),
}

#[derive(Debug)]
struct Job {
    wanted: Wanted,
    /// The PV's capacity already equals the target (a resumed run).
    volume_done: bool,
}

/// External-resizer's `pvcNeedResize` (Bound, request above status capacity), plus the
/// checks that the volume is ours and the class allows expansion.
fn wanted(pvc: &PersistentVolumeClaim, ctx: &Context) -> Result<Wanted, Skip> {
    let phase = pvc.status.as_ref().and_then(|s| s.phase.as_deref());
    let Some(pv_name) = volume_name(pvc).filter(|_| phase == Some("Bound")) else {
        return Err(Skip::NotBound);
    };
    let (Some(target), Some(current)) = (requested(pvc), status_capacity(pvc)) else {
        return Err(Skip::NoResizeRequested);
    };
    let (Some(target_bytes), Some(current_bytes)) = (bytes(target), bytes(current)) else {
        return Err(Skip::NoResizeRequested);
    };
    if target_bytes <= current_bytes {
        return Err(Skip::NoResizeRequested);
    }
    let volume = ctx
        .volumes
        .get(&ObjectRef::new(pv_name))
        .ok_or_else(|| Skip::VolumeNotFound(pv_name.to_owned()))?;
    if !is_ours(&volume, &ctx.provisioner) {
        return Err(Skip::VolumeNotOurs);
    }
    let recorded = &volume.recorded;
    let (Some(agent), Some(path)) = (recorded.agent.as_deref(), recorded.path.as_deref()) else {
        return Err(Skip::VolumeNotOurs);
    };
    // The API's admission plugin already refuses a larger request when the class does not
    // allow expansion; a class edited (or deleted) since then is respected too.
    let allowed = claim_class(pvc)
        .and_then(|name| ctx.class(name))
        .is_some_and(|class| class.allow_volume_expansion == Some(true));
    if !allowed {
        return Err(Skip::ExpansionNotAllowed);
    }
    Ok(Wanted {
        pv_name: pv_name.to_owned(),
        target: target.clone(),
        target_bytes,
        agent: agent.to_owned(),
        path: path.to_owned(),
        quota: recorded.quota.as_deref().and_then(|q| q.parse().ok()),
    })
}

/// External-resizer's `pvCanBeExpanded` and its choice between expanding and resuming, on
/// the PV as the API has it now (the cache may lag behind this controller's own patch).
fn plan(
    pvc: &PersistentVolumeClaim,
    wanted: Wanted,
    volume: Option<&PersistentVolume>,
) -> Result<Plan, Skip> {
    let spec = volume
        .and_then(|v| v.spec.as_ref())
        .ok_or_else(|| Skip::VolumeNotFound(wanted.pv_name.clone()))?;
    let claim_ref = spec.claim_ref.as_ref();
    let bound_here = claim_ref.is_some_and(|r| {
        r.namespace == pvc.metadata.namespace && r.uid.is_some() && r.uid == pvc.metadata.uid
    });
    if !bound_here {
        return Err(Skip::VolumeBoundElsewhere);
    }
    let volume_capacity = storage_of(spec.capacity.as_ref());
    let volume_bytes = volume_capacity.and_then(bytes).unwrap_or(0);
    if wanted.target_bytes < volume_bytes
        && let Some(volume) = volume_capacity
    {
        return Ok(Plan::Shrink {
            volume: volume.clone(),
        });
    }
    Ok(Plan::Expand(Job {
        volume_done: volume_bytes == wanted.target_bytes,
        wanted,
    }))
}

/// Reconciles one bound claim: expands its volume when it asks for more.
pub(crate) async fn reconcile_bound_claim(
    pvc: &PersistentVolumeClaim,
    ctx: &Context,
) -> Result<Action, Error> {
    let planned = match wanted(pvc, ctx) {
        Ok(wanted) => {
            let volume = Api::<PersistentVolume>::all(ctx.client.clone())
                .get_opt(&wanted.pv_name)
                .await?;
            plan(pvc, wanted, volume.as_ref())
        }
        Err(skip) => Err(skip),
    };
    match planned {
        Err(skip) => {
            debug!(claim = %claim_key(pvc), ?skip, "not expanding");
            Ok(Action::await_change())
        }
        Ok(Plan::Shrink { volume }) => {
            refuse_shrink(pvc, &volume, ctx).await;
            Ok(Action::await_change())
        }
        Ok(Plan::Expand(job)) => expand(pvc, &job, ctx).await,
    }
}

/// The API lets a user lower the request after a failed expansion, down to the claim's
/// status capacity; if the volume already grew beyond it, honouring that would mean
/// shrinking a directory, which no quota backend does. Nothing is called: the user must
/// ask for at least the volume's size, then expansion finishes from there.
async fn refuse_shrink(pvc: &PersistentVolumeClaim, volume: &Quantity, ctx: &Context) {
    let target = requested(pvc).map(|q| q.0.as_str()).unwrap_or_default();
    let pv_name = volume_name(pvc).unwrap_or_default();
    warn!(claim = %claim_key(pvc), pv = pv_name, %target, volume = %volume.0, "refusing to shrink");
    ctx.event(
        &pvc.object_ref(&()),
        EventType::Warning,
        REASON_RESIZE_FAILED,
        ACTION,
        &format!(
            "cannot shrink volume {pv_name} from {} to {target}: NFS volumes can only grow; set the claim's storage request to at least {} to finish the expansion",
            volume.0, volume.0
        ),
    )
    .await;
}

/// Whether the claim was already marked for this very size (by a run that crashed or
/// failed afterwards): then its status is left as it is, as upstream does, and the work
/// resumes.
fn already_marked(pvc: &PersistentVolumeClaim, target_bytes: u64) -> bool {
    let same_size = allocated(pvc).and_then(bytes) == Some(target_bytes);
    let marked = matches!(
        resize_status(pvc),
        Some(CONTROLLER_RESIZE_IN_PROGRESS | CONTROLLER_RESIZE_INFEASIBLE)
    );
    same_size && marked
}

/// Agent answers that retrying cannot fix: upstream's "infeasible" final errors.
fn is_infeasible(error: &ClientError) -> bool {
    match error.code() {
        Some(
            ErrorCode::Unsupported
            | ErrorCode::Conflict
            | ErrorCode::NotFound
            | ErrorCode::InvalidPath
            | ErrorCode::InvalidBody
            | ErrorCode::UnsafePath,
        ) => true,
        // A code newer than this controller: its status tells a refusal from a passing
        // condition.
        Some(ErrorCode::Unknown) => !error.is_transient(),
        _ => false,
    }
}

fn failure_message(job: &Job, ctx: &Context, cause: &str) -> String {
    format!(
        "resize volume {:?} by resizer {:?} failed: {cause}",
        job.wanted.pv_name,
        ctx.provisioner.own()
    )
}

/// The directory and the agent holding it, from the PV's annotations.
fn locate(job: &Job, ctx: &Context) -> Result<(VolumePath, Arc<Agent>), String> {
    let path = VolumePath::parse(&job.wanted.path).map_err(|e| {
        format!(
            "annotation {}={:?} on the PV is not a valid volume path: {e}",
            ANN_PATH, job.wanted.path
        )
    })?;
    let agent = ctx.agents.get(&job.wanted.agent).ok_or_else(|| {
        format!(
            "agent {:?} that holds directory {path} is not configured ({}; known: {})",
            job.wanted.agent,
            ctx.agents.why_missing(&job.wanted.agent),
            ctx.agents.names().join(", ")
        )
    })?;
    Ok((path, agent))
}

async fn expand(pvc: &PersistentVolumeClaim, job: &Job, ctx: &Context) -> Result<Action, Error> {
    let reference = pvc.object_ref(&());
    let report_failure = |message: String| async move {
        ctx.event(
            &reference,
            EventType::Warning,
            REASON_RESIZE_FAILED,
            ACTION,
            &message,
        )
        .await;
        message
    };
    // A PV whose records are wrong: the claim's status is left alone until they are fixed.
    let (path, agent) = match locate(job, ctx) {
        Ok(found) => found,
        Err(cause) => {
            let message = report_failure(failure_message(job, ctx, &cause)).await;
            return Err(Error::Reported(message));
        }
    };

    let claims = Api::<PersistentVolumeClaim>::namespaced(
        ctx.client.clone(),
        &pvc.namespace().unwrap_or_default(),
    );
    let claim = if already_marked(pvc, job.wanted.target_bytes) {
        info!(claim = %claim_key(pvc), target = %job.wanted.target.0, "resuming expansion");
        pvc.clone()
    } else {
        patch_claim_status(&claims, pvc, mark_in_progress(pvc, &job.wanted.target)).await?
    };

    ctx.event(
        &pvc.object_ref(&()),
        EventType::Normal,
        REASON_RESIZING,
        ACTION,
        &format!("External resizer is resizing volume {}", job.wanted.pv_name),
    )
    .await;

    let rid = request_id(&job.wanted.pv_name);
    let resized = match agent
        .client()
        .resize_volume(&path, job.wanted.target_bytes, Some(&rid))
        .await
    {
        Ok(resized) => resized,
        Err(e) => {
            let cause = format!(
                "agent {} could not resize directory {path} to {} ({} bytes): {e}",
                agent.name(),
                job.wanted.target.0,
                job.wanted.target_bytes
            );
            if !is_infeasible(&e) {
                report_failure(failure_message(job, ctx, &format!("{cause}; retrying"))).await;
                return Err(Error::Agent {
                    agent: agent.name().to_owned(),
                    source: e,
                });
            }
            let patch = mark_infeasible(&claim, &format!("failed to expand pvc with {cause}"));
            let marked = patch_claim_status(&claims, &claim, patch).await;
            let hint = match marked {
                Ok(_) => "; retried when the claim changes or at the next resync",
                Err(_) => "; the claim's status could not be updated, retrying",
            };
            report_failure(failure_message(job, ctx, &format!("{cause}{hint}"))).await;
            marked?;
            // Retrying at once cannot help; a changed request or the periodic resync tries
            // again, as upstream's slow retry of infeasible claims does.
            return Ok(Action::await_change());
        }
    };

    let recorded = async {
        if !job.volume_done {
            set_volume_capacity(ctx, &job.wanted.pv_name, &job.wanted.target).await?;
        }
        patch_claim_status(&claims, &claim, mark_finished(&claim, &job.wanted.target)).await
    }
    .await;
    if let Err(e) = recorded {
        // The agent already holds the new size; the retry confirms it and records it again.
        let cause = format!(
            "the directory was resized but the new capacity could not be recorded: {e}; retrying"
        );
        report_failure(failure_message(job, ctx, &cause)).await;
        return Err(e);
    }

    info!(
        claim = %claim_key(pvc), pv = %job.wanted.pv_name, capacity = %job.wanted.target.0,
        quota_enforced = resized.quota_enforced, "volume expanded"
    );
    ctx.event(
        &pvc.object_ref(&()),
        EventType::Normal,
        REASON_RESIZE_SUCCEEDED,
        ACTION,
        &success_message(job, &resized),
    )
    .await;
    Ok(Action::await_change())
}

/// Says plainly whether the new capacity is a limit or just a number.
fn success_message(job: &Job, resized: &Volume) -> String {
    if resized.quota_enforced {
        return format!(
            "Resize volume succeeded: {} is now {}, enforced by a quota on agent {}",
            job.wanted.pv_name, job.wanted.target.0, job.wanted.agent
        );
    }
    let why = if job.wanted.quota == Some(QuotaPolicy::Off) {
        "its StorageClass sets quota: off".to_owned()
    } else {
        format!("agent {} does not enforce quotas", job.wanted.agent)
    };
    format!(
        "Resize volume succeeded: capacity of {} recorded as {} but not enforced ({why}); the volume can hold more than that until the NFS server's filesystem is full",
        job.wanted.pv_name, job.wanted.target.0
    )
}

/// Resize conditions replaced by `new`, every other condition kept in place; upstream's
/// `MergeResizeConditionsOfPVC`.
fn merge_conditions(
    pvc: &PersistentVolumeClaim,
    new: Vec<PersistentVolumeClaimCondition>,
    keep_old_resize_conditions: bool,
) -> Vec<PersistentVolumeClaimCondition> {
    let mut merged: Vec<PersistentVolumeClaimCondition> = Vec::new();
    let mut pending = new;
    let old = pvc.status.as_ref().and_then(|s| s.conditions.as_deref());
    for condition in old.unwrap_or_default() {
        if !RESIZE_CONDITIONS.contains(&condition.type_.as_str()) {
            merged.push(condition.clone());
        } else if let Some(at) = pending.iter().position(|c| c.type_ == condition.type_) {
            merged.push(pending.remove(at));
        } else if keep_old_resize_conditions {
            merged.push(condition.clone());
        }
    }
    merged.extend(pending);
    merged
}

fn condition(type_: &str, message: Option<String>) -> PersistentVolumeClaimCondition {
    PersistentVolumeClaimCondition {
        type_: type_.to_owned(),
        status: "True".to_owned(),
        last_transition_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
        message,
        ..PersistentVolumeClaimCondition::default()
    }
}

/// Patches are guarded by the resourceVersion they were computed from, as upstream's are:
/// the conditions list is sent whole, and must not overwrite a concurrent writer's.
fn guarded(pvc: &PersistentVolumeClaim, status: Value) -> Value {
    json!({
        "metadata": {"resourceVersion": pvc.resource_version()},
        "status": status,
    })
}

/// `markControllerResizeInProgress`: condition Resizing, the size being allocated, and
/// `ControllerResizeInProgress`. Earlier resize conditions (a previous attempt's error)
/// are dropped.
fn mark_in_progress(pvc: &PersistentVolumeClaim, target: &Quantity) -> Value {
    let conditions = merge_conditions(pvc, vec![condition(CONDITION_RESIZING, None)], false);
    guarded(
        pvc,
        json!({
            "conditions": conditions,
            "allocatedResources": {STORAGE: target},
            "allocatedResourceStatuses": {STORAGE: CONTROLLER_RESIZE_IN_PROGRESS},
        }),
    )
}

/// `markControllerExpansionInfeasible`: `ControllerResizeInfeasible` plus a
/// ControllerResizeError condition with the cause; the Resizing condition stays.
fn mark_infeasible(pvc: &PersistentVolumeClaim, message: &str) -> Value {
    let error = condition(CONDITION_CONTROLLER_RESIZE_ERROR, Some(message.to_owned()));
    let conditions = merge_conditions(pvc, vec![error], true);
    guarded(
        pvc,
        json!({
            "conditions": conditions,
            "allocatedResourceStatuses": {STORAGE: CONTROLLER_RESIZE_INFEASIBLE},
        }),
    )
}

/// `markOverallExpansionAsFinished`: the new capacity, no resize condition, and no
/// `storage` entry in allocatedResourceStatuses; allocatedResources stays as the record of
/// what was asked for.
fn mark_finished(pvc: &PersistentVolumeClaim, target: &Quantity) -> Value {
    let conditions = merge_conditions(pvc, Vec::new(), false);
    guarded(
        pvc,
        json!({
            "capacity": {STORAGE: target},
            "conditions": conditions,
            // A JSON merge patch removes a key given as null.
            "allocatedResourceStatuses": {STORAGE: null},
        }),
    )
}

async fn patch_claim_status(
    claims: &Api<PersistentVolumeClaim>,
    pvc: &PersistentVolumeClaim,
    patch: Value,
) -> Result<PersistentVolumeClaim, Error> {
    Ok(claims
        .patch_status(
            &pvc.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?)
}

/// `spec.capacity` of the PV, as upstream's `updatePVCapacity` (an absolute value, so a
/// repeat is harmless). The answer is decoded as the cache's slim volume: nothing of it is
/// needed.
async fn set_volume_capacity(ctx: &Context, pv_name: &str, target: &Quantity) -> Result<(), Error> {
    let patch = json!({"spec": {"capacity": {STORAGE: target}}});
    Api::<CachedVolume>::all(ctx.client.clone())
        .patch(pv_name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use crate::objects::resize_in_play;
    use k8s_openapi::api::core::v1::PersistentVolumeClaimStatus;

    fn bound(request: &str, capacity: &str) -> PersistentVolumeClaim {
        let mut pvc = crate::tests::builders::claim("nfs");
        pvc.spec.as_mut().unwrap().volume_name = Some("pvc-1".into());
        pvc.spec
            .as_mut()
            .unwrap()
            .resources
            .as_mut()
            .unwrap()
            .requests = Some(BTreeMap::from([(STORAGE.into(), Quantity(request.into()))]));
        pvc.status = Some(PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            capacity: Some(BTreeMap::from([(
                STORAGE.into(),
                Quantity(capacity.into()),
            )])),
            ..PersistentVolumeClaimStatus::default()
        });
        pvc
    }

    fn with_condition(mut pvc: PersistentVolumeClaim, type_: &str) -> PersistentVolumeClaim {
        let status = pvc.status.get_or_insert_with(Default::default);
        status
            .conditions
            .get_or_insert_with(Vec::new)
            .push(PersistentVolumeClaimCondition {
                type_: type_.into(),
                status: "True".into(),
                ..Default::default()
            });
        pvc
    }

    fn types(conditions: &[PersistentVolumeClaimCondition]) -> Vec<&str> {
        conditions.iter().map(|c| c.type_.as_str()).collect()
    }

    #[test]
    fn resize_in_play_only_for_bound_claims_asking_for_more_or_marked() {
        assert!(!resize_in_play(&bound("1Gi", "1Gi")));
        assert!(!resize_in_play(&bound("1024Mi", "1Gi")));
        assert!(resize_in_play(&bound("2Gi", "1Gi")));
        let mut unbound = bound("2Gi", "1Gi");
        unbound.spec.as_mut().unwrap().volume_name = None;
        assert!(!resize_in_play(&unbound));
        // Bound by the binder but its status not written yet: nothing to compare.
        let mut no_status = bound("2Gi", "1Gi");
        no_status.status = None;
        assert!(!resize_in_play(&no_status));
        let mut marked = bound("1Gi", "1Gi");
        marked.status.as_mut().unwrap().allocated_resource_statuses = Some(BTreeMap::from([(
            STORAGE.into(),
            CONTROLLER_RESIZE_INFEASIBLE.into(),
        )]));
        assert!(resize_in_play(&marked));
    }

    #[test]
    fn conditions_merge_like_upstream() {
        let pvc = with_condition(
            with_condition(bound("2Gi", "1Gi"), "ModifyingVolume"),
            CONDITION_CONTROLLER_RESIZE_ERROR,
        );
        // Starting over drops the old error, keeps the unrelated condition first.
        let merged = merge_conditions(&pvc, vec![condition(CONDITION_RESIZING, None)], false);
        assert_eq!(types(&merged), ["ModifyingVolume", CONDITION_RESIZING]);
        // An error keeps the Resizing condition and replaces an older error in place.
        let pvc = with_condition(pvc, CONDITION_RESIZING);
        let error = condition(CONDITION_CONTROLLER_RESIZE_ERROR, Some("new".into()));
        let merged = merge_conditions(&pvc, vec![error], true);
        assert_eq!(
            types(&merged),
            [
                "ModifyingVolume",
                CONDITION_CONTROLLER_RESIZE_ERROR,
                CONDITION_RESIZING
            ]
        );
        assert_eq!(merged[1].message.as_deref(), Some("new"));
        // Finishing drops every resize condition.
        let merged = merge_conditions(&pvc, Vec::new(), false);
        assert_eq!(types(&merged), ["ModifyingVolume"]);
    }

    #[test]
    fn already_marked_needs_the_same_size_and_a_controller_status() {
        let mut pvc = bound("2Gi", "1Gi");
        assert!(!already_marked(&pvc, 2 << 30));
        let status = pvc.status.as_mut().unwrap();
        status.allocated_resources = Some(BTreeMap::from([(
            STORAGE.into(),
            Quantity("2048Mi".into()),
        )]));
        status.allocated_resource_statuses = Some(BTreeMap::from([(
            STORAGE.into(),
            CONTROLLER_RESIZE_IN_PROGRESS.into(),
        )]));
        assert!(already_marked(&pvc, 2 << 30));
        assert!(!already_marked(&pvc, 3 << 30));
        pvc.status.as_mut().unwrap().allocated_resource_statuses = Some(BTreeMap::from([(
            STORAGE.into(),
            "NodeResizePending".into(),
        )]));
        assert!(!already_marked(&pvc, 2 << 30));
    }
}
