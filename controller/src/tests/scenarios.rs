//! The controller against a mocked Kubernetes API (ApiServerVerifier: every call's method,
//! URI and body asserted in order) and `MockAgent`, the in-test HTTPS fake of the agent.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use kube::runtime::controller::Action;
use nfsprov_api_types::{CreateVolumeRequest, ErrorCode, Mode, QuotaPolicy, VolumeOwner};
use serde_json::json;

use crate::agents::AgentRegistry;
use crate::objects::{self, CachedClaim, CachedVolume};
use crate::reconciler::{error_policy, reconcile};
use crate::tests::builders::*;
use crate::tests::mock_agent::*;
use crate::tests::mock_api::*;

const PVS: &str = "/api/v1/persistentvolumes?";
const DEFAULT_PATH: &str = "team-a-data-pvc-6b1c8f3e-2d4a-4e5b-9c7d-0a1b2c3d4e5f";

fn pv_uri() -> String {
    format!("/api/v1/persistentvolumes/{PV_NAME}?")
}

fn expected_pv(path: &str, on_delete: &str) -> serde_json::Value {
    expected_pv_with_quota(path, on_delete, "bestEffort")
}

fn expected_pv_with_quota(path: &str, on_delete: &str, quota: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": PV_NAME,
            "annotations": {
                "pv.kubernetes.io/provisioned-by": PROVISIONER,
                "nfsprov.dev/agent": "nfs1",
                "nfsprov.dev/path": path,
                "nfsprov.dev/on-delete": on_delete,
                "nfsprov.dev/quota": quota,
            },
            "finalizers": ["external-provisioner.volume.kubernetes.io/finalizer"],
        },
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "capacity": {"storage": "1Gi"},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": "team-a",
                "name": "data",
                "uid": CLAIM_UID,
                "resourceVersion": "100",
            },
            "nfs": {"server": "nfs1.example", "path": format!("/srv/nfs/{path}")},
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "nfs",
            "volumeMode": "Filesystem",
        }
    })
}

fn provisioning_event() -> Call {
    Call::event(
        "team-a",
        "Normal",
        "Provisioning",
        "data",
        "provisioning volume for claim \"team-a/data\"",
    )
}

fn failed_event(note: &str) -> Call {
    Call::event("team-a", "Warning", "ProvisioningFailed", "data", note)
}

fn succeeded_event() -> Call {
    Call::event("team-a", "Normal", "ProvisioningSucceeded", "data", PV_NAME)
}

fn create_pv(path: &str, on_delete: &str) -> Call {
    Call::new(
        Method::POST,
        PVS,
        BodyCheck::Exact(expected_pv(path, on_delete)),
    )
    .status(201)
}

fn owner() -> VolumeOwner {
    VolumeOwner {
        pvc_namespace: Some("team-a".into()),
        pvc_name: Some("data".into()),
        pv_name: Some(PV_NAME.into()),
    }
}

#[tokio::test]
async fn an_additional_provisioner_name_is_served_and_the_pv_records_our_own() {
    const REPLACED: &str = "k8s-sigs.io/nfs-subdir-external-provisioner";
    let agent = MockAgent::start("nfs1").await;
    let mut replaced_class = class("nfs", &[]);
    replaced_class.provisioner = REPLACED.into();
    let mut pvc = claim("nfs");
    pvc.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(objects::ANN_STORAGE_PROVISIONER.into(), REPLACED.into());
    let pvc = Arc::new(CachedClaim::from(pvc));

    // Without the additional name the claim is not ours: no call at all.
    let (ctx, api) = context(agent.registry(), vec![replaced_class.clone()], vec![]);
    let server = api.run(vec![]);
    reconcile::<CachedClaim>(pvc.clone(), ctx.clone())
        .await
        .unwrap();
    finish(ctx, server).await;
    assert!(agent.calls().is_empty());

    let (ctx, api, _) = context_with_provisioners(
        objects::Provisioners::new(PROVISIONER, [REPLACED.to_owned()]),
        agent.registry(),
        vec![replaced_class],
        vec![],
    );
    let server = api.run(vec![
        provisioning_event(),
        create_pv(DEFAULT_PATH, "archive"),
        succeeded_event(),
    ]);
    reconcile::<CachedClaim>(pvc, ctx.clone()).await.unwrap();
    finish(ctx, server).await;
    assert_eq!(
        agent.calls(),
        ["GET info".to_owned(), format!("PUT {DEFAULT_PATH}")]
    );
}

#[tokio::test]
async fn a_claim_whose_agent_has_no_free_slot_steps_aside_without_failing() {
    let agent = MockAgent::start("nfs1").await;
    let registry = AgentRegistry::with_max_in_flight(
        std::slice::from_ref(&agent.config),
        std::sync::Arc::new(crate::metrics::Metrics::new()),
        1,
    )
    .unwrap();
    let held = registry
        .get("nfs1")
        .unwrap()
        .try_slot()
        .expect("a free slot");
    let (ctx, api) = context(registry, vec![class("nfs", &[])], vec![]);
    // Busy: the attempt is announced once, however often it steps aside; no agent call,
    // no failure count; a retry soon.
    let server = api.run(vec![provisioning_event()]);
    let pvc = Arc::new(CachedClaim::from(claim("nfs")));
    for _ in 0..2 {
        let action = reconcile::<CachedClaim>(pvc.clone(), ctx.clone())
            .await
            .unwrap();
        assert_eq!(action, Action::requeue(crate::agents::BUSY_RETRY));
    }
    assert!(agent.calls().is_empty(), "{:?}", agent.calls());
    assert!(
        !ctx.metrics
            .encode()
            .unwrap()
            .contains("controller_persistentvolumeclaim_provision_failed_total")
    );
    finish(ctx, server).await;

    // The slot freed, the same claim goes through.
    drop(held);
    let (ctx, api) = context(
        AgentRegistry::with_max_in_flight(
            std::slice::from_ref(&agent.config),
            std::sync::Arc::new(crate::metrics::Metrics::new()),
            1,
        )
        .unwrap(),
        vec![class("nfs", &[])],
        vec![],
    );
    let server = api.run(vec![
        provisioning_event(),
        create_pv(DEFAULT_PATH, "archive"),
        succeeded_event(),
    ]);
    assert_eq!(
        reconcile::<CachedClaim>(pvc, ctx.clone()).await.unwrap(),
        Action::await_change()
    );
    finish(ctx, server).await;
}

#[tokio::test]
async fn happy_path_creates_directory_then_the_exact_pv() {
    let agent = MockAgent::start("nfs1").await;
    let (ctx, api) = context(agent.registry(), vec![class("nfs", &[])], vec![]);
    let server = api.run(vec![
        provisioning_event(),
        create_pv(DEFAULT_PATH, "archive"),
        succeeded_event(),
    ]);
    let action = reconcile::<CachedClaim>(Arc::new(claim("nfs").into()), ctx.clone())
        .await
        .unwrap();
    assert_eq!(action, Action::await_change());
    let metrics = ctx.metrics.encode().unwrap();
    finish(ctx, server).await;
    assert_eq!(
        agent.calls(),
        ["GET info".to_owned(), format!("PUT {DEFAULT_PATH}")]
    );
    assert_eq!(
        agent.volume(DEFAULT_PATH),
        Some(CreateVolumeRequest {
            mode: Mode::DEFAULT,
            uid: None,
            gid: None,
            capacity_bytes: 1 << 30,
            owner: owner(),
            quota: QuotaPolicy::BestEffort,
            export: None,
        })
    );
    assert!(
        metrics.contains(
            "controller_persistentvolumeclaim_provision_total{class=\"nfs\",source=\"\"} 1"
        )
    );
}

