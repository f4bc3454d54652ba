//! The custom resources of snapshots, `Snapshot` and `SnapshotSchedule` in the API group
//! `nfsprov.dev`: their Rust form (the schema the API server checks is the CRD manifests'
//! in `deploy/crds`, which these types follow field for field), the names the controller
//! puts on them, and the interval a schedule runs at.
//!
//! Both kinds implement `k8s_openapi`'s resource traits, which kube's client takes as it
//! takes a built-in kind, so neither this crate nor its users need kube's derive macros.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, ObjectMeta, Time};
use k8s_openapi::{ListableResource, Metadata, NamespaceResourceScope, Resource};
use serde::{Deserialize, Serialize};

/// The API group of both kinds.
pub const GROUP: &str = "nfsprov.dev";
/// Their version: `v1alpha1` while the fields may still change (a cron expression and
/// status conditions are likely additions), so no conversion is owed to early users.
pub const VERSION: &str = "v1alpha1";
pub const API_VERSION: &str = "nfsprov.dev/v1alpha1";
pub const SNAPSHOT_KIND: &str = "Snapshot";
pub const SCHEDULE_KIND: &str = "SnapshotSchedule";

/// Keeps a Snapshot until the agent's copy was dealt with as its `deletionPolicy` says.
pub const SNAPSHOT_FINALIZER: &str = "nfsprov.dev/snapshot";
/// Set on each Snapshot a schedule makes: the schedule's name.
pub const LABEL_SCHEDULE: &str = "nfsprov.dev/snapshot-schedule";
/// The condition a Snapshot reports its readiness in.
pub const CONDITION_READY: &str = "Ready";

/// Set on a PV restored from a snapshot: the Snapshot (`namespace/name`) it was made from.
pub const ANN_RESTORED_FROM: &str = "nfsprov.dev/restored-from";

/// The name of the agent's snapshot kept for a Snapshot object: one per object UID, so a
/// create repeated after a lost answer finds the same snapshot, and a Snapshot deleted
/// and made again under the same name never meets the old one's data.
pub fn agent_snapshot_name(snapshot_uid: &str) -> String {
    format!("snap-{snapshot_uid}")
}

/// A volume's content at one point in time, kept by its agent.
///
/// Serialized with its `apiVersion` and `kind` always (see `namespaced_resource!` below): an
/// API server refuses a custom object without them, so no caller may forget them.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Snapshot {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: SnapshotSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<SnapshotStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotSpec {
    pub source: SnapshotSource,
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotSource {
    /// A claim of the Snapshot's namespace, bound to a volume of this provisioner.
    pub persistent_volume_claim_name: String,
}

/// What deleting a Snapshot does to the agent's copy, as for a VolumeSnapshotContent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeletionPolicy {
    #[default]
    Delete,
    Retain,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    /// The point in time the snapshot holds, as the agent reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_time: Option<Time>,
    /// The least a claim restored from it may request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_size: Option<Quantity>,
    /// How the agent keeps it: `btrfs-snapshot`, `zfs-snapshot`, `reflink` or `copy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Bytes of data the snapshot holds, as its agent counts them (see
    /// `docs/snapshots.md` for what each storage backend counts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// Bytes only this snapshot holds, which deleting it would free; absent where the
    /// storage does not count them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive_bytes: Option<u64>,
    /// Why the snapshot is not (yet) ready; absent once it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The agent holding it. With `snapshotName`, written before the agent is first
    /// asked, so deleting the Snapshot needs nothing else, whatever became of its claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The snapshot's name on its agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_name: Option<String>,
    /// The volume it was taken of, relative to the agent's export root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_path: Option<String>,
    /// One condition, `Ready` (what `kubectl wait --for=condition=Ready` waits for), with
    /// the reason it is not: `InProgress` or `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
}

impl Snapshot {
    pub fn ready(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.ready_to_use)
            .unwrap_or(false)
    }

    pub fn claim_name(&self) -> &str {
        &self.spec.source.persistent_volume_claim_name
    }
}

