//! Which agent a new volume goes to (the default agent, `agents` by available space,
//! unreachable agents skipped), and the provisioning behaviours kept in line with
//! sig-storage-lib-external-provisioner: an existing PV is a success, an empty selected
//! node is no node, and a permanent failure is reported once per change.

use std::sync::Arc;

use http::Method;
use kube::runtime::controller::Action;
use serde_json::json;

use crate::objects::{self, CachedClaim};
use crate::reconciler::{error_policy, reconcile};
use crate::tests::builders::*;
use crate::tests::mock_agent::*;
use crate::tests::mock_api::*;

const PVS: &str = "/api/v1/persistentvolumes?";
const DEFAULT_PATH: &str = "team-a-data-pvc-6b1c8f3e-2d4a-4e5b-9c7d-0a1b2c3d4e5f";
const GIB: u64 = 1 << 30;

fn provisioning_event(claim: &str) -> Call {
    Call::event(
        "team-a",
        "Normal",
        "Provisioning",
        claim,
        &format!("provisioning volume for claim \"team-a/{claim}\""),
    )
}

fn failed_event(note: &str) -> Call {
    Call::event("team-a", "Warning", "ProvisioningFailed", "data", note)
}

fn succeeded_event(claim: &str, pv: &str) -> Call {
    Call::event("team-a", "Normal", "ProvisioningSucceeded", claim, pv)
}

/// The create of the PV of `pv_name` at `path`, which must record `agent` and mount its
/// export (the mock agent `X` exports `X.example:/srv/nfs`).
fn create_pv_on(agent: &str, pv_name: &str, path: &str) -> Call {
    Call::new(
        Method::POST,
        PVS,
        BodyCheck::Subset(json!({
            "metadata": {
                "name": pv_name,
                "annotations": {
                    "nfsprov.dev/agent": agent,
                    "nfsprov.dev/path": path,
                },
            },
            "spec": {
                "nfs": {
                    "server": format!("{agent}.example"),
                    "path": format!("/srv/nfs/{path}"),
                },
            },
        })),
    )
    .status(201)
}

/// A second claim of the same namespace, with its own uid and so its own PV and path.
fn other_claim(class: &str) -> (CachedClaim, String, String) {
    let mut pvc = claim(class);
    pvc.metadata.name = Some("logs".into());
    pvc.metadata.uid = Some("0000-logs".into());
    (
        pvc.into(),
        "pvc-0000-logs".to_owned(),
        "team-a-logs-pvc-0000-logs".to_owned(),
    )
}

#[tokio::test]
async fn a_class_without_agent_uses_the_default_agent() {
    let nfs1 = MockAgent::start("nfs1").await;
    let nfs2 = MockAgent::start("nfs2").await;
    let registry = MockAgent::registry_of(&[&nfs1, &nfs2], Some("nfs2"));
    let (ctx, api) = context(registry, vec![class("nfs", &[])], vec![]);
    let server = api.run(vec![
        provisioning_event("data"),
        create_pv_on("nfs2", PV_NAME, DEFAULT_PATH),
        succeeded_event("data", PV_NAME),
    ]);
    let action = reconcile::<CachedClaim>(Arc::new(claim("nfs").into()), ctx.clone())
        .await
        .unwrap();
    assert_eq!(action, Action::await_change());
    finish(ctx, server).await;
    assert!(nfs2.has_volume(DEFAULT_PATH));
    assert!(nfs1.calls().is_empty(), "{:?}", nfs1.calls());
}

#[tokio::test]
async fn the_default_agent_flag_wins_over_the_connection_files() {
    let nfs1 = MockAgent::start("nfs1").await;
    let nfs2 = MockAgent::start("nfs2").await;
    let mut registry = MockAgent::registry_of(&[&nfs1, &nfs2], Some("nfs2"));
    registry.set_default("nfs1").unwrap();
    let (ctx, api) = context(registry, vec![class("nfs", &[])], vec![]);
    let server = api.run(vec![
        provisioning_event("data"),
        create_pv_on("nfs1", PV_NAME, DEFAULT_PATH),
        succeeded_event("data", PV_NAME),
    ]);
    reconcile::<CachedClaim>(Arc::new(claim("nfs").into()), ctx.clone())
        .await
        .unwrap();
    finish(ctx, server).await;
    assert!(nfs1.has_volume(DEFAULT_PATH));
    assert!(nfs2.calls().is_empty(), "{:?}", nfs2.calls());
}