#[tokio::test]
async fn parameters_reach_the_agent_and_the_pv() {
    let agent = MockAgent::start("nfs1").await;
    let params = [
        ("agent", "nfs1"),
        (
            "pathPattern",
            "${.PVC.namespace}/${.PVC.labels.app}-${.PVC.name}",
        ),
        ("onDelete", "delete"),
        ("mode", "0750"),
        ("uid", "1001"),
        ("gid", "2002"),
    ];
    let (ctx, api) = context(agent.registry(), vec![class("nfs", &params)], vec![]);
    let mut pvc = claim("nfs");
    pvc.metadata.labels = Some(BTreeMap::from([("app".into(), "db".into())]));
    let server = api.run(vec![
        provisioning_event(),
        create_pv("team-a/db-data", "delete"),
        succeeded_event(),
    ]);
    reconcile::<CachedClaim>(Arc::new(pvc.into()), ctx.clone())
        .await
        .unwrap();
    finish(ctx, server).await;
    let request = agent.volume("team-a/db-data").expect("volume");
    assert_eq!(request.mode.bits(), 0o750);
    assert_eq!((request.uid, request.gid), (Some(1001), Some(2002)));
}

/// Runs one claim that must be refused: exactly one ProvisioningFailed event and one failure
/// in the metrics, no agent call, and no retry until the claim or class changes (a second
/// reconcile of the same claim, as a resync makes, reports nothing again).
async fn assert_refused(
    pvc: k8s_openapi::api::core::v1::PersistentVolumeClaim,
    params: &[(&str, &str)],
    note: &str,
) {
    // The library labels failures with the kind of the claim's data source.
    let source = pvc
        .spec
        .as_ref()
        .and_then(|s| s.data_source.as_ref())
        .map_or(String::new(), |d| d.kind.clone());
    let agent = MockAgent::start("nfs1").await;
    let (ctx, api) = context(agent.registry(), vec![class("nfs", params)], vec![]);
    // Provisioning first, as the library publishes it before calling Provision; the
    // second attempt on the same claim and class says nothing again.
    let server = api.run(vec![provisioning_event(), failed_event(note)]);
    let pvc = Arc::new(CachedClaim::from(pvc));
    for _ in 0..2 {
        let result = reconcile::<CachedClaim>(pvc.clone(), ctx.clone()).await;
        assert_eq!(result.unwrap(), Action::await_change(), "{note}");
    }
    let metrics = ctx.metrics.encode().unwrap();
    assert!(
        metrics.contains(&format!(
            "controller_persistentvolumeclaim_provision_failed_total{{class=\"nfs\",source=\"{source}\"}} 1"
        )),
        "{note}: {metrics}"
    );
    finish(ctx, server).await;
    assert!(
        agent.calls().is_empty(),
        "{note}: agent was called: {:?}",
        agent.calls()
    );
}

#[tokio::test]
async fn claim_selector_is_refused() {
    let mut pvc = claim("nfs");
    pvc.spec.as_mut().unwrap().selector = Some(Default::default());
    assert_refused(pvc, &[], "claim Selector is not supported").await;
}

#[tokio::test]
async fn block_volume_mode_is_refused() {
    let mut pvc = claim("nfs");
    pvc.spec.as_mut().unwrap().volume_mode = Some("Block".into());
    assert_refused(pvc, &[], "volumeMode Block is not supported").await;
}

#[tokio::test]
async fn a_snapshot_data_source_is_refused() {
    let mut pvc = claim("nfs");
    pvc.spec.as_mut().unwrap().data_source =
        Some(k8s_openapi::api::core::v1::TypedLocalObjectReference {
            kind: "VolumeSnapshot".into(),
            name: "nightly".into(),
            api_group: Some("snapshot.storage.k8s.io".into()),
        });
    assert_refused(
        pvc,
        &[],
        "dataSource of kind VolumeSnapshot (API group snapshot.storage.k8s.io) is not supported",
    )
    .await;
}

#[tokio::test]
async fn unknown_parameter_is_refused() {
    assert_refused(
        claim("nfs"),
        &[("archiveOnDelet", "true")],
        "unknown StorageClass parameter \"archiveOnDelet\"",
    )
    .await;
}

#[tokio::test]
async fn hostile_path_pattern_result_is_refused() {
    let mut pvc = claim("nfs");
    pvc.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("example.com/dir".into(), "..".into());
    assert_refused(
        pvc,
        &[("pathPattern", "${.PVC.annotations.example.com/dir}")],
        "is not a valid volume path",
    )
    .await;
    let mut pvc = claim("nfs");
    pvc.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("example.com/dir".into(), "../../etc".into());
    assert_refused(
        pvc,
        &[("pathPattern", "vols/${.PVC.annotations.example.com/dir}")],
        "contains '/'",
    )
    .await;
}

#[tokio::test]
async fn wait_for_first_consumer_waits_for_the_selected_node() {
    let agent = MockAgent::start("nfs1").await;
    let mut wffc = class("nfs", &[]);
    wffc.volume_binding_mode = Some("WaitForFirstConsumer".into());

    // Before the scheduler picked a node: no call at all.
    let (ctx, api) = context(agent.registry(), vec![wffc.clone()], vec![]);
    let server = api.run(vec![]);
    let action = reconcile::<CachedClaim>(Arc::new(claim("nfs").into()), ctx.clone())
        .await
        .unwrap();
    assert_eq!(action, Action::await_change());
    finish(ctx, server).await;
    assert!(agent.calls().is_empty());

    // After: provisioned as usual.
    let mut pvc = claim("nfs");
    pvc.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(objects::ANN_SELECTED_NODE.into(), "node-1".into());
    let (ctx, api) = context(agent.registry(), vec![wffc], vec![]);
    let server = api.run(vec![
        provisioning_event(),
        create_pv(DEFAULT_PATH, "archive"),
        succeeded_event(),
    ]);
    reconcile::<CachedClaim>(Arc::new(pvc.into()), ctx.clone())
        .await
        .unwrap();
    finish(ctx, server).await;
    assert!(agent.has_volume(DEFAULT_PATH));
}

