//! Expansion through the whole controller (`controller::run`) on either tier (see
//! [`Harness`]): the in-repo API simulator, whose binder plays kube-controller-manager, or
//! the real API server with kube-controller-manager itself: the status subresource, merge
//! patches and resourceVersion preconditions are the simulator's, not a script's. The agent
//! is `MockAgent` (the real agent's resize endpoint is not part of this crate's tests).

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use serde_json::json;

use crate::tests::harness::{Harness, HarnessOptions};

const WAIT: Duration = Duration::from_secs(30);

fn capacity(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.status
        .as_ref()?
        .capacity
        .as_ref()?
        .get("storage")
        .map(|q| q.0.as_str())
}

fn is_bound(pvc: &PersistentVolumeClaim) -> bool {
    pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_claim_grows_through_the_api() {
    let harness = Harness::start(HarnessOptions::default()).await;
    let agent = &harness.agents[0];
    let client = harness.client.clone();
    let namespace = harness.namespace.as_str();
    let class_name = harness.class_name("nfs");
    let class: StorageClass = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": class_name},
        "provisioner": harness.provisioner,
        "allowVolumeExpansion": true,
        "parameters": {"pathPattern": "${.PVC.namespace}/${.PVC.name}"},
    }))
    .unwrap();
    harness.adopt("storageclass", &class_name);
    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": class_name,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }))
    .unwrap();
    claims.create(&PostParams::default(), &claim).await.unwrap();
    tokio::time::timeout(
        WAIT,
        await_condition(
            claims.clone(),
            "data",
            |c: Option<&PersistentVolumeClaim>| c.is_some_and(is_bound),
        ),
    )
    .await
    .expect("claim bound in time")
    .unwrap();

    claims
        .patch(
            "data",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}})),
        )
        .await
        .unwrap();
    let grown = tokio::time::timeout(
        WAIT,
        await_condition(
            claims.clone(),
            "data",
            |c: Option<&PersistentVolumeClaim>| c.and_then(capacity) == Some("2Gi"),
        ),
    )
    .await
    .expect("claim expanded in time")
    .unwrap()
    .unwrap();

    let status = grown.status.unwrap();
    assert_eq!(
        status.allocated_resources.unwrap()["storage"].0,
        "2Gi",
        "allocatedResources is kept"
    );
    assert!(
        !status
            .allocated_resource_statuses
            .unwrap_or_default()
            .contains_key("storage")
    );
    assert!(
        status
            .conditions
            .unwrap_or_default()
            .iter()
            .all(|c| c.type_ != "Resizing")
    );
    let volume_name = grown.spec.unwrap().volume_name.unwrap();
    let volume = Api::<PersistentVolume>::all(client.clone())
        .get(&volume_name)
        .await
        .unwrap();
    assert_eq!(volume.spec.unwrap().capacity.unwrap()["storage"].0, "2Gi");
    assert_eq!(
        agent
            .volume(&format!("{namespace}/data"))
            .unwrap()
            .capacity_bytes,
        2 << 30
    );
    // The success event is published after the claim's status is written, so the claim
    // can show 2Gi a moment before the event exists: wait for it, with a bound.
    let events = Api::<Event>::namespaced(client.clone(), namespace);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let reasons: Vec<String> = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|e| e.reason)
            .collect();
        let missing: Vec<&str> = ["Resizing", "VolumeResizeSuccessful"]
            .into_iter()
            .filter(|reason| !reasons.iter().any(|r| r == reason))
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{missing:?} not in {reasons:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    harness.finish().await;
}