#[tokio::test]
async fn a_class_without_agent_and_no_default_fails_clearly_once() {
    let nfs1 = MockAgent::start("nfs1").await;
    let nfs2 = MockAgent::start("nfs2").await;
    let registry = MockAgent::registry_of(&[&nfs1, &nfs2], None);
    let (ctx, api) = context(registry, vec![class("nfs", &[])], vec![]);
    let server = api.run(vec![
        provisioning_event("data"),
        failed_event(
            "has no \"agent\" parameter and several agents are configured (nfs1, nfs2) with no default",
        ),
    ]);
    let pvc = Arc::new(CachedClaim::from(claim("nfs")));
    for _ in 0..2 {
        let action = reconcile::<CachedClaim>(pvc.clone(), ctx.clone())
            .await
            .unwrap();
        assert_eq!(action, Action::await_change());
    }
    finish(ctx, server).await;
    assert!(nfs1.calls().is_empty() && nfs2.calls().is_empty());
}

#[tokio::test]
async fn agents_places_each_volume_on_the_most_available_space() {
    let nfs1 = MockAgent::start("nfs1").await;
    let nfs2 = MockAgent::start("nfs2").await;
    nfs1.set_available_bytes(10 * GIB);
    nfs2.set_available_bytes(100 * GIB);
    let registry = MockAgent::registry_of(&[&nfs1, &nfs2], None);
    let (ctx, api) = context(
        registry,
        vec![class("nfs", &[("agents", "nfs1,nfs2")])],
        vec![],
    );
    let (logs, logs_pv, logs_path) = other_claim("nfs");
    let server = api.run(vec![
        provisioning_event("data"),
        create_pv_on("nfs2", PV_NAME, DEFAULT_PATH),
        succeeded_event("data", PV_NAME),
        provisioning_event("logs"),
        create_pv_on("nfs2", &logs_pv, &logs_path),
        succeeded_event("logs", &logs_pv),
    ]);
    reconcile::<CachedClaim>(Arc::new(claim("nfs").into()), ctx.clone())
        .await
        .unwrap();
    reconcile::<CachedClaim>(Arc::new(logs), ctx.clone())
        .await
        .unwrap();
    finish(ctx, server).await;
    // Two claims, one /v1/info per agent: the answers are cached.
    assert_eq!(
        nfs2.calls(),
        [
            "GET info".to_owned(),
            format!("PUT {DEFAULT_PATH}"),
            format!("PUT {logs_path}")
        ]
    );
    assert_eq!(nfs1.calls(), ["GET info"]);

    // The other way round: the choice follows the space, not the order of the names.
    nfs1.set_available_bytes(200 * GIB);
    let registry = MockAgent::registry_of(&[&nfs1, &nfs2], None);
    let (ctx, api) = context(
        registry,
        vec![class("nfs", &[("agents", "nfs2, nfs1")])],
        vec![],
    );
    let server = api.run(vec![
        provisioning_event("data"),
        create_pv_on("nfs1", PV_NAME, DEFAULT_PATH),
        succeeded_event("data", PV_NAME),
    ]);
    reconcile::<CachedClaim>(Arc::new(claim("nfs").into()), ctx.clone())
        .await
        .unwrap();
    finish(ctx, server).await;
    assert!(nfs1.has_volume(DEFAULT_PATH));
}

/// One class, refused with `note` in a single ProvisioningFailed event, no agent asked.
async fn assert_class_refused(parameters: &[(&str, &str)], note: &str) {
    let nfs1 = MockAgent::start("nfs1").await;
    let nfs2 = MockAgent::start("nfs2").await;
    let registry = MockAgent::registry_of(&[&nfs1, &nfs2], Some("nfs1"));
    let (ctx, api) = context(registry, vec![class("nfs", parameters)], vec![]);
    let server = api.run(vec![provisioning_event("data"), failed_event(note)]);
    let action = reconcile::<CachedClaim>(Arc::new(claim("nfs").into()), ctx.clone())
        .await
        .unwrap();
    assert_eq!(action, Action::await_change(), "{note}");
    let metrics = ctx.metrics.encode().unwrap();
    finish(ctx, server).await;
    assert!(
        metrics.contains(
            "controller_persistentvolumeclaim_provision_failed_total{class=\"nfs\",source=\"\"} 1"
        ),
        "{metrics}"
    );
    assert!(nfs1.calls().is_empty() && nfs2.calls().is_empty(), "{note}");
}

#[tokio::test]
async fn unknown_or_repeated_agents_are_refused() {
    assert_class_refused(
        &[("agents", "nfs1,nfs9")],
        "names agent \"nfs9\", which is not configured (no connection file configures it); known agents: nfs1, nfs2",
    )
    .await;
    assert_class_refused(
        &[("agents", "nfs1,nfs2,nfs1")],
        "names agent \"nfs1\" twice",
    )
    .await;
    assert_class_refused(
        &[("agent", "nfs1"), ("agents", "nfs1,nfs2")],
        "agent and agents exclude each other",
    )
    .await;
}