#[tokio::test]
async fn claims_that_are_not_ours_are_left_alone() {
    let agent = MockAgent::start("nfs1").await;
    let mut other_class = class("other", &[]);
    other_class.provisioner = "example.com/other".into();
    let (ctx, api) = context(
        agent.registry(),
        vec![class("nfs", &[]), other_class],
        vec![],
    );
    let server = api.run(vec![]);
    // Annotated for another provisioner.
    let mut pvc = claim("nfs");
    pvc.metadata.annotations = Some(BTreeMap::from([(
        objects::ANN_STORAGE_PROVISIONER.into(),
        "example.com/other".into(),
    )]));
    reconcile::<CachedClaim>(Arc::new(pvc.into()), ctx.clone())
        .await
        .unwrap();
    // Annotated for us but its class belongs to someone else.
    reconcile::<CachedClaim>(Arc::new(claim("other").into()), ctx.clone())
        .await
        .unwrap();
    // Already bound.
    let mut pvc = claim("nfs");
    pvc.spec.as_mut().unwrap().volume_name = Some("pv-static".into());
    reconcile::<CachedClaim>(Arc::new(pvc.into()), ctx.clone())
        .await
        .unwrap();
    // Only the legacy beta annotation: still ours (checked by provisioning it).
    finish(ctx, server).await;
    assert!(agent.calls().is_empty());

    let mut beta = claim("nfs");
    beta.metadata.annotations = Some(BTreeMap::from([(
        objects::ANN_BETA_STORAGE_PROVISIONER.into(),
        PROVISIONER.into(),
    )]));
    let (ctx, api) = context(agent.registry(), vec![class("nfs", &[])], vec![]);
    let server = api.run(vec![
        provisioning_event(),
        create_pv(DEFAULT_PATH, "archive"),
        succeeded_event(),
    ]);
    reconcile::<CachedClaim>(Arc::new(beta.into()), ctx.clone())
        .await
        .unwrap();
    finish(ctx, server).await;
}

#[tokio::test]
async fn pv_already_exists() {
    let agent = MockAgent::start("nfs1").await;
    // In the cache: nothing to do, no call anywhere.
    let existing = released_pv(Some("archive"), DEFAULT_PATH);
    let (ctx, api) = context(agent.registry(), vec![class("nfs", &[])], vec![existing]);
    let server = api.run(vec![]);
    reconcile::<CachedClaim>(Arc::new(claim("nfs").into()), ctx.clone())
        .await
        .unwrap();
    finish(ctx, server).await;
    assert!(agent.calls().is_empty());

    // Not yet in the cache (a crash after saving it): the directory is confirmed, the
    // create answers AlreadyExists, and that counts as a success, reported as one.
    agent.insert_volume(
        DEFAULT_PATH,
        CreateVolumeRequest {
            mode: Mode::DEFAULT,
            uid: None,
            gid: None,
            capacity_bytes: 1 << 30,
            owner: owner(),
            quota: QuotaPolicy::BestEffort,
            export: None,
        },
    );
    let (ctx, api) = context(agent.registry(), vec![class("nfs", &[])], vec![]);
    let server = api.run(vec![
        provisioning_event(),
        create_pv(DEFAULT_PATH, "archive").status(409),
        succeeded_event(),
    ]);
    let action = reconcile::<CachedClaim>(Arc::new(claim("nfs").into()), ctx.clone())
        .await
        .unwrap();
    assert_eq!(action, Action::await_change());
    let metrics = ctx.metrics.encode().unwrap();
    finish(ctx, server).await;
    assert!(
        metrics.contains(
            "controller_persistentvolumeclaim_provision_total{class=\"nfs\",source=\"\"} 1"
        ),
        "{metrics}"
    );
    assert!(
        !metrics.contains(
            "controller_persistentvolumeclaim_provision_failed_total{class=\"nfs\",source=\"\"} 1"
        ),
        "{metrics}"
    );
    assert_eq!(
        agent.calls(),
        ["GET info".to_owned(), format!("PUT {DEFAULT_PATH}")]
    );
}

