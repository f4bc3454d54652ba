//! Decoding through the typed API structs, as the real server decodes every body: fields
//! it does not know are dropped (the default `fieldValidation=Warn` behaviour) and wrongly
//! typed values are a 400, so a misspelled or mistyped field never round-trips here when
//! it would vanish or fail on a real cluster.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    Event, Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod,
};
use k8s_openapi::api::events::v1::Event as EventV1;
use k8s_openapi::api::storage::v1::StorageClass;

use crate::custom;
use crate::errors::ApiError;
use crate::meta::path;
use crate::quantity::Quantity;
use crate::resources::Kind;

fn undecodable(kind: Kind, cause: impl std::fmt::Display) -> ApiError {
    let k = kind.info().kind;
    ApiError::bad_request(format!(
        "{k} in version \"{}\" cannot be handled as a {k}: {cause}",
        kind.info().version
    ))
}

fn roundtrip<T: DeserializeOwned + Serialize>(kind: Kind, obj: Value) -> Result<Value, ApiError> {
    let typed: T = serde_json::from_value(obj).map_err(|e| undecodable(kind, e))?;
    serde_json::to_value(&typed)
        .map_err(|e| ApiError::internal(format!("encoding {}: {e}", kind.info().kind)))
}

/// The maps of quantities in each kind. The typed structs hold them as plain strings, but
/// the real decoder parses every one, so a malformed quantity is a 400 there too.
fn quantity_maps(kind: Kind) -> &'static [&'static [&'static str]] {
    match kind {
        Kind::PersistentVolumeClaim => &[
            &["spec", "resources", "requests"],
            &["spec", "resources", "limits"],
            &["status", "capacity"],
            &["status", "allocatedResources"],
        ],
        Kind::PersistentVolume => &[&["spec", "capacity"]],
        _ => &[],
    }
}

fn check_quantities(kind: Kind, obj: &Value) -> Result<(), ApiError> {
    for keys in quantity_maps(kind) {
        let Some(map) = path(obj, keys).and_then(Value::as_object) else {
            continue;
        };
        for v in map.values() {
            if let Some(Err(e)) = Quantity::from_json(v) {
                return Err(undecodable(kind, e));
            }
        }
    }
    Ok(())
}

pub fn normalize(kind: Kind, obj: Value) -> Result<Value, ApiError> {
    let obj = decode(kind, obj)?;
    check_quantities(kind, &obj)?;
    Ok(obj)
}

fn decode(kind: Kind, obj: Value) -> Result<Value, ApiError> {
    match kind {
        Kind::Namespace => roundtrip::<Namespace>(kind, obj),
        Kind::PersistentVolumeClaim => roundtrip::<PersistentVolumeClaim>(kind, obj),
        Kind::PersistentVolume => roundtrip::<PersistentVolume>(kind, obj),
        Kind::CoreEvent => roundtrip::<Event>(kind, obj),
        Kind::StorageClass => roundtrip::<StorageClass>(kind, obj),
        Kind::Lease => roundtrip::<Lease>(kind, obj),
        Kind::EventsV1Event => roundtrip::<EventV1>(kind, obj),
        Kind::Node => roundtrip::<Node>(kind, obj),
        Kind::Pod => roundtrip::<Pod>(kind, obj),
        Kind::Snapshot | Kind::SnapshotSchedule => {
            let mut obj = obj;
            if let Some(schema) = custom::schema(kind) {
                custom::prune_and_default(schema, &mut obj);
            }
            Ok(obj)
        }
    }
}
