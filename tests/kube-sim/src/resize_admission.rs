//! The PersistentVolumeClaimResize admission plugin (on by default in kube-apiserver): a
//! claim's storage request may only grow when the claim is bound and its StorageClass
//! exists and sets `allowVolumeExpansion: true`. It runs after validation, so an update
//! that is also invalid gets the 422, not this 403.

use serde_json::Value;

use crate::claim_validation::{claim_class, requested_storage};
use crate::errors::ApiError;
use crate::meta::{self, path_str};
use crate::resources::Kind;
use crate::store::View;

const NOT_BOUND: &str = "Only bound persistent volume claims can be expanded";
const CLASS_FORBIDS: &str = "only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize";

/// Whether the class the claim had and still has exists and allows expansion; a class
/// switched in the same write does not count.
fn class_allows_resize(view: &View<'_>, old: &Value, new: &Value) -> bool {
    let class = claim_class(new);
    if class.is_empty() || class != claim_class(old) {
        return false;
    }
    view.get(Kind::StorageClass, "", class)
        .and_then(|sc| sc.get("allowVolumeExpansion").and_then(Value::as_bool))
        .unwrap_or(false)
}

/// Admit (or refuse) a write of the main resource of a claim.
pub fn admit(view: &View<'_>, old: &Value, new: &Value) -> Result<(), ApiError> {
    if requested_storage(new) <= requested_storage(old) {
        return Ok(());
    }
    let refuse = |detail| {
        Err(ApiError::forbidden_for(
            Kind::PersistentVolumeClaim,
            meta::name(new),
            detail,
        ))
    };
    if path_str(old, &["status", "phase"]) != Some("Bound") {
        return refuse(NOT_BOUND);
    }
    if !class_allows_resize(view, old, new) {
        return refuse(CLASS_FORBIDS);
    }
    Ok(())
}
