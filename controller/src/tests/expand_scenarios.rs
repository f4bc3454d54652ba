//! Expansion against a mocked Kubernetes API (every call's method, URI and body asserted in
//! order) and `MockAgent`, the in-test HTTPS fake of the agent.

use std::sync::Arc;
use std::time::Duration;

use http::Method;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::controller::Action;
use nfsprov_api_types::{CreateVolumeRequest, ErrorCode, QuotaPolicy};
use serde_json::{Value, json};

use crate::expand::{CONTROLLER_RESIZE_IN_PROGRESS, CONTROLLER_RESIZE_INFEASIBLE};
use crate::objects::CachedClaim;
use crate::reconciler::{error_policy, reconcile};
use crate::tests::builders::*;
use crate::tests::mock_agent::*;
use crate::tests::mock_api::*;

const CLAIM_STATUS: &str = "/api/v1/namespaces/team-a/persistentvolumeclaims/data/status?";
const PATH: &str = "team-a/data";
const ONE_GI: u64 = 1 << 30;
const TWO_GI: u64 = 2 << 30;

fn any() -> Value {
    json!({"$any": true})
}

/// The agent holds `team-a/data` at `capacity_bytes`.
fn stored(agent: &MockAgent, capacity_bytes: u64, quota: QuotaPolicy) {
    agent.insert_volume(
        PATH,
        CreateVolumeRequest {
            capacity_bytes,
            quota,
            ..CreateVolumeRequest::default()
        },
    );
}

fn respond_with(call: Call, claim: &PersistentVolumeClaim) -> Call {
    call.respond(serde_json::to_value(claim).unwrap())
}

/// A patch of the claim's status guarded by `resource_version`, answered with `then`.
fn patch_claim_status(
    resource_version: &str,
    status: Value,
    check: fn(Value) -> BodyCheck,
    then: &PersistentVolumeClaim,
) -> Call {
    let body = json!({"metadata": {"resourceVersion": resource_version}, "status": status});
    respond_with(Call::new(Method::PATCH, CLAIM_STATUS, check(body)), then)
}

/// external-resizer's markControllerResizeInProgress, answered with `then`.
fn mark_in_progress(resource_version: &str, size: &str, then: &PersistentVolumeClaim) -> Call {
    let status = json!({
        "conditions": [{"type": "Resizing", "status": "True", "lastTransitionTime": any()}],
        "allocatedResources": {"storage": size},
        "allocatedResourceStatuses": {"storage": CONTROLLER_RESIZE_IN_PROGRESS},
    });
    patch_claim_status(resource_version, status, BodyCheck::Shape, then)
}

/// markControllerExpansionInfeasible: the Resizing condition stays, the error is added.
fn mark_infeasible(resource_version: &str, cause: &str, then: &PersistentVolumeClaim) -> Call {
    let status = json!({
        "conditions": [
            {"type": "Resizing", "status": "True"},
            {
                "type": "ControllerResizeError",
                "status": "True",
                "lastTransitionTime": any(),
                "message": {"$contains": cause},
            },
        ],
        "allocatedResourceStatuses": {"storage": CONTROLLER_RESIZE_INFEASIBLE},
    });
    patch_claim_status(resource_version, status, BodyCheck::Shape, then)
}

/// markOverallExpansionAsFinished: capacity, no resize condition, no storage status.
fn mark_finished(resource_version: &str, size: &str, then: &PersistentVolumeClaim) -> Call {
    let status = json!({
        "capacity": {"storage": size},
        "conditions": [],
        "allocatedResourceStatuses": {"storage": null},
    });
    patch_claim_status(resource_version, status, BodyCheck::Exact, then)
}

/// The fresh read of the PV that decides between expanding, resuming and refusing.
fn get_pv(volume: &k8s_openapi::api::core::v1::PersistentVolume) -> Call {
    Call::new(
        Method::GET,
        &format!("/api/v1/persistentvolumes/{PV_NAME}"),
        BodyCheck::Exact(Value::Null),
    )
    .respond(serde_json::to_value(volume).unwrap())
}

