//! Small accessors for the JSON objects the store holds, plus the server-assigned values
//! (uids, timestamps, generated names).

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Map, Value};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

pub fn meta(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

pub fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = Value::Object(Map::new());
    }
    match obj.get_mut("metadata").and_then(Value::as_object_mut) {
        Some(m) => m,
        None => unreachable!("metadata was just made an object"),
    }
}

pub fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    meta(obj)?.get(field)?.as_str()
}

pub fn name(obj: &Value) -> &str {
    meta_str(obj, "name").unwrap_or("")
}

pub fn namespace(obj: &Value) -> &str {
    meta_str(obj, "namespace").unwrap_or("")
}

pub fn resource_version(obj: &Value) -> &str {
    meta_str(obj, "resourceVersion").unwrap_or("")
}

pub fn finalizers(obj: &Value) -> Vec<String> {
    meta(obj)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

pub fn is_deleting(obj: &Value) -> bool {
    meta(obj)
        .and_then(|m| m.get("deletionTimestamp"))
        .is_some_and(|v| !v.is_null())
}

pub fn label<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    meta(obj)?.get("labels")?.get(key)?.as_str()
}

pub fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    meta(obj)?.get("annotations")?.get(key)?.as_str()
}

pub fn set_annotation(obj: &mut Value, key: &str, value: &str) {
    let m = meta_mut(obj);
    if !m.get("annotations").is_some_and(Value::is_object) {
        m.insert("annotations".into(), Value::Object(Map::new()));
    }
    if let Some(a) = m.get_mut("annotations").and_then(Value::as_object_mut) {
        a.insert(key.into(), Value::String(value.into()));
    }
}

/// Walk a path of object keys.
pub fn path<'a>(obj: &'a Value, keys: &[&str]) -> Option<&'a Value> {
    keys.iter().try_fold(obj, |v, k| v.get(*k))
}

pub fn path_str<'a>(obj: &'a Value, keys: &[&str]) -> Option<&'a str> {
    path(obj, keys)?.as_str()
}

/// RFC 3339 with second precision, the `metav1.Time` wire format.
pub fn now_time() -> String {
    let now = OffsetDateTime::now_utc();
    let now = now.replace_nanosecond(0).unwrap_or(now);
    now.format(&Rfc3339).unwrap_or_default()
}

/// RFC 3339 with microseconds, the `metav1.MicroTime` wire format.
pub fn now_micro_time() -> String {
    let now = OffsetDateTime::now_utc();
    let micros = now.microsecond();
    let now = now.replace_microsecond(micros).unwrap_or(now);
    let s = now.replace_nanosecond(0).unwrap_or(now).format(&Rfc3339);
    match s {
        Ok(s) => format!("{}.{micros:06}Z", s.trim_end_matches('Z')),
        Err(_) => String::new(),
    }
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

fn random_u64() -> u64 {
    // RandomState is seeded from the OS per instance; hashing a counter gives independent
    // values without adding an RNG dependency.
    RandomState::new().hash_one(COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// A random (version 4) UUID, as the API server assigns to `metadata.uid`.
pub fn new_uid() -> String {
    let a = random_u64();
    let b = random_u64();
    let hi = (a & 0xffff_ffff_ffff_0fff) | 0x4000;
    let lo = (b & 0x3fff_ffff_ffff_ffff) | 0x8000_0000_0000_0000;
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
}

/// The 5-character suffix `generateName` gets, from the same alphabet as the real one
/// (no vowels, no confusable characters).
pub fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut r = random_u64();
    (0..5)
        .map(|_| {
            let c = ALPHABET[(r % ALPHABET.len() as u64) as usize] as char;
            r /= ALPHABET.len() as u64;
            c
        })
        .collect()
}