#[tokio::test]
async fn agent_failure_reports_and_backs_off_then_succeeds() {
    let agent = MockAgent::start("nfs1").await;
    agent.fail_with(Some(ErrorCode::NotReady));
    let (ctx, api) = context(agent.registry(), vec![class("nfs", &[])], vec![]);
    let server = api.run(vec![
        provisioning_event(),
        failed_event("agent nfs1 did not report its NFS export"),
        Call::event_repeat("team-a", "Provisioning", 2),
        Call::event_repeat("team-a", "ProvisioningFailed", 2),
        Call::event_repeat("team-a", "Provisioning", 3),
        create_pv(DEFAULT_PATH, "archive"),
        succeeded_event(),
    ]);
    let pvc = Arc::new(CachedClaim::from(claim("nfs")));
    let error = reconcile::<CachedClaim>(pvc.clone(), ctx.clone())
        .await
        .unwrap_err();
    assert!(error.to_string().contains("not_ready"), "{error}");
    assert_eq!(
        error_policy::<CachedClaim>(pvc.clone(), &error, ctx.clone()),
        Action::requeue(Duration::from_secs(1))
    );
    let error = reconcile::<CachedClaim>(pvc.clone(), ctx.clone())
        .await
        .unwrap_err();
    // Per-object exponential backoff.
    assert_eq!(
        error_policy::<CachedClaim>(pvc.clone(), &error, ctx.clone()),
        Action::requeue(Duration::from_secs(2))
    );
    agent.fail_with(None);
    reconcile::<CachedClaim>(pvc.clone(), ctx.clone())
        .await
        .unwrap();
    // Success forgets the failures.
    assert_eq!(
        error_policy::<CachedClaim>(pvc, &error, ctx.clone()),
        Action::requeue(Duration::from_secs(1))
    );
    let metrics = ctx.metrics.encode().unwrap();
    finish(ctx, server).await;
    assert!(agent.has_volume(DEFAULT_PATH));
    assert!(
        metrics.contains(
            "controller_persistentvolumeclaim_provision_failed_total{class=\"nfs\",source=\"\"} 2"
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn pv_save_failure_names_the_directory_and_retry_reuses_it() {
    let agent = MockAgent::start("nfs1").await;
    let (ctx, api) = context(agent.registry(), vec![class("nfs", &[])], vec![]);
    let server = api.run(vec![
        provisioning_event(),
        create_pv(DEFAULT_PATH, "archive").status(500),
        failed_event(&format!("volume directory \"{DEFAULT_PATH}\" on agent nfs1 was created but PersistentVolume {PV_NAME} could not be saved")),
        Call::event_repeat("team-a", "Provisioning", 2),
        create_pv(DEFAULT_PATH, "archive"),
        succeeded_event(),
    ]);
    let pvc = Arc::new(CachedClaim::from(claim("nfs")));
    assert!(
        reconcile::<CachedClaim>(pvc.clone(), ctx.clone())
            .await
            .is_err()
    );
    assert!(agent.has_volume(DEFAULT_PATH));
    reconcile::<CachedClaim>(pvc, ctx.clone()).await.unwrap();
    finish(ctx, server).await;
    // One directory, created once then confirmed; the export is asked once (cached).
    assert_eq!(
        agent.calls(),
        [
            "GET info".to_owned(),
            format!("PUT {DEFAULT_PATH}"),
            format!("PUT {DEFAULT_PATH}")
        ]
    );
}

#[tokio::test]
async fn agent_conflict_is_reported() {
    let agent = MockAgent::start("nfs1").await;
    agent.insert_volume(
        DEFAULT_PATH,
        CreateVolumeRequest {
            capacity_bytes: 5,
            ..CreateVolumeRequest::default()
        },
    );
    let (ctx, api) = context(agent.registry(), vec![class("nfs", &[])], vec![]);
    let server = api.run(vec![
        provisioning_event(),
        failed_event("could not create directory"),
    ]);
    let error = reconcile::<CachedClaim>(Arc::new(claim("nfs").into()), ctx.clone())
        .await
        .unwrap_err();
    assert!(error.to_string().contains("conflict"), "{error}");
    finish(ctx, server).await;
}

// ------------------------------------------------------------------- quota

/// Provisions the default claim with a class whose `quota` parameter is `quota`, expecting
/// the PV to record it.
async fn provision_with_quota(agent: &MockAgent, quota: &str) {
    let (ctx, api) = context(
        agent.registry(),
        vec![class("nfs", &[("quota", quota)])],
        vec![],
    );
    let server = api.run(vec![
        provisioning_event(),
        Call::new(
            Method::POST,
            PVS,
            BodyCheck::Exact(expected_pv_with_quota(DEFAULT_PATH, "archive", quota)),
        )
        .status(201),
        succeeded_event(),
    ]);
    reconcile::<CachedClaim>(Arc::new(claim("nfs").into()), ctx.clone())
        .await
        .unwrap();
    finish(ctx, server).await;
}

#[tokio::test]
async fn quota_parameter_reaches_the_agent_and_is_recorded_on_the_pv() {
    // off: the agent records the capacity and is told not to enforce it.
    let agent = MockAgent::start("nfs1").await;
    provision_with_quota(&agent, "off").await;
    assert_eq!(agent.volume(DEFAULT_PATH).unwrap().quota, QuotaPolicy::Off);

    // enforce, on an agent that enforces: the same two agent calls as ever.
    let agent = MockAgent::start("nfs1").await;
    agent.enforce_quotas(true);
    provision_with_quota(&agent, "enforce").await;
    assert_eq!(
        agent.calls(),
        ["GET info".to_owned(), format!("PUT {DEFAULT_PATH}")]
    );
    assert_eq!(
        agent.volume(DEFAULT_PATH).unwrap().quota,
        QuotaPolicy::Enforce
    );
}

#[tokio::test]
async fn unknown_quota_value_is_refused() {
    assert_refused(
        claim("nfs"),
        &[("quota", "hard")],
        "StorageClass parameter quota=\"hard\" is invalid: expected one of enforce, bestEffort, off",
    )
    .await;
}

#[tokio::test]
async fn enforce_on_an_agent_without_quotas_fails_before_any_directory() {
    let agent = MockAgent::start("nfs1").await;
    let (ctx, api) = context(
        agent.registry(),
        vec![class("nfs", &[("quota", "enforce")])],
        vec![],
    );
    let server = api.run(vec![
        provisioning_event(),
        failed_event(
            "asks for quota enforce, but agent nfs1 cannot enforce quotas (it has no quota backend); no directory was created",
        ),
    ]);
    let result = reconcile::<CachedClaim>(Arc::new(claim("nfs").into()), ctx.clone()).await;
    assert!(result.is_err(), "{result:?}");
    finish(ctx, server).await;
    assert_eq!(agent.calls(), ["GET info"]);
    assert!(!agent.has_volume(DEFAULT_PATH));
}

#[tokio::test]
async fn enforce_refused_by_the_agent_is_reported_the_same_way() {
    // /v1/info says quotas are enforced, but the create itself is refused (as when the
    // export root's filesystem lost its quota support since the answer was cached).
    let agent = MockAgent::start("nfs1").await;
    agent.enforce_quotas(true);
    agent.fail_calls(Some(("PUT", ErrorCode::Unsupported)));
    let (ctx, api) = context(
        agent.registry(),
        vec![class("nfs", &[("quota", "enforce")])],
        vec![],
    );
    let server = api.run(vec![
        provisioning_event(),
        failed_event("but agent nfs1 cannot enforce quotas (it refused: agent answered 422"),
    ]);
    let result = reconcile::<CachedClaim>(Arc::new(claim("nfs").into()), ctx.clone()).await;
    assert!(result.is_err(), "{result:?}");
    finish(ctx, server).await;
    assert_eq!(
        agent.calls(),
        ["GET info".to_owned(), format!("PUT {DEFAULT_PATH}")]
    );
    assert!(!agent.has_volume(DEFAULT_PATH));
}

#[tokio::test]
async fn a_create_past_the_agents_overcommit_limit_is_reported_on_the_claim_and_retried() {
    let agent = MockAgent::start("nfs1").await;
    agent.fail_calls(Some(("PUT", ErrorCode::OvercommitLimit)));
    let (ctx, api) = context(agent.registry(), vec![class("nfs", &[])], vec![]);
    let server = api.run(vec![
        provisioning_event(),
        // A failure that is retried, not a refusal for good.
        Call::new(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/team-a/events?",
            BodyCheck::Subset(json!({
                "reason": "ProvisioningFailed",
                "type": "Warning",
                "action": "Provision",
                "regarding": {"name": "data"},
                "note": {"$contains": "agent answered 507: overcommit_limit: injected failure; retried until the agent has room again"},
            })),
        )
        .status(201),
    ]);
    let result = reconcile::<CachedClaim>(Arc::new(claim("nfs").into()), ctx.clone()).await;
    assert!(result.is_err(), "retried with backoff: {result:?}");
    finish(ctx, server).await;
    assert_eq!(
        agent.calls(),
        ["GET info".to_owned(), format!("PUT {DEFAULT_PATH}")]
    );
    assert!(!agent.has_volume(DEFAULT_PATH));
}

// ------------------------------------------------------------------- deletion

/// The fresh read deletion makes before acting, answered with `volume`.
fn get_pv(volume: &k8s_openapi::api::core::v1::PersistentVolume) -> Call {
    Call::new(
        Method::GET,
        &format!("/api/v1/persistentvolumes/{PV_NAME}"),
        BodyCheck::Exact(serde_json::Value::Null),
    )
    .respond(serde_json::to_value(volume).unwrap())
}

fn remove_finalizer() -> Call {
    Call::new(
        Method::PATCH,
        &pv_uri(),
        BodyCheck::Exact(json!({
            "metadata": {"finalizers": ["kubernetes.io/pv-protection"], "resourceVersion": "200"}
        })),
    )
}

fn delete_pv() -> Call {
    Call::new(
        Method::DELETE,
        &pv_uri(),
        BodyCheck::Subset(json!({"preconditions": {"uid": "pv-uid-1"}})),
    )
    .respond(json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200}))
}

fn stored(path: &str, agent: &MockAgent) {
    agent.insert_volume(
        path,
        CreateVolumeRequest {
            capacity_bytes: 1 << 30,
            owner: owner(),
            ..CreateVolumeRequest::default()
        },
    );
}

#[tokio::test]
async fn on_delete_delete_removes_the_directory_then_the_pv() {
    let agent = MockAgent::start("nfs1").await;
    stored("team-a/data", &agent);
    let (ctx, api) = context(agent.registry(), vec![class("nfs", &[])], vec![]);
    let server = api.run(vec![
        get_pv(&released_pv(Some("delete"), "team-a/data")),
        remove_finalizer(),
        delete_pv(),
    ]);
    reconcile::<CachedVolume>(
        Arc::new(cached(released_pv(Some("delete"), "team-a/data"))),
        ctx.clone(),
    )
    .await
    .unwrap();
    let metrics = ctx.metrics.encode().unwrap();
    finish(ctx, server).await;
    assert_eq!(agent.calls(), ["DELETE team-a/data"]);
    assert!(!agent.has_volume("team-a/data"));
    assert!(metrics.contains("controller_persistentvolume_delete_total{class=\"nfs\"} 1"));
}

#[tokio::test]
async fn on_delete_archive_archives_then_deletes_the_pv() {
    let agent = MockAgent::start("nfs1").await;
    stored("team-a/data", &agent);
    let (ctx, api) = context(agent.registry(), vec![class("nfs", &[])], vec![]);
    let server = api.run(vec![
        get_pv(&released_pv(Some("archive"), "team-a/data")),
        remove_finalizer(),
        delete_pv(),
    ]);
    reconcile::<CachedVolume>(
        Arc::new(cached(released_pv(Some("archive"), "team-a/data"))),
        ctx.clone(),
    )
    .await
    .unwrap();
    finish(ctx, server).await;
    assert_eq!(agent.calls(), ["POST archive team-a/data"]);
    assert!(agent.archived("team-a/data").is_some());
    assert!(!agent.has_volume("team-a/data"));
}

#[tokio::test]
async fn the_recorded_archive_retention_goes_with_the_archive_request() {
    let agent = MockAgent::start("nfs1").await;
    stored("team-a/data", &agent);
    stored("team-a/other", &agent);
    let (ctx, api) = context(agent.registry(), vec![class("nfs", &[])], vec![]);
    let with_retention = |path: &str, days: &str| {
        let mut pv = released_pv(Some("archive"), path);
        pv.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(objects::ANN_ARCHIVE_RETENTION_DAYS.into(), days.into());
        pv
    };
    let server = api.run(vec![
        get_pv(&with_retention("team-a/data", "30")),
        remove_finalizer(),
        delete_pv(),
        get_pv(&with_retention("team-a/other", "soon")),
        Call::event(
            "default",
            "Warning",
            "VolumeFailedDelete",
            PV_NAME,
            "nfsprov.dev/archive-retention-days=\"soon\" is not a whole number of days",
        ),
    ]);
    reconcile::<CachedVolume>(
        Arc::new(cached(with_retention("team-a/data", "30"))),
        ctx.clone(),
    )
    .await
    .unwrap();
    // An unreadable retention stops the deletion: the data stays where it is.
    let result = reconcile::<CachedVolume>(
        Arc::new(cached(with_retention("team-a/other", "soon"))),
        ctx.clone(),
    )
    .await;
    assert!(result.is_err(), "{result:?}");
    finish(ctx, server).await;
    assert_eq!(agent.archive_retention("team-a/data"), Some(Some(30)));
    assert!(agent.archived("team-a/data").is_some());
    assert!(agent.has_volume("team-a/other"));
    assert_eq!(agent.calls(), ["POST archive team-a/data"]);
}

/// A PV the replaced provisioner made is left to it until adopted: released with Delete,
/// with or without a finalizer, it gets no finalizer, no deletion and no event; once it
/// carries this project's agent and path it is handled like any of ours.
#[tokio::test]
async fn volumes_of_an_additional_provisioner_wait_for_adoption() {
    const REPLACED: &str = "k8s-sigs.io/nfs-subdir-external-provisioner";
    let agent = MockAgent::start("nfs1").await;
    stored("team-a/data", &agent);
    let provisioners = || objects::Provisioners::new(PROVISIONER, [REPLACED.to_owned()]);
    let mut theirs = released_pv(Some("delete"), "team-a/data");
    let annotations = theirs.metadata.annotations.as_mut().unwrap();
    annotations.clear();
    annotations.insert(objects::ANN_PROVISIONED_BY.into(), REPLACED.into());
    for finalizers in [vec![], vec!["kubernetes.io/pv-protection".to_owned()]] {
        theirs.metadata.finalizers = Some(finalizers);
        let (ctx, api, _) =
            context_with_provisioners(provisioners(), agent.registry(), vec![], vec![]);
        let server = api.run(vec![]);
        // As the watch caches it.
        let mut volume = cached(theirs.clone());
        crate::cache::slim_volume(&mut volume, &provisioners());
        reconcile::<CachedVolume>(Arc::new(volume), ctx.clone())
            .await
            .unwrap();
        finish(ctx, server).await;
    }
    assert!(agent.calls().is_empty());

    // Adopted under the old name (annotations of this project): ours, so deleted.
    let mut adopted = released_pv(Some("delete"), "team-a/data");
    adopted
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(objects::ANN_PROVISIONED_BY.into(), REPLACED.into());
    let (ctx, api, _) = context_with_provisioners(provisioners(), agent.registry(), vec![], vec![]);
    let server = api.run(vec![get_pv(&adopted), remove_finalizer(), delete_pv()]);
    reconcile::<CachedVolume>(Arc::new(cached(adopted)), ctx.clone())
        .await
        .unwrap();
    finish(ctx, server).await;
    assert_eq!(agent.calls(), ["DELETE team-a/data"]);
}

#[tokio::test]
async fn on_delete_retain_keeps_the_directory_and_deletes_the_pv() {
    let agent = MockAgent::start("nfs1").await;
    stored("team-a/data", &agent);
    let (ctx, api) = context(agent.registry(), vec![class("nfs", &[])], vec![]);
    let server = api.run(vec![
        get_pv(&released_pv(Some("retain"), "team-a/data")),
        remove_finalizer(),
        delete_pv(),
    ]);
    reconcile::<CachedVolume>(
        Arc::new(cached(released_pv(Some("retain"), "team-a/data"))),
        ctx.clone(),
    )
    .await
    .unwrap();
    finish(ctx, server).await;
    assert!(agent.calls().is_empty());
    assert!(agent.has_volume("team-a/data"));
}

#[tokio::test]
async fn class_gone_and_no_recorded_policy_archives() {
    let agent = MockAgent::start("nfs1").await;
    stored("team-a/data", &agent);
    // No class in the cache, no policy annotation (a PV from before it was recorded).
    let (ctx, api) = context(agent.registry(), vec![], vec![]);
    let server = api.run(vec![
        get_pv(&released_pv(None, "team-a/data")),
        remove_finalizer(),
        delete_pv(),
    ]);
    reconcile::<CachedVolume>(
        Arc::new(cached(released_pv(None, "team-a/data"))),
        ctx.clone(),
    )
    .await
    .unwrap();
    finish(ctx, server).await;
    assert_eq!(agent.calls(), ["POST archive team-a/data"]);
}

#[tokio::test]
async fn recorded_policy_wins_over_a_changed_class() {
    let agent = MockAgent::start("nfs1").await;
    stored("team-a/data", &agent);
    let (ctx, api) = context(
        agent.registry(),
        vec![class("nfs", &[("onDelete", "delete")])],
        vec![],
    );
    let server = api.run(vec![
        get_pv(&released_pv(Some("archive"), "team-a/data")),
        remove_finalizer(),
        delete_pv(),
    ]);
    reconcile::<CachedVolume>(
        Arc::new(cached(released_pv(Some("archive"), "team-a/data"))),
        ctx.clone(),
    )
    .await
    .unwrap();
    finish(ctx, server).await;
    assert_eq!(agent.calls(), ["POST archive team-a/data"]);
}

#[tokio::test]
async fn a_release_whose_agent_has_no_free_slot_waits_without_touching_anything() {
    let agent = MockAgent::start("nfs1").await;
    stored("team-a/data", &agent);
    let registry = AgentRegistry::with_max_in_flight(
        std::slice::from_ref(&agent.config),
        std::sync::Arc::new(crate::metrics::Metrics::new()),
        1,
    )
    .unwrap();
    let _held = registry
        .get("nfs1")
        .unwrap()
        .try_slot()
        .expect("a free slot");
    let (ctx, api) = context(registry, vec![class("nfs", &[])], vec![]);
    let server = api.run(vec![get_pv(&released_pv(Some("delete"), "team-a/data"))]);
    let action = reconcile::<CachedVolume>(
        Arc::new(cached(released_pv(Some("delete"), "team-a/data"))),
        ctx.clone(),
    )
    .await
    .unwrap();
    assert_eq!(action, Action::requeue(crate::agents::BUSY_RETRY));
    finish(ctx, server).await;
    assert!(agent.calls().is_empty());
    assert!(agent.has_volume("team-a/data"));
}

#[tokio::test]
async fn delete_failure_reports_on_the_pv_and_keeps_the_finalizer() {
    let agent = MockAgent::start("nfs1").await;
    stored("team-a/data", &agent);
    agent.fail_with(Some(ErrorCode::Internal));
    let (ctx, api) = context(agent.registry(), vec![class("nfs", &[])], vec![]);
    // PVs are cluster-scoped: their events go to the default namespace.
    let server = api.run(vec![
        get_pv(&released_pv(Some("delete"), "team-a/data")),
        Call::event(
            "default",
            "Warning",
            "VolumeFailedDelete",
            PV_NAME,
            "agent nfs1 could not delete directory team-a/data",
        ),
    ]);
    let volume = Arc::new(cached(released_pv(Some("delete"), "team-a/data")));
    let error = reconcile::<CachedVolume>(volume.clone(), ctx.clone())
        .await
        .unwrap_err();
    assert_eq!(
        error_policy::<CachedVolume>(volume, &error, ctx.clone()),
        Action::requeue(Duration::from_secs(1))
    );
    finish(ctx, server).await;
    assert!(agent.has_volume("team-a/data"));
}

#[tokio::test]
async fn retain_pvs_and_other_provisioners_pvs_are_untouched() {
    let agent = MockAgent::start("nfs1").await;
    stored("team-a/data", &agent);
    let (ctx, api) = context(agent.registry(), vec![class("nfs", &[])], vec![]);
    let server = api.run(vec![]);
    // Retain, as provisioned from a Retain class (no finalizer).
    let mut retain = released_pv(Some("delete"), "team-a/data");
    retain
        .spec
        .as_mut()
        .unwrap()
        .persistent_volume_reclaim_policy = Some("Retain".into());
    retain.metadata.finalizers = Some(vec!["kubernetes.io/pv-protection".into()]);
    reconcile::<CachedVolume>(Arc::new(cached(retain)), ctx.clone())
        .await
        .unwrap();
    // Another provisioner's released Delete PV, even with our annotations and finalizer.
    let mut foreign = released_pv(Some("delete"), "team-a/data");
    foreign.metadata.annotations.as_mut().unwrap().insert(
        objects::ANN_PROVISIONED_BY.into(),
        "example.com/other".into(),
    );
    reconcile::<CachedVolume>(Arc::new(cached(foreign)), ctx.clone())
        .await
        .unwrap();
    // Ours, Released, already deleted and our finalizer gone: nothing left to do.
    let mut done = released_pv(Some("delete"), "team-a/data");
    done.metadata.finalizers = Some(vec!["kubernetes.io/pv-protection".into()]);
    done.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    reconcile::<CachedVolume>(Arc::new(cached(done)), ctx.clone())
        .await
        .unwrap();
    // Ours, Delete, but still Bound.
    let mut bound = released_pv(Some("delete"), "team-a/data");
    bound.status.as_mut().unwrap().phase = Some("Bound".into());
    reconcile::<CachedVolume>(Arc::new(cached(bound)), ctx.clone())
        .await
        .unwrap();
    finish(ctx, server).await;
    assert!(agent.calls().is_empty());
    assert!(agent.has_volume("team-a/data"));
}

#[tokio::test]
async fn switching_to_retain_only_removes_our_finalizer() {
    let agent = MockAgent::start("nfs1").await;
    stored("team-a/data", &agent);
    let (ctx, api) = context(agent.registry(), vec![class("nfs", &[])], vec![]);
    let server = api.run(vec![remove_finalizer()]);
    let mut retain = released_pv(Some("delete"), "team-a/data");
    retain
        .spec
        .as_mut()
        .unwrap()
        .persistent_volume_reclaim_policy = Some("Retain".into());
    reconcile::<CachedVolume>(Arc::new(cached(retain)), ctx.clone())
        .await
        .unwrap();
    finish(ctx, server).await;
    assert!(agent.calls().is_empty());
    assert!(agent.has_volume("team-a/data"));
}

#[tokio::test]
async fn switching_to_delete_adds_our_finalizer_first() {
    let agent = MockAgent::start("nfs1").await;
    stored("team-a/data", &agent);
    let (ctx, api) = context(agent.registry(), vec![class("nfs", &[])], vec![]);
    let server = api.run(vec![Call::new(
        Method::PATCH,
        &pv_uri(),
        BodyCheck::Exact(json!({
            "metadata": {
                "finalizers": ["kubernetes.io/pv-protection", objects::FINALIZER],
                "resourceVersion": "200",
            }
        })),
    )]);
    // Provisioned under Retain (no finalizer of ours), then switched to Delete and
    // released: the data is not touched before the finalizer holds the PV.
    let mut switched = released_pv(Some("delete"), "team-a/data");
    switched.metadata.finalizers = Some(vec!["kubernetes.io/pv-protection".into()]);
    reconcile::<CachedVolume>(Arc::new(cached(switched)), ctx.clone())
        .await
        .unwrap();
    finish(ctx, server).await;
    assert!(agent.calls().is_empty());
    assert!(agent.has_volume("team-a/data"));
}

#[tokio::test]
async fn finalizer_conflict_is_retried_not_forced() {
    let agent = MockAgent::start("nfs1").await;
    stored("team-a/data", &agent);
    let (ctx, api) = context(agent.registry(), vec![class("nfs", &[])], vec![]);
    let fresh = released_pv(Some("delete"), "team-a/data");
    let server = api.run(vec![
        get_pv(&fresh),
        remove_finalizer().status(409),
        // The retry re-deletes (idempotent) and goes through.
        get_pv(&fresh),
        remove_finalizer(),
        delete_pv(),
    ]);
    let volume = Arc::new(cached(released_pv(Some("delete"), "team-a/data")));
    assert!(
        reconcile::<CachedVolume>(volume.clone(), ctx.clone())
            .await
            .is_err()
    );
    reconcile::<CachedVolume>(volume, ctx.clone())
        .await
        .unwrap();
    finish(ctx, server).await;
    assert_eq!(agent.calls(), ["DELETE team-a/data", "DELETE team-a/data"]);
}

#[tokio::test]
async fn an_unreachable_agent_only_fails_its_own_classes() {
    let live = MockAgent::start("nfs1").await;
    let mut dead = MockAgent::start("nfs2").await;
    dead.stop().await;
    let registry = AgentRegistry::new(
        &[live.config.clone(), dead.config.clone()],
        Arc::new(crate::metrics::Metrics::new()),
    )
    .unwrap();
    let (ctx, api) = context(
        registry,
        vec![
            class("nfs", &[("agent", "nfs1")]),
            class("nfs-dead", &[("agent", "nfs2")]),
        ],
        vec![],
    );
    let mut stranded = claim("nfs-dead");
    stranded.metadata.name = Some("stranded".into());
    stranded.metadata.uid = Some("0000-dead".into());
    let server = api.run(vec![
        Call::event(
            "team-a",
            "Normal",
            "Provisioning",
            "stranded",
            "team-a/stranded",
        ),
        Call::event(
            "team-a",
            "Warning",
            "ProvisioningFailed",
            "stranded",
            "agent nfs2 did not report its NFS export: agent unreachable",
        ),
        provisioning_event(),
        create_pv(DEFAULT_PATH, "archive"),
        succeeded_event(),
    ]);
    assert!(
        reconcile::<CachedClaim>(Arc::new(stranded.into()), ctx.clone())
            .await
            .is_err()
    );
    reconcile::<CachedClaim>(Arc::new(claim("nfs").into()), ctx.clone())
        .await
        .unwrap();
    finish(ctx, server).await;
    assert!(live.has_volume(DEFAULT_PATH));
}

#[tokio::test]
async fn a_stale_cache_never_repeats_a_finished_deletion() {
    let agent = MockAgent::start("nfs1").await;
    stored("team-a/data", &agent);
    let (ctx, api) = context(agent.registry(), vec![class("nfs", &[])], vec![]);
    // The cache still shows the released PV with our finalizer, but the API already has
    // it deleted (finalizer gone, pv-protection holding it), then gone altogether.
    let mut finished = released_pv(Some("delete"), "team-a/data");
    finished.metadata.finalizers = Some(vec!["kubernetes.io/pv-protection".into()]);
    finished.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()),
    );
    let server = api.run(vec![
        get_pv(&finished),
        Call::new(
            Method::GET,
            &format!("/api/v1/persistentvolumes/{PV_NAME}"),
            BodyCheck::Exact(serde_json::Value::Null),
        )
        .status(404),
    ]);
    let stale = Arc::new(cached(released_pv(Some("delete"), "team-a/data")));
    reconcile::<CachedVolume>(stale.clone(), ctx.clone())
        .await
        .unwrap();
    reconcile::<CachedVolume>(stale, ctx.clone()).await.unwrap();
    finish(ctx, server).await;
    assert!(agent.calls().is_empty());
    assert!(agent.has_volume("team-a/data"));
}