/// Makes `$kind` a namespaced resource of this group, as the CRDs in `deploy/crds/`
/// declare it: what kube's typed `Api` needs to read, list and watch it, and its wire
/// form. That form writes `apiVersion` and `kind` from the `Resource` constants before
/// the fields (`$status` is the type of its optional `status`): the API server decodes a
/// custom object by them and answers 400 `Object 'Kind' is missing` without, while the
/// derived form of a plain struct would leave them out.
macro_rules! namespaced_resource {
    ($kind:ty, $kind_name:expr, $plural:literal, $list_kind:literal, $spec:ty, $status:ty) => {
        impl Serialize for $kind {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                #[derive(Serialize)]
                #[serde(rename_all = "camelCase")]
                struct Wire<'a> {
                    api_version: &'static str,
                    kind: &'static str,
                    metadata: &'a ObjectMeta,
                    spec: &'a $spec,
                    #[serde(skip_serializing_if = "Option::is_none")]
                    status: Option<&'a $status>,
                }
                Wire {
                    api_version: <$kind as Resource>::API_VERSION,
                    kind: <$kind as Resource>::KIND,
                    metadata: &self.metadata,
                    spec: &self.spec,
                    status: self.status.as_ref(),
                }
                .serialize(serializer)
            }
        }

        impl Resource for $kind {
            const API_VERSION: &'static str = API_VERSION;
            const GROUP: &'static str = GROUP;
            const KIND: &'static str = $kind_name;
            const VERSION: &'static str = VERSION;
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = NamespaceResourceScope;
        }

        impl ListableResource for $kind {
            const LIST_KIND: &'static str = $list_kind;
        }

        impl Metadata for $kind {
            type Ty = ObjectMeta;

            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }

            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

namespaced_resource!(
    Snapshot,
    SNAPSHOT_KIND,
    "snapshots",
    "SnapshotList",
    SnapshotSpec,
    SnapshotStatus
);

/// Snapshots of the claims a selector picks, taken at an interval and pruned.
///
/// Serialized with its `apiVersion` and `kind` always, as [`Snapshot`].
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct SnapshotSchedule {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ScheduleSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ScheduleStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleSpec {
    /// The claims of the schedule's namespace to snapshot; an empty selector picks all.
    #[serde(default)]
    pub claim_selector: LabelSelector,
    /// How often, as [`parse_interval`] reads it (`90m`, `1h`, `1d12h`).
    pub interval: String,
    /// Newest snapshots kept per claim; older ones are deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<u32>,
    /// Snapshots older than this ([`parse_interval`]'s form) are deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<String>,
    /// The `deletionPolicy` of the Snapshots it makes.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_run: Option<Time>,
    /// The run under way: the time its Snapshots are named after, written before the
    /// first is made and cleared with `lastRun`, so a run repeated after a crash makes
    /// the same names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_run: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

namespaced_resource!(
    SnapshotSchedule,
    SCHEDULE_KIND,
    "snapshotschedules",
    "SnapshotScheduleList",
    ScheduleSpec,
    ScheduleStatus
);

/// The labels a schedule puts on each Snapshot it makes.
pub fn schedule_labels(schedule: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(LABEL_SCHEDULE.to_owned(), schedule.to_owned())])
}

/// Why a string is no interval.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IntervalError {
    #[error("an interval must not be empty")]
    Empty,
    #[error(
        "{0:?} is no interval: write numbers each followed by d, h, m or s, such as 90m, 1h or 1d12h"
    )]
    Invalid(String),
    #[error("an interval must be at least one second")]
    Zero,
    #[error("{0:?} is longer than any schedule needs")]
    TooLong(String),
}

/// The longest interval or age accepted: ten years, far beyond any schedule, and far
/// from where adding it to a timestamp could overflow.
const MAX_INTERVAL: Duration = Duration::from_secs(10 * 366 * 24 * 3600);

