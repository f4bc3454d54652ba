//! The leader's orphan check, with the whole controller against the API simulator and the
//! REAL agent on a temp-dir export root. The race cases: a directory whose claim still
//! waits for its PV and a bound claim's directory are never touched, while a directory
//! whose claim is gone is archived (never deleted) and a PV whose directory was removed
//! behind the agent's back is counted by the check and reported on its claim by the usage
//! and health poll (the PV itself gets no event).

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::wait::await_condition;
use nfsprov_api_types::{CreateVolumeRequest, VolumeOwner, VolumePath};
use nfsprov_controller::config::OrphanSettings;
use nfsprov_controller::controller::RunConfig;
use nfsprov_controller::metrics::Metrics;
use nfsprov_test_harness::{Harness, HarnessOptions};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

fn class(name: &str, provisioner: &str) -> StorageClass {
    serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": provisioner,
        "reclaimPolicy": "Delete",
        "parameters": {"pathPattern": "${.PVC.namespace}/${.PVC.name}", "onDelete": "delete"},
    }))
    .unwrap()
}

fn claim(name: &str, class: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": class,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }))
    .unwrap()
}

/// Waits, with a bound, until the controller's metrics contain every line of `wanted`.
async fn metrics_show(metrics: &Metrics, wanted: &[&str]) -> String {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let text = metrics.encode().unwrap();
        if wanted.iter().all(|line| text.contains(line)) {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "metrics never showed {wanted:?}:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How many volumes the controller has asked `agent` for so far (the usage and health
/// poll asks for each bound volume at every round).
fn volume_gets_in(text: &str, agent: &str) -> u64 {
    let prefix = format!(
        "nfsprov_agent_request_duration_seconds_count{{agent=\"{agent}\",operation=\"get\"}} "
    );
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|count| count.parse().ok())
        .unwrap_or(0)
}

fn volume_gets(metrics: &Metrics, agent: &str) -> u64 {
    volume_gets_in(&metrics.encode().unwrap(), agent)
}

/// Waits, with a bound, until `ready` holds of the controller's metrics.
async fn metrics_show_with(metrics: &Metrics, ready: impl Fn(&str) -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let text = metrics.encode().unwrap();
        if ready(&text) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "metrics never got there:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_are_reported_and_archived_and_wanted_directories_are_kept() {
    let mut harness = Harness::start(HarnessOptions {
        agents: vec!["test"],
        ..HarnessOptions::default()
    })
    .await;
    let client = harness.client.clone();
    let root = harness.agents[0].root().to_owned();
    let agent_client = harness.agents[0].client();
    let metrics = harness.metrics.clone();

    let classes: Api<StorageClass> = Api::all(client.clone());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    classes
        .create(&PostParams::default(), &class("nfs", "nfsprov.dev/nfs"))
        .await
        .unwrap();
    // A class of another provisioner: its claim stays unbound, like a claim whose PV this
    // controller has not made yet.
    classes
        .create(
            &PostParams::default(),
            &class("elsewhere", "example.com/other"),
        )
        .await
        .unwrap();
    let pending = claims
        .create(&PostParams::default(), &claim("pending", "elsewhere"))
        .await
        .unwrap();
    let pending_pv = format!("pvc-{}", pending.metadata.uid.unwrap());

    // Directories as an interrupted provisioning leaves them: made by the agent, no PV.
    let make = |path: &str, owner: VolumeOwner| {
        let agent_client = agent_client.clone();
        let path = VolumePath::parse(path).unwrap();
        async move {
            agent_client
                .create_volume(
                    &path,
                    &CreateVolumeRequest {
                        capacity_bytes: 1 << 30,
                        owner,
                        ..Default::default()
                    },
                    None,
                )
                .await
                .unwrap();
        }
    };
    make(
        "default/pending",
        VolumeOwner {
            pvc_namespace: Some("default".into()),
            pvc_name: Some("pending".into()),
            pv_name: Some(pending_pv.clone()),
        },
    )
    .await;
    make(
        "default/gone",
        VolumeOwner {
            pvc_namespace: Some("default".into()),
            pvc_name: Some("gone".into()),
            pv_name: Some("pvc-00000000-0000-0000-0000-000000000000".into()),
        },
    )
    .await;

    let config = harness.run_config();
    harness.start_controller(RunConfig {
        orphan_check: Some(OrphanSettings {
            every: Duration::from_millis(200),
            grace: Duration::ZERO,
            archive: true,
            // Smaller than the three volumes listed: the check pages through, and a
            // directory missing is only known once every page was seen.
            page_size: 2,
        }),
        usage_interval: Some(Duration::from_millis(200)),
        ..config
    });

    // A bound claim of ours, then its directory removed behind the agent's back.
    claims
        .create(&PostParams::default(), &claim("kept", "nfs"))
        .await
        .unwrap();
    claims
        .create(&PostParams::default(), &claim("lost", "nfs"))
        .await
        .unwrap();
    for name in ["kept", "lost"] {
        tokio::time::timeout(
            WAIT,
            await_condition(claims.clone(), name, |c: Option<&PersistentVolumeClaim>| {
                c.and_then(|c| c.spec.as_ref())
                    .and_then(|s| s.volume_name.as_deref())
                    .is_some()
            }),
        )
        .await
        .expect("claim bound in time")
        .unwrap();
    }
    let lost_pv = claims
        .get("lost")
        .await
        .unwrap()
        .spec
        .unwrap()
        .volume_name
        .unwrap();
    std::fs::remove_dir_all(root.join("default/lost")).unwrap();

    // Both counts come from the same check, after every finding of it was handled.
    let name = harness.agents[0].connection().name;
    let archived_line =
        format!("nfsprov_orphaned_directories_archived_total{{agent=\"{name}\"}} 1");
    metrics_show(
        &metrics,
        &[
            &archived_line,
            &format!("nfsprov_missing_volume_directories{{agent=\"{name}\"}} 1"),
        ],
    )
    .await;
    let archived: Vec<_> = std::fs::read_dir(root.join(".archive/default/gone"))
        .unwrap()
        .collect();
    assert_eq!(archived.len(), 1, "the orphan is archived, not deleted");
    assert!(!root.join("default/gone").exists());
    assert!(
        root.join("default/pending").is_dir(),
        "a directory whose claim still waits for its PV is never touched"
    );
    assert!(root.join("default/kept").is_dir());
    assert!(!root.join(".archive/default/pending").exists());
    assert!(!root.join(".archive/default/kept").exists());

    // More checks change nothing: the archived orphan is gone from the count.
    let text = metrics_show(
        &metrics,
        &[&format!(
            "nfsprov_orphaned_directories{{agent=\"{name}\"}} 0"
        )],
    )
    .await;
    assert!(text.contains(&archived_line), "{text}");

    // The claim learns that its volume is missing, once, from the usage and health poll.
    let events: Api<Event> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let found = events.list(&ListParams::default()).await.unwrap();
        let abnormal: Vec<&Event> = found
            .items
            .iter()
            .filter(|e| e.reason.as_deref() == Some("VolumeConditionAbnormal"))
            .collect();
        if let Some(event) = abnormal.first() {
            let regarding = event.regarding.as_ref().unwrap();
            assert_eq!(regarding.kind.as_deref(), Some("PersistentVolumeClaim"));
            assert_eq!(regarding.namespace.as_deref(), Some("default"));
            assert_eq!(regarding.name.as_deref(), Some("lost"));
            let note = event.note.as_deref().unwrap();
            assert!(note.contains(&lost_pv), "{event:?}");
            assert!(note.contains("is abnormal: missing"), "{event:?}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no VolumeConditionAbnormal event"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // More polls and checks add no event: the condition did not change, and the orphan
    // check reports on no PV.
    metrics_show(
        &metrics,
        &[&format!(
            "nfsprov_volume_abnormal{{agent=\"{name}\",reason=\"missing\"}} 1"
        )],
    )
    .await;
    let gets_before = volume_gets(&metrics, &name);
    metrics_show_with(&metrics, |text| {
        volume_gets_in(text, &name) >= gets_before + 10
    })
    .await;
    let found = events.list(&ListParams::default()).await.unwrap();
    let reasons: Vec<&str> = found
        .items
        .iter()
        .filter_map(|e| e.reason.as_deref())
        .collect();
    assert_eq!(
        reasons
            .iter()
            .filter(|r| **r == "VolumeConditionAbnormal")
            .count(),
        1,
        "{reasons:?}"
    );
    assert!(!reasons.contains(&"VolumeDirectoryMissing"), "{reasons:?}");

    harness.finish().await;
}
