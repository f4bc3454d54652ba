//! The whole controller (`controller::run`: watchers, caches, both kube-runtime controllers)
//! against the in-repo Kubernetes API simulator, whose PV binder plays
//! kube-controller-manager, and the REAL agent on a temp-dir export root: a claim gets a
//! directory and a bound PV; deleting the claim deletes the directory and the PV.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::events::Reporter;
use kube::runtime::wait::{await_condition, conditions};
use nfsprov_agent_testkit::TestAgent;
use nfsprov_controller::agents::AgentRegistry;
use nfsprov_controller::controller::{self, RunConfig};
use nfsprov_controller::metrics::Metrics;
use nfsprov_kube_sim::{SimOptions, Simulator};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

fn is_bound(pvc: Option<&PersistentVolumeClaim>) -> bool {
    pvc.and_then(|c| c.status.as_ref())
        .and_then(|s| s.phase.as_deref())
        == Some("Bound")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_to_directory_and_back() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let sim = Simulator::start(SimOptions::default()).await.unwrap();
    let client = sim.client().await;
    let root = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(root.path()).await.unwrap();
    let metrics = Arc::new(Metrics::new());
    let agents = AgentRegistry::new(&[agent.connection()], metrics.clone()).unwrap();
    let ready = Arc::new(AtomicBool::new(false));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(controller::run(
        client.clone(),
        agents,
        metrics.clone(),
        RunConfig::reconcilers_only(
            "nfsprov.dev/nfs",
            Reporter {
                controller: "nfsprov-controller".into(),
                instance: Some("test".into()),
            },
        ),
        ready.clone(),
        stopped,
    ));

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
        ready.load(Ordering::SeqCst),
        "caches synced before work was done"
    );
    let dir = root.path().join("default/data");
    assert!(dir.is_dir(), "{} missing", dir.display());
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let volume = volumes.get(&pv_name).await.unwrap();
    assert_eq!(
        volume.spec.as_ref().unwrap().nfs.as_ref().unwrap().path,
        format!("{}/default/data", root.path().display())
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

    stop.send(true).unwrap();
    tokio::time::timeout(WAIT, running)
        .await
        .expect("controller stops on shutdown")
        .unwrap();
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
    sim.shutdown().await;
}
