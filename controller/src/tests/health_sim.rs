//! Volume health through the whole controller (`controller::run`, usage and health poll on)
//! on either tier (see [`Harness`]), with `MockAgent` reporting conditions and then cut off
//! behind its relay: the claims' events and `nfsprov_volume_abnormal` as an operator sees
//! them.

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::wait::await_condition;
use nfsprov_api_types::{AbnormalReason, VolumeCondition};
use serde_json::json;

use crate::metrics::Metrics;
use crate::tests::harness::{Harness, HarnessOptions};

const WAIT: Duration = Duration::from_secs(30);

/// The health events of `claim`, oldest first, as (reason, note, occurrences).
async fn health_events(events: &Api<Event>, claim: &str) -> Vec<(String, String, i32)> {
    let mut found: Vec<Event> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(claim)
                && e.reason
                    .as_deref()
                    .is_some_and(|r| r.starts_with("VolumeCondition"))
        })
        .collect();
    found.sort_by(|a, b| a.event_time.cmp(&b.event_time));
    found
        .into_iter()
        .map(|e| {
            (
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default(),
                e.series.map_or(1, |s| s.count),
            )
        })
        .collect()
}

/// Waits, with a bound, until `claim` has `count` health events; returns them.
async fn await_health_events(
    events: &Api<Event>,
    claim: &str,
    count: usize,
) -> Vec<(String, String, i32)> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let found = health_events(events, claim).await;
        if found.len() >= count {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "claim {claim} has {found:?}, not {count} health events"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits, with a bound, until the metrics hold `line`.
async fn await_metric(metrics: &Metrics, line: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let text = metrics.encode().unwrap();
        if text.lines().any(|l| l == line) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {line:?} in\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn abnormal_line(reason: &str, count: u64) -> String {
    format!("nfsprov_volume_abnormal{{agent=\"nfs1\",reason=\"{reason}\"}} {count}")
}

/// How many volumes the mock agent was asked for so far.
fn gets(harness: &Harness) -> usize {
    harness.agents[0]
        .calls()
        .iter()
        .filter(|c| c.starts_with("GET "))
        .count()
}

/// Waits until the poll has asked for at least `more` volumes after `since`.
async fn await_polls(harness: &Harness, since: usize, more: usize) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while gets(harness) < since + more {
        assert!(tokio::time::Instant::now() < deadline, "the poll stopped");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_learn_their_volume_turned_abnormal_and_back_and_their_agent_out_of_reach() {
    let harness = Harness::start(HarnessOptions {
        usage_poll: Some((Duration::from_millis(200), Duration::from_secs(1))),
        ..HarnessOptions::default()
    })
    .await;
    let agent = &harness.agents[0];
    let client = harness.client.clone();
    let namespace = harness.namespace.as_str();
    let class_name = harness.class_name("nfs");
    let class: StorageClass = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": class_name},
        "provisioner": harness.provisioner,
        "parameters": {"pathPattern": "${.PVC.namespace}/${.PVC.name}"},
    }))
    .unwrap();
    harness.adopt("storageclass", &class_name);
    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    for name in ["data", "logs"] {
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": class_name,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }))
        .unwrap();
        claims.create(&PostParams::default(), &claim).await.unwrap();
    }
    for name in ["data", "logs"] {
        tokio::time::timeout(
            WAIT,
            await_condition(claims.clone(), name, |c: Option<&PersistentVolumeClaim>| {
                c.and_then(|c| c.status.as_ref())
                    .and_then(|s| s.phase.as_deref())
                    == Some("Bound")
            }),
        )
        .await
        .expect("claim bound in time")
        .unwrap();
    }
    let metrics = &harness.metrics;
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    // Every reason is there from the start, at zero.
    for reason in [
        "missing",
        "not_exported",
        "read_only",
        "quota_full",
        "filesystem_error",
        "agent_unreachable",
    ] {
        await_metric(metrics, &abnormal_line(reason, 0)).await;
    }

    // Abnormal, then normal again.
    let data_path = format!("{namespace}/data");
    agent.set_condition(
        &data_path,
        Some(VolumeCondition::abnormal(
            AbnormalReason::ReadOnly,
            "the filesystem is mounted read-only",
        )),
    );
    let found = await_health_events(&events, "data", 1).await;
    assert_eq!(found[0].0, "VolumeConditionAbnormal");
    assert!(
        found[0]
            .1
            .contains("is abnormal: read_only: the filesystem is mounted read-only"),
        "{found:?}"
    );
    await_metric(metrics, &abnormal_line("read_only", 1)).await;
    let since = gets(&harness);
    await_polls(&harness, since, 6).await;
    assert_eq!(
        health_events(&events, "data").await.len(),
        1,
        "an unchanged condition is not repeated"
    );
    agent.set_condition(&data_path, Some(VolumeCondition::normal()));
    let found = await_health_events(&events, "data", 2).await;
    assert_eq!(found[1].0, "VolumeConditionNormal");
    assert!(
        found[1].1.contains("normal again (was read_only)"),
        "{found:?}"
    );
    await_metric(metrics, &abnormal_line("read_only", 0)).await;
    assert!(
        health_events(&events, "logs").await.is_empty(),
        "a volume never abnormal is never reported normal"
    );

    // The agent out of reach: each claim hears of it once, then that it is back.
    agent.set_unreachable(true);
    for claim in ["data", "logs"] {
        let found = await_health_events(&events, claim, if claim == "data" { 3 } else { 1 }).await;
        let (reason, note, _) = found.last().unwrap();
        assert_eq!(reason, "VolumeConditionAbnormal");
        assert!(
            note.contains("on agent nfs1 is abnormal: agent_unreachable: the agent has answered no request for"),
            "{note}"
        );
    }
    await_metric(metrics, &abnormal_line("agent_unreachable", 2)).await;
    // Several more failing polls add nothing. Each poll probes the agent once and, with
    // no answer, asks nothing about its volumes.
    let failed_polls = |m: &Metrics| {
        m.encode()
            .unwrap()
            .lines()
            .find_map(|l| {
                l.strip_prefix(
                    "nfsprov_agent_request_errors_total{agent=\"nfs1\",operation=\"healthz\",code=\"transport\"} ",
                )
                .and_then(|n| n.parse::<u64>().ok())
            })
            .unwrap_or(0)
    };
    let gets_while_cut = gets(&harness);
    let failed_before = failed_polls(metrics);
    let deadline = tokio::time::Instant::now() + WAIT;
    while failed_polls(metrics) < failed_before + 6 {
        assert!(tokio::time::Instant::now() < deadline, "the poll stopped");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        gets(&harness),
        gets_while_cut,
        "no volume is asked for of an agent that answered no probe"
    );
    agent.set_unreachable(false);
    let data = await_health_events(&events, "data", 4).await;
    let logs = await_health_events(&events, "logs", 2).await;
    for found in [&data, &logs] {
        let (reason, note, _) = found.last().unwrap();
        assert_eq!(reason, "VolumeConditionNormal");
        assert!(
            note.contains("normal again (was agent_unreachable)"),
            "{note}"
        );
    }
    await_metric(metrics, &abnormal_line("agent_unreachable", 0)).await;
    let since = gets(&harness);
    await_polls(&harness, since, 6).await;
    let data = health_events(&events, "data").await;
    let logs = health_events(&events, "logs").await;
    assert_eq!(
        data.iter().map(|e| (e.0.as_str(), e.2)).collect::<Vec<_>>(),
        [
            ("VolumeConditionAbnormal", 1),
            ("VolumeConditionNormal", 1),
            ("VolumeConditionAbnormal", 1),
            ("VolumeConditionNormal", 1),
        ],
        "each change once: {data:?}"
    );
    assert_eq!(logs.len(), 2, "{logs:?}");
    assert!(logs.iter().all(|e| e.2 == 1), "{logs:?}");

    // An agent that drops packets instead: every request waits out the client's time
    // limit. Each poll holds one probe, never a request per volume, so its claims learn
    // it after the threshold and a poll or two, not after one time limit per volume.
    agent.set_silent(true);
    for (claim, count) in [("data", 5), ("logs", 3)] {
        let found = await_health_events(&events, claim, count).await;
        let (reason, note, _) = found.last().unwrap();
        assert_eq!(reason, "VolumeConditionAbnormal");
        assert!(
            note.contains("did not answer within the time limit"),
            "{note}"
        );
    }
    assert_eq!(
        agent.held().most(),
        1,
        "one connection at a time waited for the silent agent"
    );
    await_metric(metrics, &abnormal_line("agent_unreachable", 2)).await;
    agent.set_silent(false);
    await_metric(metrics, &abnormal_line("agent_unreachable", 0)).await;

    harness.finish().await;
}
