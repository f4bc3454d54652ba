//! What one cached claim and one cached volume cost, counted byte by byte: every
//! allocation of this test binary goes through a counting allocator, and the objects are
//! decoded from the JSON a real API server sends (managedFields, the PV controller's
//! annotations, finalizers, status) and pass through the caches' own filter and slimming
//! into kube-runtime stores, as in the controller.
//!
//! `cargo test -p nfsprov-controller --test cache_memory -- --nocapture` prints
//! the bytes per object at each stage; the test fails when the cost per object held grows
//! past its bound or when a claim the cache should not hold costs anything at all. It is
//! the only test of this binary: the counter is process-wide.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::Event;
use nfsprov_controller::cache::{self, ClaimFilter};
use nfsprov_controller::objects::{CachedClaim, CachedVolume, Provisioners};
use serde_json::json;

/// Bytes currently allocated by the whole process.
static LIVE: AtomicIsize = AtomicIsize::new(0);

struct Counting;

// SAFETY: every call is passed on unchanged to the system allocator, which upholds the
// trait's contract; the counter is a relaxed atomic, no allocation is made here.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's layout, as received.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` was allocated by `System` with this layout (see `alloc`).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: as for `dealloc`; `new_size` is the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const OBJECTS: usize = 10_000;
const PROVISIONER: &str = "nfsprov.dev/nfs";

fn live() -> isize {
    LIVE.load(Ordering::SeqCst)
}

fn uid(i: usize) -> String {
    format!("6b1c8f3e-2d4a-4e5b-9c7d-{i:012x}")
}

/// A claim as kube-apiserver sends it once the PV controller has handed it to
/// `provisioner`: Pending, with its managedFields and the protection finalizer.
fn claim_json(i: usize, provisioner: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": format!("bench-{i}"),
            "namespace": "nfsprov-bench-3f2a9c",
            "uid": uid(i),
            "resourceVersion": format!("{}", 100_000 + i),
            "creationTimestamp": "2026-11-25T21:00:00Z",
            "labels": {"app": "bench"},
            "annotations": {
                "volume.beta.kubernetes.io/storage-provisioner": provisioner,
                "volume.kubernetes.io/storage-provisioner": provisioner,
            },
            "finalizers": ["kubernetes.io/pvc-protection"],
            "managedFields": [
                {"manager": "kubectl-create", "operation": "Update", "apiVersion": "v1",
                 "time": "2026-11-25T21:00:00Z", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:spec": {"f:accessModes": {}, "f:resources": {"f:requests": {".": {}, "f:storage": {}}}, "f:storageClassName": {}, "f:volumeMode": {}}}},
                {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                 "time": "2026-11-25T21:00:01Z", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:volume.beta.kubernetes.io/storage-provisioner": {}, "f:volume.kubernetes.io/storage-provisioner": {}}}}},
            ],
        },
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": "1Gi"}},
            "storageClassName": "nfs",
            "volumeMode": "Filesystem",
        },
        "status": {"phase": "Pending"},
    }))
    .unwrap()
}

/// A PV as this controller makes it, once the binder has bound it.
fn volume_json(i: usize) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": format!("pvc-{}", uid(i)),
            "uid": format!("9a8b7c6d-2d4a-4e5b-9c7d-{i:012x}"),
            "resourceVersion": format!("{}", 200_000 + i),
            "creationTimestamp": "2026-11-25T21:00:02Z",
            "annotations": {
                "pv.kubernetes.io/provisioned-by": PROVISIONER,
                "nfsprov.dev/agent": "nfs1",
                "nfsprov.dev/path": format!("nfsprov-bench-3f2a9c/bench-{i}"),
                "nfsprov.dev/on-delete": "delete",
                "pv.kubernetes.io/bound-by-controller": "yes",
            },
            "finalizers": ["kubernetes.io/pv-protection", "nfsprov.dev/volume"],
            "managedFields": [
                {"manager": "nfsprov-controller", "operation": "Update", "apiVersion": "v1",
                 "time": "2026-11-25T21:00:02Z", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:annotations": {}}, "f:spec": {"f:nfs": {}}}},
            ],
        },
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteMany"],
            "nfs": {"server": "nfs1.example.com", "path": format!("/export/nfsprov-bench-3f2a9c/bench-{i}")},
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "nfs",
            "volumeMode": "Filesystem",
            "claimRef": {
                "kind": "PersistentVolumeClaim", "apiVersion": "v1",
                "namespace": "nfsprov-bench-3f2a9c", "name": format!("bench-{i}"),
                "uid": uid(i), "resourceVersion": format!("{}", 100_000 + i),
            },
        },
        "status": {"phase": "Bound"},
    }))
    .unwrap()
}

/// Bytes per object that `fill` leaves allocated, the JSON it reads excluded.
fn per_object<T>(jsons: &[Vec<u8>], fill: impl FnOnce(&[Vec<u8>]) -> T) -> (f64, T) {
    let before = live();
    let kept = fill(jsons);
    let after = live();
    ((after - before) as f64 / jsons.len() as f64, kept)
}

