//! What the caches keep. Everything the reconcilers never read is dropped before an object
//! is stored, so that tens of thousands of claims and volumes fit in a small pod.

use kube::Resource;
use kube::runtime::watcher::Event;

use crate::objects::{
    CachedClaim, CachedVolume, Provisioners, RecordedAnnotations, claim_is_bound, is_ours,
    resize_in_play,
};

/// Drops server-side bookkeeping no reconciler reads.
pub fn strip_meta<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// Whether a claim is done with: bound, and asking for no resize. Nothing reconciles such a
/// claim again until it asks for more, and its labels and warnings are read from its PV's
/// `claimRef`, so the claim cache need not hold it.
fn claim_is_done(claim: &CachedClaim) -> bool {
    claim_is_bound(claim) && !resize_in_play(claim)
}

/// The claim watch events that reach the claim cache: claims that are done leave it (the
/// store sees a deletion, the controller no change), so 10,000 bound claims cost nothing
/// there. A done claim that asks for more is an update like any other and comes back.
pub fn claim_event(event: Event<CachedClaim>) -> Option<Event<CachedClaim>> {
    match event {
        Event::InitApply(claim) if claim_is_done(&claim) => None,
        Event::Apply(claim) if claim_is_done(&claim) => Some(Event::Delete(claim)),
        other => Some(other),
    }
}

/// Claims: an unbound claim keeps what provisioning reads (labels and annotations feed the
/// pathPattern; the status is not read); a bound one asking for more keeps everything, as
/// expansion reads the request, the class and the status.
pub fn slim_claim(claim: &mut CachedClaim) {
    strip_meta(claim);
    if !resize_in_play(claim) {
        claim.status = None;
    }
}

