//! What the caches keep. Everything the reconcilers never read is dropped before an object
//! is stored, so that tens of thousands of claims and volumes fit in a small pod.

use kube::Resource;

use crate::objects::{
    CachedClaim, CachedVolume, claim_is_bound, is_ours, resize_in_play, volume_name,
};

/// Drops server-side bookkeeping no reconciler reads.
pub fn strip_meta<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// Claims: an unbound claim keeps what provisioning reads (labels and annotations feed the
/// pathPattern); a bound claim is never provisioned again, so only the name of its volume
/// is kept (spec and status are dropped), unless a resize is asked for or under way: then
/// expansion reads the request, the class and the status. That is rare and short-lived,
/// so it costs nothing in the steady state.
pub fn slim_claim(claim: &mut CachedClaim) {
    strip_meta(claim);
    if resize_in_play(claim) {
        return;
    }
    claim.status = None;
    if claim_is_bound(claim) {
        claim.bound_to = volume_name(claim).map(str::to_owned);
        claim.spec = None;
        let meta = &mut claim.metadata;
        meta.labels = None;
        meta.annotations = None;
        meta.finalizers = None;
        meta.owner_references = None;
    }
}

/// Volumes: deletion reads the provisioner, our annotations, finalizers, reclaim policy,
/// class and phase ([`CachedVolume`] holds nothing else). Volumes of other provisioners
/// keep only what says they are not ours.
pub fn slim_volume(volume: &mut CachedVolume, provisioner: &str) {
    strip_meta(volume);
    let ours = is_ours(volume, provisioner);
    let meta = &mut volume.metadata;
    meta.labels = None;
    meta.owner_references = None;
    if !ours {
        meta.annotations = None;
        meta.finalizers = None;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::objects::ClaimParts;
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

    #[test]
    fn bound_claims_keep_only_their_volume_name() {
        let mut pvc = claim("nfs");
        pvc.spec.as_mut().unwrap().volume_name = Some("pvc-1".into());
        let mut cached = CachedClaim::from(pvc);
        slim_claim(&mut cached);
        assert_eq!(cached.spec, None, "the bound skeleton holds no spec");
        assert_eq!(cached.status, None);
        assert_eq!(cached.bound_volume_name(), Some("pvc-1"));
        assert!(claim_is_bound(&cached));
        let pvc = cached.to_claim();
        assert_eq!(pvc.metadata.annotations, None);
        let spec = pvc.spec.as_ref().unwrap();
        assert_eq!(spec.volume_name.as_deref(), Some("pvc-1"));
        assert_eq!(spec.storage_class_name, None);
        assert_eq!(
            pvc.metadata.uid.as_deref(),
            Some(crate::tests::fixtures::CLAIM_UID)
        );
    }

    #[test]
    fn bound_claims_asking_for_more_are_kept_whole_until_done() {
        let mut pvc = bound_claim("2Gi", "1Gi");
        pvc.metadata.managed_fields = Some(vec![Default::default()]);
        let before = pvc.clone();
        let mut cached = CachedClaim::from(pvc);
        slim_claim(&mut cached);
        assert_eq!(cached.bound_to, None);
        let pvc = cached.to_claim();
        assert_eq!(pvc.metadata.managed_fields, None);
        assert_eq!(pvc.metadata.annotations, before.metadata.annotations);
        assert_eq!(pvc.spec, before.spec);
        assert_eq!(pvc.status, before.status);

        let mut done = CachedClaim::from(bound_claim("2Gi", "2Gi"));
        slim_claim(&mut done);
        assert_eq!(done.status, None);
        assert_eq!(done.spec, None);
        assert_eq!(done.to_claim().spec.unwrap().resources, None);
    }

    #[test]
    fn our_volumes_keep_what_deletion_reads() {
        let mut full = released_pv(Some("delete"), "team-a/data");
        full.spec.as_mut().unwrap().nfs = Some(Default::default());
        full.metadata.labels = Some(BTreeMap::from([("a".into(), "b".into())]));
        let before = full.clone();
        let mut volume = cached(full);
        slim_volume(&mut volume, PROVISIONER);
        assert_eq!(volume.metadata.annotations, before.metadata.annotations);
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
        slim_volume(&mut volume, "example.com/other");
        assert_eq!(volume.metadata.annotations, None);
        assert_eq!(volume.metadata.finalizers, None);
        assert!(!crate::objects::is_ours(&volume, "example.com/other"));
        assert!(!crate::objects::is_ours(&volume, PROVISIONER));
    }
}
