//! The objects the controller works on (claims, classes and the cached form of volumes):
//! the names and annotations it reads and writes, and every predicate over them, once.
//! The names themselves are shared with the kubectl plugin and defined in
//! `nfsprov-vocabulary`; they are re-exported here so the predicates and the names they
//! read stay one import away.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ObjectReference, PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::{ClusterResourceScope, NamespaceResourceScope};
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use nfsprov_vocabulary::quantity::bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};

pub(crate) use nfsprov_vocabulary::names::{
    ANN_AGENT, ANN_ARCHIVE_RETENTION_DAYS, ANN_BETA_STORAGE_CLASS, ANN_BETA_STORAGE_PROVISIONER,
    ANN_CLONE_METHOD, ANN_CLONED_FROM, ANN_ON_DELETE, ANN_PATH, ANN_PROVISIONED_BY, ANN_QUOTA,
    ANN_SELECTED_NODE, ANN_STORAGE_PROVISIONER, FINALIZER, RECLAIM_DELETE, RECLAIM_RETAIN, STORAGE,
    pv_name_for,
};

/// The claim's class: the beta annotation wins over `spec.storageClassName`, as in
/// Kubernetes' own helper.
pub(crate) fn claim_class(pvc: &impl ClaimParts) -> Option<&str> {
    pvc.claim_annotation(ANN_BETA_STORAGE_CLASS)
        .or_else(|| pvc.claim_spec()?.storage_class_name.as_deref())
        .filter(|c| !c.is_empty())
}

/// Whether the claim names its volume (the binder sets it; provisioning is then over).
pub(crate) fn claim_is_bound(pvc: &impl ClaimParts) -> bool {
    volume_name(pvc).is_some()
}

/// `namespace/name`, for logs.
pub(crate) fn claim_key(pvc: &impl ClaimParts) -> String {
    let namespace = pvc.claim_meta().namespace.as_deref().unwrap_or_default();
    let name = pvc.claim_meta().name.as_deref().unwrap_or_default();
    format!("{namespace}/{name}")
}

/// The provisioner the PV controller asked to act on the claim.
pub(crate) fn claim_provisioner(pvc: &impl ClaimParts) -> Option<&str> {
    pvc.claim_annotation(ANN_STORAGE_PROVISIONER)
        .or_else(|| pvc.claim_annotation(ANN_BETA_STORAGE_PROVISIONER))
}

/// The class's reclaim policy; Kubernetes defaults it to Delete.
pub(crate) fn class_reclaim_policy(class: &StorageClass) -> &str {
    class.reclaim_policy.as_deref().unwrap_or(RECLAIM_DELETE)
}

/// `pvc/namespace/name`: the claim's key among per-object state such as backoff.
pub(crate) fn claim_state_key(pvc: &impl ClaimParts) -> String {
    format!("pvc/{}", claim_key(pvc))
}

/// `pv/name`: the volume's key among per-object state such as backoff.
pub(crate) fn volume_state_key(pv: &CachedVolume) -> String {
    format!("pv/{}", pv.name_any())
}

/// The storage entry of a resource map.
pub(crate) fn storage_of(map: Option<&BTreeMap<String, Quantity>>) -> Option<&Quantity> {
    map?.get(STORAGE)
}

pub(crate) fn requested(pvc: &impl ClaimParts) -> Option<&Quantity> {
    storage_of(pvc.claim_spec()?.resources.as_ref()?.requests.as_ref())
}

pub(crate) fn status_capacity(pvc: &impl ClaimParts) -> Option<&Quantity> {
    storage_of(pvc.claim_status()?.capacity.as_ref())
}

pub(crate) fn allocated(pvc: &impl ClaimParts) -> Option<&Quantity> {
    storage_of(pvc.claim_status()?.allocated_resources.as_ref())
}

pub(crate) fn resize_status(pvc: &impl ClaimParts) -> Option<&str> {
    pvc.claim_status()?
        .allocated_resource_statuses
        .as_ref()?
        .get(STORAGE)
        .map(String::as_str)
}

/// The volume the claim is bound to (the binder sets it; provisioning is then over).
pub(crate) fn volume_name(pvc: &impl ClaimParts) -> Option<&str> {
    pvc.bound_volume_name().filter(|v| !v.is_empty())
}

