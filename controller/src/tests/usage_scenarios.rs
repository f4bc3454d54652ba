//! The usage poll against `MockAgent` and a mocked Kubernetes API (which sees only the
//! `VolumeNearlyFull` events, in order).

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::runtime::watcher;
use nfsprov_api_types::{CreateVolumeRequest, ErrorCode};

use crate::tests::builders::*;
use crate::tests::mock_agent::*;
use crate::tests::mock_api::*;
use crate::usage::{UsageTracker, poll_once};

const GI: u64 = 1 << 30;

/// A second bound volume of ours, for the claim `team-a/logs`.
fn logs_pv() -> PersistentVolume {
    let mut volume = bound_pv("1Gi", "bestEffort");
    volume.metadata.name = Some("pvc-logs".into());
    volume
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(crate::objects::ANN_PATH.into(), "team-a/logs".into());
    let claim_ref = volume.spec.as_mut().unwrap().claim_ref.as_mut().unwrap();
    claim_ref.name = Some("logs".into());
    claim_ref.uid = Some("uid-logs".into());
    volume
}

fn series(metric: &str, claim: &str, value: u64) -> String {
    format!(
        "{metric}{{namespace=\"team-a\",persistentvolumeclaim=\"{claim}\",agent=\"nfs1\"}} {value}"
    )
}

fn nearly_full(note: &str) -> Call {
    Call::event("team-a", "Warning", "VolumeNearlyFull", "data", note)
}

#[tokio::test]
async fn usage_is_published_warned_about_once_per_crossing_and_dropped_with_the_claim() {
    let agent = MockAgent::start("nfs1").await;
    for path in ["team-a/data", "team-a/logs"] {
        agent.insert_volume(
            path,
            CreateVolumeRequest {
                capacity_bytes: GI,
                ..CreateVolumeRequest::default()
            },
        );
    }
    let nearly = GI * 95 / 100;
    agent.set_usage("team-a/data", nearly, 12);
    agent.set_usage("team-a/logs", GI / 10, 3);
    // Released volumes and other provisioners' volumes are not measured.
    let mut released = released_pv(Some("delete"), "team-a/old");
    released.metadata.name = Some("pvc-old".into());
    let (ctx, api, mut volumes) = context_with_volume_writer(
        agent.registry(),
        vec![],
        vec![bound_pv("1Gi", "bestEffort"), logs_pv(), released],
    );
    let server = api.run(vec![
        nearly_full(&format!(
            "volume {PV_NAME} is 95% full: 972.8 MiB of 1.0 GiB used ({nearly} of {GI} bytes, 12 inodes); the capacity is not enforced"
        )),
        nearly_full(&format!("volume {PV_NAME} is 91% full")),
        // The directory vanished: its claim learns it, once.
        Call::event(
            "team-a",
            "Warning",
            "VolumeConditionAbnormal",
            "data",
            &format!("volume {PV_NAME} on agent nfs1 is abnormal: missing: agent nfs1 has no directory for this volume"),
        ),
    ]);
    let mut tracker = UsageTracker::default();

    poll_once(&ctx, &mut tracker).await;
    let text = ctx.metrics.encode().unwrap();
    for line in [
        series("nfsprov_volume_used_bytes", "data", nearly),
        series("nfsprov_volume_capacity_bytes", "data", GI),
        series("nfsprov_volume_used_inodes", "data", 12),
        series("nfsprov_volume_used_bytes", "logs", GI / 10),
        series("nfsprov_volume_used_inodes", "logs", 3),
    ] {
        assert!(text.contains(&line), "missing {line:?} in\n{text}");
    }
    let mut calls = agent.calls();
    calls.sort();
    assert_eq!(calls, ["GET team-a/data", "GET team-a/logs"]);

    // Still above 90 %: no second warning.
    poll_once(&ctx, &mut tracker).await;

    // An unreachable agent keeps the last figures (the claims still exist).
    agent.fail_with(Some(ErrorCode::NotReady));
    poll_once(&ctx, &mut tracker).await;
    agent.fail_with(None);
    let text = ctx.metrics.encode().unwrap();
    assert!(
        text.contains(&series("nfsprov_volume_used_bytes", "logs", GI / 10)),
        "{text}"
    );

    // The logs claim is deleted, so its PV is Released and not measured: its series go.
    let mut released_logs = logs_pv();
    released_logs.status.as_mut().unwrap().phase = Some("Released".into());
    volumes.apply_watcher_event(&watcher::Event::Apply(cached(released_logs)));
    poll_once(&ctx, &mut tracker).await;
    let text = ctx.metrics.encode().unwrap();
    assert!(!text.contains("persistentvolumeclaim=\"logs\""), "{text}");
    assert!(
        text.contains(&series("nfsprov_volume_used_bytes", "data", nearly)),
        "{text}"
    );

    // Below 85 % re-arms; the next crossing warns again, with its own figures.
    agent.set_usage("team-a/data", GI * 80 / 100, 12);
    poll_once(&ctx, &mut tracker).await;
    agent.set_usage("team-a/data", GI * 91 / 100, 12);
    poll_once(&ctx, &mut tracker).await;

    // The directory vanished from the agent: no figures to show.
    agent.state.lock().unwrap().volumes.remove("team-a/data");
    poll_once(&ctx, &mut tracker).await;
    poll_once(&ctx, &mut tracker).await;
    let text = ctx.metrics.encode().unwrap();
    assert!(!text.contains("persistentvolumeclaim=\"data\""), "{text}");
    assert!(
        text.contains("nfsprov_volume_abnormal{agent=\"nfs1\",reason=\"missing\"} 1"),
        "{text}"
    );
    finish(ctx, server).await;
}