/// Volumes: deletion reads the provisioner, our annotations, finalizers, reclaim policy,
/// class and phase ([`CachedVolume`] holds nothing else, and its annotations are already
/// reduced to the ones read). Volumes of other provisioners keep none of them: without a
/// recorded provisioner a volume is not ours.
pub fn slim_volume(volume: &mut CachedVolume, provisioners: &Provisioners) {
    strip_meta(volume);
    let ours = is_ours(volume, provisioners);
    let meta = &mut volume.metadata;
    meta.labels = None;
    meta.owner_references = None;
    if !ours {
        meta.finalizers = None;
        volume.recorded = RecordedAnnotations::default();
        if let Some(spec) = volume.spec.as_mut() {
            spec.claim_ref = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::objects::{
        ANN_AGENT, ANN_ARCHIVE_RETENTION_DAYS, ANN_ON_DELETE, ANN_PATH, ANN_PROVISIONED_BY,
        ANN_QUOTA,
    };
    use crate::tests::fixtures::{PROVISIONER, bound_claim, cached, claim, released_pv};

    #[test]
    fn unbound_claims_keep_what_provisioning_reads() {
        let mut pvc = claim("nfs");
        pvc.metadata.labels = Some(BTreeMap::from([("app".into(), "db".into())]));
        pvc.metadata.managed_fields = Some(vec![Default::default()]);
        let before = pvc.clone();
        let mut cached = CachedClaim::from(pvc);
        slim_claim(&mut cached);
        let pvc = cached.to_claim();
        assert_eq!(pvc.metadata.managed_fields, None);
        assert_eq!(pvc.metadata.labels, before.metadata.labels);
        assert_eq!(pvc.metadata.annotations, before.metadata.annotations);
        assert_eq!(pvc.spec, before.spec);
    }

    /// The name of the event's kind and its claim's resource version, to compare events.
    fn seen(event: Option<Event<CachedClaim>>) -> Option<(&'static str, String)> {
        let (kind, claim) = match event? {
            Event::Apply(claim) => ("Apply", claim),
            Event::InitApply(claim) => ("InitApply", claim),
            Event::Delete(claim) => ("Delete", claim),
            Event::Init => return Some(("Init", String::new())),
            Event::InitDone => return Some(("InitDone", String::new())),
        };
        Some((kind, claim.metadata.resource_version.unwrap_or_default()))
    }

    #[test]
    fn done_claims_leave_the_cache_and_come_back_to_grow() {
        let version = |mut pvc: k8s_openapi::api::core::v1::PersistentVolumeClaim, rv: &str| {
            pvc.metadata.resource_version = Some(rv.into());
            CachedClaim::from(pvc)
        };
        let pending = version(claim("nfs"), "1");
        let done = version(bound_claim("2Gi", "2Gi"), "2");
        let growing = version(bound_claim("3Gi", "2Gi"), "3");

        // The first list: a done claim is never stored.
        assert_eq!(
            seen(claim_event(Event::Init)),
            Some(("Init", String::new()))
        );
        assert_eq!(
            seen(claim_event(Event::InitApply(pending.clone()))),
            Some(("InitApply", "1".into()))
        );
        assert_eq!(seen(claim_event(Event::InitApply(done.clone()))), None);
        assert_eq!(
            seen(claim_event(Event::InitApply(growing.clone()))),
            Some(("InitApply", "3".into()))
        );
        // Watching: binding takes a claim out; asking for more brings it back; deletions
        // pass as they are.
        assert_eq!(
            seen(claim_event(Event::Apply(pending))),
            Some(("Apply", "1".into()))
        );
        assert_eq!(
            seen(claim_event(Event::Apply(done.clone()))),
            Some(("Delete", "2".into()))
        );
        assert_eq!(
            seen(claim_event(Event::Apply(growing))),
            Some(("Apply", "3".into()))
        );
        assert_eq!(
            seen(claim_event(Event::Delete(done))),
            Some(("Delete", "2".into()))
        );
    }

    #[test]
    fn bound_claims_asking_for_more_are_kept_whole_until_done() {
        let mut pvc = bound_claim("2Gi", "1Gi");
        pvc.metadata.managed_fields = Some(vec![Default::default()]);
        let before = pvc.clone();
        let mut cached = CachedClaim::from(pvc);
        slim_claim(&mut cached);
        let pvc = cached.to_claim();
        assert_eq!(pvc.metadata.managed_fields, None);
        assert_eq!(pvc.metadata.annotations, before.metadata.annotations);
        assert_eq!(pvc.spec, before.spec);
        assert_eq!(pvc.status, before.status);
        assert!(!claim_is_done(&cached));
        assert!(claim_is_done(&CachedClaim::from(bound_claim("2Gi", "2Gi"))));
    }

    #[test]
    fn our_volumes_keep_what_deletion_reads() {
        let mut full = released_pv(Some("delete"), "team-a/data");
        full.spec.as_mut().unwrap().nfs = Some(Default::default());
        full.metadata.labels = Some(BTreeMap::from([("a".into(), "b".into())]));
        let annotations = full.metadata.annotations.as_mut().unwrap();
        annotations.insert(ANN_QUOTA.into(), "enforced".into());
        annotations.insert(ANN_ARCHIVE_RETENTION_DAYS.into(), "30".into());
        annotations.insert("pv.kubernetes.io/bound-by-controller".into(), "yes".into());
        let before = full.clone();
        let mut volume = cached(full);
        slim_volume(&mut volume, &PROVISIONER.into());
        let annotation = |key: &str| {
            let value = before.metadata.annotations.as_ref().unwrap().get(key);
            value.map(|v| v.clone().into_boxed_str())
        };
        assert_eq!(
            volume.recorded,
            RecordedAnnotations {
                provisioned_by: annotation(ANN_PROVISIONED_BY),
                agent: annotation(ANN_AGENT),
                path: annotation(ANN_PATH),
                on_delete: annotation(ANN_ON_DELETE),
                quota: annotation(ANN_QUOTA),
                archive_retention_days: annotation(ANN_ARCHIVE_RETENTION_DAYS),
            }
        );
        assert_eq!(volume.recorded.on_delete.as_deref(), Some("delete"));
        assert_eq!(volume.recorded.path.as_deref(), Some("team-a/data"));
        // Read through the fields only: a map left behind would be a second, stale copy.
        assert_eq!(volume.metadata.annotations, None);
        assert_eq!(volume.metadata.finalizers, before.metadata.finalizers);
        assert_eq!(volume.metadata.uid, before.metadata.uid);
        assert_eq!(
            volume.metadata.resource_version,
            before.metadata.resource_version
        );
        let spec = volume.spec.as_ref().unwrap();
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some("Delete")
        );
        assert_eq!(spec.storage_class_name.as_deref(), Some("nfs"));
        assert_eq!(volume.metadata.labels, None);
        assert_eq!(volume.status.unwrap().phase.as_deref(), Some("Released"));
    }

    #[test]
    fn other_volumes_keep_only_that_they_are_not_ours() {
        let mut volume = cached(released_pv(Some("delete"), "team-a/data"));
        slim_volume(&mut volume, &"example.com/other".into());
        assert_eq!(volume.recorded, RecordedAnnotations::default());
        assert_eq!(volume.metadata.annotations, None);
        assert_eq!(volume.metadata.finalizers, None);
        assert!(!crate::objects::is_ours(
            &volume,
            &"example.com/other".into()
        ));
        assert!(!crate::objects::is_ours(&volume, &PROVISIONER.into()));
    }
}
