//! Snapshots: a volume's content at one point in time, kept by the agent outside every
//! volume (no tenant can mount it), and volumes restored from them.
//!
//! A snapshot is named by the controller ([`SnapshotName`]) (one name per Kubernetes `Snapshot` object), so
//! a create retried after a lost answer finds the snapshot it made instead of making a
//! second one.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::export::ExportRequest;
use crate::path::VolumePath;
use crate::snapshot_name::SnapshotName;
use crate::types::{QuotaPolicy, VolumeOwner};

/// Body of `PUT /v1/snapshots/{name}`. The same request again is answered with the same
/// snapshot (running or done); the name taken by a snapshot of another volume is a
/// `conflict`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshotRequest {
    /// The volume whose content is kept, on this agent.
    pub source: VolumePath,
}

/// How the agent keeps a snapshot: the fastest exact method the source volume allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SnapshotMethod {
    /// A read-only btrfs snapshot of the source's subvolume: instant, point in time.
    BtrfsSnapshot,
    /// A ZFS snapshot of the source's dataset: instant, point in time.
    ZfsSnapshot,
    /// Every file's data shared by `FICLONE` reflinks; the tree is walked file by file.
    Reflink,
    /// A local copy, file by file, at disk speed.
    Copy,
    /// A method newer than this side knows: shown as `unknown`, never acted on.
    #[serde(other)]
    Unknown,
}

impl SnapshotMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotMethod::BtrfsSnapshot => "btrfs-snapshot",
            SnapshotMethod::ZfsSnapshot => "zfs-snapshot",
            SnapshotMethod::Reflink => "reflink",
            SnapshotMethod::Copy => "copy",
            SnapshotMethod::Unknown => "unknown",
        }
    }
}

impl fmt::Display for SnapshotMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A snapshot as the agent sees it: the answer to create and get, an element of the list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub name: SnapshotName,
    /// The volume it was taken of. The snapshot outlives it: deleting or archiving the
    /// source leaves its snapshots and their restores as they are.
    pub source: VolumePath,
    pub method: SnapshotMethod,
    /// `false` while a reflink or copy snapshot is still being made; such a snapshot is
    /// not listed as ready and cannot be restored from yet.
    pub ready: bool,
    /// RFC 3339 UTC time of the point in time the snapshot holds (for a reflink or copy,
    /// when its walk began).
    pub created_at: String,
    /// The source's capacity when the snapshot was taken: the least a restore may ask for.
    pub restore_size_bytes: u64,
    /// Bytes of file data the snapshot holds (holes not counted), once ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// Bytes only this snapshot holds, which deleting it would free, where the
    /// filesystem knows them (btrfs with quotas, ZFS `used`); absent elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive_bytes: Option<u64>,
}

/// Answer to `GET /v1/snapshots`, sorted by name; paged by the same query as volumes
/// ([`ListQuery`](crate::ListQuery), `after` a snapshot name).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotList {
    pub snapshots: Vec<Snapshot>,
    /// The `after` of the next page; absent on the last page and on an unpaged answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// Body of `POST /v1/restores/{path}`: make the volume at `path` from a ready snapshot.
/// Answered as a clone is: `201` with the volume when made by this call, `200` when it
/// was there already (the same snapshot, capacity and owner), `202` with a
/// [`RestoreProgress`] while a reflink or copy runs (repeat the same request later).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreVolumeRequest {
    pub snapshot: SnapshotName,
    /// Size in bytes of the new volume, at least the snapshot's `restore_size_bytes`
    /// (`invalid_body` otherwise).
    pub capacity_bytes: u64,
    #[serde(default)]
    pub owner: VolumeOwner,
    #[serde(default)]
    pub quota: QuotaPolicy,
    /// Who may mount the volume, as for a create.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub export: Option<ExportRequest>,
}

/// Answer `202 Accepted` of `POST /v1/restores/{path}`: the restore is still being made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreProgress {
    pub snapshot: SnapshotName,
    /// Seconds since the agent started this restore.
    pub running_seconds: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_side_reads_a_newer_method_as_unknown() {
        let method: SnapshotMethod = serde_json::from_str("\"lvm-thin\"").unwrap();
        assert_eq!(method, SnapshotMethod::Unknown);
    }
}