// ------------------------------------------------------------------- clones

const SOURCE_PATH: &str = "team-a/source";

/// The claim `team-a/source` of class `class`, Bound to `pvc-source`, asking for `size`.
fn source_claim(class: &str, size: &str) -> k8s_openapi::api::core::v1::PersistentVolumeClaim {
    let mut source = bound_claim(size, size);
    source.metadata.name = Some("source".into());
    let spec = source.spec.as_mut().unwrap();
    spec.volume_name = Some("pvc-source".into());
    spec.storage_class_name = Some(class.into());
    source
}

/// The PV of [`source_claim`], made by this controller on `agent`.
fn source_pv(agent: &str) -> k8s_openapi::api::core::v1::PersistentVolume {
    let mut volume = bound_pv("1Gi", "bestEffort");
    volume.metadata.name = Some("pvc-source".into());
    let annotations = volume.metadata.annotations.as_mut().unwrap();
    annotations.insert(objects::ANN_AGENT.into(), agent.into());
    annotations.insert(objects::ANN_PATH.into(), SOURCE_PATH.into());
    volume
}

/// The claim of [`claim`] asking to be cloned from `team-a/source`.
fn clone_claim() -> k8s_openapi::api::core::v1::PersistentVolumeClaim {
    let mut pvc = claim("nfs");
    pvc.spec.as_mut().unwrap().data_source =
        Some(k8s_openapi::api::core::v1::TypedLocalObjectReference {
            kind: "PersistentVolumeClaim".into(),
            name: "source".into(),
            api_group: None,
        });
    pvc
}

