//! The in-process stand-in for kube-controller-manager's parts the provisioner relies on:
//! the PV controller (binding, provisioner annotations, Released/Lost phases), the PVC and
//! PV protection controllers, the expand controller (see `expander`) and the namespace
//! controller's cleanup. It reproduces their observable writes (same fields, same order,
//! one write per step) rather than their code.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use crate::api::{Api, DeleteOptions, PV_PROTECTION, PVC_PROTECTION, Sub};
use crate::errors::ApiError;
use crate::expander::{ExpandController, claim_ref_key};
use crate::meta::{self, annotation, path, path_str};
use crate::quantity::storage_quantity;
use crate::recorder::{Note, Recorder};
use crate::resources::Kind;
use crate::store::{Key, WatchEvent};

pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
pub const ANN_BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
pub const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
const COMPONENT: &str = "persistentvolume-controller";

enum Signal {
    Event(Kind, Arc<WatchEvent>),
    /// Events were missed; everything must be looked at again.
    Lost,
}

struct Controllers {
    api: Api,
    binder: bool,
    /// The PV controller's events, each state reported once rather than on every pass
    /// (the real controller repeats them with a growing count).
    recorder: Recorder,
    expand: ExpandController,
}

pub async fn run(api: Api, binder: bool, resync: Duration) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    for kind in Kind::ALL {
        let mut sub = api.store.subscribe(kind);
        let tx = tx.clone();
        tokio::spawn(async move {
            loop {
                let sig = match sub.recv().await {
                    Ok(ev) => Signal::Event(kind, ev),
                    Err(broadcast::error::RecvError::Lagged(_)) => Signal::Lost,
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                if tx.send(sig).is_err() {
                    return;
                }
            }
        });
    }
    drop(tx);
    let mut c = Controllers {
        recorder: Recorder::new(api.clone(), COMPONENT),
        expand: ExpandController::new(api.clone()),
        api,
        binder,
    };
    let mut ticker = tokio::time::interval(resync);
    loop {
        let mut full = false;
        let mut claims: BTreeSet<Key> = BTreeSet::new();
        let mut volumes: BTreeSet<String> = BTreeSet::new();
        let mut namespaces: BTreeSet<String> = BTreeSet::new();
        let first = tokio::select! {
            s = rx.recv() => match s { Some(s) => Some(s), None => return },
            _ = ticker.tick() => { full = true; None }
        };
        let mut pending: Vec<Signal> = first.into_iter().collect();
        while let Ok(s) = rx.try_recv() {
            pending.push(s);
        }
        for s in pending {
            match s {
                Signal::Lost => full = true,
                Signal::Event(kind, ev) => {
                    let o = &ev.object;
                    match kind {
                        Kind::PersistentVolumeClaim => {
                            claims.insert((meta::namespace(o).into(), meta::name(o).into()));
                            // A claim's change (above all its deletion) matters to its volume.
                            if let Some(v) =
                                path_str(o, &["spec", "volumeName"]).filter(|v| !v.is_empty())
                            {
                                volumes.insert(v.to_string());
                            }
                        }
                        Kind::PersistentVolume => {
                            volumes.insert(meta::name(o).into());
                            if let Some(k) = claim_ref_key(o) {
                                claims.insert(k);
                            }
                            if let Some(k) = ev.previous.as_deref().and_then(claim_ref_key) {
                                claims.insert(k);
                            }
                        }
                        Kind::StorageClass => full = true,
                        Kind::Namespace => {
                            namespaces.insert(meta::name(o).into());
                        }
                        _ => {}
                    }
                    if kind.info().namespaced {
                        namespaces.insert(meta::namespace(o).into());
                    }
                }
            }
        }
        if full {
            c.sync_everything();
        } else {
            c.sync_some(&claims, &volumes, &namespaces);
        }
    }
}

fn phase(o: &Value) -> &str {
    path_str(o, &["status", "phase"]).unwrap_or("")
}

fn uid(o: &Value) -> &str {
    meta::meta_str(o, "uid").unwrap_or("")
}

/// IsVolumeBoundToClaim: the PV's claimRef names this claim (and its uid, when set).
fn volume_bound_to_claim(pv: &Value, claim: &Value) -> bool {
    let Some(cr) = path(pv, &["spec", "claimRef"]) else {
        return false;
    };
    let s = |k: &str| cr.get(k).and_then(Value::as_str).unwrap_or("");
    s("name") == meta::name(claim)
        && s("namespace") == meta::namespace(claim)
        && (s("uid").is_empty() || s("uid") == uid(claim))
}