#[tokio::test]
async fn a_volume_not_measured_yet_has_only_its_capacity() {
    let agent = MockAgent::start("nfs1").await;
    agent.insert_volume(
        "team-a/data",
        CreateVolumeRequest {
            capacity_bytes: GI,
            ..CreateVolumeRequest::default()
        },
    );
    let (ctx, api) = context(
        agent.registry(),
        vec![],
        vec![bound_pv("1Gi", "bestEffort")],
    );
    let server = api.run(vec![]);
    poll_once(&ctx, &mut UsageTracker::default()).await;
    let text = ctx.metrics.encode().unwrap();
    assert!(
        text.contains(&series("nfsprov_volume_capacity_bytes", "data", GI)),
        "{text}"
    );
    assert!(!text.contains("nfsprov_volume_used_bytes{"), "{text}");
    finish(ctx, server).await;
}

fn repaired_at(found_at: &str, repaired_at: &str) -> nfsprov_api_types::VolumeCondition {
    nfsprov_api_types::VolumeCondition {
        repaired: Some(nfsprov_api_types::RepairedCondition {
            reason: nfsprov_api_types::AbnormalReason::NotExported,
            message: "the NFS server did not serve the export".into(),
            found_at: found_at.into(),
            repaired_at: repaired_at.into(),
        }),
        ..nfsprov_api_types::VolumeCondition::normal()
    }
}

#[tokio::test]
async fn a_repair_between_two_polls_is_published_as_abnormal_then_normal_and_an_old_one_never() {
    let agent = MockAgent::start("nfs1").await;
    agent.insert_volume(
        "team-a/data",
        CreateVolumeRequest {
            capacity_bytes: GI,
            ..CreateVolumeRequest::default()
        },
    );
    // Repaired before the controller's first look: not replayed.
    agent.set_condition(
        "team-a/data",
        Some(repaired_at("2026-11-01T10:00:00Z", "2026-11-01T10:00:02Z")),
    );
    let (ctx, api) = context(
        agent.registry(),
        vec![],
        vec![bound_pv("1Gi", "bestEffort")],
    );
    let server = api.run(vec![
        Call::event(
            "team-a",
            "Warning",
            "VolumeConditionAbnormal",
            "data",
            &format!("volume {PV_NAME} on agent nfs1 was abnormal: not_exported: the NFS server did not serve the export (found by the agent at 2026-11-28T10:00:00Z)"),
        ),
        Call::event(
            "team-a",
            "Normal",
            "VolumeConditionNormal",
            "data",
            &format!("volume {PV_NAME}: not_exported was repaired by the agent at 2026-11-28T10:00:03Z"),
        ),
    ]);
    let mut tracker = UsageTracker::default();
    poll_once(&ctx, &mut tracker).await;
    poll_once(&ctx, &mut tracker).await;
    // Found and repaired by the agent between two polls.
    agent.set_condition(
        "team-a/data",
        Some(repaired_at("2026-11-28T10:00:00Z", "2026-11-28T10:00:03Z")),
    );
    poll_once(&ctx, &mut tracker).await;
    poll_once(&ctx, &mut tracker).await;
    let text = ctx.metrics.encode().unwrap();
    assert!(
        text.contains("nfsprov_volume_abnormal{agent=\"nfs1\",reason=\"not_exported\"} 0"),
        "{text}"
    );
    finish(ctx, server).await;
}