/// Whether a bound claim asks for more than it has, or carries resize state: the claim cache
/// keeps such claims whole, because expansion reads their request, class and status.
pub(crate) fn resize_in_play(pvc: &impl ClaimParts) -> bool {
    if volume_name(pvc).is_none() {
        return false;
    }
    if resize_status(pvc).is_some() {
        return true;
    }
    // Without a status capacity the claim is not Bound yet, and its status update (which
    // brings the capacity) triggers another look.
    match (
        requested(pvc).and_then(bytes),
        status_capacity(pvc).and_then(bytes),
    ) {
        (Some(request), Some(capacity)) => request > capacity,
        _ => false,
    }
}

/// What the claim predicates read, from a whole claim or from the claim cache's form.
pub(crate) trait ClaimParts {
    fn claim_meta(&self) -> &ObjectMeta;
    fn claim_spec(&self) -> Option<&PersistentVolumeClaimSpec>;
    fn claim_status(&self) -> Option<&PersistentVolumeClaimStatus>;
    /// `spec.volumeName`, as the binder set it.
    fn bound_volume_name(&self) -> Option<&str> {
        self.claim_spec()?.volume_name.as_deref()
    }
    /// One annotation's value.
    fn claim_annotation(&self, key: &str) -> Option<&str> {
        self.claim_meta()
            .annotations
            .as_ref()?
            .get(key)
            .map(String::as_str)
    }
}

impl ClaimParts for PersistentVolumeClaim {
    fn claim_meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn claim_spec(&self) -> Option<&PersistentVolumeClaimSpec> {
        self.spec.as_ref()
    }

    fn claim_status(&self) -> Option<&PersistentVolumeClaimStatus> {
        self.status.as_ref()
    }
}

/// A PersistentVolumeClaim as the claim cache holds it. `k8s_openapi`'s claim is 1 kB
/// before any string, spec and status inline; here they are boxed, so a claim whose status
/// the cache dropped (see [`crate::cache::slim_claim`]) does not pay for an empty one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CachedClaim {
    #[serde(default, deserialize_with = "meta_without_managed_fields")]
    pub(crate) metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) spec: Option<Box<PersistentVolumeClaimSpec>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) status: Option<Box<PersistentVolumeClaimStatus>>,
    /// The labels, annotations and storage requests of a claim [`CachedClaim::pack`]ed
    /// for the cache; their maps in `metadata` and `spec` are then `None`.
    #[serde(skip)]
    packed: PackedMaps,
}

/// A claim's maps as sorted pairs. Every non-empty `BTreeMap` holds at least one node
/// with room for eleven entries (540 bytes for string pairs); a pending claim has three
/// such maps of one or two entries, over half of what it cost the cache whole.
#[derive(Debug, Clone, Default, PartialEq)]
struct PackedMaps {
    labels: Option<Pairs>,
    annotations: Option<Pairs>,
    requests: Option<Pairs>,
}

type Pairs = Box<[(Box<str>, Box<str>)]>;

fn pack(map: Option<BTreeMap<String, String>>) -> Option<Pairs> {
    map.map(|map| {
        map.into_iter()
            .map(|(k, v)| (k.into_boxed_str(), v.into_boxed_str()))
            .collect()
    })
}

fn unpack(pairs: &Option<Pairs>) -> Option<BTreeMap<String, String>> {
    pairs.as_ref().map(|pairs| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    })
}

impl CachedClaim {
    /// The claim as the reconcilers read it.
    pub(crate) fn to_claim(&self) -> PersistentVolumeClaim {
        let mut metadata = self.metadata.clone();
        let mut spec = self.spec.as_deref().cloned();
        if self.packed != PackedMaps::default() {
            metadata.labels = unpack(&self.packed.labels);
            metadata.annotations = unpack(&self.packed.annotations);
            if let Some(requests) = unpack(&self.packed.requests) {
                let spec = spec.get_or_insert_with(Default::default);
                spec.resources.get_or_insert_with(Default::default).requests = Some(
                    requests
                        .into_iter()
                        .map(|(k, v)| (k, Quantity(v)))
                        .collect(),
                );
            }
        }
        PersistentVolumeClaim {
            metadata,
            spec,
            status: self.status.as_deref().cloned(),
        }
    }

