//! The whole controller (`controller::run`: watchers, caches, both kube-runtime controllers)
//! against the in-repo Kubernetes API simulator, whose PV binder plays
//! kube-controller-manager, and the REAL agent on a temp-dir export root: a claim gets a
//! directory and a bound PV; deleting the claim deletes the directory and the PV.

use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use nfsprov_test_harness::{Harness, HarnessOptions};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

fn is_bound(pvc: Option<&PersistentVolumeClaim>) -> bool {
    pvc.and_then(|c| c.status.as_ref())
        .and_then(|s| s.phase.as_deref())
        == Some("Bound")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_to_directory_and_back() {
    let harness = Harness::start(HarnessOptions {
        agents: vec!["test"],
        controller: true,
        ..HarnessOptions::default()
    })
    .await;
    let client = harness.client.clone();
    let root = harness.agents[0].root();

    let classes: Api<StorageClass> = Api::all(client.clone());
    let class: StorageClass = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": "nfs"},
        "provisioner": "nfsprov.dev/nfs",
        "reclaimPolicy": "Delete",
        "parameters": {"pathPattern": "${.PVC.namespace}/${.PVC.name}", "onDelete": "delete"},
    }))
    .unwrap();
    classes
        .create(&PostParams::default(), &class)
        .await
        .unwrap();

    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": "default"},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "nfs",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }))
    .unwrap();
    let made = claims.create(&PostParams::default(), &claim).await.unwrap();
    let uid = made.metadata.uid.clone().unwrap();

    let bound = tokio::time::timeout(
        WAIT,
        await_condition(
            claims.clone(),
            "data",
            |c: Option<&PersistentVolumeClaim>| is_bound(c),
        ),
    )
    .await
    .expect("claim bound in time")
    .unwrap()
    .unwrap();
    let pv_name = format!("pvc-{uid}");
    assert_eq!(
        bound.spec.as_ref().unwrap().volume_name.as_deref(),
        Some(pv_name.as_str())
    );
    assert!(
        harness.ready.load(Ordering::SeqCst),
        "caches synced before work was done"
    );
    let dir = root.join("default/data");
    assert!(dir.is_dir(), "{} missing", dir.display());
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let volume = volumes.get(&pv_name).await.unwrap();
    assert_eq!(
        volume.spec.as_ref().unwrap().nfs.as_ref().unwrap().path,
        format!("{}/default/data", root.display())
    );

    claims
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    let pv_uid = volume.metadata.uid.clone().unwrap();
    tokio::time::timeout(
        WAIT,
        await_condition(volumes.clone(), &pv_name, conditions::is_deleted(&pv_uid)),
    )
    .await
    .expect("PV deleted in time")
    .unwrap();
    assert!(!dir.exists(), "{} still there", dir.display());

    let metrics = harness.metrics.clone();
    harness.finish().await;
    let text = metrics.encode().unwrap();
    assert!(
        text.contains(
            "controller_persistentvolumeclaim_provision_total{class=\"nfs\",source=\"\"} 1"
        ),
        "{text}"
    );
    assert!(
        text.contains("controller_persistentvolume_delete_total{class=\"nfs\"} 1"),
        "{text}"
    );
}