fn set_pv_capacity(size: &str) -> Call {
    Call::new(
        Method::PATCH,
        &format!("/api/v1/persistentvolumes/{PV_NAME}?"),
        BodyCheck::Exact(json!({"spec": {"capacity": {"storage": size}}})),
    )
}

fn resizing_event() -> Call {
    Call::event(
        "team-a",
        "Normal",
        "Resizing",
        "data",
        &format!("External resizer is resizing volume {PV_NAME}"),
    )
}

fn succeeded_event(note: &str) -> Call {
    Call::event("team-a", "Normal", "VolumeResizeSuccessful", "data", note)
}

fn failed_event(note: &str) -> Call {
    Call::event("team-a", "Warning", "VolumeResizeFailed", "data", note)
}

/// The claim after each step of a 1Gi to 2Gi expansion, as the API answers.
struct Steps {
    asked: PersistentVolumeClaim,
    marked: PersistentVolumeClaim,
    finished: PersistentVolumeClaim,
}

fn steps() -> Steps {
    let asked = bound_claim("2Gi", "1Gi");
    let marked = with_resize_state(
        asked.clone(),
        "301",
        "2Gi",
        Some(CONTROLLER_RESIZE_IN_PROGRESS),
        &["Resizing"],
    );
    let finished = with_resize_state(bound_claim("2Gi", "2Gi"), "302", "2Gi", None, &[]);
    Steps {
        asked,
        marked,
        finished,
    }
}

#[tokio::test]
async fn expansion_with_an_enforced_quota() {
    let agent = MockAgent::start("nfs1").await;
    agent.enforce_quotas(true);
    stored(&agent, ONE_GI, QuotaPolicy::BestEffort);
    let (ctx, api) = context(
        agent.registry(),
        vec![expandable_class("nfs", &[])],
        vec![bound_pv("1Gi", "bestEffort")],
    );
    let Steps {
        asked,
        marked,
        finished,
    } = steps();
    let server = api.run(vec![
        get_pv(&bound_pv("1Gi", "bestEffort")),
        mark_in_progress("300", "2Gi", &marked),
        resizing_event(),
        set_pv_capacity("2Gi"),
        mark_finished("301", "2Gi", &finished),
        succeeded_event(&format!(
            "Resize volume succeeded: {PV_NAME} is now 2Gi, enforced by a quota on agent nfs1"
        )),
    ]);
    let action = reconcile::<CachedClaim>(Arc::new(asked.into()), ctx.clone())
        .await
        .unwrap();
    assert_eq!(action, Action::await_change());
    finish(ctx, server).await;
    assert_eq!(agent.calls(), [format!("PATCH {PATH} {TWO_GI}")]);
    assert_eq!(agent.volume(PATH).unwrap().capacity_bytes, TWO_GI);
}

#[tokio::test]
async fn expansion_without_enforcement_says_so() {
    for (agent_enforces, quota, why) in [
        (
            false,
            QuotaPolicy::BestEffort,
            "agent nfs1 does not enforce quotas",
        ),
        (true, QuotaPolicy::Off, "its StorageClass sets quota: off"),
    ] {
        let agent = MockAgent::start("nfs1").await;
        agent.enforce_quotas(agent_enforces);
        stored(&agent, ONE_GI, quota);
        let (ctx, api) = context(
            agent.registry(),
            vec![expandable_class("nfs", &[])],
            vec![bound_pv("1Gi", quota.as_str())],
        );
        let Steps {
            asked,
            marked,
            finished,
        } = steps();
        let server = api.run(vec![
            get_pv(&bound_pv("1Gi", quota.as_str())),
            mark_in_progress("300", "2Gi", &marked),
            resizing_event(),
            set_pv_capacity("2Gi"),
            mark_finished("301", "2Gi", &finished),
            succeeded_event(&format!(
                "capacity of {PV_NAME} recorded as 2Gi but not enforced ({why})"
            )),
        ]);
        reconcile::<CachedClaim>(Arc::new(asked.into()), ctx.clone())
            .await
            .unwrap();
        finish(ctx, server).await;
        assert_eq!(agent.volume(PATH).unwrap().capacity_bytes, TWO_GI, "{why}");
    }
}