    /// Moves the labels, annotations and storage requests out of their maps, for a claim
    /// that is read whole only through [`CachedClaim::to_claim`] (an unbound one: the
    /// predicates read its annotations through [`ClaimParts::claim_annotation`], and its
    /// class, name and volume name, which stay where they are).
    pub(crate) fn pack(&mut self) {
        self.packed.labels = pack(self.metadata.labels.take());
        self.packed.annotations = pack(self.metadata.annotations.take());
        let requests = self
            .spec
            .as_mut()
            .and_then(|spec| spec.resources.as_mut())
            .and_then(|resources| resources.requests.take());
        self.packed.requests = pack(requests.map(|requests| {
            requests
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect::<BTreeMap<_, _>>()
        }));
    }
}

impl From<PersistentVolumeClaim> for CachedClaim {
    fn from(pvc: PersistentVolumeClaim) -> Self {
        Self {
            metadata: pvc.metadata,
            spec: pvc.spec.map(Box::new),
            status: pvc.status.map(Box::new),
            packed: PackedMaps::default(),
        }
    }
}

impl ClaimParts for CachedClaim {
    fn claim_meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn claim_annotation(&self, key: &str) -> Option<&str> {
        if let Some(annotations) = &self.metadata.annotations {
            return annotations.get(key).map(String::as_str);
        }
        let pairs = self.packed.annotations.as_ref()?;
        // Packed from a B-tree: sorted by key.
        let at = pairs.binary_search_by(|(k, _)| (**k).cmp(key)).ok()?;
        Some(&pairs[at].1)
    }

    fn claim_spec(&self) -> Option<&PersistentVolumeClaimSpec> {
        self.spec.as_deref()
    }

    fn claim_status(&self) -> Option<&PersistentVolumeClaimStatus> {
        self.status.as_deref()
    }
}

impl Resource for CachedClaim {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("PersistentVolumeClaim")
    }

    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("")
    }

    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }

    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("persistentvolumeclaims")
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A PersistentVolume as the volume cache holds it: read from the same API, but only the
/// fields deletion needs are ever deserialized. `k8s_openapi`'s `PersistentVolume` is
/// 3.4 kB before any string (every volume source is inline), which alone would be 34 MB
/// for 10,000 volumes.
///
/// The annotations this controller reads are moved out of the metadata into
/// `RecordedAnnotations` as the object is decoded, and the rest are dropped:
/// `metadata.annotations` of a `CachedVolume` is always `None`. A map of a PV's six
/// annotations costs about 1 kB (a B-tree node plus a string per key and value), the
/// fields about a quarter of that, and every decode (watch, get, patch answer) gives the
/// same shape, so no reader can look in the wrong place.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(from = "DecodedVolume")]
pub struct CachedVolume {
    pub(crate) metadata: ObjectMeta,
    pub(crate) recorded: RecordedAnnotations,
    pub(crate) spec: Option<CachedVolumeSpec>,
    pub(crate) status: Option<CachedVolumeStatus>,
}

/// The annotations of a PV that this controller reads, each by its constant's name.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct RecordedAnnotations {
    /// [`ANN_PROVISIONED_BY`]
    pub(crate) provisioned_by: Option<Box<str>>,
    /// [`ANN_AGENT`]
    pub(crate) agent: Option<Box<str>>,
    /// [`ANN_PATH`]
    pub(crate) path: Option<Box<str>>,
    /// [`ANN_ON_DELETE`]
    pub(crate) on_delete: Option<Box<str>>,
    /// [`ANN_QUOTA`]
    pub(crate) quota: Option<Box<str>>,
    /// [`ANN_ARCHIVE_RETENTION_DAYS`]
    pub(crate) archive_retention_days: Option<Box<str>>,
}

impl RecordedAnnotations {
    fn take_from(annotations: Option<BTreeMap<String, String>>) -> Self {
        let Some(mut annotations) = annotations else {
            return Self::default();
        };
        let mut take = |key: &str| annotations.remove(key).map(String::into_boxed_str);
        Self {
            provisioned_by: take(ANN_PROVISIONED_BY),
            agent: take(ANN_AGENT),
            path: take(ANN_PATH),
            on_delete: take(ANN_ON_DELETE),
            quota: take(ANN_QUOTA),
            archive_retention_days: take(ANN_ARCHIVE_RETENTION_DAYS),
        }
    }
}

