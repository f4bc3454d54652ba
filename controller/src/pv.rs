//! The construction of the PersistentVolume for a provisioned claim.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    NFSVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use nfsprov_api_types::{CloneMethod, NfsExport, QuotaPolicy, VolumePath};
use nfsprov_vocabulary::params::OnDelete;

use crate::objects::{
    ANN_AGENT, ANN_ARCHIVE_RETENTION_DAYS, ANN_CLONE_METHOD, ANN_CLONED_FROM, ANN_ON_DELETE,
    ANN_PATH, ANN_PROVISIONED_BY, ANN_QUOTA, FINALIZER, RECLAIM_DELETE, class_reclaim_policy,
};

/// `spec.nfs.path` for a volume: the export root as clients mount it, then the volume path.
pub(crate) fn nfs_path(export_root: &str, path: &VolumePath) -> String {
    let root = export_root.trim_end_matches('/');
    format!("{root}/{path}")
}

/// Everything that goes into a new PV.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewVolume<'a> {
    pub(crate) pvc: &'a PersistentVolumeClaim,
    pub(crate) class: &'a StorageClass,
    pub(crate) class_name: &'a str,
    pub(crate) provisioner: &'a str,
    pub(crate) pv_name: &'a str,
    pub(crate) agent: &'a str,
    pub(crate) path: &'a VolumePath,
    pub(crate) on_delete: OnDelete,
    pub(crate) quota: QuotaPolicy,
    pub(crate) archive_retention_days: Option<u32>,
    pub(crate) export: &'a NfsExport,
    /// The path of the volume's own export as the agent reported it, when the agent
    /// gave it an opaque one (ganesha's pseudo path): mounted instead of the export
    /// root's path and the volume path, which would show the namespace and claim.
    pub(crate) export_path: Option<&'a str>,
    pub(crate) capacity: &'a Quantity,
    /// The claim (`namespace/name`) it was cloned from, and how.
    pub(crate) cloned_from: Option<(&'a str, CloneMethod)>,
}

