//! Test objects: classes, claims and volumes as the API or this controller would make them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimCondition,
    PersistentVolumeClaimSpec, PersistentVolumeClaimStatus, PersistentVolumeSpec,
    PersistentVolumeStatus, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::objects;
use crate::objects::CachedVolume;

pub const PROVISIONER: &str = "nfsprov.dev/nfs";
pub const CLAIM_UID: &str = "6b1c8f3e-2d4a-4e5b-9c7d-0a1b2c3d4e5f";
pub const PV_NAME: &str = "pvc-6b1c8f3e-2d4a-4e5b-9c7d-0a1b2c3d4e5f";

pub fn class(name: &str, parameters: &[(&str, &str)]) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        provisioner: PROVISIONER.to_owned(),
        parameters: (!parameters.is_empty()).then(|| {
            parameters
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        }),
        reclaim_policy: Some("Delete".to_owned()),
        volume_binding_mode: Some("Immediate".to_owned()),
        ..StorageClass::default()
    }
}

/// An unbound claim the PV controller has handed to our provisioner.
pub fn claim(class: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".to_owned()),
            namespace: Some("team-a".to_owned()),
            uid: Some(CLAIM_UID.to_owned()),
            resource_version: Some("100".to_owned()),
            annotations: Some(BTreeMap::from([(
                objects::ANN_STORAGE_PROVISIONER.to_owned(),
                PROVISIONER.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteMany".to_owned()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity("1Gi".to_owned()),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            storage_class_name: Some(class.to_owned()),
            volume_mode: Some("Filesystem".to_owned()),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}

/// The cache's view of a PV, as the watcher would decode it from the API.
pub fn cached(volume: PersistentVolume) -> CachedVolume {
    serde_json::from_value(serde_json::to_value(volume).expect("serialize")).expect("decode")
}

/// A released PV as this controller would have made it.
pub fn released_pv(on_delete: Option<&str>, path: &str) -> PersistentVolume {
    let mut annotations = BTreeMap::from([
        (
            objects::ANN_PROVISIONED_BY.to_owned(),
            PROVISIONER.to_owned(),
        ),
        (objects::ANN_AGENT.to_owned(), "nfs1".to_owned()),
        (objects::ANN_PATH.to_owned(), path.to_owned()),
    ]);
    if let Some(policy) = on_delete {
        annotations.insert(objects::ANN_ON_DELETE.to_owned(), policy.to_owned());
    }
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(PV_NAME.to_owned()),
            uid: Some("pv-uid-1".to_owned()),
            resource_version: Some("200".to_owned()),
            annotations: Some(annotations),
            finalizers: Some(vec![
                "kubernetes.io/pv-protection".to_owned(),
                objects::FINALIZER.to_owned(),
            ]),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            persistent_volume_reclaim_policy: Some("Delete".to_owned()),
            storage_class_name: Some("nfs".to_owned()),
            ..PersistentVolumeSpec::default()
        }),
        status: Some(PersistentVolumeStatus {
            phase: Some("Released".to_owned()),
            ..PersistentVolumeStatus::default()
        }),
    }
}

/// A class that allows expansion.
pub fn expandable_class(name: &str, parameters: &[(&str, &str)]) -> StorageClass {
    StorageClass {
        allow_volume_expansion: Some(true),
        ..class(name, parameters)
    }
}

fn storage(quantity: &str) -> BTreeMap<String, Quantity> {
    BTreeMap::from([("storage".to_owned(), Quantity(quantity.to_owned()))])
}

/// The claim of [`claim`] once bound to [`PV_NAME`], asking for `request` and holding
/// `capacity`, as the cache holds it (resourceVersion 300).
pub fn bound_claim(request: &str, capacity: &str) -> PersistentVolumeClaim {
    let mut pvc = claim("nfs");
    pvc.metadata.resource_version = Some("300".to_owned());
    let spec = pvc.spec.as_mut().expect("spec");
    spec.volume_name = Some(PV_NAME.to_owned());
    spec.resources = Some(VolumeResourceRequirements {
        requests: Some(storage(request)),
        ..VolumeResourceRequirements::default()
    });
    pvc.status = Some(PersistentVolumeClaimStatus {
        phase: Some("Bound".to_owned()),
        access_modes: Some(vec!["ReadWriteMany".to_owned()]),
        capacity: Some(storage(capacity)),
        ..PersistentVolumeClaimStatus::default()
    });
    pvc
}

/// `pvc` as the API answers after a status patch: the given resize state and a new
/// resourceVersion.
pub fn with_resize_state(
    mut pvc: PersistentVolumeClaim,
    resource_version: &str,
    allocated: &str,
    state: Option<&str>,
    conditions: &[&str],
) -> PersistentVolumeClaim {
    pvc.metadata.resource_version = Some(resource_version.to_owned());
    let status = pvc.status.get_or_insert_with(Default::default);
    status.allocated_resources = Some(storage(allocated));
    status.allocated_resource_statuses =
        state.map(|s| BTreeMap::from([("storage".to_owned(), s.to_owned())]));
    status.conditions = (!conditions.is_empty()).then(|| {
        conditions
            .iter()
            .map(|type_| PersistentVolumeClaimCondition {
                type_: (*type_).to_owned(),
                status: "True".to_owned(),
                ..PersistentVolumeClaimCondition::default()
            })
            .collect()
    });
    pvc
}

/// The PV of [`bound_claim`], made by this controller: `team-a/data` on agent nfs1.
pub fn bound_pv(capacity: &str, quota: &str) -> PersistentVolume {
    let mut volume = released_pv(Some("delete"), "team-a/data");
    volume
        .metadata
        .annotations
        .as_mut()
        .expect("annotations")
        .insert(objects::ANN_QUOTA.to_owned(), quota.to_owned());
    let spec = volume.spec.as_mut().expect("spec");
    spec.capacity = Some(storage(capacity));
    spec.claim_ref = Some(ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("PersistentVolumeClaim".to_owned()),
        namespace: Some("team-a".to_owned()),
        name: Some("data".to_owned()),
        uid: Some(CLAIM_UID.to_owned()),
        ..ObjectReference::default()
    });
    volume.status = Some(PersistentVolumeStatus {
        phase: Some("Bound".to_owned()),
        ..PersistentVolumeStatus::default()
    });
    volume
}
