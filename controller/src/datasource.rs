//! Claims with a data source: which other claim a new volume is cloned from, checked by
//! the rules the external-provisioner applies to PVC clones, or which `nfsprov.dev`
//! Snapshot it is restored from. A source claim must be in the same namespace and class,
//! Bound to a volume this provisioner made, on an agent the class allows, and the new
//! claim at least as large; a snapshot must be of the same namespace, ready, on an agent
//! the class allows, and no larger than the claim. A claim annotated with an archive
//! (`archive_restore`) is made from it where the archive is of the claim's own namespace,
//! on an agent the class allows, and no larger than the claim. The agent does the copy
//! next to the data, so no byte crosses the network.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use nfsprov_api_types::{ErrorCode, SnapshotName, VolumePath};
use nfsprov_vocabulary::archive_restore::{self, ArchiveSource};
use nfsprov_vocabulary::quantity;
use nfsprov_vocabulary::snapshots::{self, Snapshot};

use crate::agents::Agent;
use crate::context::Context;
use crate::objects::{claim_class, is_ours, requested, volume_name};

const CLAIM_KIND: &str = "PersistentVolumeClaim";

/// The claim a new claim asks to be cloned from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SourceClaim {
    pub(crate) namespace: String,
    pub(crate) name: String,
}

impl std::fmt::Display for SourceClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The Snapshot a new claim asks to be restored from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SourceSnapshot {
    pub(crate) namespace: String,
    pub(crate) name: String,
}

impl std::fmt::Display for SourceSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What a claim's data source names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Requested {
    Claim(SourceClaim),
    Snapshot(SourceSnapshot),
    /// Named by the claim's annotations, not its data source: an archive id is no object
    /// name, and the data source path wants a kind.
    Archive(ArchiveSource),
}

impl std::fmt::Display for Requested {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Requested::Claim(claim) => write!(f, "claim {claim}"),
            Requested::Snapshot(snapshot) => write!(f, "snapshot {snapshot}"),
            Requested::Archive(archive) => write!(f, "archive {archive}"),
        }
    }
}

/// A ready snapshot, where the restore is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReadySnapshot {
    pub(crate) snapshot: SourceSnapshot,
    pub(crate) agent: String,
    /// The snapshot's name on its agent.
    pub(crate) name: SnapshotName,
}

/// The source's volume, where the clone is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SourceVolume {
    pub(crate) claim: SourceClaim,
    pub(crate) agent: String,
    pub(crate) path: VolumePath,
}

/// Why a claim cannot be cloned from its source (yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SourceProblem {
    pub(crate) message: String,
    /// The source may still come right by itself (it is created, or binds); otherwise
    /// only a change of the claim can help.
    pub(crate) may_resolve: bool,
}

impl SourceProblem {
    fn permanent(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            may_resolve: false,
        }
    }

    fn waiting(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            may_resolve: true,
        }
    }
}

