//! Deletion with finalizers, and the PV binder playing kube-controller-manager.

mod common;

use common::*;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event as CoreEvent, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::conditions::is_deleted;
use kube::runtime::watcher::{self, Event};
use nfsprov_kube_sim::SimOptions;
use serde_json::json;
use tokio::sync::mpsc;

const PROVISIONER: &str = "nfsprov.example.com/nfs";

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let (_sim, client) = start_with(SimOptions {
        binder: false,
        ..SimOptions::default()
    })
    .await;
    let leases: Api<Lease> = Api::namespaced(client, "default");
    let l: Lease = serde_json::from_value(
        json!({"metadata": {"name": "held", "finalizers": ["example.com/hold"]}}),
    )
    .unwrap();
    let made = create(&leases, &l).await;
    let uid = made.metadata.uid.clone().unwrap();

    let (tx, mut rx) = mpsc::unbounded_channel();
    let w = leases.clone();
    tokio::spawn(async move {
        let mut s = watcher::watcher(w, watcher::Config::default()).boxed();
        while let Some(Ok(ev)) = s.next().await {
            let _ = tx.send(ev);
        }
    });

    let deleted = leases
        .delete("held", &DeleteParams::default())
        .await
        .unwrap();
    let pending = deleted
        .left()
        .expect("object returned while finalizers remain");
    assert!(pending.metadata.deletion_timestamp.is_some());
    let still = leases.get("held").await.unwrap();
    assert!(still.metadata.deletion_timestamp.is_some());
    // No new finalizers on an object being deleted.
    let e = status(
        leases
            .patch(
                "held",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"finalizers": ["example.com/hold", "example.com/more"]}}),
                ),
            )
            .await,
    );
    assert!(e.is_invalid(), "{e:?}");
    // Deleting again changes nothing.
    let again = leases
        .delete("held", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(
        again.metadata.resource_version,
        still.metadata.resource_version
    );

    leases
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    assert!(status(leases.get("held").await).is_not_found());
    tokio::time::timeout(
        WAIT,
        kube::runtime::wait::await_condition(leases.clone(), "held", is_deleted(&uid)),
    )
    .await
    .unwrap()
    .unwrap();
    // The watch saw the deletionTimestamp change, then the deletion.
    let mut saw_deleting = false;
    let saw_delete = tokio::time::timeout(WAIT, async {
        while let Some(ev) = rx.recv().await {
            match ev {
                Event::Apply(o) if o.metadata.deletion_timestamp.is_some() => saw_deleting = true,
                Event::Delete(o) => return o.metadata.name.as_deref() == Some("held"),
                _ => {}
            }
        }
        false
    })
    .await
    .unwrap();
    assert!(saw_deleting && saw_delete);

    // Without finalizers a delete is immediate and answers a Status.
    create(
        &leases,
        &serde_json::from_value(json!({"metadata": {"name": "plain"}})).unwrap(),
    )
    .await;
    let st = leases
        .delete("plain", &DeleteParams::default())
        .await
        .unwrap()
        .right()
        .unwrap();
    assert!(st.is_success());
}

fn claim_state(c: &PersistentVolumeClaim) -> String {
    let ann = c.metadata.annotations.clone().unwrap_or_default();
    let mut keys: Vec<&str> = ann.keys().map(String::as_str).collect();
    keys.sort();
    format!(
        "{}|{}|{}",
        c.status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default(),
        c.spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap_or_default(),
        keys.join(",")
    )
}