#[tokio::test]
async fn an_unreachable_agent_is_skipped() {
    let nfs1 = MockAgent::start("nfs1").await;
    let mut nfs2 = MockAgent::start("nfs2").await;
    nfs1.set_available_bytes(GIB);
    nfs2.stop().await;
    let registry = MockAgent::registry_of(&[&nfs1, &nfs2], None);
    let (ctx, api) = context(
        registry,
        vec![class("nfs", &[("agents", "nfs2,nfs1")])],
        vec![],
    );
    let server = api.run(vec![
        provisioning_event("data"),
        create_pv_on("nfs1", PV_NAME, DEFAULT_PATH),
        succeeded_event("data", PV_NAME),
    ]);
    reconcile::<CachedClaim>(Arc::new(claim("nfs").into()), ctx.clone())
        .await
        .unwrap();
    finish(ctx, server).await;
    assert!(nfs1.has_volume(DEFAULT_PATH));
}

#[tokio::test]
async fn no_ready_agent_is_a_retriable_failure() {
    let mut nfs1 = MockAgent::start("nfs1").await;
    let nfs2 = MockAgent::start("nfs2").await;
    nfs1.stop().await;
    nfs2.fail_with(Some(nfsprov_api_types::ErrorCode::NotReady));
    let registry = MockAgent::registry_of(&[&nfs1, &nfs2], None);
    let (ctx, api) = context(
        registry,
        vec![class("nfs", &[("agents", "nfs1,nfs2")])],
        vec![],
    );
    let server = api.run(vec![
        provisioning_event("data"),
        failed_event("none of the StorageClass's agents is ready: agent nfs1: agent unreachable"),
    ]);
    let pvc = Arc::new(CachedClaim::from(claim("nfs")));
    let error = reconcile::<CachedClaim>(pvc.clone(), ctx.clone())
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("agent nfs2: agent answered 503"),
        "{error}"
    );
    // Retried with backoff, not parked until a change.
    assert_eq!(
        error_policy::<CachedClaim>(pvc, &error, ctx.clone()),
        Action::requeue(std::time::Duration::from_secs(1))
    );
    finish(ctx, server).await;
    assert_eq!(nfs2.calls(), ["GET info"]);
}

// ------------------------------------------------------------- library parity

#[tokio::test]
async fn an_empty_selected_node_is_no_node() {
    let agent = MockAgent::start("nfs1").await;
    let mut wffc = class("nfs", &[]);
    wffc.volume_binding_mode = Some("WaitForFirstConsumer".into());
    let mut pvc = claim("nfs");
    pvc.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(objects::ANN_SELECTED_NODE.into(), String::new());
    let (ctx, api) = context(agent.registry(), vec![wffc], vec![]);
    let server = api.run(vec![]);
    let action = reconcile::<CachedClaim>(Arc::new(pvc.into()), ctx.clone())
        .await
        .unwrap();
    assert_eq!(action, Action::await_change());
    finish(ctx, server).await;
    assert!(agent.calls().is_empty(), "{:?}", agent.calls());
}

#[tokio::test]
async fn a_permanent_failure_is_reported_again_only_after_a_change() {
    let agent = MockAgent::start("nfs1").await;
    let mut broken = class("nfs", &[("mode", "0999")]);
    broken.metadata.resource_version = Some("7".into());
    let (ctx, api) = context(agent.registry(), vec![broken], vec![]);
    let server = api.run(vec![
        provisioning_event("data"),
        failed_event("StorageClass parameter mode=\"0999\" is invalid"),
        // The claim changed (say, a label) but is still refused: announced and reported
        // again, which the recorder folds into the first events' series.
        Call::event_repeat("team-a", "Provisioning", 2),
        Call::event_repeat("team-a", "ProvisioningFailed", 2),
    ]);
    let mut pvc = claim("nfs");
    let first = Arc::new(CachedClaim::from(pvc.clone()));
    // The first reconcile and a resync of the unchanged claim: one event.
    for _ in 0..2 {
        assert_eq!(
            reconcile::<CachedClaim>(first.clone(), ctx.clone())
                .await
                .unwrap(),
            Action::await_change()
        );
    }
    pvc.metadata.resource_version = Some("101".into());
    let changed = Arc::new(CachedClaim::from(pvc));
    for _ in 0..2 {
        assert_eq!(
            reconcile::<CachedClaim>(changed.clone(), ctx.clone())
                .await
                .unwrap(),
            Action::await_change()
        );
    }
    let metrics = ctx.metrics.encode().unwrap();
    assert_eq!(ctx.reported.tracked(), 1);
    finish(ctx, server).await;
    assert!(
        metrics.contains(
            "controller_persistentvolumeclaim_provision_failed_total{class=\"nfs\",source=\"\"} 2"
        ),
        "{metrics}"
    );
    assert!(agent.calls().is_empty());
}