/// The claim's data source, when it has one: `dataSourceRef` where set (it is the
/// newer field and may name a namespace), else `dataSource`. Only claims and `nfsprov.dev`
/// Snapshots of the same namespace can be sources; other kinds are refused.
pub(crate) fn requested_source(
    pvc: &PersistentVolumeClaim,
) -> Result<Option<Requested>, SourceProblem> {
    let archive = archive_restore::requested(pvc.metadata.annotations.as_ref())
        .map_err(SourceProblem::permanent)?;
    let Some(spec) = pvc.spec.as_ref() else {
        return Ok(archive.map(Requested::Archive));
    };
    if let Some(archive) = archive {
        if spec.data_source.is_some() || spec.data_source_ref.is_some() {
            return Err(SourceProblem::permanent(format!(
                "the claim names archive {archive} in its annotations and a dataSource too: a volume is made from one source; remove spec.dataSource/dataSourceRef or the archive annotations"
            )));
        }
        return Ok(Some(Requested::Archive(archive)));
    }
    let namespace = pvc.namespace().unwrap_or_default();
    let (kind, group, name, other_namespace) = match (&spec.data_source_ref, &spec.data_source) {
        (Some(r), _) => (
            &r.kind,
            r.api_group.as_deref(),
            &r.name,
            r.namespace.as_deref(),
        ),
        (None, Some(s)) => (&s.kind, s.api_group.as_deref(), &s.name, None),
        (None, None) => return Ok(None),
    };
    let is_snapshot = kind == snapshots::SNAPSHOT_KIND && group == Some(snapshots::GROUP);
    if !is_snapshot && (kind != CLAIM_KIND || group.is_some_and(|g| !g.is_empty())) {
        let group = group.filter(|g| !g.is_empty()).unwrap_or("core");
        return Err(SourceProblem::permanent(format!(
            "dataSource of kind {kind} (API group {group}) is not supported: this provisioner clones PersistentVolumeClaims and restores {} Snapshots only; use one of the same namespace as the data source, or remove spec.dataSource/dataSourceRef",
            snapshots::GROUP
        )));
    }
    if let Some(other) = other_namespace.filter(|ns| *ns != namespace) {
        let what = if is_snapshot { "snapshot" } else { "claim" };
        return Err(SourceProblem::permanent(format!(
            "dataSourceRef names {what} {other}/{name} in another namespace: a volume is made only from a source of its own namespace; use a {what} of namespace {namespace}"
        )));
    }
    let name = name.clone();
    Ok(Some(if is_snapshot {
        Requested::Snapshot(SourceSnapshot { namespace, name })
    } else {
        Requested::Claim(SourceClaim { namespace, name })
    }))
}

/// Whether the claim asks to be restored from the Snapshot `name` of its namespace.
pub(crate) fn restores_from(pvc: &PersistentVolumeClaim, name: &str) -> bool {
    matches!(requested_source(pvc), Ok(Some(Requested::Snapshot(s))) if s.name == name)
}

/// Checks the snapshot a claim is restored from: it must exist, be ready (both may come
/// right by themselves) and be no larger than the claim (which only the claim can cure).
pub(crate) async fn resolve_snapshot(
    ctx: &Context,
    source: &SourceSnapshot,
    requested_bytes: u64,
) -> Result<ReadySnapshot, SourceProblem> {
    let api = Api::<Snapshot>::namespaced(ctx.client.clone(), &source.namespace);
    let snapshot = api
        .get_opt(&source.name)
        .await
        .map_err(|e| SourceProblem::waiting(format!("cannot read the snapshot {source}: {e}")))?;
    let Some(snapshot) = snapshot else {
        return Err(SourceProblem::waiting(format!(
            "the snapshot {source} does not exist (yet); the volume is restored once it exists and is ready"
        )));
    };
    check_snapshot(&snapshot, source, requested_bytes)
}

fn check_snapshot(
    snapshot: &Snapshot,
    source: &SourceSnapshot,
    requested_bytes: u64,
) -> Result<ReadySnapshot, SourceProblem> {
    if snapshot.metadata.deletion_timestamp.is_some() {
        return Err(SourceProblem::permanent(format!(
            "the snapshot {source} is being deleted"
        )));
    }
    let status = snapshot.status.clone().unwrap_or_default();
    let (Some(agent), Some(name), true) = (status.agent, status.snapshot_name, snapshot.ready())
    else {
        let why = status.error.map(|e| format!(": {e}")).unwrap_or_default();
        return Err(SourceProblem::waiting(format!(
            "the snapshot {source} is not ready yet{why}; the volume is restored once it is"
        )));
    };
    let name = SnapshotName::parse(&name).map_err(|e| {
        SourceProblem::permanent(format!(
            "the snapshot {source} records an invalid agent snapshot name: {e}"
        ))
    })?;
    let restore_bytes = status
        .restore_size
        .as_ref()
        .and_then(quantity::bytes)
        .unwrap_or(0);
    if requested_bytes < restore_bytes {
        return Err(SourceProblem::permanent(format!(
            "this claim requests {requested_bytes} bytes, less than the {restore_bytes} bytes of its snapshot {source}: a restored volume must be at least as large as its snapshot"
        )));
    }
    Ok(ReadySnapshot {
        snapshot: source.clone(),
        agent,
        name,
    })
}

