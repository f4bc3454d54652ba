//! Core API semantics through a stock kube client: create/get/list, errors as Status
//! objects, optimistic concurrency, validation, patch types, status subresources.

mod common;

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::ObjectMeta;
use nfsprov_kube_sim::SimOptions;
use serde_json::json;

fn no_binder() -> SimOptions {
    SimOptions {
        binder: false,
        ..SimOptions::default()
    }
}

#[tokio::test]
async fn create_assigns_server_fields_and_rejects_duplicates() {
    let (_sim, client) = start_with(no_binder()).await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let made = create(&pvcs, &pvc("data", Some("nfs"), "1Gi")).await;
    let m = &made.metadata;
    assert!(m.uid.as_deref().is_some_and(|u| u.len() == 36));
    assert!(m.creation_timestamp.is_some());
    assert!(
        m.resource_version
            .as_deref()
            .is_some_and(|r| r.parse::<u64>().is_ok())
    );
    assert_eq!(
        made.status.and_then(|s| s.phase).as_deref(),
        Some("Pending")
    );

    let dup = status(
        pvcs.create(&PostParams::default(), &pvc("data", None, "1Gi"))
            .await,
    );
    assert_eq!((dup.code, dup.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(
        dup.message,
        "persistentvolumeclaims \"data\" already exists"
    );

    let mut generated = pvc("", None, "1Gi");
    generated.metadata.name = None;
    generated.metadata.generate_name = Some("gen-".into());
    let g = create(&pvcs, &generated).await;
    let name = g.metadata.name.unwrap();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");

    let in_missing_ns: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "nope");
    let e = status(
        in_missing_ns
            .create(&PostParams::default(), &pvc("x", None, "1Gi"))
            .await,
    );
    assert_eq!(
        (e.code, e.message.as_str()),
        (404, "namespaces \"nope\" not found")
    );

    let missing = status(pvcs.get("absent").await);
    assert!(missing.is_not_found());
    assert_eq!(
        missing.message,
        "persistentvolumeclaims \"absent\" not found"
    );
}

#[tokio::test]
async fn list_supports_selectors_and_pagination() {
    let (_sim, client) = start_with(no_binder()).await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    for i in 0..7 {
        let mut c = pvc(&format!("c{i}"), None, "1Gi");
        c.metadata.labels = Some(
            [(
                "parity".to_string(),
                (if i % 2 == 0 { "even" } else { "odd" }).to_string(),
            )]
            .into(),
        );
        create(&pvcs, &c).await;
    }
    let even = pvcs
        .list(&ListParams::default().labels("parity=even"))
        .await
        .unwrap();
    assert_eq!(even.items.len(), 4);
    let not_even = pvcs
        .list(&ListParams::default().labels("parity notin (even)"))
        .await
        .unwrap();
    assert_eq!(not_even.items.len(), 3);
    let one = pvcs
        .list(&ListParams::default().fields("metadata.name=c3"))
        .await
        .unwrap();
    assert_eq!(one.items.len(), 1);
    let bad = status(
        pvcs.list(&ListParams::default().fields("spec.volumeName=x"))
            .await,
    );
    assert_eq!(
        (bad.code, bad.message.as_str()),
        (400, "field label not supported: spec.volumeName")
    );

    // Pages of 3: consistent snapshot even when objects change between pages.
    let first = pvcs.list(&ListParams::default().limit(3)).await.unwrap();
    assert_eq!(first.items.len(), 3);
    let token = first.metadata.continue_.clone().expect("continue token");
    create(&pvcs, &pvc("c9", None, "1Gi")).await;
    let mut names: Vec<String> = first
        .items
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    let mut cont = Some(token);
    while let Some(t) = cont {
        let page = pvcs
            .list(&ListParams::default().limit(3).continue_token(&t))
            .await
            .unwrap();
        assert_eq!(
            page.metadata.resource_version,
            first.metadata.resource_version
        );
        names.extend(page.items.iter().map(|p| p.metadata.name.clone().unwrap()));
        cont = page.metadata.continue_.filter(|c| !c.is_empty());
    }
    assert_eq!(names, ["c0", "c1", "c2", "c3", "c4", "c5", "c6"]);
    let garbage = status(
        pvcs.list(&ListParams::default().continue_token("zzz"))
            .await,
    );
    assert_eq!(garbage.code, 400);
}

#[tokio::test]
async fn stale_update_conflicts_and_fresh_update_succeeds() {
    let (_sim, client) = start_with(no_binder()).await;
    let leases: Api<Lease> = Api::namespaced(client, "default");
    let l: Lease = serde_json::from_value(json!({
        "metadata": {"name": "lock"}, "spec": {"holderIdentity": "a"}
    }))
    .unwrap();
    let v1 = create(&leases, &l).await;
    let mut a = v1.clone();
    a.spec.as_mut().unwrap().holder_identity = Some("b".into());
    let v2 = leases
        .replace("lock", &PostParams::default(), &a)
        .await
        .unwrap();
    assert_ne!(v2.metadata.resource_version, v1.metadata.resource_version);
    // Writing again from the old version must fail: someone else changed it.
    let mut stale = v1.clone();
    stale.spec.as_mut().unwrap().holder_identity = Some("c".into());
    let e = status(leases.replace("lock", &PostParams::default(), &stale).await);
    assert!(e.is_conflict());
    assert_eq!(
        e.message,
        "Operation cannot be fulfilled on leases.coordination.k8s.io \"lock\": the object has been modified; please apply your changes to the latest version and try again"
    );
    // A no-op write does not bump the version.
    let same = leases
        .replace("lock", &PostParams::default(), &v2)
        .await
        .unwrap();
    assert_eq!(same.metadata.resource_version, v2.metadata.resource_version);
    // Unconditional update (no resourceVersion) is allowed for leases, as in the real API.
    let mut blind = v2.clone();
    blind.metadata.resource_version = None;
    blind.spec.as_mut().unwrap().holder_identity = Some("d".into());
    leases
        .replace("lock", &PostParams::default(), &blind)
        .await
        .unwrap();
    // Delete preconditions.
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: Some("1".into()),
            uid: None,
        }),
        ..DeleteParams::default()
    };
    assert!(status(leases.delete("lock", &dp).await).is_conflict());
}

