//! Snapshots: a volume's content at one point in time, kept by the agent outside every
//! volume (no tenant can mount it), and volumes restored from them.
//!
//! A snapshot is named by the controller ([`SnapshotName`]) (one name per Kubernetes `Snapshot` object), so
//! a create retried after a lost answer finds the snapshot it made instead of making a
//! second one.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::archive::ArchivePath;
use crate::export::ExportRequest;
use crate::path::VolumePath;
use crate::restore_source::RestoreSource;
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
    /// Received from another agent's snapshot, file by file (a replica).
    Replica,
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
            SnapshotMethod::Replica => "replica",
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

/// Body of `POST /v1/restores/{path}`: make the volume at `path` from a ready snapshot or
/// from an archive (exactly one of `snapshot` and `archive`; both or neither is
/// `invalid_body`). The source is kept as it is. Answered as a clone is: `201` with the
/// volume when made by this call, `200` when it was there already (the same source,
/// capacity and owner), `202` with a [`RestoreProgress`] while a reflink or copy runs
/// (repeat the same request later).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreVolumeRequest {
    /// The snapshot the volume is made from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotName>,
    /// The archive (its id, as `GET /v1/archives` lists it) the volume is made from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive: Option<ArchivePath>,
    /// Size in bytes of the new volume: at least the snapshot's `restore_size_bytes`, or
    /// the archive's `capacity_bytes` where the archive records one (`invalid_body`
    /// otherwise).
    pub capacity_bytes: u64,
    #[serde(default)]
    pub owner: VolumeOwner,
    #[serde(default)]
    pub quota: QuotaPolicy,
    /// Who may mount the volume, as for a create.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub export: Option<ExportRequest>,
}

impl RestoreVolumeRequest {
    /// The request for a volume made from `source`.
    pub fn from_source(source: RestoreSource, capacity_bytes: u64, owner: VolumeOwner) -> Self {
        let (snapshot, archive) = match source {
            RestoreSource::Snapshot(name) => (Some(name), None),
            RestoreSource::Archive(id) => (None, Some(id)),
        };
        Self {
            snapshot,
            archive,
            capacity_bytes,
            owner,
            quota: QuotaPolicy::default(),
            export: None,
        }
    }

    /// What the volume is made from, or why the request names no single source.
    pub fn source(&self) -> Result<RestoreSource, &'static str> {
        match (&self.snapshot, &self.archive) {
            (Some(name), None) => Ok(RestoreSource::Snapshot(name.clone())),
            (None, Some(id)) => Ok(RestoreSource::Archive(id.clone())),
            (Some(_), Some(_)) => Err("a restore names either a snapshot or an archive, not both"),
            (None, None) => Err("a restore names a snapshot or an archive to make the volume from"),
        }
    }
}

/// Answer `202 Accepted` of `POST /v1/restores/{path}`: the restore is still being made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreProgress {
    /// `"snapshot": NAME` or `"archive": ID`.
    #[serde(flatten)]
    pub source: RestoreSource,
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

    fn request(body: &str) -> Result<RestoreVolumeRequest, serde_json::Error> {
        serde_json::from_str(body)
    }

    #[test]
    fn a_restore_names_exactly_one_source() {
        let from_snapshot = request(r#"{"snapshot": "snap-1", "capacity_bytes": 1}"#).unwrap();
        assert_eq!(
            from_snapshot.source(),
            Ok(RestoreSource::Snapshot(
                SnapshotName::parse("snap-1").unwrap()
            ))
        );
        let id = "team/data/@20260101T000000.000000000Z";
        let from_archive =
            request(&format!(r#"{{"archive": "{id}", "capacity_bytes": 1}}"#)).unwrap();
        assert_eq!(
            from_archive.source(),
            Ok(RestoreSource::Archive(ArchivePath::parse(id).unwrap()))
        );
        let both = request(&format!(
            r#"{{"snapshot": "snap-1", "archive": "{id}", "capacity_bytes": 1}}"#
        ))
        .unwrap();
        assert!(both.source().is_err());
        assert!(
            request(r#"{"capacity_bytes": 1}"#)
                .unwrap()
                .source()
                .is_err()
        );
        assert!(request(r#"{"archive": "../etc/@x", "capacity_bytes": 1}"#).is_err());
    }

    #[test]
    fn progress_and_origin_name_their_source_by_kind() {
        let progress = RestoreProgress {
            source: RestoreSource::Snapshot(SnapshotName::parse("snap-1").unwrap()),
            running_seconds: 3,
        };
        let json = serde_json::to_value(&progress).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"snapshot": "snap-1", "running_seconds": 3})
        );
        assert_eq!(
            serde_json::from_value::<RestoreProgress>(json).unwrap(),
            progress
        );
    }
}