/// Checks the archive a claim of `namespace` is made from, on its agent: the agent must
/// restore archives (an older one is only cured by an upgrade), the archive must exist (an
/// agent that does not answer may yet), be of the claim's namespace and fit in
/// `requested_bytes` (which only a change of the claim can cure).
pub(crate) async fn resolve_archive(
    agent: &Agent,
    source: &ArchiveSource,
    namespace: &str,
    requested_bytes: u64,
    request_id: &str,
) -> Result<(), SourceProblem> {
    let unanswered = |e: &dyn std::fmt::Display| {
        SourceProblem::waiting(format!(
            "cannot read archive {source}: {e}; the volume is made once the agent answers"
        ))
    };
    let capabilities = agent
        .capabilities(request_id)
        .await
        .map_err(|e| unanswered(&e))?;
    archive_restore::check_agent(source, &capabilities).map_err(SourceProblem::permanent)?;
    let archive = match agent
        .client()
        .get_archive(&source.id, Some(request_id))
        .await
    {
        Ok(archive) => archive,
        Err(e) if e.code() == Some(ErrorCode::NotFound) => {
            return Err(SourceProblem::permanent(format!(
                "archive {source} does not exist: agent {} has no archive {} (kubectl nfsprov archives lists them)",
                source.agent, source.id
            )));
        }
        Err(e) => return Err(unanswered(&e)),
    };
    archive_restore::check_namespace(source, &archive, namespace)
        .and_then(|()| archive_restore::check_capacity(source, &archive, requested_bytes))
        .map_err(SourceProblem::permanent)
}

/// Checks the source claim and finds its volume. `class_name` and `requested_bytes` are
/// the new claim's.
pub(crate) async fn resolve(
    ctx: &Context,
    source: &SourceClaim,
    class_name: &str,
    requested_bytes: u64,
) -> Result<SourceVolume, SourceProblem> {
    let api = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &source.namespace);
    let claim = api.get_opt(&source.name).await.map_err(|e| {
        SourceProblem::waiting(format!("cannot read the source claim {source}: {e}"))
    })?;
    let Some(claim) = claim else {
        return Err(SourceProblem::waiting(format!(
            "the source claim {source} does not exist (yet); the clone is made once it exists and is Bound"
        )));
    };
    check_source_claim(&claim, source, class_name, requested_bytes)?;
    claim_volume(ctx, &claim, source)
}

/// The volume of this provisioner a Bound claim is bound to, with its agent and path.
pub(crate) fn claim_volume(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    source: &SourceClaim,
) -> Result<SourceVolume, SourceProblem> {
    let volume_name = volume_name(claim).unwrap_or_default().to_owned();
    let Some(volume) = ctx.volumes.get(&ObjectRef::new(&volume_name)) else {
        return Err(SourceProblem::waiting(format!(
            "the source claim {source} is bound to PersistentVolume {volume_name}, which this controller has not seen (yet)"
        )));
    };
    if !is_ours(&volume, &ctx.provisioner) {
        return Err(SourceProblem::permanent(format!(
            "the source claim {source} is bound to PersistentVolume {volume_name}, which was not provisioned by {}; only volumes of this provisioner can be cloned or snapshotted",
            ctx.provisioner.own()
        )));
    }
    let (Some(agent), Some(path)) = (
        volume.recorded.agent.as_deref(),
        volume.recorded.path.as_deref(),
    ) else {
        return Err(SourceProblem::permanent(format!(
            "PersistentVolume {volume_name} of the source claim {source} does not record its agent and path (made by an old version, or edited); it cannot be cloned or snapshotted"
        )));
    };
    let path = VolumePath::parse(path).map_err(|e| {
        SourceProblem::permanent(format!(
            "PersistentVolume {volume_name} of the source claim {source} records an invalid path: {e}"
        ))
    })?;
    Ok(SourceVolume {
        claim: source.clone(),
        agent: agent.to_owned(),
        path,
    })
}