/// The PV of the clone of `team-a/source` at [`DEFAULT_PATH`], made by `method`.
fn expected_clone_pv(method: &str) -> serde_json::Value {
    let mut expected = expected_pv(DEFAULT_PATH, "archive");
    let annotations = expected["metadata"]["annotations"].as_object_mut().unwrap();
    annotations.insert("nfsprov.dev/cloned-from".into(), json!("team-a/source"));
    annotations.insert("nfsprov.dev/clone-method".into(), json!(method));
    expected
}

fn cloning_event() -> Call {
    Call::event(
        "team-a",
        "Normal",
        "Provisioning",
        "data",
        "cloning claim team-a/source",
    )
}

fn get_source(source: &k8s_openapi::api::core::v1::PersistentVolumeClaim) -> Call {
    Call::new(
        Method::GET,
        "/api/v1/namespaces/team-a/persistentvolumeclaims/source",
        BodyCheck::Exact(serde_json::Value::Null),
    )
    .respond(serde_json::to_value(source).unwrap())
}

#[tokio::test]
async fn a_clone_is_polled_until_the_agent_made_it_and_its_pv_names_the_source() {
    let agent = MockAgent::start("nfs1").await;
    agent.insert_volume(
        SOURCE_PATH,
        CreateVolumeRequest {
            mode: Mode::new(0o750).unwrap(),
            uid: Some(4242),
            gid: Some(4242),
            capacity_bytes: 1 << 30,
            ..CreateVolumeRequest::default()
        },
    );
    agent.set_clone_polls(1);
    let source = source_claim("nfs", "1Gi");
    // The class's mode is not what the clone gets: the agent keeps the source's.
    let (ctx, api) = context(
        agent.registry(),
        vec![class("nfs", &[("agent", "nfs1"), ("mode", "0700")])],
        vec![source_pv("nfs1")],
    );
    let expected = expected_clone_pv("reflink");
    let server = api.run(vec![
        cloning_event(),
        get_source(&source),
        // Polled again: no second Provisioning event.
        get_source(&source),
        Call::new(Method::POST, PVS, BodyCheck::Exact(expected)).status(201),
        succeeded_event(),
    ]);
    let pvc = Arc::new(CachedClaim::from(clone_claim()));
    assert_eq!(
        reconcile::<CachedClaim>(pvc.clone(), ctx.clone())
            .await
            .unwrap(),
        Action::requeue(Duration::from_secs(3)),
        "still cloning: asked again soon, no failure"
    );
    assert_eq!(
        reconcile::<CachedClaim>(pvc, ctx.clone()).await.unwrap(),
        Action::await_change()
    );
    let metrics = ctx.metrics.encode().unwrap();
    assert!(
        metrics.contains(
            "controller_persistentvolumeclaim_provision_total{class=\"nfs\",source=\"PersistentVolumeClaim\"} 1"
        ),
        "{metrics}"
    );
    assert!(!metrics.contains("provision_failed_total{"), "{metrics}");
    finish(ctx, server).await;
    let clone_call = format!("POST clone {DEFAULT_PATH} from {SOURCE_PATH}");
    assert_eq!(
        agent.calls(),
        ["GET info".to_owned(), clone_call.clone(), clone_call]
    );
    let made = agent.volume(DEFAULT_PATH).unwrap();
    assert_eq!(
        (made.mode, made.uid),
        (Mode::new(0o750).unwrap(), Some(4242))
    );
    assert_eq!(made.owner, owner());
}

