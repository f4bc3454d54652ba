//! Volume expansion as a real control plane handles it: PVC update validation, the
//! PersistentVolumeClaimResize admission plugin, the resize fields of the claim's status,
//! and kube-controller-manager's expand controller handing NFS volumes to an external
//! resizer.

mod common;

use common::*;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use nfsprov_kube_sim::SimOptions;
use serde_json::json;

const IMMUTABLE_SPEC: &str = "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims";

async fn class(client: &Client, name: &str, allow_expansion: Option<bool>) {
    let mut sc = storage_class(name, PROVISIONER, "Immediate");
    sc.allow_volume_expansion = allow_expansion;
    create(&Api::<StorageClass>::all(client.clone()), &sc).await;
}

fn claims(client: &Client) -> Api<PersistentVolumeClaim> {
    Api::namespaced(client.clone(), "default")
}

async fn resize(
    pvcs: &Api<PersistentVolumeClaim>,
    name: &str,
    size: &str,
) -> Result<PersistentVolumeClaim, kube::Error> {
    pvcs.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": size}}}})),
    )
    .await
}

fn requested(c: &PersistentVolumeClaim) -> String {
    c.spec
        .as_ref()
        .unwrap()
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap()["storage"]
        .0
        .clone()
}

fn capacity(c: &PersistentVolumeClaim) -> String {
    c.status.as_ref().unwrap().capacity.as_ref().unwrap()["storage"]
        .0
        .clone()
}