#[tokio::test]
async fn transient_agent_failure_keeps_the_claim_in_progress_and_retries() {
    let agent = MockAgent::start("nfs1").await;
    stored(&agent, ONE_GI, QuotaPolicy::BestEffort);
    agent.fail_calls(Some(("PATCH", ErrorCode::NotReady)));
    let (ctx, api) = context(
        agent.registry(),
        vec![expandable_class("nfs", &[])],
        vec![bound_pv("1Gi", "bestEffort")],
    );
    let Steps {
        asked,
        marked,
        finished,
    } = steps();
    let server = api.run(vec![
        get_pv(&bound_pv("1Gi", "bestEffort")),
        mark_in_progress("300", "2Gi", &marked),
        resizing_event(),
        failed_event(&format!(
            "resize volume \"{PV_NAME}\" by resizer \"nfsprov.dev/nfs\" failed: agent nfs1 could not resize directory {PATH} to 2Gi ({TWO_GI} bytes): agent answered 503: not_ready: injected failure; retrying"
        )),
        // The retry sees the claim as marked: no second mark, the same Resizing event again.
        get_pv(&bound_pv("1Gi", "bestEffort")),
        Call::event_repeat("team-a", "Resizing", 2),
        set_pv_capacity("2Gi"),
        mark_finished("301", "2Gi", &finished),
        succeeded_event("recorded as 2Gi but not enforced"),
    ]);
    let error = reconcile::<CachedClaim>(Arc::new(asked.into()), ctx.clone())
        .await
        .unwrap_err();
    assert!(error.to_string().contains("not_ready"), "{error}");
    let retry = Arc::new(CachedClaim::from(marked));
    assert_eq!(
        error_policy::<CachedClaim>(retry.clone(), &error, ctx.clone()),
        Action::requeue(Duration::from_secs(1))
    );
    agent.fail_calls(None);
    reconcile::<CachedClaim>(retry.clone(), ctx.clone())
        .await
        .unwrap();
    // Success forgets the failure.
    assert_eq!(
        error_policy::<CachedClaim>(retry, &error, ctx.clone()),
        Action::requeue(Duration::from_secs(1))
    );
    finish(ctx, server).await;
    assert_eq!(
        agent.calls(),
        [
            format!("PATCH {PATH} {TWO_GI}"),
            format!("PATCH {PATH} {TWO_GI}")
        ]
    );
    assert_eq!(agent.volume(PATH).unwrap().capacity_bytes, TWO_GI);
}

#[tokio::test]
async fn an_expansion_past_the_agents_overcommit_limit_is_reported_and_retried() {
    let agent = MockAgent::start("nfs1").await;
    stored(&agent, ONE_GI, QuotaPolicy::BestEffort);
    agent.fail_calls(Some(("PATCH", ErrorCode::OvercommitLimit)));
    let (ctx, api) = context(
        agent.registry(),
        vec![expandable_class("nfs", &[])],
        vec![bound_pv("1Gi", "bestEffort")],
    );
    let Steps { asked, marked, .. } = steps();
    let server = api.run(vec![
        get_pv(&bound_pv("1Gi", "bestEffort")),
        // In progress, not infeasible: the agent may have room later.
        mark_in_progress("300", "2Gi", &marked),
        resizing_event(),
        failed_event(&format!(
            "agent nfs1 could not resize directory {PATH} to 2Gi ({TWO_GI} bytes): agent answered 507: overcommit_limit: injected failure; retrying"
        )),
    ]);
    let error = reconcile::<CachedClaim>(Arc::new(asked.into()), ctx.clone())
        .await
        .unwrap_err();
    assert!(error.to_string().contains("overcommit_limit"), "{error}");
    finish(ctx, server).await;
    assert_eq!(agent.volume(PATH).unwrap().capacity_bytes, ONE_GI);
}

