//! What the caches keep. Everything the reconcilers never read is dropped before an object
//! is stored, so that tens of thousands of claims and volumes fit in a small pod.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::Event;

use crate::objects::{
    CachedClaim, CachedVolume, Provisioners, RecordedAnnotations, claim_is_bound,
    claim_provisioner, is_ours, phase, pv_name_for, resize_in_play,
};

/// Drops server-side bookkeeping no reconciler reads.
pub(crate) fn strip_meta<K: Resource>(object: &mut K) {
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

/// Which claims the claim cache holds: those a reconcile can still act on. Every other
/// claim's watch events reach the cache as deletions (the store forgets it, the controller
/// sees no change), and its next update that matters brings it back like any other.
#[derive(Clone)]
pub struct ClaimFilter {
    provisioners: Provisioners,
    volumes: Store<CachedVolume>,
}

impl ClaimFilter {
    pub fn new(provisioners: Provisioners, volumes: Store<CachedVolume>) -> Self {
        Self {
            provisioners,
            volumes,
        }
    }

    /// Bound claims only while they ask for a resize. Unbound ones only while provisioning
    /// may act: the PV controller has handed them to one of our names (claims of other
    /// provisioners, or of none yet, cost nothing beyond decoding; the annotation comes
    /// as an update), they are not being deleted, and their PV is not made yet. A claim
    /// whose PV exists waits for the binder only, so it costs no more than a bound one;
    /// should that PV go before the binder binds it, [`ClaimFilter::unparked`] says to
    /// read the claim again.
    pub(crate) fn needs(&self, claim: &CachedClaim) -> bool {
        if claim_is_bound(claim) {
            return !claim_is_done(claim);
        }
        claim.metadata.deletion_timestamp.is_none()
            && claim_provisioner(claim).is_some_and(|name| self.provisioners.contains(name))
            && !self.has_volume(claim)
    }

    fn has_volume(&self, claim: &CachedClaim) -> bool {
        claim.metadata.uid.as_deref().is_some_and(|uid| {
            self.volumes
                .get(&ObjectRef::new(&pv_name_for(uid)))
                .is_some()
        })
    }

    /// The claim watch events that reach the claim cache.
    pub fn event(&self, event: Event<CachedClaim>) -> Option<Event<CachedClaim>> {
        match event {
            Event::InitApply(claim) if !self.needs(&claim) => None,
            Event::Apply(claim) if !self.needs(&claim) => Some(Event::Delete(claim)),
            other => Some(other),
        }
    }

    /// For a PV of ours just seen: the deletion that takes its claim out of the claim
    /// cache, when the cache holds that claim unbound. The claim's own watch events say
    /// nothing until the binder binds it, which can take many minutes in a burst.
    pub(crate) fn parked(
        &self,
        pv: &CachedVolume,
        claims: &Store<CachedClaim>,
    ) -> Option<Event<CachedClaim>> {
        let (namespace, name) = self.claim_of(pv)?;
        let key = ObjectRef::new(name).within(namespace);
        let claim = claims.get(&key)?;
        let uid = claim.metadata.uid.as_deref()?;
        if claim_is_bound(&*claim) || pv.metadata.name.as_deref() != Some(&pv_name_for(uid)) {
            return None;
        }
        let mut gone = CachedClaim::default();
        gone.metadata = ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        };
        Some(Event::Delete(gone))
    }

    /// For a PV of ours just deleted before any claim was bound to it: the claim it was
    /// made for (namespace, name, uid), which must be read again, as it may be waiting
    /// for a PV once more and no watch event of its own will say so.
    pub(crate) fn unparked(&self, pv: &CachedVolume) -> Option<(String, String, String)> {
        if !matches!(phase(pv), "" | "Pending" | "Available") {
            return None;
        }
        let (namespace, name) = self.claim_of(pv)?;
        let uid = pv.spec.as_ref()?.claim_ref.as_ref()?.uid.clone()?;
        Some((namespace.to_owned(), name.to_owned(), uid))
    }

    fn claim_of<'a>(&self, pv: &'a CachedVolume) -> Option<(&'a str, &'a str)> {
        if !is_ours(pv, &self.provisioners) {
            return None;
        }
        let claim = pv.spec.as_ref()?.claim_ref.as_ref()?;
        Some((claim.namespace.as_deref()?, claim.name.as_deref()?))
    }
}