#[tokio::test]
async fn validation_rejects_what_the_real_api_rejects() {
    let (_sim, client) = start_with(no_binder()).await;
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let e = status(
        pvs.create(&PostParams::default(), &nfs_pv("Bad_Name", "1Gi"))
            .await,
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert!(e.message.starts_with("PersistentVolume \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain"), "{}", e.message);

    let mut no_cap = nfs_pv("nocap", "1Gi");
    no_cap.spec.as_mut().unwrap().capacity = None;
    let e = status(pvs.create(&PostParams::default(), &no_cap).await);
    assert_eq!(
        e.message,
        "PersistentVolume \"nocap\" is invalid: spec.capacity: Required value"
    );

    let mut two_sources: serde_json::Value = serde_json::to_value(nfs_pv("two", "1Gi")).unwrap();
    two_sources["spec"]["hostPath"] = json!({"path": "/tmp"});
    let two: PersistentVolume = serde_json::from_value(two_sources).unwrap();
    let e = status(pvs.create(&PostParams::default(), &two).await);
    assert!(
        e.message
            .contains("spec: Forbidden: may not specify more than 1 volume type"),
        "{}",
        e.message
    );

    let mut bare = nfs_pv("bare", "1Gi");
    bare.spec.as_mut().unwrap().nfs = None;
    bare.spec.as_mut().unwrap().access_modes = None;
    let e = status(pvs.create(&PostParams::default(), &bare).await);
    assert!(
        e.message.contains("spec.accessModes: Required value")
            && e.message
                .contains("spec: Required value: must specify a volume type"),
        "{}",
        e.message
    );

    // Claims: spec is immutable except growing requests of a bound claim.
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    create(&pvcs, &pvc("imm", Some("a"), "1Gi")).await;
    let e = status(
        pvcs.patch(
            "imm",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"storageClassName": "b"}})),
        )
        .await,
    );
    assert!(e.is_invalid());
    assert!(
        e.message
            .contains("spec: Forbidden: spec is immutable after creation"),
        "{}",
        e.message
    );
    let e = status(
        pvcs.patch(
            "imm",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}})),
        )
        .await,
    );
    assert!(e.is_invalid(), "an unbound claim cannot be resized");
    // Finalizers must be qualified.
    let e = status(
        pvcs.patch(
            "imm",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["unqualified"]}})),
        )
        .await,
    );
    assert!(
        e.message
            .contains("name is neither a standard finalizer name nor is it fully qualified"),
        "{}",
        e.message
    );
    // The apiVersion in the body must match the endpoint.
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "UPPER"}})).unwrap();
    assert!(status(nss.create(&PostParams::default(), &ns).await).is_invalid());
}