/// Builds the PV bound to the claim, as sig-storage-lib-external-provisioner does, plus our
/// annotations recording where the data is.
pub(crate) fn build_pv(v: &NewVolume<'_>) -> PersistentVolume {
    let reclaim = class_reclaim_policy(v.class).to_owned();
    let mut annotations = BTreeMap::from([
        (ANN_PROVISIONED_BY.to_owned(), v.provisioner.to_owned()),
        (ANN_AGENT.to_owned(), v.agent.to_owned()),
        (ANN_PATH.to_owned(), v.path.to_string()),
        (ANN_ON_DELETE.to_owned(), v.on_delete.to_string()),
        (ANN_QUOTA.to_owned(), v.quota.to_string()),
    ]);
    if let Some(days) = v.archive_retention_days {
        annotations.insert(ANN_ARCHIVE_RETENTION_DAYS.to_owned(), days.to_string());
    }
    if let Some((claim, method)) = v.cloned_from {
        annotations.insert(ANN_CLONED_FROM.to_owned(), claim.to_owned());
        annotations.insert(ANN_CLONE_METHOD.to_owned(), method.to_string());
    }
    let finalizers = (reclaim == RECLAIM_DELETE).then(|| vec![FINALIZER.to_owned()]);
    let claim_spec = v.pvc.spec.as_ref();
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(v.pv_name.to_owned()),
            annotations: Some(annotations),
            finalizers,
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: claim_spec.and_then(|s| s.access_modes.clone()),
            capacity: Some(BTreeMap::from([("storage".to_owned(), v.capacity.clone())])),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("PersistentVolumeClaim".to_owned()),
                namespace: v.pvc.metadata.namespace.clone(),
                name: v.pvc.metadata.name.clone(),
                uid: v.pvc.metadata.uid.clone(),
                resource_version: v.pvc.metadata.resource_version.clone(),
                ..ObjectReference::default()
            }),
            mount_options: v.class.mount_options.clone(),
            nfs: Some(NFSVolumeSource {
                server: v.export.server.clone(),
                path: match v.export_path {
                    Some(reported) => reported.to_owned(),
                    None => nfs_path(&v.export.path, v.path),
                },
                read_only: None,
            }),
            persistent_volume_reclaim_policy: Some(reclaim),
            storage_class_name: Some(v.class_name.to_owned()),
            volume_mode: claim_spec.and_then(|s| s.volume_mode.clone()),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::*;
    use k8s_openapi::api::core::v1::{PersistentVolumeClaimSpec, VolumeResourceRequirements};
    use serde_json::json;

    fn claim() -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data".into()),
                namespace: Some("team-a".into()),
                uid: Some("1234".into()),
                resource_version: Some("77".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteMany".into()]),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([("storage".into(), Quantity("5Gi".into()))])),
                    ..Default::default()
                }),
                storage_class_name: Some("nfs".into()),
                volume_mode: Some("Filesystem".into()),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn class(reclaim: Option<&str>) -> StorageClass {
        StorageClass {
            metadata: ObjectMeta {
                name: Some("nfs".into()),
                ..ObjectMeta::default()
            },
            provisioner: "nfsprov.dev/nfs".into(),
            reclaim_policy: reclaim.map(str::to_owned),
            mount_options: Some(vec!["nfsvers=4.1".into(), "hard".into()]),
            ..StorageClass::default()
        }
    }

    fn build(class: &StorageClass, on_delete: OnDelete, root: &str) -> serde_json::Value {
        build_with_retention(class, on_delete, root, None, None)
    }

    fn build_with_retention(
        class: &StorageClass,
        on_delete: OnDelete,
        root: &str,
        archive_retention_days: Option<u32>,
        export_path: Option<&str>,
    ) -> serde_json::Value {
        let pvc = claim();
        let path = VolumePath::parse("team-a/data").unwrap();
        let export = NfsExport {
            server: "nfs1.example".into(),
            path: root.into(),
        };
        let pv = build_pv(&NewVolume {
            pvc: &pvc,
            class,
            class_name: "nfs",
            provisioner: "nfsprov.dev/nfs",
            pv_name: "pvc-1234",
            agent: "nfs1",
            path: &path,
            on_delete,
            quota: QuotaPolicy::Enforce,
            archive_retention_days,
            export: &export,
            export_path,
            capacity: &Quantity("5Gi".into()),
            cloned_from: None,
        });
        serde_json::to_value(pv).unwrap()
    }

    #[test]
    fn delete_class_gives_the_library_pv_with_our_annotations() {
        let pv = build(&class(None), OnDelete::Archive, "/srv/nfs/");
        assert_eq!(
            pv,
            json!({
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {
                    "name": "pvc-1234",
                    "annotations": {
                        "pv.kubernetes.io/provisioned-by": "nfsprov.dev/nfs",
                        "nfsprov.dev/agent": "nfs1",
                        "nfsprov.dev/path": "team-a/data",
                        "nfsprov.dev/on-delete": "archive",
                        "nfsprov.dev/quota": "enforce",
                    },
                    "finalizers": ["external-provisioner.volume.kubernetes.io/finalizer"],
                },
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "capacity": {"storage": "5Gi"},
                    "claimRef": {
                        "apiVersion": "v1",
                        "kind": "PersistentVolumeClaim",
                        "namespace": "team-a",
                        "name": "data",
                        "uid": "1234",
                        "resourceVersion": "77",
                    },
                    "mountOptions": ["nfsvers=4.1", "hard"],
                    "nfs": {"server": "nfs1.example", "path": "/srv/nfs/team-a/data"},
                    "persistentVolumeReclaimPolicy": "Delete",
                    "storageClassName": "nfs",
                    "volumeMode": "Filesystem",
                }
            })
        );
    }

    #[test]
    fn the_archive_retention_is_recorded_only_when_the_class_sets_one() {
        let pv = build_with_retention(&class(None), OnDelete::Archive, "/srv/nfs", Some(30), None);
        assert_eq!(
            pv["metadata"]["annotations"]["nfsprov.dev/archive-retention-days"],
            "30"
        );
        let pv = build(&class(None), OnDelete::Archive, "/srv/nfs");
        assert!(pv["metadata"]["annotations"]["nfsprov.dev/archive-retention-days"].is_null());
    }

    #[test]
    fn an_opaque_export_is_mounted_by_the_path_the_agent_reported() {
        let reported = "/srv/nfs/0123456789abcdef0123456789abcdef";
        let pv = build_with_retention(
            &class(None),
            OnDelete::Archive,
            "/srv/nfs",
            None,
            Some(reported),
        );
        assert_eq!(pv["spec"]["nfs"]["path"], reported);
        // Where the data is stays in the annotation, for everything that acts on it.
        assert_eq!(
            pv["metadata"]["annotations"]["nfsprov.dev/path"],
            "team-a/data"
        );
    }

    #[test]
    fn retain_class_has_no_finalizer() {
        let pv = build(&class(Some("Retain")), OnDelete::Delete, "/");
        assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Retain");
        assert!(pv["metadata"].get("finalizers").is_none());
        assert_eq!(pv["spec"]["nfs"]["path"], "/team-a/data");
        assert_eq!(
            pv["metadata"]["annotations"]["nfsprov.dev/on-delete"],
            "delete"
        );
    }

    #[test]
    fn claim_helpers() {
        let mut pvc = claim();
        assert_eq!(claim_class(&pvc), Some("nfs"));
        assert_eq!(claim_provisioner(&pvc), None);
        pvc.metadata.annotations = Some(BTreeMap::from([
            (ANN_BETA_STORAGE_CLASS.into(), "legacy".into()),
            (ANN_BETA_STORAGE_PROVISIONER.into(), "old".into()),
        ]));
        assert_eq!(claim_class(&pvc), Some("legacy"));
        assert_eq!(claim_provisioner(&pvc), Some("old"));
        pvc.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANN_STORAGE_PROVISIONER.into(), "new".into());
        assert_eq!(claim_provisioner(&pvc), Some("new"));
        assert_eq!(pv_name_for("abc"), "pvc-abc");
    }
}