/// `metadata` as the caches decode it: `managedFields` (and the obsolete `selfLink`) are
/// skipped unread. The field managers' trees are most of a watched object's metadata, a
/// JSON value of many small allocations each, that the caches would drop at once; at
/// thousands of watch events a minute they are the bulk of the decoding work and leave
/// the heap fragmented.
fn meta_without_managed_fields<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<ObjectMeta, D::Error> {
    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase", default)]
    struct Meta {
        annotations: Option<BTreeMap<String, String>>,
        creation_timestamp: Option<Time>,
        deletion_grace_period_seconds: Option<i64>,
        deletion_timestamp: Option<Time>,
        finalizers: Option<Vec<String>>,
        generate_name: Option<String>,
        generation: Option<i64>,
        labels: Option<BTreeMap<String, String>>,
        name: Option<String>,
        namespace: Option<String>,
        owner_references: Option<Vec<OwnerReference>>,
        resource_version: Option<String>,
        uid: Option<String>,
    }
    let meta = Meta::deserialize(deserializer)?;
    Ok(ObjectMeta {
        annotations: meta.annotations,
        creation_timestamp: meta.creation_timestamp,
        deletion_grace_period_seconds: meta.deletion_grace_period_seconds,
        deletion_timestamp: meta.deletion_timestamp,
        finalizers: meta.finalizers,
        generate_name: meta.generate_name,
        generation: meta.generation,
        labels: meta.labels,
        managed_fields: None,
        name: meta.name,
        namespace: meta.namespace,
        owner_references: meta.owner_references,
        resource_version: meta.resource_version,
        self_link: None,
        uid: meta.uid,
    })
}

/// A PV as the API sends it, before the annotations are moved out.
#[derive(Deserialize)]
struct DecodedVolume {
    #[serde(default, deserialize_with = "meta_without_managed_fields")]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<CachedVolumeSpec>,
    #[serde(default)]
    status: Option<CachedVolumeStatus>,
}

impl From<DecodedVolume> for CachedVolume {
    fn from(mut decoded: DecodedVolume) -> Self {
        let recorded = RecordedAnnotations::take_from(decoded.metadata.annotations.take());
        Self {
            metadata: decoded.metadata,
            recorded,
            spec: decoded.spec,
            status: decoded.status,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CachedVolumeSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) persistent_volume_reclaim_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) storage_class_name: Option<String>,
    /// The claim a bound volume belongs to: the usage poll labels and warns by it, so the
    /// claim cache need not keep bound claims at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) claim_ref: Option<VolumeClaimRef>,
}

/// `spec.claimRef` of a PV, reduced to what names the claim.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct VolumeClaimRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) uid: Option<String>,
}

impl VolumeClaimRef {
    /// The claim as events refer to it.
    pub(crate) fn object_reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("PersistentVolumeClaim".to_owned()),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            ..ObjectReference::default()
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct CachedVolumeStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) phase: Option<String>,
}

impl Resource for CachedVolume {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("PersistentVolume")
    }

    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("")
    }

    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }

    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("persistentvolumes")
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The provisioner names this controller answers to: its own, then additional ones, as
/// the library's `additionalProvisionerNames` (the name of a provisioner it replaces, so
/// that provisioner's classes and volumes keep working under this controller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provisioners {
    /// Its own name first.
    names: Vec<String>,
}

impl Provisioners {
    pub(crate) fn new(
        own: impl Into<String>,
        additional: impl IntoIterator<Item = String>,
    ) -> Self {
        let mut names = vec![own.into()];
        for name in additional {
            if !names.contains(&name) {
                names.push(name);
            }
        }
        Self { names }
    }

    /// The controller's own name: what the PVs it adopts are marked with.
    pub(crate) fn own(&self) -> &str {
        &self.names[0]
    }

    pub(crate) fn contains(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }
}

impl From<&str> for Provisioners {
    fn from(own: &str) -> Self {
        Self::new(own, [])
    }
}

impl std::fmt::Display for Provisioners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.names.join(", "))
    }
}

/// Whether the PV is this controller's to manage (the only PVs it ever touches): it records
/// the controller's own provisioner name, or an additional one together with the agent
/// and path of this project (made or adopted here). A PV the replaced provisioner made
/// stays that provisioner's until adopted: no finalizer, no deletion, so scaling the old
/// provisioner back up finds its PVs as it left them.
pub(crate) fn is_ours(pv: &CachedVolume, provisioners: &Provisioners) -> bool {
    let recorded = &pv.recorded;
    match recorded.provisioned_by.as_deref() {
        Some(name) if name == provisioners.own() => true,
        Some(name) if provisioners.contains(name) => {
            recorded.agent.is_some() && recorded.path.is_some()
        }
        _ => false,
    }
}