#[tokio::test]
async fn final_agent_failure_marks_the_claim_infeasible() {
    let agent = MockAgent::start("nfs1").await;
    stored(&agent, ONE_GI, QuotaPolicy::BestEffort);
    agent.fail_calls(Some(("PATCH", ErrorCode::Unsupported)));
    let (ctx, api) = context(
        agent.registry(),
        vec![expandable_class("nfs", &[])],
        vec![bound_pv("1Gi", "bestEffort")],
    );
    let Steps { asked, marked, .. } = steps();
    let infeasible = with_resize_state(
        asked.clone(),
        "302",
        "2Gi",
        Some(CONTROLLER_RESIZE_INFEASIBLE),
        &["Resizing", "ControllerResizeError"],
    );
    let server = api.run(vec![
        get_pv(&bound_pv("1Gi", "bestEffort")),
        mark_in_progress("300", "2Gi", &marked),
        resizing_event(),
        mark_infeasible(
            "301",
            &format!(
                "failed to expand pvc with agent nfs1 could not resize directory {PATH} to 2Gi"
            ),
            &infeasible,
        ),
        failed_event(
            "unsupported: injected failure; retried when the claim changes or at the next resync",
        ),
    ]);
    let action = reconcile::<CachedClaim>(Arc::new(asked.into()), ctx.clone())
        .await
        .unwrap();
    // Retrying at once cannot help: it waits for a change (or the periodic resync).
    assert_eq!(action, Action::await_change());
    finish(ctx, server).await;
    assert_eq!(agent.calls(), [format!("PATCH {PATH} {TWO_GI}")]);
    assert_eq!(agent.volume(PATH).unwrap().capacity_bytes, ONE_GI);
}

#[tokio::test]
async fn shrinking_below_the_volume_is_refused_without_calling_the_agent() {
    let agent = MockAgent::start("nfs1").await;
    stored(&agent, TWO_GI, QuotaPolicy::BestEffort);
    // The volume already grew to 2Gi (the claim's status never caught up), and the user
    // lowered the request to 1500Mi, which the API allows because it is above 1Gi.
    let (ctx, api) = context(
        agent.registry(),
        vec![expandable_class("nfs", &[])],
        vec![bound_pv("2Gi", "bestEffort")],
    );
    let lowered = with_resize_state(
        bound_claim("1500Mi", "1Gi"),
        "305",
        "2Gi",
        Some(CONTROLLER_RESIZE_IN_PROGRESS),
        &["Resizing"],
    );
    let server = api.run(vec![
        get_pv(&bound_pv("2Gi", "bestEffort")),
        failed_event(&format!(
            "cannot shrink volume {PV_NAME} from 2Gi to 1500Mi: NFS volumes can only grow; set the claim's storage request to at least 2Gi"
        )),
    ]);
    let action = reconcile::<CachedClaim>(Arc::new(lowered.into()), ctx.clone())
        .await
        .unwrap();
    assert_eq!(action, Action::await_change());
    finish(ctx, server).await;
    assert!(agent.calls().is_empty(), "{:?}", agent.calls());
}

#[tokio::test]
async fn a_crash_after_the_pv_was_patched_resumes_with_the_claim_status() {
    let agent = MockAgent::start("nfs1").await;
    // The agent and the PV already have 2Gi; the claim is still marked in progress.
    stored(&agent, TWO_GI, QuotaPolicy::BestEffort);
    let (ctx, api) = context(
        agent.registry(),
        vec![expandable_class("nfs", &[])],
        vec![bound_pv("2Gi", "bestEffort")],
    );
    let Steps {
        marked, finished, ..
    } = steps();
    let server = api.run(vec![
        get_pv(&bound_pv("2Gi", "bestEffort")),
        resizing_event(),
        mark_finished("301", "2Gi", &finished),
        succeeded_event("recorded as 2Gi but not enforced"),
    ]);
    reconcile::<CachedClaim>(Arc::new(marked.into()), ctx.clone())
        .await
        .unwrap();
    finish(ctx, server).await;
    // The agent is asked again (idempotent: same size, same answer).
    assert_eq!(agent.calls(), [format!("PATCH {PATH} {TWO_GI}")]);
}