#[tokio::test]
async fn patch_types_behave_like_the_real_api() {
    let (_sim, client) = start_with(no_binder()).await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    create(&pvcs, &pvc("p", Some("nfs"), "1Gi")).await;
    let pp = PatchParams::default();
    // Merge patch replaces lists.
    pvcs.patch(
        "p",
        &pp,
        &Patch::Merge(json!({"metadata": {"finalizers": ["a.io/one", "a.io/two"]}})),
    )
    .await
    .unwrap();
    let p = pvcs
        .patch(
            "p",
            &pp,
            &Patch::Merge(json!({"metadata": {"finalizers": ["a.io/three"]}})),
        )
        .await
        .unwrap();
    assert_eq!(p.metadata.finalizers.unwrap(), ["a.io/three"]);
    // Strategic merge merges finalizers (patchStrategy=merge in ObjectMeta).
    let p = pvcs
        .patch(
            "p",
            &pp,
            &Patch::Strategic(json!({"metadata": {"finalizers": ["a.io/four"]}})),
        )
        .await
        .unwrap();
    assert_eq!(p.metadata.finalizers.unwrap(), ["a.io/three", "a.io/four"]);
    // JSON patch with a test op guarding the removal.
    let p = pvcs
        .patch(
            "p",
            &pp,
            &Patch::<()>::Json(
                serde_json::from_value(json!([
                    {"op": "test", "path": "/metadata/finalizers/0", "value": "a.io/three"},
                    {"op": "remove", "path": "/metadata/finalizers/0"}
                ]))
                .unwrap(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(p.metadata.finalizers.unwrap(), ["a.io/four"]);
    let failed = pvcs
        .patch(
            "p",
            &pp,
            &Patch::<()>::Json(
                serde_json::from_value(json!([
                    {"op": "test", "path": "/metadata/finalizers/0", "value": "a.io/three"}
                ]))
                .unwrap(),
            ),
        )
        .await;
    assert_eq!(status(failed).code, 422);
    // A patch carrying a stale resourceVersion is a precondition and conflicts.
    let e = status(
        pvcs.patch(
            "p",
            &pp,
            &Patch::Merge(json!({"metadata": {"resourceVersion": "1", "labels": {"a": "b"}}})),
        )
        .await,
    );
    assert!(e.is_conflict());
    // Patching something absent is 404; server-side apply creates.
    assert!(status(pvcs.patch("ghost", &pp, &Patch::Merge(json!({}))).await).is_not_found());
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let apply = PatchParams::apply("test-manager");
    let l = leases
        .patch("applied", &apply, &Patch::Apply(json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": {"holderIdentity": "me"}})))
        .await
        .unwrap();
    assert_eq!(l.spec.unwrap().holder_identity.as_deref(), Some("me"));
}

#[tokio::test]
async fn status_subresource_is_separate_from_the_main_resource() {
    let (_sim, client) = start_with(no_binder()).await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client, "default");
    create(&pvcs, &pvc("s", Some("nfs"), "1Gi")).await;
    // A status change through the main resource is ignored...
    let p = pvcs
        .patch(
            "s",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"phase": "Bound"}, "metadata": {"labels": {"x": "y"}}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Pending"));
    assert_eq!(p.metadata.labels.unwrap()["x"], "y");
    // ...and a metadata change through /status is ignored.
    let p = pvcs
        .patch_status(
            "s",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Lost"}, "metadata": {"labels": {"x": "z"}}})),
        )
        .await
        .unwrap();
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Lost"));
    assert_eq!(p.metadata.labels.unwrap()["x"], "y");
    let _ = ObjectMeta::default();
}

#[tokio::test]
async fn server_side_apply_conflicts_between_managers() {
    let (_sim, client) = start_with(no_binder()).await;
    let leases: Api<Lease> = Api::namespaced(client, "default");
    let hold = |who: &str| {
        Patch::Apply(json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "spec": {"holderIdentity": who, "leaseDurationSeconds": 15}
        }))
    };
    leases
        .patch("leader", &PatchParams::apply("lease-a"), &hold("a"))
        .await
        .unwrap();
    // Another manager may not take the fields "a" set to different values...
    let e = status(
        leases
            .patch("leader", &PatchParams::apply("lease-b"), &hold("b"))
            .await,
    );
    assert!(e.is_conflict());
    assert!(
        e.message.contains("conflict with \"lease-a\"")
            && e.message.contains(".spec.holderIdentity"),
        "{}",
        e.message
    );
    // ...re-applying its own configuration is fine.
    leases
        .patch("leader", &PatchParams::apply("lease-a"), &hold("a"))
        .await
        .unwrap();
    // Once "a" releases (a strategic merge patch removing the fields), "b" can take it.
    leases
        .patch(
            "leader",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"spec": {"holderIdentity": null, "leaseDurationSeconds": null}}),
            ),
        )
        .await
        .unwrap();
    let l = leases
        .patch("leader", &PatchParams::apply("lease-b"), &hold("b"))
        .await
        .unwrap();
    assert_eq!(l.spec.unwrap().holder_identity.as_deref(), Some("b"));
    let managers: Vec<String> = l
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(managers.contains(&"lease-b".to_string()), "{managers:?}");
    // Forcing takes ownership from the other manager.
    leases
        .patch("leader", &PatchParams::apply("lease-c").force(), &hold("c"))
        .await
        .unwrap();
    let e = status(
        leases
            .patch("leader", &PatchParams::apply("lease-b"), &hold("b2"))
            .await,
    );
    assert!(
        e.message.contains("conflict with \"lease-c\""),
        "{}",
        e.message
    );
}