/// The field causes of a 422, rendered as `field: message`.
fn causes(e: &kube::core::Status) -> Vec<String> {
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"), "{e:?}");
    e.details
        .as_ref()
        .map(|d| {
            d.causes
                .iter()
                .map(|c| format!("{} {}: {}", c.reason, c.field, c.message))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn growing_a_bound_claim_is_announced_once_per_requested_size() {
    let (_sim, client) = start().await;
    class(&client, "nfs", Some(true)).await;
    let claim = bound_claim(&client, "data", "nfs", "1Gi").await;
    let pvcs = claims(&client);

    let grown = resize(&pvcs, "data", "2Gi").await.expect("growth admitted");
    assert_eq!(requested(&grown), "2Gi");
    let ev = wait_event(&client, "default", "data", "ExternalExpanding").await;
    assert_eq!(ev.type_.as_deref(), Some("Normal"));
    assert_eq!(
        ev.message.as_deref(),
        Some("waiting for an external controller to expand this PVC")
    );
    assert_eq!(
        ev.source.as_ref().and_then(|s| s.component.as_deref()),
        Some("volume_expand")
    );
    assert_eq!(ev.reporting_component.as_deref(), Some("volume_expand"));
    assert_eq!(
        ev.involved_object.kind.as_deref(),
        Some("PersistentVolumeClaim")
    );
    assert_eq!(ev.involved_object.uid, claim.metadata.uid);

    // Another pass over the same claim, for a change that is not a new size, says nothing.
    pvcs.patch(
        "data",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
    )
    .await
    .unwrap();
    binder_settled(&client).await;
    assert_eq!(
        events_about(&client, "data", "ExternalExpanding")
            .await
            .len(),
        1
    );
    // The claim's status is the resizer's business, not the expand controller's.
    let now = pvcs.get("data").await.unwrap();
    assert_eq!(capacity(&now), "1Gi");
    let status = now.status.unwrap();
    assert!(status.conditions.is_none(), "{status:?}");
    assert!(status.allocated_resources.is_none(), "{status:?}");

    // A larger size is news again; the same size spelled otherwise is not.
    resize(&pvcs, "data", "3Gi").await.expect("second growth");
    wait_events(&client, "data", "ExternalExpanding", 2).await;
    resize(&pvcs, "data", "3072Mi")
        .await
        .expect("the same amount in other units");
    binder_settled(&client).await;
    assert_eq!(
        events_about(&client, "data", "ExternalExpanding")
            .await
            .len(),
        2
    );
}

#[tokio::test]
async fn growing_is_forbidden_unless_the_class_allows_expansion() {
    let (_sim, client) = start().await;
    let pvcs = claims(&client);
    let forbidden = |name: &str| {
        format!(
            "persistentvolumeclaims \"{name}\" is forbidden: only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize"
        )
    };
    for (claim, allow) in [("unset", None), ("off", Some(false))] {
        class(&client, claim, allow).await;
        bound_claim(&client, claim, claim, "1Gi").await;
        let e = status(resize(&pvcs, claim, "2Gi").await);
        assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"), "{e:?}");
        assert_eq!(e.message, forbidden(claim));
        let details = e.details.expect("details");
        assert_eq!(
            (details.name.as_str(), details.kind.as_str()),
            (claim, "persistentvolumeclaims")
        );
        assert_eq!(requested(&pvcs.get(claim).await.unwrap()), "1Gi");
    }

    // A class that allowed it but is gone allows nothing.
    class(&client, "gone", Some(true)).await;
    bound_claim(&client, "orphan", "gone", "1Gi").await;
    Api::<StorageClass>::all(client.clone())
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap();
    let e = status(resize(&pvcs, "orphan", "2Gi").await);
    assert_eq!(e.message, forbidden("orphan"));

    // The same amount in other units is no growth: nothing for the plugin to refuse.
    let respelled = resize(&pvcs, "off", "1024Mi").await;
    assert!(respelled.is_ok(), "{respelled:?}");
}

#[tokio::test]
async fn an_unbound_claim_cannot_be_resized() {
    // Without the binder the claim stays Pending, whatever its class allows.
    let (_sim, client) = start_with(SimOptions {
        binder: false,
        ..SimOptions::default()
    })
    .await;
    class(&client, "nfs", Some(true)).await;
    let pvcs = claims(&client);
    create(&pvcs, &pvc("pending", Some("nfs"), "1Gi")).await;
    let e = status(resize(&pvcs, "pending", "2Gi").await);
    assert!(
        e.message.starts_with(&format!(
            "PersistentVolumeClaim \"pending\" is invalid: spec: Forbidden: {IMMUTABLE_SPEC}\n"
        )),
        "{}",
        e.message
    );
    let causes = causes(&e);
    assert_eq!(causes.len(), 1, "{causes:?}");
    assert!(
        causes[0].starts_with(&format!(
            "FieldValueForbidden spec: Forbidden: {IMMUTABLE_SPEC}"
        )),
        "{causes:?}"
    );
    assert_eq!(requested(&pvcs.get("pending").await.unwrap()), "1Gi");
}

#[tokio::test]
async fn shrinking_stops_above_the_status_capacity() {
    let (_sim, client) = start().await;
    class(&client, "nfs", Some(true)).await;
    bound_claim(&client, "shrink", "nfs", "1Gi").await;
    let pvcs = claims(&client);
    resize(&pvcs, "shrink", "3Gi").await.expect("growth");
    // Back down, but still above the 1Gi the volume has: how a failed expansion is undone.
    let back = resize(&pvcs, "shrink", "2000Mi")
        .await
        .expect("a decrease that stays above status.capacity");
    assert_eq!(requested(&back), "2000Mi");
    // Equal to (in plain bytes) or below (in decimal units) status.capacity: refused.
    for size in ["1073741824", "1G", "512Mi"] {
        let e = status(resize(&pvcs, "shrink", size).await);
        assert_eq!(
            e.message,
            "PersistentVolumeClaim \"shrink\" is invalid: spec.resources.requests.storage: Forbidden: field can not be less than status.capacity",
            "{size}"
        );
        assert_eq!(
            causes(&e),
            [
                "FieldValueForbidden spec.resources.requests.storage: Forbidden: field can not be less than status.capacity"
            ]
        );
    }
    // Of a bound claim's resources only the storage request may change.
    let e = status(
        pvcs.patch(
            "shrink",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resources": {"limits": {"storage": "5Gi"}}}})),
        )
        .await,
    );
    assert!(
        causes(&e)[0].starts_with(&format!(
            "FieldValueForbidden spec: Forbidden: {IMMUTABLE_SPEC}"
        )),
        "{e:?}"
    );
    assert_eq!(requested(&pvcs.get("shrink").await.unwrap()), "2000Mi");
}

#[tokio::test]
async fn resize_status_is_kept_and_checked() {
    let (_sim, client) = start().await;
    class(&client, "nfs", Some(true)).await;
    let claim = bound_claim(&client, "data", "nfs", "1Gi").await;
    let pv_name = claim.spec.unwrap().volume_name.unwrap();
    let pvcs = claims(&client);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pp = PatchParams::default();
    resize(&pvcs, "data", "2Gi").await.unwrap();

    // What an external resizer writes: the volume's new size first...
    let pv = pvs
        .patch(
            &pv_name,
            &pp,
            &Patch::Merge(json!({"spec": {"capacity": {"storage": "2Gi"}}})),
        )
        .await
        .expect("a volume's capacity may change");
    assert_eq!(pv.spec.unwrap().capacity.unwrap()["storage"].0, "2Gi");
    // ...and the claim's progress, then its result.
    let in_progress = json!({"status": {
        "allocatedResources": {"storage": "2Gi"},
        "allocatedResourceStatuses": {"storage": "ControllerResizeInProgress", "example.com/iops": "NodeResizePending"},
        "conditions": [{"type": "Resizing", "status": "True", "lastTransitionTime": "2025-01-01T00:00:00Z"}],
    }});
    let c = pvcs
        .patch_status("data", &pp, &Patch::Merge(in_progress))
        .await
        .expect("resize progress accepted");
    let st = c.status.unwrap();
    assert_eq!(st.allocated_resources.unwrap()["storage"].0, "2Gi");
    let statuses = st.allocated_resource_statuses.unwrap();
    assert_eq!(statuses["storage"], "ControllerResizeInProgress");
    assert_eq!(statuses["example.com/iops"], "NodeResizePending");
    assert_eq!(st.conditions.unwrap()[0].type_, "Resizing");
    for (condition, state) in [
        ("ControllerResizeError", "ControllerResizeInfeasible"),
        ("FileSystemResizePending", "NodeResizePending"),
    ] {
        let c = pvcs
            .patch_status(
                "data",
                &pp,
                &Patch::Merge(json!({"status": {
                    "allocatedResourceStatuses": {"storage": state},
                    "conditions": [{"type": condition, "status": "True"}],
                }})),
            )
            .await
            .unwrap_or_else(|e| panic!("{condition}: {e}"));
        assert_eq!(c.status.unwrap().conditions.unwrap()[0].type_, condition);
    }
    let done = json!({"status": {
        "capacity": {"storage": "2Gi"},
        "allocatedResourceStatuses": null,
        "conditions": null,
    }});
    pvcs.patch_status("data", &pp, &Patch::Merge(done))
        .await
        .unwrap();

    // Writes to the main resource keep all of it.
    let labelled = pvcs
        .patch(
            "data",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"resized": "yes"}}})),
        )
        .await
        .unwrap();
    assert_eq!(capacity(&labelled), "2Gi");
    assert_eq!(
        labelled.status.unwrap().allocated_resources.unwrap()["storage"].0,
        "2Gi"
    );

    // Malformed resize statuses and negative amounts are refused with the real wording.
    let refused = [
        (
            json!({"allocatedResourceStatuses": {"storage": "Resizing"}}),
            "FieldValueNotSupported status.allocatedResourceStatus: Unsupported value: \"storage\": supported values: \"ControllerResizeInProgress\", \"ControllerResizeInfeasible\", \"NodeResizeInProgress\", \"NodeResizeInfeasible\", \"NodeResizePending\"",
        ),
        (
            json!({"allocatedResourceStatuses": {"cpu": "NodeResizePending"}}),
            "FieldValueNotSupported status.allocatedResourceStatus: Unsupported value: \"cpu\": supported values: \"storage\"",
        ),
        (
            json!({"allocatedResources": {"kubernetes.io/memory": "1Gi"}}),
            "FieldValueNotSupported status.allocatedResources: Unsupported value: \"kubernetes.io/memory\": supported values: \"storage\"",
        ),
        (
            json!({"capacity": {"storage": "-1Gi"}}),
            "FieldValueInvalid status.capacity[storage]: Invalid value: -1073741824: must be a valid resource quantity",
        ),
    ];
    for (bad, expected) in refused {
        let e = status(
            pvcs.patch_status("data", &pp, &Patch::Merge(json!({ "status": bad })))
                .await,
        );
        assert_eq!(causes(&e), [expected]);
    }
    let e = status(
        pvcs.patch_status(
            "data",
            &pp,
            &Patch::Merge(json!({"status": {"capacity": {"storage": "two gigs"}}})),
        )
        .await,
    );
    assert_eq!(
        (e.code, e.message.as_str()),
        (
            400,
            "PersistentVolumeClaim in version \"v1\" cannot be handled as a PersistentVolumeClaim: quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        )
    );

    // Even when the binder has to bind the pair again (here: the volume's claimRef
    // dropped), it leaves a Bound claim's capacity alone, however the volume's differs:
    // the real PV controller only copies the capacity when a claim becomes Bound.
    pvs.patch(
        &pv_name,
        &pp,
        &Patch::Merge(json!({"spec": {"capacity": {"storage": "1Gi"}, "claimRef": null}})),
    )
    .await
    .unwrap();
    wait_for(pvs.clone(), &pv_name, |p: Option<&PersistentVolume>| {
        p.is_some_and(|p| {
            p.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).is_some()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
        })
    })
    .await;
    binder_settled(&client).await;
    assert_eq!(capacity(&pvcs.get("data").await.unwrap()), "2Gi");
}