fn modes(o: &Value, keys: &[&str]) -> Vec<String> {
    path(o, keys)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

impl Controllers {
    fn sync_everything(&mut self) {
        let (claims, _) = self.api.store.snapshot(Kind::PersistentVolumeClaim, None);
        let (pvs, _) = self.api.store.snapshot(Kind::PersistentVolume, None);
        let (nss, _) = self.api.store.snapshot(Kind::Namespace, None);
        let claims = claims
            .iter()
            .map(|c| (meta::namespace(c).to_string(), meta::name(c).to_string()))
            .collect();
        let volumes = pvs.iter().map(|p| meta::name(p).to_string()).collect();
        let namespaces = nss.iter().map(|n| meta::name(n).to_string()).collect();
        self.sync_some(&claims, &volumes, &namespaces);
    }

    fn sync_some(
        &mut self,
        claims: &BTreeSet<Key>,
        volumes: &BTreeSet<String>,
        namespaces: &BTreeSet<String>,
    ) {
        for ns in namespaces {
            self.sync_namespace(ns);
        }
        if !self.binder {
            return;
        }
        for name in volumes {
            if let Err(e) = self.sync_volume(name) {
                tracing::debug!("volume {name}: {e}");
            }
        }
        if claims.is_empty() {
            return;
        }
        let (pvs, _) = self.api.store.snapshot(Kind::PersistentVolume, None);
        let mut by_claim: HashMap<Key, Vec<Arc<Value>>> = HashMap::new();
        let mut unclaimed = Vec::new();
        for pv in pvs {
            match claim_ref_key(&pv) {
                Some(k) => by_claim.entry(k).or_default().push(pv),
                None => unclaimed.push(pv),
            }
        }
        for key in claims {
            let pre = by_claim.get(key).map(Vec::as_slice).unwrap_or(&[]);
            if let Err(e) = self.sync_claim(key, pre, &unclaimed) {
                tracing::debug!("claim {}/{}: {e}", key.0, key.1);
            }
            // The expand controller sees the claim as the binder left it.
            if let Some(claim) = self
                .api
                .store
                .get(Kind::PersistentVolumeClaim, &key.0, &key.1)
            {
                self.expand.sync_claim(&claim);
            }
        }
    }

    /// The namespace controller: a terminating namespace has its content deleted and
    /// goes away once nothing is left in it.
    fn sync_namespace(&mut self, name: &str) {
        let Some(ns) = self.api.store.get(Kind::Namespace, "", name) else {
            return;
        };
        if !meta::is_deleting(&ns) {
            return;
        }
        let mut remaining = 0;
        for kind in Kind::ALL.into_iter().filter(|k| k.info().namespaced) {
            let (items, _) = self.api.store.snapshot(kind, Some(name));
            remaining += items.len();
            for o in items.iter().filter(|o| !meta::is_deleting(o)) {
                let _ = self
                    .api
                    .delete(kind, name, meta::name(o), &DeleteOptions::default());
            }
        }
        if remaining == 0
            && let Err(e) = self.api.finalize_namespace(name)
        {
            tracing::debug!("finalizing namespace {name}: {e}");
        }
    }

    fn event(&mut self, obj: &Value, kind: Kind, type_: &str, reason: &str, message: &str) {
        let note = Note {
            type_,
            reason,
            message,
        };
        self.recorder.record(obj, kind, note, "");
    }

    fn set_phase(
        &self,
        kind: Kind,
        obj: &Value,
        phase: &str,
    ) -> Result<Option<Arc<Value>>, ApiError> {
        self.api.modify(
            kind,
            meta::namespace(obj),
            meta::name(obj),
            meta::resource_version(obj),
            Sub::Status,
            |o| o["status"]["phase"] = json!(phase),
        )
    }

    fn sync_volume(&mut self, name: &str) -> Result<(), ApiError> {
        let Some(pv) = self.api.store.get(Kind::PersistentVolume, "", name) else {
            return Ok(());
        };
        if meta::is_deleting(&pv)
            && phase(&pv) != "Bound"
            && meta::finalizers(&pv).iter().any(|f| f == PV_PROTECTION)
        {
            self.api.modify(
                Kind::PersistentVolume,
                "",
                name,
                meta::resource_version(&pv),
                Sub::Main,
                |o| remove_finalizer(o, PV_PROTECTION),
            )?;
            return Ok(());
        }
        let Some(cr) = path(&pv, &["spec", "claimRef"]).filter(|v| v.is_object()) else {
            if phase(&pv) != "Available" {
                self.set_phase(Kind::PersistentVolume, &pv, "Available")?;
            }
            return Ok(());
        };
        let cr_uid = cr.get("uid").and_then(Value::as_str).unwrap_or("");
        if cr_uid.is_empty() {
            // Reserved for a claim not bound yet: the claim's sync binds it.
            if phase(&pv) != "Available" {
                self.set_phase(Kind::PersistentVolume, &pv, "Available")?;
            }
            return Ok(());
        }
        let cns = cr.get("namespace").and_then(Value::as_str).unwrap_or("");
        let cname = cr.get("name").and_then(Value::as_str).unwrap_or("");
        let claim = self
            .api
            .store
            .get(Kind::PersistentVolumeClaim, cns, cname)
            .filter(|c| uid(c) == cr_uid);
        let Some(claim) = claim else {
            // The claim is gone (or replaced by a same-named one): the volume is Released
            // and keeps its claimRef; what happens to the data is the reclaim policy's call.
            return self.release_and_reclaim(pv);
        };
        let volume_name = path_str(&claim, &["spec", "volumeName"]).unwrap_or("");
        if volume_name.is_empty() {
            // Binding not done yet; the claim's sync does it.
            return Ok(());
        }
        if volume_name == name {
            if phase(&pv) != "Bound" {
                self.set_phase(Kind::PersistentVolume, &pv, "Bound")?;
            }
            return Ok(());
        }
        // The claim went to another volume.
        let dynamic = annotation(&pv, ANN_PROVISIONED_BY).is_some();
        let delete = path_str(&pv, &["spec", "persistentVolumeReclaimPolicy"]) == Some("Delete");
        if dynamic && delete {
            self.release_and_reclaim(pv)?;
        } else if annotation(&pv, ANN_BOUND_BY_CONTROLLER).is_some() {
            self.unbind(&pv)?;
        }
        Ok(())
    }

    fn unbind(&self, pv: &Value) -> Result<(), ApiError> {
        let by_controller = annotation(pv, ANN_BOUND_BY_CONTROLLER).is_some();
        let updated = self.api.modify(
            Kind::PersistentVolume,
            "",
            meta::name(pv),
            meta::resource_version(pv),
            Sub::Main,
            |o| {
                if by_controller {
                    if let Some(spec) = o.get_mut("spec").and_then(Value::as_object_mut) {
                        spec.remove("claimRef");
                    }
                } else if let Some(cr) = o
                    .pointer_mut("/spec/claimRef")
                    .and_then(Value::as_object_mut)
                {
                    cr.remove("uid");
                    cr.remove("resourceVersion");
                }
                if let Some(a) = o
                    .pointer_mut("/metadata/annotations")
                    .and_then(Value::as_object_mut)
                {
                    a.remove(ANN_BOUND_BY_CONTROLLER);
                }
            },
        )?;
        if let Some(p) = updated {
            self.set_phase(Kind::PersistentVolume, &p, "Available")?;
        }
        Ok(())
    }

    /// What the PV controller does with a Released volume: Retain keeps it; Delete leaves
    /// it to the external provisioner that made it; without one nothing can delete it.
    /// Marks the volume Released (unless it already is, or Failed) and applies its reclaim
    /// policy, as the PV controller does once the claim is gone or went elsewhere.
    fn release_and_reclaim(&mut self, pv: Arc<Value>) -> Result<(), ApiError> {
        let pv = if phase(&pv) != "Released" && phase(&pv) != "Failed" {
            match self.set_phase(Kind::PersistentVolume, &pv, "Released")? {
                Some(p) => p,
                None => return Ok(()),
            }
        } else {
            pv
        };
        self.reclaim(&pv)
    }

    fn reclaim(&mut self, pv: &Value) -> Result<(), ApiError> {
        let policy = path_str(pv, &["spec", "persistentVolumeReclaimPolicy"]).unwrap_or("Retain");
        let external =
            annotation(pv, ANN_PROVISIONED_BY).is_some_and(|p| !p.starts_with("kubernetes.io/"));
        match policy {
            "Delete" if !external && phase(pv) != "Failed" => {
                let msg = format!(
                    "error getting deleter volume plugin for volume \"{}\": no deletable volume plugin matched",
                    meta::name(pv)
                );
                if let Some(p) = self.set_phase(Kind::PersistentVolume, pv, "Failed")? {
                    self.event(
                        &p,
                        Kind::PersistentVolume,
                        "Warning",
                        "VolumeFailedDelete",
                        &msg,
                    );
                }
            }
            "Recycle" if phase(pv) != "Failed" => {
                if let Some(p) = self.set_phase(Kind::PersistentVolume, pv, "Failed")? {
                    self.event(
                        &p,
                        Kind::PersistentVolume,
                        "Warning",
                        "VolumeFailedRecycle",
                        "No recycler plugin found for the volume!",
                    );
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn sync_claim(
        &mut self,
        key: &Key,
        prebound: &[Arc<Value>],
        unclaimed: &[Arc<Value>],
    ) -> Result<(), ApiError> {
        let Some(claim) = self
            .api
            .store
            .get(Kind::PersistentVolumeClaim, &key.0, &key.1)
        else {
            return Ok(());
        };
        if meta::is_deleting(&claim) {
            // PVC protection: no pods exist here, so nothing uses the claim.
            if meta::finalizers(&claim).iter().any(|f| f == PVC_PROTECTION) {
                self.api.modify(
                    Kind::PersistentVolumeClaim,
                    &key.0,
                    &key.1,
                    meta::resource_version(&claim),
                    Sub::Main,
                    |o| remove_finalizer(o, PVC_PROTECTION),
                )?;
            }
            return Ok(());
        }
        let volume_name = path_str(&claim, &["spec", "volumeName"])
            .unwrap_or("")
            .to_string();
        if annotation(&claim, ANN_BIND_COMPLETED).is_some() && !volume_name.is_empty() {
            return self.sync_bound_claim(&claim, &volume_name);
        }
        if !volume_name.is_empty() {
            // Claim pre-bound by the user to a named volume.
            let Some(pv) = self.api.store.get(Kind::PersistentVolume, "", &volume_name) else {
                if phase(&claim) != "Pending" {
                    self.set_phase(Kind::PersistentVolumeClaim, &claim, "Pending")?;
                }
                return Ok(());
            };
            if path(&pv, &["spec", "claimRef"]).is_none_or(Value::is_null)
                || volume_bound_to_claim(&pv, &claim)
            {
                return self.bind(&claim, &pv);
            }
            let msg = format!("volume \"{volume_name}\" already bound to a different claim.");
            self.event(
                &claim,
                Kind::PersistentVolumeClaim,
                "Warning",
                "FailedBinding",
                &msg,
            );
            return Ok(());
        }
        let class_name = path_str(&claim, &["spec", "storageClassName"])
            .unwrap_or("")
            .to_string();
        let class = (!class_name.is_empty())
            .then(|| self.api.store.get(Kind::StorageClass, "", &class_name))
            .flatten();
        let delay = class.as_ref().is_some_and(|c| {
            c.get("volumeBindingMode").and_then(Value::as_str) == Some("WaitForFirstConsumer")
        });
        let selected_node = annotation(&claim, ANN_SELECTED_NODE).is_some();
        if let Some(pv) = prebound
            .iter()
            .find(|pv| volume_bound_to_claim(pv, &claim) && !meta::is_deleting(pv))
        {
            return self.bind(&claim, pv);
        }
        if !delay && let Some(pv) = best_match(&claim, unclaimed) {
            return self.bind(&claim, &pv);
        }
        if class_name.is_empty() {
            self.event(
                &claim,
                Kind::PersistentVolumeClaim,
                "Normal",
                "FailedBinding",
                "no persistent volumes available for this claim and no storage class is set",
            );
            return Ok(());
        }
        let Some(class) = class else {
            let msg = format!("storageclass.storage.k8s.io \"{class_name}\" not found");
            self.event(
                &claim,
                Kind::PersistentVolumeClaim,
                "Warning",
                "ProvisioningFailed",
                &msg,
            );
            return Ok(());
        };
        if delay && !selected_node {
            self.event(
                &claim,
                Kind::PersistentVolumeClaim,
                "Normal",
                "WaitForFirstConsumer",
                "waiting for first consumer to be created before binding",
            );
            return Ok(());
        }
        let provisioner = class
            .get("provisioner")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if provisioner == "kubernetes.io/no-provisioner" {
            self.event(
                &claim,
                Kind::PersistentVolumeClaim,
                "Normal",
                "FailedBinding",
                "no persistent volumes available for this claim and no storage class is set",
            );
            return Ok(());
        }
        let claim = if annotation(&claim, ANN_STORAGE_PROVISIONER) != Some(provisioner.as_str())
            || annotation(&claim, ANN_BETA_STORAGE_PROVISIONER) != Some(provisioner.as_str())
        {
            match self.api.modify(
                Kind::PersistentVolumeClaim,
                &key.0,
                &key.1,
                meta::resource_version(&claim),
                Sub::Main,
                |o| {
                    meta::set_annotation(o, ANN_BETA_STORAGE_PROVISIONER, &provisioner);
                    meta::set_annotation(o, ANN_STORAGE_PROVISIONER, &provisioner);
                },
            )? {
                Some(c) => c,
                None => return Ok(()),
            }
        } else {
            claim
        };
        let msg = format!(
            "Waiting for a volume to be created either by the external provisioner '{provisioner}' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered."
        );
        self.event(
            &claim,
            Kind::PersistentVolumeClaim,
            "Normal",
            "ExternalProvisioning",
            &msg,
        );
        Ok(())
    }

    fn sync_bound_claim(&mut self, claim: &Value, volume_name: &str) -> Result<(), ApiError> {
        let lost = |c: &mut Self, msg: &str| -> Result<(), ApiError> {
            if phase(claim) != "Lost" {
                c.set_phase(Kind::PersistentVolumeClaim, claim, "Lost")?;
                c.event(
                    claim,
                    Kind::PersistentVolumeClaim,
                    "Warning",
                    "ClaimLost",
                    msg,
                );
            }
            Ok(())
        };
        let Some(pv) = self.api.store.get(Kind::PersistentVolume, "", volume_name) else {
            return lost(
                self,
                "Bound claim has lost reference to PersistentVolume. Data on the volume is lost!",
            );
        };
        if path(&pv, &["spec", "claimRef"]).is_none_or(Value::is_null) {
            // The volume was unbound behind our back; bind it again.
            return self.bind(claim, &pv);
        }
        if !volume_bound_to_claim(&pv, claim) {
            return lost(
                self,
                "Two claims are bound to the same volume, this one is bound incorrectly",
            );
        }
        if phase(claim) != "Bound" || phase(&pv) != "Bound" {
            return self.bind(claim, &pv);
        }
        Ok(())
    }

    /// The four writes of the real controller's bind(), in its order; each is skipped when
    /// already done, and a conflict aborts (the next pass continues from fresh state).
    fn bind(&mut self, claim: &Value, pv: &Value) -> Result<(), ApiError> {
        let pv_name = meta::name(pv).to_string();
        // 1. The volume points at the claim (full reference with uid).
        let mut pv = Arc::new(pv.clone());
        let fully_bound = path(&pv, &["spec", "claimRef", "uid"]).and_then(Value::as_str)
            == Some(uid(claim))
            && volume_bound_to_claim(&pv, claim);
        if !fully_bound {
            let set_by_controller = !volume_bound_to_claim(&pv, claim);
            let claim_ref = json!({
                "kind": "PersistentVolumeClaim",
                "namespace": meta::namespace(claim),
                "name": meta::name(claim),
                "uid": uid(claim),
                "apiVersion": "v1",
                "resourceVersion": meta::resource_version(claim),
            });
            match self.api.modify(
                Kind::PersistentVolume,
                "",
                &pv_name,
                meta::resource_version(&pv),
                Sub::Main,
                |o| {
                    o["spec"]["claimRef"] = claim_ref;
                    if set_by_controller && annotation(o, ANN_BOUND_BY_CONTROLLER).is_none() {
                        meta::set_annotation(o, ANN_BOUND_BY_CONTROLLER, "yes");
                    }
                },
            )? {
                Some(p) => pv = p,
                None => return Ok(()),
            }
        }
        // 2. Volume phase Bound.
        if phase(&pv) != "Bound"
            && self
                .set_phase(Kind::PersistentVolume, &pv, "Bound")?
                .is_none()
        {
            return Ok(());
        }
        // 3. The claim points at the volume, with the bind annotations.
        let mut claim = Arc::new(claim.clone());
        let needs_name = path_str(&claim, &["spec", "volumeName"]) != Some(pv_name.as_str());
        if needs_name || annotation(&claim, ANN_BIND_COMPLETED).is_none() {
            let (ns, name, rv) = (
                meta::namespace(&claim).to_string(),
                meta::name(&claim).to_string(),
                meta::resource_version(&claim).to_string(),
            );
            match self.api.modify(
                Kind::PersistentVolumeClaim,
                &ns,
                &name,
                &rv,
                Sub::Main,
                |o| {
                    if needs_name {
                        o["spec"]["volumeName"] = json!(pv_name);
                        if annotation(o, ANN_BOUND_BY_CONTROLLER).is_none() {
                            meta::set_annotation(o, ANN_BOUND_BY_CONTROLLER, "yes");
                        }
                    }
                    if annotation(o, ANN_BIND_COMPLETED).is_none() {
                        meta::set_annotation(o, ANN_BIND_COMPLETED, "yes");
                    }
                },
            )? {
                Some(c) => claim = c,
                None => return Ok(()),
            }
        }
        // 4. Claim status: Bound, with the volume's access modes, and its capacity when the
        // claim becomes Bound. A claim already Bound keeps its capacity: once a volume is
        // resized the two differ on purpose until the resizer (or the node) finishes, and
        // the real controller does not clobber that.
        let want_modes = json!(modes(&pv, &["spec", "accessModes"]));
        let becomes_bound = phase(&claim) != "Bound";
        let volume_cap = storage_quantity(&pv, &["spec", "capacity", "storage"]);
        let claim_cap = storage_quantity(&claim, &["status", "capacity", "storage"]);
        let new_cap = (becomes_bound && (claim_cap.is_none() || claim_cap != volume_cap))
            .then(|| path(&pv, &["spec", "capacity"]).cloned())
            .flatten();
        if becomes_bound
            || path(&claim, &["status", "accessModes"]) != Some(&want_modes)
            || new_cap.is_some()
        {
            self.api.modify(
                Kind::PersistentVolumeClaim,
                meta::namespace(&claim),
                meta::name(&claim),
                meta::resource_version(&claim),
                Sub::Status,
                |o| {
                    o["status"]["phase"] = json!("Bound");
                    o["status"]["accessModes"] = want_modes;
                    if let Some(cap) = new_cap {
                        o["status"]["capacity"] = cap;
                    }
                },
            )?;
        }
        Ok(())
    }
}

fn remove_finalizer(o: &mut Value, fin: &str) {
    if let Some(list) = o
        .pointer_mut("/metadata/finalizers")
        .and_then(Value::as_array_mut)
    {
        list.retain(|f| f != fin);
    }
}

/// The smallest available volume that satisfies the claim (class, size, access modes,
/// volume mode, label selector), as the real controller's findBestMatchForClaim.
fn best_match(claim: &Value, unclaimed: &[Arc<Value>]) -> Option<Value> {
    let want = storage_quantity(claim, &["spec", "resources", "requests", "storage"])?;
    let class = path_str(claim, &["spec", "storageClassName"]).unwrap_or("");
    let want_modes = modes(claim, &["spec", "accessModes"]);
    let mode = path_str(claim, &["spec", "volumeMode"]).unwrap_or("Filesystem");
    let selector = path(claim, &["spec", "selector"]).filter(|s| !s.is_null());
    unclaimed
        .iter()
        .filter(|pv| !meta::is_deleting(pv) && phase(pv) == "Available")
        .filter(|pv| path_str(pv, &["spec", "storageClassName"]).unwrap_or("") == class)
        .filter(|pv| path_str(pv, &["spec", "volumeMode"]).unwrap_or("Filesystem") == mode)
        .filter(|pv| {
            let have = modes(pv, &["spec", "accessModes"]);
            want_modes.iter().all(|m| have.contains(m))
        })
        .filter(|pv| selector.is_none_or(|s| selector_matches(s, pv)))
        .filter_map(|pv| Some((storage_quantity(pv, &["spec", "capacity", "storage"])?, pv)))
        .filter(|(cap, _)| *cap >= want)
        .min_by_key(|(cap, _)| *cap)
        .map(|(_, pv)| (**pv).clone())
}

fn selector_matches(sel: &Value, obj: &Value) -> bool {
    if let Some(ml) = sel.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in ml {
            if meta::label(obj, k) != v.as_str() {
                return false;
            }
        }
    }
    if let Some(exprs) = sel.get("matchExpressions").and_then(Value::as_array) {
        for e in exprs {
            let key = e.get("key").and_then(Value::as_str).unwrap_or("");
            let values: Vec<&str> = e
                .get("values")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let l = meta::label(obj, key);
            let ok = match e.get("operator").and_then(Value::as_str) {
                Some("In") => l.is_some_and(|l| values.contains(&l)),
                Some("NotIn") => !l.is_some_and(|l| values.contains(&l)),
                Some("Exists") => l.is_some(),
                Some("DoesNotExist") => l.is_none(),
                _ => false,
            };
            if !ok {
                return false;
            }
        }
    }
    true
}