#[tokio::test]
async fn binder_flow_pending_bound_released() {
    let (_sim, client) = start().await;
    let classes: Api<StorageClass> = Api::all(client.clone());
    create(&classes, &storage_class("nfs", PROVISIONER, "Immediate")).await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let pvs: Api<PersistentVolume> = Api::all(client.clone());

    // Record every state of the claim the way `kubectl get -w` would show it.
    let (tx, mut rx) = mpsc::unbounded_channel();
    let w = pvcs.clone();
    tokio::spawn(async move {
        let mut s = watcher::watcher(w, watcher::Config::default()).boxed();
        while let Some(Ok(ev)) = s.next().await {
            let state = match ev {
                Event::Apply(c) => claim_state(&c),
                Event::InitDone => "listed".to_string(),
                _ => continue,
            };
            if tx.send(state).is_err() {
                return;
            }
        }
    });
    // The watcher lists first, so the claim's creation reaches it as an event.
    let listed = tokio::time::timeout(WAIT, rx.recv()).await.unwrap();
    assert_eq!(listed.as_deref(), Some("listed"));
    create(&pvcs, &pvc("data", Some("nfs"), "1Gi")).await;

    let claim = wait_for(pvcs.clone(), "data", |c: Option<&PersistentVolumeClaim>| {
        c.and_then(|c| c.metadata.annotations.as_ref())
            .is_some_and(|a| {
                a.get("volume.kubernetes.io/storage-provisioner")
                    .map(String::as_str)
                    == Some(PROVISIONER)
            })
    })
    .await;
    let ann = claim.metadata.annotations.clone().unwrap();
    assert_eq!(
        ann["volume.beta.kubernetes.io/storage-provisioner"],
        PROVISIONER
    );
    assert_eq!(
        claim.status.as_ref().unwrap().phase.as_deref(),
        Some("Pending")
    );
    assert_eq!(
        claim.metadata.finalizers.clone().unwrap(),
        ["kubernetes.io/pvc-protection"]
    );
    let events: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let evs = events
        .list(&ListParams::default().fields("involvedObject.name=data,reason=ExternalProvisioning"))
        .await
        .unwrap();
    assert_eq!(evs.items.len(), 1);

    // The provisioner's PV, pre-bound with the claim's uid.
    let uid = claim.metadata.uid.clone().unwrap();
    let pv_name = format!("pvc-{uid}");
    let mut pv = nfs_pv(&pv_name, "1Gi");
    pv.metadata.annotations = Some(
        [(
            "pv.kubernetes.io/provisioned-by".to_string(),
            PROVISIONER.to_string(),
        )]
        .into(),
    );
    let spec = pv.spec.as_mut().unwrap();
    spec.storage_class_name = Some("nfs".into());
    spec.persistent_volume_reclaim_policy = Some("Delete".into());
    spec.claim_ref = Some(serde_json::from_value(json!({"kind": "PersistentVolumeClaim", "namespace": "default", "name": "data", "uid": uid, "apiVersion": "v1"})).unwrap());
    pvs.create(&PostParams::default(), &pv).await.unwrap();

    let bound = wait_for(pvcs.clone(), "data", |c: Option<&PersistentVolumeClaim>| {
        c.and_then(|c| c.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            == Some("Bound")
    })
    .await;
    assert_eq!(
        bound.spec.as_ref().unwrap().volume_name.as_deref(),
        Some(pv_name.as_str())
    );
    let ann = bound.metadata.annotations.clone().unwrap();
    assert_eq!(ann["pv.kubernetes.io/bind-completed"], "yes");
    assert_eq!(ann["pv.kubernetes.io/bound-by-controller"], "yes");
    let st = bound.status.clone().unwrap();
    assert_eq!(st.access_modes.unwrap(), ["ReadWriteMany"]);
    assert_eq!(st.capacity.unwrap()["storage"].0, "1Gi");
    let pv_now = pvs.get(&pv_name).await.unwrap();
    assert_eq!(pv_now.status.unwrap().phase.as_deref(), Some("Bound"));
    assert!(
        !pv_now
            .metadata
            .annotations
            .unwrap()
            .contains_key("pv.kubernetes.io/bound-by-controller"),
        "pre-bound PVs are not marked bound-by-controller"
    );
    assert_eq!(
        pv_now.metadata.finalizers.unwrap(),
        ["kubernetes.io/pv-protection"]
    );

    // The claim's visible states, in order (duplicates from no-op resyncs excluded).
    let mut states: Vec<String> = Vec::new();
    tokio::time::timeout(WAIT, async {
        while let Some(s) = rx.recv().await {
            if states.last() != Some(&s) {
                states.push(s.clone());
            }
            if s.starts_with("Bound|") {
                break;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("watcher never saw Bound: {states:#?}"));
    let prov =
        "volume.beta.kubernetes.io/storage-provisioner,volume.kubernetes.io/storage-provisioner";
    assert_eq!(
        states,
        [
            "Pending||".to_string(),
            format!("Pending||{prov}"),
            format!(
                "Pending|{pv_name}|pv.kubernetes.io/bind-completed,pv.kubernetes.io/bound-by-controller,{prov}"
            ),
            format!(
                "Bound|{pv_name}|pv.kubernetes.io/bind-completed,pv.kubernetes.io/bound-by-controller,{prov}"
            ),
        ]
    );

    // Deleting the claim: protection finalizer removed (no pods), claim gone, PV Released.
    pvcs.delete("data", &DeleteParams::default()).await.unwrap();
    tokio::time::timeout(
        WAIT,
        kube::runtime::wait::await_condition(pvcs.clone(), "data", is_deleted(&uid)),
    )
    .await
    .unwrap()
    .unwrap();
    let released = wait_for(pvs.clone(), &pv_name, |p: Option<&PersistentVolume>| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            == Some("Released")
    })
    .await;
    assert_eq!(
        released.spec.unwrap().claim_ref.unwrap().uid.as_deref(),
        Some(uid.as_str())
    );

    // PV protection lets an unbound PV go.
    pvs.delete(&pv_name, &DeleteParams::default())
        .await
        .unwrap();
    let pv_uid = released.metadata.uid.unwrap();
    tokio::time::timeout(
        WAIT,
        kube::runtime::wait::await_condition(pvs.clone(), &pv_name, is_deleted(&pv_uid)),
    )
    .await
    .unwrap()
    .unwrap();
}

#[tokio::test]
async fn wait_for_first_consumer_and_static_binding() {
    let (_sim, client) = start().await;
    let classes: Api<StorageClass> = Api::all(client.clone());
    create(
        &classes,
        &storage_class("late", PROVISIONER, "WaitForFirstConsumer"),
    )
    .await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    create(&pvcs, &pvc("wffc", Some("late"), "1Gi")).await;
    let ev = wait_event(&client, "default", "wffc", "WaitForFirstConsumer").await;
    assert_eq!(
        ev.message.as_deref(),
        Some("waiting for first consumer to be created before binding")
    );
    let c = pvcs.get("wffc").await.unwrap();
    assert!(
        !c.metadata
            .annotations
            .unwrap_or_default()
            .contains_key("volume.kubernetes.io/storage-provisioner")
    );
    pvcs.patch(
        "wffc",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "node-1"}}}),
        ),
    )
    .await
    .unwrap();
    wait_for(pvcs.clone(), "wffc", |c: Option<&PersistentVolumeClaim>| {
        c.and_then(|c| c.metadata.annotations.as_ref())
            .is_some_and(|a| a.contains_key("volume.kubernetes.io/storage-provisioner"))
    })
    .await;

    // Static binding: an Available PV of the claim's class and size is picked by the binder,
    // which marks the PV bound-by-controller and fills in the full claimRef.
    let mut pv = nfs_pv("static", "5Gi");
    pv.spec.as_mut().unwrap().storage_class_name = Some("manual".into());
    create(&pvs, &pv).await;
    wait_for(pvs.clone(), "static", |p: Option<&PersistentVolume>| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            == Some("Available")
    })
    .await;
    create(&pvcs, &pvc("static-claim", Some("manual"), "2Gi")).await;
    let bound = wait_for(pvs.clone(), "static", |p: Option<&PersistentVolume>| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            == Some("Bound")
    })
    .await;
    assert_eq!(
        bound.metadata.annotations.unwrap()["pv.kubernetes.io/bound-by-controller"],
        "yes"
    );
    assert_eq!(
        bound.spec.unwrap().claim_ref.unwrap().name.as_deref(),
        Some("static-claim")
    );
    let claim = wait_for(
        pvcs.clone(),
        "static-claim",
        |c: Option<&PersistentVolumeClaim>| {
            c.and_then(|c| c.status.as_ref())
                .and_then(|s| s.phase.as_deref())
                == Some("Bound")
        },
    )
    .await;
    assert_eq!(claim.status.unwrap().capacity.unwrap()["storage"].0, "5Gi");
}