/// The external-provisioner's checks of the source claim itself.
fn check_source_claim(
    claim: &PersistentVolumeClaim,
    source: &SourceClaim,
    class_name: &str,
    requested_bytes: u64,
) -> Result<(), SourceProblem> {
    if claim.metadata.deletion_timestamp.is_some() {
        return Err(SourceProblem::permanent(format!(
            "the source claim {source} is being deleted"
        )));
    }
    let source_class = claim_class(claim).unwrap_or_default();
    if source_class != class_name {
        return Err(SourceProblem::permanent(format!(
            "the source claim {source} is of StorageClass {source_class:?}, this claim of {class_name:?}: a clone must be of its source's class"
        )));
    }
    let phase = claim
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending");
    if phase != "Bound" || volume_name(claim).is_none() {
        return Err(SourceProblem::waiting(format!(
            "the source claim {source} is {phase}, not Bound; the clone is made once it is"
        )));
    }
    let source_bytes = requested(claim)
        .and_then(|q| quantity::parse_bytes(&q.0).ok())
        .unwrap_or(0);
    if requested_bytes < source_bytes {
        return Err(SourceProblem::permanent(format!(
            "this claim requests {requested_bytes} bytes, less than the {source_bytes} bytes of its source claim {source}: a clone must be at least as large as its source"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        PersistentVolumeClaimSpec, PersistentVolumeClaimStatus, TypedLocalObjectReference,
        TypedObjectReference, VolumeResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use std::collections::BTreeMap;

    fn claim(class: &str, size: &str, phase: &str) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("src".into()),
                namespace: Some("team".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                storage_class_name: Some(class.into()),
                volume_name: (phase == "Bound").then(|| "pvc-1".into()),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([("storage".into(), Quantity(size.into()))])),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: Some(PersistentVolumeClaimStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
        }
    }

    fn source() -> SourceClaim {
        SourceClaim {
            namespace: "team".into(),
            name: "src".into(),
        }
    }

    #[test]
    fn data_source_ref_wins_and_only_claims_of_the_namespace_are_accepted() {
        let mut pvc = claim("nfs", "1Gi", "Pending");
        assert_eq!(requested_source(&pvc), Ok(None));
        let spec = pvc.spec.as_mut().unwrap();
        spec.data_source = Some(TypedLocalObjectReference {
            kind: "PersistentVolumeClaim".into(),
            name: "old".into(),
            api_group: None,
        });
        spec.data_source_ref = Some(TypedObjectReference {
            kind: "PersistentVolumeClaim".into(),
            name: "new".into(),
            api_group: Some(String::new()),
            namespace: Some("team".into()),
        });
        assert_eq!(
            requested_source(&pvc).unwrap().unwrap().to_string(),
            "claim team/new",
            "dataSourceRef is the newer field"
        );
        pvc.spec
            .as_mut()
            .unwrap()
            .data_source_ref
            .as_mut()
            .unwrap()
            .namespace = Some("other".into());
        let problem = requested_source(&pvc).unwrap_err();
        assert!(!problem.may_resolve);
        assert!(problem.message.contains("another namespace"), "{problem:?}");
        let spec = pvc.spec.as_mut().unwrap();
        spec.data_source_ref = None;
        spec.data_source = Some(TypedLocalObjectReference {
            kind: "VolumeSnapshot".into(),
            name: "snap".into(),
            api_group: Some("snapshot.storage.k8s.io".into()),
        });
        let problem = requested_source(&pvc).unwrap_err();
        assert!(
            problem.message.contains(
                "kind VolumeSnapshot (API group snapshot.storage.k8s.io) is not supported"
            ),
            "{problem:?}"
        );
    }

    #[test]
    fn the_source_must_be_bound_of_the_same_class_not_larger_and_not_deleting() {
        assert_eq!(
            check_source_claim(&claim("nfs", "1Gi", "Bound"), &source(), "nfs", 1 << 30),
            Ok(())
        );
        let waiting =
            check_source_claim(&claim("nfs", "1Gi", "Pending"), &source(), "nfs", 1 << 30)
                .unwrap_err();
        assert!(waiting.may_resolve, "a Pending source may still bind");
        assert!(
            waiting.message.contains("is Pending, not Bound"),
            "{waiting:?}"
        );
        let class = check_source_claim(&claim("fast", "1Gi", "Bound"), &source(), "nfs", 1 << 30)
            .unwrap_err();
        assert!(!class.may_resolve);
        assert!(
            class.message.contains("must be of its source's class"),
            "{class:?}"
        );
        let small = check_source_claim(&claim("nfs", "2Gi", "Bound"), &source(), "nfs", 1 << 30)
            .unwrap_err();
        assert!(!small.may_resolve);
        assert!(small.message.contains("at least as large"), "{small:?}");
        let mut deleting = claim("nfs", "1Gi", "Bound");
        deleting.metadata.deletion_timestamp = Some(Time(Default::default()));
        let deleting = check_source_claim(&deleting, &source(), "nfs", 1 << 30).unwrap_err();
        assert!(deleting.message.contains("being deleted"), "{deleting:?}");
    }

    #[test]
    fn archive_annotations_name_a_source_but_never_beside_a_data_source() {
        use nfsprov_vocabulary::names::{ANN_RESTORE_ARCHIVE, ANN_RESTORE_ARCHIVE_AGENT};
        let id = "team/old/@20260101T000000.000000000Z";
        let mut pvc = claim("nfs", "1Gi", "Pending");
        pvc.metadata.annotations = Some(BTreeMap::from([
            (ANN_RESTORE_ARCHIVE.to_owned(), id.to_owned()),
            (ANN_RESTORE_ARCHIVE_AGENT.to_owned(), "nfs1".to_owned()),
        ]));
        let Ok(Some(Requested::Archive(archive))) = requested_source(&pvc) else {
            panic!("{:?}", requested_source(&pvc));
        };
        assert_eq!(archive.to_string(), format!("nfs1:{id}"));
        pvc.spec.as_mut().unwrap().data_source = Some(TypedLocalObjectReference {
            kind: "PersistentVolumeClaim".into(),
            name: "other".into(),
            api_group: None,
        });
        let both = requested_source(&pvc).unwrap_err();
        assert!(!both.may_resolve);
        assert!(both.message.contains("and a dataSource too"), "{both:?}");
        pvc.spec.as_mut().unwrap().data_source = None;
        pvc.metadata
            .annotations
            .as_mut()
            .unwrap()
            .remove(ANN_RESTORE_ARCHIVE_AGENT);
        let half = requested_source(&pvc).unwrap_err();
        assert!(!half.may_resolve);
        assert!(half.message.contains("names no agent"), "{half:?}");
    }

    #[test]
    fn a_snapshot_of_the_namespace_is_a_source_and_must_be_ready_and_fit() {
        let mut pvc = claim("nfs", "1Gi", "Pending");
        pvc.spec.as_mut().unwrap().data_source_ref = Some(TypedObjectReference {
            kind: "Snapshot".into(),
            name: "nightly".into(),
            api_group: Some("nfsprov.dev".into()),
            namespace: None,
        });
        let source = SourceSnapshot {
            namespace: "team".into(),
            name: "nightly".into(),
        };
        assert_eq!(
            requested_source(&pvc),
            Ok(Some(Requested::Snapshot(source.clone())))
        );
        let mut snapshot: Snapshot = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "nightly", "namespace": "team"},
            "spec": {"source": {"persistentVolumeClaimName": "data"}},
            "status": {"readyToUse": false, "agent": "nfs1", "snapshotName": "snap-1"},
        }))
        .unwrap();
        let waiting = check_snapshot(&snapshot, &source, 1 << 30).unwrap_err();
        assert!(waiting.may_resolve, "{waiting:?}");
        assert!(waiting.message.contains("not ready yet"), "{waiting:?}");
        let status = snapshot.status.as_mut().unwrap();
        status.ready_to_use = Some(true);
        status.restore_size = Some(Quantity("2Gi".into()));
        let large = check_snapshot(&snapshot, &source, 1 << 30).unwrap_err();
        assert!(!large.may_resolve);
        assert!(
            large.message.contains("at least as large as its snapshot"),
            "{large:?}"
        );
        let ready = check_snapshot(&snapshot, &source, 2 << 30).unwrap();
        assert_eq!(
            (ready.agent.as_str(), ready.name.as_str()),
            ("nfs1", "snap-1")
        );
        let elsewhere = TypedObjectReference {
            namespace: Some("other".into()),
            ..pvc.spec.as_ref().unwrap().data_source_ref.clone().unwrap()
        };
        pvc.spec.as_mut().unwrap().data_source_ref = Some(elsewhere);
        let problem = requested_source(&pvc).unwrap_err();
        assert!(
            problem
                .message
                .contains("snapshot other/nightly in another namespace"),
            "{problem:?}"
        );
    }
}