/// An agent whose clone queue is full starts nothing and says when to ask again: the
/// claim waits that long, with no failure counted or reported, then is cloned.
#[tokio::test]
async fn a_clone_refused_by_a_full_job_queue_is_asked_again_when_the_agent_says() {
    let agent = MockAgent::start("nfs1").await;
    agent.insert_volume(
        SOURCE_PATH,
        CreateVolumeRequest {
            capacity_bytes: 1 << 30,
            ..CreateVolumeRequest::default()
        },
    );
    agent.fail_calls(Some(("POST clone", ErrorCode::JobQueueFull)));
    let source = source_claim("nfs", "1Gi");
    let (ctx, api) = context(
        agent.registry(),
        vec![class("nfs", &[("agent", "nfs1")])],
        vec![source_pv("nfs1")],
    );
    let expected = expected_clone_pv("reflink");
    let server = api.run(vec![
        cloning_event(),
        get_source(&source),
        // Asked again: no failure event in between, no second Provisioning event.
        get_source(&source),
        Call::new(Method::POST, PVS, BodyCheck::Exact(expected)).status(201),
        succeeded_event(),
    ]);
    let pvc = Arc::new(CachedClaim::from(clone_claim()));
    assert_eq!(
        reconcile::<CachedClaim>(pvc.clone(), ctx.clone())
            .await
            .unwrap(),
        Action::requeue(MOCK_RETRY_AFTER),
        "refused for now: asked again after the agent's Retry-After, no failure"
    );
    agent.fail_calls(None);
    assert_eq!(
        reconcile::<CachedClaim>(pvc, ctx.clone()).await.unwrap(),
        Action::await_change()
    );
    let metrics = ctx.metrics.encode().unwrap();
    assert!(!metrics.contains("provision_failed_total{"), "{metrics}");
    finish(ctx, server).await;
    let clone_call = format!("POST clone {DEFAULT_PATH} from {SOURCE_PATH}");
    assert_eq!(
        agent.calls(),
        ["GET info".to_owned(), clone_call.clone(), clone_call]
    );
}