#[tokio::test]
async fn a_status_conflict_is_retried_from_the_fresh_claim() {
    let agent = MockAgent::start("nfs1").await;
    stored(&agent, ONE_GI, QuotaPolicy::BestEffort);
    let (ctx, api) = context(
        agent.registry(),
        vec![expandable_class("nfs", &[])],
        vec![bound_pv("1Gi", "bestEffort")],
    );
    let Steps {
        asked,
        marked,
        finished,
    } = steps();
    // Someone else wrote the claim meanwhile: the guarded patch is refused, nothing else
    // happens; the retry starts from the claim the cache now holds.
    let mut fresh = asked.clone();
    fresh.metadata.resource_version = Some("310".into());
    let server = api.run(vec![
        get_pv(&bound_pv("1Gi", "bestEffort")),
        mark_in_progress("300", "2Gi", &marked).status(409),
        get_pv(&bound_pv("1Gi", "bestEffort")),
        mark_in_progress("310", "2Gi", &marked),
        resizing_event(),
        set_pv_capacity("2Gi"),
        mark_finished("301", "2Gi", &finished),
        succeeded_event("recorded as 2Gi"),
    ]);
    assert!(
        reconcile::<CachedClaim>(Arc::new(asked.into()), ctx.clone())
            .await
            .is_err()
    );
    assert!(agent.calls().is_empty());
    reconcile::<CachedClaim>(Arc::new(fresh.into()), ctx.clone())
        .await
        .unwrap();
    finish(ctx, server).await;
    assert_eq!(agent.calls(), [format!("PATCH {PATH} {TWO_GI}")]);
}

#[tokio::test]
async fn claims_that_cannot_or_need_not_expand_are_left_alone() {
    let agent = MockAgent::start("nfs1").await;
    stored(&agent, ONE_GI, QuotaPolicy::BestEffort);
    let asked = bound_claim("2Gi", "1Gi");
    let ours = || bound_pv("1Gi", "bestEffort");
    let expandable = || vec![expandable_class("nfs", &[])];
    let mut foreign = ours();
    foreign.metadata.annotations.as_mut().unwrap().insert(
        crate::objects::ANN_PROVISIONED_BY.into(),
        "example.com/other".into(),
    );
    let mut elsewhere = ours();
    elsewhere
        .spec
        .as_mut()
        .unwrap()
        .claim_ref
        .as_mut()
        .unwrap()
        .uid = Some("another-claim-of-that-name".into());
    let mut pending = asked.clone();
    pending.status.as_mut().unwrap().phase = Some("Pending".into());
    let gone = Call::new(
        Method::GET,
        &format!("/api/v1/persistentvolumes/{PV_NAME}"),
        BodyCheck::Exact(Value::Null),
    )
    .status(404);
    // (case, classes, cached volume, claim, the only API calls expected)
    let cases = vec![
        (
            "class does not allow expansion",
            vec![class("nfs", &[])],
            ours(),
            asked.clone(),
            vec![],
        ),
        ("class gone", vec![], ours(), asked.clone(), vec![]),
        (
            "another provisioner's PV",
            expandable(),
            foreign,
            asked.clone(),
            vec![],
        ),
        (
            "nothing asked",
            expandable(),
            ours(),
            bound_claim("1Gi", "1Gi"),
            vec![],
        ),
        ("not Bound yet", expandable(), ours(), pending, vec![]),
        (
            "PV bound to another claim",
            expandable(),
            ours(),
            asked.clone(),
            vec![get_pv(&elsewhere)],
        ),
        (
            "PV already deleted",
            expandable(),
            ours(),
            asked.clone(),
            vec![gone],
        ),
    ];
    for (case, classes, volume, claim, calls) in cases {
        let (ctx, api) = context(agent.registry(), classes, vec![volume]);
        let server = api.run(calls);
        let action = reconcile::<CachedClaim>(Arc::new(claim.into()), ctx.clone())
            .await
            .unwrap();
        assert_eq!(action, Action::await_change(), "{case}");
        finish(ctx, server).await;
        assert!(agent.calls().is_empty(), "{case}: {:?}", agent.calls());
    }
}