/// Claims: an unbound claim keeps what provisioning reads (labels and annotations feed the
/// pathPattern; the status, finalizers and owners are not read); a bound one asking for
/// more keeps everything, as expansion reads the request, the class and the status.
pub fn slim_claim(claim: &mut CachedClaim) {
    strip_meta(claim);
    if !resize_in_play(claim) {
        claim.status = None;
        claim.metadata.finalizers = None;
        claim.metadata.owner_references = None;
        if !claim_is_bound(claim) {
            claim.pack();
        }
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
    use crate::tests::builders::{CLAIM_UID, PROVISIONER, bound_claim, cached, claim, released_pv};

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
        // Held packed, and read through the predicates as before.
        assert_eq!(cached.metadata.labels, None);
        assert_eq!(cached.metadata.annotations, None);
        assert_eq!(
            crate::objects::claim_provisioner(&cached),
            Some(PROVISIONER)
        );
        assert_eq!(crate::objects::claim_class(&cached), Some("nfs"));
        assert!(!claim_is_bound(&cached));
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

    fn filter(volumes: &[CachedVolume]) -> ClaimFilter {
        let (store, mut writer) = kube::runtime::reflector::store::<CachedVolume>();
        for volume in volumes {
            writer.apply_watcher_event(&Event::Apply(volume.clone()));
        }
        ClaimFilter::new(PROVISIONER.into(), store)
    }

    /// The PV this controller made for the claim of [`claim`], not bound yet.
    fn unbound_pv() -> CachedVolume {
        let mut pv = released_pv(Some("delete"), "team-a/data");
        pv.spec.as_mut().unwrap().claim_ref = Some(k8s_openapi::api::core::v1::ObjectReference {
            namespace: Some("team-a".into()),
            name: Some("data".into()),
            uid: Some(CLAIM_UID.into()),
            ..Default::default()
        });
        pv.status.as_mut().unwrap().phase = Some("Available".into());
        cached(pv)
    }

    #[test]
    fn done_claims_leave_the_cache_and_come_back_to_grow() {
        let filter = filter(&[]);
        let claim_event = |event| filter.event(event);
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
    fn claims_of_other_provisioners_or_of_none_yet_are_not_held() {
        let filter = filter(&[]);
        let mut other = claim("nfs");
        other.metadata.annotations = Some(BTreeMap::from([(
            crate::objects::ANN_STORAGE_PROVISIONER.into(),
            "example.com/other".into(),
        )]));
        let mut unannotated = claim("nfs");
        unannotated.metadata.annotations = None;
        let mut deleting = claim("nfs");
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
        );
        for pvc in [other, unannotated, deleting] {
            let pvc = CachedClaim::from(pvc);
            assert!(!filter.needs(&pvc), "{pvc:?}");
            assert_eq!(seen(filter.event(Event::InitApply(pvc.clone()))), None);
            assert_eq!(
                seen(filter.event(Event::Apply(pvc))),
                Some(("Delete", "100".into()))
            );
        }
        // Once the PV controller hands it to us, the same claim is held.
        let ours = CachedClaim::from(claim("nfs"));
        assert!(filter.needs(&ours));
        assert_eq!(
            seen(filter.event(Event::Apply(ours))),
            Some(("Apply", "100".into()))
        );
    }

    #[test]
    fn a_claim_whose_pv_exists_waits_outside_the_cache_until_the_pv_goes() {
        let pending = CachedClaim::from(claim("nfs"));
        let pv = unbound_pv();
        // Listed or updated after its PV is cached: never held.
        let with_pv = filter(std::slice::from_ref(&pv));
        assert!(!with_pv.needs(&pending));
        assert_eq!(seen(with_pv.event(Event::InitApply(pending.clone()))), None);

        // Held before its PV came: the PV's arrival takes it out.
        let (claims, mut writer) = kube::runtime::reflector::store::<CachedClaim>();
        writer.apply_watcher_event(&Event::Apply(pending.clone()));
        let Some(Event::Delete(stub)) = with_pv.parked(&pv, &claims) else {
            panic!("the claim was not taken out");
        };
        writer.apply_watcher_event(&Event::Delete(stub));
        assert!(claims.state().is_empty());
        // Not for a claim the cache does not hold, nor for a PV made for another uid.
        assert!(with_pv.parked(&pv, &claims).is_none());
        writer.apply_watcher_event(&Event::Apply(pending));
        let mut other_pv = pv.clone();
        other_pv.metadata.name = Some("pvc-other".into());
        assert!(with_pv.parked(&other_pv, &claims).is_none());

        // The PV deleted before binding: the claim is to be read again.
        assert_eq!(
            with_pv.unparked(&pv),
            Some(("team-a".into(), "data".into(), CLAIM_UID.into()))
        );
        let mut released = pv.clone();
        released.status.as_mut().unwrap().phase = Some("Released".into());
        assert_eq!(with_pv.unparked(&released), None);
        // Not a PV of ours: nothing.
        let others = ClaimFilter::new("example.com/other".into(), filter(&[]).volumes);
        assert_eq!(others.unparked(&pv), None);
        assert!(others.parked(&pv, &claims).is_none());
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
