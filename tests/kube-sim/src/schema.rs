//! Decoding through the typed API structs, as the real server decodes every body: fields
//! it does not know are dropped (the default `fieldValidation=Warn` behaviour) and wrongly
//! typed values are a 400, so a misspelled or mistyped field never round-trips here when
//! it would vanish or fail on a real cluster.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::events::v1::Event as EventV1;
use k8s_openapi::api::storage::v1::StorageClass;

use crate::errors::ApiError;
use crate::resources::Kind;

fn roundtrip<T: DeserializeOwned + Serialize>(kind: Kind, obj: Value) -> Result<Value, ApiError> {
    let k = kind.info().kind;
    let typed: T = serde_json::from_value(obj).map_err(|e| {
        ApiError::bad_request(format!(
            "{k} in version \"{}\" cannot be handled as a {k}: {e}",
            kind.info().version
        ))
    })?;
    serde_json::to_value(&typed).map_err(|e| ApiError::internal(format!("encoding {k}: {e}")))
}

pub fn normalize(kind: Kind, obj: Value) -> Result<Value, ApiError> {
    match kind {
        Kind::Namespace => roundtrip::<Namespace>(kind, obj),
        Kind::PersistentVolumeClaim => roundtrip::<PersistentVolumeClaim>(kind, obj),
        Kind::PersistentVolume => roundtrip::<PersistentVolume>(kind, obj),
        Kind::CoreEvent => roundtrip::<Event>(kind, obj),
        Kind::StorageClass => roundtrip::<StorageClass>(kind, obj),
        Kind::Lease => roundtrip::<Lease>(kind, obj),
        Kind::EventsV1Event => roundtrip::<EventV1>(kind, obj),
    }
}