/// Whether our finalizer still holds the PV.
pub(crate) fn has_finalizer(pv: &CachedVolume) -> bool {
    pv.finalizers().iter().any(|f| f == FINALIZER)
}

/// The PV's reclaim policy; absent means Retain (nothing is ever deleted by mistake).
pub(crate) fn reclaim_policy(pv: &CachedVolume) -> &str {
    pv.spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        .unwrap_or(RECLAIM_RETAIN)
}

pub(crate) fn phase(pv: &CachedVolume) -> &str {
    pv.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// The claim a volume is bound to, when its `claimRef` names one.
pub(crate) fn bound_claim_of(pv: &CachedVolume) -> Option<&VolumeClaimRef> {
    let claim = pv.spec.as_ref()?.claim_ref.as_ref()?;
    (claim.namespace.is_some() && claim.name.is_some()).then_some(claim)
}

pub(crate) fn class_name(pv: &CachedVolume) -> &str {
    pv.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .unwrap_or("")
}

/// Sets the object's finalizers to `finalizers`, guarded by the resourceVersion it was read
/// at so another writer's finalizers are never lost (a conflict means: retry with a fresh
/// copy). An object that is gone meanwhile holds nothing any more: that is done, not a
/// failure.
pub(crate) async fn set_finalizers<K>(
    api: &Api<K>,
    object: &K,
    finalizers: &[&str],
) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let patch = serde_json::json!({
        "metadata": {
            "finalizers": finalizers,
            "resourceVersion": object.resource_version(),
        }
    });
    match api
        .patch(
            &object.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
    use serde_json::json;

    use super::*;

    /// Every metadata field set, as the API server sends them.
    fn full_meta() -> ObjectMeta {
        let time: Time = serde_json::from_value(json!("2026-01-02T03:04:05Z")).unwrap();
        let mut annotations = BTreeMap::from([("a".to_owned(), "1".to_owned())]);
        annotations.insert(ANN_PROVISIONED_BY.into(), "example.com/nfs".into());
        ObjectMeta {
            annotations: Some(annotations),
            creation_timestamp: Some(time.clone()),
            deletion_grace_period_seconds: Some(30),
            deletion_timestamp: Some(time),
            finalizers: Some(vec!["kubernetes.io/pvc-protection".into()]),
            generate_name: Some("data-".into()),
            generation: Some(3),
            labels: Some(BTreeMap::from([("app".into(), "db".into())])),
            managed_fields: Some(vec![ManagedFieldsEntry {
                manager: Some("kube-controller-manager".into()),
                fields_v1: Some(
                    serde_json::from_value(json!({"f:spec": {"f:volumeName": {}}})).unwrap(),
                ),
                ..ManagedFieldsEntry::default()
            }]),
            name: Some("data".into()),
            namespace: Some("team-a".into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "apps/v1".into(),
                kind: "StatefulSet".into(),
                name: "db".into(),
                uid: "uid-db".into(),
                ..OwnerReference::default()
            }]),
            resource_version: Some("42".into()),
            self_link: Some("/api/v1/obsolete".into()),
            uid: Some("uid-data".into()),
        }
    }

    fn without_managed_fields(mut meta: ObjectMeta) -> ObjectMeta {
        meta.managed_fields = None;
        meta.self_link = None;
        meta
    }

    #[test]
    fn the_caches_decode_all_metadata_but_the_field_managers() {
        let pvc = PersistentVolumeClaim {
            metadata: full_meta(),
            ..PersistentVolumeClaim::default()
        };
        let claim: CachedClaim =
            serde_json::from_value(serde_json::to_value(&pvc).unwrap()).unwrap();
        assert_eq!(claim.metadata, without_managed_fields(full_meta()));

        let pv = PersistentVolume {
            metadata: full_meta(),
            spec: Some(PersistentVolumeSpec::default()),
            ..PersistentVolume::default()
        };
        let volume: CachedVolume =
            serde_json::from_value(serde_json::to_value(&pv).unwrap()).unwrap();
        let mut expected = without_managed_fields(full_meta());
        // The annotations read are fields of their own; the others are dropped.
        expected.annotations = None;
        assert_eq!(volume.metadata, expected);
        assert_eq!(
            volume.recorded.provisioned_by.as_deref(),
            Some("example.com/nfs")
        );
    }
}