#[tokio::test]
async fn bodies_are_decoded_like_the_real_api() {
    let (_sim, client) = start_with(no_binder()).await;
    let raw: Api<kube::core::DynamicObject> = Api::namespaced_with(
        client,
        "default",
        &kube::discovery::ApiResource::erase::<PersistentVolumeClaim>(&()),
    );
    // Unknown fields are dropped, as the real decoder does...
    let obj: kube::core::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "typo"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            "storageClasName": "misspelled"
        }
    }))
    .unwrap();
    let made = raw.create(&PostParams::default(), &obj).await.unwrap();
    assert!(made.data["spec"].get("storageClasName").is_none());
    // ...and wrongly typed values are a 400.
    let wrong: kube::core::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "wrong"},
        "spec": {"accessModes": "ReadWriteOnce", "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    let e = status(raw.create(&PostParams::default(), &wrong).await);
    assert_eq!(e.code, 400);
    assert!(
        e.message.starts_with(
            "PersistentVolumeClaim in version \"v1\" cannot be handled as a PersistentVolumeClaim"
        ),
        "{}",
        e.message
    );
}

#[tokio::test]
async fn nodes_and_pods_are_stored_listed_and_deleted_as_written() {
    use k8s_openapi::api::core::v1::{Node, Pod};
    let (_sim, client) = start_with(no_binder()).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "node-a"},
        "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.2"}]},
    }))
    .unwrap();
    create(&nodes, &node).await;
    let listed = nodes.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(listed.len(), 1);
    let addresses = listed[0]
        .status
        .as_ref()
        .unwrap()
        .addresses
        .clone()
        .unwrap();
    assert_eq!(addresses[0].address, "127.0.0.2");

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "app"},
        "spec": {
            "nodeName": "node-a",
            "containers": [{"name": "app", "image": "busybox"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
        },
    }))
    .unwrap();
    create(&pods, &pod).await;
    let on_node = pods
        .list(&ListParams::default().fields("spec.nodeName=node-a"))
        .await
        .unwrap()
        .items;
    assert_eq!(on_node.len(), 1);
    let elsewhere = pods
        .list(&ListParams::default().fields("spec.nodeName=node-b"))
        .await
        .unwrap()
        .items;
    assert!(elsewhere.is_empty());
    pods.delete("app", &DeleteParams::default()).await.unwrap();
    assert_eq!(status(pods.get("app").await).code, 404);
    nodes
        .delete("node-a", &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        nodes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

#[tokio::test]
async fn custom_resources_follow_their_crd_manifests() {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    use kube::discovery::Discovery;
    let (_sim, client) = start_with(no_binder()).await;
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("nfsprov.dev", "v1alpha1", "Snapshot"),
        "snapshots",
    );
    let snapshots: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &resource);
    let body: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "nfsprov.dev/v1alpha1",
        "kind": "Snapshot",
        "metadata": {"name": "s1", "finalizers": ["nfsprov.dev/snapshot"]},
        "spec": {"source": {"persistentVolumeClaimName": "data", "misspelt": true}},
        "status": {"readyToUse": true},
    }))
    .unwrap();
    let made = snapshots
        .create(&PostParams::default(), &body)
        .await
        .unwrap();
    // Pruned and defaulted by the manifest's schema; the status of a create is ignored.
    assert!(made.data.get("status").is_none(), "{:?}", made.data);
    assert_eq!(
        made.data["spec"],
        json!({"source": {"persistentVolumeClaimName": "data"}, "deletionPolicy": "Delete"})
    );
    let invalid = snapshots
        .patch(
            "s1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"deletionPolicy": "Keep"}})),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&invalid, kube::Error::Api(s) if s.code == 422),
        "{invalid:?}"
    );
    let strategic = snapshots
        .patch(
            "s1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&strategic, kube::Error::Api(s) if s.code == 415),
        "{strategic:?}"
    );
    let status = snapshots
        .patch_status(
            "s1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"readyToUse": false, "snapshotName": "snap-1", "bogus": 1}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        status.data["status"],
        json!({"readyToUse": false, "snapshotName": "snap-1"})
    );
    // The finalizer holds a deleted object until it is removed.
    snapshots
        .delete("s1", &DeleteParams::default())
        .await
        .unwrap();
    let held = snapshots.get("s1").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    snapshots
        .patch(
            "s1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    assert!(snapshots.get_opt("s1").await.unwrap().is_none());

    let discovery = Discovery::new(client).run().await.unwrap();
    let kinds: Vec<String> = discovery
        .groups()
        .filter(|g| g.name() == "nfsprov.dev")
        .flat_map(|g| g.recommended_resources())
        .map(|(r, _)| format!("{}/{}", r.api_version, r.plural))
        .collect();
    assert_eq!(
        kinds,
        [
            "nfsprov.dev/v1alpha1/snapshots",
            "nfsprov.dev/v1alpha1/snapshotschedules"
        ]
    );
}
