//! Helpers shared by the simulator's integration tests.
#![allow(dead_code)]

use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event as CoreEvent, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::wait::{Condition, await_condition};
use kube::{Client, Resource};
use nfsprov_kube_sim::{SimOptions, Simulator};
use serde::de::DeserializeOwned;
use serde_json::json;

pub const WAIT: Duration = Duration::from_secs(15);

pub async fn start() -> (Simulator, Client) {
    start_with(SimOptions::default()).await
}

pub async fn start_with(opts: SimOptions) -> (Simulator, Client) {
    let sim = Simulator::start(opts).await.expect("simulator starts");
    let client = sim.client().await;
    (sim, client)
}

/// The `Status` inside a kube API error; panics on any other outcome.
pub fn status<T: Debug>(r: Result<T, kube::Error>) -> Box<kube::core::Status> {
    match r {
        Err(kube::Error::Api(s)) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Wait (bounded) until `cond` holds for the named object.
pub async fn wait_for<K>(api: Api<K>, name: &str, cond: impl Condition<K>) -> K
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + 'static,
{
    tokio::time::timeout(WAIT, await_condition(api, name, cond))
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {name}"))
        .expect("watch for condition")
        .unwrap_or_else(|| panic!("{name} was deleted while waiting"))
}

pub fn pvc(name: &str, class: Option<&str>, size: &str) -> PersistentVolumeClaim {
    let mut v = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": size}},
        }
    });
    if let Some(c) = class {
        v["spec"]["storageClassName"] = json!(c);
    }
    serde_json::from_value(v).expect("pvc literal")
}

pub fn nfs_pv(name: &str, size: &str) -> PersistentVolume {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteMany"],
            "nfs": {"server": "127.0.0.1", "path": format!("/export/{name}")},
        }
    }))
    .expect("pv literal")
}

pub fn storage_class(name: &str, provisioner: &str, mode: &str) -> StorageClass {
    serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": provisioner,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": mode,
    }))
    .expect("storage class literal")
}

pub async fn create<K>(api: &Api<K>, obj: &K) -> K
where
    K: Resource + Clone + Debug + DeserializeOwned + serde::Serialize,
{
    api.create(&PostParams::default(), obj)
        .await
        .expect("create succeeds")
}

/// Wait (bounded, through a watch) for a core/v1 Event about `involved` with `reason`.
pub async fn wait_event(
    client: &Client,
    ns: &str,
    involved: &str,
    reason: &str,
) -> k8s_openapi::api::core::v1::Event {
    use futures::StreamExt;
    use kube::runtime::watcher::{self, Event};
    let api: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), ns);
    let cfg = watcher::Config::default().fields(&format!("involvedObject.name={involved}"));
    let mut s = watcher::watcher(api, cfg).boxed();
    tokio::time::timeout(WAIT, async {
        while let Some(ev) = s.next().await {
            if let Ok(Event::Apply(e) | Event::InitApply(e)) = ev
                && e.reason.as_deref() == Some(reason)
            {
                return e;
            }
        }
        panic!("event watch ended")
    })
    .await
    .unwrap_or_else(|_| panic!("no {reason} event for {involved}"))
}

/// The provisioner name the tests' classes use.
pub const PROVISIONER: &str = "nfsprov.example.com/nfs";

/// Create a claim and the volume a provisioner would make for it (pre-bound by uid), and
/// wait until the binder has bound them.
pub async fn bound_claim(
    client: &Client,
    name: &str,
    class: &str,
    size: &str,
) -> PersistentVolumeClaim {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let claim = create(&pvcs, &pvc(name, Some(class), size)).await;
    let uid = claim.metadata.uid.clone().expect("claim uid");
    let mut pv = nfs_pv(&format!("pvc-{uid}"), size);
    pv.metadata.annotations = Some(
        [(
            "pv.kubernetes.io/provisioned-by".to_string(),
            PROVISIONER.to_string(),
        )]
        .into(),
    );
    let spec = pv.spec.as_mut().expect("pv spec");
    spec.storage_class_name = Some(class.into());
    spec.persistent_volume_reclaim_policy = Some("Delete".into());
    spec.claim_ref = Some(
        serde_json::from_value(json!({
            "kind": "PersistentVolumeClaim", "apiVersion": "v1",
            "namespace": "default", "name": name, "uid": uid,
        }))
        .expect("claimRef literal"),
    );
    create(&Api::<PersistentVolume>::all(client.clone()), &pv).await;
    wait_for(pvcs, name, |c: Option<&PersistentVolumeClaim>| {
        c.and_then(|c| c.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            == Some("Bound")
    })
    .await
}

/// Wait until the binder has handled every claim change made before this call. Its passes
/// take changes in order and claims by name, so a claim in a missing class, named to sort
/// last, gets its ProvisioningFailed event only once everything before it was looked at.
pub async fn binder_settled(client: &Client) {
    static BARRIERS: AtomicUsize = AtomicUsize::new(0);
    let name = format!("zz-settled-{}", BARRIERS.fetch_add(1, Ordering::Relaxed));
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    create(&pvcs, &pvc(&name, Some("zz-no-such-class"), "1Gi")).await;
    wait_event(client, "default", &name, "ProvisioningFailed").await;
}

/// The core/v1 Events in "default" about the object `involved` with `reason`.
pub async fn events_about(client: &Client, involved: &str, reason: &str) -> Vec<CoreEvent> {
    let api: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    api.list(
        &ListParams::default().fields(&format!("involvedObject.name={involved},reason={reason}")),
    )
    .await
    .expect("list events")
    .items
}

/// Wait (bounded, through a watch) until `count` distinct Events about `involved` with
/// `reason` exist.
pub async fn wait_events(
    client: &Client,
    involved: &str,
    reason: &str,
    count: usize,
) -> Vec<CoreEvent> {
    use futures::StreamExt;
    use kube::runtime::watcher::{self, Event};
    let api: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let cfg = watcher::Config::default()
        .fields(&format!("involvedObject.name={involved},reason={reason}"));
    let mut s = watcher::watcher(api, cfg).boxed();
    let mut seen: Vec<CoreEvent> = Vec::new();
    tokio::time::timeout(WAIT, async {
        while let Some(ev) = s.next().await {
            if let Ok(Event::Apply(e) | Event::InitApply(e)) = ev
                && !seen.iter().any(|s| s.metadata.name == e.metadata.name)
            {
                seen.push(e);
                if seen.len() >= count {
                    return;
                }
            }
        }
        panic!("event watch ended")
    })
    .await
    .unwrap_or_else(|_| panic!("{} of {count} {reason} events for {involved}", seen.len()));
    seen
}