/// An agent a version newer than the controller answers with a clone method, a quota
/// backend and fields the controller does not know: the claim is still provisioned, and
/// its PV shows the method as `unknown`.
#[tokio::test]
async fn a_clone_by_a_method_newer_than_the_controller_is_provisioned_and_shown_as_unknown() {
    let agent = MockAgent::start("nfs1").await;
    agent.insert_volume(
        SOURCE_PATH,
        CreateVolumeRequest {
            capacity_bytes: 1 << 30,
            ..CreateVolumeRequest::default()
        },
    );
    agent.answer_as_newer();
    let source = source_claim("nfs", "1Gi");
    let (ctx, api) = context(
        agent.registry(),
        vec![class("nfs", &[("agent", "nfs1")])],
        vec![source_pv("nfs1")],
    );
    let expected = expected_clone_pv("unknown");
    let server = api.run(vec![
        cloning_event(),
        get_source(&source),
        Call::new(Method::POST, PVS, BodyCheck::Exact(expected)).status(201),
        succeeded_event(),
    ]);
    let pvc = Arc::new(CachedClaim::from(clone_claim()));
    assert_eq!(
        reconcile::<CachedClaim>(pvc, ctx.clone()).await.unwrap(),
        Action::await_change()
    );
    finish(ctx, server).await;
    assert_eq!(
        agent.calls(),
        [
            "GET info".to_owned(),
            format!("POST clone {DEFAULT_PATH} from {SOURCE_PATH}")
        ]
    );
}

#[tokio::test]
async fn a_clone_that_breaks_a_rule_is_refused_once_without_calling_the_agent() {
    let cases: [(
        k8s_openapi::api::core::v1::PersistentVolumeClaim,
        &str,
        &str,
    ); 3] = [
        (
            source_claim("other", "1Gi"),
            "nfs1",
            "is of StorageClass \"other\", this claim of \"nfs\"",
        ),
        (
            source_claim("nfs", "2Gi"),
            "nfs1",
            "less than the 2147483648 bytes of its source claim team-a/source",
        ),
        (
            source_claim("nfs", "1Gi"),
            "nfs2",
            "is on agent nfs2, but StorageClass \"nfs\" places volumes on agents nfs1",
        ),
    ];
    for (source, source_agent, note) in cases {
        let agent = MockAgent::start("nfs1").await;
        let (ctx, api) = context(
            agent.registry(),
            vec![class("nfs", &[("agent", "nfs1")])],
            vec![source_pv(source_agent)],
        );
        let server = api.run(vec![
            provisioning_event(),
            get_source(&source),
            failed_event(note),
            // The second reconcile of the same claim reads the source, reports nothing.
            get_source(&source),
        ]);
        let pvc = Arc::new(CachedClaim::from(clone_claim()));
        for _ in 0..2 {
            let result = reconcile::<CachedClaim>(pvc.clone(), ctx.clone()).await;
            assert_eq!(result.unwrap(), Action::await_change(), "{note}");
        }
        finish(ctx, server).await;
        assert!(agent.calls().is_empty(), "{note}: {:?}", agent.calls());
    }
}

#[tokio::test]
async fn a_clone_waits_with_backoff_for_a_source_that_is_not_bound_yet() {
    let agent = MockAgent::start("nfs1").await;
    let mut pending = source_claim("nfs", "1Gi");
    pending.status.as_mut().unwrap().phase = Some("Pending".into());
    pending.spec.as_mut().unwrap().volume_name = None;
    let (ctx, api) = context(
        agent.registry(),
        vec![class("nfs", &[("agent", "nfs1")])],
        vec![],
    );
    let server = api.run(vec![
        provisioning_event(),
        get_source(&pending),
        failed_event("the source claim team-a/source is Pending, not Bound"),
    ]);
    let pvc = Arc::new(CachedClaim::from(clone_claim()));
    let result = reconcile::<CachedClaim>(pvc, ctx.clone()).await;
    assert!(
        result.is_err(),
        "retried with backoff, not given up: {result:?}"
    );
    finish(ctx, server).await;
    assert!(agent.calls().is_empty());
}