/// A volume store holding `volumes`, through the caches' own slimming.
fn volume_store(
    volumes: &[Vec<u8>],
) -> (Store<CachedVolume>, reflector::store::Writer<CachedVolume>) {
    let provisioners = Provisioners::from(PROVISIONER);
    let (store, mut writer) = reflector::store::<CachedVolume>();
    writer.apply_watcher_event(&Event::Init);
    for json in volumes {
        let mut pv: CachedVolume = serde_json::from_slice(json).unwrap();
        cache::slim_volume(&mut pv, &provisioners);
        writer.apply_watcher_event(&Event::InitApply(pv));
    }
    writer.apply_watcher_event(&Event::InitDone);
    (store, writer)
}

/// Lists `claims` into a claim store through `filter` and the slimming, as the claim
/// watch does.
fn claim_store(
    claims: &[Vec<u8>],
    filter: &ClaimFilter,
) -> (Store<CachedClaim>, reflector::store::Writer<CachedClaim>) {
    let (store, mut writer) = reflector::store::<CachedClaim>();
    writer.apply_watcher_event(&Event::Init);
    for json in claims {
        let claim: CachedClaim = serde_json::from_slice(json).unwrap();
        if let Some(mut event) = filter.event(Event::InitApply(claim)) {
            if let Event::InitApply(claim) = &mut event {
                cache::slim_claim(claim);
            }
            writer.apply_watcher_event(&event);
        }
    }
    writer.apply_watcher_event(&Event::InitDone);
    (store, writer)
}

#[test]
fn what_each_cached_object_costs() {
    let ours: Vec<Vec<u8>> = (0..OBJECTS).map(|i| claim_json(i, PROVISIONER)).collect();
    let others: Vec<Vec<u8>> = (0..OBJECTS)
        .map(|i| claim_json(i, "example.com/other"))
        .collect();
    let volumes: Vec<Vec<u8>> = (0..OBJECTS).map(volume_json).collect();
    let (empty_volumes, _volume_writer) = volume_store(&[]);
    let filter = ClaimFilter::new(Provisioners::from(PROVISIONER), empty_volumes);

    // Where a pending claim's bytes go, stage by stage.
    let (decoded, kept) = per_object(&ours, |jsons| {
        jsons
            .iter()
            .map(|j| serde_json::from_slice::<CachedClaim>(j).unwrap())
            .collect::<Vec<_>>()
    });
    drop(kept);
    let (slimmed, kept) = per_object(&ours, decoded_slimmed);
    drop(kept);
    let (pending, held) = per_object(&ours, |jsons| claim_store(jsons, &filter));
    assert_eq!(
        held.0.state().len(),
        OBJECTS,
        "every pending claim of ours is held"
    );
    let (other, not_held) = per_object(&others, |jsons| claim_store(jsons, &filter));
    assert!(
        not_held.0.state().is_empty(),
        "claims of others are not held"
    );
    let (volume, cached_volumes) = per_object(&volumes, volume_store);
    assert_eq!(cached_volumes.0.state().len(), OBJECTS);
    // The same claims once their PVs are cached: waiting for the binder only.
    let parked_filter = ClaimFilter::new(Provisioners::from(PROVISIONER), cached_volumes.0.clone());
    let (parked, parked_store) = per_object(&ours, |jsons| claim_store(jsons, &parked_filter));
    assert!(
        parked_store.0.state().is_empty(),
        "claims whose PV exists are not held"
    );

    println!("bytes per object ({OBJECTS} of each), decoded from what the API server sends:");
    println!("  pending claim, decoded (managedFields skipped):  {decoded:>7.0}");
    println!("  pending claim, slimmed:                          {slimmed:>7.0}");
    println!("  pending claim of ours, in the claim store:       {pending:>7.0}");
    println!("  pending claim of another provisioner, in store:  {other:>7.0}");
    println!("  pending claim whose PV is cached, in store:      {parked:>7.0}");
    println!("  bound PV of ours, in the volume store:           {volume:>7.0}");
    assert!(
        other.abs() < 8.0,
        "a claim of another provisioner costs {other} B"
    );
    assert!(
        parked.abs() < 8.0,
        "a claim waiting for the binder costs {parked} B"
    );
    assert!(
        pending < 2_000.0,
        "a pending claim of ours costs {pending} B"
    );
    assert!(volume < 1_200.0, "a cached PV costs {volume} B");
    drop((held, not_held, parked_store));
    // A lookup the reconcilers make, so the stores are used as the controller uses them.
    assert!(
        cached_volumes
            .0
            .get(&ObjectRef::new(&format!("pvc-{}", uid(7))))
            .is_some()
    );
}

fn decoded_slimmed(jsons: &[Vec<u8>]) -> Vec<CachedClaim> {
    jsons
        .iter()
        .map(|j| {
            let mut claim: CachedClaim = serde_json::from_slice(j).unwrap();
            cache::slim_claim(&mut claim);
            claim
        })
        .collect()
}
