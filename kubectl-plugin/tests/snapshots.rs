//! `kubectl nfsprov snapshots` as kubectl runs it, against the API simulator serving the
//! `nfsprov.dev` resources by their CRD manifests.

use std::process::Command;

use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use nfsprov_test_harness::{Harness, HarnessOptions};
use serde_json::{Value, json};

async fn create(client: &kube::Client, kind: &str, plural: &str, body: Value, status: Value) {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("nfsprov.dev", "v1alpha1", kind),
        plural,
    );
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &resource);
    let made = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(body).unwrap(),
        )
        .await
        .unwrap();
    api.patch_status(
        &made.metadata.name.unwrap(),
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_and_schedules_are_listed_with_their_state() {
    let harness = Harness::start(HarnessOptions::without_binder()).await;
    let client = harness.client.clone();
    create(
        &client,
        "SnapshotSchedule",
        "snapshotschedules",
        json!({
            "apiVersion": "nfsprov.dev/v1alpha1", "kind": "SnapshotSchedule",
            "metadata": {"name": "hourly"},
            "spec": {"interval": "1h", "keep": 3},
        }),
        json!({"lastRun": "2026-01-01T10:00:00Z", "nextRun": "2026-01-01T11:00:00Z"}),
    )
    .await;
    create(
        &client,
        "Snapshot",
        "snapshots",
        json!({
            "apiVersion": "nfsprov.dev/v1alpha1", "kind": "Snapshot",
            "metadata": {"name": "hourly-data-20260101100000",
                         "labels": {"nfsprov.dev/snapshot-schedule": "hourly"}},
            "spec": {"source": {"persistentVolumeClaimName": "data"}},
        }),
        json!({"readyToUse": true, "restoreSize": "2147483648", "sizeBytes": 1073741824u64,
               "exclusiveBytes": 4096, "method": "reflink", "agent": "nfs1"}),
    )
    .await;
    let kubeconfig = harness.kubeconfig();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_kubectl-nfsprov"))
            .args(["snapshots", "-o", "json"])
            .env("KUBECONFIG", &kubeconfig)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report,
        json!({
            "snapshots": [{
                "snapshot": "default/hourly-data-20260101100000",
                "claim": "data",
                "ready": true,
                "restore_size_bytes": 2147483648u64,
                "size_bytes": 1073741824u64,
                "exclusive_bytes": 4096,
                "method": "reflink",
                "agent": "nfs1",
                "deletion_policy": "Delete",
                "schedule": "hourly",
                "deleting": false,
                "error": null,
            }],
            "schedules": [{
                "schedule": "default/hourly",
                "interval": "1h",
                "keep": 3,
                "max_age": null,
                "last_run": "2026-01-01T10:00:00Z",
                "next_run": "2026-01-01T11:00:00Z",
                "snapshots": 1,
                "error": null,
            }],
        })
    );
    harness.finish().await;
}
