//! kube-controller-manager's volume expand controller (`volume_expand`) for volumes it has
//! no in-tree plugin for (NFS, CSI, hostPath...): it only announces that an external
//! resizer has to act, with a `Normal ExternalExpanding` event on the claim, and never
//! writes the claim itself. Resizing the volume and updating the claim's status is the
//! external resizer's job (here: the controller under test).

use serde_json::Value;

use crate::api::Api;
use crate::claim_validation::{capacity_storage, requested_storage};
use crate::meta::{self, annotation, path, path_str};
use crate::recorder::{Note, Recorder};
use crate::resources::Kind;
use crate::store::Key;

pub const COMPONENT: &str = "volume_expand";
pub const EXTERNAL_EXPANDING: &str = "ExternalExpanding";
pub const WAITING_FOR_RESIZER: &str = "waiting for an external controller to expand this PVC";
/// Left on a volume by in-tree expansion until the node finishes; the real controller
/// looks at a claim again while it is there.
pub const ANN_PRE_RESIZE_CAPACITY: &str = "volume.alpha.kubernetes.io/pre-resize-capacity";

/// Volume sources the real controller deals with in-tree: CSI-migrated types get another
/// event and a resizer annotation, fc is expanded by the controller itself, flexVolume is
/// left to the kubelet. Not simulated: the controller stays silent for them.
const HANDLED_IN_TREE: [&str; 9] = [
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cinder",
    "gcePersistentDisk",
    "portworxVolume",
    "vsphereVolume",
    "fc",
    "flexVolume",
];

pub struct ExpandController {
    api: Api,
    recorder: Recorder,
}

impl ExpandController {
    pub fn new(api: Api) -> Self {
        ExpandController {
            recorder: Recorder::new(api.clone(), COMPONENT),
            api,
        }
    }

    /// Look at one claim, as the real controller's sync does for a claim it queued.
    pub fn sync_claim(&mut self, claim: &Value) {
        if path_str(claim, &["status", "phase"]) != Some("Bound") {
            return;
        }
        let volume_name = path_str(claim, &["spec", "volumeName"]).unwrap_or("");
        if volume_name.is_empty() {
            return;
        }
        let Some(pv) = self.api.store.get(Kind::PersistentVolume, "", volume_name) else {
            return;
        };
        // The volume must point back at this very claim (namespace and uid, not name).
        let claim_uid = meta::meta_str(claim, "uid").unwrap_or("");
        let ref_uid = path_str(&pv, &["spec", "claimRef", "uid"]).unwrap_or("");
        if claim_ref_key(&pv).is_none_or(|(ns, _)| ns != meta::namespace(claim))
            || ref_uid != claim_uid
        {
            return;
        }
        let requested = requested_storage(claim);
        if requested <= capacity_storage(claim)
            && annotation(&pv, ANN_PRE_RESIZE_CAPACITY).is_none()
        {
            return;
        }
        let spec = path(&pv, &["spec"]);
        if HANDLED_IN_TREE.iter().any(|source| {
            spec.and_then(|s| s.get(*source))
                .is_some_and(|v| !v.is_null())
        }) {
            return;
        }
        // The real controller is woken by a larger request (or a larger status capacity,
        // or its own restart) and then announces again; once per requested size is what
        // a test can rely on.
        self.recorder.record(
            claim,
            Kind::PersistentVolumeClaim,
            Note {
                type_: "Normal",
                reason: EXTERNAL_EXPANDING,
                message: WAITING_FOR_RESIZER,
            },
            &requested.canonical(),
        );
    }
}

/// The (namespace, name) of the claim a volume's claimRef names.
pub fn claim_ref_key(pv: &Value) -> Option<Key> {
    let cr = path(pv, &["spec", "claimRef"])?;
    Some((
        cr.get("namespace")?.as_str()?.to_string(),
        cr.get("name")?.as_str()?.to_string(),
    ))
}