/// Reads an interval such as `30s`, `90m`, `1h`, `1h30m` or `7d`: whole numbers, each
/// followed by its unit (`d` is 24 hours), largest unit first or not.
pub fn parse_interval(raw: &str) -> Result<Duration, IntervalError> {
    if raw.is_empty() {
        return Err(IntervalError::Empty);
    }
    let invalid = || IntervalError::Invalid(raw.to_owned());
    let mut total: u64 = 0;
    let mut digits = String::new();
    for c in raw.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            'd' => 86_400,
            'h' => 3_600,
            'm' => 60,
            's' => 1,
            _ => return Err(invalid()),
        };
        if digits.is_empty() {
            return Err(invalid());
        }
        let value: u64 = digits
            .parse()
            .map_err(|_| IntervalError::TooLong(raw.to_owned()))?;
        digits.clear();
        total = value
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(|| IntervalError::TooLong(raw.to_owned()))?;
    }
    if !digits.is_empty() {
        return Err(invalid());
    }
    let total = Duration::from_secs(total);
    if total.is_zero() {
        return Err(IntervalError::Zero);
    }
    if total > MAX_INTERVAL {
        return Err(IntervalError::TooLong(raw.to_owned()));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_are_sums_of_whole_units() {
        for (raw, secs) in [
            ("30s", 30),
            ("90m", 5_400),
            ("1h", 3_600),
            ("1h30m", 5_400),
            ("30m1h", 5_400),
            ("7d", 604_800),
            ("1d12h", 129_600),
        ] {
            assert_eq!(parse_interval(raw), Ok(Duration::from_secs(secs)), "{raw}");
        }
    }

    #[test]
    fn anything_else_is_refused() {
        assert_eq!(parse_interval(""), Err(IntervalError::Empty));
        assert_eq!(parse_interval("0h"), Err(IntervalError::Zero));
        for bad in ["1", "h", "1.5h", "1w", "-1h", "1h ", "PT1H", "1H"] {
            assert!(
                matches!(parse_interval(bad), Err(IntervalError::Invalid(_))),
                "{bad}"
            );
        }
        for long in ["99999d", "99999999999999999999999s"] {
            assert!(
                matches!(parse_interval(long), Err(IntervalError::TooLong(_))),
                "{long}"
            );
        }
    }

    #[test]
    fn the_json_form_is_the_manifests_camel_case() {
        let snapshot: Snapshot = serde_json::from_value(serde_json::json!({
            "apiVersion": "nfsprov.dev/v1alpha1",
            "kind": "Snapshot",
            "metadata": {"name": "s", "namespace": "team"},
            "spec": {"source": {"persistentVolumeClaimName": "data"}},
            "status": {"readyToUse": true, "restoreSize": "1Gi", "snapshotName": "snap-1"},
        }))
        .unwrap();
        assert_eq!(snapshot.claim_name(), "data");
        assert_eq!(snapshot.spec.deletion_policy, DeletionPolicy::Delete);
        assert!(snapshot.ready());
        let back = serde_json::to_value(&snapshot).unwrap();
        assert_eq!(back["spec"]["deletionPolicy"], "Delete");
        assert_eq!(back["status"]["snapshotName"], "snap-1");
        assert_eq!(agent_snapshot_name("u-1"), "snap-u-1");
    }

    /// An API server decodes a custom object by its `apiVersion` and `kind` and refuses
    /// one without: every object of these kinds is written with them, even one built
    /// from `Default` as the schedule controller builds its Snapshots.
    #[test]
    fn every_object_is_written_with_its_api_version_and_kind() {
        let snapshot = serde_json::to_value(Snapshot::default()).unwrap();
        assert_eq!(snapshot["apiVersion"], "nfsprov.dev/v1alpha1");
        assert_eq!(snapshot["kind"], "Snapshot");
        assert!(snapshot.get("status").is_none(), "{snapshot}");
        let schedule = serde_json::to_value(SnapshotSchedule {
            status: Some(ScheduleStatus::default()),
            ..SnapshotSchedule::default()
        })
        .unwrap();
        assert_eq!(schedule["apiVersion"], "nfsprov.dev/v1alpha1");
        assert_eq!(schedule["kind"], "SnapshotSchedule");
        assert!(schedule["status"].is_object(), "{schedule}");
        // And read back as they were written.
        let back: SnapshotSchedule = serde_json::from_value(schedule).unwrap();
        assert!(back.status.is_some());
    }
}
